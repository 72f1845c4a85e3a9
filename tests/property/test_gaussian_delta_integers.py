"""`gaussian_delta_up` computes its arguments in integers (issue 27, item 1: a charge of a
fresh sigma pays it on the charging path). Stored records are checked against their
charge's recomputed cost exactly, so the result must be bit for bit the one of the
Fraction formula it replaced, written out here as the reference."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from dpaccount._numeric import ONE, float_down, float_up, gaussian_delta_up, up

SLACK = 1e-12  # the relative slack of scipy's normal CDF the function allows


def reference(epsilon: Fraction, mu: Fraction) -> Fraction:
    """Balle and Wang 2018, Thm 8, as `gaussian_delta_up` computed it in Fractions."""
    a = float_up(mu / 2 - epsilon / mu)
    b = float_down(-mu / 2 - epsilon / mu)
    first = float(special.ndtr(a)) * (1 + SLACK)
    second = math.exp(float_down(epsilon) + float(special.log_ndtr(b))) * (1 - SLACK)
    value = first - second
    if value <= 0:
        value = float(special.ndtr(a)) * SLACK * 2
    return min(up(value), ONE)


FLOAT_MU = st.floats(min_value=1e-6, max_value=1e4).map(lambda s: 1 / Fraction(s))
RATIONAL_MU = st.fractions(min_value=Fraction(1, 10**9), max_value=100,
                           max_denominator=10**12)
EPSILONS = st.one_of(st.floats(min_value=0, max_value=100).map(Fraction),
                     st.fractions(min_value=0, max_value=1000, max_denominator=10**9))


@settings(max_examples=2000, deadline=None)
@given(epsilon=EPSILONS, mu=st.one_of(FLOAT_MU, RATIONAL_MU))
def test_bit_for_bit_the_fraction_formula(epsilon: Fraction, mu: Fraction) -> None:
    try:
        expected: object = reference(epsilon, mu)
    except (OverflowError, ValueError) as exc:
        expected = type(exc)
    try:
        got: object = gaussian_delta_up(epsilon, mu)
    except (OverflowError, ValueError) as exc:
        got = type(exc)
    assert got == expected
