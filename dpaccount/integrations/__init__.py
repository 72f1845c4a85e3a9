"""Guards for training loops: one run's budget in a ledger, and adapters for frameworks.

* `dpaccount.integrations.training`: any loop; `TrainingLedger` charges DP-SGD steps
  before they are applied (no extra).
* `dpaccount.integrations.opacus`: Opacus' ``PrivacyEngine`` with an accountant backed
  by a ledger (extra ``opacus``).
* `dpaccount.integrations.jax`: JAX / Optax; compiled ``lax.scan`` chunks, each charged
  first (extra ``jax``).
* `dpaccount.integrations.dp_events`: dp_accounting ``DpEvent`` trees as charges, and
  back (extra ``dp-accounting``).

The framework modules import their framework when they are imported, and raise an
`ImportError` naming the ``pip install`` command when it is missing.
"""

from dpaccount.integrations.training import (
    TrainingLedger,
    epsilon_of_history,
    max_planned_steps,
)

__all__ = ["TrainingLedger", "epsilon_of_history", "max_planned_steps"]
