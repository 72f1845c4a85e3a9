"""Guarded aggregates for pipelines: count, sum, mean, histogram and quantile.

Each function takes the data (a numpy array, a pandas Series, or any 1-D sequence), the
`Accountant` to charge and the privacy parameters, and
follows the same order:

1. validate every parameter and build the mechanism (its cost is then known);
2. **charge the accountant** (a refusal raises
   `BudgetExceededError` and the data is never read);
3. compute the true answer with the implemented arithmetic below, add noise, and
   return an `AggregateResult` with the noisy value, the ledger record, the
   sensitivity used and an accuracy statement (an interval that holds with probability
   at least ``level``).

**Sensitivity is exact for the implemented arithmetic.** Summing floats in floating point
can change by more than the ideal ``upper - lower`` when one record changes, because
rounding depends on the other records and on their order (Casacuberta, Shoemate, Vadhan
and Wagaman 2022, "Widespread Underestimation of Sensitivity in Differentially Private
Libraries and How to Fix It", ACM CCS). Here each value is clipped to the declared
bounds and rounded to the lattice ``g * Z`` (g a power of two, so ``x / g`` is exact),
and the integers are summed exactly (int64 in chunks that cannot overflow, Python ints
across chunks). Clipping and rounding are monotone, so every record maps to an integer in
``[a, b]`` with ``a = rint(lower / g)`` and ``b = rint(upper / g)``; the sensitivities
below are in those integer units, exactly, whatever the other records and their order.

**Noise** is integer-valued and sampled exactly (Canonne, Kamath and Steinke 2020, "The
Discrete Gaussian for Differential Privacy", Algorithms 2 and 3): the discrete Laplace
with scale S / epsilon is epsilon-DP for an integer query of L1 sensitivity S (Dwork and
Roth 2014, Thm 3.6 in its discrete form: the density ratio is exp(|v| / scale)); the
discrete Gaussian's guarantee is its exact one-dimensional privacy profile (CKS 2020,
Thm 7) for small shifts and its zCDP bound otherwise (CKS 2020, Thm 14 with Cor. 13).
Each release is one mechanism with fixed parameters; the accountant composes them.

**Neighbouring relations** (the accountant's relation decides which bound is used). The
data passed is "the records of the dataset that this query reads": it may be a column
selected by a data-independent rule (a filter on each record's own value), so under
substitution a changed record may also move in or out of the selection.

| aggregate | add/remove | substitution (value change, or in/out of the selection) |
|---|---|---|
| count | 1 | 1 |
| sum | max(abs(a), abs(b)) | max(b - a, abs(a), abs(b)) |
| mean | centred sum: max(b-c, c-a) and count: 1 | centred sum: b - a; count: 1 |
| histogram | one bin by 1 (L1 = L2² = 1) | two bins by 1 each (L1 = L2² = 2) |
| quantile | max(q, 1 - q) (utility) | 1 (utility) |

Missing values: NaN is replaced by ``fill`` (default: 0 clipped into the bounds) in
``sum``/``mean``; ``+inf``/``-inf`` clip to the bounds. ``histogram`` drops values outside
every bin and NaN; ``quantile`` counts NaN as above every candidate. None of this can
raise after the charge, so an exception never reveals a record.

Examples:
    >>> import numpy as np
    >>> from dpaccount import Accountant
    >>> from dpaccount.mechanisms._sampling import RandomSource
    >>> acct = Accountant(2)
    >>> ages = np.array([23.0, 35.5, 41.0, 67.0, 19.0])
    >>> res = sum(ages, acct, "0.5", lower=0, upper=100, rng=RandomSource.seeded(1))
    >>> res.cost
    PrivacyCost(epsilon=0.5, delta=0)
    >>> res.sensitivity        # max(|lower|, |upper|) under add/remove
    Fraction(100, 1)
    >>> lo, hi = res.interval
    >>> lo <= res.value <= hi
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import numpy.typing as npt
from scipy import special

from dpaccount._numeric import (
    check_delta,
    check_positive,
    float_up,
    to_fraction,
)
from dpaccount.charges import DiscreteGaussianCharge, DiscreteLaplaceCharge, Relation
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms._sampling import (
    RandomSource,
    power_of_two_at_most,
    resolve_rng,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from dpaccount.mechanisms.base import Mechanism
from dpaccount.mechanisms.exponential import ExponentialMechanism
from dpaccount.mechanisms.gaussian import (
    _coarse_up,
    continuous_sigma,
    discrete_gaussian_delta_up,
    zcdp_delta_up,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import Accountant, ChargePreview
    from dpaccount.records import LedgerRecord

__all__ = [
    "AggregatePreview",
    "AggregateResult",
    "FixedPoint",
    "IntegerGaussianMechanism",
    "IntegerLaplaceMechanism",
    "count",
    "exact_sum",
    "histogram",
    "histogram_counts",
    "lattice_sum",
    "mean",
    "preview",
    "quantile",
    "quantile_utilities",
    "sum",
    "sum_sensitivity",
]

#: Default lattice: g = the largest power of two <= max(|lower|, |upper|) / 2**30.
_LATTICE_BITS = 30
#: The exact 1-D discrete Gaussian profile is evaluated for shifts up to this many steps;
#: beyond, the zCDP bound is used (it needs no per-shift work).
_EXACT_PROFILE_MAX_SHIFT = 4096
#: int64 chunks are summed only while their total provably fits in 2**62.
_INT64_LIMIT = 2**62


# ---------------------------------------------------------------------------------------
# Integer-valued noise mechanisms (the query answer is already an exact integer)
# ---------------------------------------------------------------------------------------


def _laplace_tail_halfwidth(scale: Fraction, level: float) -> int:
    """Smallest w with P[|Y| <= w] >= level for the discrete Laplace of ``scale``.

    P[|Y| >= m] = 2 q^m / (1 + q), q = exp(-1 / scale), for m >= 1 (geometric series).
    """
    q = math.exp(-1.0 / float(scale))
    miss = 1.0 - level
    m = max(1, math.ceil(math.log(miss * (1.0 + q) / 2.0) / math.log(q)))
    while 2.0 * q**m / (1.0 + q) * (1.0 + 1e-9) > miss:
        m += 1
    return m - 1


def _gaussian_tail_halfwidth(sigma2: Fraction, level: float) -> int:
    """A w with P[|Y| <= w] >= level for the discrete Gaussian N_Z(0, sigma2).

    With f(k) = exp(-k² / (2 sigma2)): sum_{k >= m} f(k) <= int_{m-1}^inf f, and the
    normaliser Z = sum_k f(k) >= sigma sqrt(2 pi) - 1 (sum and integral of a unimodal
    function with maximum 1 differ by at most 1), so
    P[|Y| >= m] <= 2 sigma sqrt(2 pi) Q((m - 1) / sigma) / (sigma sqrt(2 pi) - 1).
    Small sigma: the probabilities are summed directly.
    """
    s2 = float(sigma2)
    sigma = math.sqrt(s2)
    miss = 1.0 - level
    if sigma < 8.0:
        k = np.arange(0, int(40 * sigma) + 40, dtype=np.float64)
        f = np.exp(-(k * k) / (2.0 * s2))
        z = f[0] + 2.0 * f[1:].sum()
        tail = 2.0 * np.cumsum(f[::-1])[::-1] / z  # tail[m] = P[|Y| >= m], m >= 1
        for m in range(1, k.size):
            if tail[m] * (1.0 + 1e-9) <= miss:
                return m - 1
        return k.size
    norm = sigma * math.sqrt(2.0 * math.pi)
    # Q(t) <= miss (norm - 1) / (2 norm): t from the inverse survival function, then
    # checked (and stepped) in the safe direction.
    target = miss * (norm - 1.0) / (2.0 * norm)
    t = float(-special.ndtri(target))
    m = math.ceil(t * sigma + 1.0)
    while 2.0 * norm * float(special.ndtr(-(m - 1) / sigma)) / (norm - 1.0) > miss:
        m += 1
    return m - 1


class IntegerLaplaceMechanism(Mechanism):
    """Discrete Laplace noise of scale S / epsilon on an integer (vector) query.

    For an integer-valued query whose answers on neighbours differ by a vector v with
    ``||v||_1 <= S``, adding independent discrete Laplace noise P[Y = y] ∝ exp(-|y| / b)
    with b = S / epsilon to each coordinate is epsilon-DP: the output density ratio is
    at most exp(||v||_1 / b) (Dwork and Roth 2014, Thm 3.6, discrete form; Ghosh,
    Roughgarden and Sundararajan 2009). The noise is drawn exactly (Canonne, Kamath and
    Steinke 2020, Algorithm 2). No lattice rounding is needed: the answer is an integer.

    The charge is a `DiscreteLaplaceCharge` (b, S, coordinates), whose cost is
    ``PrivacyCost(epsilon)`` exactly; when a neighbour changes one coordinate
    (``coordinates=1``) the other coordinates' noise does not depend on the data, so the
    tight engines may use the exact scalar pair.

    Args:
        epsilon: > 0.
        sensitivity: The L1 sensitivity S, a positive integer (in the query's units).
        coordinates: How many coordinates a neighbour can change (1 or more).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Examples:
        >>> m = IntegerLaplaceMechanism(1, 1)
        >>> m.charge.cost, m.scale
        (PrivacyCost(epsilon=1, delta=0), Fraction(1, 1))
        >>> isinstance(m.release(10), int)
        True
    """

    def __init__(
        self, epsilon: Any, sensitivity: int, *, coordinates: int = 1, rng: Any = None
    ) -> None:
        self._epsilon = check_positive(epsilon, "epsilon")
        self._sensitivity = _check_int_sensitivity(sensitivity)
        self._scale = Fraction(self._sensitivity) / self._epsilon
        self._rng: RandomSource = resolve_rng(rng)
        self._charge = DiscreteLaplaceCharge(
            self._scale, self._sensitivity, _check_coordinates(coordinates)
        )

    @property
    def charge(self) -> DiscreteLaplaceCharge:
        """``DiscreteLaplaceCharge(S / epsilon, S, coordinates)``; its cost is
        ``PrivacyCost(epsilon)``, exact."""
        return self._charge

    @property
    def scale(self) -> Fraction:
        """b = S / epsilon, in the query's integer units."""
        return self._scale

    @property
    def variance(self) -> float:
        """The noise variance per coordinate, 2 q / (1 - q)², q = exp(-1 / b)."""
        q = math.exp(-1.0 / float(self._scale))
        return 2.0 * q / (1.0 - q) ** 2

    def release(self, value: Any) -> Any:
        """Add noise to an int (returns an int) or to each int of a list (returns a list)."""
        if isinstance(value, list):
            return [int(v) + sample_discrete_laplace(self._scale, self._rng) for v in value]
        return int(value) + sample_discrete_laplace(self._scale, self._rng)

    def halfwidth(self, level: float) -> int:
        """w with P[|noise| <= w] >= level in one coordinate."""
        return _laplace_tail_halfwidth(self._scale, level)


class IntegerGaussianMechanism(Mechanism):
    """Discrete Gaussian noise on an integer (vector) query, calibrated to (epsilon, delta).

    The neighbouring answers differ by an integer vector v with at most ``coordinates``
    non-zero entries, each of absolute value at most ``shift``. Guarantee used:

    * one coordinate: the exact privacy profile of N_Z(0, s²) under integer shifts
      1..shift (Canonne, Kamath and Steinke 2020, Thm 7), for shift <= 4096;
    * otherwise: N_Z(0, s²) added to each coordinate is rho-zCDP with
      rho = ||v||_2² / (2 s²) <= coordinates * shift² / (2 s²) (CKS 2020, Thm 14),
      converted to (epsilon, delta) by CKS 2020, Cor. 13.

    s² is the smallest dyadic value found by bisection whose bound is <= delta; the
    charge is ``PrivacyCost(epsilon, delta_bound)`` at that s² (never above delta).

    Args:
        epsilon: > 0.
        delta: In (0, 1).
        shift: Largest change of one coordinate, a positive integer.
        coordinates: Largest number of coordinates that change (1 or more).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Examples:
        >>> m = IntegerGaussianMechanism(1, "1e-5", 1)
        >>> 3.5 < math.sqrt(m.sigma2) < 4.0      # continuous analytic sigma: 3.73
        True
        >>> m.charge.delta <= Fraction(1, 100000)
        True
    """

    def __init__(
        self, epsilon: Any, delta: Any, shift: int, *, coordinates: int = 1, rng: Any = None
    ) -> None:
        eps = check_positive(epsilon, "epsilon")
        dlt = check_delta(delta)
        if dlt == 0:
            raise InvalidCostError("delta", delta, "the Gaussian mechanism needs delta > 0")
        self._shift = _check_int_sensitivity(shift)
        self._coordinates = _check_coordinates(coordinates)
        self._exact = coordinates == 1 and self._shift <= _EXACT_PROFILE_MAX_SHIFT
        l2 = Fraction(self._shift) * Fraction(math.isqrt(coordinates - 1) + 1)
        start = continuous_sigma("analytic", eps, dlt, l2)
        self._sigma2 = self._calibrate(eps, dlt, start)
        self._delta = self._delta_at(eps, self._sigma2)
        self._rng: RandomSource = resolve_rng(rng)
        # ||v||_2 <= shift sqrt(coordinates), rounded up to an integer
        squared = coordinates * self._shift**2
        l2_steps = math.isqrt(squared - 1) + 1 if squared > 1 else 1
        self._charge = DiscreteGaussianCharge(
            self._sigma, l2_steps, eps, self._delta, coordinates
        )

    def _delta_at(self, epsilon: Fraction, sigma2: Fraction) -> Fraction:
        if self._exact:
            return discrete_gaussian_delta_up(epsilon, float(sigma2), self._shift)
        rho = float_up(Fraction(self._coordinates * self._shift**2) / (2 * sigma2))
        return zcdp_delta_up(epsilon, math.nextafter(rho, math.inf))

    def _calibrate(self, epsilon: Fraction, delta: Fraction, sigma: float) -> Fraction:
        def ok(s2: float) -> bool:
            return self._delta_at(epsilon, Fraction(s2)) <= delta

        lo = hi = sigma * sigma
        while not ok(hi):
            lo, hi = hi, hi * 1.5
        if lo == hi:
            lo = hi / 1.5
            while ok(lo) and lo > 1e-300:
                hi, lo = lo, lo / 1.5
        while hi / lo - 1.0 > 1e-6:
            mid = math.sqrt(lo * hi)
            if ok(mid):
                hi = mid
            else:
                lo = mid
        # s rounded up to 26 significant bits, so that s^2 is exact and the charge can
        # carry s itself; raised again should the bound at s^2 not fit
        s = _coarse_up(math.sqrt(hi))
        while not ok(s * s):
            s = _coarse_up(s * (1 + 2.0**-20))
        self._sigma = Fraction(s)
        return self._sigma**2

    @property
    def charge(self) -> DiscreteGaussianCharge:
        """``DiscreteGaussianCharge(s, L, epsilon, delta_bound, coordinates)`` with
        L = ceil(shift sqrt(coordinates)) and s^2 = `sigma2` exactly; its cost is
        ``PrivacyCost(epsilon, delta_bound)``, proven for the discrete sampler."""
        return self._charge

    @property
    def sigma2(self) -> Fraction:
        """The discrete Gaussian's parameter s² (exact, integer units)."""
        return self._sigma2

    @property
    def variance(self) -> float:
        """An upper bound on the noise variance per coordinate: s² (the discrete Gaussian's
        variance is below its parameter s²; Canonne, Kamath and Steinke 2020)."""
        return float(self._sigma2)

    def release(self, value: Any) -> Any:
        """Add noise to an int (returns an int) or to each int of a list (returns a list)."""
        if isinstance(value, list):
            return [int(v) + sample_discrete_gaussian(self._sigma2, self._rng) for v in value]
        return int(value) + sample_discrete_gaussian(self._sigma2, self._rng)

    def halfwidth(self, level: float) -> int:
        """w with P[|noise| <= w] >= level in one coordinate."""
        return _gaussian_tail_halfwidth(self._sigma2, level)


def _check_int_sensitivity(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidCostError("sensitivity", value, "must be a positive integer")
    return int(value)


# ---------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------


@attrs.frozen
class AggregateResult:
    """A noisy aggregate with its ledger record and an accuracy statement.

    Attributes:
        value: The noisy answer (a float; a float array for a histogram; the selected
            candidate for a quantile).
        interval: ``(low, high)`` that contains the implemented true answer (clipped,
            rounded to the lattice) with probability at least ``level``; per bin for a
            histogram; ``None`` for a quantile (see ``error_bound``).
        level: The confidence level of ``interval`` / ``error_bound``.
        error_bound: The half-width of the noise at ``level`` in the answer's units
            (per bin for a histogram; in ranks for a quantile).
        accuracy: The accuracy statement in words.
        record: The ledger record of the charge.
        sensitivity: The sensitivity used, in the answer's units (for a mean: of the
            centred sum).
        relation: The neighbouring relation the sensitivity holds for.
        granularity: The lattice spacing g the values were rounded to (or ``None``).
    """

    value: Any
    interval: tuple[Any, Any] | None
    level: float
    error_bound: Any
    accuracy: str
    record: LedgerRecord
    sensitivity: Fraction
    relation: Relation
    granularity: Fraction | None = None

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) charged for this aggregate."""
        return self.record.cost

    def clamped(self, lower: float = 0.0, upper: float | None = None) -> AggregateResult:
        """The same result with its value and interval clipped to ``[lower, upper]``.

        Post-processing of a released value: free (no new charge, the same record) and
        still covered by the charge's guarantee. A noisy count below 0 becomes 0; the
        interval still contains the true answer whenever the true answer is in the
        range (a count is never negative).

        Examples:
            >>> from dpaccount import Accountant
            >>> res = count([], Accountant(1), 1).clamped()
            >>> res.value >= 0 and res.interval[0] >= 0
            True
        """
        def clip(x: Any) -> Any:
            arr = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
            return float(arr) if arr.ndim == 0 else arr

        interval = None if self.interval is None else (
            clip(self.interval[0]), clip(self.interval[1])
        )
        return attrs.evolve(self, value=clip(self.value), interval=interval)

    def rounded(self) -> AggregateResult:
        """The same result with its value rounded to whole numbers (free post-processing,
        e.g. for counts); the interval is widened outward to whole numbers."""
        def nearest(x: Any) -> Any:
            arr = np.rint(np.asarray(x, dtype=np.float64))
            return float(arr) if arr.ndim == 0 else arr

        def outward(x: Any, up: bool) -> Any:
            arr = np.ceil(x) if up else np.floor(x)
            arr = np.asarray(arr, dtype=np.float64)
            return float(arr) if arr.ndim == 0 else arr

        interval = None if self.interval is None else (
            outward(self.interval[0], False), outward(self.interval[1], True)
        )
        return attrs.evolve(self, value=nearest(self.value), interval=interval)


# ---------------------------------------------------------------------------------------
# Validation, conversion and exact fixed-point arithmetic
# ---------------------------------------------------------------------------------------


def _check_level(level: Any) -> float:
    lvl = to_fraction(level, "level")
    if not 0 < lvl < 1:
        raise InvalidCostError("level", level, "must be in (0, 1)")
    return float(lvl)


def _check_bounds(lower: Any, upper: Any) -> tuple[float, float]:
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


def _check_accountant(accountant: Any) -> Relation:
    relation = getattr(accountant, "relation", None)
    if not callable(getattr(accountant, "charge", None)) or not isinstance(relation, Relation):
        raise ConfigError(
            f"expected a dpaccount Accountant, got {type(accountant).__name__}"
        )
    return relation


def _choose_mechanism(mechanism: str | None, delta: Fraction) -> str:
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


def _check_coordinates(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidCostError("coordinates", value, "must be an integer >= 1")
    return value


#: The integer noise an aggregate adds.
Noise = IntegerLaplaceMechanism | IntegerGaussianMechanism


def _noise(
    kind: str, epsilon: Fraction, delta: Fraction, shift: int, coordinates: int, l1: int,
    rng: Any,
) -> Noise:
    if kind == "laplace":
        return IntegerLaplaceMechanism(epsilon, l1, coordinates=coordinates, rng=rng)
    return IntegerGaussianMechanism(epsilon, delta, shift, coordinates=coordinates, rng=rng)


def _converted(data: Any) -> npt.NDArray[np.float64] | None:
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


def _check_container(data: Any) -> None:
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
            "is a lazy frame (a plan of work, not data): materialise the column first, "
            "e.g. .collect() or .compute(), then pass it",
        )


def _float_array(data: Any) -> npt.NDArray[np.float64]:
    """The data as a 1-D float64 array (pandas Series / nullable dtypes included).

    Errors name only the data's type, never a value.
    """
    arr = _converted(data)
    if arr is None:  # raised here, outside the handler: no context holding a value
        raise InvalidCostError(
            "data", type(data).__name__, "must hold real numbers (a numeric column)"
        )
    if arr.ndim != 1:
        raise InvalidCostError("data", type(data).__name__, "must be one-dimensional")
    return arr


@attrs.frozen
class FixedPoint:
    """The declared bounds on the lattice ``g * Z``: records map to integers in [a, b].

    Attributes:
        lower: The lower clipping bound (a float).
        upper: The upper clipping bound (a float).
        granularity: g, a power of two.
        a: rint(lower / g), the smallest integer a record can map to.
        b: rint(upper / g), the largest.
        fill: The float a NaN is replaced with (inside the bounds).
    """

    lower: float
    upper: float
    granularity: Fraction
    a: int
    b: int
    fill: float

    @classmethod
    def build(
        cls, lower: Any, upper: Any, granularity: Any = None, fill: Any = None
    ) -> FixedPoint:
        """Validate the bounds and choose the lattice (default: 2**30 steps to the bound).

        Examples:
            >>> fp = FixedPoint.build(0, 1)
            >>> fp.granularity, fp.a, fp.b
            (Fraction(1, 1073741824), 0, 1073741824)
        """
        lo, hi = _check_bounds(lower, upper)
        if granularity is None:
            g = power_of_two_at_most(Fraction(max(abs(lo), abs(hi))) / 2**_LATTICE_BITS)
        else:
            g = check_positive(granularity, "granularity")
            if power_of_two_at_most(g) != g:
                raise InvalidCostError("granularity", granularity, "must be a power of two")
            if Fraction(max(abs(lo), abs(hi))) / g > 2**52:
                raise InvalidCostError(
                    "granularity", granularity, "too fine for the bounds (over 2**52 steps)"
                )
        if not Fraction(1, 2**1000) <= g <= 2**1000:
            raise InvalidCostError(
                "lower/upper",
                (lower, upper),
                "the lattice spacing would leave 2**-1000..2**1000 (bounds this close to "
                "zero or this large, or such a granularity, are not supported)",
            )
        if fill is None:
            fill_f = min(max(0.0, lo), hi)
        else:
            fill_f = float(to_fraction(fill, "fill"))
            if not lo <= fill_f <= hi:
                raise InvalidCostError("fill", fill, "must lie within [lower, upper]")
        inv = float(1 / g)
        a = int(np.rint(np.float64(lo) * inv))
        b = int(np.rint(np.float64(hi) * inv))
        return cls(lo, hi, g, a, b, fill_f)

    def to_ints(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """Replace NaN by ``fill``, clip to the bounds, round to the lattice: ints in [a, b].

        Multiplying by a power of two is exact (no overflow: |x / g| <= 2**52) and rint
        is exact, so the map is a monotone function of each value alone.
        """
        x = np.where(np.isnan(values), self.fill, values)
        x = np.clip(x, self.lower, self.upper)
        return np.rint(x * float(1 / self.granularity)).astype(np.int64)


def exact_sum(ints: npt.NDArray[np.int64], bound: int) -> int:
    """The exact sum of integers with ``|x| <= bound``: int64 chunks that cannot overflow.

    Examples:
        >>> exact_sum(np.array([2**61, 2**61, 2**61], dtype=np.int64), 2**61)
        6917529027641081856
    """
    chunk = max(1, _INT64_LIMIT // max(bound, 1))
    total = 0
    for start in range(0, ints.size, chunk):
        total += int(ints[start : start + chunk].sum(dtype=np.int64))
    return total


def sum_sensitivity(fp: FixedPoint, relation: Relation, centre: int = 0) -> int:
    """The exact sensitivity, in lattice steps, of the sum of ``ints - centre``.

    Add/remove: one term appears or disappears: max(|a - c|, |b - c|). Substitution: a
    term changes within [a, b] (b - a) or enters/leaves the selection (as add/remove).

    Examples:
        >>> fp = FixedPoint.build(-1, 3, granularity=1)
        >>> sum_sensitivity(fp, Relation.ADD_REMOVE), sum_sensitivity(fp, Relation.SUBSTITUTION)
        (3, 4)
    """
    one = max(abs(fp.a - centre), abs(fp.b - centre))
    if relation is Relation.ADD_REMOVE:
        return max(one, 1)
    return max(fp.b - fp.a, one, 1)


def lattice_sum(data: Any, fp: FixedPoint, centre: int = 0) -> int:
    """The implemented true (pre-noise) sum, in lattice steps: sum of (int_i - centre).

    This is exactly what `sum()` (``centre = 0``) and `mean()` add noise to.

    Examples:
        >>> fp = FixedPoint.build(0, 1, granularity="0.5")
        >>> lattice_sum([0.2, 0.9, 7.0, float("nan")], fp)     # 0 + 2 + 2 + 0
        4
    """
    ints = fp.to_ints(_float_array(data))
    return exact_sum(ints, max(abs(fp.a), abs(fp.b))) - int(ints.size) * centre


def quantile_utilities(data: Any, grid: Any, q: Fraction) -> list[Fraction]:
    """The implemented utilities of `quantile()`: -|#{x <= c} - q n| per candidate c.

    Examples:
        >>> quantile_utilities([1.0, 2.0, 3.0, 4.0], [2.0, 3.0], Fraction(1, 2))
        [Fraction(0, 1), Fraction(-1, 1)]
    """
    arr = np.sort(_float_array(data))  # NaN sorts last: above every candidate
    ranks = np.searchsorted(arr, np.asarray(grid, dtype=np.float64), side="right").tolist()
    target = q * int(arr.size)
    return [-abs(r - target) for r in ranks]


def histogram_counts(data: Any, edges: Any) -> list[int]:
    """The implemented true counts of `histogram()` over numeric bin edges.

    Examples:
        >>> histogram_counts([0.5, 1.5, 2.0, 9.0, float("nan")], [0, 1, 2])
        [1, 2]
    """
    arr = _float_array(data)
    arr = arr[np.isfinite(arr)]
    return [int(c) for c in np.histogram(arr, bins=_check_edges(edges))[0].tolist()]


def _to_float(k: int, g: Fraction) -> float:
    return float(k * g)


# ---------------------------------------------------------------------------------------
# The aggregates
# ---------------------------------------------------------------------------------------


# -- what each aggregate decides before the data (shared with `preview`) -----------------

def _checked(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any
) -> tuple[Relation, Fraction, Fraction, str, float]:
    """The checks every aggregate makes first: ledger, epsilon, delta, noise, level."""
    relation = _check_accountant(accountant)
    eps, dlt = check_positive(epsilon, "epsilon"), check_delta(delta)
    return relation, eps, dlt, _choose_mechanism(mechanism, dlt), _check_level(level)


def _count_setup(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any, rng: Any
) -> tuple[Relation, Noise, float]:
    relation, eps, dlt, kind, lvl = _checked(accountant, epsilon, delta, mechanism, level)
    return relation, _noise(kind, eps, dlt, 1, 1, 1, rng), lvl


def _sum_setup(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any,
    lower: Any, upper: Any, granularity: Any, fill: Any, rng: Any,
) -> tuple[Relation, Noise, float, FixedPoint, int]:
    relation, eps, dlt, kind, lvl = _checked(accountant, epsilon, delta, mechanism, level)
    fp = FixedPoint.build(lower, upper, granularity, fill)
    s = sum_sensitivity(fp, relation)
    return relation, _noise(kind, eps, dlt, s, 1, s, rng), lvl, fp, s


def _histogram_setup(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any,
    bins: Any, categories: Sequence[Any] | None, rng: Any,
) -> tuple[Relation, Noise, float, Any, list[Any]]:
    relation, eps, dlt, kind, lvl = _checked(accountant, epsilon, delta, mechanism, level)
    if (bins is None) == (categories is None):
        raise ConfigError("give exactly one of bins= (numeric edges) or categories=")
    edges = _check_edges(bins) if bins is not None else None
    cats = list(categories) if categories is not None else []
    if categories is not None and not cats:
        raise InvalidCostError("categories", categories, "at least one category is needed")
    moved = 1 if relation is Relation.ADD_REMOVE else 2
    return relation, _noise(kind, eps, dlt, 1, moved, moved, rng), lvl, edges, cats


@attrs.frozen
class AggregatePreview:
    """What an aggregate would charge and how accurate it would be (`preview`).

    Nothing was charged and no data was read.

    Attributes:
        charge: What the ledger would do (`ChargePreview`: the cost, whether it would
            be admitted, the totals before and after).
        level: The confidence level of ``error_bound``.
        error_bound: The half-width of the noise at ``level``, in the answer's units:
            the same number the aggregate reports when it runs (for a histogram, per
            bin).
    """

    charge: ChargePreview
    level: float
    error_bound: float

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) the aggregate would charge."""
        return self.charge.cost

    @property
    def admitted(self) -> bool:
        """Whether the ledger would take the charge now."""
        return self.charge.admitted


def preview(
    aggregate: Callable[..., AggregateResult], data: Any, accountant: Accountant,
    epsilon: Any, **options: Any,
) -> AggregatePreview:
    """What ``aggregate(data, accountant, epsilon, **options)`` would do, without doing it.

    For `count`, `sum` and `histogram`: the cost, whether the ledger would admit it and
    its totals before and after (`Accountant.preview`), and the noise's half-width at the
    level asked for, in the answer's units. Nothing is charged, the data is not read
    (only its container type is checked, as before a real charge), and the options are
    checked exactly as the aggregate checks them.

    Raises:
        ConfigError: An aggregate other than `count`, `sum` or `histogram`.

    Examples:
        >>> from dpaccount import Accountant
        >>> acct = Accountant(1)
        >>> p = preview(count, [1, 2, 3], acct, "0.5")
        >>> p.cost, p.admitted, p.error_bound, len(acct.records)
        (PrivacyCost(epsilon=0.5, delta=0), True, 6.0, 0)
    """
    level = options.get("level", 0.95)
    common = (accountant, epsilon, options.get("delta", 0), options.get("mechanism"), level)
    rng = options.get("rng")
    unit: Fraction = Fraction(1)
    if aggregate is count:
        _relation, mech, lvl = _count_setup(*common, rng)
    elif aggregate is sum:
        _relation, mech, lvl, fp, _s = _sum_setup(
            *common, options.get("lower"), options.get("upper"),
            options.get("granularity"), options.get("fill"), rng,
        )
        unit = fp.granularity
    elif aggregate is histogram:
        _relation, mech, lvl, _edges, _cats = _histogram_setup(
            *common, options.get("bins"), options.get("categories"), rng
        )
    else:
        raise ConfigError("preview() covers count, sum and histogram")
    _check_container(data)
    w = mech.halfwidth(lvl)
    return AggregatePreview(accountant.preview(mech), lvl, _to_float(w, unit))


def count(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    *,
    delta: Any = 0,
    mechanism: str | None = None,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
) -> AggregateResult:
    """A noisy count of the records (rows) of ``data``.

    Sensitivity 1 under both relations (a record appears/disappears, or moves in or out
    of the selection that produced ``data``).

    Args:
        data: Anything with ``len()``: an array, a Series, a DataFrame, a list.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        delta: 0 for the discrete Laplace (default); > 0 selects the discrete Gaussian.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        level: Confidence level of the interval.
        label: The ledger label (default ``"count"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.

    Examples:
        >>> from dpaccount import Accountant
        >>> acct = Accountant(1)
        >>> res = count([1, 2, 3], acct, "0.5")
        >>> res.cost, res.sensitivity
        (PrivacyCost(epsilon=0.5, delta=0), Fraction(1, 1))
    """
    relation, mech, lvl = _count_setup(accountant, epsilon, delta, mechanism, level, rng)
    _check_container(data)
    record = accountant.charge(mech, label=label or "count", query_id=query_id)
    noisy = mech.release(len(data))
    w = mech.halfwidth(lvl)
    return AggregateResult(
        value=float(noisy),
        interval=(float(noisy - w), float(noisy + w)),
        level=lvl,
        error_bound=float(w),
        accuracy=f"the true count is within ±{w} of the value with probability >= {lvl}",
        record=record,
        sensitivity=Fraction(1),
        relation=relation,
    )


def sum(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    *,
    lower: Any,
    upper: Any,
    delta: Any = 0,
    mechanism: str | None = None,
    granularity: Any = None,
    fill: Any = None,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
) -> AggregateResult:
    """A noisy sum of values clipped to ``[lower, upper]``, summed exactly on a lattice.

    Args:
        data: A 1-D numeric array or Series.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        lower: The lower clipping bound (declared, data-independent).
        upper: The upper clipping bound, > lower.
        delta: 0 for the discrete Laplace (default); > 0 selects the discrete Gaussian.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        granularity: The lattice spacing, a power of two (default: 2**-30 of the bound).
        fill: The value a NaN stands for (default 0 clipped into the bounds).
        level: Confidence level of the interval.
        label: The ledger label (default ``"sum"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.

    Returns:
        The result; ``sensitivity`` is ``S * g`` (see the module table).
    """
    relation, mech, lvl, fp, s = _sum_setup(
        accountant, epsilon, delta, mechanism, level, lower, upper, granularity, fill, rng
    )
    _check_container(data)
    record = accountant.charge(mech, label=label or "sum", query_id=query_id)
    noisy = mech.release(lattice_sum(data, fp))
    w = mech.halfwidth(lvl)
    g = fp.granularity
    return AggregateResult(
        value=_to_float(noisy, g),
        interval=(_to_float(noisy - w, g), _to_float(noisy + w, g)),
        level=lvl,
        error_bound=_to_float(w, g),
        accuracy=(
            f"the clipped sum (values rounded to multiples of {float(g)!r}) is within "
            f"±{_to_float(w, g)!r} of the value with probability >= {lvl}"
        ),
        record=record,
        sensitivity=s * g,
        relation=relation,
        granularity=g,
    )


def mean(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    *,
    lower: Any,
    upper: Any,
    delta: Any = 0,
    mechanism: str | None = None,
    count_share: Any = "1/2",
    granularity: Any = None,
    fill: Any = None,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
) -> AggregateResult:
    """A noisy mean of values clipped to ``[lower, upper]``: noisy centred sum / noisy count.

    The values are centred at the lattice midpoint c of the bounds, so the sum's
    add/remove sensitivity is about (upper - lower) / 2 instead of max(|lower|, |upper|).
    epsilon (and delta) are split: ``count_share`` to the count, the rest to the sum;
    the two releases are charged as one record whose cost is their basic composition
    (Dwork and Roth 2014, Thm 3.16). The number of records is never assumed public
    (the data may be a selection of the dataset). The released mean is clipped to the
    bounds (post-processing).

    Args:
        data: A 1-D numeric array or Series.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0, the total for the mean.
        lower: The lower clipping bound.
        upper: The upper clipping bound, > lower.
        delta: 0 (discrete Laplace) or > 0 (discrete Gaussian), the total.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        count_share: The fraction of epsilon and delta spent on the count, in (0, 1).
        granularity: The lattice spacing, a power of two.
        fill: The value a NaN stands for (default 0 clipped into the bounds).
        level: Confidence level of the interval (each release at (1 + level) / 2).
        label: The ledger label (default ``"mean"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.

    Examples:
        >>> from dpaccount import Accountant
        >>> acct = Accountant(1)
        >>> res = mean([1.0, 2.0, 3.0] * 100, acct, 1, lower=0, upper=4)
        >>> res.cost
        PrivacyCost(epsilon=1, delta=0)
        >>> 0 <= res.value <= 4
        True
    """
    relation, eps, dlt, kind, lvl = _checked(accountant, epsilon, delta, mechanism, level)
    share = to_fraction(count_share, "count_share")
    if not 0 < share < 1:
        raise InvalidCostError("count_share", count_share, "must be in (0, 1)")
    fp = FixedPoint.build(lower, upper, granularity, fill)
    centre = (fp.a + fp.b) // 2
    s = sum_sensitivity(fp, relation, centre)
    sum_mech = _noise(kind, eps * (1 - share), dlt * (1 - share), s, 1, s, rng)
    count_mech = _noise(kind, eps * share, dlt * share, 1, 1, 1, rng)
    total_cost = sum_mech.charge.cost + count_mech.charge.cost  # two mechanisms, one record
    _check_container(data)
    record = accountant.charge(total_cost, label=label or "mean", query_id=query_id)
    noisy_sum = sum_mech.release(lattice_sum(data, fp, centre))
    noisy_n = count_mech.release(len(data))
    g = fp.granularity
    value_int = Fraction(noisy_sum, max(noisy_n, 1)) + centre
    value_int = min(max(value_int, Fraction(fp.a)), Fraction(fp.b))
    each = (1.0 + lvl) / 2.0
    ws, wn = sum_mech.halfwidth(each), count_mech.halfwidth(each)
    n_lo = noisy_n - wn
    if n_lo >= 1:
        corners = [
            Fraction(noisy_sum + ds, noisy_n + dn)
            for ds in (-ws, ws)
            for dn in (-wn, wn)
        ]
        lo_int = max(min(corners) + centre, Fraction(fp.a))
        hi_int = min(max(corners) + centre, Fraction(fp.b))
    else:
        lo_int, hi_int = Fraction(fp.a), Fraction(fp.b)
    return AggregateResult(
        value=float(value_int * g),
        interval=(float(lo_int * g), float(hi_int * g)),
        level=lvl,
        error_bound=float((hi_int - lo_int) * g / 2),
        accuracy=(
            f"the clipped mean (values rounded to multiples of {float(g)!r}) lies in the "
            f"interval with probability >= {lvl} (union bound over the sum and the count)"
        ),
        record=record,
        sensitivity=s * g,
        relation=relation,
        granularity=g,
    )


def _check_edges(bins: Any) -> npt.NDArray[np.float64]:
    try:
        edges = np.asarray(bins, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidCostError("bins", bins, "must be a sequence of numbers") from None
    if edges.ndim != 1 or edges.size < 2:
        raise InvalidCostError("bins", bins, "must hold at least two bin edges")
    if not np.all(np.isfinite(edges)) or not np.all(np.diff(edges) > 0):
        raise InvalidCostError("bins", bins, "edges must be finite and strictly increasing")
    return edges


def histogram(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    *,
    bins: Any = None,
    categories: Sequence[Any] | None = None,
    delta: Any = 0,
    mechanism: str | None = None,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
) -> AggregateResult:
    """Noisy counts over declared bins (numeric edges) or declared categories.

    Give ``bins`` (strictly increasing finite edges; bin i is [e_i, e_{i+1}), the last
    one closed, as `numpy.histogram()`) or ``categories`` (values compared with
    ``==``; others are dropped). Each record falls in at most one bin, so one record
    changes one count by 1 (add/remove) or two counts by 1 (substitution). Noise is
    independent per bin.

    Args:
        data: A 1-D array or Series.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        bins: The bin edges (declared, data-independent).
        categories: The declared categories (instead of ``bins``).
        delta: 0 for the discrete Laplace (default); > 0 selects the discrete Gaussian.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        level: Confidence level of each bin's interval.
        label: The ledger label (default ``"histogram"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.

    Examples:
        >>> from dpaccount import Accountant
        >>> res = histogram([0.5, 1.5, 1.7], Accountant(1), 1, bins=[0, 1, 2])
        >>> res.value.shape
        (2,)
    """
    relation, mech, lvl, edges, cats = _histogram_setup(
        accountant, epsilon, delta, mechanism, level, bins, categories, rng
    )
    _check_container(data)
    record = accountant.charge(mech, label=label or "histogram", query_id=query_id)
    if edges is not None:
        counts = histogram_counts(data, edges)
    else:
        index = {c: i for i, c in enumerate(cats)}
        counts = [0] * len(cats)
        values = data.tolist() if hasattr(data, "tolist") else list(data)
        for v in values:
            try:
                i = index.get(v)
            except TypeError:  # unhashable values are in no category
                i = None
            if i is not None:
                counts[i] += 1
    noisy = mech.release(counts)
    w = mech.halfwidth(lvl)
    out = np.asarray(noisy, dtype=np.float64)
    return AggregateResult(
        value=out,
        interval=(out - w, out + w),
        level=lvl,
        error_bound=float(w),
        accuracy=(
            f"each bin's true count is within ±{w} of its value with probability >= {lvl} "
            "(per bin, not simultaneously)"
        ),
        record=record,
        sensitivity=Fraction(1 if relation is Relation.ADD_REMOVE else 2),
        relation=relation,
    )


def quantile(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    q: Any,
    *,
    candidates: Any = None,
    lower: Any = None,
    upper: Any = None,
    grid_size: int = 1001,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
) -> AggregateResult:
    """A private q-quantile chosen by the exponential mechanism over a declared grid.

    Utility of candidate c: -|#{x <= c} - q n| (exact rationals). One record changes it
    by at most max(q, 1 - q) under add/remove (#{x <= c} and q n move together) and by 1
    under substitution, so the exponential mechanism with that sensitivity is epsilon-DP
    (McSherry and Talwar 2007, Thm 6; Dwork and Roth 2014, Thm 3.10; the quantile
    utility of Smith 2011, "Privacy-preserving statistical estimation with optimal
    convergence rates"). Accuracy (Dwork and Roth 2014, Thm 3.11): with probability
    >= level, the selected candidate's rank misses q n by at most the best candidate's
    miss plus (2 Δ / epsilon)(ln |grid| + ln(1 / (1 - level))).

    Args:
        data: A 1-D numeric array or Series.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        q: The quantile, in [0, 1].
        candidates: The declared candidate values (finite).
        lower: Instead of ``candidates``: a grid of ``grid_size`` evenly spaced points
            from ``lower`` to ``upper``.
        upper: See ``lower``.
        grid_size: Number of grid points (>= 2) with ``lower``/``upper``.
        level: Confidence level of the rank-error statement.
        label: The ledger label (default ``"quantile"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.

    Examples:
        >>> from dpaccount import Accountant
        >>> res = quantile(list(range(100)), Accountant(1), 1, "0.5", lower=0, upper=99,
        ...                grid_size=100)
        >>> res.cost.epsilon, res.interval is None
        (Fraction(1, 1), True)
    """
    relation = _check_accountant(accountant)
    eps = check_positive(epsilon, "epsilon")
    qf = to_fraction(q, "q")
    if not 0 <= qf <= 1:
        raise InvalidCostError("q", q, "must be in [0, 1]")
    lvl = _check_level(level)
    if candidates is not None:
        if lower is not None or upper is not None:
            raise ConfigError("give candidates= or lower=/upper=, not both")
        grid = np.unique(_float_array(candidates))
        if grid.size == 0 or not np.all(np.isfinite(grid)):
            raise InvalidCostError("candidates", candidates, "must be finite, at least one")
    else:
        if lower is None or upper is None:
            raise ConfigError("give candidates= or both lower= and upper=")
        lo, hi = _check_bounds(lower, upper)
        if isinstance(grid_size, bool) or not isinstance(grid_size, int) or grid_size < 2:
            raise InvalidCostError("grid_size", grid_size, "must be an integer >= 2")
        grid = np.unique(np.linspace(lo, hi, grid_size))
    sens = max(qf, 1 - qf) if relation is Relation.ADD_REMOVE else Fraction(1)
    mech = ExponentialMechanism(eps, sens, rng=rng)
    _check_container(data)
    record = accountant.charge(mech, label=label or "quantile", query_id=query_id)
    utilities = quantile_utilities(data, grid, qf)
    chosen = float(grid[mech.release(utilities)])
    miss = 1.0 - lvl
    rank_err = float_up(
        2 * sens / eps * Fraction(math.log(grid.size) + math.log(1.0 / miss)) * (1 + 1e-12)
    )
    return AggregateResult(
        value=chosen,
        interval=None,
        level=lvl,
        error_bound=rank_err,
        accuracy=(
            f"with probability >= {lvl} the value's rank is within the best grid point's "
            f"rank error + {rank_err:.4g} of q*n"
        ),
        record=record,
        sensitivity=sens,
        relation=relation,
    )

