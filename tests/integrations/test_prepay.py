"""Paying the next step ahead: durable before it is applied, at most one never runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.errors import InvalidCostError, StepRefusedError
from dpaccount.integrations import TrainingLedger
from dpaccount.integrations.checkpoints import save_checkpoint

STEP = {"noise_multiplier": 2.0, "sampling_rate": 0.1}
BUDGET = (8, "1e-5")


def test_a_prepaid_step_is_consumed_not_charged_twice() -> None:
    run = TrainingLedger("memory://", budget=BUDGET, steps=5)
    run.charge_steps(**STEP)
    run.prepay(**STEP)
    run.prepay(**STEP)  # at most one ahead: ignored
    assert run.steps_applied == 1 and run.steps_taken == 2  # durable, not applied yet
    run.charge_steps(**STEP)  # consumes the prepaid step
    assert run.steps_taken == run.steps_applied == 2
    assert len(run.accountant.records) == 2  # type: ignore[union-attr, arg-type]
    for _ in range(3):
        run.charge_steps(**STEP)
        run.prepay(**STEP)  # the last one is past the plan: refused in the background
    assert run.steps_taken == run.steps_applied == 5
    with pytest.raises(StepRefusedError) as refused:
        run.charge_steps(**STEP)
    assert refused.value.computed  # reported as the step whose gradient was computed
    assert len(run.accountant.records) == 5  # type: ignore[union-attr, arg-type]
    with pytest.raises(InvalidCostError):
        run.prepay(noise_multiplier=float("nan"), sampling_rate=0.1)
    run.close()


def test_a_prepaid_step_for_other_values_stays_charged() -> None:
    run = TrainingLedger("memory://", budget=BUDGET, rule="rdp")
    run.charge_steps(**STEP)
    run.prepay(**STEP)
    run.charge_steps(noise_multiplier=3.0, sampling_rate=0.1)  # not the prepaid values
    assert run.history == [(2.0, 0.1, 2), (3.0, 0.1, 1)]  # the prepaid one is not refunded
    run.close()


@settings(max_examples=15, deadline=None)
@given(steps=st.integers(0, 12), planned=st.integers(1, 12))
def test_at_most_one_charged_step_never_runs(steps: int, planned: int) -> None:
    run = TrainingLedger("memory://", budget=BUDGET, steps=planned)
    applied = 0
    try:
        for _ in range(steps):
            run.charge_steps(**STEP)
            applied += 1
            run.prepay(**STEP)
    except StepRefusedError:
        assert applied == planned
    assert run.steps_applied == applied  # waits for the prepay in flight first
    assert run.steps_taken - applied == (1 if 0 < applied < planned else 0)
    assert run.steps_taken <= planned
    run.close()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                            "ignore::FutureWarning")
def test_opacus_with_prepay_stops_where_the_plan_does(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from dpaccount.integrations.opacus import privacy_engine

    url = "sqlite:///" + os.path.join(str(tmp_path), "run.db")
    run = TrainingLedger(url, name="r", budget=BUDGET, steps=25)
    engine = privacy_engine(run, prepay=True)
    torch.manual_seed(0)
    x = torch.randn(200, 5)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=20)
    module = torch.nn.Linear(5, 2)
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        data_loader=loader, noise_multiplier=2.0, max_grad_norm=1.0)
    applied = 0
    with pytest.raises(StepRefusedError):
        for _ in range(10):
            for xb, yb in loader:
                before = [p.detach().clone() for p in model.parameters()]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                applied += 1
                if applied == 12:  # a checkpoint records the applied steps, not the paid
                    path = save_checkpoint(tmp_path / "ckpt", run, model=model)
                    assert path.name == "step-000000000012.pt" and run.steps_taken == 13
    assert applied == 25 == run.steps_taken
    assert len(run.accountant.records) == 25  # type: ignore[union-attr, arg-type]
    for p, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), old) and p.grad is None
    run.close()
