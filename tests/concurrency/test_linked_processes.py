"""Sub-budgets and block windows across processes, and under kill -9, on SQLite and
PostgreSQL: no ledger of a tree or a window is ever overspent, and a charge is in all of
its ledgers or in none.

Nothing here depends on the machine's speed (docs/architecture.md, "Tests on a busy
machine"): a child is killed only after it has been seen charging, waited for with a
generous deadline, never after a fixed sleep; the races count outcomes, never time.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from liveness import wait_for
from storage_helpers import pg_schema, pg_url, race

from dpaccount.budgets import BlockLedgers
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import BudgetExceededError, DPAccountError
from dpaccount.ledgers import open_ledger

pytestmark = pytest.mark.slow

CTX = multiprocessing.get_context("fork")
STEP = PrivacyCost("1/10")
BLOCKS = [f"b{i}" for i in range(5)]


@pytest.fixture
def schema() -> Iterator[str]:
    yield from pg_schema()


def _tree(url: str) -> None:
    open_ledger(url, name="root", budget=Budget(2)).close()
    for i in range(4):
        open_ledger(url, name=f"root/t{i}", budget=Budget(1), parent="root").close()


def _tree_worker(url: str, team: int, start: Any, out: Any) -> None:
    accepted, errors = 0, []
    try:
        acct = open_ledger(url, name=f"root/t{team}")  # by name: the parent is stored
        start.wait()
        for i in range(15):
            try:
                acct.charge(STEP, query_id=f"t{team}-{i}")
                accepted += 1
            except BudgetExceededError:
                pass
            except DPAccountError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        acct.close()
    finally:
        out.put((accepted, errors))


def _ids(url: str, name: str) -> list[str]:
    with open_ledger(url, name=name, read_only=True, verify="full") as acct:
        return [str(r.query_id) for r in acct.records]


def _race_tree(url: str) -> None:
    _tree(url)
    results = race(_tree_worker, [(url, team) for team in range(4)])
    assert [e for _, errs in results for e in errs] == []
    assert sum(a for a, _ in results) == 20  # the parent's 2 = 20 charges, exactly
    root = _ids(url, "root")
    assert len(root) == 20
    teams = [_ids(url, f"root/t{t}") for t in range(4)]
    assert all(len(ids) <= 10 for ids in teams)
    assert sorted(root) == sorted(i for ids in teams for i in ids)
    with open_ledger(url, name="root") as acct:
        assert acct.spent == PrivacyCost(2)


def _window(rng: random.Random) -> list[str]:
    first = rng.randrange(len(BLOCKS))
    return BLOCKS[first:first + rng.randint(1, 3)]


def _blocks_worker(url: str, seed: int, start: Any, out: Any) -> None:
    accepted, errors = 0, []
    rng = random.Random(seed)
    try:
        blocks = BlockLedgers(url, "events", budget_per_block=Budget(1))
        start.wait()
        for i in range(20):
            window = _window(rng)
            try:
                blocks.charge(PrivacyCost("1/4"), window,
                              query_id=f"{seed}-{i}:{','.join(window)}")
                accepted += 1
            except BudgetExceededError:
                pass
            except DPAccountError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        blocks.close()
    finally:
        out.put((accepted, errors))


def _check_windows(url: str) -> dict[str, list[str]]:
    """Every charge is in every block of its window or in none; no block overspent."""
    held = {b: _ids(url, f"events/{b}") if _exists(url, f"events/{b}") else []
            for b in BLOCKS}
    for block, ids in held.items():
        for query_id in ids:
            window = query_id.split(":", 1)[1].split(",")
            assert block in window
            for other in window:
                assert query_id in held[other], (query_id, other)
    return held


def _exists(url: str, name: str) -> bool:
    try:
        open_ledger(url, name=name, read_only=True).close()
    except DPAccountError:
        return False
    return True


def _race_blocks(url: str) -> None:
    BlockLedgers(url, "events", budget_per_block=Budget(1)).close()
    results = race(_blocks_worker, [(url, seed) for seed in range(4)])
    assert [e for _, errs in results for e in errs] == []
    held = _check_windows(url)
    assert all(len(ids) <= 4 for ids in held.values())  # 4 x 1/4 = each block's budget
    assert sum(a for a, _ in results) == len({i for ids in held.values() for i in ids})
    assert max(len(ids) for ids in held.values()) == 4  # the race did reach the budgets


def test_sub_budgets_race_sqlite(tmp_path: Path) -> None:
    _race_tree(f"sqlite:///{tmp_path / 'tree.db'}")


def test_sub_budgets_race_postgres(schema: str) -> None:
    _race_tree(pg_url(schema))


def test_block_windows_race_sqlite(tmp_path: Path) -> None:
    _race_blocks(f"sqlite:///{tmp_path / 'blocks.db'}")


def test_block_windows_race_postgres(schema: str) -> None:
    _race_blocks(pg_url(schema))


def _kill_worker(url: str, side: str) -> None:
    rng = random.Random(os.getpid())
    team = open_ledger(url, name="root/t0")
    blocks = BlockLedgers(url, "events", budget_per_block=Budget(10**6))
    i = 0
    while True:
        window = _window(rng)
        query_id = f"{os.getpid()}-{i}:{','.join(window)}"
        blocks.charge(PrivacyCost("1/1000"), window, query_id=query_id)
        team.charge(PrivacyCost("1/1000"), query_id=f"team-{query_id}")
        with open(side, "a") as stream:  # released only after both charges returned
            stream.write(query_id + "\n")
            stream.flush()
        i += 1


def _released(side: Path) -> list[str]:
    return side.read_text().split() if side.exists() else []


def _charging(child: multiprocessing.process.BaseProcess, side: Path) -> bool:
    """Whether ``child`` has released an answer; fails at once if it died first."""
    if _released(side):
        return True
    if not child.is_alive():
        pytest.fail(f"a writer ended (exit code {child.exitcode}) before it charged")
    return False


def _kill_loop(url: str, tmp_path: Path, rounds: int) -> None:
    open_ledger(url, name="root", budget=Budget(10**6)).close()
    open_ledger(url, name="root/t0", budget=Budget(10**6), parent="root").close()
    BlockLedgers(url, "events", budget_per_block=Budget(10**6)).close()
    released: list[str] = []
    for r in range(rounds):
        side = tmp_path / f"released-{r}.txt"
        child = CTX.Process(target=_kill_worker, args=(url, str(side)))
        try:
            child.start()
            # Liveness, waited for explicitly: the child has made both charges of a query
            # and released it, so the kill below lands while it is charging (it used to
            # sleep a fixed time, and on a busy machine killed children still opening).
            wait_for(lambda c=child, s=side: _charging(c, s), "a writer's first released query")
            time.sleep(random.uniform(0, 0.3))  # not a wait: a random point in the charges
        finally:
            if child.pid is not None:
                if child.exitcode is None:
                    os.kill(child.pid, signal.SIGKILL)
                child.join()
        assert child.exitcode == -signal.SIGKILL
        released += _released(side)
    # Every ledger opens and verifies in full; fails if a charge of a window is in some
    # of its blocks but not all, or a released query is missing from one of them.
    held = _check_windows(url)
    for query_id in released:
        for block in query_id.split(":", 1)[1].split(","):
            assert query_id in held[block]
    team, root = _ids(url, "root/t0"), _ids(url, "root")
    assert sorted(team) == sorted(root)  # a sub-budget charge is in both or in neither
    assert len(set(team)) == len(team)  # and never twice
    assert {f"team-{q}" for q in released} <= set(team)
    assert len(released) >= rounds  # every child was seen charging before its kill


def test_kill_nine_sub_budgets_and_windows_sqlite(tmp_path: Path) -> None:
    _kill_loop(f"sqlite:///{tmp_path / 'kill.db'}", tmp_path, rounds=8)


def test_kill_nine_sub_budgets_and_windows_postgres(schema: str, tmp_path: Path) -> None:
    _kill_loop(pg_url(schema), tmp_path, rounds=8)
