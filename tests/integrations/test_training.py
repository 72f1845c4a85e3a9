"""TrainingLedger: steps charged before use, plans from public numbers, resume, chunks."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget
from dpaccount.accounting import PLDRule, dpsgd_epsilon, dpsgd_step_charge
from dpaccount.errors import ConfigError, StepRefusedError, UnsupportedChargeError
from dpaccount.integrations import TrainingLedger, epsilon_of_history, max_planned_steps

STEP = {"noise_multiplier": 1.0, "sampling_rate": 0.01}
H = 1e-3


def _url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return "sqlite:///" + os.path.join(str(tmp_path), "run.db")


def test_the_plan_is_the_largest_run_whose_certified_epsilon_fits() -> None:
    k = max_planned_steps(**STEP, budget=(1, "1e-5"))
    # Independently: the DP-SGD helper's certified epsilon at k and k + 1 steps.
    assert dpsgd_epsilon(**STEP, steps=k, target_delta=1e-5) <= 1
    assert dpsgd_epsilon(**STEP, steps=k + 1, target_delta=1e-5) > 1
    assert max_planned_steps(noise_multiplier="0.1", sampling_rate=1, budget=(1, "1e-5")) == 0


def test_steps_past_the_plan_are_refused_and_nothing_is_recorded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger(_url(tmp_path), name="r", budget=(1, "1e-5"))
    planned = max_planned_steps(**STEP, budget=(1, "1e-5"))
    run.charge_steps(**STEP, steps=planned - 1)
    before = list(run.accountant.records)  # type: ignore[union-attr]
    with pytest.raises(StepRefusedError) as refused:
        run.charge_steps(**STEP, steps=2, computed=True)
    assert list(run.accountant.records) == before  # type: ignore[union-attr]
    error = refused.value
    assert (error.step, error.steps, error.computed) == (planned - 1, 2, True)
    assert "discarded, not applied" in str(error) and "did not run" not in str(error)
    assert error.would_be.epsilon > 1 and error.budget == Budget(1, "1e-5")
    run.charge_steps(**STEP)  # the last planned step still fits
    assert run.steps_taken == planned
    with pytest.raises(StepRefusedError, match="Nothing ran"):
        run.charge_steps(**STEP)
    run.close()


def test_a_resumed_run_continues_from_the_ledger(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = _url(tmp_path)
    first = TrainingLedger(url, name="r", budget=(2, "1e-5"), steps=300)
    for _ in range(7):
        first.charge_steps(**STEP)
    first.close()  # the process ends; a new one opens the same run
    second = TrainingLedger(url, name="r", budget=(2, "1e-5"), steps=300)
    assert second.accountant is None  # opened at the first step, which says sigma and q
    assert second.history == [(1.0, 0.01, 7)] and second.steps_taken == 7
    second.start(**STEP)
    assert second.steps_taken == 7 and second.history == [(1.0, 0.01, 7)]
    with pytest.raises(UnsupportedChargeError, match="plan of 300 steps"):
        second.charge_steps(noise_multiplier=1.2, sampling_rate=0.01)
    second.close()
    # The plan is read back from the ledger: a new process that asks for the most steps
    # that fit gets the stored plan, not a new search.
    third = TrainingLedger(url, name="r", budget=(2, "1e-5"))
    third.start(**STEP)
    assert third._planned is not None and third._planned[1] == 300
    third.close()


def test_a_plan_that_does_not_fit_is_refused_at_the_first_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger(_url(tmp_path), name="r", budget=(1, "1e-5"), steps=10_000)
    with pytest.raises(StepRefusedError, match="over its budget"):
        run.charge_steps(**STEP)
    assert run.accountant is not None and run.accountant.records == []


def test_chunks_are_paid_before_they_are_yielded_and_shrink_to_the_budget() -> None:
    run = TrainingLedger("memory://", budget=(1, "1e-5"))
    planned = max_planned_steps(**STEP, budget=(1, "1e-5"))
    seen = []
    for size in run.chunks(**STEP, total_steps=10_000, chunk_size=100):
        # Paid before the caller runs it: the ledger already holds it.
        assert run.steps_taken == sum(seen) + size
        seen.append(size)
    assert sum(seen) == planned and all(s == 100 for s in seen[:-1])
    assert list(run.chunks(**STEP, total_steps=5, chunk_size=2)) == []


def test_an_accountant_of_your_own_decides_with_its_rule() -> None:
    acct = Accountant((2, "1e-5"), rule="rdp")
    run = TrainingLedger(acct)
    taken = 0
    with pytest.raises(StepRefusedError) as refused:
        while True:
            run.charge_steps(noise_multiplier=1.5, sampling_rate=0.01)
            taken += 1
    assert refused.value.rule == "rdp" and run.steps_taken == taken == 2713  # ml-users.md
    with pytest.raises(ConfigError, match="add/remove"):
        TrainingLedger(Accountant(1, relation="substitution"))
    with pytest.raises(ConfigError, match="budget"):
        TrainingLedger("memory://")
    with pytest.raises(ConfigError, match="rule"):
        TrainingLedger("memory://", budget=1, rule="basic")


def test_rdp_runs_may_change_sigma(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger(_url(tmp_path), name="r", budget=(3, "1e-5"), rule="rdp")
    run.charge_steps(noise_multiplier=1.0, sampling_rate=0.01, steps=5)
    run.charge_steps(noise_multiplier=2.0, sampling_rate=0.01, steps=5)
    assert run.history == [(1.0, 0.01, 5), (2.0, 0.01, 5)]
    run.close()


@settings(max_examples=10, deadline=None)
@given(k1=st.integers(1, 200), k2=st.integers(1, 200))
def test_epsilon_of_history_is_the_plans_pld_epsilon(k1: int, k2: int) -> None:
    # The same steps declared as a PLD rule's plan: its certified total at that delta.
    history = [(1.0, 0.01, k1), (2.0, 0.02, k2)]
    plan = [(dpsgd_step_charge(noise_multiplier=s, sampling_rate=q), k) for s, q, k in history]
    rule = PLDRule(plan, target_delta="1e-5")
    state = rule.start()
    for step, k in plan:
        state = rule.add(state, step, k)
    assert epsilon_of_history(history, "1e-5") == pytest.approx(
        float(rule.total(state).epsilon), rel=1e-9
    )
    assert epsilon_of_history([], "1e-5") == 0.0
