"""Randomized response for one bit and for k categories, sampled exactly.

Each respondent reports their true category with probability p and each of the other
k - 1 categories with probability (1 - p) / (k - 1). The ratio of the probabilities of
any output under two different true answers is at most p (k - 1) / (1 - p), so one
report is epsilon-DP with epsilon = ln(p (k - 1) / (1 - p)). With p = e^eps / (e^eps + k - 1)
this is the k-ary randomized response ("k-RR") of Kairouz, Oh and Viswanath 2016,
"Extremal Mechanisms for Local Differential Privacy" (JMLR 17; the privacy bound is the
direct likelihood-ratio argument above);
for k = 2 it is Warner 1965, "Randomized response: a survey technique for eliminating
evasive answer bias" (JASA 60), with the epsilon of Dwork and Roth 2014, Sec. 3.2.

**The epsilon charged is the one implemented.** e^eps is irrational, so the mechanism
uses an exact rational ``r <= e^eps`` (the float exp(eps) stepped down twice, which
is below e^eps because libm's exp is within one ulp) and the probabilities
p = r / (r + k - 1), q = 1 / (r + k - 1), whose ratio is exactly r. The guarantee is
ln(r) <= eps, computed upward, and never above the requested eps. With
`RandomizedResponseMechanism.from_keep_probability()` the user's rational p is used
as given, and the charge is ln(p (k - 1) / (1 - p)) rounded up.

**Neighbouring relation.** One `release()` randomizes
one record's value: two values differ in one "record", so the guarantee is for
substitution (and, as a local randomizer, for whoever holds that one value). Randomizing
every value of a column with `release_many()` and
publishing the reports is epsilon-DP under substitution, since each report depends on one
record only (parallel composition, McSherry 2009, Thm 4); under add/remove the number of
reports still reveals the number of records.

Sampling uses one uniform integer below the common denominator of the probabilities
(exact; the OS CSPRNG by default).

Examples:
    >>> from dpaccount.mechanisms._sampling import RandomSource
    >>> rr = RandomizedResponseMechanism(1, categories=2, rng=RandomSource.seeded(0))
    >>> rr.charge.epsilon <= 1
    True
    >>> 0.7310 < float(rr.keep_probability) < 0.7311     # e / (e + 1)
    True
    >>> rr.release(1) in (0, 1)
    True
    >>> RandomizedResponseMechanism.from_keep_probability("3/4", 2).charge.epsilon > 1.0986
    True
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpaccount._numeric import check_count, check_positive, float_down, to_fraction, up
from dpaccount.charges import RandomizedResponseCharge
from dpaccount.errors import InvalidCostError, unreleasable
from dpaccount.mechanisms._sampling import RandomSource, resolve_rng
from dpaccount.mechanisms.base import Mechanism

__all__ = ["RandomizedResponseMechanism", "rational_exp_below"]


def rational_exp_below(epsilon: Fraction) -> Fraction:
    """An exact rational r with 1 <= r <= e^epsilon, within a few ulps of e^epsilon.

    exp is evaluated at a float <= epsilon and stepped down two ulps (libm's exp is
    within one ulp of the true value), so the result never exceeds e^epsilon.

    Examples:
        >>> r = rational_exp_below(Fraction(1))
        >>> 2.718281828459 < float(r) <= math.e
        True
    """
    value = math.exp(float_down(epsilon))
    for _ in range(2):
        value = math.nextafter(value, 0.0)
    return max(Fraction(value), Fraction(1))


def _log_up(value: Fraction) -> Fraction:
    """An upper bound on ln(value) for a rational value >= 1, as a Fraction.

    ln(value) = log1p(value - 1): value - 1 is exact, its float has relative error
    2^-53 and log1p is within an ulp, so a few ulps upward cover both (log1p(x) grows
    more slowly than x). Beyond the float range, ln n - ln d with an absolute margin.
    """
    if value <= 1:
        return Fraction(0)
    excess = value - 1
    if excess < Fraction(2) ** 1000:
        return up(math.log1p(float(excess)), ulps=8)
    return up(math.log(value.numerator) - math.log(value.denominator) + 1e-9)


class RandomizedResponseMechanism(Mechanism):
    """k-ary randomized response: keep the true category with probability p, else report
    one of the other k - 1 uniformly; epsilon = ln(p (k - 1) / (1 - p)).

    Theorem: Warner 1965 (k = 2); Kairouz, Oh and Viswanath 2016, Sec. 4 (k-RR); the
    privacy follows from the likelihood-ratio bound of Dwork and Roth 2014, Def. 2.4. It is
    one mechanism with fixed parameters (the accountant composes repeated use). See the
    module docstring for the rational probabilities and the neighbouring relation.

    Args:
        epsilon: > 0. The charge is ln(r) for the rational r <= e^epsilon actually used.
        categories: k >= 2. Values are category indices ``0..k-1`` (a bool counts as 0/1
            for k = 2).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Raises:
        InvalidCostError: An invalid epsilon or number of categories.

    Examples:
        >>> rr = RandomizedResponseMechanism("0.5", categories=4)
        >>> rr.charge.epsilon <= Fraction(1, 2)
        True
        >>> rr.probabilities(2)[2] == rr.keep_probability
        True
    """

    def __init__(self, epsilon: Any, categories: int = 2, *, rng: Any = None) -> None:
        eps = check_positive(epsilon, "epsilon")
        k = check_count(categories, "categories", minimum=2)
        ratio = rational_exp_below(eps)
        self._setup(ratio / (ratio + k - 1), k, rng)
        self._charge = RandomizedResponseCharge(min(self._epsilon, eps), k)

    @classmethod
    def from_keep_probability(
        cls, keep_probability: Any, categories: int = 2, *, rng: Any = None
    ) -> RandomizedResponseMechanism:
        """Randomized response with a given exact keep probability p in (1/k, 1).

        The charge is ln(p (k - 1) / (1 - p)), rounded up.

        Examples:
            >>> rr = RandomizedResponseMechanism.from_keep_probability("0.75", 2)
            >>> 1.0986 < float(rr.charge.epsilon) < 1.0987       # ln 3
            True
        """
        k = check_count(categories, "categories", minimum=2)
        p = to_fraction(keep_probability, "keep_probability")
        if not Fraction(1, k) < p < 1:
            raise InvalidCostError(
                "keep_probability", keep_probability, f"must be in (1/{k}, 1) for k = {k}"
            )
        self = cls.__new__(cls)
        self._setup(p, k, rng)
        self._charge = RandomizedResponseCharge(self._epsilon, k)
        return self

    def _setup(self, keep: Fraction, k: int, rng: Any) -> None:
        self._k = k
        self._keep = keep
        self._other = (1 - keep) / (k - 1)
        self._ratio = keep / self._other
        self._epsilon = _log_up(self._ratio)
        # A common denominator: P[keep] = a / total, P[each other] = b / total.
        common = math.lcm(keep.denominator, self._other.denominator)
        self._a = keep.numerator * (common // keep.denominator)
        self._b = self._other.numerator * (common // self._other.denominator)
        self._total = self._a + (k - 1) * self._b
        self._rng: RandomSource = resolve_rng(rng)

    @property
    def charge(self) -> RandomizedResponseCharge:
        """``RandomizedResponseCharge(ln r, k)`` for the exact ratio r = p / q implemented
        (ln r rounded up; its cost is ``PrivacyCost(ln r)``). The tight engines use the
        exact k-ary pair: losses +-ln r and 0, with masses p, q and (k - 2) q."""
        return self._charge

    @property
    def categories(self) -> int:
        """The number of categories k."""
        return self._k

    @property
    def keep_probability(self) -> Fraction:
        """p: the exact probability of reporting the true category."""
        return self._keep

    @property
    def other_probability(self) -> Fraction:
        """q = (1 - p) / (k - 1): the exact probability of each other category."""
        return self._other

    def probabilities(self, value: Any) -> list[Fraction]:
        """The exact output distribution for the true category ``value``."""
        v = self._category(value)
        return [self._keep if j == v else self._other for j in range(self._k)]

    def _category(self, value: Any) -> int:
        expected = f"a category index in 0..{self._k - 1}"
        if isinstance(value, bool | np.bool_):
            if self._k != 2:
                raise unreleasable(value, expected, "A boolean needs categories=2.")
            return int(value)
        if not isinstance(value, int | np.integer):
            raise unreleasable(value, expected)
        if not 0 <= value < self._k:
            raise unreleasable(value, expected, "The index is out of range.")
        return int(value)

    def _draw(self, v: int) -> int:
        u = self._rng.randbelow(self._total)
        if u < self._a:
            return v
        j = (u - self._a) // self._b  # uniform over 0..k-2
        return j if j < v else j + 1

    def release(self, value: Any) -> int:
        """Randomize one category index (or bool for k = 2); returns an index."""
        return self._draw(self._category(value))

    def release_many(self, values: Any) -> npt.NDArray[np.int64]:
        """Randomize each value of a 1-D array independently (one report per record)."""
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise unreleasable(values, "a 1-D array of category indices")
        return np.asarray([self._draw(self._category(v)) for v in arr.tolist()], np.int64)

    def estimate_counts(self, reports: Any) -> npt.NDArray[np.float64]:
        """Unbiased estimates of the true category counts from the reports.

        With observed counts c_j over n reports, E[c_j] = q n + (p - q) t_j, so
        t_j = (c_j - q n) / (p - q) is unbiased (post-processing: no extra privacy cost).
        """
        arr = np.asarray(reports, dtype=np.int64)
        counts = np.bincount(arr, minlength=self._k).astype(np.float64)
        n = float(arr.size)
        q, p = float(self._other), float(self._keep)
        return (counts - q * n) / (p - q)

    def __repr__(self) -> str:
        return (
            f"RandomizedResponseMechanism(categories={self._k}, "
            f"keep_probability={float(self._keep)!r}, epsilon={float(self._epsilon)!r})"
        )
