"""Rule states as exact text, so a ledger can store a snapshot of its rule's running
state and reopen in O(1) instead of replaying every record.

Every rule's state is exact (fractions, integers, tuples of them, and numpy arrays of
Python integers for the Rényi sums), so the encoding is exact too: decoding an encoded
state gives a state equal to it, field by field (a property test checks each kind). The
world is closed: only the state classes listed here can be read back, chosen by a
``kind`` name, never by importing code named in stored data.

Examples:
    >>> from dpaccount.composition.basic import BasicState
    >>> text = encode_state(BasicState(Fraction(1, 3), Fraction(0)))
    >>> text
    '{"delta":"q:0/1","epsilon":"q:1/3","kind":"basic"}'
    >>> decode_state(text) == BasicState(Fraction(1, 3), Fraction(0))
    True
"""

from __future__ import annotations

import importlib
import json
from fractions import Fraction
from typing import Any

import attrs
import numpy as np

from dpaccount._numeric import int_text, text_int
from dpaccount.errors import LedgerCorruptError

__all__ = ["decode_state", "encode_state"]


#: kind -> (module, class) of every state that can be stored. Named, not imported: a
#: basic ledger's snapshot must not import the PLD engine (and scipy.fft with it, about
#: 90 ms in the middle of a charge); reading a state imports only its own class.
_KINDS: dict[str, tuple[str, str]] = {
    "basic": ("dpaccount.composition.basic", "BasicState"),
    "filter": ("dpaccount.composition.filters", "FilterState"),
    "plan": ("dpaccount.composition.plans", "PlanState"),
    "rdp": ("dpaccount.accounting.rdp.rule", "RDPState"),
    "gdp": ("dpaccount.accounting.gdp", "GDPState"),
    "zcdp": ("dpaccount.composition.zcdp", "ZCDPState"),
    "pld": ("dpaccount.accounting.pld", "PLDState"),
}
_KIND_OF: dict[tuple[str, str], str] = {where: kind for kind, where in _KINDS.items()}


def _state_class(kind: str) -> type:
    module, name = _KINDS[kind]
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def _encode(value: Any) -> Any:
    if isinstance(value, bool):
        raise TypeError("no rule state holds a bool")
    if isinstance(value, Fraction):
        return f"q:{int_text(value.numerator)}/{int_text(value.denominator)}"
    if isinstance(value, int):
        return f"i:{int_text(value)}"
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype == object:
        return {"ints": [_encode(int(v)) for v in value.tolist()]}
    raise TypeError(f"cannot encode a rule state field of type {type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("q:"):
        num, _, den = value[2:].partition("/")
        return Fraction(text_int(num), text_int(den))
    if isinstance(value, str) and value.startswith("i:"):
        return text_int(value[2:])
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict) and set(value) == {"ints"}:
        return np.array([_decode(v) for v in value["ints"]], dtype=object)
    raise ValueError(f"not an encoded state field: {type(value).__name__}")


def encode_state(state: Any) -> str | None:
    """The state as canonical JSON text, or None for a state of a kind not listed."""
    cls = type(state)
    kind = _KIND_OF.get((cls.__module__, cls.__qualname__))
    if kind is None or _state_class(kind) is not cls:
        return None
    fields = {field.name: _encode(getattr(state, field.name))
              for field in attrs.fields(type(state))}
    return json.dumps({"kind": kind, **fields}, sort_keys=True, separators=(",", ":"))


def decode_state(text: str) -> Any:
    """The state `encode_state` wrote.

    Raises:
        LedgerCorruptError: The text is not an encoded state of a listed kind.
    """
    try:
        data = json.loads(text)
        cls = _state_class(data.pop("kind"))
        names = {field.name for field in attrs.fields(cls)}
        if set(data) != names:
            raise ValueError(f"fields {sorted(data)} are not {sorted(names)}")
        return cls(**{name: _decode(value) for name, value in data.items()})
    except (ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError,
            RecursionError) as exc:  # (json refuses text nested too deep this way)
        raise LedgerCorruptError(f"a stored rule state cannot be read: {exc}") from None
