"""What the auditor's view costs on a large ledger (issue 29, items 2 and 3).

Run: ``python benchmarks/bench_auditor_view.py [--big 200000] [--repeats 3]``

CPU time (``time.process_time``: the work is single-threaded), each pair alternated in
one run on one SQLite ledger of ``--big`` records (built as ``bench_open.py`` builds
it), min and median of ``--repeats`` pairs, with the ratio:

1. **progress**: ``store.verify(records)`` with a progress callback that draws a line
   (into memory, as on a terminal) against the same call without one. Goal: <= 1.05.
2. **streamed export**: `dpaccount.audit.write_export` (one record at a time, with
   progress) against ``json.dump(export_document(...), indent=1, sort_keys=True)`` (what
   ``ledger export`` did before: the same bytes, built whole first). Goal: <= 1.1.
3. **share attribution**: `dpaccount.audit.attribute_shares` of the ledger against two
   shares holding every other record each (the exact in-order match), against the same
   work done by hand when every key is unique: a dict from key to position (the same
   key: time, label, query id, cost as integers), one look-up per share record, no
   check of order or overlap. The slow sibling beside it: the greedy per-share matching the
   attribution falls back to. Context: the ledger's own ``store.verify``, which every
   command runs first.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import attrs
from bench_open import build, sqlite_raw

from dpaccount import Budget, PrivacyCost
from dpaccount._progress import ProgressLine
from dpaccount.audit import attribute_shares, export_document, write_export
from dpaccount.charges import Relation
from dpaccount.ledgers import open_store
from dpaccount.records import LedgerMeta, LedgerRecord


def cpu(work: Any) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def paired(label: str, anchor: tuple[str, Any], ours: tuple[str, Any], repeats: int,
           goal: str) -> None:
    """Alternate the anchor and ours; print min and median CPU seconds and the ratio."""
    a_times, o_times, ratios = [], [], []
    for _ in range(repeats):
        a = cpu(anchor[1])
        o = cpu(ours[1])
        a_times.append(a)
        o_times.append(o)
        ratios.append(o / a)
    print(f"{label}:\n"
          f"  {anchor[0]:<44} min {min(a_times):7.3f} s  "
          f"median {statistics.median(a_times):7.3f} s\n"
          f"  {ours[0]:<44} min {min(o_times):7.3f} s  "
          f"median {statistics.median(o_times):7.3f} s\n"
          f"  ratio ours/anchor: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})   goal {goal}")


def synthetic(n: int) -> dict[str, tuple[LedgerMeta, list[LedgerRecord]]]:
    """A parent of ``n`` records; shares A and B hold every other one (as the joint
    protocol records them: same time, label, query id and cost)."""
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    cost = PrivacyCost("0.000001")
    parent = [LedgerRecord(seq=i, label="count", charge=cost, cost=cost, rule="basic",
                           timestamp=t0 + timedelta(microseconds=i)) for i in range(n)]
    # the shares' copies are objects of their own, as records decoded from their rows
    a = [attrs.evolve(r, seq=i, timestamp=r.timestamp + timedelta(0),
                      cost=PrivacyCost(str(r.cost.epsilon)), label="".join(r.label or ""))
         for i, r in enumerate(r for r in parent if r.seq % 4 == 1)]
    b = [attrs.evolve(r, seq=i, timestamp=r.timestamp + timedelta(0),
                      cost=PrivacyCost(str(r.cost.epsilon)), label="".join(r.label or ""))
         for i, r in enumerate(r for r in parent if r.seq % 4 == 3)]

    def meta(name: str, parent_name: str | None) -> LedgerMeta:
        return LedgerMeta.build(name, Budget(10**6), {"name": "basic"}, Relation.ADD_REMOVE,
                                parent=parent_name)

    return {"P": (meta("P", None), parent), "P/a": (meta("P/a", "P"), a),
            "P/b": (meta("P/b", "P"), b)}


def by_hand(ledgers: dict[str, tuple[LedgerMeta, list[LedgerRecord]]]) -> list[str | None]:
    def key(r: LedgerRecord) -> tuple[Any, ...]:
        e, d = r.cost.epsilon, r.cost.delta
        return (r.timestamp, r.label, r.query_id, e.numerator, e.denominator, d.numerator,
                d.denominator)

    records = ledgers["P"][1]
    at = {key(r): i for i, r in enumerate(records)}
    names: list[str | None] = [None] * len(records)
    for share in ("P/a", "P/b"):
        for r in ledgers[share][1]:
            names[at[key(r)]] = share
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "view.db")
    url = f"sqlite:///{path}"
    build(url, "big", args.big, sqlite_raw(path))
    print(f"a SQLite ledger of {args.big:,} records; CPU time, {args.repeats} alternated pairs")
    store: Any = open_store(url, name="big", create=False, read_only=True)
    drawn = io.StringIO()
    line = ProgressLine(drawn, enabled=True)

    def plain() -> None:
        store.verify([])

    def with_progress() -> None:
        store.verify([], progress=line.stage("verifying big"))

    paired("1. store.verify", ("without progress", plain),
           ("with a progress line (drawn into memory)", with_progress), args.repeats,
           "<= 1.05")
    rows, history = store.chain_rows()
    records: list[LedgerRecord] = []
    store.verify(records)
    meta = store.stored_meta()
    store.close()

    def whole() -> None:
        json.dump(export_document(meta, rows, history), io.StringIO(), indent=1,
                  sort_keys=True)

    def streamed() -> None:
        write_export(io.StringIO(), meta, rows, history, progress=line.stage("writing"))

    paired("2. JSON export", ("json.dump(export_document(...)) (before)", whole),
           ("write_export, streamed, with progress", streamed), args.repeats, "<= 1.1")
    ledgers = synthetic(args.big)
    assert attribute_shares("P", ledgers).names == by_hand(ledgers)
    paired(f"3. share attribution ({args.big:,} parent records, 2 shares)",
           ("by hand: a dict of unique keys", lambda: by_hand(ledgers)),
           ("attribute_shares (exact, in order)", lambda: attribute_shares("P", ledgers)),
           args.repeats, "context: see store.verify above")
    import dpaccount.spend as spend

    real = spend._embed
    spend._embed = lambda parent, children: None  # type: ignore[assignment]
    try:
        greedy = cpu(lambda: attribute_shares("P", ledgers))
    finally:
        spend._embed = real  # type: ignore[assignment]
    print(f"  slow sibling: the greedy fallback alone: {greedy:.3f} s")
    print(f"  (progress lines drawn: {drawn.getvalue().count(chr(13))})")


if __name__ == "__main__":
    main()
