"""How writers of one SQLite ledger file take turns (the writers' gate) and make each
write durable (``commit="group"``: the WAL fsync'ed after the write lock is released)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from liveness import LIVENESS_SECONDS

from dpaccount import Budget, PrivacyCost
from dpaccount.errors import ConfigError, StorageError
from dpaccount.ledgers import open_ledger
from dpaccount.storage.sqlite import SQLiteStore
from dpaccount.storage.sqlite.gate import WriterGate

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="the gate is POSIX-only"),
    # JAX (imported by the integration tests earlier in the run) warns at every fork;
    # these children never touch JAX.
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
]

# Generous: a deadline that a working gate meets by orders of magnitude, on a busy
# machine too (liveness.LIVENESS_SECONDS). The short deadlines below (0.05 s) are only
# given to a gate that is held throughout, so they expire whatever the load.
SOON = LIVENESS_SECONDS


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def test_the_gate_is_a_private_hidden_fifo_beside_the_file(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db", name="L")
    assert sorted(p.name for p in tmp_path.glob("l.db*")) == ["l.db", "l.db-shm", "l.db-wal"]
    mode = os.stat(tmp_path / ".l.db-writers").st_mode
    assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) & 0o077 == 0
    store.close()


def test_no_gate_for_memory_read_only_or_a_file_in_its_place(tmp_path: Path) -> None:
    assert WriterGate.beside(":memory:") is None
    (tmp_path / ".x.db-writers").write_text("not a fifo")
    assert WriterGate.beside(str(tmp_path / "x.db")) is None
    os.mkfifo(tmp_path / "elsewhere")
    (tmp_path / ".y.db-writers").symlink_to(tmp_path / "elsewhere")
    assert WriterGate.beside(str(tmp_path / "y.db")) is None  # never through a symlink
    acct = open_ledger(f"sqlite:///{tmp_path / 'x.db'}", name="L", budget=Budget(1))
    acct.charge(PrivacyCost("0.5"))  # still a working ledger, without a gate
    assert acct.store._gate is None  # type: ignore[attr-defined]
    acct.store.close()
    reader = SQLiteStore(tmp_path / "x.db", name="L", read_only=True)
    assert reader._gate is None
    reader.close()


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[tuple[WriterGate, WriterGate]]:
    """Two writers' gates of one file (as two processes would hold them)."""
    a = WriterGate.beside(str(tmp_path / "g.db"))
    b = WriterGate.beside(str(tmp_path / "g.db"))
    assert a is not None and b is not None
    yield a, b
    a.close()
    b.close()


def test_one_holder_at_a_time_reentrant_and_bounded(
    gates: tuple[WriterGate, WriterGate],
) -> None:
    a, b = gates
    assert a.enter(_deadline(SOON))
    assert a.enter(_deadline(SOON))  # re-entrant
    a.leave()
    started = time.monotonic()
    assert not b.enter(_deadline(0.05))  # still held once: b gives up at its deadline
    assert time.monotonic() - started >= 0.05
    a.leave()
    assert b.enter(_deadline(SOON))
    assert not a.enter(_deadline(0.01))
    b.leave()


class _Watched:
    """A gate's poller that tells when its gate has started waiting."""

    def __init__(self, poller: Any) -> None:
        self.poller = poller
        self.waiting = threading.Event()

    def poll(self, milliseconds: float) -> Any:
        self.waiting.set()
        return self.poller.poll(milliseconds)


def test_a_waiter_is_woken_when_the_holder_leaves(
    gates: tuple[WriterGate, WriterGate],
) -> None:
    a, b = gates
    assert a.enter(_deadline(SOON))
    watched = _Watched(b._poll)  # type: ignore[attr-defined]
    b._poll = watched  # type: ignore[attr-defined]
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(b.enter(_deadline(SOON))))
    waiter.start()
    # Waited for explicitly (a fixed sleep let a slow thread start after the holder left,
    # and the test pass without a waiter): b found the gate taken and waits on the FIFO.
    assert watched.waiting.wait(SOON)
    assert got == []  # waiting while a holds the gate
    a.leave()
    waiter.join(SOON)
    assert got == [True]
    b.leave()


def _hold_gate(path: str, ready: Any) -> None:
    gate = WriterGate.beside(path)
    assert gate is not None and gate.enter(_deadline(SOON))
    ready.set()
    while True:  # holds the gate until killed (a fixed sleep could end first)
        time.sleep(3600)


def test_a_holder_that_dies_frees_the_gate(tmp_path: Path) -> None:
    path = str(tmp_path / "g.db")
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_gate, args=(path, ready))
    holder.start()
    try:
        assert ready.wait(SOON)
        mine = WriterGate.beside(path)
        assert mine is not None
        assert not mine.enter(_deadline(0.05))
    finally:
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    assert holder.exitcode == -signal.SIGKILL
    assert mine.enter(_deadline(SOON))  # the kernel dropped the dead holder's lock
    mine.leave()
    mine.close()


def _child_enters(path: str, gate: WriterGate, out: Any) -> None:
    # The forked child dropped the parent's descriptor (and so its turn): it waits.
    out.put(gate.enter(_deadline(0.05)))


def test_a_forked_child_does_not_inherit_the_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "g.db")
    gate = WriterGate.beside(path)
    assert gate is not None and gate.enter(_deadline(SOON))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_enters, args=(path, gate, out))
    child.start()
    assert out.get(timeout=SOON) is False
    child.join(SOON)
    gate.leave()
    gate.close()


def test_a_writer_blocked_at_the_gate_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    acct = open_ledger(f"sqlite:///{path}?lock_timeout=0.2", name="L", budget=Budget(1))
    other = WriterGate.beside(str(path))
    assert other is not None and other.enter(_deadline(SOON))
    with pytest.raises(StorageError, match="could not lock"):
        acct.charge(PrivacyCost("0.1"))
    other.leave()
    other.close()
    assert acct.store.head() == 0  # nothing was written
    acct.charge(PrivacyCost("0.1"))
    assert acct.store.head() == 1
    acct.store.close()


@pytest.mark.parametrize(("commit", "level"), [("group", 1), ("sync", 2)])
def test_commit_modes_set_synchronous(tmp_path: Path, commit: str, level: int) -> None:
    acct = open_ledger(f"sqlite:///{tmp_path / 'l.db'}?commit={commit}", name="L",
                       budget=Budget(1))
    conn = acct.store._conn  # type: ignore[attr-defined]
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
    acct.store.close()


def test_an_unknown_commit_mode_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="commit mode"):
        open_ledger(f"sqlite:///{tmp_path / 'l.db'}?commit=later", name="L", budget=Budget(1))
    with pytest.raises(ConfigError, match="commit mode"):
        SQLiteStore(tmp_path / "l.db", commit="never")  # type: ignore[arg-type]


def test_group_commit_flushes_the_wal_after_the_locks_are_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "l.db"
    acct = open_ledger(f"sqlite:///{path}", name="L", budget=Budget(10))
    seen: list[tuple[bool, bool, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        # At the flush, another connection can take SQLite's write lock and another
        # writer the gate: neither is held through the disk's flush.
        probe = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            free = True
        except sqlite3.OperationalError:
            free = False
        probe.close()
        gate = WriterGate.beside(str(path))
        assert gate is not None
        gate_free = gate.enter(_deadline(0))
        if gate_free:
            gate.leave()
        gate.close()
        wal = os.fstat(fd).st_ino == os.stat(f"{path}-wal").st_ino
        seen.append((free, gate_free, int(wal)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for _ in range(3):
        acct.charge(PrivacyCost("0.1"))
    assert seen == [(True, True, 1)] * 3  # one flush of the WAL per charge, locks free
    acct.store.close()


def test_sync_commit_leaves_the_flush_to_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acct = open_ledger(f"sqlite:///{tmp_path / 'l.db'}?commit=sync", name="L", budget=Budget(1))
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    acct.charge(PrivacyCost("0.1"))
    assert calls == []
    acct.store.close()


def test_a_failed_flush_keeps_the_charge_and_stops_the_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = open_ledger(url, name="L", budget=Budget(1))

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    ran: list[int] = []
    with pytest.raises(StorageError, match="could not be flushed"):
        acct.charge(PrivacyCost("0.25"))
        ran.append(1)
    monkeypatch.undo()
    assert ran == []
    acct.store.close()
    again = open_ledger(url, name="L", budget=Budget(1))
    assert again.spent == PrivacyCost("0.25")  # committed: counted, never refunded
    again.store.close()


def test_a_relative_path_keeps_its_wal_and_gate_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore("rel.db", name="L")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    flushed: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        flushed.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert store._gate is not None and store._gate.path == str(tmp_path / ".rel.db-writers")
    from dpaccount.charges import Relation
    from dpaccount.records import LedgerMeta

    with pytest.raises(StorageError, match="deleted or replaced"):  # fails closed, as before
        store.initialize(LedgerMeta.build("L", Budget(1), {"name": "basic"},
                                          Relation.ADD_REMOVE))
    store._flush_wal()  # the WAL it opens is the file's own, wherever the process is
    assert flushed == [os.stat(tmp_path / "rel.db-wal").st_ino]
    store.close()
