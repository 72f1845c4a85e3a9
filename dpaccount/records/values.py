"""What a ledger holds in memory: its records (`LedgerRecord`) and the rule for its name.

Nothing here imports pydantic: an in-memory accountant uses these values and never
(de)serialises them. The stored form of a record is in `dpaccount.records.models`.
"""

from __future__ import annotations

import unicodedata
from datetime import datetime
from typing import Any, Final

import attrs

from dpaccount.charges import Charge
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, LedgerCorruptError

__all__ = [
    "GENESIS_HASH",
    "MAX_NAME_LENGTH",
    "SCHEMA_VERSION",
    "LedgerRecord",
    "check_ledger_name",
    "stored_name",
]

#: The version of the serialised record and metadata format.
SCHEMA_VERSION: Final = 1

#: The hash that precedes the first record of every ledger.
GENESIS_HASH = "0" * 64

#: The longest ledger name (characters), shares and blocks included.
MAX_NAME_LENGTH = 200


def check_ledger_name(name: Any, field: str = "name") -> str:
    """Refuse a ledger name that could not be stored, read back, told apart or shown.

    A name is a ``str`` of 1 to `MAX_NAME_LENGTH` characters, in Unicode NFC form, whose
    characters are all printable (`str.isprintable`: no control, format, surrogate or
    separator characters; the ASCII space is allowed). ``/`` separates the parts of a
    share's or a block's name (``census/team-a``, ``events/2026-11-24``): every part is
    non-empty, does not start or end with a space, and is not only dots (``.``,
    ``..``). The same rule holds on every backend and for every way a name comes in;
    it is checked before anything is opened or created.

    Args:
        name: The name to check.
        field: What the name is called in the message (``"name"``, ``"parent"``, ...).

    Returns:
        The name, unchanged.

    Raises:
        ConfigError: Saying what is wrong (the name is shown escaped and shortened).

    Examples:
        >>> check_ledger_name("census/team-a")
        'census/team-a'
        >>> check_ledger_name("census/../other")
        Traceback (most recent call last):
        ...
        dpaccount.errors.ConfigError: invalid ledger name 'census/../other': ...
    """
    if type(name) is not str:
        raise ConfigError(f"a ledger {field} must be a str, not {type(name).__name__}")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"invalid ledger {field} of {len(name)} characters: at most {MAX_NAME_LENGTH}"
        )
    reason = _name_defect(name)
    if reason is not None:
        shown = ascii(name)
        shown = shown if len(shown) <= 80 else f"{shown[:60]}...'"
        raise ConfigError(
            f"invalid ledger {field} {shown}: {reason}. A ledger name is 1 to "
            f"{MAX_NAME_LENGTH} printable characters (NFC), parts separated by '/', each "
            "part non-empty, without leading or trailing spaces, and not only dots"
        )
    return name


def _name_defect(name: str) -> str | None:
    if not name:
        return "it is empty"
    if not name.isprintable():
        return ("it holds characters that are not printable (control, format, separator "
                "or lone surrogate characters)")
    if not unicodedata.is_normalized("NFC", name):
        return "it is not in Unicode NFC form (the same text could name two ledgers)"
    for part in name.split("/"):
        if not part:
            return "it has an empty part (a leading, trailing or doubled '/')"
        if part != part.strip(" "):
            return "a part starts or ends with a space"
        if not part.strip("."):
            return "a part is only dots"
    return None


def stored_name(name: Any) -> str:
    """A ledger name read back from a store, checked as `check_ledger_name` does.

    Raises:
        LedgerCorruptError: The stored name breaks the rule (someone wrote it around
            dpaccount).
    """
    try:
        return check_ledger_name(name)
    except ConfigError as exc:
        error = exc
    raise LedgerCorruptError(f"a stored ledger name is invalid: {error}")


@attrs.frozen
class LedgerRecord:
    """One accepted charge, as the ledger keeps it.

    Attributes:
        seq: Position in the ledger, from 0.
        label: The caller's label (e.g. the guarded function's name), or None.
        charge: The charge as given (a PrivacyCost or a charge from dpaccount.charges).
        cost: Its (epsilon, delta) guarantee on its own, by basic composition.
        rule: The name of the rule that admitted it.
        timestamp: When it was recorded (UTC).
        query_id: The caller's idempotency key, or None.
    """

    seq: int
    label: str | None
    charge: Charge
    cost: PrivacyCost
    rule: str
    timestamp: datetime
    query_id: str | None = None
