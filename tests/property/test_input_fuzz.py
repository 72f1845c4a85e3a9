"""Hostile inputs to the value types: typed errors, bounded work, nothing accepted by
accident.

Issue (integrity, item 4): every input either gives a valid value or raises a dpaccount
error, quickly (no input may hang the process), and the listed inputs from the review are
refused with a typed error. "Quickly" is checked without a clock (issue 28: the suite
passes on a loaded machine): the inputs that hung the process built a huge integer
(``Fraction("1e999999999")`` computes 10**999999999, about 415 MB), so each input is
checked for the memory it makes the parser allocate, which load does not change; a hang
that allocates nothing fails the run through `liveness.FINISHES`.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from liveness import FINISHES

from dpaccount import Budget, PrivacyCost
from dpaccount._numeric import MAX_VALUE_BITS
from dpaccount.errors import DPAccountError, InvalidCostError

#: The most a parser may allocate for one input, 128 KiB: 256 times the largest value it
#: keeps (3-4 KiB are usual, 18 KiB the most seen in 3,000 examples; 10**(10**6), which
#: reading 1e1000000 exactly would build, is 415 KiB).
ALLOCATION_BOUND = 256 * MAX_VALUE_BITS // 8


@contextmanager
def bounded_allocation() -> Iterator[None]:
    """Fails if the block allocates more than `ALLOCATION_BOUND` bytes at its peak."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= ALLOCATION_BOUND, f"allocated {peak} bytes for one input"


def _typed_error(make: Callable[[Any], object], value: Any) -> None:
    with bounded_allocation(), pytest.raises(InvalidCostError):
        make(value)


class MinusOne(Fraction):
    """Compares equal to -1 whatever it holds."""

    def __eq__(self, other: object) -> bool:
        return other == -1

    def __lt__(self, other: Any) -> bool:
        return False

    __hash__ = Fraction.__hash__


class HostileFloat:
    def __float__(self) -> float:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    "value",
    ["1e-999999999", "1e999999999", "1e5000", " 1 ", "1_000", "\u0661", "\uff11",
     "nan", "inf", "0x10", "1/0", "", "--1", 10**5000, Decimal("1e-999999999"),
     Decimal("1e999999999"), HostileFloat()],
    ids=lambda v: type(v).__name__ if isinstance(v, int) else None,
)
@FINISHES
def test_the_reviewed_inputs_get_a_typed_error_quickly(value: Any) -> None:
    _typed_error(PrivacyCost, value)
    _typed_error(Budget, value)


def test_a_fraction_subclass_is_read_by_its_value_not_its_comparisons() -> None:
    # MinusOne(1) holds 1 but claims to equal -1: it is taken at its value, 1.
    assert PrivacyCost(MinusOne(1)).epsilon == 1
    with pytest.raises(InvalidCostError):
        PrivacyCost(MinusOne(-1))


def test_every_double_is_accepted_exactly() -> None:
    for value in (5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1):
        assert PrivacyCost(value).epsilon == Fraction(value)


values = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789eE+-./_ ", max_size=40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**5000), max_value=2**5000),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.fractions(),
    st.builds(lambda e: f"1e{e}", st.integers(-10**12, 10**12)),
    st.builds(lambda n, d: f"{n}/{d}", st.integers(0, 10**40), st.integers(0, 10**40)),
)


@FINISHES
@settings(max_examples=400, deadline=None)
@given(epsilon=values, delta=values)
def test_every_input_is_a_value_or_a_typed_error_with_bounded_work(epsilon: Any, delta: Any
                                                                   ) -> None:
    cost: PrivacyCost | None = None
    with bounded_allocation(), contextlib.suppress(DPAccountError):
        cost = PrivacyCost(epsilon, delta)
    if cost is not None:
        assert cost.epsilon >= 0 and 0 <= cost.delta < 1
        for given, value in ((epsilon, cost.epsilon), (delta, cost.delta)):
            if type(given) is Fraction:
                continue  # exact Fractions are taken as they are (`to_fraction`)
            assert value.numerator.bit_length() <= MAX_VALUE_BITS
            assert value.denominator.bit_length() <= MAX_VALUE_BITS
