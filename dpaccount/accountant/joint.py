"""One charge to several ledgers, all or nothing: the joint protocol.

A sub-budget's charge goes to the share and every ancestor; a query over a window of
blocks goes to every block of the window (`dpaccount.budgets`). Each ledger decides under
its own rule and budget, on its own state caught up with every other writer, and the
store appends to all of them in one transaction (`Store.append_group`), or to none. Only
public steps of `Ledger` are used (its module docstring lists them), so this is the same
decision as a charge to one ledger, made for each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from dpaccount.accountant.ledger import Decision, Ledger
from dpaccount.accountant.logs import log_admitted, log_duplicate, log_refused
from dpaccount.accountant.settings import check_text, revalidate
from dpaccount.charges import Charge, cost_of
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DuplicateQueryError,
    LedgerConflictError,
    LedgerCorruptError,
)
from dpaccount.records import LedgerRecord
from dpaccount.storage.base import GroupAppend
from dpaccount.storage.memory import MemoryStore

__all__ = ["charge_jointly"]

_log = logging.getLogger(__name__)


def _database(ledger: Ledger) -> tuple[Any, ...]:
    """Which database ``ledger`` lives in: a joint charge is atomic only within one."""
    store: Any = ledger.store
    if isinstance(store, MemoryStore):
        return ("memory",)
    path = getattr(store, "path", None)
    if path is not None:
        return ("sqlite", os.path.realpath(path))
    return ("postgresql", getattr(store, "database", None), getattr(store, "schema", None))


def charge_jointly(ledgers: Sequence[Ledger], charge: Any, *, label: str | None = None,
                   query_id: str | None = None) -> list[LedgerRecord]:
    """Charge ``charge`` to every ledger of ``ledgers``, all or none, atomically.

    Each ledger decides under its own rule and budget (folding in what other writers
    appended, under the database's lock); the charge is recorded in all of them in one
    transaction only if all admit it. Concurrent writers on other processes or machines
    are serialised by the database as for single charges.

    Returns:
        The stored records, one per ledger, in the order given.

    Raises:
        BudgetExceededError: A ledger would go over its budget (``.ledger`` names it);
            nothing was recorded anywhere.
        ConfigError: The ledgers are not in one database, or the same ledger twice.
        DuplicateQueryError: ``query_id`` is already recorded in one of them.
        ReadOnlyLedgerError: One was opened read-only.
    """
    if not ledgers:
        raise ConfigError("a joint charge needs at least one ledger")
    names = [ledger.name for ledger in ledgers]
    if len(set(names)) != len(names):
        raise ConfigError(f"the same ledger appears twice in {names}")
    if len({_database(ledger) for ledger in ledgers}) != 1:
        raise ConfigError(
            f"ledgers {names} are not in one database: a charge to several ledgers is "
            "atomic only within one SQLite file, one PostgreSQL schema or one process"
        )
    for ledger in ledgers:
        ledger.refuse_read_only()
    charges = [ledger.as_charge(charge) for ledger in ledgers]
    cost = cost_of(charges[0])
    revalidate(cost)
    check_text(label, "label")
    check_text(query_id, "query_id")
    ordered = sorted(ledgers, key=lambda ledger: ledger.name)
    for ledger in ordered:
        ledger.lock.acquire()
    try:
        records = _charge_locked(ledgers, charges, label, query_id)
        log_admitted(_log, ledgers, records)  # under the locks: this charge's totals
        return records
    except BudgetExceededError as error:
        log_refused(_log, ledgers, error, label, query_id, charges[0])
        raise
    except DuplicateQueryError as error:
        log_duplicate(_log, ledgers, error, label)
        raise
    finally:
        for ledger in reversed(ordered):
            ledger.lock.release()


def _charge_locked(ledgers: Sequence[Ledger], charges: list[Charge],
                   label: str | None, query_id: str | None) -> list[LedgerRecord]:
    """One decision and append for all (no lost race to retry: the store decides under
    its lock with what other writers appended, as `DecidingStore` does)."""
    now = datetime.now(UTC)
    for ledger in ledgers:
        ledger.refresh()
        if query_id is not None:
            ledger.refuse_duplicate(query_id)
    records = [
        LedgerRecord(seq=ledger.head, label=label, charge=c, cost=cost_of(c),
                     rule=ledger.rule.name, timestamp=now, query_id=query_id)
        for ledger, c in zip(ledgers, charges, strict=True)
    ]
    decisions: list[Decision] = [ledger.decision(c)
                                 for ledger, c in zip(ledgers, charges, strict=True)]
    if isinstance(ledgers[0].store, MemoryStore):
        admitted = all([decide(()) for decide in decisions])
        if admitted:
            for ledger, record in zip(ledgers, records, strict=True):
                ledger.store.append(ledger.head, record)
        seqs = [ledger.head for ledger in ledgers]
    else:
        store: Any = ledgers[0].store
        parts = [GroupAppend(ledger.name, ledger.head, record,
                             getattr(ledger.store, "meta_text", None), decide,
                             getattr(ledger.store, "seen_tip", None))
                 for ledger, record, decide in zip(ledgers, records, decisions, strict=True)]
        try:
            results = store.append_group(parts)
        except LedgerConflictError:
            for ledger in ledgers:
                ledger.refresh()
                if query_id is not None:
                    ledger.refuse_duplicate(query_id)
            raise
        admitted = all(result.appended for result in results)
        seqs = [result.seq for result in results]
    if not admitted:
        for ledger, decide in zip(ledgers, decisions, strict=True):
            ledger.settle(decide, None)
        for ledger, decide, charge in zip(ledgers, decisions, charges, strict=True):
            if decide.new_state is not None and not decide.fits:
                refusal = ledger.refusal(cost_of(charge), decide.new_state,
                                         ledger=ledger.name)
                if refusal is not None:
                    raise refusal
        raise LedgerCorruptError("a ledger refused a charge that its decision admitted")
    out = []
    for ledger, decide, record, seq in zip(ledgers, decisions, records, seqs, strict=True):
        ledger.settle(decide, seq)
        ledger.snapshot_if_due()
        out.append(record if record.seq == seq else attrs.evolve(record, seq=seq))
    return out
