"""(lower, upper) epsilon of a training run: the exact epsilon lies in between."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from dpaccount.integrations import TrainingLedger, epsilon_bounds_of_history, epsilon_of_history

DELTA = 1e-5


def _exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon of a Gaussian of sensitivity/sigma = mu (Balle and Wang 2018,
    Thm 8: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)), by root finding."""
    def excess(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2)) - delta)

    return float(optimize.brentq(excess, 0.0, mu * mu / 2 + 10 * mu + 10, xtol=1e-12))


@settings(max_examples=10, deadline=None)
@given(sigma=st.floats(0.8, 20.0), steps=st.integers(1, 400))
def test_unsubsampled_steps_bracket_the_exact_gaussian_epsilon(sigma: float, steps: int) -> None:
    # q = 1: k Gaussian steps of noise multiplier sigma are one Gaussian of mu = sqrt(k)/sigma
    # (Dong, Roth and Su 2019, Cor. 3.3), whose epsilon is known exactly.
    low, high = epsilon_bounds_of_history([(sigma, 1.0, steps)], DELTA)
    exact = _exact_gaussian_epsilon(math.sqrt(steps) / sigma, DELTA)
    assert low <= exact + 1e-9 and exact <= high + 1e-9
    assert high == epsilon_of_history([(sigma, 1.0, steps)], DELTA)


@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 1 / 32, 96), (1.1, 0.01, 2000),
                                                   (0.8, 0.1, 30)])
def test_subsampled_steps_bracket_google_dp_accounting(sigma: float, q: float,
                                                       steps: int) -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    low, high = epsilon_bounds_of_history([(sigma, q, steps)], DELTA)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    theirs = accountant.get_epsilon(DELTA)  # Google's pessimistic PLD estimate
    assert low <= theirs <= high + 1e-3
    assert 0 < high - low < 0.02 * high


def test_a_run_reports_both_and_no_steps_cost_nothing() -> None:
    run = TrainingLedger("memory://", budget=(2, DELTA), steps=50)
    assert run.epsilon_bounds(DELTA) == (0.0, 0.0)
    run.charge_steps(noise_multiplier=2.0, sampling_rate=0.1, steps=20)
    low, high = run.epsilon_bounds(DELTA)
    assert low < high == run.epsilon(DELTA)
