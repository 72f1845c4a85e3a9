"""Bad numbers for a training run: a typed error before anything is charged or applied."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.integrations import TrainingLedger
from dpaccount.integrations.training import MAX_PLANNED_STEPS

BUDGET = (10, "1e-5")
GOOD = {"noise_multiplier": 1.0, "sampling_rate": 0.1}
BAD_SIGMAS = [0, -1.0, math.nan, math.inf, -math.inf, True, "x", None]
BAD_RATES = [0, -0.1, 1.5, math.nan, math.inf, True, None]
BAD_STEPS = [0, -1, 1.5, True, "3", MAX_PLANNED_STEPS + 1, 10**30]


def _bad_cases() -> list[dict[str, Any]]:
    return (
        [{"noise_multiplier": s} for s in BAD_SIGMAS]
        + [{"sampling_rate": q} for q in BAD_RATES]
        + [{"steps": k} for k in BAD_STEPS]
    )


@pytest.mark.parametrize("bad", _bad_cases())
def test_a_bad_step_is_refused_before_the_ledger_is_opened(tmp_path, bad) -> None:  # type: ignore[no-untyped-def]
    url = "sqlite:///" + os.path.join(str(tmp_path), "run.db")
    run = TrainingLedger(url, name="r", budget=BUDGET, steps=50)
    with pytest.raises((InvalidCostError, ConfigError)):  # ConfigError: a missing rate
        run.charge_steps(**{**GOOD, **bad})
    assert run.accountant is None and run.history == [] and run.steps_taken == 0


@pytest.mark.parametrize("bad", _bad_cases())
def test_a_bad_step_leaves_a_running_ledger_as_it_was(bad: dict[str, Any]) -> None:
    run = TrainingLedger("memory://", budget=BUDGET, steps=50)
    run.charge_steps(**GOOD, steps=3)
    before = list(run.accountant.records)  # type: ignore[union-attr]
    with pytest.raises((InvalidCostError, ConfigError)):
        run.charge_steps(**{**GOOD, **bad})
    assert list(run.accountant.records) == before and run.steps_taken == 3  # type: ignore[union-attr]


@settings(max_examples=30, deadline=None)
@given(sigma=st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf)),
       rate=st.one_of(st.floats(min_value=0.1, max_value=1.0),
                      st.floats(min_value=1.0, exclude_min=True), st.floats(max_value=0.0)))
def test_no_invalid_sigma_or_rate_is_ever_charged(sigma: float, rate: float) -> None:
    run = TrainingLedger("memory://", budget=BUDGET, rule="rdp")
    with pytest.raises(InvalidCostError):
        run.charge_steps(noise_multiplier=sigma, sampling_rate=rate)
    assert run.accountant is not None and list(run.accountant.records) == []


def test_a_declared_plan_beyond_the_cap_is_refused() -> None:
    with pytest.raises(ConfigError, match="at most"):
        TrainingLedger("memory://", budget=BUDGET, steps=MAX_PLANNED_STEPS + 1)
    with pytest.raises(InvalidCostError):
        TrainingLedger("memory://", budget=(math.nan, 1e-5))
    with pytest.raises(InvalidCostError):
        TrainingLedger("memory://", budget=(1, 1))
