"""Processes racing on one durable ledger never overspend, and kill -9 loses nothing.

16 processes x 50 charges of epsilon 1/100 against a budget of exactly 4 (400 charges):
exactly 400 are accepted, every run, on SQLite and PostgreSQL, and no storage error
(such as "database is locked") reaches a caller. Then writers are killed with SIGKILL in
the middle of charging, 20 times: the ledger opens, verifies, its cached totals equal the
sum of its records, no query_id is stored twice, and every answer a child "released"
(wrote to its side file after charge() returned) has its record in the ledger.

Nothing here depends on the machine's speed (docs/architecture.md, "Tests on a busy
machine"): a child is killed only after it has been seen charging (its side file holds a
released answer, waited for with a generous deadline), never after a fixed sleep.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from liveness import wait_for
from storage_helpers import pg_schema, pg_url, race

from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import BudgetExceededError, DPAccountError
from dpaccount.ledgers import open_ledger

pytestmark = pytest.mark.slow

CTX = multiprocessing.get_context("fork")
BUDGET = Budget(4)
COST = PrivacyCost("1/100")


def _race_worker(url: str, n: int, start: multiprocessing.synchronize.Event,
                 out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    accepted = refused = 0
    errors: list[str] = []
    try:
        acct = open_ledger(url, name="race", budget=BUDGET)
        start.wait()
        for i in range(n):
            try:
                acct.charge(COST, query_id=f"{os.getpid()}-{i}")
                accepted += 1
            except BudgetExceededError:
                refused += 1
            except DPAccountError as exc:  # any storage error is a failure of the test
                errors.append(f"{type(exc).__name__}: {exc}")
        acct.store.close()
    finally:
        out.put((accepted, refused, errors))


def _race(url: str, procs: int = 16, per_proc: int = 50) -> None:
    open_ledger(url, name="race", budget=BUDGET).store.close()
    results = race(_race_worker, [(url, per_proc)] * procs)
    errors = [e for _, _, errs in results for e in errs]
    assert errors == []
    assert sum(a for a, _, _ in results) == 400
    assert sum(r for _, r, _ in results) == procs * per_proc - 400
    acct = open_ledger(url, name="race", budget=BUDGET)
    assert len(acct.records) == 400
    assert acct.spent == PrivacyCost(4)
    assert acct.store.verify().epsilon_sum == Fraction(4)  # type: ignore[attr-defined]
    acct.store.close()


def test_sixteen_processes_sqlite(tmp_path: Path) -> None:
    _race(f"sqlite:///{tmp_path / 'race.db'}")


@pytest.fixture
def schema() -> Iterator[str]:
    yield from pg_schema()


def test_sixteen_processes_postgres(schema: str) -> None:
    _race(pg_url(schema))


def _kill_worker(url: str, side: str) -> None:
    acct = open_ledger(url, name="kill", budget=Budget(10**6))
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    i = 0
    while True:
        qid = f"{os.getpid()}-{i}"
        acct.charge(COST, query_id=qid)
        os.write(fd, f"{qid}\n".encode())  # the answer is "released" only now
        i += 1


def _released(side: str) -> set[str]:
    return set(Path(side).read_text().split()) if os.path.exists(side) else set()


def _charging(child: multiprocessing.process.BaseProcess, side: str) -> bool:
    """Whether ``child`` has released an answer; fails at once if it died first."""
    if _released(side):
        return True
    if not child.is_alive():
        pytest.fail(f"a writer ended (exit code {child.exitcode}) before it charged")
    return False


def _kill_loop(url: str, tmp_path: Path, rounds: int) -> None:
    rng = random.Random()
    open_ledger(url, name="kill", budget=Budget(10**6)).store.close()
    released: set[str] = set()
    for r in range(rounds):
        sides = [str(tmp_path / f"side-{r}-{k}.txt") for k in range(2)]
        children = [CTX.Process(target=_kill_worker, args=(url, s)) for s in sides]
        try:
            for c in children:
                c.start()
            # Liveness, waited for explicitly: each child has charged and released at
            # least once, so each kill below lands while it is charging.
            for c, s in zip(children, sides, strict=True):
                wait_for(lambda c=c, s=s: _charging(c, s), "a writer's first released charge")
            time.sleep(rng.uniform(0, 0.15))  # not a wait: a random point in the charges
        finally:
            for c in children:
                if c.pid is not None and c.exitcode is None:
                    os.kill(c.pid, signal.SIGKILL)
            for c in children:
                if c.pid is not None:
                    c.join()
        assert [c.exitcode for c in children] == [-signal.SIGKILL] * 2
        for s in sides:
            released |= _released(s)
        acct = open_ledger(url, name="kill", budget=Budget(10**6))  # verifies on open
        records = acct.records
        tip = acct.store.verify()  # type: ignore[attr-defined]
        # Fails if a kill tore a write: the cached head and sums must match the records.
        assert tip.head == len(records)
        assert tip.epsilon_sum == sum((x.cost.epsilon for x in records), Fraction(0))
        assert acct.spent.epsilon == tip.epsilon_sum
        stored = [x.query_id for x in records]
        assert len(set(stored)) == len(stored)  # fails if a charge was recorded twice
        # Fails if a charge that returned (its answer released) was lost with the kill.
        assert released <= set(stored), sorted(released - set(stored))[:5]
        acct.store.close()
    assert len(released) >= 2 * rounds  # every child was seen charging before its kill


def test_kill_nine_sqlite(tmp_path: Path) -> None:
    _kill_loop(f"sqlite:///{tmp_path / 'kill.db'}", tmp_path, rounds=20)


def test_kill_nine_postgres(schema: str, tmp_path: Path) -> None:
    _kill_loop(pg_url(schema), tmp_path, rounds=20)


FILTER_BUDGET = Budget(1, "1e-5")
FILTER_COST = PrivacyCost("0.02")


def _race_rule(url: str, rule: str, cost: object) -> None:
    """6 processes race on one ledger under ``rule``: exactly as many equal charges are
    admitted as one process admits alone (the reference, computed in memory)."""
    from dpaccount.accountant import Accountant

    alone = Accountant(FILTER_BUDGET, rule=rule)
    expected = 0
    while True:
        try:
            alone.charge(cost)  # type: ignore[arg-type]
        except BudgetExceededError:
            break
        expected += 1
    open_ledger(url, name="filters", budget=FILTER_BUDGET, rule=rule).store.close()
    results = race(_cost_worker, [(url, rule, cost, 40)] * 6)
    assert [e for _, errs in results for e in errs] == []
    assert sum(a for a, _ in results) == expected
    acct = open_ledger(url, name="filters", budget=FILTER_BUDGET, rule=rule)
    assert len(acct.records) == expected
    assert acct.spent == alone.spent
    acct.store.close()


@pytest.mark.parametrize("rule", ["filter", "rdp"])
def test_filters_decide_under_the_store_lock_sqlite(tmp_path: Path, rule: str) -> None:
    # a lost race is decided again under SQLite's write lock on the records as they are
    _race_rule(f"sqlite:///{tmp_path / 'filters.db'}", rule, FILTER_COST)


@pytest.mark.parametrize("rule", ["filter", "gdp"])
def test_filters_decide_under_the_row_lock_postgres(schema: str, rule: str) -> None:
    from dpaccount.charges import GaussianCharge

    cost = FILTER_COST if rule == "filter" else GaussianCharge(sigma=4, sensitivity=1,
                                                              epsilon="0.1")
    _race_rule(pg_url(schema), rule, cost)


def _cost_worker(url: str, rule: str, cost: object, n: int,
                 start: multiprocessing.synchronize.Event,
                 out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    accepted = 0
    errors: list[str] = []
    try:
        acct = open_ledger(url, name="filters", budget=FILTER_BUDGET, rule=rule)
        start.wait()
        for _ in range(n):
            try:
                acct.charge(cost)  # type: ignore[arg-type]
                accepted += 1
            except BudgetExceededError:
                pass
            except DPAccountError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        acct.store.close()
    finally:
        out.put((accepted, errors))


def _open_and_charge(url: str, start: multiprocessing.synchronize.Event,
                     out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    errors: list[str] = []
    try:
        start.wait()
        acct = open_ledger(url, name="fresh", budget=Budget(10**6, "0.5"), rule="filter")
        for _ in range(20):
            acct.charge(COST)
        acct.store.close()
    except DPAccountError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        out.put(errors)


def test_processes_opening_a_fresh_postgres_schema_at_once(schema: str) -> None:
    # Several processes create the same new schema and charge at once: the one that
    # waited for the schema lock must not re-run its DDL (that deadlocked with the
    # first one's charges).
    url = pg_url(schema)
    errors = [e for errs in race(_open_and_charge, [(url,)] * 6) for e in errs]
    assert errors == []
    acct = open_ledger(url, name="fresh", budget=Budget(10**6, "0.5"), rule="filter")
    assert len(acct.records) == 120
    acct.store.close()
