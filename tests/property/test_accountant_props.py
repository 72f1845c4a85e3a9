"""Hypothesis properties of values and the accountant under the basic rule."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpaccount import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidCostError,
    PrivacyCost,
    Repeated,
)
from dpaccount.composition import basic
from dpaccount.records import decode_record, encode_record

# Numbers in every accepted form: floats (exact binary), decimal strings, Fractions.
small_fraction = st.fractions(min_value=0, max_value=2, max_denominator=10**6)
epsilon_values = st.one_of(
    st.floats(min_value=0, max_value=2, allow_nan=False, allow_infinity=False),
    small_fraction,
    st.decimals(min_value=0, max_value=2, allow_nan=False, allow_infinity=False, places=6),
    st.integers(min_value=0, max_value=2),
)
delta_values = st.one_of(
    st.floats(min_value=0, max_value=1e-4),
    st.fractions(min_value=0, max_value=Fraction(1, 10**4), max_denominator=10**9),
)
costs = st.builds(PrivacyCost, epsilon_values, delta_values)
invalid_numbers = st.one_of(
    st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")),
    st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False),
    st.booleans(), st.text(alphabet="abcxyz!?", min_size=1), st.none(),
    st.just(Decimal("-0.5")),
)


def exact(value: object) -> Fraction:
    if isinstance(value, Decimal):
        return Fraction(value)
    return Fraction(value)  # type: ignore[arg-type]


@given(epsilon_values, delta_values)
def test_value_is_exactly_the_input(eps: object, delta: float) -> None:
    cost = PrivacyCost(eps, delta)
    assert cost.epsilon == exact(eps)
    assert cost.delta == Fraction(delta)


@given(invalid_numbers)
def test_invalid_input_is_never_accepted(bad: object) -> None:
    with pytest.raises(InvalidCostError):
        PrivacyCost(bad)
    with pytest.raises(InvalidCostError):
        PrivacyCost(0, bad)
    with pytest.raises(InvalidCostError):
        Budget(bad)


@given(st.lists(costs, max_size=30), st.builds(Budget, epsilon_values, delta_values))
def test_admits_exactly_what_fits_and_refusals_change_nothing(
    stream: list[PrivacyCost], budget: Budget
) -> None:
    acct = Accountant(budget)
    eps_sum, delta_sum = Fraction(0), Fraction(0)
    for cost in stream:
        fits = (eps_sum + cost.epsilon <= budget.epsilon) and (
            delta_sum + cost.delta <= budget.delta
        )
        before = (acct.spent, tuple(acct.records), acct.remaining)
        if fits:
            acct.charge(cost)
            eps_sum += cost.epsilon
            delta_sum += cost.delta
        else:
            with pytest.raises(BudgetExceededError):
                acct.charge(cost)
            assert (acct.spent, tuple(acct.records), acct.remaining) == before
        assert acct.spent == PrivacyCost(eps_sum, delta_sum)
        assert acct.spent.fits(budget)


@given(st.lists(costs, min_size=1, max_size=20), st.randoms())
def test_basic_is_order_invariant(stream: list[PrivacyCost], rnd: object) -> None:
    shuffled = list(stream)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert basic(stream) == basic(shuffled)


@given(costs, st.integers(min_value=1, max_value=50))
def test_repeated_is_k_separate_charges(cost: PrivacyCost, k: int) -> None:
    a = Accountant(Budget.unlimited(Fraction(1, 2)))
    b = Accountant(Budget.unlimited(Fraction(1, 2)))
    a.charge(Repeated(cost, k))
    for _ in range(k):
        b.charge(cost)
    assert a.spent == b.spent


@given(st.lists(costs, max_size=10))
def test_basic_never_below_largest_single_cost_and_monotone(stream: list[PrivacyCost]) -> None:
    total = basic(stream)
    for cost in stream:
        assert total.epsilon >= cost.epsilon and total.delta >= cost.delta
    assert basic([*stream, PrivacyCost("0.001")]).epsilon > total.epsilon


#: Labels the ledger takes: printable text (anything else is refused before anything is
#: charged; tests/unit/test_integrity_inputs.py).
labels = st.text(max_size=20).filter(str.isprintable)


@given(costs, labels | st.none())
def test_record_round_trip(cost: PrivacyCost, label: str | None) -> None:
    acct = Accountant(Budget.unlimited(Fraction(1, 2)))
    record = acct.charge(Repeated(cost, 3), label=label)
    assert decode_record(encode_record(record).model_dump_json()) == record
