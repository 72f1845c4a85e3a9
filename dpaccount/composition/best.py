"""Choosing the tightest valid rule, and the closed-form rules by name.

`REGISTRY` and `build_rule()` build the closed-form rules (and ``best``) by name,
`compose_by_name()` composes a cost with one; every name a ledger may give is in
`dpaccount.composition.registry.RULES`, which builds on `REGISTRY`.

`best_rule()` picks, once and for all when a ledger is created, the rule that is
tightest *among those proven for the declared adaptivity*:

| declared adaptivity | candidates |
|---|---|
| ``FULLY_ADAPTIVE`` | basic, filter |
| ``ADAPTIVE_MECHANISMS`` or ``FIXED_PLAN``, with a plan | basic, filter, advanced, |
| | heterogeneous, optimal, pld |
| the same, with a plan of mechanism charges | pld, rdp (on the declared plan) |

Switching rules in the middle of a ledger is not covered by any of the theorems, so the
choice is made from the declared plan (or, for fully adaptive use without one, from the
budget: the filter when the budget has a delta, else basic). The chosen rule's ``name``
and ``theorem`` say which theorem is in force.

Examples:
    >>> rule = best_rule("adaptive_mechanisms", plan=(PrivacyCost("0.1"), 1000),
    ...                  budget=Budget(20, "1e-5"))
    >>> rule.name
    'optimal'
    >>> best_rule("fully_adaptive", budget=Budget(1, "1e-5")).name
    'filter'
"""

from __future__ import annotations

import contextlib
from typing import Any

from dpaccount._numeric import ZERO, check_count
from dpaccount.charges import GaussianCharge, Relation, Repeated, atoms
from dpaccount.composition.advanced import (
    THEOREM_ADAPTIVE,
    THEOREM_ADVANCED,
    THEOREM_SIMPLIFIED,
    AdvancedRule,
    advanced,
    advanced_adaptive,
    advanced_simplified,
    check_slack,
)
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.composition.basic import BasicRule
from dpaccount.composition.filters import THEOREM_FILTER, FilterRule, filter_value
from dpaccount.composition.heterogeneous import (
    THEOREM_HETEROGENEOUS,
    HeterogeneousRule,
    KOVSums,
    kov_bound,
)
from dpaccount.composition.optimal import THEOREM_OPTIMAL, OptimalRule, optimal
from dpaccount.composition.plans import Plan, as_cost, as_plan, last_fitting
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = [
    "COMPOSE_RULES",
    "REGISTRY",
    "best_rule",
    "build_rule",
    "compose_by_name",
]


def _as_adaptivity(value: Any) -> Adaptivity:
    if isinstance(value, Adaptivity):
        return value
    if isinstance(value, str):
        try:
            return Adaptivity[value.strip().upper()]
        except KeyError:
            pass
    raise ConfigError(
        f"unknown adaptivity {value!r}; use one of {[a.name.lower() for a in Adaptivity]}"
    )


def _as_budget(value: Any) -> Budget:
    if isinstance(value, Budget):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Budget(*value)
    if value is None:
        raise ConfigError("best_rule needs the ledger's budget (budget=...)")
    return Budget(value)


def _candidates(
    adaptivity: Adaptivity, plan: Plan | None, budget: Budget, relation: Relation
) -> list[Rule[Any]]:
    rules: list[Rule[Any]] = [BasicRule()]
    plan_delta = sum((c.delta * n for c, n in plan.runs), ZERO) if plan else ZERO
    if budget.delta > 0:
        slack = budget.delta - plan_delta if plan and budget.delta > plan_delta else None
        rules.append(FilterRule(slack if slack is not None else budget.delta / 2))
    if plan is None or adaptivity is Adaptivity.FULLY_ADAPTIVE or budget.delta <= plan_delta:
        return rules
    builders: list[Any] = [HeterogeneousRule]
    if plan.is_homogeneous:
        builders = [AdvancedRule, HeterogeneousRule, OptimalRule]
    for build in builders:
        try:
            rules.append(build(plan=plan, budget=budget))
        except (ConfigError, InvalidCostError):
            continue
    # The privacy-loss-distribution engine composes the declared plan numerically; it is
    # at least as tight as optimal composition on (epsilon, delta) plans and much tighter
    # for Gaussian, Laplace and subsampled charges.
    from dpaccount.accounting.pld import PLDRule

    with contextlib.suppress(ConfigError, InvalidCostError, UnsupportedChargeError):
        rules.append(PLDRule(plan=plan, budget=budget, relation=relation))
    return rules


def _prefix_admitted(rule: Rule[Any], runs: list[tuple[Any, int]], budget: Budget) -> int:
    """How many of the planned queries, in order, ``rule`` admits (binary search)."""

    def fits(j: int) -> bool:
        state = rule.start()
        left = j
        try:
            for charge, n in runs:
                if left == 0:
                    break
                take = min(n, left)
                state = rule.extend(state, Repeated(charge, take))
                left -= take
            return bool(rule.admits(state, budget))
        except (UnsupportedChargeError, InvalidCostError):
            return False

    total = sum(n for _, n in runs)
    return total if fits(total) else last_fitting(fits, 0, total)


def _tight_filters(runs: list[tuple[Any, int]], budget: Budget, relation: Relation
                   ) -> list[Rule[Any]]:
    """The fully adaptive filters of `dpaccount.accounting` that fit a forecast."""
    if budget.delta == 0:
        return []
    from dpaccount.accounting.gdp import GDPFilterRule
    from dpaccount.accounting.rdp import RDPRule

    rules: list[Rule[Any]] = [RDPRule(budget=budget, relation=relation)]
    if runs and all(isinstance(atom, GaussianCharge)
                    for charge, _ in runs for atom, _n in atoms(charge)):
        rules.append(GDPFilterRule(budget=budget))
    return rules


def _plan_engines(plan: Any, budget: Budget, relation: Relation) -> list[Rule[Any]]:
    """The tight engines for a declared plan of charges: the PLD engine, then the Renyi
    engine on the same plan (for bounded-range charges its per-order maximum over the
    pairs composes tighter than the PLD's single dominating pair)."""
    from dpaccount.accounting.pld import PLDRule
    from dpaccount.accounting.rdp import RDPRule

    rules: list[Rule[Any]] = [PLDRule(plan=plan, budget=budget, relation=relation)]
    with contextlib.suppress(ConfigError, InvalidCostError, UnsupportedChargeError):
        rules.append(RDPRule(budget=budget, plan=plan, adaptive=False, relation=relation))
    return rules


def _charge_runs(plan: Any) -> list[tuple[Any, int]] | None:
    """The plan as ``(atom, count)`` runs if it holds charges other than PrivacyCost."""
    if plan is None:
        return None
    from dpaccount.accounting.pld import plan_runs

    try:
        runs = plan_runs(plan)
    except (ConfigError, InvalidCostError):
        return None  # not a plan of charges; as_plan reads (or refuses) it
    if all(isinstance(atom, PrivacyCost) for atom, _ in runs):
        return None
    return runs


def _choose(rules: list[Rule[Any]], runs: list[tuple[Any, int]], budget: Budget) -> Rule[Any]:
    """The rule admitting the most of ``runs``; ties to the smallest epsilon, then order."""
    best: tuple[int, Any, int] | None = None
    chosen = rules[0]
    for order, rule in enumerate(rules):
        admitted = _prefix_admitted(rule, runs, budget)
        state = rule.start()
        try:
            for charge, n in runs:
                state = rule.extend(state, Repeated(charge, n))
            epsilon = rule.total(state).epsilon
        except (UnsupportedChargeError, InvalidCostError):
            continue
        key = (-admitted, epsilon, order)
        if best is None or key < best:
            best = key
            chosen = rule
    return chosen


def best_rule(
    adaptivity: Any = None,
    plan: Any = None,
    budget: Any = None,
    relation: Relation | str = Relation.ADD_REMOVE,
) -> Rule[Any]:
    """The tightest rule proven for ``adaptivity``, chosen for ``budget`` (and ``plan``).

    With a plan, every candidate proven for the declared adaptivity is run over the
    whole plan; the one that admits the most of it wins, ties going to the smallest
    total epsilon (then to the simplest rule). For fully adaptive use the plan is only
    a forecast: the candidates are basic, the filter, the Rényi filter and (for a
    forecast of plain Gaussian charges) the Gaussian-DP filter, all proven for
    parameters chosen at run time. Without a forecast it is the filter (basic for a
    pure-epsilon budget).

    Args:
        adaptivity: An `Adaptivity` or its name
            (``"fixed_plan"``, ``"adaptive_mechanisms"``, ``"fully_adaptive"``). By
            default ``"adaptive_mechanisms"`` when a plan is declared (the fixed-plan
            rules then refuse any charge outside it) and ``"fully_adaptive"`` otherwise.
        plan: The declared plan (``(cost, k)``, a list of costs, or a Plan); required
            for the fixed-plan rules to be considered.
        budget: The ledger's budget (required).
        relation: The ledger's neighbouring relation (for the PLD engine).

    Returns:
        A rule instance; its ``name`` and ``theorem`` record the choice.

    Raises:
        ConfigError: Unknown adaptivity or missing budget.
    """
    if adaptivity is None:
        adaptivity = (
            Adaptivity.ADAPTIVE_MECHANISMS if plan is not None else Adaptivity.FULLY_ADAPTIVE
        )
    level = _as_adaptivity(adaptivity)
    the_budget = _as_budget(budget)
    the_relation = Relation(relation)
    charge_runs = _charge_runs(plan)
    if charge_runs is not None:
        # A plan of mechanism charges (Gaussian, Laplace, subsampled), not just
        # (epsilon, delta) costs: the PLD engine reads it as a declared plan; for fully
        # adaptive use it is a forecast for choosing among the filters.
        if level is not Adaptivity.FULLY_ADAPTIVE:
            return _choose(_plan_engines(plan, the_budget, the_relation), charge_runs,
                           the_budget)
        rules = _candidates(level, None, the_budget, the_relation)
        return _choose(rules + _tight_filters(charge_runs, the_budget, the_relation),
                       charge_runs, the_budget)
    the_plan = as_plan(plan) if plan is not None else None
    rules = _candidates(level, the_plan, the_budget, the_relation)
    if the_plan is None:
        return rules[-1]
    runs = [(cost, n) for cost, n in the_plan.runs]
    if level is Adaptivity.FULLY_ADAPTIVE:
        rules += _tight_filters(runs, the_budget, the_relation)
    return _choose(rules, runs, the_budget)


def build_rule(name: str, **options: Any) -> Rule[Any]:
    """Build a rule by name, dropping options that rule does not take.

    ``plan`` is dropped for ``"basic"`` and ``"filter"``; ``budget`` for ``"basic"``.

    Raises:
        ConfigError: Unknown name or bad options.
    """
    if name == "basic":
        return BasicRule()
    if name == "filter":
        options.pop("plan", None)
    if name not in REGISTRY:
        raise ConfigError(f"unknown composition rule {name!r}; choose one of {sorted(REGISTRY)}")
    try:
        rule: Rule[Any] = REGISTRY[name](**options)
    except TypeError as exc:
        raise ConfigError(f"rule {name!r}: {exc}") from exc
    return rule


#: Accountant rule factories by name, for ``dpaccount.composition.RULES``.
REGISTRY: dict[str, Any] = {
    "advanced": AdvancedRule,
    "heterogeneous": HeterogeneousRule,
    "optimal": OptimalRule,
    "filter": FilterRule,
    "best": best_rule,
}

#: The names `compose_by_name()` accepts.
COMPOSE_RULES = (
    "basic",
    "advanced",
    "advanced_adaptive",
    "advanced_simplified",
    "heterogeneous",
    "optimal",
    "filter",
    "best",
)

_THEOREM_BASIC = BasicRule.theorem


def compose_by_name(
    rule_name: str, cost: Any, k: int, delta_slack: Any = None, *,
    optimal_limit: int | None = None,
) -> tuple[PrivacyCost, str]:
    """Compose ``k`` queries of ``cost`` with the named rule (the CLI's ``compose``).

    For ``"optimal"`` the target delta is delta_slack + k delta, the total delta the
    advanced rules report, so the epsilons are comparable. ``"filter"`` gives the
    smallest budget the filter would accept for this stream. ``"best"`` is the smallest
    epsilon among the rules proven for adaptively chosen mechanisms with a fixed plan
    (basic, advanced, heterogeneous, optimal; ``advanced_adaptive`` is left out because
    it is never below the better of basic and advanced).

    Args:
        rule_name: One of `COMPOSE_RULES`.
        cost: The per-query (epsilon, delta).
        k: The number of queries.
        delta_slack: delta' (required except for ``"basic"``).
        optimal_limit: For ``"best"``: leave the exact optimum out above this k (it is
            linear in k; the closed forms are O(1)).

    Returns:
        ``(composed cost, theorem citation)``.

    Examples:
        >>> total, theorem = compose_by_name("basic", PrivacyCost("0.1"), 10)
        >>> total, theorem.split(",")[0]
        (PrivacyCost(epsilon=1, delta=0), 'Dwork and Roth 2014')
    """
    the_cost = as_cost(cost)
    k = check_count(k, "k")
    if rule_name == "basic":
        return the_cost.times(k), _THEOREM_BASIC
    if rule_name not in COMPOSE_RULES:
        raise ConfigError(
            f"unknown composition rule {rule_name!r}; choose one of {list(COMPOSE_RULES)}"
        )
    if delta_slack is None:
        raise InvalidCostError("delta_slack", None, f"the {rule_name!r} rule needs a slack delta")
    slack = check_slack(delta_slack)
    if rule_name == "advanced":
        return advanced(the_cost, k, slack), THEOREM_ADVANCED
    if rule_name == "advanced_adaptive":
        return advanced_adaptive(the_cost, k, slack), THEOREM_ADAPTIVE
    if rule_name == "advanced_simplified":
        return advanced_simplified(the_cost, k, slack), THEOREM_SIMPLIFIED
    if rule_name == "heterogeneous":
        return kov_bound(KOVSums().plus(the_cost, k), slack), THEOREM_HETEROGENEOUS
    if rule_name == "optimal":
        return optimal(the_cost, k, slack + k * the_cost.delta), THEOREM_OPTIMAL
    if rule_name == "filter":
        delta = slack + k * the_cost.delta
        if delta >= 1:
            raise InvalidCostError("delta", delta, "delta_slack + k x delta reaches 1")
        epsilon = filter_value(the_cost.epsilon * the_cost.epsilon * k, slack)
        return trusted_cost(epsilon, delta), THEOREM_FILTER
    options: list[tuple[PrivacyCost, str]] = [(the_cost.times(k), _THEOREM_BASIC)]
    for name in ("advanced", "heterogeneous", "optimal"):
        if name == "optimal" and optimal_limit is not None and k > optimal_limit:
            continue
        try:
            options.append(compose_by_name(name, the_cost, k, slack))
        except InvalidCostError:
            continue
    return min(options, key=lambda pair: (pair[0].epsilon, pair[0].delta))
