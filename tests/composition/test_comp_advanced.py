"""Advanced composition and its variants against closed forms evaluated independently.

The reference values are computed here with 50-digit :mod:`decimal` arithmetic from the
formulas as printed in the cited theorems, not with dpaccount's float code.
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.composition.advanced import (
    AdvancedRule,
    advanced,
    advanced_adaptive,
    advanced_simplified,
)
from dpaccount.composition.heterogeneous import HeterogeneousRule, heterogeneous
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

CTX = Context(prec=50)


def dec(value: Fraction) -> Decimal:
    return CTX.divide(Decimal(value.numerator), Decimal(value.denominator))


def ref_advanced(eps: Decimal, k: int, slack: Decimal) -> Decimal:
    """Dwork and Roth 2014, Thm 3.20: sqrt(2k ln(1/d')) eps + k eps (e^eps - 1)."""
    root = CTX.sqrt(2 * k * CTX.ln(1 / slack))
    return CTX.add(root * eps, k * eps * (CTX.exp(eps) - 1))


def ref_a(eps: Decimal) -> Decimal:
    """a(eps) of the seed notes: eps (e^eps - 1) for eps <= ln 2, else eps."""
    return eps * (CTX.exp(eps) - 1) if eps <= CTX.ln(Decimal(2)) else eps


def ref_adaptive(eps: Decimal, k: int, slack: Decimal) -> Decimal:
    a = ref_a(eps)
    return k * a + CTX.sqrt(2 * k * CTX.ln(1 / slack)) * (eps + a)


def ref_kov(epsilons: list[Decimal], slack: Decimal) -> Decimal:
    """Kairouz, Oh and Viswanath 2015, Thm 3.5: the minimum of its three bounds."""
    s1 = sum(epsilons, Decimal(0))
    s2 = sum((e * e for e in epsilons), Decimal(0))
    t = sum(((CTX.exp(e) - 1) * e / (CTX.exp(e) + 1) for e in epsilons), Decimal(0))
    e_const = CTX.exp(Decimal(1))
    second = t + CTX.sqrt(2 * s2 * CTX.ln(e_const + CTX.sqrt(s2) / slack))
    third = t + CTX.sqrt(2 * s2 * CTX.ln(1 / slack))
    return min(s1, second, third)


def assert_tight_upper(got: Fraction, ref: Decimal, rel: float = 1e-12) -> None:
    value = dec(got)
    assert value >= ref, (value, ref)
    assert (value - ref) / max(ref, Decimal("1e-300")) <= Decimal(rel)


CASES = [
    ("0.1", "0", 1000, "1e-6"),
    ("0.1", "0", 1000, "1e-5"),
    ("0.01", "1e-9", 100, "1e-5"),
    ("1", "0", 10, "1e-9"),
    ("0.5", "0", 1, "0.5"),
    ("2.5", "1e-7", 77, "1e-3"),
    (0.3, 0, 5000, 1e-8),
]


@pytest.mark.parametrize(("eps", "delta", "k", "slack"), CASES)
def test_advanced_matches_thm_3_20(eps: object, delta: object, k: int, slack: object) -> None:
    cost = PrivacyCost(eps, delta)
    result = advanced(cost, k, slack)
    slack_f = PrivacyCost(0, slack).delta
    assert_tight_upper(result.epsilon, ref_advanced(dec(cost.epsilon), k, dec(slack_f)))
    assert result.delta == slack_f + k * cost.delta  # exact


def test_issue_example_1000_queries_of_a_tenth() -> None:
    # Issue 3: 1000 queries of 0.1 cost 100 under basic composition and "roughly 26"
    # under Thm 3.20 (delta' = 1e-5: sqrt(2000 ln 1e5)/10 + 100 (e^0.1 - 1) = 25.69...).
    result = advanced(PrivacyCost("0.1"), 1000, "1e-5")
    assert 25 < result.epsilon < 27


@pytest.mark.parametrize(("eps", "delta", "k", "slack"), CASES)
def test_advanced_adaptive_matches_a_epsilon_form(
    eps: object, delta: object, k: int, slack: object
) -> None:
    cost = PrivacyCost(eps, delta)
    result = advanced_adaptive(cost, k, slack)
    slack_f = PrivacyCost(0, slack).delta
    assert_tight_upper(result.epsilon, ref_adaptive(dec(cost.epsilon), k, dec(slack_f)))
    assert result.delta == slack_f + k * cost.delta


def test_a_epsilon_switches_at_ln2() -> None:
    # Below ln 2 the linear term is k eps (e^eps - 1); above, k eps (never more than basic).
    below = advanced_adaptive(PrivacyCost("0.6"), 1, "0.5")
    above = advanced_adaptive(PrivacyCost("0.8"), 1, "0.5")
    root = math.sqrt(2 * math.log(2))
    assert float(below.epsilon) == pytest.approx(
        0.6 * math.expm1(0.6) + root * (0.6 + 0.6 * math.expm1(0.6)), rel=1e-12
    )
    assert float(above.epsilon) == pytest.approx(0.8 + root * 1.6, rel=1e-12)


def test_simplified_form_inside_its_range() -> None:
    cost = PrivacyCost("0.01")
    result = advanced_simplified(cost, 100, "1e-5")
    ref = 2 * Decimal("0.01") * CTX.sqrt(200 * CTX.ln(Decimal(10) ** 5))
    assert_tight_upper(result.epsilon, ref)
    # Inside the range it is never below Thm 3.20 (that is why it is valid there).
    assert result.epsilon >= advanced(cost, 100, "1e-5").epsilon


def test_simplified_form_validity_boundary() -> None:
    # Valid iff k (e^eps - 1)^2 <= 2 ln(1/delta'); the boundary k derived in Decimal.
    eps, slack = Decimal("0.01"), Decimal("1e-5")
    bound = 2 * CTX.ln(1 / slack) / (CTX.exp(eps) - 1) ** 2
    k_max = int(bound)
    assert bound - k_max > Decimal("1e-6")  # not a razor-edge case
    assert advanced_simplified(PrivacyCost("0.01"), k_max, "1e-5").epsilon > 0
    with pytest.raises(UnsupportedChargeError, match="proven only when"):
        advanced_simplified(PrivacyCost("0.01"), k_max + 1, "1e-5")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((PrivacyCost(1), 0, "1e-5"), "k"),
        ((PrivacyCost(1), 1.0, "1e-5"), "k"),
        ((PrivacyCost(1), True, "1e-5"), "k"),
        ((PrivacyCost(1), 3, 0), "delta_slack"),
        ((PrivacyCost(1), 3, 1), "delta_slack"),
        ((PrivacyCost(1), 3, float("nan")), "delta_slack"),
        ((PrivacyCost(1), 3, "-0.1"), "delta_slack"),
        (("x", 3, "1e-5"), "cost"),
        ((PrivacyCost(1000), 3, "1e-5"), "epsilon"),
        ((PrivacyCost(1, "0.4"), 3, "0.1"), "delta"),
    ],
)
def test_invalid_input_is_refused(args: tuple[object, ...], field: str) -> None:
    for formula in (advanced, advanced_adaptive, advanced_simplified):
        with pytest.raises(InvalidCostError) as info:
            formula(*args)  # type: ignore[arg-type]
        assert info.value.field == field


def test_kov_heterogeneous_matches_thm_3_5() -> None:
    costs = (
        [PrivacyCost("0.1")] * 50 + [PrivacyCost("0.5", "1e-8")] * 3 + [PrivacyCost("0.01")] * 200
    )
    result = heterogeneous(costs, "1e-6")
    ref = ref_kov([dec(c.epsilon) for c in costs], Decimal("1e-6"))
    assert_tight_upper(result.epsilon, ref)
    assert result.delta == Fraction(1, 10**6) + 3 * Fraction(1, 10**8)


def test_kov_second_bound_can_be_the_minimum() -> None:
    # With a large slack the ln(e + sqrt(S2)/delta~) term is below ln(1/delta~):
    # S2 = 1e-4 and delta~ = 0.5 give ln(e + 0.02) < ln 2.
    costs = [PrivacyCost("0.01")]
    result = heterogeneous(costs, "0.5")
    assert_tight_upper(result.epsilon, ref_kov([Decimal("0.01")], Decimal("0.5")))


def test_kov_reduces_to_basic_for_few_large_costs() -> None:
    result = heterogeneous([PrivacyCost(1), PrivacyCost(2)], "1e-6")
    assert result.epsilon == 3


def test_kov_is_never_above_drv_with_the_same_slack() -> None:
    # eps tanh(eps/2) <= eps (e^eps - 1): KOV's third bound improves on Thm 3.20.
    for eps in ("0.01", "0.1", "0.7", "2"):
        for k in (1, 10, 1000):
            kov = heterogeneous([PrivacyCost(eps)] * k, "1e-6")
            drv = advanced(PrivacyCost(eps), k, "1e-6")
            assert kov.epsilon <= drv.epsilon


def test_advanced_rule_follows_the_plan_and_reports_the_better_bound() -> None:
    rule = AdvancedRule(plan=(PrivacyCost("0.1"), 1000), delta_slack="1e-5")
    state = rule.start()
    state = rule.extend(state, PrivacyCost("0.1"))
    assert rule.total(state) == PrivacyCost("0.1")  # basic dominates for one query
    state = rule.extend(state, PrivacyCost("0.05"))  # cheaper than planned: accepted
    from dpaccount.charges import Repeated

    state = rule.extend(state, Repeated(PrivacyCost("0.1"), 998))
    assert rule.total(state) == advanced(PrivacyCost("0.1"), 1000, "1e-5")
    with pytest.raises(UnsupportedChargeError, match="declared plan of 1000"):
        rule.extend(state, PrivacyCost("0.1"))


def test_advanced_rule_refuses_a_charge_above_the_plan() -> None:
    rule = AdvancedRule(plan=(PrivacyCost("0.1"), 10), delta_slack="1e-5")
    with pytest.raises(UnsupportedChargeError, match="declared to cost"):
        rule.extend(rule.start(), PrivacyCost("0.2"))
    with pytest.raises(UnsupportedChargeError):
        rule.extend(rule.start(), PrivacyCost("0.1", "1e-9"))


def test_advanced_rule_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="fixed plan"):
        AdvancedRule(delta_slack="1e-5")
    with pytest.raises(ConfigError, match="heterogeneous"):
        AdvancedRule(plan=[PrivacyCost(1), PrivacyCost(2)], delta_slack="1e-5")
    with pytest.raises(ConfigError, match="delta_slack"):
        AdvancedRule(plan=(PrivacyCost(1), 2))
    with pytest.raises(ConfigError, match="no slack"):
        AdvancedRule(plan=(PrivacyCost(1, "1e-6"), 10), budget=Budget(5, "1e-5"))
    rule = AdvancedRule(plan=(PrivacyCost(1, "1e-7"), 10), budget=Budget(5, "1e-5"))
    assert rule.delta_slack == Fraction(1, 10**5) - 10 * Fraction(1, 10**7)


def test_heterogeneous_rule_prefix_sums() -> None:
    plan = [PrivacyCost("0.1")] * 5 + [PrivacyCost("0.3")] * 5
    rule = HeterogeneousRule(plan=plan, delta_slack="1e-6")
    state = rule.start()
    for j, cost in enumerate(plan, start=1):
        state = rule.extend(state, cost)
        assert rule.bound(state) == heterogeneous(plan[:j], "1e-6")


@settings(max_examples=200, deadline=None)
@given(
    eps=st.floats(1e-4, 5.0),
    k=st.integers(1, 10**6),
    slack=st.floats(1e-12, 0.5),
)
def test_the_a_epsilon_form_is_dominated_by_basic_or_advanced(
    eps: float, k: int, slack: float
) -> None:
    # Issue (soundness, item 6): k a + sqrt(2k L)(eps + a) >= min(k eps, advanced), and
    # strictly above basic for eps > ln 2; best never picks it.
    from dpaccount.composition.best import compose_by_name

    cost = PrivacyCost(eps)
    a_form = advanced_adaptive(cost, k, slack).epsilon
    plain = advanced(cost, k, slack).epsilon
    basic = cost.epsilon * k
    assert a_form >= min(plain, basic)
    if eps > math.log(2):
        assert a_form > basic
    _total, theorem = compose_by_name("best", cost, k, slack)
    assert theorem != compose_by_name("advanced_adaptive", cost, k, slack)[1]
