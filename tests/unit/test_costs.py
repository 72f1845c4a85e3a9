"""PrivacyCost and Budget: exact values, validation, typed errors."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Budget, InvalidCostError, PrivacyCost
from dpaccount.costs import format_bound

BAD_EPSILONS = [
    float("nan"), float("inf"), -float("inf"), -1e-300, -1, True, False, "abc", "nan", "inf",
    None, [0.1], object(), np.float64("nan"), np.bool_(True), Decimal("NaN"), "", "1/0",
]


@pytest.mark.parametrize("value", BAD_EPSILONS, ids=repr)
def test_invalid_epsilon_is_a_typed_error_naming_field_and_value(value: object) -> None:
    with pytest.raises(InvalidCostError) as info:
        PrivacyCost(value)
    assert info.value.field == "epsilon"
    assert "epsilon" in str(info.value)
    assert repr(value) in str(info.value) or value is None
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [1, 1.0, 1.5, -0.1, float("nan"), "2", True])
def test_invalid_delta(value: object) -> None:
    with pytest.raises(InvalidCostError) as info:
        PrivacyCost(0.5, value)
    assert info.value.field == "delta"


def test_float_is_taken_at_its_exact_binary_value() -> None:
    assert PrivacyCost(0.1).epsilon == Fraction(0.1)
    assert PrivacyCost(0.1).epsilon > Fraction(1, 10)
    # ten charges of the float 0.1 sum to more than 1 exactly (no under-count)
    total = sum([PrivacyCost(0.1)] * 10, PrivacyCost(0))
    assert total.epsilon == 10 * Fraction(0.1) > 1
    assert math.fsum([0.1] * 10) == 1.0  # the float sum says exactly 1: the trap avoided


@pytest.mark.parametrize(
    ("given", "exact"),
    [("0.1", Fraction(1, 10)), (Decimal("0.3"), Fraction(3, 10)), ("1/3", Fraction(1, 3)),
     (Fraction(2, 7), Fraction(2, 7)), (np.float32(0.5), Fraction(1, 2)), (3, Fraction(3)),
     ("1e-5", Fraction(1, 100_000)), (np.int64(2), Fraction(2))],
)
def test_exact_decimal_and_rational_inputs(given: object, exact: Fraction) -> None:
    assert PrivacyCost(given).epsilon == exact


def test_values_are_frozen() -> None:
    cost = PrivacyCost(1)
    with pytest.raises(AttributeError):
        cost.epsilon = Fraction(0)  # type: ignore[misc]


def test_budget_infinity_must_be_explicit() -> None:
    with pytest.raises(InvalidCostError, match="unlimited"):
        Budget(float("inf"))
    unlimited = Budget.unlimited("1e-6")
    assert unlimited.is_unlimited and unlimited.delta == Fraction(1, 10**6)
    assert PrivacyCost(10**9).fits(unlimited)
    assert not PrivacyCost(1, "2e-6").fits(unlimited)


def test_summed_delta_reaching_one_is_refused() -> None:
    with pytest.raises(InvalidCostError):
        PrivacyCost(0, "0.5") + PrivacyCost(0, "0.5")


def test_fits_is_inclusive_and_exact() -> None:
    budget = Budget("1", "1e-6")
    assert PrivacyCost("1", "1e-6").fits(budget)
    assert not PrivacyCost(Fraction(1) + Fraction(1, 10**30), "1e-6").fits(budget)
    assert not PrivacyCost(1.0 + 2**-52).fits(budget)


def _shown_value(text: str) -> Fraction:
    return Fraction(Decimal(text))


@settings(max_examples=300, deadline=None)
@given(value=st.fractions(min_value=Fraction(1, 10**30), max_value=10**20)
       | st.floats(min_value=1e-300, max_value=1e15).map(Fraction))
def test_displayed_numbers_err_toward_privacy(value: Fraction) -> None:
    # Issue (pipelines, item 6): a cost is shown rounded up, a budget left rounded down,
    # an exact value as itself; never more than 12 significant digits.
    up, up_exact = format_bound(value, upward=True)
    down, down_exact = format_bound(value, upward=False)
    assert _shown_value(up) >= value and _shown_value(down) <= value
    assert up_exact == (_shown_value(up) == value)
    assert down_exact == (_shown_value(down) == value)
    digits = up.split("e")[0].replace(".", "").replace("-", "").strip("0")
    assert len(digits) <= 12


def test_float_noise_is_not_displayed() -> None:
    # The review's examples: a delta of 9.999995707834774e-08 and an epsilon left of
    # 0.7999999999999999 are shown as bounds with six digits, marked as such.
    assert str(PrivacyCost("0.5", 9.999995707834774e-08)) == "(ε=0.5, δ≤1e-07)"
    assert str(Budget(0.7999999999999999, "1e-6")) == "(ε≥0.799999, δ=1e-06)"
    assert repr(PrivacyCost("0.5", "1e-6")) == "PrivacyCost(epsilon=0.5, delta=1e-06)"
