"""JAX: a DP-SGD loop compiled with lax.scan, charged chunk by chunk before it runs.

Skipped without JAX (``pip install "dpaccount[jax]"``); ``DPACCOUNT_REQUIRE_ML=1`` (set
by ``.ci/run``) turns the skip into a failure.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("DPACCOUNT_REQUIRE_ML") != "1":
    pytest.importorskip("jax", reason='JAX is not installed (pip install "dpaccount[jax]")')

import jax
import jax.numpy as jnp

from dpaccount.accounting import dpsgd_epsilon
from dpaccount.integrations import TrainingLedger, max_planned_steps
from dpaccount.integrations.jax import scan_steps

N, Q, SIGMA, CLIP = 256, 0.05, 2.0, 1.0
BUDGET = (1.5, "1e-5")


def _data():  # type: ignore[no-untyped-def]
    x = jax.random.normal(jax.random.PRNGKey(0), (N, 3))
    y = x @ jnp.array([1.0, -2.0, 0.5])
    return x, y


def _body(x, y):  # type: ignore[no-untyped-def]
    def loss(w, xi, yi):  # type: ignore[no-untyped-def]
        return (xi @ w - yi) ** 2

    def step(carry):  # type: ignore[no-untyped-def]
        w, key, calls = carry
        key, k_sample, k_noise = jax.random.split(key, 3)
        keep = jax.random.bernoulli(k_sample, Q, (N,))  # Poisson sampling, rate Q
        grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, x, y)
        norms = jnp.linalg.norm(grads, axis=1, keepdims=True)
        clipped = grads * jnp.minimum(1.0, CLIP / jnp.maximum(norms, 1e-12))
        total = jnp.sum(clipped * keep[:, None], axis=0)
        noisy = total + SIGMA * CLIP * jax.random.normal(k_noise, w.shape)
        w = w - 0.05 * noisy / (Q * N)
        return (w, key, calls + 1), jnp.mean((x @ w - y) ** 2)

    return step


def test_chunks_run_only_after_they_are_charged_and_stop_inside_the_budget() -> None:
    run = TrainingLedger("memory://", budget=BUDGET)
    x, y = _data()
    carry = (jnp.zeros(3), jax.random.PRNGKey(1), jnp.int32(0))
    result = scan_steps(run, _body(x, y), carry, noise_multiplier=SIGMA, sampling_rate=Q,
                        total_steps=100_000, chunk_size=64)
    planned = max_planned_steps(noise_multiplier=SIGMA, sampling_rate=Q, budget=BUDGET)
    # Every step that ran was paid for, and the run stopped at the last step that fits.
    assert result.steps == planned == run.steps_taken == int(result.carry[2])
    assert dpsgd_epsilon(noise_multiplier=SIGMA, sampling_rate=Q, steps=result.steps,
                         target_delta=1e-5) <= 1.5
    records = run.accountant.records  # type: ignore[union-attr]
    assert [r.charge.count if hasattr(r.charge, "count") else 1 for r in records] == [
        64
    ] * (planned // 64) + ([planned % 64] if planned % 64 else [])
    assert sum(o.shape[0] for o in result.outputs) == planned
    assert float(result.outputs[-1][-1]) < float(result.outputs[0][0])  # it learned


def test_a_short_run_takes_what_it_asks_for() -> None:
    run = TrainingLedger("memory://", budget=BUDGET)
    x, y = _data()
    carry = (jnp.zeros(3), jax.random.PRNGKey(2), jnp.int32(0))
    result = scan_steps(run, _body(x, y), carry, noise_multiplier=SIGMA, sampling_rate=Q,
                        total_steps=10, chunk_size=4)
    assert result.steps == 10 == int(result.carry[2]) and run.history == [(SIGMA, Q, 10)]
