"""Threads racing on one in-memory ledger never overspend and never refuse early."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from fractions import Fraction

import pytest

from dpaccount import Accountant, Budget, BudgetExceededError, PrivacyCost


@pytest.fixture(autouse=True)
def _fast_switching() -> Iterator[None]:
    # Switch threads every microsecond so that check-then-write races would show.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _hammer(acct: Accountant, cost: PrivacyCost, tries: int, threads: int) -> list[int]:
    accepted = [0] * threads
    start = threading.Barrier(threads)

    def worker(i: int) -> None:
        start.wait()
        for _ in range(tries):
            try:
                acct.charge(cost)
            except BudgetExceededError:
                # A refusal is only allowed when the remaining budget cannot pay.
                assert not cost.fits(acct.remaining)
            else:
                accepted[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return accepted


@pytest.mark.parametrize("run", range(3))
def test_eight_threads_admit_exactly_the_budget(run: int) -> None:
    unit = PrivacyCost(Fraction(1, 7), Fraction(1, 10**9))
    acct = Accountant(Budget(Fraction(300, 7), Fraction(300, 10**9)))
    accepted = _hammer(acct, unit, tries=100, threads=8)
    assert sum(accepted) == 300
    assert len(acct.records) == 300
    assert acct.spent == PrivacyCost(Fraction(300, 7), Fraction(300, 10**9))


def test_mixed_costs_never_overspend() -> None:
    budget = Budget("5")
    acct = Accountant(budget)
    big, small = PrivacyCost("0.3"), PrivacyCost("0.01")
    threads = [threading.Thread(target=_hammer, args=(acct, c, 50, 1)) for c in (big, small) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum((r.cost for r in acct.records), PrivacyCost(0))
    assert total == acct.spent and total.fits(budget)
    # nothing is left that the small charge could still pay for
    assert not small.fits(acct.remaining)
