"""JAX / Optax: compiled chunks of DP-SGD steps, each charged before it runs.

A training loop compiled with ``jax.lax.scan`` runs many steps in one call, so the guard
cannot sit between two steps. `scan_steps` charges a chunk of k steps as one ``Repeated``
record **before** the compiled scan of k steps starts, and shrinks the last chunks to what
the budget still admits (`TrainingLedger.chunks`), so the run stops inside its budget
without a refused step. Each distinct chunk length of a body is compiled once, and kept
for later calls with the same body function (a resumed run, the next epoch).

JAX dispatches a compiled call asynchronously, so the durable charge of chunk k + 1 is
made while chunk k computes; chunk k + 1 is dispatched only once its record is durable.
A crash can therefore lose at most the one chunk charged ahead (charges are never
refunded).

What the body must do is DP-SGD as the charge describes it: sample each example with
probability ``sampling_rate`` (Poisson), clip per-example gradients to norm C, and add
Gaussian noise of standard deviation ``noise_multiplier * C`` to their sum. dpaccount
accounts for the steps; it cannot see inside the compiled body.

Install: ``pip install "dpaccount[jax]"`` (CPU ``jax`` and ``jaxlib``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import attrs

from dpaccount.errors import missing_extra
from dpaccount.integrations.training import TrainingLedger

try:
    import jax
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise missing_extra("jax", "jax") from error

__all__ = ["ScanResult", "scan_steps"]

#: The compiled scans of each body, by chunk length: a later call with the same body
#: (a resumed run, the next epoch) reuses them instead of compiling again.
_COMPILED: weakref.WeakKeyDictionary[Any, dict[int, Callable[[Any], tuple[Any, Any]]]] = (
    weakref.WeakKeyDictionary()
)


@attrs.frozen
class ScanResult:
    """What `scan_steps` ran.

    Attributes:
        carry: The final carry (model parameters, optimizer state, random key, ...).
        outputs: Each chunk's stacked per-step outputs, in order.
        steps: How many steps ran (fewer than asked when the budget ran out).
    """

    carry: Any
    outputs: list[Any]
    steps: int


def scan_steps(
    run: TrainingLedger,
    body: Callable[[Any], tuple[Any, Any]],
    carry: Any,
    *,
    noise_multiplier: Any,
    sampling_rate: Any,
    total_steps: int,
    chunk_size: int,
) -> ScanResult:
    """Run ``body`` up to ``total_steps`` times as compiled scans, each chunk paid first.

    Args:
        run: The run's `TrainingLedger`.
        body: One DP-SGD step, ``carry -> (carry, output)`` (traced by JAX).
        carry: The initial carry.
        noise_multiplier: sigma / clipping norm, as the body uses it.
        sampling_rate: The body's Poisson sampling rate q.
        total_steps: How many steps to run at most.
        chunk_size: Steps per compiled scan (and per ledger record).

    Returns:
        A `ScanResult`; ``steps < total_steps`` when the budget admitted fewer.
    """

    def scan(length: int) -> Callable[[Any], tuple[Any, Any]]:
        def run_chunk(state: Any) -> tuple[Any, Any]:
            return jax.lax.scan(lambda c, _x: body(c), state, None, length=length)

        return jax.jit(run_chunk)

    try:
        compiled = _COMPILED.setdefault(body, {})
    except TypeError:  # a body that cannot be weakly referenced: compiled for this call
        compiled = {}
    outputs: list[Any] = []
    steps = 0
    for length in run.chunks(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
                             total_steps=total_steps, chunk_size=chunk_size):
        if length not in compiled:
            compiled[length] = scan(length)
        carry, out = compiled[length](carry)
        outputs.append(out)
        steps += length
    return ScanResult(carry, outputs, steps)
