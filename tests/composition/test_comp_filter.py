"""The Whitehouse-Ramdas-Rogers-Wu privacy filter (ICML 2023, Thm 3.2).

The stopping rule: keep going while
sqrt(2 ln(1/delta') sum eps_m^2) + sum eps_m^2 / 2 <= epsilon and
sum delta_m <= delta - delta'. Counts below are derived here from that inequality in
50-digit Decimal arithmetic, independently of dpaccount's float code.
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from fractions import Fraction

import mpmath
import pytest

from dpaccount.accountant import Accountant
from dpaccount.charges import Repeated
from dpaccount.composition.filters import FilterRule, filter_epsilon
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import BudgetExceededError, ConfigError, InvalidCostError

CTX = Context(prec=50)


def filter_holds(n: int, eps: Decimal, slack: Decimal, budget_eps: Decimal) -> bool:
    s2 = n * eps * eps
    return CTX.sqrt(2 * CTX.ln(1 / slack) * s2) + s2 / 2 <= budget_eps


def filter_count(eps: Decimal, slack: Decimal, budget_eps: Decimal) -> int:
    """The largest n with the filter's condition true, from the quadratic in sqrt(n)."""
    # (eps^2/2) x^2 + eps sqrt(2 ln(1/d')) x - B = 0 with x = sqrt(n).
    a = eps * eps / 2
    b = eps * CTX.sqrt(2 * CTX.ln(1 / slack))
    x = (-b + CTX.sqrt(b * b + 4 * a * budget_eps)) / (2 * a)
    n = int(x * x)
    assert filter_holds(n, eps, slack, budget_eps)
    assert not filter_holds(n + 1, eps, slack, budget_eps)
    return n


def test_filter_count_for_budget_1_and_1e_5() -> None:
    # Budget (1.0, 1e-5), delta' = half the budget's delta, charges of 0.01 each.
    expected = filter_count(Decimal("0.01"), Decimal("5e-6"), Decimal(1))
    assert expected == 393  # the number stated in docs/composition.md
    budget = Budget("1.0", "1e-5")
    acct = Accountant(budget, rule=FilterRule(budget=budget))
    for _ in range(expected):
        acct.charge(PrivacyCost("0.01"))
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost("0.01"))
    assert len(acct.records) == expected
    # Basic composition admits only 100 of them.
    assert expected > 100


@pytest.mark.parametrize(
    ("eps", "slack", "budget"),
    [("0.001", "1e-9", "0.5"), ("0.05", "1e-6", "3"), ("0.2", "0.01", "10"), ("0.5", "1e-3", "4")],
)
def test_filter_counts_match_the_inequality(eps: str, slack: str, budget: str) -> None:
    expected = filter_count(Decimal(eps), Decimal(slack), Decimal(budget))
    rule = FilterRule(delta_slack=slack)
    limit = Budget(budget, Fraction(Decimal(slack)) * 2)
    state = rule.extend(rule.start(), Repeated(PrivacyCost(eps), expected))
    assert rule.admits(state, limit)
    assert not rule.admits(rule.extend(state, PrivacyCost(eps)), limit)


def test_filter_epsilon_matches_the_closed_form() -> None:
    costs = [PrivacyCost("0.01")] * 50 + [PrivacyCost("0.2", "1e-9")] * 7
    result = filter_epsilon(costs, "1e-6")
    s2 = 50 * Decimal("0.0001") + 7 * Decimal("0.04")
    ref = CTX.sqrt(2 * CTX.ln(Decimal(10) ** 6) * s2) + s2 / 2
    got = Decimal(result.epsilon.numerator) / Decimal(result.epsilon.denominator)
    assert ref <= got <= ref * (1 + Decimal("1e-12"))
    assert result.delta == Fraction(1, 10**6) + 7 * Fraction(1, 10**9)


def test_delta_accounting() -> None:
    # delta'' = budget delta - delta' = 5e-6 holds five charges of delta 1e-6.
    budget = Budget(10, "1e-5")
    rule = FilterRule(budget=budget)
    state = rule.extend(rule.start(), Repeated(PrivacyCost("0.01", "1e-6"), 5))
    assert rule.admits(state, budget)
    assert rule.total(state).delta == Fraction(1, 10**5)
    assert not rule.admits(rule.extend(state, PrivacyCost("0.01", "1e-9")), budget)


def test_filter_refuses_one_large_charge_that_basic_admits() -> None:
    # Documented: the filter is not uniformly tighter than basic composition.
    budget = Budget(1, "1e-5")
    rule = FilterRule(budget=budget)
    assert not rule.admits(rule.extend(rule.start(), PrivacyCost("0.5")), budget)


def test_configuration() -> None:
    with pytest.raises(ConfigError, match="delta_slack"):
        FilterRule()
    with pytest.raises(ConfigError, match="basic"):
        FilterRule(budget=Budget(1))
    with pytest.raises(ConfigError, match="exceeds"):
        FilterRule(delta_slack="1e-4", budget=Budget(1, "1e-5"))
    with pytest.raises(InvalidCostError):
        FilterRule(delta_slack=0)
    assert FilterRule(budget=Budget(1, "1e-5")).describe() == {
        "name": "filter",
        "delta_slack": "1/200000",
    }


def test_unlimited_budget_tracks_only_delta() -> None:
    rule = FilterRule(delta_slack="1e-6")
    budget = Budget.unlimited("1e-5")
    state = rule.extend(rule.start(), Repeated(PrivacyCost(5), 1000))
    assert rule.admits(state, budget)
    assert rule.total(state).epsilon > 5


@pytest.mark.parametrize(
    ("rule", "options"),
    [("filter", {}), ("rdp", {}), ("gdp", {"target_delta": "1e-6"})],
)
def test_filters_refuse_an_unlimited_budget(rule: str, options: dict[str, object]) -> None:
    # A filter certifies its budget; with none, spent would be an odometer claim that
    # no cited theorem covers under run-time parameters (issue: soundness, item 4).
    with pytest.raises(ConfigError, match="privacy filter"):
        Accountant(Budget.unlimited("1e-5"), rule=rule, rule_options=options or None)


def test_spent_meaning_is_stated_per_rule() -> None:
    from dpaccount.composition.base import SpentMeaning

    assert Accountant(Budget.unlimited()).spent_meaning is SpentMeaning.SUM
    assert Accountant(Budget(1, "1e-5"), rule="filter").spent_meaning is SpentMeaning.FILTER
    assert Accountant(Budget(1, "1e-5"), rule="rdp").spent_meaning is SpentMeaning.FILTER
    planned = Accountant(Budget(1, "1e-5"), rule="optimal", plan=(PrivacyCost("0.1"), 5))
    assert planned.spent_meaning is SpentMeaning.PLAN
    rdp_plan = Accountant(Budget(1, "1e-5"), rule="rdp", rule_options={"adaptive": False},
                          plan=(PrivacyCost("0.1"), 5))
    assert rdp_plan.spent_meaning is SpentMeaning.PLAN


def _renyi_filter_count(eps: float, delta: float, budget_eps: float) -> int:
    """How many pure-eps charges the Renyi filter admits, from its definition.

    Each charge has the RDP of the binary randomized response, which dominates every
    pure eps-DP pair (Kairouz, Oh and Viswanath 2015, Thm 2.4):
    ln((e^(alpha eps) + e^((1 - alpha) eps)) / (e^eps + 1)) / (alpha - 1), summed here
    at 40 digits with mpmath; at
    order alpha the n-fold sum converts to (epsilon, delta / |orders|) by
    R + ln(1 - 1/alpha) - (ln delta_split + ln alpha) / (alpha - 1) (Canonne, Kamath and
    Steinke 2020, Prop. 12); the filter admits while the smallest over the orders is
    within the budget.
    """
    from dpaccount.accounting.rdp import FILTER_ORDERS

    split = delta / len(FILTER_ORDERS)
    mpmath.mp.dps = 40
    e = mpmath.mpf(eps)
    rdp = {
        a: float(mpmath.log((mpmath.exp(a * e) + mpmath.exp((1 - a) * e)) / (mpmath.exp(e) + 1))
                 / (a - 1))
        for a in FILTER_ORDERS
    }

    def epsilon(n: int) -> float:
        return min(
            n * rdp[a] + math.log1p(-1 / a)
            - (math.log(split) + math.log(a)) / (a - 1)
            for a in FILTER_ORDERS
        )

    n = 0
    while epsilon(n + 1) <= budget_eps:
        n += 1
    return n


def test_best_picks_the_filter_that_admits_more_for_a_forecast() -> None:
    # Budget (1, 1e-5), charges of pure 0.01 (issue: soundness, item 5): the Renyi filter
    # admits 455 of them, the approximate-DP filter 393; with the charges forecast,
    # best must take the Renyi filter, and each record names it.
    renyi = _renyi_filter_count(0.01, 1e-5, 1.0)
    approximate = filter_count(Decimal("0.01"), Decimal("5e-6"), Decimal(1))
    assert (renyi, approximate) == (455, 393)
    acct = Accountant(Budget(1, "1e-5"), rule="best",
                      rule_options={"adaptivity": "fully_adaptive"},
                      plan=(PrivacyCost("0.01"), 1000))
    assert acct.rule.name == "rdp"
    for _ in range(renyi):
        acct.charge(PrivacyCost("0.01"))
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost("0.01"))
    assert {r.rule for r in acct.records} == {"rdp"}
    assert len(acct.records) == renyi
