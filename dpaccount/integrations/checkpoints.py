"""Checkpoints tied to the ledger: the model saved with the number of steps it has seen.

A DP-SGD step is charged to the ledger before it is applied, and a charge is never
refunded. A crash therefore loses the work of every step charged since the last model
checkpoint, and nothing else: `save_checkpoint` writes the model (and optimizer) state
together with the run's ledger position (`TrainingLedger.steps_taken`, the steps the
saved model has applied), and `resume_checkpoint` loads the latest one and says how many
charged steps were lost since (`Resumed.lost`), refusing a checkpoint that is *ahead* of
the ledger (it was not made from this ledger, or the ledger lost records).

Writes are atomic: the checkpoint goes to a temporary file in the same folder, is
flushed and ``fsync``-ed, renamed over its final name (``os.replace``, atomic on POSIX
and Windows), and the folder is ``fsync``-ed; a process killed at any point leaves
either the previous checkpoints or the new one, never a torn file (leftover temporary
files are ignored and cleaned by the next save).

Two formats, chosen by what is saved:

* PyTorch (``model=``, ``optimizer=``): ``torch.save`` of the state dicts, read back
  with ``torch.load(weights_only=True)`` (no pickled code). An Opacus-wrapped module
  (``GradSampleModule``, whose keys carry ``_module.``) is saved as the module it wraps,
  and a checkpoint loads into either form: no key surgery. A ``DPOptimizer`` is saved as
  the optimizer it wraps.
* JAX / any pytree (``state=``): its leaves as NumPy arrays in an ``.npz`` file (no
  pickle); resuming needs a pytree of the same structure (``like=``), as Orbax does.

Examples:
    >>> import tempfile
    >>> from dpaccount.integrations import TrainingLedger
    >>> run = TrainingLedger("memory://", budget=(2, "1e-5"), steps=40)
    >>> run.charge_steps(noise_multiplier=2.0, sampling_rate=0.1, steps=10)
    >>> folder = tempfile.mkdtemp()
    >>> path = save_checkpoint(folder, run, state={"w": [1.0, 2.0]})
    >>> run.charge_steps(noise_multiplier=2.0, sampling_rate=0.1, steps=3)  # then a crash
    >>> resumed = resume_checkpoint(folder, run, like={"w": [0.0, 0.0]})
    >>> resumed.position, resumed.charged, resumed.lost
    (10, 13, 3)
    >>> [float(v) for v in resumed.state["w"]]
    [1.0, 2.0]
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

from dpaccount.errors import ConfigError, LedgerCorruptError, StorageError
from dpaccount.integrations.training import TrainingLedger

__all__ = ["FORMAT", "Resumed", "resume_checkpoint", "save_checkpoint"]

#: The format tag stored in every checkpoint.
FORMAT = "dpaccount-training-checkpoint/1"
_NAME = re.compile(r"^step-(\d{12})\.(pt|npz)$")


@attrs.frozen
class Resumed:
    """What `resume_checkpoint` loaded.

    Attributes:
        path: The checkpoint file (None: there was none; nothing was loaded).
        position: Steps the loaded model had applied (its ledger position; 0 if none).
        charged: Steps the ledger holds now.
        lost: ``charged - position``: steps charged to the budget whose work is lost.
            They stay charged (a charge is never refunded).
        state: The loaded pytree (JAX format), else None.
        extra: The ``extra`` dictionary given when saving (JSON values).
    """

    path: Path | None
    position: int
    charged: int
    lost: int
    state: Any = None
    extra: dict[str, Any] = attrs.field(factory=dict)

    def __str__(self) -> str:
        where = "no checkpoint" if self.path is None else f"the checkpoint at step {self.position}"
        return (f"resumed from {where}; the ledger holds {self.charged} charged steps, so "
                f"{self.lost} charged steps were lost since (their privacy cost stays "
                "spent: charges are never refunded)")


def _unwrapped(obj: Any, attribute: str) -> Any:
    """The module an Opacus ``GradSampleModule`` wraps, or the optimizer a
    ``DPOptimizer`` wraps (the object itself otherwise)."""
    inner = getattr(obj, attribute, None)
    return obj if inner is None else inner


def _fsync_folder(folder: Path) -> None:
    if os.name == "nt":  # pragma: no cover - Windows cannot open a folder to fsync it
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = []
    for entry in folder.iterdir() if folder.is_dir() else []:
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def save_checkpoint(folder: str | os.PathLike[str], run: TrainingLedger, *,
                    model: Any = None, optimizer: Any = None, state: Any = None,
                    extra: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Save the model state with the run's ledger position, atomically.

    Call it between steps (after ``optimizer.step()`` or a `scan_steps` chunk returned):
    the position saved is `TrainingLedger.steps_applied`, the steps the state has
    applied (`steps_taken` less a step paid ahead with ``prepay``).

    Args:
        folder: Where checkpoints live (created if missing); one file per position,
            ``step-<position>.pt`` or ``.npz``.
        run: The run's `TrainingLedger`.
        model: A PyTorch module (Opacus-wrapped or not).
        optimizer: Its optimizer (a ``DPOptimizer`` or not).
        state: A JAX (or any) pytree of arrays, instead of ``model``.
        extra: JSON values to keep with it (epoch, data-loader position, ...).
        keep: How many of the newest checkpoints to keep (older ones are removed after
            the new one is durable).

    Returns:
        The checkpoint's path.

    Raises:
        ConfigError: Neither or both of ``model`` and ``state``; ``keep`` < 1; ``extra``
            not JSON.
    """
    if (model is None) == (state is None):
        raise ConfigError("save a PyTorch model= (and optimizer=) or a pytree state=")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ConfigError("keep must be an integer >= 1")
    try:
        extra_text = json.dumps(extra or {}, allow_nan=False)
    except (TypeError, ValueError):
        raise ConfigError("extra must hold JSON values (str, numbers, lists, dicts)") from None
    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    position = run.steps_applied  # a step paid ahead (prepay) has not been applied
    header = {"format": FORMAT, "position": position, "ledger": run.ledger_name,
              "extra": extra_text}
    suffix = "pt" if model is not None else "npz"
    final = where / f"step-{position:012d}.{suffix}"
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix="." + suffix, dir=where)
    try:
        with os.fdopen(handle, "wb") as stream:
            if model is not None:
                _write_torch(stream, header, model, optimizer)
            else:
                _write_pytree(stream, header, state)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, final)
        _fsync_folder(where)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    for _position, old in _checkpoints(where)[:-keep]:
        with contextlib.suppress(OSError):
            old.unlink()
    for leftover in where.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            leftover.unlink()
    return final


def _write_torch(stream: Any, header: dict[str, Any], model: Any, optimizer: Any) -> None:
    import torch

    payload: dict[str, Any] = {
        "header": header,
        "model": _unwrapped(model, "_module").state_dict(),
    }
    if optimizer is not None:
        payload["optimizer"] = _unwrapped(optimizer, "original_optimizer").state_dict()
    torch.save(payload, stream)


def _write_pytree(stream: Any, header: dict[str, Any], state: Any) -> None:
    import numpy as np

    leaves = _leaves(state)
    arrays = {f"leaf_{i:06d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    arrays["header"] = np.array(json.dumps(header))
    np.savez(stream, **arrays)  # type: ignore[arg-type]


def _jax() -> Any:
    """JAX if the program already imported it (a pytree of JAX arrays implies it), else
    None: plain nested lists, tuples and dicts are handled without it."""
    return sys.modules.get("jax")


def _leaves(tree: Any) -> list[Any]:
    jax = _jax()
    if jax is None:  # a plain nested structure of lists, tuples and dicts
        if isinstance(tree, dict):
            return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
        if isinstance(tree, (list, tuple)):
            return [leaf for item in tree for leaf in _leaves(item)]
        return [tree]
    return list(jax.tree_util.tree_leaves(jax.device_get(tree)))


def _rebuild(like: Any, leaves: list[Any]) -> Any:
    jax = _jax()
    if jax is None:
        it = iter(leaves)

        def fill(tree: Any) -> Any:
            if isinstance(tree, dict):
                return {key: fill(tree[key]) for key in sorted(tree)}
            if isinstance(tree, (list, tuple)):
                return type(tree)(fill(item) for item in tree)
            try:
                return next(it)
            except StopIteration:
                raise ConfigError("like= has more leaves than the checkpoint") from None

        return fill(like)
    treedef = jax.tree_util.tree_structure(like)
    expected = len(jax.tree_util.tree_leaves(like))
    if expected != len(leaves):
        raise ConfigError(f"the checkpoint holds {len(leaves)} arrays; like= has {expected}")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def resume_checkpoint(folder: str | os.PathLike[str], run: TrainingLedger, *,
                      model: Any = None, optimizer: Any = None,
                      like: Any = None) -> Resumed:
    """Load the latest checkpoint in ``folder`` and say how many charged steps were lost.

    The model (and optimizer) are loaded in place (an Opacus-wrapped module or not);
    a pytree checkpoint is returned as `Resumed.state`, shaped like ``like``. Nothing
    is charged or refunded: the ledger is only read.

    Raises:
        LedgerCorruptError: The latest checkpoint is ahead of the ledger (it records more
            steps than the ledger holds), or was saved from another ledger name.
        StorageError: The checkpoint file cannot be read.
        ConfigError: A PyTorch checkpoint without ``model=``, or a pytree one without
            ``like=``.
    """
    charged = run.steps_taken
    found = _checkpoints(Path(folder))
    if not found:
        return Resumed(None, 0, charged, charged)
    position, path = found[-1]
    if position > charged:
        raise LedgerCorruptError(
            f"the latest checkpoint ({path.name}) has applied {position} steps but the "
            f"ledger holds {charged}: it was not saved from this ledger, or the ledger "
            "lost records; refusing to resume from it"
        )
    if path.suffix == ".pt":
        if model is None:
            raise ConfigError(f"{path.name} is a PyTorch checkpoint: pass model=")
        header, state = _read_torch(path, model, optimizer), None
    else:
        if like is None:
            raise ConfigError(f"{path.name} is a pytree checkpoint: pass like=")
        header, state = _read_pytree(path, like)
    if header.get("format") != FORMAT or header.get("position") != position:
        raise LedgerCorruptError(f"{path.name} is not a {FORMAT} checkpoint of step "
                                 f"{position}")
    if header.get("ledger") != run.ledger_name:
        raise LedgerCorruptError(
            f"{path.name} was saved from the ledger {header.get('ledger')!r}, not "
            f"{run.ledger_name!r}"
        )
    return Resumed(path, position, charged, charged - position, state,
                   json.loads(header.get("extra", "{}")))


def _read_torch(path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
        raise StorageError(f"cannot read the checkpoint {path.name}: "
                           f"{type(error).__name__}") from None
    header = payload.get("header", {})
    if header.get("format") == FORMAT:
        _unwrapped(model, "_module").load_state_dict(payload["model"])
        if optimizer is not None and "optimizer" in payload:
            _unwrapped(optimizer, "original_optimizer").load_state_dict(payload["optimizer"])
    return dict(header)


def _read_pytree(path: Path, like: Any) -> tuple[dict[str, Any], Any]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            names = sorted(name for name in data.files if name.startswith("leaf_"))
            leaves = [data[name] for name in names]
    except (OSError, ValueError, KeyError) as error:
        raise StorageError(f"cannot read the checkpoint {path.name}: "
                           f"{type(error).__name__}") from None
    return header, _rebuild(like, leaves)
