"""``Accountant.remaining`` is a value like ``spent`` (issue 29, item 5), and old code that
calls it keeps working with a DeprecationWarning."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpaccount import Accountant, Budget, InvalidCostError, PrivacyCost
from dpaccount.costs import RemainingBudget


def test_remaining_is_a_value_printed_as_a_budget() -> None:
    acct = Accountant((1, "1e-6"))
    acct.charge(PrivacyCost("0.25", "1e-7"))
    left = acct.remaining
    assert isinstance(left, Budget)
    # basic composition: the exact differences (Dwork and Roth 2014, Thm 3.16)
    assert (left.epsilon, left.delta) == (Fraction(3, 4), Fraction(9, 10**7))
    assert repr(left) == "Budget(epsilon=0.75, delta=9e-07)"
    assert str(left) == str(Budget("0.75", "9e-7"))
    assert left == Budget("0.75", "9e-7") and Budget("0.75", "9e-7") == left
    assert left != Budget("0.75") and hash(left) == hash(Budget("0.75", "9e-7"))
    assert PrivacyCost("0.75").fits(left) and not PrivacyCost("0.76").fits(left)


def test_calling_it_still_works_with_a_deprecation_warning() -> None:
    acct = Accountant(1)
    acct.charge(PrivacyCost("0.5"))
    with pytest.warns(DeprecationWarning, match="remaining_for"):
        assert acct.remaining() == Budget("0.5")
    with pytest.warns(DeprecationWarning):
        assert acct.remaining(4) == acct.remaining_for(4) == Budget("0.125")
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidCostError):
        acct.remaining(0)


def test_a_remaining_value_given_as_a_budget_becomes_a_plain_budget() -> None:
    left = Accountant((1, "1e-6")).remaining
    other = Accountant(left)
    assert type(other.budget) is Budget and other.budget == Budget(1, "1e-6")
    unlimited = Accountant(Accountant(Budget.unlimited()).remaining)
    assert type(unlimited.budget) is Budget and unlimited.budget.is_unlimited


def test_unlimited_and_rho_budgets_stay_what_they_are() -> None:
    assert Accountant(Budget.unlimited()).remaining.epsilon is None
    zc = Accountant(Budget(rho="0.5", delta="1e-6"), rule="zcdp")
    assert zc.remaining == zc.remaining_for(1)
    assert zc.remaining.rho == zc.remaining_for(1).rho


_decimals = st.decimals(min_value=0, max_value=10, places=3, allow_nan=False)


@given(_decimals, st.lists(_decimals, max_size=6), st.integers(1, 50))
def test_the_value_is_the_k_equals_one_answer(budget: object, costs: list[object],
                                              k: int) -> None:
    acct = Accountant(Budget(budget), name="p")
    admitted = Fraction(0)
    for cost in costs:
        if PrivacyCost(cost).fits(acct.remaining):
            acct.charge(PrivacyCost(cost))
            admitted += Fraction(str(cost))
    left = acct.remaining
    assert left == acct.remaining_for(1)
    # basic: what is left is budget - the exact sum admitted, and k queries split it evenly
    assert left.epsilon == Fraction(str(budget)) - admitted >= 0
    assert acct.remaining_for(k).epsilon == left.epsilon / k
    assert RemainingBudget.of(left) == left == Budget(left.epsilon, left.delta)
