"""Exact fixed-point arithmetic: the implemented true answers the aggregates add noise to.

Summing floats in floating point can change by more than the ideal ``upper - lower`` when
one record changes, because rounding depends on the other records and on their order
(Casacuberta, Shoemate, Vadhan and Wagaman 2022, "Widespread Underestimation of
Sensitivity in Differentially Private Libraries and How to Fix It", ACM CCS). Here each
value is clipped to the declared bounds and rounded to the lattice ``g * Z`` (g a power
of two, so ``x / g`` is exact), and the integers are summed exactly. Clipping and rounding
are monotone, so every record maps to an integer in ``[a, b]``; the sensitivities are in
those integer units, exactly, whatever the other records and their order.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from dpaccount._numeric import check_positive, to_fraction
from dpaccount.aggregates._checks import check_bounds, check_edges, float_array
from dpaccount.charges import Relation
from dpaccount.errors import InvalidCostError
from dpaccount.mechanisms._sampling import power_of_two_at_most

__all__ = [
    "FixedPoint",
    "exact_sum",
    "histogram_counts",
    "lattice_sum",
    "mean_estimate",
    "quantile_utilities",
    "sum_sensitivity",
]

#: Default lattice: g = the largest power of two <= max(|lower|, |upper|) / 2**30.
_LATTICE_BITS = 30
#: int64 chunks are summed only while their total provably fits in 2**62.
_INT64_LIMIT = 2**62


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
        lo, hi = check_bounds(lower, upper)
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
    ints = fp.to_ints(float_array(data))
    return exact_sum(ints, max(abs(fp.a), abs(fp.b))) - int(ints.size) * centre


def quantile_utilities(data: Any, grid: Any, q: Fraction) -> list[Fraction]:
    """The implemented utilities of `quantile()`: -|#{x <= c} - q n| per candidate c.

    Examples:
        >>> quantile_utilities([1.0, 2.0, 3.0, 4.0], [2.0, 3.0], Fraction(1, 2))
        [Fraction(0, 1), Fraction(-1, 1)]
    """
    arr = np.sort(float_array(data))  # NaN sorts last: above every candidate
    ranks = np.searchsorted(arr, np.asarray(grid, dtype=np.float64), side="right").tolist()
    target = q * int(arr.size)
    return [-abs(r - target) for r in ranks]


def histogram_counts(data: Any, edges: Any) -> list[int]:
    """The implemented true counts of `histogram()` over numeric bin edges.

    Examples:
        >>> histogram_counts([0.5, 1.5, 2.0, 9.0, float("nan")], [0, 1, 2])
        [1, 2]
    """
    arr = float_array(data)
    arr = arr[np.isfinite(arr)]
    return [int(c) for c in np.histogram(arr, bins=check_edges(edges))[0].tolist()]


def mean_estimate(
    noisy_sum: int, noisy_n: int, ws: int, wn: int, centre: int, fp: FixedPoint
) -> tuple[Fraction, Fraction, Fraction]:
    """The mean (lattice units) from a noisy centred sum and a noisy count, and its interval.

    The estimate is ``noisy_sum / max(noisy_n, 1) + centre`` clipped to ``[a, b]``
    (post-processing). When the sum's noise is within ``ws`` and the count's within
    ``wn``, the true clipped mean is among the corners (sum ± ws) / (n ± wn) + centre,
    as long as n - wn >= 1; otherwise the interval is the whole range ``[a, b]``.

    Examples:
        >>> fp = FixedPoint.build(0, 10, granularity=1)
        >>> mean_estimate(0, 100, 10, 5, 5, fp)
        (Fraction(5, 1), Fraction(93, 19), Fraction(97, 19))
    """
    a, b = Fraction(fp.a), Fraction(fp.b)
    value = min(max(Fraction(noisy_sum, max(noisy_n, 1)) + centre, a), b)
    if noisy_n - wn < 1:
        return value, a, b
    corners = [Fraction(noisy_sum + ds, noisy_n + dn) for ds in (-ws, ws) for dn in (-wn, wn)]
    return value, max(min(corners) + centre, a), min(max(corners) + centre, b)


def to_float(k: int, g: Fraction) -> float:
    return float(k * g)
