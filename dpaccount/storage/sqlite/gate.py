"""The writers' gate of a SQLite ledger file: dpaccount's writers take turns at the
write lock without sleeping through each other's turns.

SQLite's own wait for a busy write lock sleeps in steps of 1, 2, 5, ... milliseconds,
while a dpaccount append holds the lock for about a tenth of a millisecond. Writers of one
file in several processes therefore spend most of their time asleep while the lock is
free. The gate is a FIFO beside the database (``.<file>-writers``, hidden, mode 0600):

- a writer takes an exclusive ``flock`` on it before ``BEGIN IMMEDIATE`` (the kernel
  drops the lock of a process that dies, so a crash never blocks the others);
- a writer that finds it taken waits in ``poll`` on the FIFO, with a timeout, so every
  wait stays within the store's ``lock_timeout``;
- a writer that leaves writes one byte to the FIFO, which wakes the waiters at once.

The gate only orders dpaccount's writers; SQLite's write lock still decides what may be
written (other programs writing the file are waited for by SQLite's busy handling as
before). Where no FIFO can be made (an in-memory database, a directory that refuses it,
Windows) or the path holds something else (a file of another kind, a symlink), there
is no gate and writers wait as SQLite lets them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import stat
import sys
import time
import weakref
from typing import Any

if sys.platform != "win32":
    import fcntl

__all__ = ["WriterGate"]

_log = logging.getLogger(__name__)

#: The longest a waiter sleeps before it looks at the lock again (a wake-up byte can be
#: read by another waiter, or lost with a writer that died while holding the gate).
_POLL_SECONDS = 0.002

_GATES: weakref.WeakSet[WriterGate] = weakref.WeakSet()


class WriterGate:
    """An exclusive, process-crossing turn for the writers of one SQLite file.

    Not thread-safe on its own: the store takes its thread lock first (``flock`` does not
    exclude two threads that share one descriptor).
    """

    def __init__(self, path: str) -> None:
        #: The FIFO beside the database file, hidden: ``cp ledger.db*`` would block
        #: reading it (a FIFO without a writer never ends).
        folder, name = os.path.split(path)
        self.path = os.path.join(folder, f".{name}-writers")
        self._fd: int | None = None
        self._poll: Any = None  # a select.poll watching the FIFO for wake-ups
        self._depth = 0
        _GATES.add(self)

    @classmethod
    def beside(cls, path: str) -> WriterGate | None:
        """The gate of the database file at ``path``, or None where none can be made."""
        if sys.platform == "win32" or path == ":memory:":
            return None
        gate = cls(path)
        return gate if gate._open() is not None else None

    def _open(self) -> int | None:
        if self._fd is not None:
            return self._fd
        try:
            os.mkfifo(self.path, 0o600)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            # Never through a symlink (it could name a device), never blocking on open.
            fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)  # a file of another kind in its place: do without a gate
            return None
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        return fd

    def enter(self, deadline: float) -> bool:
        """Take the gate, waiting until ``deadline`` (``time.monotonic()``) at most.
        Re-entrant. Returns whether it was taken."""
        if self._depth:
            self._depth += 1
            return True
        fd = self._open()
        if fd is None:
            return False
        waiting_since = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting_since is None:
                    waiting_since = time.monotonic()
            else:
                self._drain(fd)  # wake-ups sent while nobody waited are stale
                self._depth = 1
                if waiting_since is not None:
                    _log.debug("waited %.1f ms for the SQLite writers' gate",
                               (time.monotonic() - waiting_since) * 1000)
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                _log.debug("gave up waiting for the SQLite writers' gate (lock_timeout)")
                return False
            if self._poll.poll(min(left, _POLL_SECONDS) * 1000):  # (no FD_SETSIZE limit)
                self._drain(fd)

    def leave(self) -> None:
        """Give the gate back and wake a waiter."""
        self._depth -= 1
        if self._depth or self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        try:
            os.write(self._fd, b"\0")
        except OSError as exc:  # a full FIFO already holds a wake-up
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise

    @staticmethod
    def _drain(fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 4096)

    def close(self) -> None:
        """Close the descriptor (the FIFO stays for the file's other writers)."""
        fd, self._fd, self._depth = self._fd, None, 0
        if fd is not None:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: drop the parent's descriptor (reopened on the next turn)."""
        fd, self._fd, self._depth = self._fd, None, 0
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _after_fork_in_child() -> None:
    for gate in list(_GATES):
        gate._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
