"""Durable ledger throughput: SQLite against the raw SQLite rate, PostgreSQL 1 vs 8 writers.

Run: ``python benchmarks/bench_storage.py [--pg URL] [--seconds S]``

1. SQLite: durable charges/s through ``Accountant`` + ``SQLiteStore`` and, in the same
   run and directory, the raw transaction rate (``BEGIN IMMEDIATE``; one ``INSERT``;
   ``COMMIT``; WAL, ``synchronous=FULL``). Goal: ratio >= 0.5. Two ledger rows: the
   basic rule decided by the store on its sums (``append_within``, what the Accountant
   uses for ``rule="basic"``) and compare-and-append (forced with a subclass of the
   basic rule, which the Accountant does not hand to the store).
2. PostgreSQL: charges/s with 1 and with 8 writer processes on one ledger, and 8
   writers on 8 ledgers (one per dataset). Rows ``within/<commit>``: the basic rule
   decided by the store (one server-side function call under the ledger row's lock;
   no lost races). Rows ``<locking>/<commit>``: compare-and-append with each locking
   mode of ``PostgresStore`` (conditional UPDATE, row lock, SERIALIZABLE). Commit modes:
   ``group`` (asynchronous commit + shared synchronous barrier) and ``sync``
   (synchronous commit under the row lock). Goal: 8 writers on one ledger faster than
   1. ``--modes within/group,conditional/group`` (comma-separated) restricts the rows;
   ``--no-sqlite`` skips part 1.
3. ``--filters``: 4 writer processes on one ledger for each rule (basic, filter, rdp,
   gdp), on SQLite and PostgreSQL, each run paired with the raw rate of 4 processes
   doing one-row transactions on the same database (raw, ledger, raw, alternating, at
   least 3 repeats; min and median of the ratio to the mean of the two raw runs around
   it). Basic is decided on the store's sums; every other rule by compare-and-append
   until writers meet, then under the store's lock (``append_decided``). Goal (issue
   16): ratio >= 0.5 for every rule. Each row also prints the CPU time per transaction,
   raw and ledger, per process (issue 27, item 6): the writers' own CPU
   (``time.process_time`` in each, over the timed loop) and, for PostgreSQL, their
   backends' (``/proc/<pid>/stat`` of each connection's ``pg_backend_pid()``); other
   processes on the machine (other benchmarks, other users) do not count, as they did
   in the machine-wide ``/proc/stat`` this part read before. PostgreSQL's background
   processes (WAL writer, checkpointer) are counted on neither side.

4. ``--guard REV``: what failing closed inside the deciding transaction costs per charge
   (issue 28, item 3): the code at git revision ``REV`` (before the checks) against the
   working tree, paired in one run: for SQLite and PostgreSQL, 1 writer and 4 on one
   ledger, the basic rule (decided by the store) and the filter (compare-and-append,
   then under the lock), ``before`` and ``after`` alternating (``--repeats`` pairs).
   Each writer is its own process, importing dpaccount from one tree or the other.
   Prints charges/s (median), the ratio after/before (median of the pairs' ratios) and
   the CPU per charge of the writer processes and of their PostgreSQL backends (per
   process, from ``time.process_time`` and ``/proc/<pid>/stat``).

Every ledger charge is durable when it returns, as every raw transaction is: SQLite
ledgers use the default ``commit="group"`` (one fsync of the WAL per charge, after the
write lock is released; the raw side fsyncs inside its ``COMMIT`` at
``synchronous=FULL``), PostgreSQL ledgers ``commit="group"`` (a synchronous barrier per
charge; the raw side commits synchronously).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from dpaccount.accountant import Accountant
from dpaccount.composition import BasicRule
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.storage.sqlite import SQLiteStore

COST = PrivacyCost("1/1000000")
MODES = ("within/group", "within/sync", "conditional/group", "conditional/sync",
         "row/group", "row/sync", "serializable/group", "serializable/sync")
BUDGET = Budget(10**9)


class CasBasic(BasicRule):
    """The basic rule under another class: the Accountant keeps compare-and-append."""


def rule_for(locking: str) -> BasicRule:
    """The plain basic rule for the ``within`` rows, the CAS-forcing subclass otherwise."""
    return BasicRule() if locking == "within" else CasBasic()


def raw_sqlite_rate(path: str, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    payload = "x" * 300
    start = time.perf_counter()
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (payload) VALUES (?)", (payload,))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def ledger_sqlite_rate(path: str, n: int, locking: str = "within") -> float:
    acct = Accountant(BUDGET, store=SQLiteStore(path, name="bench"), name="bench",
                      rule=rule_for(locking))
    start = time.perf_counter()
    for i in range(n):
        acct.charge(COST, label="q", query_id=f"q{i}")
    elapsed = time.perf_counter() - start
    acct.store.close()
    return n / elapsed


def _pg_writer(url: str, schema: str, name: str, mode: str, seconds: float,
               go: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from dpaccount.storage.postgres import PostgresStore

    locking, commit = mode.split("/")
    store = PostgresStore(url, name=name, schema=schema,
                          locking="conditional" if locking == "within" else locking,  # type: ignore[arg-type]
                          commit=commit)  # type: ignore[arg-type]
    acct = Accountant(BUDGET, store=store, name=name, rule=rule_for(locking))
    go.wait()
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        acct.charge(COST)
        done += 1
    store.close()
    out.put(done)


def pg_rate(url: str, writers: int, mode: str, seconds: float, separate: bool) -> float:
    import psycopg

    from dpaccount.storage.postgres import PostgresStore

    ctx = multiprocessing.get_context("fork")
    schema = f"dpacct_bench_{uuid.uuid4().hex[:8]}"
    names = [f"l{i}" if separate else "shared" for i in range(writers)]
    for name in set(names):
        Accountant(BUDGET, store=PostgresStore(url, name=name, schema=schema), name=name)
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_pg_writer, args=(url, schema, n, mode, seconds, go, out))
             for n in names]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every writer connect
    go.set()
    total: int = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="SQLite transactions per side")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=3.0, help="per PostgreSQL run")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="PostgreSQL rows as locking/commit, comma-separated")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite part")
    parser.add_argument("--filters", action="store_true",
                        help="only part 3: every rule with 4 processes, paired with raw")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--guard", metavar="REV",
                        help="only part 4: the fail-closed checks, against git revision REV")
    parser.add_argument("--worker", nargs=4, metavar=("URL", "RULE", "WRITERS", "TAG"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        guard_worker(*args.worker)
        return
    if args.guard:
        guard_part(args.guard, args.pg, args.seconds, args.repeats)
        return
    if args.filters:
        filters_part(args.pg, args.seconds, args.repeats)
        return
    if not args.no_sqlite:
        sqlite_part(args.n)
    pg_part(args.pg, args.seconds, args.modes.split(","))


def sqlite_part(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_sqlite_rate(os.path.join(tmp, "raw.db"), n)
        ours = ledger_sqlite_rate(os.path.join(tmp, "ledger.db"), n)
        cas = ledger_sqlite_rate(os.path.join(tmp, "cas.db"), n, locking="conditional")
        raw2 = raw_sqlite_rate(os.path.join(tmp, "raw2.db"), n)
    raw_mean = (raw + raw2) / 2
    print(f"SQLite raw BEGIN IMMEDIATE/INSERT/COMMIT (FULL, WAL): {raw_mean:9.0f} tx/s "
          f"(runs {raw:.0f}, {raw2:.0f})")
    print(f"SQLite Accountant + SQLiteStore, basic rule decided by the store (within): "
          f"{ours:9.0f} charges/s  ratio {ours / raw_mean:.2f}  (goal >= 0.50)")
    print(f"SQLite Accountant + SQLiteStore, compare-and-append:                       "
          f"{cas:9.0f} charges/s  ratio {cas / raw_mean:.2f}")


def pg_part(url: str, seconds: float, modes: list[str]) -> None:
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=3).close()
    except (ImportError, OSError) as exc:
        print(f"PostgreSQL skipped: {exc}")
        return
    except psycopg.Error as exc:
        print(f"PostgreSQL skipped: {exc}")
        return
    print(f"\nPostgreSQL, {seconds:g} s per run, charges/s:")
    print(f"{'locking/commit':<20}{'1 writer':>10}{'8 writers, 1 ledger':>22}{'ratio':>8}"
          f"{'8 writers, 8 ledgers':>23}{'ratio':>8}")
    for mode in modes:
        one = pg_rate(url, 1, mode, seconds, separate=False)
        shared = pg_rate(url, 8, mode, seconds, separate=False)
        spread = pg_rate(url, 8, mode, seconds, separate=True)
        print(f"{mode:<20}{one:10.0f}{shared:22.0f}{shared / one:8.2f}"
              f"{spread:23.0f}{spread / one:8.2f}", flush=True)


# -- part 3: every rule with 4 processes, paired with the raw rate -------------------

FILTER_BUDGET = Budget(10**9, "0.5")
WRITERS = 4


def _rule_charge(rule: str) -> object:
    from dpaccount.charges import GaussianCharge

    if rule == "gdp":
        return GaussianCharge(sigma=10**6, sensitivity=1, epsilon="0.001")
    return COST


def _raw_writer(kind: str, target: str, seconds: float, go: multiprocessing.synchronize.Event,
                out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Raw one-row transactions for ``seconds``; puts (count, client CPU s, server CPU s):
    this process's CPU and, for PostgreSQL, its backend's (``pg_backend_pid()``)."""
    payload = "x" * 300
    done = 0
    if kind == "sqlite":
        conn = sqlite3.connect(target, isolation_level=None, timeout=60)
        conn.execute("PRAGMA synchronous = FULL")
        go.wait()
        client = time.process_time()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (payload) VALUES (?)", (payload,))
            conn.execute("COMMIT")
            done += 1
        client = time.process_time() - client
        conn.close()
        out.put((done, client, 0.0))
        return
    import psycopg

    url, table = target.rsplit("#", 1)
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute("SELECT pg_backend_pid()").fetchone()
        backend = int(row[0]) if row else None
        go.wait()
        client, server = time.process_time(), _process_seconds(backend)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pg.execute(f"INSERT INTO {table} (payload) VALUES (%s)", (payload,))
            done += 1
        client, server = time.process_time() - client, _process_seconds(backend) - server
    out.put((done, client, server))


def _ledger_writer(url: str, rule: str, seconds: float, go: multiprocessing.synchronize.Event,
                   out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from dpaccount.ledgers import open_ledger

    acct = open_ledger(url, name="bench", budget=FILTER_BUDGET, rule=rule)
    if os.environ.get("BENCH_FORCE_CAS"):  # the compare-and-append path, for comparison
        acct._deciding_store = None
    charge = _rule_charge(rule)
    store: Any = acct.store
    backend = None
    if url.startswith("postgres"):  # the server process of this writer's connection
        row = store._connection().execute("SELECT pg_backend_pid()").fetchone()
        backend = int(row[0]) if row else None
    go.wait()
    client, server = time.process_time(), _process_seconds(backend)
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        acct.charge(charge)  # type: ignore[arg-type]
        done += 1
    client, server = time.process_time() - client, _process_seconds(backend) - server
    acct.store.close()
    out.put((done, client, server))


#: CPU microseconds per transaction of the last `_processes` run, summed over its writer
#: processes (client) and over their PostgreSQL backends (server; 0 for SQLite, which
#: runs in the writer). Per process, from ``time.process_time`` in each writer and
#: ``/proc/<pid>/stat`` of its backend: other processes on the machine do not count.
LAST_CPU_US: list[tuple[float, float]] = [(0.0, 0.0)]


def _processes(target: Callable[..., None], args: tuple[object, ...], seconds: float) -> float:
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, seconds, go, out))
             for _ in range(WRITERS)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    go.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    total = sum(done for done, _, _ in results)
    if total:
        LAST_CPU_US[0] = (sum(c for _, c, _ in results) / total * 1e6,
                          sum(s for _, _, s in results) / total * 1e6)
    return float(total) / seconds


def filters_part(pg: str, seconds: float, repeats: int) -> None:
    import statistics

    rules = ("basic", "filter", "rdp", "gdp")
    backends: list[tuple[str, Callable[[str], tuple[str, str]]]] = []
    with tempfile.TemporaryDirectory() as tmp:

        def sqlite_targets(tag: str) -> tuple[str, str]:
            raw = os.path.join(tmp, f"raw-{tag}.db")
            conn = sqlite3.connect(raw, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
            conn.close()
            return raw, f"sqlite:///{os.path.join(tmp, f'ledger-{tag}.db')}"

        backends.append(("sqlite", sqlite_targets))
        try:
            import psycopg

            psycopg.connect(pg, connect_timeout=3).close()

            def pg_targets(tag: str) -> tuple[str, str]:
                schema = f"dpacct_bench_{uuid.uuid4().hex[:8]}"
                with psycopg.connect(pg, autocommit=True) as conn:
                    conn.execute(f'CREATE SCHEMA "{schema}"')
                    conn.execute(f'CREATE TABLE "{schema}".t (id bigserial PRIMARY KEY, '
                                 "payload text NOT NULL)")
                sep = "&" if "?" in pg else "?"
                return f'{pg}#"{schema}".t', f"{pg}{sep}schema={schema}"

            backends.append(("postgres", pg_targets))
        except Exception as exc:  # no PostgreSQL here: SQLite only
            print(f"PostgreSQL skipped: {type(exc).__name__}")
        print(f"{WRITERS} processes, {seconds:g} s a run, {repeats} repeats; "
              "ratio = ledger / mean(raw before, raw after)")
        for backend, targets in backends:
            for rule in rules:
                ratios: list[float] = []
                rates: list[float] = []
                cpu_raw: list[tuple[float, float]] = []
                cpu_ours: list[tuple[float, float]] = []
                for i in range(repeats):
                    raw_target, url = targets(f"{rule}{i}")
                    kind = "sqlite" if backend == "sqlite" else "postgres"
                    before = _processes(_raw_writer, (kind, raw_target), seconds)
                    cpu_raw.append(LAST_CPU_US[0])
                    ours = _processes(_ledger_writer, (url, rule), seconds)
                    cpu_ours.append(LAST_CPU_US[0])
                    after = _processes(_raw_writer, (kind, raw_target), seconds)
                    cpu_raw.append(LAST_CPU_US[0])
                    ratios.append(ours / ((before + after) / 2))
                    rates.append(ours)
                raw_client = statistics.median(c for c, _ in cpu_raw)
                raw_server = statistics.median(s for _, s in cpu_raw)
                our_client = statistics.median(c for c, _ in cpu_ours)
                our_server = statistics.median(s for _, s in cpu_ours)
                cpu = (f"  CPU us per transaction, client + server: raw {raw_client:.0f} + "
                       f"{raw_server:.0f}, ledger {our_client:.0f} + {our_server:.0f} "
                       f"({(our_client + our_server) / (raw_client + raw_server):.1f}x)")
                print(f"  {backend:9s} {rule:7s} {statistics.median(rates):8.0f} charges/s  "
                      f"ratio to raw min {min(ratios):.2f} median "
                      f"{statistics.median(ratios):.2f} (goal >= 0.5){cpu}", flush=True)


# -- part 4: the fail-closed checks, before and after ---------------------------------------

GUARD_BUDGET = Budget(10**9, "0.5")


def guard_worker(url: str, rule: str, writers: str, tag: str) -> None:
    """One writer process of part 4: open the ledger, charge 3 times (the first charge
    pays one-off costs), say ``ready``, wait for ``go SECONDS`` on standard input, charge
    for that long, then print how many charges and the CPU seconds they took in this
    process and, for PostgreSQL, in its server process (read from ``/proc``)."""
    import sys

    from dpaccount.ledgers import open_ledger

    acct = open_ledger(url, name="bench", budget=GUARD_BUDGET, rule=rule)
    for _ in range(3):
        acct.charge(COST)
    store: Any = acct.store
    backend = store._connection().info.backend_pid if url.startswith("postgres") else None
    print("ready", flush=True)
    seconds = float(sys.stdin.readline().split()[1])
    client, server = time.process_time(), _process_seconds(backend)
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        acct.charge(COST)
        done += 1
    client, server = time.process_time() - client, _process_seconds(backend) - server
    acct.close()
    print(done, client, server, flush=True)


def _process_seconds(pid: int | None) -> float:
    """CPU seconds (user and system) process ``pid`` has used (0 for None)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _guard_run(tree: str, url: str, rule: str, writers: int, seconds: float
               ) -> tuple[float, float, float]:
    """Charges/s of ``writers`` processes importing dpaccount from ``tree``, and the CPU
    microseconds per charge in the writers and in their server processes."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": tree}
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", url, rule, str(writers),
         "w"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(writers)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"go {seconds}\n")
        proc.stdin.flush()
    total, client, server = 0, 0.0, 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        done, used, served = out.split()[-3:]
        total, client, server = total + int(done), client + float(used), server + float(served)
    return total / seconds, client / total * 1e6, server / total * 1e6


def guard_part(rev: str, pg: str, seconds: float, repeats: int) -> None:
    import statistics
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        before = os.path.join(tmp, "before")
        os.mkdir(before)
        archive = subprocess.run(["git", "-C", root, "archive", rev, "dpaccount"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        trees = {"before": before, "after": root}
        backends = ["sqlite"]
        try:
            import psycopg

            psycopg.connect(pg, connect_timeout=3).close()
            backends.append("postgres")
        except Exception as exc:  # no PostgreSQL here: SQLite only
            print(f"PostgreSQL skipped: {type(exc).__name__}")
        print(f"before = {rev}, after = the working tree; {seconds:g} s a run, {repeats} "
              "pairs (before, after alternating); median charges/s, ratio after/before "
              "(median of the pairs), CPU per charge of the writer processes and their "
              "server processes (median)")
        for backend in backends:
            for writers in (1, 4):
                for rule in ("basic", "filter"):
                    rates: dict[str, list[float]] = {"before": [], "after": []}
                    cpus: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
                    ratios = []
                    for i in range(repeats):
                        pair = {}
                        for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                            tag = f"{side}{i}{uuid.uuid4().hex[:6]}"
                            if backend == "sqlite":
                                url = f"sqlite:///{os.path.join(tmp, tag + '.db')}"
                            else:
                                sep = "&" if "?" in pg else "?"
                                url = f"{pg}{sep}schema=dpacct_bench_{tag}"
                            rate, client, server = _guard_run(trees[side], url, rule, writers,
                                                              seconds)
                            if backend == "postgres":
                                with psycopg.connect(pg, autocommit=True) as conn:
                                    conn.execute(
                                        f'DROP SCHEMA "dpacct_bench_{tag}" CASCADE')
                            pair[side] = rate
                            rates[side].append(rate)
                            cpus[side].append((client, server))
                        ratios.append(pair["after"] / pair["before"])

                    def cpu(side: str, cpus: dict[str, list[tuple[float, float]]] = cpus) -> str:
                        client = statistics.median(c for c, _ in cpus[side])
                        server = statistics.median(s for _, s in cpus[side])
                        return f"{client + server:5.0f} ({client:4.0f} + {server:4.0f})"

                    print(f"  {backend:9s} {writers} writer{'s' if writers > 1 else ' '} "
                          f"{rule:7s} {statistics.median(rates['before']):6.0f} -> "
                          f"{statistics.median(rates['after']):6.0f} charges/s  ratio "
                          f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
                          f"{max(ratios):.2f})  CPU us/charge, client + server: "
                          f"{cpu('before')} -> {cpu('after')}", flush=True)


if __name__ == "__main__":
    main()
