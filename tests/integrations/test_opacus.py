"""Opacus: a real PrivacyEngine, a small model and data made here, charged to a ledger.

Skipped without Opacus (install ``torch==2.13.0`` first, then ``dpaccount[opacus]``);
``DPACCOUNT_REQUIRE_ML=1`` (set by ``.ci/run``) turns the skip into a failure.
"""

from __future__ import annotations

import math
import os

import pytest

if os.environ.get("DPACCOUNT_REQUIRE_ML") != "1":
    pytest.importorskip("opacus", reason="Opacus is not installed (pip install torch==2.13.0 "
                        '"dpaccount[opacus]")')

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from dpaccount.accounting import dpsgd_epsilon
from dpaccount.errors import (
    ConfigError,
    InvalidCostError,
    LedgerCorruptError,
    StepRefusedError,
)
from dpaccount.integrations import TrainingLedger, max_planned_steps
from dpaccount.integrations.opacus import LedgerAccountant, privacy_engine

pytestmark = pytest.mark.filterwarnings(
    "ignore:Secure RNG turned off",
    "ignore::UserWarning:opacus",
    "ignore:Full backward hook is firing:UserWarning",
    "ignore::DeprecationWarning",
    "ignore::FutureWarning",
)

N, BATCH = 200, 20  # sample rate 1/10: Opacus' DPDataLoader uses 1 / len(loader)
BUDGET = (2, "1e-5")


def _setup(seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    x = torch.randn(N, 5)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    model = torch.nn.Linear(5, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, loader


def _train(model, optimizer, loader, epochs: int) -> int:  # type: ignore[no-untyped-def]
    steps = 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            steps += 1
    return steps


def _url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return "sqlite:///" + os.path.join(str(tmp_path), "run.db")


def test_make_private_with_epsilon_calibrates_with_certified_epsilon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger(_url(tmp_path), name="mnist", budget=BUDGET)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=module, optimizer=optimizer, data_loader=loader,
        target_epsilon=2.0, target_delta=1e-5, epochs=3, max_grad_norm=1.0,
    )
    sigma = optimizer.noise_multiplier
    # Opacus' calibration ran through our registered accountant: 30 steps fit.
    assert dpsgd_epsilon(noise_multiplier=sigma, sampling_rate=0.1, steps=30,
                         target_delta=1e-5) <= 2.0
    steps = _train(model, optimizer, loader, epochs=3)
    assert len(engine.accountant) == steps == 30 == run.steps_taken
    assert len(run.accountant.records) == 30  # type: ignore[union-attr]
    eps = engine.get_epsilon(1e-5)
    assert eps == dpsgd_epsilon(noise_multiplier=sigma, sampling_rate=0.1, steps=30,
                                target_delta=1e-5)
    run.close()


def test_the_step_over_budget_is_refused_before_it_is_applied(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger(_url(tmp_path), name="r", budget=BUDGET)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=optimizer, data_loader=loader,
        noise_multiplier=1.0, max_grad_norm=1.0,
    )
    planned = max_planned_steps(noise_multiplier=1.0, sampling_rate=0.1, budget=BUDGET)
    taken = 0
    with pytest.raises(StepRefusedError) as refused:
        for _ in range(100):
            for x, y in loader:
                before = [p.detach().clone() for p in model.parameters()]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                taken += 1
    assert taken == planned == run.steps_taken == len(engine.accountant)
    assert refused.value.computed and "discarded, not applied" in str(refused.value)
    # The refused step changed nothing, and left no noisy gradient to apply later.
    for p, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), old)
        assert p.grad is None
    run.close()

    # Resume in a "new process": the ledger has every step; nothing more fits.
    again = TrainingLedger(_url(tmp_path), name="r", budget=BUDGET)
    engine = privacy_engine(again)
    module, optimizer, loader = _setup(seed=1)
    again.start(noise_multiplier=1.0, sampling_rate=0.1)
    with pytest.raises(ConfigError, match="resume with"):
        engine.make_private_with_epsilon(
            module=module, optimizer=optimizer, data_loader=loader, target_epsilon=2.0,
            target_delta=1e-5, epochs=1, max_grad_norm=1.0,
        )
    assert len(engine.accountant) == planned
    again.close()


def test_a_run_resumes_from_the_ledger_after_a_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger(_url(tmp_path), name="r", budget=BUDGET, steps=25)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=optimizer, data_loader=loader,
        noise_multiplier=2.0, max_grad_norm=1.0,
    )
    _train(model, optimizer, loader, epochs=1)  # 10 steps, then the process "dies"
    checkpoint = engine.accountant.state_dict()
    run.close()

    resumed = TrainingLedger(_url(tmp_path), name="r", budget=BUDGET, steps=25)
    engine = privacy_engine(resumed)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=optimizer, data_loader=loader,
        noise_multiplier=2.0, max_grad_norm=1.0,
    )
    engine.accountant.load_state_dict(checkpoint)  # a prefix of the ledger: accepted
    _train(model, optimizer, loader, epochs=1)
    assert len(engine.accountant) == 20 and resumed.history == [(2.0, 0.1, 20)]
    with pytest.raises(StepRefusedError):
        _train(model, optimizer, loader, epochs=1)  # 5 more fit, the 6th does not
    assert resumed.steps_taken == 25
    too_long = {"history": [(2.0, 0.1, 40)], "mechanism": "dpaccount"}
    with pytest.raises(LedgerCorruptError, match="40 steps"):
        engine.accountant.load_state_dict(too_long)
    resumed.close()


def test_poisson_sampling_is_required(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = privacy_engine(TrainingLedger("memory://", budget=BUDGET))
    module, optimizer, loader = _setup()
    with pytest.raises(ConfigError, match="Poisson"):
        engine.make_private(module=module, optimizer=optimizer, data_loader=loader,
                            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False)


def test_plain_privacy_engine_accepts_the_registered_name() -> None:
    engine = PrivacyEngine(accountant="dpaccount")
    assert isinstance(engine.accountant, LedgerAccountant)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=optimizer, data_loader=loader,
        noise_multiplier=1.1, max_grad_norm=1.0,
    )
    _train(model, optimizer, loader, epochs=2)
    assert engine.accountant.history == [(1.1, 0.1, 20)]
    # Opacus' own PRV accountant on the same steps: an estimate within its error bar.
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(1.1, 0.1, 20)]
    ours, theirs = engine.get_epsilon(1e-5), prv.get_epsilon(1e-5)
    assert abs(ours - theirs) / theirs < 0.02
    with pytest.raises(ConfigError, match="cannot be set"):
        LedgerAccountant(TrainingLedger("memory://", budget=1)).history = []


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"noise_multiplier": math.nan}, InvalidCostError),
        ({"noise_multiplier": 0.0}, InvalidCostError),
        ({"noise_multiplier": -1.0}, InvalidCostError),
        ({"max_grad_norm": math.nan}, InvalidCostError),
        ({"max_grad_norm": 0.0}, InvalidCostError),
        ({"max_grad_norm": [1.0, math.inf]}, InvalidCostError),
        ({"poisson_sampling": False}, ConfigError),
        ({"clipping": "adaptive"}, ConfigError),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_wrapped(bad, error) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger("memory://", budget=BUDGET)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    args = {"module": module, "optimizer": optimizer, "data_loader": loader,
            "noise_multiplier": 1.0, "max_grad_norm": 1.0, **bad}
    with pytest.raises(error):
        engine.make_private(**args)
    assert not hasattr(module, "_module") and run.steps_taken == 0 and run.accountant is None
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


@pytest.mark.parametrize(
    "bad",
    [{"target_epsilon": math.nan}, {"target_epsilon": 0}, {"target_epsilon": 1e300},
     {"target_delta": 0}, {"target_delta": 1.5}, {"epochs": 0}, {"epochs": math.nan},
     {"poisson_sampling": False}],
)
def test_bad_targets_are_refused_before_calibration(bad) -> None:  # type: ignore[no-untyped-def]
    run = TrainingLedger("memory://", budget=BUDGET)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    args = {"module": module, "optimizer": optimizer, "data_loader": loader,
            "target_epsilon": 2.0, "target_delta": 1e-5, "epochs": 1, "max_grad_norm": 1.0,
            **bad}
    with pytest.raises((InvalidCostError, ConfigError)):
        engine.make_private_with_epsilon(**args)
    assert run.steps_taken == 0 and run.accountant is None


@pytest.mark.parametrize("sigma", [0.0, math.nan])
def test_a_bad_noise_multiplier_set_mid_run_is_refused_with_the_model_untouched(
    sigma: float,
) -> None:
    # 0: no noise at all; the hook refuses it (typed) and drops the gradient. NaN: torch
    # refuses to draw the noise (RuntimeError) before the hook runs; nothing is applied.
    run = TrainingLedger("memory://", budget=BUDGET)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=optimizer, data_loader=loader,
        noise_multiplier=2.0, max_grad_norm=1.0,
    )
    _train(model, optimizer, loader, epochs=1)
    taken, records = run.steps_taken, list(run.accountant.records)  # type: ignore[union-attr]
    optimizer.noise_multiplier = sigma
    x, y = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(InvalidCostError if sigma == 0 else RuntimeError):
        optimizer.step()
    for p, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), old)
        assert p.grad is None or sigma != 0
    assert run.steps_taken == taken and list(run.accountant.records) == records  # type: ignore[union-attr]


def test_the_accountant_says_which_number_is_certified() -> None:
    from opacus.accountants import PRVAccountant

    run = TrainingLedger("memory://", budget=BUDGET)
    engine = privacy_engine(run)
    module, optimizer, loader = _setup()
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=module, optimizer=optimizer, data_loader=loader,
        target_epsilon=2.0, target_delta=1e-5, epochs=3, max_grad_norm=1.0,
    )
    _train(model, optimizer, loader, epochs=3)
    low, high = engine.accountant.epsilon_bounds(1e-5)
    assert high == engine.get_epsilon(1e-5) <= 2.0 and 0 < low <= high
    prv = PRVAccountant()
    prv.history = list(engine.accountant.history)
    # PRV's number is its estimate's upper end, widened by eps_error = 0.01: no valid
    # upper bound can be below our lower one, and it may read above our certified one.
    assert prv.get_epsilon(1e-5) >= low
    assert prv.get_epsilon(1e-5) <= high + 0.02
