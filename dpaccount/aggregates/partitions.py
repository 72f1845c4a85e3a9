"""Private partition selection: which group keys a group-by may release.

When the group keys are not declared up front, the keys present in the data are
themselves private: a key that only one person holds reveals that person. Each observed
key with n distinct privacy units is released with a probability that depends on n
alone, with independent randomness per key; a unit's change moves one key's n by at most
1 (within each of the G groups it may reach). Two methods:

* `OptimalSelection` (the default, ``key_selection="optimal"``): the optimal
  (epsilon, delta) partition selection of Desfontaines, Voss, Gipson and Mandayam 2022,
  "Differentially private partition selection", PoPETs 2022 (1) (arXiv 2006.03684), its
  optimal mechanism for one partition per user (the recursion checked here against the
  two inequalities below and against PyDP's ``probability_of_keep``): release with
  probability pi_n, pi_0 = 0 and
  pi_n = min(e^eps pi_{n-1} + delta, 1 - e^-eps (1 - pi_{n-1} - delta), 1), the largest
  probabilities that the two (epsilon, delta) inequalities between n - 1 and n allow.
* `ThresholdSelection` (``key_selection="threshold"``, kept for reproducing earlier
  results): Laplace thresholding (Korolova, Kenthapadi, Mishra and Ntoulas 2009,
  "Releasing Search Queries and Clicks Privately", WWW 2009, Thm 1; Wilson et al. 2020,
  "Differentially Private SQL with Bounded User Contribution", PoPETs 2020, Sec. 3.2)
  with the exact discrete Laplace on the integer count. At the same per-key (epsilon,
  delta) the optimal one releases a key with 0 to 28 % fewer people (median 9 %; most
  at small epsilon and large delta) for release with probability 1/2 or 0.95
  (``benchmarks/bench_selection.py``).

**The guarantee for one key** (what each key's part of a `Parallel` charge states).
A mechanism M that releases a key with probability p(n) is (epsilon, delta)-DP for one
key between neighbours n and n + 1 (n >= 0, p(0) = 0: an absent key is never released)
iff, with p non-decreasing, p(n + 1) <= e^eps p(n) + delta and
1 - p(n) <= e^eps (1 - p(n + 1)) + delta (the two events "released" and "not released";
the other two inequalities hold by monotonicity): the output is one bit, so these two
events are all the (epsilon, delta) definition (Dwork and Roth 2014, Def. 2.4) asks
about.
`OptimalSelection` computes its probabilities as integers over 2**bits with a rational
L <= e^eps and the exact delta, rounding each pi_n *down* before the next step, so the
two inequalities hold exactly for the probabilities it samples with (an exact Bernoulli
draw), and every rounding only lowers a probability (a little less utility, never more
privacy loss). For `ThresholdSelection`: if the key is present on both sides, the
release (and the threshold test, post-processing) is epsilon-DP (Dwork and Roth 2014,
Thm 3.6, discrete form); if only one side holds it, the outputs differ only by the
event "released", of probability p = P[Y >= T - 1] = q^(T-1) / (1 + q), q = e^-eps, so
each key is (epsilon, p)-DP with T the smallest integer >= 2 with p <= delta. Keys are
selected with independent randomness, so the group-by's parallel composition (McSherry
2009, Thm 4) holds over keys as over declared groups. Both are one mechanism with fixed
parameters, valid under any adaptivity the ledger's rule allows.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, TypeAlias

import attrs

from dpaccount._numeric import down, float_down
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms._sampling import RandomSource, sample_discrete_laplace

__all__ = [
    "SELECTION_METHODS",
    "KeySelection",
    "OptimalSelection",
    "SelectionPreview",
    "ThresholdSelection",
    "calibrate_selection",
    "check_key_counts",
]

#: The key-selection methods of a group-by with undeclared keys (the first is the default).
SELECTION_METHODS = ("optimal", "threshold")

#: The most steps of `OptimalSelection`'s recursion (about 2 ln(1 / delta) / epsilon).
_MAX_STEPS = 1_000_000


def _check_delta(delta: Fraction) -> None:
    if not 0 < delta < 1:
        raise InvalidCostError(
            "delta", delta, "selecting keys privately needs a delta in (0, 1)"
        )


def _tail_up(q: float, m: int) -> float:
    """An upper bound on q^m / (1 + q) (a few roundings, each far below the margin)."""
    return (q**m / (1.0 + q)) * (1.0 + 1e-12)


def _first_at_least(probability: Any, level: float, start: int = 1) -> int:
    """The smallest n >= ``start`` with ``probability(n) >= level`` (non-decreasing)."""
    hi = max(start, 1)
    while probability(hi) < level:
        hi *= 2
    lo = start
    while lo < hi:
        mid = (lo + hi) // 2
        if probability(mid) >= level:
            hi = mid
        else:
            lo = mid + 1
    return lo


def check_key_counts(key_counts: Any) -> list[int]:
    """Declared (or public) counts of people per key: a mapping's values or a sequence of
    integers >= 0. `InvalidCostError` names the type, never a count."""
    values = key_counts.values() if isinstance(key_counts, Mapping) else key_counts
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidCostError(
            "key_counts", type(key_counts).__name__,
            "must be a sequence (or a mapping) of people per key",
        )
    out: list[int] = []
    for n in values:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidCostError(
                "key_counts", type(key_counts).__name__,
                "every count of people per key must be an integer >= 0",
            )
        out.append(int(n))
    return out


@attrs.frozen
class SelectionPreview:
    """What a key selection would release, stated before anything is spent.

    Attributes:
        method: ``"optimal"`` or ``"threshold"``.
        epsilon: Each key's epsilon for the selection.
        delta: Each key's delta: the most probability that a key held by one person is
            released.
        people_for_half: The fewest distinct people a key needs to be released with
            probability >= 1/2.
        people_for_95: The same for probability >= 0.95.
        expected_released: With ``key_counts`` given, the expected number of released
            keys (the sum of their release probabilities); else ``None``.
        keys_declared: How many key counts were given (``None`` without them).
    """

    method: str
    epsilon: Fraction
    delta: Fraction
    people_for_half: int
    people_for_95: int
    expected_released: float | None
    keys_declared: int | None


@attrs.frozen
class ThresholdSelection:
    """Release a key iff its count of distinct units plus discrete Laplace noise >= T.

    Attributes:
        epsilon: The per-key epsilon (the noise scale is 1 / epsilon).
        delta: The per-key delta: an upper bound on the chance that a key held by one
            unit is released.
        threshold: T, an integer >= 2.

    Examples:
        >>> sel = ThresholdSelection.calibrate(Fraction(1), Fraction(1, 10**6))
        >>> sel.threshold, sel.delta <= Fraction(1, 10**6)
        (15, True)
        >>> sel.cost
        PrivacyCost(epsilon=1, delta=...)
    """

    epsilon: Fraction
    delta: Fraction
    threshold: int

    method = "threshold"

    @classmethod
    def calibrate(cls, epsilon: Fraction, delta: Fraction) -> ThresholdSelection:
        """The smallest threshold whose per-key delta is at most ``delta``."""
        _check_delta(delta)
        # q rounded up: q^m / (1 + q) grows with q for m >= 1
        q = math.nextafter(math.exp(-float_down(epsilon)), math.inf)
        target = float_down(delta)
        m = max(1, math.ceil(math.log(target) / math.log(q)) - 1)
        while _tail_up(q, m) > target:
            m += 1
        while m > 1 and _tail_up(q, m - 1) <= target:
            m -= 1
        return cls(epsilon, Fraction(_tail_up(q, m)), m + 1)

    @property
    def cost(self) -> PrivacyCost:
        """``PrivacyCost(epsilon, delta)``: each key's guarantee."""
        return PrivacyCost(self.epsilon, self.delta)

    def keeps(self, unit_count: int, rng: RandomSource) -> bool:
        """Whether a key with this many distinct units is released (one fresh draw)."""
        return unit_count + sample_discrete_laplace(1 / self.epsilon, rng) >= self.threshold

    def select(self, unit_counts: Any, rng: RandomSource) -> list[bool]:
        """`keeps` for each key's count, with independent noise."""
        return [self.keeps(int(n), rng) for n in unit_counts]

    def release_probability(self, unit_count: int) -> float:
        """P[n + Y >= T] for the discrete Laplace Y (a float: for previews, not privacy).

        Examples:
            >>> sel = ThresholdSelection.calibrate(Fraction(1), Fraction(1, 10**6))
            >>> round(sel.release_probability(sel.threshold), 3)   # 1 / (1 + e^-1)
            0.731
        """
        if unit_count <= 0:
            return 0.0
        q = math.exp(-float(self.epsilon))
        k = self.threshold - unit_count  # P[Y >= k]
        return q**k / (1 + q) if k >= 1 else 1.0 - q ** (1 - k) / (1 + q)

    def preview(self, key_counts: Any = None) -> SelectionPreview:
        """People per key for release at 1/2 and 0.95, and the expected released keys."""
        return _preview(self, key_counts)


@attrs.frozen
class OptimalSelection:
    """Release a key with n distinct units with probability ``keep[n - 1] / 2**bits``.

    The optimal partition selection (Desfontaines et al. 2022), computed exactly
    (see the module's docstring): the probabilities are integers over ``2**bits``, from
    the recursion with ``exp_lower`` (a rational <= e^epsilon) and the exact ``delta``,
    each rounded down; from n = ``len(keep)`` on, a key is always released.

    Attributes:
        epsilon: The per-key epsilon.
        delta: The per-key delta, exactly: the two inequalities hold with it.
        exp_lower: The rational L <= e^epsilon the recursion used.
        bits: The probabilities' denominator is ``2**bits``.
        keep: Numerators of p_1, p_2, ..., the last equal to ``2**bits``.

    Examples:
        >>> sel = OptimalSelection.calibrate(Fraction(1), Fraction(1, 10**6))
        >>> sel.people_for(0.5), sel.release_probability(1) <= 1e-6
        (14, True)
        >>> sel.cost
        PrivacyCost(epsilon=1, delta=1e-06)
    """

    epsilon: Fraction
    delta: Fraction
    exp_lower: Fraction = attrs.field(repr=False)
    bits: int = attrs.field(repr=False)
    keep: tuple[int, ...] = attrs.field(repr=False)

    method = "optimal"

    @classmethod
    def calibrate(cls, epsilon: Fraction, delta: Fraction) -> OptimalSelection:
        """The optimal release probabilities for a per-key (epsilon, delta).

        Raises:
            InvalidCostError: ``delta`` not in (0, 1), or epsilon so small that the
                probabilities need more than a million steps to reach 1.
        """
        _check_delta(delta)
        exp_lower = max(down(math.exp(min(float_down(epsilon), 700.0))), Fraction(1))
        a, b = exp_lower.numerator, exp_lower.denominator  # L = a / b
        dn, dd = delta.numerator, delta.denominator
        # delta * 2**bits >= 2**64 * L: each rounding is far below a step's progress
        bits = max(64, 64 + (a * dd).bit_length() - (b * dn).bit_length() + 2)
        one = 1 << bits
        m, keep = 0, list[int]()
        while m < one:
            if len(keep) >= _MAX_STEPS:
                raise InvalidCostError(
                    "epsilon", epsilon,
                    "is too small for selecting keys (each key's epsilon): give the "
                    "selection more epsilon (selection_share), declare the keys, or use "
                    "key_selection='threshold'",
                )
            # floor(L m + delta 2**bits) and floor(2**bits - (2**bits - m - delta 2**bits) / L)
            grow = (a * m * dd + dn * one * b) // (b * dd)
            shrink = one + (-((one - m) * dd - dn * one) * b) // (a * dd)
            m = min(grow, shrink, one)
            keep.append(m)
        return cls(epsilon, delta, exp_lower, bits, tuple(keep))

    @property
    def cost(self) -> PrivacyCost:
        """``PrivacyCost(epsilon, delta)``: each key's guarantee."""
        return PrivacyCost(self.epsilon, self.delta)

    def keep_probability(self, unit_count: int) -> Fraction:
        """The exact probability that a key with this many distinct units is released."""
        if unit_count <= 0:
            return Fraction(0)
        if unit_count > len(self.keep):
            return Fraction(1)
        return Fraction(self.keep[unit_count - 1], 1 << self.bits)

    def release_probability(self, unit_count: int) -> float:
        """`keep_probability` as a float."""
        return float(self.keep_probability(unit_count))

    def keeps(self, unit_count: int, rng: RandomSource) -> bool:
        """Whether a key with this many distinct units is released (an exact Bernoulli)."""
        if unit_count <= 0:
            return False
        if unit_count >= len(self.keep):
            return True
        return rng.randbelow(1 << self.bits) < self.keep[unit_count - 1]

    def select(self, unit_counts: Any, rng: RandomSource) -> list[bool]:
        """`keeps` for each key's count, with independent randomness."""
        return [self.keeps(int(n), rng) for n in unit_counts]

    def people_for(self, level: float) -> int:
        """The fewest distinct people whose key is released with probability >= level."""
        need = Fraction(level) * (1 << self.bits)
        return bisect.bisect_left(self.keep, need) + 1

    def preview(self, key_counts: Any = None) -> SelectionPreview:
        """People per key for release at 1/2 and 0.95, and the expected released keys."""
        return _preview(self, key_counts)


#: A key selection: either method (both have ``cost``, ``select`` and ``preview``).
KeySelection: TypeAlias = OptimalSelection | ThresholdSelection


def calibrate_selection(method: str, epsilon: Fraction, delta: Fraction) -> KeySelection:
    """The key selection ``method`` (one of `SELECTION_METHODS`) for a per-key budget."""
    if method == "optimal":
        return OptimalSelection.calibrate(epsilon, delta)
    if method == "threshold":
        return ThresholdSelection.calibrate(epsilon, delta)
    raise ConfigError(
        f"unknown key_selection {method!r}; use 'optimal' (Desfontaines et al. 2022) or "
        "'threshold' (Laplace thresholding, as before)"
    )


def _preview(selection: KeySelection, key_counts: Any) -> SelectionPreview:
    counts = None if key_counts is None else check_key_counts(key_counts)
    prob = selection.release_probability
    expected = None if counts is None else math.fsum(prob(n) for n in counts)
    return SelectionPreview(
        selection.method, selection.epsilon, selection.delta,
        _first_at_least(prob, 0.5), _first_at_least(prob, 0.95),
        expected, None if counts is None else len(counts),
    )
