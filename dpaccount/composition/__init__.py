"""Composition rules: pure functions and accountant rules, each citing its theorem.

| rule | proven for | theorem |
|---|---|---|
| ``basic`` | fully adaptive | Dwork-Roth 2014 Thm 3.16; Rogers et al. 2016 Thm 3.6 |
| ``filter`` | fully adaptive | Whitehouse, Ramdas, Rogers and Wu 2023 (approximate-DP filter) |
| ``advanced`` | adaptive mechanisms, fixed plan | Dwork-Roth 2014 Thm 3.20 |
| ``heterogeneous`` | adaptive mechanisms, fixed plan | Kairouz-Oh-Viswanath 2015 Thm 3.5 |
| ``optimal`` | adaptive mechanisms, fixed plan | Kairouz-Oh-Viswanath 2015 Thm 3.3 |
| ``pld`` | adaptive mechanisms, fixed plan | privacy loss distributions (Dong-Roth-Su 2019) |
| ``rdp`` | fully adaptive | Rényi filter (Feldman and Zrnic 2021) |
| ``gdp`` | fully adaptive, Gaussian charges | Gaussian-DP filter (Smith and Thakurta 2022) |
| ``best`` | the declared adaptivity | the tightest of the above that is valid for it |

Tight accounting for Gaussian, Laplace and subsampled mechanisms lives in
`dpaccount.accounting`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpaccount.composition.advanced import (
    AdvancedRule,
    advanced,
    advanced_adaptive,
    advanced_simplified,
)
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.composition.basic import BasicRule, basic
from dpaccount.composition.best import COMPOSE_RULES, REGISTRY, best_rule, compose_by_name
from dpaccount.composition.filters import FilterRule, filter_epsilon
from dpaccount.composition.heterogeneous import HeterogeneousRule, heterogeneous
from dpaccount.composition.optimal import OptimalRule, optimal, optimal_delta
from dpaccount.composition.planning import (
    Plan,
    max_queries,
    per_query_epsilon,
    remaining_per_query,
)
from dpaccount.composition.subsampling import subsample
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, DPAccountError

__all__ = [
    "COMPOSE_RULES",
    "RELATION_RULES",
    "RULES",
    "Adaptivity",
    "AdvancedRule",
    "BasicRule",
    "FilterRule",
    "HeterogeneousRule",
    "OptimalRule",
    "Plan",
    "Rule",
    "advanced",
    "advanced_adaptive",
    "advanced_simplified",
    "basic",
    "best_rule",
    "compose_by_name",
    "filter_epsilon",
    "heterogeneous",
    "make_rule",
    "max_queries",
    "optimal",
    "optimal_delta",
    "per_query_epsilon",
    "remaining_per_query",
    "rule_from_description",
    "subsample",
]

def _pld_rule(**options: Any) -> Rule[Any]:
    from dpaccount.accounting.pld import PLDRule

    return PLDRule(**options)


def _rdp_rule(**options: Any) -> Rule[Any]:
    from dpaccount.accounting.rdp import RDPRule

    return RDPRule(**options)


def _gdp_rule(**options: Any) -> Rule[Any]:
    from dpaccount.accounting.rdp import GDPFilterRule

    return GDPFilterRule(**options)


#: Rule factories by name. Each takes the keyword arguments its rule needs (a declared
#: plan, a slack delta, the budget for defaults, the relation, ...). The tight engines
#: of `dpaccount.accounting` are imported when first used.
RULES: dict[str, Any] = {
    "basic": BasicRule,
    **REGISTRY,
    "pld": _pld_rule,
    "rdp": _rdp_rule,
    "gdp": _gdp_rule,
}

#: Rules that take the ledger's neighbouring relation.
RELATION_RULES = frozenset({"best", "pld", "rdp"})


def register_rule(name: str, factory: Any) -> None:
    """Add a rule factory under ``name`` (used by `dpaccount.accounting`)."""
    RULES[name] = factory


def make_rule(rule: str | Rule[Any], **options: Any) -> Rule[Any]:
    """Build the rule named ``rule`` (or return a Rule instance unchanged).

    Raises:
        ConfigError: For an unknown name or options the rule does not take.
    """
    if isinstance(rule, Rule):
        if options:
            raise ConfigError("options are given with the rule name, not a Rule instance")
        return rule
    if not isinstance(rule, str) or rule not in RULES:
        raise ConfigError(
            f"unknown composition rule {rule!r}; choose one of {sorted(RULES)}"
        )
    if rule == "basic":
        options.pop("budget", None)
    try:
        return RULES[rule](**options)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ConfigError(f"rule {rule!r}: {exc}") from exc


def rule_from_description(description: Mapping[str, Any]) -> Rule[Any]:
    """Rebuild a rule from the ``describe()`` dictionary a ledger stored with it.

    A fixed plan stored as ``[[epsilon, delta, count], ...]`` is read back as a `Plan`.
    The rebuilt rule must describe itself exactly as stored.

    Raises:
        ConfigError: The description does not rebuild to the same rule (a plan of
            mechanism charges, stored by name only, cannot be read back: restate the
            rule and its plan).
    """
    name = str(description.get("name"))
    options = {key: value for key, value in description.items() if key != "name"}
    plan = options.get("plan")
    try:
        if isinstance(plan, list) and all(isinstance(r, list) and len(r) == 3 for r in plan):
            options["plan"] = Plan(tuple((PrivacyCost(e, d), int(n)) for e, d, n in plan))
        rule = make_rule(name, **options)
    except DPAccountError as exc:
        raise ConfigError(
            f"the stored rule {name!r} cannot be rebuilt from its description ({exc}); "
            "give rule= (and plan=) as the ledger was created"
        ) from None
    if rule.describe() != dict(description):
        raise ConfigError(
            f"the stored rule {name!r} does not rebuild to the same rule; give rule= "
            "(and plan=) as the ledger was created"
        )
    return rule
