"""Checkpoints tied to the ledger position: atomic, Opacus and JAX, and a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpaccount.errors import ConfigError, LedgerCorruptError
from dpaccount.integrations import TrainingLedger
from dpaccount.integrations.checkpoints import Resumed, resume_checkpoint, save_checkpoint

STEP = {"noise_multiplier": 2.0, "sampling_rate": 0.1}
BUDGET = (8, "1e-5")
ROOT = Path(__file__).resolve().parents[2]


def _url(tmp_path: Path) -> str:
    return "sqlite:///" + os.path.join(str(tmp_path), "run.db")


def test_the_latest_checkpoint_is_loaded_and_the_lost_steps_are_counted(tmp_path: Path) -> None:
    run = TrainingLedger("memory://", budget=BUDGET, steps=100)
    folder = tmp_path / "ckpt"
    assert resume_checkpoint(folder, run, like={"w": 0.0}) == Resumed(None, 0, 0, 0)
    for position in (5, 10, 15):
        run.charge_steps(**STEP, steps=5)
        save_checkpoint(folder, run, state={"w": float(position)}, extra={"epoch": position})
    assert sorted(p.name for p in folder.iterdir()) == [  # keep=2: the oldest is gone
        "step-000000000010.npz", "step-000000000015.npz"]
    run.charge_steps(**STEP, steps=4)
    records = list(run.accountant.records)  # type: ignore[union-attr]
    resumed = resume_checkpoint(folder, run, like={"w": 0.0})
    assert (resumed.position, resumed.charged, resumed.lost) == (15, 19, 4)
    assert float(resumed.state["w"]) == 15.0 and resumed.extra == {"epoch": 15}
    assert "4 charged steps were lost" in str(resumed) and "never refunded" in str(resumed)
    assert list(run.accountant.records) == records  # type: ignore[union-attr]  # no refund


def test_a_checkpoint_ahead_of_the_ledger_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    long_run = TrainingLedger("memory://", budget=BUDGET, steps=100)
    long_run.charge_steps(**STEP, steps=10)
    save_checkpoint(folder, long_run, state=[1.0])
    short_run = TrainingLedger("memory://", budget=BUDGET, steps=100)
    short_run.charge_steps(**STEP, steps=3)
    with pytest.raises(LedgerCorruptError, match="holds 3"):
        resume_checkpoint(folder, short_run, like=[0.0])
    other = TrainingLedger("memory://", name="other", budget=BUDGET, steps=100)
    other.charge_steps(**STEP, steps=12)
    with pytest.raises(LedgerCorruptError, match="'training'"):
        resume_checkpoint(folder, other, like=[0.0])


def test_a_failed_write_leaves_the_previous_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    run = TrainingLedger("memory://", budget=BUDGET, steps=100)
    run.charge_steps(**STEP, steps=2)
    first = save_checkpoint(folder, run, state=[1.0])
    run.charge_steps(**STEP, steps=2)

    class Broken:
        def __array__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("the device went away")

    with pytest.raises(RuntimeError):
        save_checkpoint(folder, run, state=[Broken()])
    assert [p.name for p in folder.iterdir()] == [first.name]  # no torn or temporary file
    (folder / ".tmp-leftover.npz").write_bytes(b"torn")  # a killed writer's leftover
    assert resume_checkpoint(folder, run, like=[0.0]).position == 2
    with pytest.raises(ConfigError):
        save_checkpoint(folder, run)
    with pytest.raises(ConfigError):
        save_checkpoint(folder, run, state=[1.0], keep=0)
    with pytest.raises(ConfigError):
        save_checkpoint(folder, run, state=[1.0], extra={"x": object()})


def test_a_jax_run_resumes_from_its_pytree(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from dpaccount.integrations.jax import scan_steps

    def body(carry):  # type: ignore[no-untyped-def]
        w, key = carry
        key, sub = jax.random.split(key)
        return (w + 2.0 * jax.random.normal(sub, w.shape), key), w.sum()

    run = TrainingLedger(_url(tmp_path), name="jax", budget=BUDGET, steps=100)
    carry = (jnp.zeros(3), jax.random.PRNGKey(0))
    result = scan_steps(run, body, carry, **STEP, total_steps=32, chunk_size=16)
    save_checkpoint(tmp_path / "ckpt", run, state=result.carry)
    scan_steps(run, body, result.carry, **STEP, total_steps=16, chunk_size=16)
    run.close()
    again = TrainingLedger(_url(tmp_path), name="jax", budget=BUDGET, steps=100)
    resumed = resume_checkpoint(tmp_path / "ckpt", again, like=carry)
    assert (resumed.position, resumed.lost) == (32, 16)
    assert jnp.array_equal(resumed.state[0], result.carry[0])
    assert jnp.array_equal(resumed.state[1], result.carry[1])
    again.close()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                            "ignore::FutureWarning")
def test_an_opacus_checkpoint_loads_wrapped_or_not_without_key_surgery(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from opacus import GradSampleModule

    from dpaccount.integrations.opacus import privacy_engine

    torch.manual_seed(0)
    run = TrainingLedger("memory://", budget=BUDGET, steps=100)
    engine = privacy_engine(run)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,))),
        batch_size=4)
    module = torch.nn.Linear(4, 2)
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        data_loader=loader, noise_multiplier=2.0, max_grad_norm=1.0)
    assert all(k.startswith("_module.") for k in model.state_dict())
    save_checkpoint(tmp_path, run, model=model, optimizer=optimizer)
    plain = torch.nn.Linear(4, 2)
    resume_checkpoint(tmp_path, run, model=plain)
    wrapped = GradSampleModule(torch.nn.Linear(4, 2))
    resume_checkpoint(tmp_path, run, model=wrapped)
    for a, b, c in zip(model.parameters(), plain.parameters(), wrapped.parameters(),
                       strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(ConfigError, match="model="):
        resume_checkpoint(tmp_path, run, like=[0.0])


_CHILD = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    import torch
    from dpaccount.integrations import TrainingLedger
    from dpaccount.integrations.checkpoints import save_checkpoint
    from dpaccount.integrations.opacus import privacy_engine

    url, folder = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    run = TrainingLedger(url, name="r", budget=(8, "1e-5"), steps=400)
    engine = privacy_engine(run)
    x = torch.randn(200, 5)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=20)
    module = torch.nn.Linear(5, 2)
    model, optimizer, loader = engine.make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        data_loader=loader, noise_multiplier=2.0, max_grad_norm=1.0)
    step = 0
    while True:
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            step += 1
            if step % 5 == 0:
                save_checkpoint(folder, run, model=model, optimizer=optimizer,
                                extra={"step": step})
            print(step, flush=True)
    """
)


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    folder = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, str(script), _url(tmp_path), str(folder)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=env)
    try:
        assert child.stdout is not None
        seen = 0
        while seen < 23:  # liveness: wait until the child has reported step 23
            line = child.stdout.readline()
            if not line:
                pytest.fail(f"the child exited early ({child.wait()}) after step {seen}")
            seen = int(line)
        child.send_signal(signal.SIGKILL)  # mid-epoch: an epoch is 10 steps
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    run = TrainingLedger(_url(tmp_path), name="r", budget=(8, "1e-5"), steps=400)
    charged = run.steps_taken
    model = torch.nn.Linear(5, 2)
    resumed = resume_checkpoint(folder, run, model=model)
    assert charged >= 23 and resumed.charged == charged == run.steps_taken
    assert resumed.position % 5 == 0 and 20 <= resumed.position <= charged
    assert resumed.lost == charged - resumed.position and resumed.extra == {
        "step": resumed.position}
    saved = torch.load(resumed.path, weights_only=True)["model"]
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    run.close()


_LEAF = st.floats(allow_nan=False, allow_infinity=False, width=64)
_TREE = st.recursive(
    _LEAF,
    lambda inner: st.one_of(st.lists(inner, min_size=1, max_size=3),
                            st.dictionaries(st.text("abc", min_size=1, max_size=3), inner,
                                            min_size=1, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_TREE, before=st.integers(0, 20), after=st.integers(0, 20))
def test_any_pytree_round_trips_and_the_lost_steps_add_up(tree, before: int,  # type: ignore[no-untyped-def]
                                                          after: int) -> None:
    import tempfile

    folder = Path(tempfile.mkdtemp())
    run = TrainingLedger("memory://", budget=BUDGET, steps=100)
    if before:
        run.charge_steps(**STEP, steps=before)
    save_checkpoint(folder, run, state=tree)
    if after:
        run.charge_steps(**STEP, steps=after)
    resumed = resume_checkpoint(folder, run, like=tree)
    assert (resumed.position, resumed.charged, resumed.lost) == (
        before, before + after, after)

    def same(a, b) -> bool:  # type: ignore[no-untyped-def]
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return float(a) == float(b)

    assert same(tree, resumed.state)
