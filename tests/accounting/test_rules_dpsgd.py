"""The PLD rule's plan discipline, and the DP-SGD helpers."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.accounting.dpsgd import (
    calibrate_dpsgd_noise,
    dpsgd_epsilon,
    dpsgd_epsilon_bounds,
    dpsgd_schedule,
    dpsgd_step_charge,
)
from dpaccount.accounting.pld import PLDRule
from dpaccount.accounting.rdp import (
    DEFAULT_ORDERS,
    SGM_INTEGER_ORDERS,
    sgm_epsilon,
    subsampled_gaussian_rdp,
)
from dpaccount.accounting.rdp.conversion import _refined_epsilon
from dpaccount.accounting.rdp.subsampled import _sgm_integer_rdp
from dpaccount.charges import GaussianCharge, Repeated
from dpaccount.composition.base import Adaptivity
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

H = 1e-3


def test_pld_rule_takes_only_its_declared_plan() -> None:
    step = dpsgd_step_charge(sampling_rate=0.01, noise_multiplier=1.0)
    rule = PLDRule((step, 50), target_delta="1e-5", value_discretization_interval=H)
    assert rule.adaptivity is Adaptivity.ADAPTIVE_MECHANISMS
    state = rule.extend(rule.start(), Repeated(step, 49))
    state = rule.extend(state, step)
    with pytest.raises(UnsupportedChargeError, match="plan of 50"):
        rule.extend(state, step)
    with pytest.raises(UnsupportedChargeError, match="declared"):
        rule.extend(rule.start(), dpsgd_step_charge(sampling_rate=0.01, noise_multiplier=0.9))
    with pytest.raises(ConfigError):
        PLDRule(None, target_delta="1e-5")
    with pytest.raises(ConfigError):
        PLDRule((step, 5))  # no delta to report at


def test_pld_rule_total_is_the_better_of_plan_and_basic() -> None:
    unit = PrivacyCost("0.01")
    rule = PLDRule((unit, 500), budget=Budget(1, "1e-5"), value_discretization_interval=H)
    one = rule.extend(rule.start(), unit)
    assert rule.total(one) == unit  # basic is better for a single query
    full = rule.extend(rule.start(), Repeated(unit, 500))
    total = rule.total(full)
    assert total.epsilon < 5 * unit.epsilon * 100  # far below basic composition (5.0)
    assert float(total.epsilon) < 1.0
    assert rule.admits(full, Budget(1, "1e-5")) == total.fits(Budget(1, "1e-5"))
    assert rule.describe()["name"] == "pld"


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 20))
def test_pld_rule_repeated_equals_separate(k: int) -> None:
    g = GaussianCharge(2, 1, 1)
    rule = PLDRule((g, 20), target_delta="1e-5", value_discretization_interval=H)
    separate = rule.start()
    for _ in range(k):
        separate = rule.extend(separate, g)
    assert rule.total(separate) == rule.total(rule.extend(rule.start(), Repeated(g, k)))


RUN = {"sampling_rate": 0.01, "noise_multiplier": 1.0, "steps": 200, "target_delta": 1e-5}


def test_dpsgd_pld_is_tighter_than_rdp_and_bounds_are_ordered() -> None:
    pld = dpsgd_epsilon(**RUN, value_discretization_interval=H)
    rdp = dpsgd_epsilon(**RUN, accountant="rdp")
    low, high = dpsgd_epsilon_bounds(**RUN, value_discretization_interval=H)
    assert isinstance(pld, float) and isinstance(rdp, float)
    assert high is not None and low <= pld == high
    # RDP is a valid upper bound too: it can never be below the PLD lower bound.
    assert low <= rdp
    assert pld < rdp
    with pytest.raises(ConfigError):
        dpsgd_epsilon(**RUN, accountant="moments")
    with pytest.raises(InvalidCostError):
        dpsgd_epsilon(**{**RUN, "steps": 0})


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibrated_noise_is_certified_and_nearly_minimal(accountant: str) -> None:
    tol = 1e-2
    run = {"sampling_rate": 0.02, "steps": 100, "target_delta": 1e-5}
    sigma = calibrate_dpsgd_noise(
        **run, target_epsilon=1.0, accountant=accountant, tolerance=tol,
        value_discretization_interval=H,
    )
    assert isinstance(sigma, float)
    eps = dpsgd_epsilon(**run, noise_multiplier=sigma, accountant=accountant,
                        value_discretization_interval=H)
    assert eps <= 1
    smaller = sigma * (1 - 2 * tol)
    eps_smaller = dpsgd_epsilon(**run, noise_multiplier=smaller, accountant=accountant,
                                value_discretization_interval=H)
    assert eps_smaller > 1


def test_step_charge_describes_the_step() -> None:
    c = dpsgd_step_charge(sampling_rate="0.004", noise_multiplier="1.1")
    assert c.scheme.value == "poisson"
    assert c.charge.sigma == pytest.approx(1.1) and c.charge.sensitivity == 1
    assert math.isclose(float(c.rate), 0.004)
    by_sizes = dpsgd_step_charge(dataset_size=1000, batch_size=4, noise_multiplier="1.1")
    assert by_sizes == c


def test_schedule_from_sizes_follows_tensorflow_privacy() -> None:
    # compute_dp_sgd_privacy(n, batch_size, noise_multiplier, epochs, delta) takes
    # q = batch_size / n and steps = ceil(epochs * n / batch_size).
    q, steps = dpsgd_schedule(dataset_size=60000, batch_size=256, epochs=60)
    assert q == Fraction(256, 60000) and steps == math.ceil(60 * 60000 / 256) == 14063
    assert dpsgd_schedule(sampling_rate="0.01", epochs="2.5") == (Fraction(1, 100), 250)
    by_sizes = dpsgd_epsilon(dataset_size=1000, batch_size=10, epochs=2, noise_multiplier=1,
                             target_delta=1e-5, accountant="rdp")
    by_rate = dpsgd_epsilon(sampling_rate=0.01, steps=200, noise_multiplier=1,
                            target_delta=1e-5, accountant="rdp")
    assert by_sizes == by_rate


@pytest.mark.parametrize(
    "schedule",
    [
        {},  # nothing
        {"sampling_rate": 0.01},  # no length
        {"steps": 10},  # no rate
        {"sampling_rate": 0.01, "dataset_size": 100, "batch_size": 1, "steps": 1},
        {"sampling_rate": 0.01, "steps": 1, "epochs": 1},
        {"dataset_size": 10, "batch_size": 11, "steps": 1},
        {"dataset_size": 10, "steps": 1},
    ],
)
def test_incomplete_or_doubled_schedules_are_config_errors(schedule: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError):
        dpsgd_epsilon(noise_multiplier=1, target_delta=1e-5, **schedule)


def test_positional_arguments_are_refused() -> None:
    # The old positional order differed between the helpers; keywords only now.
    with pytest.raises(TypeError):
        dpsgd_epsilon(0.01, 1.0, 100, 1e-5)  # type: ignore[misc]


@settings(max_examples=25, deadline=None)
@given(
    log_q=st.floats(-4, -0.3),
    sigma=st.floats(0.5, 5),
    steps=st.integers(1, 20000),
    log_delta=st.floats(-9, -3),
)
def test_fast_sgm_epsilon_matches_the_full_order_grid(
    log_q: float, sigma: float, steps: int, log_delta: float
) -> None:
    # The fast path (integer orders vectorised, fractional search between the best one's
    # neighbours) against the exhaustive grid of 317 orders, each by its own formula
    # (binomial sum or quadrature) and refined the old way. Both are valid bounds; the
    # fast one must not be looser by more than the search's tolerance.
    q, delta = 10**log_q, 10**log_delta
    fast = sgm_epsilon(q, sigma, steps, delta)
    full = _refined_epsilon(lambda a: steps * subsampled_gaussian_rdp(q, sigma, a),
                            DEFAULT_ORDERS, delta)
    assert fast <= full * (1 + 1e-5)
    coarse = sgm_epsilon(q, sigma, steps, delta, refine=False)
    assert fast <= coarse


@settings(max_examples=25, deadline=None)
@given(log_q=st.floats(-4, 0), sigma=st.floats(0.3, 8), order=st.integers(2, 64))
def test_vectorised_integer_orders_match_the_scalar_formula(
    log_q: float, sigma: float, order: int
) -> None:
    q = min(10**log_q, 1.0)
    i = SGM_INTEGER_ORDERS.index(order)
    vector = _sgm_integer_rdp(q, sigma, SGM_INTEGER_ORDERS)[i]
    assert vector == pytest.approx(subsampled_gaussian_rdp(q, sigma, float(order)),
                                   rel=1e-12)
