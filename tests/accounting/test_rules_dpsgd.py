"""The PLD rule's plan discipline, and the DP-SGD helpers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.accounting.dpsgd import (
    calibrate_dpsgd_noise,
    dpsgd_epsilon,
    dpsgd_epsilon_bounds,
    dpsgd_step_charge,
)
from dpaccount.accounting.pld import PLDRule
from dpaccount.charges import GaussianCharge, Repeated
from dpaccount.composition.base import Adaptivity
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

H = 1e-3


def test_pld_rule_takes_only_its_declared_plan() -> None:
    step = dpsgd_step_charge(0.01, 1.0)
    rule = PLDRule((step, 50), target_delta="1e-5", value_discretization_interval=H)
    assert rule.adaptivity is Adaptivity.ADAPTIVE_MECHANISMS
    state = rule.extend(rule.start(), Repeated(step, 49))
    state = rule.extend(state, step)
    with pytest.raises(UnsupportedChargeError, match="plan of 50"):
        rule.extend(state, step)
    with pytest.raises(UnsupportedChargeError, match="declared"):
        rule.extend(rule.start(), dpsgd_step_charge(0.01, 0.9))
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


def test_dpsgd_pld_is_tighter_than_rdp_and_bounds_are_ordered() -> None:
    pld = float(dpsgd_epsilon(0.01, 1.0, 200, 1e-5, value_discretization_interval=H))
    rdp = float(dpsgd_epsilon(0.01, 1.0, 200, 1e-5, accountant="rdp"))
    low, high = dpsgd_epsilon_bounds(0.01, 1.0, 200, 1e-5, value_discretization_interval=H)
    assert high is not None and float(low) <= pld == float(high)
    # RDP is a valid upper bound too: it can never be below the PLD lower bound.
    assert float(low) <= rdp
    assert pld < rdp
    with pytest.raises(ConfigError):
        dpsgd_epsilon(0.01, 1.0, 10, 1e-5, accountant="moments")
    with pytest.raises(InvalidCostError):
        dpsgd_epsilon(0.01, 1.0, 0, 1e-5)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibrated_noise_is_certified_and_nearly_minimal(accountant: str) -> None:
    tol = 1e-2
    sigma = calibrate_dpsgd_noise(
        0.02,
        100,
        1.0,
        1e-5,
        accountant=accountant,
        tolerance=tol,
        value_discretization_interval=H,
    )
    eps = dpsgd_epsilon(
        0.02, sigma, 100, 1e-5, accountant=accountant, value_discretization_interval=H
    )
    assert eps <= 1
    smaller = float(sigma) * (1 - 2 * tol)
    eps_smaller = dpsgd_epsilon(
        0.02, smaller, 100, 1e-5, accountant=accountant, value_discretization_interval=H
    )
    assert eps_smaller > 1


def test_step_charge_describes_the_step() -> None:
    c = dpsgd_step_charge("0.004", "1.1")
    assert c.scheme.value == "poisson"
    assert c.charge.sigma == pytest.approx(1.1) and c.charge.sensitivity == 1
    assert math.isclose(float(c.rate), 0.004)
