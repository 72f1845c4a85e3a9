"""Per-charge time of the in-memory accountant vs diffprivlib's BudgetAccountant.spend.

Both ledgers are pre-filled with N records (N = 10^2, 10^4, 10^6) and then timed on
further charges, in one run, on the same machine. Prints microseconds per charge and the
ratios. Goals (issue 2): dpaccount flat in N (10^6 within 1.5x of 10^2) and under
10 microseconds a charge.

Run: python benchmarks/bench_charge.py [--quick]
(needs the bench extra: pip install -e ".[bench]")
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from dpaccount import Accountant, Budget, PrivacyCost


def _load_diffprivlib() -> type | None:
    try:
        from diffprivlib.accountant import BudgetAccountant
    except ImportError:  # scikit-learn too new, or not installed
        return None
    return BudgetAccountant  # type: ignore[no-any-return]


def _per_call(fn: Callable[[], object], calls: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` microseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def bench_dpaccount(existing: int, calls: int) -> float:
    acct = Accountant(Budget(10**12))
    cost = PrivacyCost("0.01")  # diffprivlib's smallest non-zero epsilon
    for _ in range(existing):
        acct.charge(cost)
    return _per_call(lambda: acct.charge(cost), calls)


def bench_diffprivlib(cls: type, existing: int, calls: int) -> float:
    # A finite budget: diffprivlib short-circuits its check for (inf, 1).
    acc = cls(epsilon=1e12, delta=0.0)
    # Pre-fill its private list directly: filling through spend() is itself O(N^2).
    acc._BudgetAccountant__spent_budget.extend([(0.01, 0.0)] * existing)
    return _per_call(lambda: acc.spend(0.01, 0), calls, repeats=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip 10^6 for diffprivlib")
    args = parser.parse_args()
    dpl = _load_diffprivlib()
    print(f"{'records':>9} {'dpaccount us':>13} {'diffprivlib us':>15} "
          f"{'diffprivlib/dpaccount':>22}")
    base = None
    for exp in (2, 4, 6):
        existing = 10**exp
        ours = bench_dpaccount(existing, 20_000)
        base = base or ours
        if dpl is None:
            theirs_s, ratio_s = "n/a", "n/a"
        elif exp == 6 and args.quick:
            theirs_s, ratio_s = "skipped", "-"
        else:
            calls = {2: 2_000, 4: 50, 6: 3}[exp]
            theirs = bench_diffprivlib(dpl, existing, calls)
            theirs_s, ratio_s = f"{theirs:.1f}", f"{theirs / ours:.0f}x"
        print(f"{existing:>9,} {ours:>13.2f} {theirs_s:>15} {ratio_s:>22}")
        if exp == 6:
            print(f"\ndpaccount flatness: 10^6 / 10^2 = {ours / base:.2f} (goal <= 1.5); "
                  f"per charge {ours:.2f} us (goal < 10 us)")
    if dpl is None:
        print("diffprivlib not importable: pip install -e '.[bench]' (pins scikit-learn<1.6)")


if __name__ == "__main__":
    main()
