"""Plans, the fixed-plan rule machinery, calibration inverses, best_rule and compose_by_name."""

from __future__ import annotations

import json
import math
from decimal import Context, Decimal
from fractions import Fraction

import pytest

from dpaccount.charges import Repeated
from dpaccount.composition.advanced import AdvancedRule, advanced
from dpaccount.composition.basic import BasicRule
from dpaccount.composition.best import COMPOSE_RULES, best_rule, build_rule, compose_by_name
from dpaccount.composition.filters import FilterRule
from dpaccount.composition.heterogeneous import HeterogeneousRule
from dpaccount.composition.optimal import OptimalRule, optimal
from dpaccount.composition.planning import (
    Plan,
    as_plan,
    max_queries,
    per_query_epsilon,
    remaining_per_query,
)
from dpaccount.composition.subsampling import subsample, subsampled
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

CTX = Context(prec=50)


def dec(value: Fraction) -> Decimal:
    return CTX.divide(Decimal(value.numerator), Decimal(value.denominator))


# -- plans --------------------------------------------------------------------------


def test_plan_forms() -> None:
    c = PrivacyCost("0.1")
    assert as_plan((c, 3)) == Plan.repeat(c, 3) == Plan.of([c, c, c])
    assert as_plan([c, c, PrivacyCost(1)]).runs == ((c, 2), (PrivacyCost(1), 1))
    assert as_plan((c, PrivacyCost(1))).count == 2  # a pair of costs is a list
    assert json.loads(json.dumps(Plan.repeat(c, 3).describe())) == [["1/10", "0", 3]]
    with pytest.raises(ConfigError):
        as_plan(None)
    with pytest.raises(InvalidCostError):
        Plan.of([])
    with pytest.raises(InvalidCostError):
        Plan.repeat(c, 0)


def test_heterogeneous_plan_is_followed_in_order() -> None:
    plan = [PrivacyCost("0.1"), PrivacyCost("0.5"), PrivacyCost("0.1")]
    rule = HeterogeneousRule(plan=plan, delta_slack="1e-6")
    state = rule.extend(rule.start(), PrivacyCost("0.1"))
    with pytest.raises(UnsupportedChargeError, match="query 3"):
        rule.extend(state, Repeated(PrivacyCost("0.5"), 2))  # query 3 was declared 0.1
    state = rule.extend(state, PrivacyCost("0.5"))
    state = rule.extend(state, PrivacyCost("0.1"))
    assert state.position == 3
    assert rule.total(state).epsilon == Fraction(7, 10)  # basic wins for three queries


# -- calibration --------------------------------------------------------------------


def test_remaining_per_query_filter_closed_form() -> None:
    # k queries of eps fit iff sqrt(2 L k) eps + k eps^2 / 2 <= B: a quadratic in eps.
    budget = Budget(1, "1e-5")
    rule = FilterRule(budget=budget)
    state = rule.extend(rule.start(), Repeated(PrivacyCost("0.02"), 50))
    k = 50
    s2_used = Decimal(50) * Decimal("0.0004")  # the filter depends on sum eps^2 only
    big_l = CTX.ln(Decimal(200000))
    # Largest S2 with sqrt(2 L S2) + S2/2 <= 1: y = sqrt(S2), y^2/2 + sqrt(2L) y - 1 = 0.
    y = -CTX.sqrt(2 * big_l) + CTX.sqrt(2 * big_l + 2)
    left_s2 = y * y - s2_used
    ref = CTX.sqrt(left_s2 / k)
    got = remaining_per_query(rule, state, budget, k)
    assert rule.admits(rule.extend(state, Repeated(got, k)), budget)
    assert dec(got.epsilon) <= ref
    assert (ref - dec(got.epsilon)) / ref < Decimal("1e-9")


def test_rule_remaining_matches_the_function() -> None:
    budget = Budget(2, "1e-5")
    rule = FilterRule(budget=budget)
    per_query = rule.remaining(rule.start(), budget, 10)
    assert per_query.delta == Fraction(1, 2 * 10**5) / 10
    cost = PrivacyCost(per_query.epsilon, per_query.delta)
    assert rule.admits(rule.extend(rule.start(), Repeated(cost, 10)), budget)


def test_remaining_for_a_fixed_plan_stays_within_the_plan() -> None:
    budget = Budget(1, "1e-5")
    rule = AdvancedRule(plan=(PrivacyCost("0.01"), 400), budget=budget)
    state = rule.extend(rule.start(), Repeated(PrivacyCost("0.01"), 100))
    answer = rule.remaining(state, budget, 300)
    assert answer.epsilon is not None
    assert answer.epsilon <= Fraction(1, 100)  # never more than the plan allows
    cost = PrivacyCost(answer.epsilon, answer.delta)
    assert rule.admits(rule.extend(state, Repeated(cost, 300)), budget)
    # Past the plan's end nothing fits.
    assert remaining_per_query(rule, state, budget, 301) == PrivacyCost(0)


def test_max_queries() -> None:
    budget = Budget(1, "1e-5")
    assert (
        max_queries(
            FilterRule(budget=budget),
            FilterRule(budget=budget).start(),
            budget,
            PrivacyCost("0.01"),
        )
        == 393
    )
    basic = BasicRule()
    assert max_queries(basic, basic.start(), budget, PrivacyCost("0.01")) == 100
    assert max_queries(basic, basic.start(), budget, PrivacyCost(2)) == 0
    assert max_queries(basic, basic.start(), budget, PrivacyCost(0)) is None
    plan_rule = OptimalRule(plan=(PrivacyCost("0.01"), 300), budget=budget)
    assert max_queries(plan_rule, plan_rule.start(), budget, PrivacyCost("0.01")) == 300


def test_per_query_epsilon_advanced_closed_form() -> None:
    # Largest eps with sqrt(2k ln(1/d')) eps + k eps (e^eps - 1) <= 1, d' = 1e-5, k = 1000.
    k, slack = 1000, Decimal("1e-5")
    lo, hi = Decimal(0), Decimal(1)
    for _ in range(150):
        mid = (lo + hi) / 2
        value = CTX.sqrt(2 * k * CTX.ln(1 / slack)) * mid + k * mid * (CTX.exp(mid) - 1)
        lo, hi = (mid, hi) if value <= 1 else (lo, mid)
    got = per_query_epsilon((1, "1e-5"), k, "advanced")
    assert dec(got.epsilon) <= lo
    assert (lo - dec(got.epsilon)) / lo < Decimal("1e-9")
    assert advanced(got, k, "1e-5").epsilon <= 1


def test_per_query_epsilon_for_each_rule_is_admitted() -> None:
    budget = Budget(1, "1e-6")
    values = {}
    for name in ("basic", "advanced", "heterogeneous", "optimal", "filter"):
        cost = per_query_epsilon(budget, 500, name)
        values[name] = cost.epsilon
        rule = build_rule(name, plan=(cost, 500), budget=budget)
        assert rule.admits(rule.extend(rule.start(), Repeated(cost, 500)), budget)
    assert Fraction(1, 500) * (1 - Fraction(1, 10**12)) <= values["basic"] <= Fraction(1, 500)
    assert values["optimal"] >= values["heterogeneous"] >= values["advanced"] > values["basic"]


# -- best ---------------------------------------------------------------------------


def test_best_rule_choices() -> None:
    plan = (PrivacyCost("0.1"), 1000)
    assert best_rule("adaptive_mechanisms", plan=plan, budget=(20, "1e-5")).name == "optimal"
    assert best_rule("fully_adaptive", budget=Budget(1, "1e-5")).name == "filter"
    assert best_rule("fully_adaptive", budget=Budget(1)).name == "basic"
    # Fully adaptive: the fixed-plan rules are never candidates, even with a plan.
    assert best_rule("fully_adaptive", plan=plan, budget=(30, "1e-5")).name == "filter"
    # Few large queries: basic admits the whole plan and is the tightest.
    few = (PrivacyCost("0.5"), 2)
    assert best_rule("fixed_plan", plan=few, budget=(1, 0)).name == "basic"
    with pytest.raises(ConfigError):
        best_rule("sometimes")
    with pytest.raises(ConfigError):
        best_rule("fixed_plan", plan=plan)


def test_compose_by_name() -> None:
    c = PrivacyCost("0.1")
    for name in COMPOSE_RULES:
        total, theorem = compose_by_name(name, c, 1000, "1e-5")
        assert total.epsilon <= 100
        assert any(str(year) in theorem for year in range(2006, 2024))
        assert "Thm" in theorem
    assert compose_by_name("optimal", c, 1000, "1e-5")[0] == optimal(c, 1000, "1e-5")
    best, theorem = compose_by_name("best", c, 1000, "1e-5")
    assert best == optimal(c, 1000, "1e-5")
    assert theorem.startswith("Kairouz")
    with pytest.raises(ConfigError):
        compose_by_name("magic", c, 3, "1e-5")
    with pytest.raises(InvalidCostError):
        compose_by_name("advanced", c, 3)


# -- subsampling --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "relation"),
    [("poisson", "add_remove"), ("without_replacement", "substitution")],
)
def test_subsample_formula(scheme: str, relation: str) -> None:
    for eps, delta, rate in (("1", "1e-6", "0.01"), ("0.1", "0", "0.5"), ("3", "1e-8", "1")):
        got = subsample(PrivacyCost(eps, delta), rate, scheme, relation)
        ref = CTX.ln(1 + Decimal(rate) * (CTX.exp(Decimal(eps)) - 1))
        assert ref <= dec(got.epsilon) <= ref * (1 + Decimal("1e-12"))
        assert got.delta == Fraction(Decimal(delta)) * Fraction(Decimal(rate))


def test_subsample_mismatch_and_invalid() -> None:
    with pytest.raises(UnsupportedChargeError, match="not substitution"):
        subsample(PrivacyCost(1), "0.1", "poisson", "substitution")
    with pytest.raises(UnsupportedChargeError, match="not add_remove"):
        subsample(PrivacyCost(1), "0.1", "without_replacement", "add_remove")
    with pytest.raises(InvalidCostError) as info:
        subsample(PrivacyCost(1), "0.1", "shuffle", "add_remove")
    assert info.value.field == "scheme"
    with pytest.raises(InvalidCostError) as info:
        subsample(PrivacyCost(1), "0", "poisson", "add_remove")
    assert info.value.field == "rate"
    assert subsampled(PrivacyCost(1), "0.5", "poisson", "add_remove").rate == Fraction(1, 2)
    assert math.isclose(
        float(subsample(PrivacyCost(1), "0.5", "poisson", "add_remove").epsilon),
        math.log(1 + 0.5 * math.expm1(1)),
        rel_tol=1e-12,
    )
