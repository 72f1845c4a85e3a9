"""Opacus: a privacy accountant backed by a dpaccount ledger.

`LedgerAccountant` is an Opacus accountant (``opacus.accountants.IAccountant``) that
charges every optimizer step to a `TrainingLedger` **before the step is applied**: the
hook runs inside ``DPOptimizer.step()`` after the noisy gradient is computed and before
the parameters change, and a step that does not fit raises `StepRefusedError` with the
gradient discarded. Importing this module registers the accountant with Opacus under the
name ``"dpaccount"``, so ``PrivacyEngine(accountant="dpaccount")`` and
``make_private_with_epsilon`` (which calibrates sigma with dpaccount's certified PLD
epsilon) work unchanged.

`privacy_engine` builds the engine around a ledger in one call; its engine refuses
``poisson_sampling=False`` (the accounting assumes Poisson sampling) with `ConfigError`.

Install: ``pip install torch==2.13.0 "dpaccount[opacus]"`` (pin torch first: an
unpinned torch pulls several GB of CUDA packages).
"""

from __future__ import annotations

from typing import Any

from dpaccount._numeric import check_delta, check_positive
from dpaccount.errors import ConfigError, InvalidCostError, LedgerCorruptError, missing_extra
from dpaccount.integrations.training import (
    TrainingLedger,
    epsilon_bounds_of_history,
    epsilon_of_history,
)

try:
    from opacus import PrivacyEngine
    from opacus.accountants import IAccountant, register_accountant
    from opacus.accountants.registry import _ACCOUNTANTS
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise missing_extra("opacus", "opacus") from error

__all__ = ["MECHANISM", "GuardedPrivacyEngine", "LedgerAccountant", "privacy_engine"]

#: The name under which the accountant is registered with Opacus.
MECHANISM = "dpaccount"


class LedgerAccountant(IAccountant):  # type: ignore[misc]
    """An Opacus accountant whose steps are charged to a dpaccount ledger first.

    Without a ledger (how Opacus itself creates one, e.g. to calibrate sigma in
    ``make_private_with_epsilon``) it keeps its history in memory like Opacus' own
    accountants; ``get_epsilon`` is dpaccount's certified PLD epsilon either way.

    Args:
        ledger: A `TrainingLedger` (or None: history in memory only).
        prepay: After each admitted step, charge the next one in a background thread
            (`TrainingLedger.prepay`), so that its durable append overlaps the next
            forward and backward pass; each step is still applied only once its record
            is durable. At most one charged step never runs (the one paid ahead when
            training stops).
    """

    def __init__(self, ledger: TrainingLedger | None = None, *, prepay: bool = False) -> None:
        self.ledger = ledger
        self.prepay = prepay
        self._history: list[tuple[float, float, int]] = []

    @classmethod
    def mechanism(cls) -> str:
        return MECHANISM

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(noise multiplier, sample rate, steps), as Opacus' accountants keep it."""
        if self.ledger is not None:
            return self.ledger.history
        return self._history

    @history.setter
    def history(self, value: list[tuple[float, float, int]]) -> None:
        if self.ledger is not None:
            raise ConfigError(
                "the history of a ledger-backed accountant is the ledger's; it cannot be "
                "set (load a checkpoint with load_state_dict, which checks it instead)"
            )
        self._history = [(float(s), float(q), int(k)) for s, q, k in value]

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Charge one step; called by the optimizer hook before the step is applied.

        Raises:
            StepRefusedError: The step does not fit; its gradient is not applied.
        """
        if self.ledger is not None:
            self.ledger.charge_steps(noise_multiplier=noise_multiplier,
                                     sampling_rate=sample_rate, computed=True)
            if self.prepay:
                self.ledger.prepay(noise_multiplier=noise_multiplier,
                                   sampling_rate=sample_rate)
            return
        if self._history and self._history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, k = self._history[-1]
            self._history[-1] = (sigma, q, k + 1)
        else:
            self._history.append((noise_multiplier, sample_rate, 1))

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """Certified epsilon at ``delta`` of the steps so far (PLD, rounded up).

        This is the number the ledger enforces: a proven upper bound, floating-point
        error included. Opacus' ``PRVAccountant`` returns the upper end of an *estimate*
        (Gopi, Lee and Wutschitz 2021) widened by its a-priori error allowance
        (``eps_error=0.01`` at ``delta - delta / 1000``), so it can read above this one;
        see `epsilon_bounds` for the interval the exact epsilon lies in.
        """
        return epsilon_of_history(self.history, delta)

    def epsilon_bounds(self, delta: float) -> tuple[float, float]:
        """(lower, upper) epsilon at ``delta`` of the steps so far.

        ``upper`` is `get_epsilon` (certified). ``lower`` comes from the same privacy
        loss distribution's optimistic discretisation, and the dominating pair is
        attained by a worst-case model and dataset, so no accountant that knows only
        (sigma, q, steps) can certify less (`epsilon_bounds_of_history`). The exact
        epsilon lies in between; an accountant reporting more than ``upper`` is looser,
        one reporting less than ``lower`` is wrong.
        """
        return epsilon_bounds_of_history(self.history, delta)

    def __len__(self) -> int:
        return sum(k for _s, _q, k in self.history)

    def get_optimizer_hook_fn(self, sample_rate: float) -> Any:
        """The hook Opacus attaches to ``DPOptimizer``: charge, or discard and refuse."""

        def hook(optimizer: Any) -> None:
            try:
                self.step(noise_multiplier=optimizer.noise_multiplier,
                          sample_rate=sample_rate * optimizer.accumulated_iterations)
            except BaseException:
                # Refused: drop the noisy gradient so that no later call applies it.
                optimizer.zero_grad(set_to_none=True)
                raise

        return hook

    def load_state_dict(self, state_dict: Any) -> None:
        """Load an Opacus checkpoint's accountant state (``PrivacyEngine.load_checkpoint``).

        A ledger-backed accountant keeps the ledger's history (the ledger never loses a
        charge, a checkpoint can be older than the last step) and only checks that the
        checkpoint's steps are a prefix of it.

        Raises:
            LedgerCorruptError: The checkpoint holds steps the ledger does not.
        """
        if self.ledger is None:
            super().load_state_dict(state_dict)
            return
        if state_dict.get("mechanism") != MECHANISM:
            raise ConfigError(
                f"the checkpoint's accountant is {state_dict.get('mechanism')!r}, not "
                f"{MECHANISM!r}; its steps were never charged to this ledger"
            )
        saved = sum(int(k) for _s, _q, k in state_dict.get("history", []))
        if saved > len(self):
            raise LedgerCorruptError(
                f"the checkpoint records {saved} steps but the ledger holds {len(self)}: "
                "it belongs to another ledger, or the ledger lost records"
            )


register_accountant(MECHANISM, LedgerAccountant, force=True)
if _ACCOUNTANTS.get(MECHANISM) is not LedgerAccountant:  # pragma: no cover - defensive
    raise ImportError("could not register the dpaccount accountant with Opacus")


def _check_wrapping(kwargs: dict[str, Any], poisson_sampling: bool) -> None:
    """Refuse what the accounting does not cover, before anything is wrapped or charged.

    Raises:
        ConfigError: ``poisson_sampling=False``, adaptive clipping, an empty data loader.
        InvalidCostError: A clipping norm that is not a positive finite number.
    """
    if not poisson_sampling:
        raise ConfigError(
            "poisson_sampling=False is not covered by the accounting (it assumes "
            "Poisson sampling, Mironov, Talwar and Zhang 2019); keep the default"
        )
    if kwargs.get("clipping", "flat") == "adaptive":
        raise ConfigError(
            "clipping='adaptive' spends privacy on the clipping bound that the DP-SGD "
            "step charge does not hold; use 'flat' or 'per_layer'"
        )
    norms = kwargs.get("max_grad_norm")
    for norm in norms if isinstance(norms, (list, tuple)) else [norms]:
        check_positive(norm, "max_grad_norm")
    loader = kwargs.get("data_loader")
    if loader is not None and len(loader) == 0:
        raise ConfigError("the data loader is empty: its sampling rate 1 / len(loader) "
                          "is undefined")


class GuardedPrivacyEngine(PrivacyEngine):  # type: ignore[misc]
    """Opacus' ``PrivacyEngine`` with a ledger-backed accountant.

    Before anything is wrapped (and before anything is charged) it refuses what the
    DP-SGD step charge does not describe: ``poisson_sampling=False`` (shuffled
    fixed-size batches are not what the Poisson-subsampled Gaussian's theorem covers),
    adaptive clipping, a noise multiplier or clipping norm that is not a positive finite
    number (NaN included), an empty data loader, and a target epsilon, delta or number
    of epochs that is not valid.
    """

    def make_private(self, *args: Any, poisson_sampling: bool = True, **kwargs: Any) -> Any:
        _check_wrapping(kwargs, poisson_sampling)
        check_positive(kwargs.get("noise_multiplier"), "noise_multiplier")
        return super().make_private(*args, poisson_sampling=True, **kwargs)

    def make_private_with_epsilon(self, *args: Any, **kwargs: Any) -> Any:
        if len(self.accountant) > 0:
            raise ConfigError(
                f"this run's ledger already holds {len(self.accountant)} steps: resume with "
                "make_private(noise_multiplier=engine.accountant.history[-1][0], ...) so "
                "that the remaining steps keep the plan's noise"
            )
        _check_wrapping(kwargs, kwargs.get("poisson_sampling", True))
        target = check_positive(kwargs.get("target_epsilon"), "target_epsilon")
        if target > 10**6:
            raise InvalidCostError("target_epsilon", kwargs.get("target_epsilon"),
                                   "must be at most 1e6")
        delta = check_delta(kwargs.get("target_delta"), "target_delta")
        if delta == 0:
            raise InvalidCostError("target_delta", 0, "must be > 0 for DP-SGD")
        check_positive(kwargs.get("epochs"), "epochs")
        return super().make_private_with_epsilon(*args, **kwargs)


def privacy_engine(ledger: TrainingLedger, *, secure_mode: bool = False,
                   prepay: bool = False) -> GuardedPrivacyEngine:
    """A `GuardedPrivacyEngine` whose accountant charges ``ledger`` before every step.

    ``secure_mode`` is Opacus' own (a cryptographically secure noise generator; Opacus
    warns when it is off, as it is by default). ``prepay=True`` charges each next step
    while the current one computes (`LedgerAccountant`).
    """
    engine = GuardedPrivacyEngine(accountant=MECHANISM, secure_mode=secure_mode)
    engine.accountant = LedgerAccountant(ledger, prepay=prepay)
    return engine
