"""The longest DP-SGD plan that fits: exact, in a few certified PLD evaluations."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.accounting import dpsgd_epsilon
from dpaccount.accounting.dpsgd_plan import (
    MAX_PLAN_STEPS,
    StepPlan,
    clear_plan_cache,
    plan_dpsgd_steps,
)
from dpaccount.accounting.pld import PrivacyLossDistribution
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.integrations import TrainingLedger

DELTA = 1e-5


@pytest.fixture
def compositions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[float]]:
    """Every PLD self-composition, counted by its grid: 1e-4 is a certified evaluation
    (the rule's grid), 1e-2 and 1e-3 the coarse surrogates'."""
    clear_plan_cache()
    seen: Counter[float] = Counter()
    original = PrivacyLossDistribution.self_compose

    def counting(self: PrivacyLossDistribution, count: int) -> PrivacyLossDistribution:
        seen[round(self.interval, 12)] += 1
        return original(self, count)

    monkeypatch.setattr(PrivacyLossDistribution, "self_compose", counting)
    yield seen
    clear_plan_cache()


def _linear_plan(sigma: float, q: float, budget: float) -> int:
    """The plan by brute force: k = 1, 2, ... with the DP-SGD helper's certified
    epsilon (its own PLD path) until one does not fit."""
    k = 0
    while dpsgd_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=k + 1,
                        target_delta=DELTA) <= budget:
        k += 1
    return k


@pytest.mark.parametrize(
    ("sigma", "q", "budget"),
    [(1.0, 1 / 32, 1.0), (1.0, 1 / 32, 1.5), (0.8, 0.1, 2.0), (2.0, 1.0, 3.0), (1.0, 1 / 32, 0.5)],
)
def test_the_plan_equals_a_linear_search(sigma: float, q: float, budget: float) -> None:
    clear_plan_cache()
    plan = plan_dpsgd_steps(noise_multiplier=sigma, sampling_rate=q, budget=(budget, DELTA))
    assert plan.steps == _linear_plan(sigma, q, budget)
    assert not plan.capped
    if plan.steps:
        assert plan.epsilon <= budget
        assert plan.epsilon == pytest.approx(
            dpsgd_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=plan.steps,
                          target_delta=DELTA), rel=1e-12)


@settings(max_examples=8, deadline=None)
@given(sigma=st.floats(0.8, 3.0), q=st.floats(0.02, 1.0), budget=st.floats(0.5, 3.0))
def test_the_plan_fits_and_one_more_step_does_not(sigma: float, q: float,
                                                  budget: float) -> None:
    plan = plan_dpsgd_steps(noise_multiplier=sigma, sampling_rate=q, budget=(budget, DELTA))
    run = {"noise_multiplier": sigma, "sampling_rate": q, "target_delta": DELTA}
    if plan.steps:
        assert dpsgd_epsilon(steps=plan.steps, **run) <= budget
    assert dpsgd_epsilon(steps=plan.steps + 1, **run) > budget


@pytest.mark.parametrize(("budget", "steps"), [(8, 1500), (30, 13072), (1000, 1048822)])
def test_the_plan_costs_at_most_five_certified_evaluations(
    compositions: Counter[float], budget: int, steps: int
) -> None:
    # The plans at sigma = 1, q = 1/32, delta = 1e-5 (checked against the previous
    # bisection, which took 20 to 40 evaluations; the linear search agrees at small
    # budgets above).
    plan = plan_dpsgd_steps(noise_multiplier=1, sampling_rate=1 / 32, budget=(budget, DELTA))
    assert plan.steps == steps
    assert compositions[1e-4] == plan.evaluations <= 5
    assert compositions[1e-2] + compositions[1e-3] == plan.surrogate_evaluations <= 12
    again = plan_dpsgd_steps(noise_multiplier=1, sampling_rate=1 / 32, budget=(budget, DELTA))
    assert (again.steps, again.evaluations) == (steps, 0)  # cached
    assert compositions[1e-4] == plan.evaluations


def test_the_first_step_of_a_run_composes_the_plan_no_more_than_the_search(
    compositions: Counter[float],
) -> None:
    run = TrainingLedger("memory://", budget=(8, DELTA))
    run.charge_steps(noise_multiplier=1, sampling_rate=1 / 32)
    # The ledger is opened on the rule the search composed: no further evaluation.
    assert compositions[1e-4] <= 5
    assert run.steps_left(noise_multiplier=1, sampling_rate=1 / 32) == 1499
    assert compositions[1e-4] <= 5


def test_a_plan_is_capped_and_says_so() -> None:
    clear_plan_cache()
    plan = plan_dpsgd_steps(noise_multiplier=1, sampling_rate=1 / 32, budget=(30, DELTA),
                            limit=40)
    assert (plan.steps, plan.capped) == (40, True)
    with pytest.raises(ConfigError, match="at most"):
        plan_dpsgd_steps(noise_multiplier=1, sampling_rate=1 / 32, budget=(30, DELTA),
                         limit=MAX_PLAN_STEPS + 1)
    with pytest.raises(ConfigError, match="at most"):
        TrainingLedger("memory://", budget=(30, DELTA), steps=MAX_PLAN_STEPS + 1)


def test_no_step_fits_pure_dp_or_a_tiny_budget() -> None:
    assert plan_dpsgd_steps(noise_multiplier=1, sampling_rate=1 / 32, budget=(1, 0)).steps == 0
    tiny = plan_dpsgd_steps(noise_multiplier=1, sampling_rate=1, budget=(0.01, DELTA))
    assert tiny == StepPlan(0, 0.0, False, 1, 2)  # one step, on each grid


@pytest.mark.parametrize(
    "bad",
    [
        {"noise_multiplier": 0},
        {"noise_multiplier": -1},
        {"noise_multiplier": math.nan},
        {"noise_multiplier": math.inf},
        {"sampling_rate": 0},
        {"sampling_rate": 1.5},
        {"sampling_rate": math.nan},
        {"budget": (math.nan, DELTA)},
        {"budget": (math.inf, DELTA)},
        {"budget": (1, 1.0)},
        {"noise_multiplier": True},
        {"value_discretization_interval": math.nan},
        {"value_discretization_interval": 0},
    ],
)
def test_bad_numbers_are_refused_before_any_evaluation(
    compositions: Counter[float], bad: dict[str, Any]
) -> None:
    args: dict[str, Any] = {"noise_multiplier": 1, "sampling_rate": 0.01, "budget": (1, DELTA)}
    args.update(bad)
    with pytest.raises(InvalidCostError):
        plan_dpsgd_steps(**args)
    assert not compositions
