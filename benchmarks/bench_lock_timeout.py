"""How closely a writer kept from the lock keeps ``lock_timeout`` (issue 28, item 6).

Run: ``python benchmarks/bench_lock_timeout.py [--timeout 1.5] [--repeats 5] [--no-pg]``

For SQLite and PostgreSQL, in one run: another connection holds the write lock (SQLite's
``BEGIN IMMEDIATE``; the ledger's row ``FOR UPDATE`` on PostgreSQL) while a charge on a
ledger opened with ``?lock_timeout=T`` waits and fails closed (``StorageError``). Its
wait is compared with the anchor, a plain ``time.sleep(T)`` timed the same way in the
same run (how late this machine wakes a sleeper right now), alternating the two, and
printed as ratios to T and to the anchor: min and median of ``--repeats``.
Goal: the charge's wait within 1.10 x T on an idle machine (the bound the tests asserted
before issue 28), and within 1.10 x the anchor on a busy one.

The tests (``tests/unit/test_integrity_inputs.py``) assert only what load cannot break:
the writer waits at least T, fails closed with nothing written, and returns.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount.errors import StorageError


def _timed(action: Callable[[], None]) -> float:
    start = time.monotonic()
    action()
    return time.monotonic() - start


def _refused(acct: Any) -> Callable[[], None]:
    def charge() -> None:
        try:
            acct.charge(PrivacyCost("0.1"))
        except StorageError:
            return
        raise SystemExit("the charge went through a held lock")

    return charge


def sqlite_waits(folder: str, timeout: float, repeats: int) -> tuple[list[float], list[float]]:
    path = os.path.join(folder, "locked.db")
    acct = open_ledger(f"sqlite:///{path}?lock_timeout={timeout}", name="L", budget=Budget(10))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    waits, anchors = [], []
    try:
        for _ in range(repeats):
            waits.append(_timed(_refused(acct)))
            anchors.append(_timed(lambda: time.sleep(timeout)))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        acct.store.close()
    return waits, anchors


def postgres_waits(pg: str, timeout: float, repeats: int) -> tuple[list[float], list[float]]:
    import psycopg

    schema = f"bench_lock_{os.getpid()}"
    acct = open_ledger(f"{pg}?schema={schema}&lock_timeout={timeout}", name="L",
                       budget=Budget(10))
    holder = psycopg.connect(pg)
    waits, anchors = [], []
    try:
        holder.execute(f'SELECT 1 FROM "{schema}".ledgers WHERE name = %s FOR UPDATE', ("L",))
        for _ in range(repeats):
            waits.append(_timed(_refused(acct)))
            anchors.append(_timed(lambda: time.sleep(timeout)))
    finally:
        holder.rollback()
        holder.close()
        acct.store.close()
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return waits, anchors


def report(label: str, timeout: float, waits: list[float], anchors: list[float]) -> None:
    for what, values in (("min", min), ("median", statistics.median)):
        wait, anchor = values(waits), values(anchors)
        print(f"  {label} ({what}): waited {wait:.3f} s = {wait / timeout:.3f} x lock_timeout "
              f"= {wait / anchor:.3f} x sleep({timeout:g}) [{anchor:.3f} s]   goal <= 1.10")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=os.environ.get(
        "DPACCOUNT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--timeout", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    print(f"lock_timeout = {args.timeout:g} s, {args.repeats} repeats, load average "
          f"{os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as folder:
        report("SQLite", args.timeout, *sqlite_waits(folder, args.timeout, args.repeats))
    if not args.no_pg:
        report("PostgreSQL", args.timeout, *postgres_waits(args.pg, args.timeout,
                                                            args.repeats))


if __name__ == "__main__":
    main()
