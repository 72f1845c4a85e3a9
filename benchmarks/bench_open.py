"""Opening a durable ledger at any length (issue: ledgers for a data platform, item 1).

Run: ``python benchmarks/bench_open.py [--pg URL] [--big 1000000] [--repeats 7]
[--verify-repeats 3]``

For SQLite and PostgreSQL, in one run: a ledger of 10 records and one of ``--big``
records (basic rule, each record a ``PrivacyCost`` charge with a label), then

1. **open**: ``open_ledger(url, name)`` by name alone, read the spend, close; min and
   median of ``--repeats`` runs, alternating small and big. Goal: big / small <= 2.
2. **full verification**: ``store.verify()`` on the big ledger (every record decoded
   and its link checked, the cached tip and every snapshot's tip recomputed), and
   ``dpaccount ledger verify`` (that, plus the rule replayed against every snapshot's
   state and the budget): records per second, best and median of ``--verify-repeats``.
   Goal: >= 100,000.

The big ledger is written directly (its rows, links, cached tip and a snapshot at its
head, as the accountant writes them) with the tables' triggers off during the bulk
load: charging a million records through the accountant would take minutes and is
measured elsewhere (``bench_storage.py``). On PostgreSQL the records table is then
vacuumed, as autovacuum would have done to a ledger filled over months. Both ledgers are
then opened through the public API only.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount.charges import cost_of
from dpaccount.composition.basic import BasicState
from dpaccount.composition.states import encode_state
from dpaccount.ledger_cli import ledger_main
from dpaccount.ledgers import open_store
from dpaccount.records import GENESIS_HASH, LedgerRecord, chain_hash_payload
from dpaccount.storage._chain import snapshot_link
from dpaccount.storage._sql import LedgerTip, frac_text, renumberable, snapshot_settings

COST = PrivacyCost("0.000001")


def _rows(n: int) -> tuple[list[tuple[Any, ...]], LedgerTip]:
    template = LedgerRecord(seq=0, label="nightly count", charge=COST, cost=cost_of(COST),
                            rule="basic", timestamp=datetime(2026, 11, 1, tzinfo=UTC))
    prefix, suffix = renumberable(template, 0)
    rows, prev = [], GENESIS_HASH
    for seq in range(n):
        payload = f"{prefix}{seq}{suffix}"
        link = chain_hash_payload(prev, payload)
        rows.append((seq, payload, prev, link))
        prev = link
    total = COST.epsilon * n
    return rows, LedgerTip(n, prev, total, Fraction(0))


def build(url: str, name: str, n: int, raw: Any) -> None:
    """A ledger of ``n`` records at ``url``; ``raw(statements)`` runs SQL with triggers
    off (the bulk load)."""
    open_ledger(url, name=name, budget=Budget(10**6)).close()
    rows, tip = _rows(n)
    with open_ledger(url, name=name, read_only=True) as acct:
        meta = acct._meta
    settings = snapshot_settings(meta)
    state = encode_state(BasicState(tip.epsilon_sum, tip.delta_sum))
    snapshot = (name, n, tip.last_hash, frac_text(tip.epsilon_sum), frac_text(tip.delta_sum),
                settings, state, snapshot_link(tip, settings, state, None))
    raw(name, [(name, seq, payload, prev, link, None) for seq, payload, prev, link in rows],
        (n, tip.last_hash, frac_text(tip.epsilon_sum), frac_text(tip.delta_sum)), snapshot)


def sqlite_raw(path: str) -> Any:
    import sqlite3

    def raw(name: str, records: list[Any], tip: tuple[Any, ...], snapshot: tuple[Any, ...]
            ) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        triggers = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
                                ).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        for trigger, _ in triggers:
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)", records)
        conn.execute("UPDATE ledgers SET head = ?, last_hash = ?, epsilon_sum = ?, "
                     "delta_sum = ? WHERE name = ?", (*tip, name))
        conn.execute("INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?)", snapshot)
        for _, sql in triggers:
            conn.execute(sql)
        conn.execute("COMMIT")
        conn.close()

    return raw


def pg_raw(pg: str, schema: str) -> Any:
    import psycopg

    def raw(name: str, records: list[Any], tip: tuple[Any, ...], snapshot: tuple[Any, ...]
            ) -> None:
        s = f'"{schema}"'
        with psycopg.connect(pg) as conn:
            for table in ("records", "ledgers", "snapshots"):
                conn.execute(f"ALTER TABLE {s}.{table} DISABLE TRIGGER USER")
            with conn.cursor().copy(f"COPY {s}.records FROM STDIN") as copy:
                for row in records:
                    copy.write_row(row)
            conn.execute(f"UPDATE {s}.ledgers SET head = %s, last_hash = %s, epsilon_sum = "
                         "%s, delta_sum = %s WHERE name = %s", (*tip, name))
            conn.execute(f"INSERT INTO {s}.snapshots VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                         snapshot)
            for table in ("records", "ledgers", "snapshots"):
                conn.execute(f"ALTER TABLE {s}.{table} ENABLE TRIGGER USER")
        # A ledger filled over months has been vacuumed by autovacuum long since; without
        # this, the first full read of freshly copied rows also sets every tuple's hint
        # bits (writes), which no real ledger pays at verification time.
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {s}.records")

    return raw


def time_open(url: str, name: str) -> float:
    start = time.perf_counter()
    with open_ledger(url, name=name) as acct:
        acct.spent  # noqa: B018 - the spend is what a job reads first
    return time.perf_counter() - start


def run_backend(label: str, url: str, raw: Any, big: int, repeats: int,
                verify_repeats: int) -> None:
    t0 = time.perf_counter()
    build(url, "small", 10, raw)
    build(url, "big", big, raw)
    print(f"{label}: built ledgers of 10 and {big:,} records in "
          f"{time.perf_counter() - t0:.0f} s")
    small, large = [], []
    time_open(url, "small")
    time_open(url, "big")  # warm the file cache / connection path once each
    for _ in range(repeats):
        small.append(time_open(url, "small"))
        large.append(time_open(url, "big"))
    ratio_min = min(large) / min(small)
    ratio_med = statistics.median(large) / statistics.median(small)
    print(f"  open by name: {big:,} records / 10 records = {ratio_min:.2f} (min), "
          f"{ratio_med:.2f} (median)   goal <= 2")
    def store_verify() -> None:
        store: Any = open_store(url, name="big", create=False, read_only=True)
        store.verify()
        store.close()

    def cli_verify() -> None:
        out = io.StringIO()
        status = ledger_main(["ledger", "verify", url, "--name", "big"], out=out)
        assert status == 0, out.getvalue()

    for what, run in (("store.verify", store_verify), ("dpaccount ledger verify", cli_verify)):
        times = []
        for _ in range(verify_repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        print(f"  full verification ({what}): {big / min(times):,.0f} records/s (best), "
              f"{big / statistics.median(times):,.0f} (median of {verify_repeats})   "
              "goal >= 100,000")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=os.environ.get(
        "DPACCOUNT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--verify-repeats", type=int, default=3)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "open.db")
    run_backend("SQLite", f"sqlite:///{path}", sqlite_raw(path), args.big, args.repeats,
                args.verify_repeats)
    if not args.no_pg:
        import psycopg

        schema = f"bench_open_{os.getpid()}"
        try:
            run_backend("PostgreSQL", f"{args.pg}?schema={schema}", pg_raw(args.pg, schema),
                        args.big, args.repeats, args.verify_repeats)
        finally:
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
