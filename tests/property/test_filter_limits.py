"""The Renyi and Gaussian-DP filters decide by limits found once per budget (issue 16).

`RDPRule.admits` compares each order's sum with a limit; `GDPFilterRule.admits` compares
sum mu^2 with one. These tests hold them to the check they replace, evaluated here as it
was (the conversion of every order and its minimum; the rounded-up Gaussian profile at
the rounded-up mu), on states drawn at, beside and far from the limits, and check the
Gaussian limit against the exact profile computed with mpmath at 50 digits.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import GaussianCharge, LaplaceCharge, PrivacyCost
from dpaccount._numeric import float_up, gaussian_delta_up
from dpaccount.accounting.rdp import GDPFilterRule, GDPState, RDPRule, RDPState
from dpaccount.charges import cost_of
from dpaccount.composition.filters import FilterRule, FilterState
from dpaccount.costs import Budget
from dpaccount.errors import InvalidCostError

EPSILONS = st.one_of(
    st.integers(1, 5000).map(lambda n: Fraction(n, 1000)),
    st.sampled_from([Fraction(0), Fraction(1, 10**9), Fraction(10**6), Fraction(10**9)]),
)
TARGETS = st.sampled_from([Fraction(1, 10**9), Fraction(1, 10**5), Fraction(1, 100)])


def conversion_admits(rule: RDPRule, state: RDPState, budget: Budget) -> bool:
    """The filter's check before the limits: the minimum over orders, rounded up."""
    try:
        return rule.total(state).epsilon <= budget.epsilon  # type: ignore[operator]
    except InvalidCostError:  # every order overflowed: nothing is within a budget
        return False


@settings(max_examples=120, deadline=None)
@given(epsilon=EPSILONS, target=TARGETS, data=st.data())
def test_renyi_limits_decide_as_the_conversion_does(epsilon: Fraction, target: Fraction,
                                                      data: st.DataObject) -> None:
    rule = RDPRule(target_delta=target)
    budget = Budget(epsilon, target)
    limits = rule.order_limits(epsilon)
    rule.order_limits(epsilon + 1)  # another budget asked about in between
    assert rule.order_limits(epsilon) is limits  # found once per budget
    sums = []
    for limit in limits:
        near = max(limit, 0)
        sums.append(data.draw(st.one_of(
            st.sampled_from([max(near - 1, 0), near, near + 1, 0]),
            st.integers(0, 2 * near + 10),
            st.integers(0, 2**90),
        )))
    state = RDPState(np.array(sums, dtype=object))
    assert rule.admits(state, budget) == (
        not any(sums) or conversion_admits(rule, state, budget))


@settings(max_examples=60, deadline=None)
@given(epsilon=EPSILONS, target=TARGETS, order=st.integers(0, 23))
def test_each_renyi_limit_is_the_last_sum_its_order_admits(epsilon: Fraction,
                                                          target: Fraction,
                                                          order: int) -> None:
    # Every other order far past its limit: this order alone decides, at its limit
    # (admitted) and one unit above it (refused).
    rule = RDPRule(target_delta=target)
    budget = Budget(epsilon, target)
    limits = rule.order_limits(epsilon)
    for at in (limits[order], limits[order] + 1):
        if at < 0:
            continue
        sums = [2**1000] * len(limits)
        sums[order] = at
        state = RDPState(np.array(sums, dtype=object))
        assert rule.admits(state, budget) == (at == limits[order])
        assert conversion_admits(rule, state, budget) == (at == limits[order])


@settings(max_examples=60, deadline=None)
@given(epsilon=st.integers(1, 4000).map(lambda n: Fraction(n, 1000)), target=TARGETS,
       charges=st.lists(st.tuples(
           st.sampled_from([PrivacyCost("0.01"), PrivacyCost("0.3"),
                            GaussianCharge(sigma=3, sensitivity=1, epsilon=1),
                            LaplaceCharge(scale=20, sensitivity=1)]),
           st.integers(1, 400)), min_size=1, max_size=6))
def test_renyi_limits_on_states_charges_reach(epsilon: Fraction, target: Fraction,
                                              charges: list[tuple[object, int]]) -> None:
    rule = RDPRule(target_delta=target)
    budget = Budget(epsilon, target)
    state = rule.start()
    for charge, count in charges:
        state = rule.add(state, charge, count)  # type: ignore[arg-type]
        assert rule.admits(state, budget) == conversion_admits(rule, state, budget)


def profile_admits(mu_squared: Fraction, budget: Budget) -> bool:
    """The Gaussian-DP filter's check before the limit."""
    mu = Fraction(math.nextafter(math.sqrt(float_up(mu_squared)), math.inf))
    try:
        return gaussian_delta_up(budget.epsilon, mu) <= budget.delta  # type: ignore[arg-type]
    except (InvalidCostError, OverflowError, ZeroDivisionError):
        return False


def exact_delta_within(epsilon: Fraction, mu_squared: Fraction, delta: Fraction) -> bool:
    """Whether delta(epsilon) of mu-GDP at mu = sqrt(mu_squared) (Balle and Wang 2018,
    Thm 8), computed with 50 digits, is at most ``delta``."""
    with mpmath.workdps(50):
        mu = mpmath.sqrt(mpmath.mpf(mu_squared.numerator) / mu_squared.denominator)
        eps = mpmath.mpf(epsilon.numerator) / epsilon.denominator
        exact = mpmath.ncdf(mu / 2 - eps / mu) - mpmath.exp(eps) * mpmath.ncdf(-mu / 2 - eps / mu)
        return bool(exact <= mpmath.mpf(delta.numerator) / delta.denominator)


@settings(max_examples=120, deadline=None)
@given(epsilon=st.integers(0, 8000).map(lambda n: Fraction(n, 1000)),
       delta=st.sampled_from([Fraction(1, 10**12), Fraction(1, 10**6), Fraction(1, 10**5),
                              Fraction(1, 100), Fraction(1, 2)]),
       scale=st.floats(1e-6, 1e6), data=st.data())
def test_the_gaussian_limit_decides_as_the_profile_does(epsilon: Fraction, delta: Fraction,
                                                        scale: float,
                                                        data: st.DataObject) -> None:
    rule = GDPFilterRule(target_delta=delta)
    budget = Budget(epsilon, delta)
    limit = rule.mu_squared_limit(epsilon, delta)
    if limit is None:  # the rounded profile certifies this delta for no mu at all
        for tiny in (Fraction(5e-324), Fraction(1, 10**40), Fraction(scale)):
            assert not profile_admits(tiny, budget)
            assert not rule.admits(GDPState(tiny), budget)
        return
    assert limit > 0
    assert profile_admits(limit, budget)
    # Sound against the exact profile: at the limit, where it is largest.
    assert exact_delta_within(epsilon, limit, delta)
    above = Fraction(math.nextafter(float(limit), math.inf))
    assert not rule.admits(GDPState(above), budget)
    mu_squared = data.draw(st.one_of(
        st.just(limit), st.just(above), st.just(limit - Fraction(1, 10**30)),
        st.floats(1e-12, 4.0).map(lambda f: Fraction(f) * limit),
        st.floats(1e-9, 1e9).map(lambda f: Fraction(f * scale)),
    ))
    if mu_squared <= 0:
        return
    fast = rule.admits(GDPState(mu_squared), budget)
    assert fast == (mu_squared <= limit)
    # The check it replaces agrees wherever the rounded profile is not within a few
    # units of the float grid of the limit (there it may wobble by an ulp).
    if abs(float_up(mu_squared) - float(limit)) > 1e-9 * float(limit):
        assert fast == profile_admits(mu_squared, budget)


def test_a_charge_met_again_is_folded_from_the_cache_and_the_cache_stays_bounded() -> None:
    rule = RDPRule(target_delta="1e-5")
    gdp = GDPFilterRule(target_delta="1e-5")
    adv = FilterRule(delta_slack="1e-6")
    charges = [GaussianCharge(sigma=1 + i, sensitivity=1, epsilon=1) for i in range(300)]
    state, mu, sq = rule.start(), gdp.start(), adv.start()
    for charge in charges + charges[:10]:
        state = rule.add(state, charge, 2)
        mu = gdp.add(mu, charge, 2)
        sq = adv.add(sq, charge, 2)
    fresh, fresh_mu = RDPRule(target_delta="1e-5"), GDPFilterRule(target_delta="1e-5")
    expected, expected_mu = fresh.start(), fresh_mu.start()
    for charge in charges + charges[:10]:
        expected = fresh.add(expected, charge, 1)
        expected = fresh.add(expected, charge, 1)
        expected_mu = fresh_mu.add(expected_mu, charge, 1)
        expected_mu = fresh_mu.add(expected_mu, charge, 1)
        fresh._vectors.clear()
        fresh_mu._mu_squared.clear()
    assert state.rdp.tolist() == expected.rdp.tolist()
    assert mu == expected_mu
    costs = [cost_of(charge) for charge in charges + charges[:10]]
    assert sq == FilterState(sum(2 * c.epsilon**2 for c in costs),  # (mu^2 by hand too)
                             sum(2 * c.delta for c in costs))
    assert mu.mu_squared == sum(2 * Fraction(1, (1 + i) ** 2)
                                for i in [*range(300), *range(10)])
    assert max(len(rule._vectors), len(gdp._mu_squared), len(adv._terms)) <= 256
