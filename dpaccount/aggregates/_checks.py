"""What every aggregate checks before it charges, and how it reads the data it is given.

Every check here looks at a parameter or at the data's container type, never at the
data's values, so it can run before the charge; every error names a type, never a value.
"""

from __future__ import annotations

import math
import re
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
            "is a lazy frame (a plan of work, not data). count, sum and mean take a Dask "
            "Series or a one-column Spark DataFrame; for the other statistics "
            "aggregates.groupby(frame, None) (or by a key column) computes them where the "
            "data lives; otherwise materialise the column first (.collect())",
        )


#: The first word of the names of dtypes whose values are containers (lists, arrays,
#: structs, maps), which are not keys: pandas' Arrow dtypes (``list<item: int64>[pyarrow]``),
#: polars (``List(Int64)``, ``Struct(...)``, ``Array(...)``) and Spark (``array<int>``).
_NESTED_DTYPES = frozenset(
    ("list", "large_list", "fixed_size_list", "list_view", "large_list_view", "struct",
     "map", "array")
)


def dtype_word(dtype: Any) -> str:
    """The first word of a dtype's name, lower case (``"list"`` for ``List(Int64)``)."""
    return re.split(r"[<(\[ ]", str(dtype), maxsplit=1)[0].lower()


def unkeyable_dtype(dtype: Any) -> bool:
    """Whether a column of this dtype can never hold keys (hashable values), by the
    dtype alone: nested values (lists, structs, maps), or a polars ``Object`` column.
    A pandas ``object`` column may hold anything; it is read value by value."""
    word = dtype_word(dtype)
    if word in _NESTED_DTYPES:
        return True
    return word == "object" and type(dtype).__module__.startswith("polars")


def _real_dtype(dtype: Any) -> bool | None:
    """Whether a numpy, pandas or polars dtype holds real numbers (booleans included):
    True, False, or None for an object dtype (read value by value after the charge)."""
    module = type(dtype).__module__.split(".")[0]
    if module == "polars":
        return bool(dtype.is_numeric()) or dtype_word(dtype) in ("boolean", "null")
    if module == "pandas":
        import pandas as pd  # the data is a pandas object: pandas is loaded

        api = pd.api.types
        if api.is_bool_dtype(dtype):
            return True
        if api.is_numeric_dtype(dtype):
            return not api.is_complex_dtype(dtype)
        return None if api.is_object_dtype(dtype) else False
    kind = getattr(dtype, "kind", None)
    if not isinstance(kind, str):
        return None
    return None if kind == "O" else kind in "biuf"


#: The libraries whose containers' dtypes and shapes are looked at before the charge.
_SCHEMA_MODULES = ("numpy", "pandas", "polars")


def check_column(data: Any, field: str = "data", *, numeric: bool = False,
                 keys: bool = False) -> None:
    """Refuse, before the charge, a column whose *schema* shows it cannot be read.

    Only a numpy, pandas or polars container's shape and dtype are looked at (never a
    value, nor the number of rows): more than one dimension (a DataFrame where one
    column is due, such as a frame's column that is duplicated); with ``numeric``, a
    dtype that holds no real numbers (text, categories, dates, complex or nested
    values); with ``keys``, a dtype whose values cannot be keys (`unkeyable_dtype`). An
    ``object`` dtype is read value by value after the charge (its error then comes after
    the charge, which is kept). `InvalidCostError` names the container's type and
    dtype.
    """
    if type(data).__module__.split(".")[0] not in _SCHEMA_MODULES:
        return
    kind = type(data).__name__
    shape = getattr(data, "shape", None)
    if isinstance(shape, tuple) and len(shape) != 1:
        raise InvalidCostError(
            field, kind,
            f"must be one column (one-dimensional), not {len(shape)}-dimensional (a "
            "DataFrame's column whose name is duplicated is a DataFrame: rename it)",
        )
    dtype = getattr(data, "dtype", None)
    if dtype is None:
        return
    if numeric and _real_dtype(dtype) is False:
        raise InvalidCostError(
            field, f"{kind} of dtype {dtype}",
            "must hold real numbers: cast the column to a numeric dtype first",
        )
    if keys and unkeyable_dtype(dtype):
        raise InvalidCostError(
            field, f"{kind} of dtype {dtype}", "must hold keys (hashable values), not "
            "lists, arrays, structs or objects",
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
        self.selection: Any = None  # a group-by's key selection, left by its plan

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
    call: Callable[[PreviewOf], Any], accountant: Any, level: Any, key_counts: Any = None
) -> AggregatePreview:
    """Run ``call`` with a stand-in accountant and return what its charge would do
    (with a group-by's key selection: what it would release, given ``key_counts``)."""
    from dpaccount.aggregates.results import AggregatePreview

    check_accountant(accountant)
    lvl = check_level(level)
    proxy = PreviewOf(accountant)
    try:
        call(proxy)
    except _Previewed as done:
        keys = None if proxy.selection is None else proxy.selection.preview(key_counts)
        return AggregatePreview(done.charge, lvl, done.error_bound, keys)
    raise AssertionError("unreachable: every aggregate charges")  # pragma: no cover
