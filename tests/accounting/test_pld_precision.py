"""Precision at tiny delta, and deltas no double can hold (issue: soundness, item 6).

Exact values come from the closed form of the Gaussian's privacy profile (Balle and Wang
2018, Thm 8: delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)), evaluated
here with mpmath at 50 digits and solved for epsilon by bisection, independently of the
engine's floating-point code.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import pytest

from dpaccount import Accountant, Budget, GaussianCharge, GaussianMechanism
from dpaccount.accounting import PrivacyLossDistribution, dpsgd_epsilon
from dpaccount.accounting.pld import compose_plan
from dpaccount.charges import DiscreteGaussianCharge, Repeated
from dpaccount.composition import advanced, filter_epsilon, heterogeneous, optimal
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError

mpmath.mp.dps = 50


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    m, d = mpmath.mpf(mu), mpmath.mpf(delta)

    def profile(eps: mpmath.mpf) -> mpmath.mpf:
        return mpmath.ncdf(m / 2 - eps / m) - mpmath.exp(eps) * mpmath.ncdf(-m / 2 - eps / m)

    lo, hi = mpmath.mpf(0), mpmath.mpf(m * m / 2 + 40 * m + 10)
    for _ in range(200):
        mid = (lo + hi) / 2
        if profile(mid) > d:
            lo = mid
        else:
            hi = mid
    return float(hi)


@pytest.mark.parametrize(("sigma", "delta"), [(10, 1e-12), (10, 1e-14), (2, 1e-13), (1, 1e-11)])
def test_one_gaussian_at_tiny_delta_is_within_one_percent(sigma: float, delta: float) -> None:
    exact = exact_gaussian_epsilon(1 / sigma, delta)
    _low, high = PrivacyLossDistribution.gaussian(sigma).epsilon(delta)
    assert high is not None
    assert exact <= float(high) <= exact * 1.01


def test_ten_thousand_gaussians_at_delta_1e_12() -> None:
    # sigma = 1, k = 10^4: one Gaussian of mu = 100 (Dong, Roth and Su 2019, Cor. 3.3);
    # exact epsilon 5702.5. The engine used to fall back to basic composition here.
    exact = exact_gaussian_epsilon(100.0, 1e-12)
    assert 5702 < exact < 5703
    plan = [Repeated(GaussianCharge(sigma=1, sensitivity=1, epsilon=1), 10**4)]
    _low, high = compose_plan(plan, value_discretization_interval=1e-2).epsilon(1e-12)
    assert high is not None
    assert exact <= float(high) <= exact * 1.01


def test_the_discrete_gaussian_at_tiny_delta() -> None:
    # sigma = 10 lattice steps, sensitivity 1: its profile is close to the continuous
    # Gaussian's of mu = 0.1 (Canonne, Kamath and Steinke 2020, Thm 7 bounds the
    # difference); the certified value must not be swamped by float allowances.
    continuous = exact_gaussian_epsilon(0.1, 1e-12)
    charge = DiscreteGaussianCharge(sigma=10, sensitivity=1, epsilon=1, delta="1e-6")
    _low, high = PrivacyLossDistribution.from_charge(charge).epsilon(1e-12)
    assert high is not None
    assert abs(float(high) - continuous) <= 0.01 * continuous


TINY = Fraction(1, 10**400)


def test_log_one_over_delta_bounds_take_any_delta() -> None:
    # ln(1/delta) = 400 ln 10 exactly; the bounds built from the integers bracket it.
    exact = float(400 * mpmath.log(10))
    by_advanced = advanced(PrivacyCost("0.01"), 100, TINY).epsilon
    # advanced: sqrt(2k ln(1/d)) eps + k eps (e^eps - 1)
    expected = float(mpmath.sqrt(2 * 100 * exact) * mpmath.mpf("0.01")
                     + 100 * mpmath.mpf("0.01") * mpmath.expm1(mpmath.mpf("0.01")))
    assert expected <= float(by_advanced) <= expected * (1 + 1e-9)
    assert filter_epsilon([PrivacyCost("0.01")] * 10, TINY).epsilon > 0
    assert heterogeneous([PrivacyCost("0.01")] * 10, TINY).epsilon > 0
    assert optimal(PrivacyCost(1), 10, TINY).epsilon == 10  # exact rule: no overflow
    acct = Accountant(Budget(5, TINY), rule="filter")
    acct.charge(PrivacyCost("0.01"))
    assert len(acct.records) == 1


@pytest.mark.parametrize(
    "build",
    [
        lambda: Accountant(Budget(1, TINY), rule="rdp"),
        lambda: Accountant(Budget(1, TINY), rule="gdp"),
        lambda: GaussianMechanism(epsilon=1, delta=TINY, sensitivity=1),
        lambda: dpsgd_epsilon(sampling_rate=0.01, noise_multiplier=1.0, steps=100,
                              target_delta=TINY, accountant="rdp"),
    ],
)
def test_float_bounds_refuse_deltas_below_1e_300_with_a_typed_error(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidCostError, match="1e-300"):
        build()


def test_pld_at_a_delta_no_double_holds_is_sound() -> None:
    # Below the smallest double the target rounds down to 0: the answer is the pure-DP
    # epsilon (unbounded for a Gaussian), never an overflow and never too small.
    low, high = PrivacyLossDistribution.gaussian(1).epsilon(TINY)
    assert high is None and low >= 0
