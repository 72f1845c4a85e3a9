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
| ``zcdp`` | fully adaptive, charges with a rho | zCDP filter (Feldman and Zrnic 2021, Thm 3.1) |
| ``best`` | the declared adaptivity | the tightest of the above that is valid for it |

Tight accounting for Gaussian, Laplace and subsampled mechanisms lives in
`dpaccount.accounting`.
"""

from __future__ import annotations

from dpaccount.composition.advanced import (
    AdvancedRule,
    advanced,
    advanced_adaptive,
    advanced_simplified,
)
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.composition.basic import BasicRule, basic
from dpaccount.composition.best import COMPOSE_RULES, best_rule, compose_by_name
from dpaccount.composition.best import REGISTRY as REGISTRY  # importable, not in __all__
from dpaccount.composition.filters import FilterRule, filter_epsilon
from dpaccount.composition.heterogeneous import HeterogeneousRule, heterogeneous
from dpaccount.composition.optimal import OptimalRule, optimal, optimal_delta
from dpaccount.composition.planning import (
    Plan,
    max_queries,
    per_query_epsilon,
    remaining_per_query,
)
from dpaccount.composition.registry import (
    RELATION_RULES,
    RULES,
    make_rule,
    rule_from_description,
)
from dpaccount.composition.registry import register_rule as register_rule  # (likewise)
from dpaccount.composition.subsampling import subsample
from dpaccount.composition.zcdp import ZCDPRule, zcdp_conversion

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
    "ZCDPRule",
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
    "zcdp_conversion",
]
