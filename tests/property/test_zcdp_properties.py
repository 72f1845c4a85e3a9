"""Property tests for the zcdp rule (hypothesis): order invariance, monotonicity,
Repeated(c, k) == [c] * k, refusal leaves the ledger as it was, invalid input refused."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget, PrivacyCost
from dpaccount.charges import BoundedRangeCharge, GaussianCharge, LaplaceCharge, Repeated
from dpaccount.composition.zcdp import ZCDPRule, rho_of
from dpaccount.errors import BudgetExceededError, InvalidCostError

small = st.integers(1, 400).map(lambda n: Fraction(n, 1000))
charges: st.SearchStrategy[Any] = st.one_of(
    st.builds(PrivacyCost, small),
    st.builds(BoundedRangeCharge, small),
    st.builds(LaplaceCharge, scale=st.integers(1, 50), sensitivity=st.just(1)),
    st.builds(GaussianCharge, sigma=st.integers(2, 60), sensitivity=st.integers(1, 3),
              epsilon=st.just(1)),
)
deltas = st.sampled_from([Fraction(1, 10**5), Fraction(1, 10**9)])


@given(st.lists(charges, min_size=1, max_size=20), deltas, st.randoms())
def test_order_invariance(items: list[Any], delta: Fraction, rnd: Any) -> None:
    rule = ZCDPRule(target_delta=delta)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    one = rule.extend_all(rule.start(), items)
    other = rule.start()
    for charge in shuffled:
        other = rule.extend(other, charge)
    assert one == other and rule.total(one) == rule.total(other)
    assert one.rho == sum((rho_of(c) for c in items), Fraction(0))


@given(st.lists(charges, min_size=1, max_size=30), deltas, small)
def test_monotone_and_admits_is_a_threshold(items: list[Any], delta: Fraction,
                                            eps: Fraction) -> None:
    rule = ZCDPRule(target_delta=delta)
    budget = Budget(eps * 10, delta)
    state, previous = rule.start(), rule.total(rule.start())
    admitted = True
    for charge in items:
        state = rule.extend(state, charge)
        total = rule.total(state)
        assert total.epsilon >= previous.epsilon
        now = rule.admits(state, budget)
        assert now == total.fits(budget)  # admits and total agree exactly
        assert admitted or not now  # once over, more charges never fit again
        admitted, previous = now, total


@given(charges, st.integers(1, 50), deltas)
def test_repeated_equals_separate_charges(charge: Any, k: int, delta: Fraction) -> None:
    rule = ZCDPRule(target_delta=delta)
    separate = rule.start()
    for _ in range(k):
        separate = rule.extend(separate, charge)
    once = rule.extend(rule.start(), Repeated(charge, k))
    nested = rule.extend(rule.start(), Repeated(Repeated(charge, 1), k))
    assert separate == once == nested
    assert rule.total(separate) == rule.total(once)


@settings(max_examples=30, deadline=None)
@given(st.lists(charges, min_size=1, max_size=40), st.integers(1, 200).map(
    lambda n: Fraction(n, 400)))
def test_refusal_leaves_the_ledger_as_it_was(items: list[Any], rho: Fraction) -> None:
    acct = Accountant(Budget(rho=rho, delta="1e-6"), rule="zcdp")
    for charge in items:
        before = (acct.spent, acct.state, len(acct.records), acct.remaining)
        try:
            acct.charge(charge)
        except BudgetExceededError:
            assert (acct.spent, acct.state, len(acct.records), acct.remaining) == before
            assert acct.state.rho + rho_of(charge) > rho  # refused only when over
        else:
            assert acct.state.rho <= rho


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, "-0.5", True, "abc", [1]])
def test_invalid_rho_is_always_refused(bad: Any) -> None:
    with pytest.raises(InvalidCostError):
        Budget(rho=bad)
