"""Waiting in tests without betting on the machine's speed.

The rule (docs/architecture.md, "Tests on a busy machine"): no test asserts on elapsed
time, on how much happened within a time window, or on how fast the machine is; the suite
must pass on a 2-core machine at a load of 30. A test that needs something to have
happened (a child process charging, a server listening, a thread waiting) polls for it
with `wait_for`. Its deadline, `LIVENESS_SECONDS`, is far beyond what any load reaches:
it only turns something that never happens into a failure instead of a hung run, so a
busy machine makes such a test slower, never red.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

#: The longest a test waits for something that takes well under a second on an idle
#: machine (a process starting and charging, a server answering): minutes, not seconds.
LIVENESS_SECONDS = 600.0

#: A hang guard for a test of code that must finish at once on hostile input (it once ran
#: for hours, computing a huge integer): after `LIVENESS_SECONDS` the run fails with
#: every thread's stack instead of stalling. The "thread" method also ends a hang inside
#: C code (an integer power), which a signal would wait for; it stops the whole run.
FINISHES = pytest.mark.timeout(LIVENESS_SECONDS, method="thread")


def wait_for(condition: Callable[[], T], what: str,
             timeout: float = LIVENESS_SECONDS) -> T:
    """Poll ``condition`` until it returns something true, and return that.

    ``condition`` may raise (``pytest.fail``) to stop waiting early, for instance when
    the process it waits for has died. Fails the test, naming ``what``, if ``timeout``
    seconds pass first.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"waited {timeout:g} s for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
