"""Heterogeneous composition: Kairouz, Oh and Viswanath 2015, Thm 3.5.

For mechanisms that are (epsilon_l, delta_l)-DP, l = 1..k, and a slack delta~ in (0, 1],
the k-fold adaptive composition is (epsilon~, 1 - (1 - delta~) prod(1 - delta_l))-DP with

    epsilon~ = min( S1,  T + sqrt(2 S2 ln(e + sqrt(S2) / delta~)),  T + sqrt(2 S2 ln(1/delta~)) )

with S1 = sum eps_l, S2 = sum eps_l^2 and T = sum eps_l tanh(eps_l / 2),

where eps tanh(eps/2) = (e^eps - 1) eps / (e^eps + 1). The parameters must be fixed in
advance (adaptively chosen mechanisms, fixed parameters). dpaccount reports the delta as
delta~ + sum delta_l, which is at least 1 - (1 - delta~) prod(1 - delta_l) and exact in
rationals (so k separate charges and ``Repeated(c, k)`` agree to the last bit).

Examples:
    >>> c = heterogeneous([PrivacyCost("0.1")] * 1000, "1e-5")
    >>> 20.1 < float(c.epsilon) < 20.2
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import ZERO, float_down, float_up, up
from dpaccount.composition.advanced import check_slack, log_inv_up
from dpaccount.composition.base import Adaptivity
from dpaccount.composition.plans import FixedPlanRule, PlanState, as_cost
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["HeterogeneousRule", "KOVSums", "heterogeneous"]

THEOREM_HETEROGENEOUS = (
    "Kairouz, Oh and Viswanath 2015, Thm 3.5 (composition of heterogeneous "
    "(epsilon_l, delta_l) mechanisms); adaptive composition with fixed parameters"
)


def eps_tanh_up(epsilon: Fraction) -> Fraction:
    """An upper bound on epsilon (e^epsilon - 1) / (e^epsilon + 1) = epsilon tanh(epsilon/2)."""
    if epsilon == 0:
        return ZERO
    eps = float_up(epsilon)
    return min(up(eps * math.tanh(eps / 2), 8), epsilon)


@attrs.frozen
class KOVSums:
    """The running sums Thm 3.5 needs, all exact rationals.

    Attributes:
        eps: sum epsilon_l.
        eps_sq: sum epsilon_l^2.
        eps_tanh: sum of upper bounds on epsilon_l tanh(epsilon_l / 2).
        delta: sum delta_l.
    """

    eps: Fraction = ZERO
    eps_sq: Fraction = ZERO
    eps_tanh: Fraction = ZERO
    delta: Fraction = ZERO

    def plus(self, cost: PrivacyCost, count: int) -> KOVSums:
        """The sums with ``count`` more copies of ``cost``."""
        e = cost.epsilon
        return KOVSums(
            self.eps + e * count,
            self.eps_sq + e * e * count,
            self.eps_tanh + eps_tanh_up(e) * count,
            self.delta + cost.delta * count,
        )


def kov_bound(sums: KOVSums, slack: Fraction) -> PrivacyCost:
    """Thm 3.5's (epsilon~, delta~ + sum delta_l) from running sums, rounded up."""
    delta = slack + sums.delta
    if delta >= 1:
        raise InvalidCostError("delta", delta, "delta_slack + sum of deltas reaches 1")
    best = sums.eps
    if sums.eps_sq > 0:
        sq = float_up(sums.eps_sq)
        lin = float_up(sums.eps_tanh)
        # ln(e + sqrt(S2) / delta~) with every input rounded toward a larger value; the
        # relative factor covers the rounding of the sum, sqrt, division and log.
        e_up = math.nextafter(math.e, math.inf)
        if slack >= Fraction(1, 2**1000):
            second_log = math.log(e_up + math.sqrt(sq) / float_down(slack)) * (1 + 2**-48)
        else:  # a slack no double holds: ln(e + x / d) <= ln x + ln(1/d) + e d / x
            half_log = math.log(sq) / 2
            inv = log_inv_up(slack)
            second_log = half_log + inv + 2**-48 * (abs(half_log) + inv) + 2.0**-900
        second = lin + math.sqrt(2 * sq * second_log)
        third = lin + math.sqrt(2 * sq * log_inv_up(slack))
        best = min(best, up(second, 16), up(third, 16))
    return trusted_cost(best, delta)


def heterogeneous(costs: Iterable[Any], delta_slack: Any) -> PrivacyCost:
    """Compose a declared list of different (epsilon_l, delta_l): KOV 2015, Thm 3.5.

    The minimum of the theorem's three bounds, with delta = delta~ + sum delta_l.
    Proven for adaptively chosen mechanisms whose parameters are fixed in advance.

    Args:
        costs: The per-query costs (PrivacyCost, pairs or charges), at least one.
        delta_slack: delta~ in (0, 1).

    Examples:
        >>> c = heterogeneous([PrivacyCost(1), PrivacyCost(2)], "1e-6")   # basic wins
        >>> c.epsilon, c.delta == Fraction(1, 10**6)
        (Fraction(3, 1), True)
    """
    slack = check_slack(delta_slack)
    sums = KOVSums()
    seen = False
    for item in costs:
        sums = sums.plus(as_cost(item), 1)
        seen = True
    if not seen:
        raise InvalidCostError("costs", costs, "at least one cost is needed")
    return kov_bound(sums, slack)


class HeterogeneousRule(FixedPlanRule):
    """Accountant rule: KOV 2015 Thm 3.5 over a declared plan of (possibly) different costs.

    Running sums at each run start are precomputed, so ``add`` and ``total`` are O(1).
    Proven for adaptively chosen mechanisms with parameters fixed in advance; charges
    outside the plan are refused.

    Args:
        plan: ``(cost, k)``, a list of costs, or a Plan.
        delta_slack: delta~; if omitted, what ``budget`` leaves after the plan's deltas.
        budget: The ledger's budget (only for the default delta_slack).

    Examples:
        >>> rule = HeterogeneousRule(plan=[PrivacyCost("0.5"), PrivacyCost(1)],
        ...                          delta_slack="1e-6")
        >>> rule.total(rule.extend(rule.start(), PrivacyCost("0.5")))
        PrivacyCost(epsilon=0.5, delta=0)
    """

    name = "heterogeneous"
    adaptivity = Adaptivity.ADAPTIVE_MECHANISMS
    theorem = THEOREM_HETEROGENEOUS

    def __init__(
        self, plan: Any = None, delta_slack: Any = None, *, budget: Budget | None = None
    ) -> None:
        super().__init__(plan)
        starts: list[KOVSums] = []
        sums = KOVSums()
        for cost, n in self.plan.runs:
            starts.append(sums)
            sums = sums.plus(cost, n)
        self._starts = starts
        self._end = sums
        if delta_slack is None:
            if budget is None:
                raise ConfigError("the heterogeneous rule needs delta_slack (or budget=)")
            delta_slack = budget.delta - sums.delta
            if delta_slack <= 0:
                raise ConfigError(
                    f"the budget's delta {budget.delta} leaves no slack after the plan's "
                    f"deltas {sums.delta}"
                )
        self.delta_slack = check_slack(delta_slack)

    def sums_at(self, state: PlanState) -> KOVSums:
        """The running sums after ``state.position`` planned queries."""
        if state.run >= len(self.plan.runs):
            return self._end
        return self._starts[state.run].plus(self.plan.runs[state.run][0], state.used)

    def bound(self, state: PlanState) -> PrivacyCost | None:
        try:
            return kov_bound(self.sums_at(state), self.delta_slack)
        except InvalidCostError:
            return None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "delta_slack": str(self.delta_slack)}
