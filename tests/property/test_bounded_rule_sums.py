"""Run-time parameters at O(1) (issue 27, item 1): the sums that can grow without bound
are rounded up to one dyadic grid (`bounded_up`), never below the exact sum, within
2^-SUM_BITS per operation, and a decision changes only on the safe side.

Expected values are the exact sums, computed here with plain `Fraction` arithmetic
(no rounding), and the rules' own checks applied to states holding those exact sums.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget, GaussianCharge, LaplaceCharge, PrivacyCost
from dpaccount._numeric import SUM_BITS, bounded_up, fits_grid
from dpaccount.accounting.gdp import GDPFilterRule, GDPState
from dpaccount.charges import Repeated, cost_of
from dpaccount.composition.basic import BasicRule, BasicState
from dpaccount.composition.filters import FilterRule, FilterState
from dpaccount.composition.states import decode_state, encode_state
from dpaccount.errors import BudgetExceededError

STEP = Fraction(1, 2**SUM_BITS)

#: Odd denominators of 150-200 bits: a few dozen distinct ones outgrow the grid.
ODD = st.integers(2**150, 2**200).map(lambda n: n | 1)
#: Values with such denominators, in (0, 1/1000]: what 1/scale for fresh float scales
#: and similar run-time parameters look like.
COPRIME = st.builds(lambda q, p: Fraction(p % (q // 1000) + 1, q), ODD, st.integers(1, 2**200))
#: Fresh float sigmas: (1/sigma)^2 has an odd denominator of up to 106 bits.
SIGMAS = st.floats(min_value=1.0, max_value=1000.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(numerator=st.integers(0, 2**5000), denominator=st.integers(1, 2**9000))
def test_bounded_up_is_an_upper_bound_within_one_step(numerator: int, denominator: int
                                                      ) -> None:
    exact = Fraction(numerator, denominator)
    rounded = bounded_up(exact)
    assert exact <= rounded < exact + STEP
    assert rounded.denominator.bit_length() <= SUM_BITS + 1  # at most 2**SUM_BITS
    assert rounded == Fraction(rounded.numerator, rounded.denominator)  # reduced
    assert hash(rounded) == hash(Fraction(rounded.numerator, rounded.denominator))
    if denominator.bit_length() <= SUM_BITS:
        assert rounded == exact  # exact values that fit are left alone
    assert bounded_up(rounded) == rounded  # on the grid it stays


@settings(max_examples=100, deadline=None)
@given(denominators=st.lists(st.integers(1, 2**300), min_size=1, max_size=40))
def test_fits_grid_is_the_lcm_check(denominators: list[int]) -> None:
    assert fits_grid(denominators) == (math.lcm(*denominators).bit_length() <= SUM_BITS)


def _fold(rule: Any, charges: list[Any]) -> Any:
    state = rule.start()
    for charge in charges:
        state = rule.extend(state, charge)
    return state


@settings(max_examples=40, deadline=None)
@given(epsilons=st.lists(COPRIME, min_size=1, max_size=60),
       deltas=st.lists(COPRIME, min_size=30, max_size=60))
def test_basic_and_filter_sums_bound_the_exact_sums(epsilons: list[Fraction],
                                                     deltas: list[Fraction]) -> None:
    costs = [PrivacyCost(e, d / 10**6) for e, d in zip(epsilons, deltas, strict=False)]
    n = len(costs)
    exact_eps = sum((c.epsilon for c in costs), Fraction(0))
    exact_delta = sum((c.delta for c in costs), Fraction(0))
    exact_sq = sum((c.epsilon**2 for c in costs), Fraction(0))
    basic = _fold(BasicRule(), costs)
    assert exact_eps <= basic.epsilon <= exact_eps + n * STEP
    assert exact_delta <= basic.delta <= exact_delta + n * STEP
    filt = _fold(FilterRule(delta_slack="1e-6"), costs)
    assert exact_sq <= filt.eps_sq <= exact_sq + n * STEP
    assert exact_delta <= filt.delta <= exact_delta + n * STEP
    for value in (basic.epsilon, basic.delta, filt.eps_sq, filt.delta):
        assert value.denominator.bit_length() <= SUM_BITS + 1  # bounded: O(1) per charge
    if exact_delta.denominator.bit_length() > SUM_BITS:  # (almost always: 30+ terms)
        assert basic.delta > exact_delta  # it was rounded, upward


@settings(max_examples=40, deadline=None)
@given(sigmas=st.lists(SIGMAS, min_size=1, max_size=80, unique=True))
def test_gdp_sum_bounds_the_exact_sum(sigmas: list[float]) -> None:
    charges = [GaussianCharge(sigma, 1, 1) for sigma in sigmas]
    exact = sum((1 / Fraction(s) ** 2 for s in sigmas), Fraction(0))
    state = _fold(GDPFilterRule(target_delta="1e-6"), charges)
    assert exact <= state.mu_squared <= exact + len(sigmas) * STEP
    assert state.mu_squared.denominator.bit_length() <= SUM_BITS + 1
    if exact.denominator.bit_length() > SUM_BITS:
        assert state.mu_squared > exact


#: The finest decimal grid a budget takes (a budget's numbers have at most 4096 bits):
#: 10^-1232 is finer than the 60 roundings of 2^-4096 (about 10^-1233) a sum here gets,
#: so budgets on it fall between the exact and the rounded sums.
FINE = Fraction(1, 10**1232)


def _near(value: Fraction) -> list[Fraction]:
    """Budgets at, just below and just above ``value`` on the `FINE` grid."""
    low = Fraction(math.floor(value / FINE)) * FINE
    return [b for b in (low - FINE, low, low + FINE, low + 2 * FINE, low + 8 * FINE) if b >= 0]


@settings(max_examples=25, deadline=None)
@given(epsilons=st.lists(COPRIME, min_size=30, max_size=60))
def test_decisions_change_only_on_the_safe_side(epsilons: list[Fraction]) -> None:
    """Whatever the rounded state admits, the exact state admits too; budgets drawn at,
    just above and just below the exact totals, where rounding could matter."""
    costs = [PrivacyCost(e, e / 10**9) for e in epsilons]
    exact_eps = sum((c.epsilon for c in costs), Fraction(0))
    exact_delta = sum((c.delta for c in costs), Fraction(0))
    rule = BasicRule()
    rounded = _fold(rule, costs)
    exact = BasicState(exact_eps, exact_delta)
    for eps in _near(exact_eps):
        for delta in _near(exact_delta):
            budget = Budget(eps, delta)
            if rule.admits(rounded, budget):
                assert rule.admits(exact, budget)
            elif rule.admits(exact, budget):  # refused, exact would admit: the safe side
                assert eps < rounded.epsilon or delta < rounded.delta
    slack = Fraction(1, 10**6)
    filt = FilterRule(delta_slack=slack)
    f_rounded = _fold(filt, costs)
    f_exact = FilterState(sum((c.epsilon**2 for c in costs), Fraction(0)), exact_delta)
    value = filt.value(f_exact)
    for eps in (value, value - FINE, value + FINE):
        for delta in _near(slack + exact_delta):
            budget = Budget(eps, delta)
            if filt.admits(f_rounded, budget):
                assert filt.admits(f_exact, budget)


@settings(max_examples=30, deadline=None)
@given(sigmas=st.lists(SIGMAS, min_size=40, max_size=80),
       epsilon=st.fractions(min_value=Fraction(1, 10), max_value=20))
def test_gdp_decisions_change_only_on_the_safe_side(sigmas: list[float], epsilon: Fraction
                                                    ) -> None:
    rule = GDPFilterRule(target_delta="1e-6")
    rounded = _fold(rule, [GaussianCharge(s, 1, 1) for s in sigmas])
    exact = GDPState(sum((1 / Fraction(s) ** 2 for s in sigmas), Fraction(0)))
    budget = Budget(epsilon, "1e-6")
    if rule.admits(rounded, budget):
        assert rule.admits(exact, budget)
    limit = rule.mu_squared_limit(budget.epsilon, budget.delta)  # type: ignore[arg-type]
    if limit is not None and exact.mu_squared <= limit < rounded.mu_squared:
        assert not rule.admits(rounded, budget)  # refused: the safe side


@settings(max_examples=25, deadline=None)
@given(epsilons=st.lists(COPRIME, min_size=2, max_size=50), picks=st.data())
def test_a_replay_gives_the_live_state(epsilons: list[Fraction], picks: st.DataObject
                                       ) -> None:
    """`extend_all` (how a ledger replays its records, sharing equal charges) gives the
    state the one-by-one fold had, rounded or not, and the state survives a snapshot."""
    pool = [PrivacyCost(e) for e in epsilons]
    order = picks.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=120))
    order += pool  # every value at least once: with 30 or more the sums are rounded
    for rule in (BasicRule(), FilterRule(delta_slack="1e-6")):
        live = _fold(rule, order)
        assert rule.extend_all(rule.start(), order) == live
        half = len(order) // 2
        assert rule.extend_all(rule.extend_all(rule.start(), order[:half]),
                               order[half:]) == live
        text = encode_state(live)
        assert text is not None and decode_state(text) == live
    gdp = GDPFilterRule(target_delta="1e-6")
    gauss = [GaussianCharge(1 + float(e * 10**5), 1, 1) for e in epsilons]
    chosen = picks.draw(st.lists(st.sampled_from(gauss), min_size=1, max_size=120))
    assert gdp.extend_all(gdp.start(), chosen) == _fold(gdp, chosen)


@settings(max_examples=30, deadline=None)
@given(cost=st.builds(PrivacyCost, COPRIME), k=st.integers(2, 50))
def test_repeated_equals_k_charges_while_the_sums_stay_exact(cost: PrivacyCost, k: int
                                                            ) -> None:
    for rule in (BasicRule(), FilterRule(delta_slack="1e-6")):
        assert _fold(rule, [cost] * k) == rule.extend(rule.start(), Repeated(cost, k))


def test_an_accountant_with_fresh_scales_stays_bounded_and_exact_at_the_edge() -> None:
    """Laplace charges of fresh float scales (epsilon = 1 / scale, coprime denominators):
    the ledger's spend is the rounded sum, bounded, and what is left is exact."""
    scales = [100 + k / 7 for k in range(300)]
    exact = sum((cost_of(LaplaceCharge(s, 1)).epsilon for s in scales), Fraction(0))
    budget = Fraction(math.ceil(exact * 10**6), 10**6)
    acct = Accountant(Budget(budget, 0))
    for s in scales:
        acct.charge(LaplaceCharge(s, 1))
    spent = acct.spent.epsilon
    assert exact <= spent <= exact + len(scales) * STEP
    assert spent.denominator.bit_length() <= SUM_BITS + 1
    left = budget - spent
    assert acct.can_afford(PrivacyCost(left))
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost(left + Fraction(1, 10**9)))
    assert acct.spent.epsilon == spent  # refused: nothing changed


def test_the_replay_test_reaches_rounded_sums() -> None:
    """The values drawn above do outgrow the grid (so the tests exercise the rounding)."""
    pool = [PrivacyCost(Fraction(1, (2**180 + 2 * k) | 1)) for k in range(40)]
    rule = BasicRule()
    live = _fold(rule, pool + pool[:5])
    exact = sum((c.epsilon for c in pool + pool[:5]), Fraction(0))
    assert exact.denominator.bit_length() > SUM_BITS and live.epsilon > exact
    assert not rule.stays_exact(rule.start(), pool)
    assert rule.extend_all(rule.start(), pool + pool[:5]) == live
