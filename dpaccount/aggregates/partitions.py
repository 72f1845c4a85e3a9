"""Private partition selection: which group keys a group-by may release.

When the group keys are not declared up front, the keys present in the data are
themselves private: a key that only one person holds reveals that person. Each observed
key is released only if its noisy count of distinct privacy units clears a threshold
(Laplace thresholding: Korolova, Kenthapadi, Mishra and Ntoulas 2009, "Releasing Search
Queries and Clicks Privately", WWW 2009, Thm 1; Wilson et al. 2020, "Differentially
Private SQL with Bounded User Contribution", PoPETs 2020, Sec. 3.2; Desfontaines, Voss,
Gipson and Mandayam 2022, "Differentially private partition selection", PoPETs 2022,
survey it and give the optimal rule, which this simpler rule approaches for small delta).
The noise here is the exact discrete Laplace on the integer count.

**The guarantee for one key** (what each key's part of a `Parallel` charge states).
Let n be the key's count of distinct units, one unit change moving it by at most 1, Y
discrete Laplace with P[Y = y] ∝ q^|y|, q = exp(-epsilon), and the key released iff
n + Y >= T. If the key is present on both sides, the release (and the threshold test,
post-processing) is epsilon-DP (Dwork and Roth 2014, Thm 3.6, discrete form). If only
one side holds it (n = 1 there, absent on the other, where it is never released), the
two output distributions differ only by the event "released", of probability
p = P[Y >= T - 1] = q^(T-1) / (1 + q) (the geometric tail); that pair is (0, p)-DP in
both directions. So each key is (epsilon, p)-DP, and T is the smallest integer >= 2 with
p <= delta. Keys are selected with independent noise, so the group-by's parallel
composition (McSherry 2009, Thm 4) holds over keys as over declared groups.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import float_down
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError
from dpaccount.mechanisms._sampling import RandomSource, sample_discrete_laplace

__all__ = ["ThresholdSelection"]


def _tail_up(q: float, m: int) -> float:
    """An upper bound on q^m / (1 + q) (a few roundings, each far below the margin)."""
    return (q**m / (1.0 + q)) * (1.0 + 1e-12)


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

    @classmethod
    def calibrate(cls, epsilon: Fraction, delta: Fraction) -> ThresholdSelection:
        """The smallest threshold whose per-key delta is at most ``delta``."""
        if not 0 < delta < 1:
            raise InvalidCostError(
                "delta", delta, "selecting keys privately needs a delta in (0, 1)"
            )
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
