"""Group privacy: what an (epsilon, delta) guarantee for one record says about g records.

If M is (epsilon, delta)-DP for neighbours that differ in one record, then for datasets
x_0 and x_g that differ in g records, walk from one to the other a record at a time
(x_0, x_1, ..., x_g, each a neighbour of the next) and apply the guarantee at each step:

    P[M(x_0) in S] <= e^eps P[M(x_1) in S] + delta
                   <= ... <= e^(g eps) P[M(x_g) in S] + delta (1 + e^eps + ... + e^((g-1) eps))

so M is (g epsilon, delta (e^(g epsilon) - 1) / (e^epsilon - 1))-DP for groups of g
(Dwork and Roth 2014, Thm 2.2 for delta = 0; Vadhan 2017, "The complexity of
differential privacy", Lemma 2.2, states the weaker g e^(g epsilon) delta for the delta
term). The rule that composed M does not matter: any (epsilon, delta) guarantee of the
whole interaction, adaptive or not, is a guarantee of one randomized algorithm.

Examples:
    >>> group_cost(PrivacyCost("0.5"), 3)
    PrivacyCost(epsilon=1.5, delta=0)
    >>> c = group_cost(PrivacyCost(1, "1e-6"), 2)          # delta (1 + e)
    >>> c.epsilon, 3.718e-6 < float(c.delta) < 3.7183e-6
    (Fraction(2, 1), True)
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpaccount._numeric import ZERO, check_count, exp_up, float_down, float_up, up
from dpaccount.costs import PrivacyCost, trusted_cost
from dpaccount.errors import InvalidCostError

__all__ = ["GROUP_THEOREM", "group_cost"]

GROUP_THEOREM = (
    "group privacy: Dwork and Roth 2014, Thm 2.2 (g records: g epsilon); for delta, the "
    "same chain gives delta (e^(g epsilon) - 1) / (e^epsilon - 1) (Vadhan 2017, Lemma 2.2)"
)


#: Beyond this exponent e^x overflows a float (math.exp raises at about 709.8).
_EXP_SAFE = 700


def _geometric_up(epsilon: Fraction, size: int) -> float:
    """A float >= 1 + e^eps + ... + e^((size-1) eps) = (e^(size eps) - 1) / (e^eps - 1)."""
    if size * epsilon > _EXP_SAFE:
        return math.inf  # too large to certify (the caller reports no guarantee)
    bound = size * exp_up(size * epsilon)  # each term is at most e^(size eps)
    low = float_down(epsilon)
    if low > 0:
        top = math.expm1(float_up(size * epsilon))
        bottom = math.expm1(low)
        for _ in range(2):
            top, bottom = math.nextafter(top, math.inf), math.nextafter(bottom, 0.0)
        if bottom > 0 and math.isfinite(top):
            bound = min(bound, math.nextafter(top / bottom, math.inf))
    return bound


def group_cost(cost: PrivacyCost, size: int) -> PrivacyCost:
    """The (epsilon, delta) guarantee for ``size`` records of an (epsilon, delta)
    guarantee for one: (size epsilon, delta (e^(size eps) - 1) / (e^eps - 1)), the delta
    rounded up (exact when epsilon or delta is 0).

    Raises:
        InvalidCostError: ``size`` is not a positive integer, or the group's delta
            reaches 1 (no guarantee is left for the group).
    """
    size = check_count(size, "size")
    epsilon = cost.epsilon * size
    if cost.delta == 0:
        return trusted_cost(epsilon, ZERO)
    if cost.epsilon == 0:
        delta = cost.delta * size
    else:
        factor = _geometric_up(cost.epsilon, size)
        product = float_up(cost.delta) * factor
        delta = up(product) if math.isfinite(product) and product < 1 else Fraction(1)
    if delta >= 1:
        raise InvalidCostError(
            "delta", "<group>", f"group privacy for {size} records leaves delta >= 1: no "
            "guarantee is left for the group")
    return trusted_cost(epsilon, delta)
