"""Training loops: plain vs guarded, Opacus and JAX, and the first step's plan.

Run (after ``pip install torch==2.13.0 opacus jax``)::

    .venv/bin/python benchmarks/bench_training.py [--section plan|certified|charge|opacus|jax]

Sections (all by default):

* ``plan``: CPU time of the first step's plan (`plan_dpsgd_steps`, cache cleared) at
  budgets 8, 30 and 1,000 (sigma = 1, q = 1/32, delta = 1e-5), paired and alternated
  with the slow sibling it replaces (the previous bisection, reproduced here) and with
  one certified PLD evaluation of the plan's length (the unit); counts of evaluations.
* ``certified``: a real (CPU) Opacus run calibrated for epsilon = 2, then every
  accountant on its steps: dpaccount's (lower, upper), Opacus' PRV and RDP, Google's
  dp_accounting PLD when installed.
* ``charge``: one durable step charge (`TrainingLedger.charge_steps` on SQLite) against
  one durable (epsilon, delta) charge on the same kind of store, alternated.
* ``opacus``: a small CNN on 32x32x3 inputs, plain Opacus (its default PRV accountant)
  vs `privacy_engine(TrainingLedger(sqlite))`, epochs alternated, CPU time per step.
* ``jax``: 2,048 DP-SGD steps as ``lax.scan`` chunks of 64, plain vs `scan_steps`
  (fresh ledger: the plan included), alternated, CPU time.

Timing: ``time.process_time`` (CPU time of this process, all its threads; torch and
XLA are limited to one thread so that CPU time is the work done), imports and compiles
before any timer, plain and guarded alternated in the same process, ratios printed as
guarded / plain. Nothing here is asserted; tests do not time anything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from dpaccount.accounting import PLDRule, dpsgd_step_charge
from dpaccount.accounting.dpsgd_plan import clear_plan_cache, plan_dpsgd_steps
from dpaccount.accounting.rdp import sgm_epsilon
from dpaccount.charges import Repeated
from dpaccount.costs import Budget, as_budget

SIGMA, Q, DELTA = 1.0, 1 / 32, 1e-5
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                      "intra_op_parallelism_threads=1")


def cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.process_time()
    value = fn()
    return value, time.process_time() - start


# -- plan ------------------------------------------------------------------------------


def _old_fits(step: Any, k: int, budget: Budget) -> bool:
    rule = PLDRule((step, k), budget=budget)
    return rule.admits(rule.extend(rule.start(), Repeated(step, k)), budget)


def old_plan(budget: Any) -> tuple[int, int]:
    """The previous search (before issue 26): RDP start, then doubling and bisection on
    the certified PLD. Returns (steps, certified evaluations)."""
    the_budget = as_budget(budget)
    step = dpsgd_step_charge(noise_multiplier=SIGMA, sampling_rate=Q)
    count = 0

    def fits(k: int) -> bool:
        nonlocal count
        count += 1
        return _old_fits(step, k, the_budget)

    cap = float(the_budget.epsilon or 0)
    if not fits(1):
        return 0, count
    lo, hi = 1, 2
    while sgm_epsilon(Q, SIGMA, hi, DELTA, refine=False) <= cap:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sgm_epsilon(Q, SIGMA, mid, DELTA, refine=False) <= cap else (lo, mid)
    hi = lo + max(1, lo // 4)
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, count


def bench_plan(rounds: int, skip_old_above: float) -> None:
    print("== first step: the plan (sigma=1, q=1/32, delta=1e-5), CPU seconds ==")
    print(f"{'budget':>7} {'steps':>9} {'new s':>7} {'evals':>5} {'surr':>4} "
          f"{'one eval s':>10} {'new/eval':>8} {'old s':>7} {'old evals':>9} {'old/new':>7}")
    step = dpsgd_step_charge(noise_multiplier=SIGMA, sampling_rate=Q)
    for budget in (8, 30, 1000):
        new_t, one_t, old_t = [], [], []
        plan = None
        old: tuple[int, int] | None = None
        for _ in range(rounds):
            clear_plan_cache()
            plan, t = cpu(lambda b=budget: plan_dpsgd_steps(  # type: ignore[misc]
                noise_multiplier=SIGMA, sampling_rate=Q, budget=(b, DELTA)))
            new_t.append(t)
            _, t = cpu(lambda k=plan.steps, b=budget: _old_fits(step, k, as_budget((b, DELTA))))
            one_t.append(t)
            if budget <= skip_old_above:
                old, t = cpu(lambda b=budget: old_plan((b, DELTA)))  # type: ignore[misc]
                old_t.append(t)
        assert plan is not None
        new, one = statistics.median(new_t), statistics.median(one_t)
        line = (f"{budget:>7} {plan.steps:>9} {new:>7.2f} {plan.evaluations:>5} "
                f"{plan.surrogate_evaluations:>4} {one:>10.2f} {new / one:>8.2f}")
        if old is not None:
            old_s = statistics.median(old_t)
            line += f" {old_s:>7.2f} {old[1]:>9} {old_s / new:>7.1f}"
            if old[0] != plan.steps:
                line += f"  (old plan {old[0]}!)"
        print(line, flush=True)


# -- certified vs estimated ------------------------------------------------------------


def _quiet() -> None:
    warnings.filterwarnings("ignore")


def bench_certified() -> None:
    _quiet()
    import torch
    from opacus.accountants import PRVAccountant, RDPAccountant
    from torch.utils.data import DataLoader, TensorDataset

    from dpaccount.integrations import TrainingLedger
    from dpaccount.integrations.opacus import privacy_engine

    torch.manual_seed(0)
    torch.set_num_threads(1)
    n, batch, epochs = 4096, 128, 3  # q = 1/32 (Opacus: 1 / len(loader)), 96 steps
    x = torch.randn(n, 20)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    url = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "certified.db")
    run = TrainingLedger(url, name="certified", budget=(2, DELTA))
    engine = privacy_engine(run)
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, target_epsilon=2.0,
        target_delta=DELTA, epochs=epochs, max_grad_norm=1.0)
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
    history = engine.accountant.history
    low, high = engine.accountant.epsilon_bounds(DELTA)
    print("== certified vs estimated: a real Opacus run (CPU), budget epsilon = 2 ==")
    print(f"sigma = {optimizer.noise_multiplier:.6f} (calibrated by dpaccount), "
          f"history = {history}")
    print(f"dpaccount upper (certified, get_epsilon) = {high:.4f}")
    print(f"dpaccount lower (optimistic PLD)           = {low:.4f}")
    prv = PRVAccountant()
    prv.history = list(history)
    print(f"Opacus PRV get_epsilon (eps_error=0.01)     = {prv.get_epsilon(DELTA):.4f}")
    print(f"Opacus PRV get_epsilon (eps_error=0.001)    = "
          f"{prv.get_epsilon(DELTA, eps_error=0.001):.4f}")
    rdp = RDPAccountant()
    rdp.history = list(history)
    print(f"Opacus RDP get_epsilon                      = {rdp.get_epsilon(DELTA):.4f}")
    try:
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant

        acct = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        sigma, q, k = history[0]
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        acct.compose(dp_accounting.SelfComposedDpEvent(event, k))
        print(f"dp_accounting PLD (pessimistic, 1e-4)       = {acct.get_epsilon(DELTA):.4f}")
    except ImportError:
        print("dp_accounting not installed")
    run.close()


# -- one durable charge ----------------------------------------------------------------


def bench_charge(repeats: int) -> None:
    from dpaccount.costs import PrivacyCost
    from dpaccount.integrations import TrainingLedger
    from dpaccount.ledgers import open_ledger

    folder = tempfile.mkdtemp()
    run = TrainingLedger("sqlite:///" + os.path.join(folder, "steps.db"), name="steps",
                         budget=(10**6, DELTA), steps=10**6)
    run.charge_steps(noise_multiplier=4.0, sampling_rate=Q)  # plan composed, not timed
    plain = open_ledger("sqlite:///" + os.path.join(folder, "eps.db"), name="eps",
                        budget=(10**9, "0.5"))
    cost = PrivacyCost("0.001", "1e-12")
    step_t, eps_t = [], []
    for _ in range(repeats):
        _, t = cpu(lambda: run.charge_steps(noise_multiplier=4.0, sampling_rate=Q))
        step_t.append(t)
        _, t = cpu(lambda: plain.charge(cost))
        eps_t.append(t)
    s, e = statistics.median(step_t), statistics.median(eps_t)
    print("== one durable charge, SQLite, CPU time (median of "
          f"{repeats}, alternated) ==")
    print(f"step charge (TrainingLedger) {s * 1e6:8.0f} us   (eps, delta) charge "
          f"{e * 1e6:8.0f} us   ratio {s / e:.2f}")
    run.close()
    plain.close()


# -- Opacus ----------------------------------------------------------------------------


def bench_opacus(steps: int, rounds: int, device: str = "cpu", batch: int = 64) -> None:
    _quiet()
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from dpaccount.integrations import TrainingLedger
    from dpaccount.integrations.opacus import privacy_engine

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device(device)
    n = batch * 32  # q = 1/32
    x = torch.randn(n, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (n,), device=dev)

    def model() -> Any:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))

    def make(guarded: bool, prepay: bool = False) -> tuple[Any, Any, Any, Any]:
        module = model().to(dev)
        opt = torch.optim.SGD(module.parameters(), lr=0.05)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch)
        if guarded:
            url = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "opacus.db")
            run = TrainingLedger(url, name="cnn", budget=(30, DELTA))
            engine = privacy_engine(run, prepay=prepay)
        else:
            run, engine = None, PrivacyEngine()
        module, opt, loader = engine.make_private(
            module=module, optimizer=opt, data_loader=loader, noise_multiplier=SIGMA,
            max_grad_norm=1.0)
        return module, opt, loader, run

    def train(setup: tuple[Any, Any, Any, Any], count: int) -> None:
        module, opt, loader, _run = setup
        done = 0
        while done < count:
            for xb, yb in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(module(xb), yb).backward()
                opt.step()
                done += 1
                if done == count:
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    return

    plain, guarded, ahead = make(False), make(True), make(True, prepay=True)
    _, first = cpu(lambda: train(guarded, 1))  # the plan (budget 30) is fixed here
    train(plain, 2)
    train(guarded, 1)
    train(ahead, 2)
    times: dict[str, list[float]] = {"plain": [], "guarded": [], "prepay": []}
    walls: dict[str, list[float]] = {"plain": [], "guarded": [], "prepay": []}
    for _ in range(rounds):
        for name, setup in (("plain", plain), ("guarded", guarded), ("prepay", ahead)):
            wall = time.perf_counter()
            _, t = cpu(lambda s=setup: train(s, steps))  # type: ignore[misc]
            walls[name].append((time.perf_counter() - wall) / steps)
            times[name].append(t / steps)
    p, g, a = (statistics.median(times[k]) for k in ("plain", "guarded", "prepay"))
    pw, gw, aw = (statistics.median(walls[k]) for k in ("plain", "guarded", "prepay"))
    print(f"== Opacus CNN 32x32x3 on {device}, batch {batch}, 1 thread, per step (median of "
          f"{rounds} alternated rounds of {steps} steps) ==")
    print(f"CPU:  plain (PRV accountant) {p * 1e3:8.2f} ms   guarded (sqlite ledger) "
          f"{g * 1e3:8.2f} ms (ratio {g / p:.3f})   guarded, prepay {a * 1e3:8.2f} ms "
          f"(ratio {a / p:.3f})")
    print(f"wall: plain {pw * 1e3:8.2f} ms   guarded {gw * 1e3:8.2f} ms (ratio {gw / pw:.3f})"
          f"   prepay {aw * 1e3:8.2f} ms (ratio {aw / pw:.3f})   first guarded step "
          f"(plan, eps=30) {first:.2f} s CPU")
    for setup in (guarded, ahead):
        if setup[3] is not None:
            setup[3].close()


# -- JAX -------------------------------------------------------------------------------


def bench_jax(rounds: int, total: int = 2048, chunk: int = 64) -> None:
    import jax
    import jax.numpy as jnp

    from dpaccount.integrations import TrainingLedger
    from dpaccount.integrations.jax import scan_steps

    n, dim, clip = 256, 32, 1.0
    x = jax.random.normal(jax.random.PRNGKey(0), (n, dim))
    y = x @ jnp.linspace(-1.0, 1.0, dim)

    def body(carry: Any) -> tuple[Any, Any]:
        w, key = carry
        key, k_sample, k_noise = jax.random.split(key, 3)
        keep = jax.random.bernoulli(k_sample, Q, (n,))
        grads = jax.vmap(jax.grad(lambda w, xi, yi: (xi @ w - yi) ** 2),
                         in_axes=(None, 0, 0))(w, x, y)
        norms = jnp.linalg.norm(grads, axis=1, keepdims=True)
        clipped = grads * jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12))
        noisy = (clipped * keep[:, None]).sum(0) + SIGMA * clip * jax.random.normal(
            k_noise, (dim,))
        w = w - 0.01 * noisy / (Q * n)
        return (w, key), jnp.mean((x @ w - y) ** 2)

    compiled = jax.jit(lambda c: jax.lax.scan(lambda c, _x: body(c), c, None, length=chunk))
    start = (jnp.zeros(dim), jax.random.PRNGKey(1))

    def plain() -> Any:
        carry = start
        outs = []
        for _ in range(total // chunk):
            carry, out = compiled(carry)
            outs.append(out)
        return jax.block_until_ready(carry)

    budget = (12, DELTA)  # a plan of 3,047 steps at sigma = 1, q = 1/32: all 2,048 fit

    def guarded(fresh: bool) -> Any:
        if fresh:  # the plan searched inside the timed region
            clear_plan_cache()
        url = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "jax.db")
        run = TrainingLedger(url, name="jax", budget=budget)
        result = scan_steps(run, body, start, noise_multiplier=SIGMA, sampling_rate=Q,
                            total_steps=total, chunk_size=chunk)
        jax.block_until_ready(result.carry)
        run.close()
        return result

    plain()  # compile
    guarded(False)
    p_t, g_t, f_t = [], [], []
    p_w, g_w, f_w = [], [], []

    def timed(fn: Any, cpus: list[float], walls: list[float]) -> None:
        wall = time.perf_counter()
        _, t = cpu(fn)
        walls.append(time.perf_counter() - wall)
        cpus.append(t)

    for _ in range(rounds):
        timed(plain, p_t, p_w)
        plan_dpsgd_steps(noise_multiplier=SIGMA, sampling_rate=Q, budget=budget)  # cached
        timed(lambda: guarded(False), g_t, g_w)
        timed(lambda: guarded(True), f_t, f_w)
    p, g, f = (statistics.median(v) for v in (p_t, g_t, f_t))
    pw, gw, fw = (statistics.median(v) for v in (p_w, g_w, f_w))
    print(f"== JAX: {total} DP-SGD steps, lax.scan chunks of {chunk}, CPU time (median of "
          f"{rounds} alternated rounds) ==")
    print(f"plain {p * 1e3:8.1f} ms   scan_steps, plan cached {g * 1e3:8.1f} ms "
          f"(ratio {g / p:.2f})   scan_steps, fresh plan (eps=12) {f * 1e3:8.1f} ms "
          f"(ratio {f / p:.2f})")
    print(f"wall on {jax.default_backend()}: plain {pw * 1e3:8.1f} ms   plan cached "
          f"{gw * 1e3:8.1f} ms (ratio {gw / pw:.2f})   fresh plan {fw * 1e3:8.1f} ms "
          f"(ratio {fw / pw:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--section", default="all",
                        choices=["all", "plan", "certified", "charge", "opacus", "jax"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="Opacus steps per round")
    parser.add_argument("--device", default="cpu", help="torch device for Opacus (cuda)")
    parser.add_argument("--batch", type=int, default=64, help="Opacus batch size")
    parser.add_argument("--skip-old-above", type=float, default=math_inf(),
                        help="skip the old plan search above this budget (it is slow)")
    args = parser.parse_args()
    if args.section in ("all", "plan"):
        bench_plan(1, args.skip_old_above)
    if args.section in ("all", "certified"):
        bench_certified()
    if args.section in ("all", "charge"):
        bench_charge(200)
    if args.section in ("all", "opacus"):
        bench_opacus(args.steps, args.rounds, args.device, args.batch)
    if args.section in ("all", "jax"):
        bench_jax(args.rounds)


def math_inf() -> float:
    return float("inf")


if __name__ == "__main__":
    main()
