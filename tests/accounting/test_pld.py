"""The PLD engine against closed forms computed independently inside the tests.

Stated discretisation error (docs/tight-accounting.md): every loss of the pessimistic
(connect-the-dots) PLD is within one grid step h of the true loss in a coupling, and
every loss of the optimistic PLD is within h below it, so after k compositions

    delta_true(eps + k h) <= lower(eps) <= delta_true(eps) <= upper(eps) <= delta_true(eps - k h)

(plus truncated tail mass and a floating-point allowance, both far below 1e-9 here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, stats

from dpaccount.accounting.pld import PrivacyLossDistribution, compose_plan
from dpaccount.charges import GaussianCharge, LaplaceCharge, Repeated, Scheme, Subsampled
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

SLACK = 1e-9


def gdp_delta(epsilon: float, mu: float) -> float:
    """Dong, Roth and Su 2019, Cor. 2.13: delta(eps) of mu-GDP."""
    return float(
        stats.norm.cdf(-epsilon / mu + mu / 2)
        - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
    )


def gdp_epsilon(delta: float, mu: float) -> float:
    return float(optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, 500.0, xtol=1e-12))


@pytest.mark.parametrize(("sigma", "k"), [(1.0, 1), (2.0, 3), (3.0, 9), (1.0, 10)])
def test_k_gaussians_match_gaussian_dp(sigma: float, k: int) -> None:
    h = 1e-3
    pld = PrivacyLossDistribution.gaussian(sigma, value_discretization_interval=h)
    composed = pld.self_compose(k)  # k >= 4 uses the FFT power, k < 4 squaring
    mu = math.sqrt(k) / sigma
    for eps in (0.0, 0.5, 1.0, 2.0):
        low, high = composed.delta(eps)
        assert gdp_delta(eps + k * h, mu) - SLACK <= float(low)
        assert float(low) <= gdp_delta(eps, mu) + SLACK
        assert gdp_delta(eps, mu) <= float(high)
        assert float(high) <= gdp_delta(max(eps - k * h, -10), mu) + SLACK
    low_e, high_e = composed.epsilon(1e-5)
    assert high_e is not None
    exact = gdp_epsilon(1e-5, mu)
    assert float(low_e) - SLACK <= exact <= float(high_e) <= exact + k * h + SLACK


def test_plan_of_gaussians_is_merged_exactly() -> None:
    # 100 Gaussians of sigma 1: mu = 10, epsilon(1e-5) = 91.82 (the number).
    plan = [Repeated(GaussianCharge(1, 1, 1), 100)]
    low, high = compose_plan(plan, value_discretization_interval=1e-4).epsilon(1e-5)
    exact = gdp_epsilon(1e-5, 10.0)
    assert 91.8 < exact < 91.83
    assert high is not None
    assert float(low) <= exact <= float(high) <= exact + 1e-3


def laplace_profile(epsilon: float, e0: float) -> float:
    """delta(eps) of Lap(0,1) vs Lap(e0,1) by numerical integration of (p - e^eps q)_+."""

    def integrand(x: float) -> float:
        p = 0.5 * math.exp(-abs(x))
        q = 0.5 * math.exp(-abs(x - e0))
        return max(p - math.exp(epsilon) * q, 0.0)

    value, _ = integrate.quad(integrand, -60, 60, points=[0.0, e0], limit=200, epsabs=1e-13)
    return float(value)


@pytest.mark.parametrize("scale", [0.5, 1.0, 4.0])
def test_laplace_pld_matches_its_privacy_profile(scale: float) -> None:
    h = 1e-3
    e0 = 1 / scale
    pld = PrivacyLossDistribution.laplace(scale, value_discretization_interval=h)
    for eps in (0.0, 0.1, 0.3, 0.9 * e0):
        low, high = pld.delta(eps)
        exact = laplace_profile(eps, e0)
        assert float(low) - 1e-9 <= exact <= float(high) + 1e-9
        assert float(high) <= laplace_profile(max(eps - h, 0.0), e0) + 1e-9
    assert pld.delta(e0 + 2 * h)[1] < 1e-9  # pure e0-DP


def kov_delta(eps0: float, delta0: float, k: int, i: int) -> float:
    """Kairouz, Oh and Viswanath 2015, Thm 3.3: delta at epsilon = (k - 2i) eps0."""
    total = 0.0
    for ell in range(i):
        total += math.comb(k, ell) * (
            math.exp((k - ell) * eps0) - math.exp((k - 2 * i + ell) * eps0)
        )
    delta_i = total / (1 + math.exp(eps0)) ** k
    # 1 - (1 - delta0)^k (1 - delta_i), without cancellation in 1 - (1 - delta0)^k
    lost = float(1 - (1 - Fraction(delta0)) ** k)
    return lost + (1 - lost) * delta_i


@pytest.mark.parametrize(("eps0", "delta0", "k"), [(0.5, 0.0, 5), (0.25, 1e-6, 12), (1.0, 1e-4, 3)])
def test_epsilon_delta_pair_reproduces_kov(eps0: float, delta0: float, k: int) -> None:
    h = 2.0**-10  # eps0 is a multiple of h: the pair's losses lie on the grid
    pld = PrivacyLossDistribution.from_privacy_parameters(
        eps0, delta0, value_discretization_interval=h
    ).self_compose(k)
    for i in range(0, k // 2 + 1):
        eps = (k - 2 * i) * eps0
        exact = kov_delta(eps0, delta0, k, i)
        low, high = pld.delta(eps)
        assert float(low) - 1e-9 <= exact <= float(high) <= exact + 1e-9


@settings(max_examples=25, deadline=None)
@given(
    sigma=st.floats(0.6, 4.0),
    rate=st.floats(0.005, 0.3),
    steps=st.integers(1, 40),
)
def test_upper_is_at_least_lower(sigma: float, rate: float, steps: int) -> None:
    pld = PrivacyLossDistribution.gaussian(
        sigma, sampling_rate=rate, value_discretization_interval=1e-2
    ).self_compose(steps)
    low, high = pld.epsilon(1e-5)
    assert high is not None and low <= high
    for eps in (0.0, 0.5, 2.0):
        d_low, d_high = pld.delta(eps)
        assert 0 <= d_low <= d_high <= 1


@settings(max_examples=15, deadline=None)
@given(sigma=st.floats(0.7, 3.0), rate=st.floats(0.01, 0.5), steps=st.integers(1, 30))
def test_upper_shrinks_as_the_grid_is_refined(sigma: float, rate: float, steps: int) -> None:
    previous = math.inf
    for h in (2.0**-5, 2.0**-7, 2.0**-9):  # nested grids
        pld = PrivacyLossDistribution.gaussian(
            sigma, sampling_rate=rate, value_discretization_interval=h
        ).self_compose(steps)
        high = pld.epsilon(1e-5)[1]
        assert high is not None
        assert float(high) <= previous * (1 + 1e-9) + 1e-9
        previous = float(high)


@settings(max_examples=15, deadline=None)
@given(sigma=st.floats(0.7, 3.0), rate=st.floats(0.01, 0.4), steps=st.integers(1, 30))
def test_upper_is_monotone_in_steps_rate_and_antitone_in_sigma(
    sigma: float, rate: float, steps: int
) -> None:
    def upper(s: float, q: float, k: int) -> float:
        pld = PrivacyLossDistribution.gaussian(
            s, sampling_rate=q, value_discretization_interval=1e-2
        ).self_compose(k)
        high = pld.epsilon(1e-5)[1]
        assert high is not None
        return float(high)

    base = upper(sigma, rate, steps)
    tol = 1e-9
    assert upper(sigma, rate, steps + 1) >= base - tol
    assert upper(sigma, min(1.0, rate * 1.5), steps) >= base - tol
    assert upper(sigma * 1.2, rate, steps) <= base + tol


def test_subsampling_directions_and_relations() -> None:
    charge = Subsampled(GaussianCharge(1, 1, 1), rate="0.1", scheme=Scheme.POISSON)
    pld = PrivacyLossDistribution.from_charge(charge, value_discretization_interval=1e-3)
    # Amplification: far below the unsubsampled Gaussian (eps(1e-5) = 4.37 at mu = 1).
    # Balle, Barthe and Gaboardi 2018, Thm 8: (eps, delta/q) -> (log(1 + q(e^eps - 1)), delta),
    # with eps the Gaussian's at delta = 1e-4 (a valid bound; the PLD may not exceed it
    # by more than the grid step).
    inner = gdp_epsilon(1e-4, 1.0)
    amplified = math.log1p(0.1 * math.expm1(inner))
    low, high = pld.epsilon(1e-5)
    assert high is not None and float(low) <= amplified + 1e-9
    assert float(high) <= amplified + 1e-3
    wor = Subsampled(GaussianCharge(1, 1, 1), rate="0.1", scheme=Scheme.WITHOUT_REPLACEMENT)
    with pytest.raises(UnsupportedChargeError, match="substitution"):
        PrivacyLossDistribution.from_charge(wor, relation="add_remove")
    sub = PrivacyLossDistribution.from_charge(
        wor, relation="substitution", value_discretization_interval=1e-3
    )
    # One step: the symmetrised pair's profile is the larger of the two orders', so
    # epsilon(delta) is the Poisson value up to discretisation, and within BBG's bound
    # (Thm 9, sampling without replacement, substitution). Composition is where the two
    # differ: tests/accounting/test_pld_substitution.py.
    sub_high = sub.epsilon(1e-5)[1]
    assert sub_high is not None
    assert float(high) - 1e-3 <= float(sub_high) <= amplified + 1e-3


def test_subsampled_laplace_is_between_zero_and_the_full_mechanism() -> None:
    h = 1e-3
    full = PrivacyLossDistribution.laplace(1, value_discretization_interval=h)
    sub = PrivacyLossDistribution.laplace(1, sampling_rate=0.2, value_discretization_interval=h)
    amplified = math.log1p(0.2 * math.expm1(1.0))  # Balle et al. 2018 bound at delta = 0
    low, high = sub.epsilon(1e-10)
    assert high is not None and float(high) <= amplified + 2 * h
    assert float(low) <= float(high) <= float(full.epsilon(1e-10)[1] or math.inf) <= 1 + 2 * h


def test_laplace_plan_and_generic_costs_compose() -> None:
    plan = [Repeated(LaplaceCharge(10, 1), 5), PrivacyCost("0.1", "1e-7")]
    low, high = compose_plan(plan, value_discretization_interval=1e-3).epsilon(1e-5)
    assert high is not None and float(low) <= float(high) <= 0.6 + 0.01  # <= basic


def test_invalid_inputs_are_refused() -> None:
    with pytest.raises(InvalidCostError, match="sigma"):
        PrivacyLossDistribution.gaussian(-1)
    with pytest.raises(InvalidCostError, match="value_discretization_interval"):
        PrivacyLossDistribution.gaussian(1, value_discretization_interval=0)
    with pytest.raises(InvalidCostError, match="count"):
        PrivacyLossDistribution.gaussian(1).self_compose(0)
    a = PrivacyLossDistribution.gaussian(1, value_discretization_interval=1e-2)
    b = PrivacyLossDistribution.gaussian(1, value_discretization_interval=1e-3)
    with pytest.raises(ConfigError):
        a.compose(b)
    with pytest.raises(InvalidCostError):
        compose_plan([])


def test_heterogeneous_composition_is_order_invariant() -> None:
    h = 1e-3
    a = PrivacyLossDistribution.laplace(2, value_discretization_interval=h)
    b = PrivacyLossDistribution.gaussian(3, sampling_rate=0.3, value_discretization_interval=h)
    ab, ba = a.compose(b), b.compose(a)
    for eps in (0.0, 0.5, 1.0):
        assert np.isclose(float(ab.delta(eps)[1]), float(ba.delta(eps)[1]), rtol=1e-9)


def hockey_stick(
    p: Callable[[float], float], q: Callable[[float], float], eps: float, points: list[float]
) -> float:
    """sup_S P(S) - e^eps Q(S) = integral of (p - e^eps q)_+, by quadrature."""
    value, _ = integrate.quad(
        lambda x: max(p(x) - math.exp(eps) * q(x), 0.0),
        -40,
        40,
        points=points,
        limit=400,
        epsabs=1e-14,
    )
    return float(value)


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_one_subsampled_step_matches_both_directions_by_quadrature(kind: str) -> None:
    # Poisson subsampling, add/remove: the remove pair ((1-q) Q + q P, Q) and the add
    # pair (Q, (1-q) Q + q P); the mechanism's profile is the larger of the two.
    rate, h = 0.2, 1e-3
    if kind == "gaussian":

        def base(x: float) -> float:
            return float(stats.norm.pdf(x))

        def shifted(x: float) -> float:
            return float(stats.norm.pdf(x, 1.0))

        pld = PrivacyLossDistribution.gaussian(
            1, sampling_rate=rate, value_discretization_interval=h
        )
    else:

        def base(x: float) -> float:
            return 0.5 * math.exp(-abs(x))

        def shifted(x: float) -> float:
            return 0.5 * math.exp(-abs(x - 1.0))

        pld = PrivacyLossDistribution.laplace(
            1, sampling_rate=rate, value_discretization_interval=h
        )

    def mix(x: float) -> float:
        return (1 - rate) * base(x) + rate * shifted(x)

    def exact(eps: float) -> float:
        return max(
            hockey_stick(mix, base, eps, [0.0, 1.0]), hockey_stick(base, mix, eps, [0.0, 1.0])
        )

    for eps in (0.0, 0.05, 0.15, 0.4):
        low, high = pld.delta(eps)
        truth = exact(eps)
        assert float(low) - 1e-8 <= truth <= float(high) + 1e-8
        assert float(high) <= exact(max(eps - h, 0.0)) + 1e-8


def test_parallel_charge_must_match_the_relation() -> None:
    from dpaccount.charges import Parallel

    part = Parallel([PrivacyCost(1), PrivacyCost("0.5")])  # stated for add/remove
    with pytest.raises(UnsupportedChargeError, match="parallel"):
        PrivacyLossDistribution.from_charge(part, relation="substitution")
    high = PrivacyLossDistribution.from_charge(part, value_discretization_interval=1e-3)
    assert float(high.epsilon(1e-10)[1] or math.inf) <= 1 + 1e-3  # max over partitions
