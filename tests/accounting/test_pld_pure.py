"""Pure DP in the PLD engine: the largest finite loss is tracked exactly, so delta = 0 and
tiny deltas give the exact epsilon where the grid's floating-point floor cannot.

Independent values: the largest loss of a composition is the sum of the largest losses
(closed form); the exact profile of a composition of randomized-response pairs is summed
here with mpmath at 50 digits.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.accounting.pld import PLDRule, PrivacyLossDistribution
from dpaccount.costs import Budget, PrivacyCost

GRID = {"value_discretization_interval": 1e-3}


def _rr(eps: object, delta: object = 0) -> PrivacyLossDistribution:
    return PrivacyLossDistribution.from_privacy_parameters(eps, delta, **GRID)


def _rr_profile(pairs: list[tuple[int, float]], eps: float) -> mpmath.mpf:
    """delta(eps) of a product of pure randomized-response pairs, at 50 digits."""
    mpmath.mp.dps = 50
    delta = mpmath.mpf(0)
    for signs in itertools.product((1, -1), repeat=len(pairs)):
        mass, loss = mpmath.mpf(1), mpmath.mpf(0)
        for sign, (e, _d) in zip(signs, pairs, strict=True):
            mass *= mpmath.e ** (sign * e) / (1 + mpmath.e ** e)
            loss += sign * e
        if loss > eps:
            delta += mass * (1 - mpmath.e ** (eps - loss))
    return delta


def test_pure_composition_is_exact_at_delta_zero() -> None:
    # dp_accounting's own test: (1, 0) composed with (2, 0) is (3, 0).
    low, high = _rr(1).compose(_rr(2)).epsilon(0)
    assert high == 3
    assert 2.99 < low <= high


def test_tiny_delta_is_finite_and_sound() -> None:
    pld = _rr(1).compose(_rr(2))
    for delta in (1e-15, 1e-12, 1e-10):
        _low, high = pld.epsilon(delta)
        assert high is not None and high <= 3
        # the exact profile at the reported epsilon is within delta (the bound is sound)
        assert _rr_profile([(1, 0), (2, 0)], float(high)) <= delta * (1 + 1e-9)


def test_laplace_and_discrete_laplace_compose_to_the_sum_of_their_epsilons() -> None:
    # dp_accounting's tests: the matching Laplace and discrete Laplace compositions give 4.
    lap = PrivacyLossDistribution.laplace(1, **GRID).self_compose(2).compose(
        PrivacyLossDistribution.laplace("0.5", **GRID)
    )
    assert lap.epsilon(0)[1] == 4
    dlap = PrivacyLossDistribution.discrete_laplace(1, 1, **GRID).self_compose(4)
    assert dlap.epsilon(0)[1] == 4
    assert dlap.delta(4)[1] == 0


@pytest.mark.parametrize("scheme", ["poisson", "without_replacement"])
def test_subsampled_laplace_is_finite_at_delta_zero(scheme: str) -> None:
    q, k = 0.1, 5
    pld = PrivacyLossDistribution.laplace(1, sampling_rate=q, scheme=scheme, **GRID)
    low, high = pld.self_compose(k).epsilon(0)
    exact = k * math.log1p(q * math.expm1(1))  # the remove order's largest loss
    assert high is not None
    assert exact <= float(high) <= exact * (1 + 1e-12)
    assert low <= high


def test_mass_at_infinity_is_tracked_exactly() -> None:
    # (1, 0.1) + (2, 0.2): mass 1 - 0.9 * 0.8 = 0.28 at +inf and largest finite loss 3.
    pld = _rr(1, "0.1").compose(_rr(2, "0.2"))
    assert pld.epsilon("0.28")[1] == 3
    assert pld.delta(3)[1] == Fraction(28, 100)
    assert pld.epsilon("0.2799")[1] is None  # truly unbounded below the mass at +inf
    # float inputs: the exact binary values compose just as well
    assert _rr(1, 0.1).compose(_rr(2, 0.2)).epsilon(0.28)[1] == 3


@settings(max_examples=25, deadline=None)
@given(st.lists(st.fractions(Fraction(1, 100), Fraction(3)), min_size=1, max_size=4))
def test_pure_epsilon_at_zero_is_the_exact_sum(epsilons: list[Fraction]) -> None:
    pld = _rr(epsilons[0])
    for eps in epsilons[1:]:
        pld = pld.compose(_rr(eps))
    low, high = pld.epsilon(0)
    assert high == sum(epsilons)
    assert low <= high
    assert pld.delta(sum(epsilons))[1] == 0


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from([1, 2, 3, 7]),
    st.fractions(Fraction(1, 10), Fraction(2)),
    st.fractions(Fraction(0), Fraction(1, 20)),
)
def test_self_composed_mass_at_infinity(count: int, eps: Fraction, delta: Fraction) -> None:
    pld = _rr(eps, delta).self_compose(count)
    mass = 1 - (1 - delta) ** count
    reported = pld.delta(count * eps)[1]
    # exact, or rounded up to a multiple of 2^-256 once the denominator grows
    assert mass <= reported <= mass + Fraction(count, 2**256)
    if mass:
        assert pld.epsilon(reported)[1] == count * eps


def test_pld_rule_reports_the_pure_plan_exactly() -> None:
    rule = PLDRule([(PrivacyCost(1), 2), PrivacyCost("0.5")], target_delta=0, **GRID)
    state = rule.add(rule.start(), PrivacyCost(1), 1)
    assert rule.total(state).epsilon == 1  # basic of what ran is smaller here
    state = rule.add(rule.add(state, PrivacyCost(1), 1), PrivacyCost("0.5"), 1)
    assert rule.total(state) == PrivacyCost("2.5")
    assert rule.admits(state, Budget("2.5", 0))
