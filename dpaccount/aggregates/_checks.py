"""What every aggregate checks before it charges, and how it reads the data it is given.

Every check here looks at a parameter or at the data's container type, never at the
data's values, so it can run before the charge; every error names a type, never a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dpaccount._numeric import check_delta, check_positive, to_fraction
from dpaccount.charges import Relation
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms.integer import (
    IntegerGaussianMechanism,
    IntegerLaplaceMechanism,
    IntegerNoise,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import ChargePreview
    from dpaccount.aggregates.results import AggregatePreview
    from dpaccount.charges import Charge
    from dpaccount.mechanisms.base import Mechanism
    from dpaccount.records import LedgerRecord


def check_level(level: Any) -> float:
    lvl = to_fraction(level, "level")
    if not 0 < lvl < 1:
        raise InvalidCostError("level", level, "must be in (0, 1)")
    return float(lvl)


def check_bounds(lower: Any, upper: Any) -> tuple[float, float]:
    try:
        lo = float(to_fraction(lower, "lower"))
        hi = float(to_fraction(upper, "upper"))
    except OverflowError:
        raise InvalidCostError(
            "lower/upper", (lower, upper), "bounds must be finite floats"
        ) from None
    if not math.isfinite(lo) or not math.isfinite(hi):
        raise InvalidCostError("lower/upper", (lower, upper), "bounds must be finite floats")
    if not lo < hi:
        raise InvalidCostError("upper", upper, f"must be greater than lower={lower!r}")
    return lo, hi


def check_accountant(accountant: Any) -> Relation:
    relation = getattr(accountant, "relation", None)
    if not callable(getattr(accountant, "charge", None)) or not isinstance(relation, Relation):
        raise ConfigError(
            f"expected a dpaccount Accountant, got {type(accountant).__name__}"
        )
    return relation


def choose_mechanism(mechanism: str | None, delta: Fraction) -> str:
    if mechanism is None:
        return "laplace" if delta == 0 else "gaussian"
    if mechanism == "laplace":
        if delta != 0:
            raise ConfigError("the Laplace mechanism is pure epsilon-DP: leave delta at 0")
        return mechanism
    if mechanism == "gaussian":
        if delta == 0:
            raise InvalidCostError("delta", delta, "the Gaussian mechanism needs delta > 0")
        return mechanism
    raise ConfigError(f"unknown mechanism {mechanism!r}; use 'laplace' or 'gaussian'")




def noise_for(
    kind: str, epsilon: Fraction, delta: Fraction, shift: int, coordinates: int, l1: int,
    rng: Any,
) -> IntegerNoise:
    if kind == "laplace":
        return IntegerLaplaceMechanism(epsilon, l1, coordinates=coordinates, rng=rng)
    return IntegerGaussianMechanism(epsilon, delta, shift, coordinates=coordinates, rng=rng)


def converted(data: Any) -> npt.NDArray[np.float64] | None:
    """``data`` as float64, or None; never raises (conversion errors quote values)."""
    try:
        if hasattr(data, "to_numpy") and not isinstance(data, np.ndarray):
            try:
                return np.asarray(data.to_numpy(dtype=np.float64, na_value=np.nan))
            except TypeError:
                return np.asarray(data.to_numpy(), dtype=np.float64)
        return np.asarray(data, dtype=np.float64)
    except Exception:  # a hostile __array__ may raise anything, with values inside
        return None


#: Attributes of containers that hold a plan of work, not data (polars LazyFrame, Dask,
#: Spark): reading them runs a job, so they are refused before anything is charged.
_LAZY_MARKERS = ("collect", "compute", "toPandas")


def check_container(data: Any) -> None:
    """Refuse, before the charge, a ``data`` whose type can never be read as records.

    Only the container's type is looked at (never its contents), so this check does not
    depend on the data: a lazy frame (``collect``/``compute``), an iterator or generator
    (consumed by reading), a string, a mapping or anything without a length is refused
    with `InvalidCostError` naming the type, and nothing is charged.
    """
    kind = type(data).__name__
    if isinstance(data, (str, bytes, dict)) or not hasattr(data, "__len__"):
        raise InvalidCostError(
            "data", kind, "must be an array, a list, a pandas Series or a DataFrame column"
        )
    if any(hasattr(data, marker) for marker in _LAZY_MARKERS) and not hasattr(
        data, "to_numpy"
    ):
        raise InvalidCostError(
            "data", kind,
            "is a lazy frame (a plan of work, not data). For a Dask or Spark DataFrame, "
            "aggregates.groupby(frame, None) (or by a key column) computes the statistic "
            "where the data lives; otherwise materialise the column first (.collect())",
        )


def float_array(data: Any) -> npt.NDArray[np.float64]:
    """The data as a 1-D float64 array (pandas Series / nullable dtypes included).

    Errors name only the data's type, never a value.
    """
    arr = converted(data)
    if arr is None:  # raised here, outside the handler: no context holding a value
        raise InvalidCostError(
            "data", type(data).__name__, "must hold real numbers (a numeric column)"
        )
    if arr.ndim != 1:
        raise InvalidCostError("data", type(data).__name__, "must be one-dimensional")
    return arr


def checked(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any
) -> tuple[Relation, Fraction, Fraction, str, float]:
    """The checks every aggregate makes first: ledger, epsilon, delta, noise, level."""
    relation = check_accountant(accountant)
    eps, dlt = check_positive(epsilon, "epsilon"), check_delta(delta)
    return relation, eps, dlt, choose_mechanism(mechanism, dlt), check_level(level)


def check_edges(bins: Any) -> npt.NDArray[np.float64]:
    try:
        edges = np.asarray(bins, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidCostError("bins", bins, "must be a sequence of numbers") from None
    if edges.ndim != 1 or edges.size < 2:
        raise InvalidCostError("bins", bins, "must hold at least two bin edges")
    if not np.all(np.isfinite(edges)) or not np.all(np.diff(edges) > 0):
        raise InvalidCostError("bins", bins, "edges must be finite and strictly increasing")
    return edges


def bin_labels(edges: npt.NDArray[np.float64]) -> list[str]:
    """Readable labels of numeric bins: ``[e0, e1)`` ..., the last one closed.

    Examples:
        >>> bin_labels(np.array([0.0, 0.5, 2.0]))
        ['[0, 0.5)', '[0.5, 2]']
    """
    last = edges.size - 2
    return [
        f"[{edges[j]:g}, {edges[j + 1]:g}{']' if j == last else ')'}"
        for j in range(edges.size - 1)
    ]


# -- preview: run an aggregate's checks and stop at its charge ---------------------------


class PreviewOf:
    """Stands in for an accountant in a preview: its relation, and no charge ever made."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.relation = ledger.relation

    def charge(self, *_args: Any, **_kwargs: Any) -> None:  # pragma: no cover - never reached
        raise AssertionError("a preview never charges")


class _Previewed(Exception):  # noqa: N818 - control flow inside a preview, never escapes
    def __init__(self, charge: ChargePreview, error_bound: float | None) -> None:
        super().__init__("preview")
        self.charge = charge
        self.error_bound = error_bound


def charge_or_preview(
    accountant: Any, charge: Charge | Mechanism, label: str, query_id: str | None,
    error_bound: Callable[[], float | None],
) -> LedgerRecord:
    """Charge the ledger; in a preview, stop here with what would be charged instead.

    ``error_bound`` gives the noise's half-width the aggregate will report, known before
    the data is read (``None`` when it depends on the noisy answer).
    """
    if isinstance(accountant, PreviewOf):
        raise _Previewed(accountant.ledger.preview(charge), error_bound())
    record: LedgerRecord = accountant.charge(charge, label=label, query_id=query_id)
    return record


def run_as_preview(
    call: Callable[[PreviewOf], Any], accountant: Any, level: Any
) -> AggregatePreview:
    """Run ``call`` with a stand-in accountant and return what its charge would do."""
    from dpaccount.aggregates.results import AggregatePreview

    check_accountant(accountant)
    lvl = check_level(level)
    try:
        call(PreviewOf(accountant))
    except _Previewed as done:
        return AggregatePreview(done.charge, lvl, done.error_bound)
    raise AssertionError("unreachable: every aggregate charges")  # pragma: no cover
