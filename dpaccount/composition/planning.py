"""Planning a fixed plan: the per-query epsilon by rule name, and the plan vocabulary.

`per_query_epsilon()` builds the named rule for a trial plan and asks its own
`admits()`; it needs the rules by name (`dpaccount.composition.best.build_rule`), so it
sits above them. Everything the rules themselves build on (`Plan`, `FixedPlanRule`,
`remaining_per_query()`, `max_queries()`, ...) lives in `dpaccount.composition.plans`
and is re-exported here, where it has always been imported from.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpaccount._numeric import ZERO, check_count, to_fraction
from dpaccount.charges import Repeated
from dpaccount.composition.best import build_rule
from dpaccount.composition.plans import (
    _BISECT_STEPS,
    FixedPlanRule,
    Plan,
    PlanState,
    _fits_after,
    as_cost,
    as_plan,
    last_fitting,
    max_queries,
    remaining_per_query,
)
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = [
    "FixedPlanRule",
    "Plan",
    "PlanState",
    "as_cost",
    "as_plan",
    "last_fitting",
    "max_queries",
    "per_query_epsilon",
    "remaining_per_query",
]


def per_query_epsilon(
    total_budget: Any,
    k: int,
    rule: str = "advanced",
    *,
    delta: Any = 0,
    **options: Any,
) -> PrivacyCost:
    """The largest per-query epsilon for a fixed plan of ``k`` equal queries.

    Solves, for the accountant rule ``rule`` built with ``plan=(cost, k)``, the largest
    epsilon whose whole plan is admitted by ``total_budget``; re-checked after solving.

    Args:
        total_budget: A `Budget` or ``(epsilon, delta)``.
        k: The number of queries.
        rule: ``"basic"``, ``"advanced"``, ``"heterogeneous"``, ``"optimal"`` or
            ``"filter"``.
        delta: The per-query delta.
        **options: Rule options (``delta_slack``, ``target_delta``); by default the
            rule takes what the budget leaves.

    Examples:
        >>> c = per_query_epsilon((1, "1e-5"), 1000, "advanced")
        >>> 0.0063 < float(c.epsilon) < 0.0064
        True
    """
    budget = total_budget if isinstance(total_budget, Budget) else Budget(*total_budget)
    k = check_count(k, "k")
    per_delta = to_fraction(delta, "delta")
    if budget.epsilon is None:
        raise InvalidCostError("total_budget", total_budget, "needs an epsilon limit")

    def fits(epsilon: Fraction) -> bool:
        cost = trusted_cost(epsilon, per_delta)
        try:
            r = build_rule(rule, plan=Plan.repeat(cost, k), budget=budget, **options)
        except (InvalidCostError, ConfigError):
            return False
        return _fits_after(r, r.start(), budget, Repeated(cost, k))

    if not fits(ZERO):
        raise InvalidCostError(
            "total_budget", total_budget, f"cannot hold {k} queries of delta {delta}"
        )
    lo, hi = 0.0, float(budget.epsilon)
    if fits(Fraction(hi)):
        return trusted_cost(Fraction(hi), per_delta)
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if fits(Fraction(mid)):
            lo = mid
        else:
            hi = mid
    answer = Fraction(lo)
    return trusted_cost(answer, per_delta)
