"""Per-charge time of the in-memory accountant vs diffprivlib's BudgetAccountant.spend,
and of every kind of charge a mechanism produces against a PrivacyCost charge.

Part 1: both ledgers are pre-filled with N records (N = 10^2, 10^4, 10^6) and then
timed on further charges, in one run, on the same machine. Prints microseconds per
charge and the ratios. Goals (issue 2): dpaccount flat in N (10^6 within 1.5x of 10^2)
and under 10 microseconds a charge.

Part 2 (issue 16): microseconds per charge of each mechanism's charge (the same object
charged again and again, as a mechanism does), under the rule such a ledger uses, and
the ratio to a PrivacyCost charge in the same run (min and median of 5 repeats). Goal:
every ratio within 2. Beside the reused GaussianCharge, its slow sibling: a fresh
GaussianCharge of a distinct float sigma each charge (its cost computed each time; see
``bench_rules.py`` for every rule with run-time parameters).

All times are CPU time (``time.process_time``), not wall clock: the work is
single-threaded, and on a loaded machine wall clock counts the other processes (this
benchmark once failed its own flatness goal that way while its CPU time was flat).

Part 3 (issue 29, ``--logging``): the cost of the charge path's logging. The same charge
(a PrivacyCost with a label, basic rule) through ``Accountant.charge`` with no handler
attached (the default: the package's NullHandler only), against the method as it was
before (the same steps, without logging: a subclass with the old body), alternated in one
run; and, as the slow sibling, ``charge`` with a do-nothing handler listening at INFO
(every record built and formatted). CPU time, min of the repeats. Goal: the no-handler
ratio within 1.03.

Run: python benchmarks/bench_charge.py [--quick] [--kinds-only] [--logging]
(needs the bench extra: pip install -e ".[bench]")
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator

from dpaccount import Accountant, Budget, PrivacyCost


def _load_diffprivlib() -> type | None:
    try:
        from diffprivlib.accountant import BudgetAccountant
    except ImportError:  # scikit-learn too new, or not installed
        return None
    return BudgetAccountant  # type: ignore[no-any-return]


def _per_call(fn: Callable[[], object], calls: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` microseconds per call."""
    return _timings(fn, calls, repeats)[0]


def _timings(fn: Callable[[], object], calls: int, repeats: int = 5) -> tuple[float, float]:
    """(min, median) over ``repeats`` of CPU microseconds per call (``time.process_time``:
    the work is single-threaded, and wall clock counts whatever else the machine runs)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e6)
    times.sort()
    return times[0], times[len(times) // 2]


def bench_kinds(calls: int = 5000) -> None:
    """Each mechanism's charge against a PrivacyCost charge, same rule, same run."""
    from dpaccount import (
        ExponentialMechanism,
        GaussianMechanism,
        LaplaceMechanism,
        RandomizedResponseMechanism,
        dpsgd_step_charge,
    )
    from dpaccount.accounting.pld import PLDRule
    from dpaccount.charges import GaussianCharge, cost_of

    step = dpsgd_step_charge(sampling_rate=0.004, noise_multiplier=1.1, epsilon=20)
    kinds: list[tuple[str, object, Callable[[], Accountant]]] = [
        ("PrivacyCost (baseline)", PrivacyCost("0.01"),
         lambda: Accountant(Budget(10**12, "0.9"))),
        ("GaussianCharge", GaussianCharge(sigma=500, sensitivity=1, epsilon="0.1"),
         lambda: Accountant(Budget(10**12, "0.9"))),
        ("LaplaceMechanism", LaplaceMechanism(1e-6, 1),
         lambda: Accountant(Budget(10**12, "0.9"))),
        ("GaussianMechanism", GaussianMechanism(1, 1e-12, 1),
         lambda: Accountant(Budget(10**12, "0.9"))),
        ("ExponentialMechanism", ExponentialMechanism("0.001", 1),
         lambda: Accountant(Budget(10**12, "0.9"))),
        ("RandomizedResponseMechanism", RandomizedResponseMechanism("0.001", 4),
         lambda: Accountant(Budget(10**12, "0.9"))),
        ("PrivacyCost equal to the step's cost", cost_of(step),
         lambda: Accountant(Budget(10**12, "0.999999"))),
        ("DP-SGD step, basic rule", step, lambda: Accountant(Budget(10**12, "0.999999"))),
        ("PrivacyCost, pld rule (same plan shape)", PrivacyCost("0.01"),
         lambda: Accountant(Budget(10**6, "1e-5"),
                            rule=PLDRule([(PrivacyCost("0.01"), 10**7)], "1e-5"))),
        ("DP-SGD step, pld rule (TrainingLedger)", step,
         lambda: Accountant(Budget(10**6, "1e-5"), rule=PLDRule([(step, 10**7)], "1e-5"))),
    ]
    import random

    rng = random.Random(27)  # benchmark workload only; not privacy noise
    fresh = iter([GaussianCharge(sigma=500 + rng.random(), sensitivity=1, epsilon="0.1")
                  for _ in range(calls * 5)])
    kinds.insert(2, ("GaussianCharge, fresh sigma each charge", fresh,
                     lambda: Accountant(Budget(10**12, "0.9"))))
    print(f"\n{'charge':40s} {'min us':>8} {'median us':>10} {'min / baseline':>15} "
          f"{'/ same rule':>12}")
    base = same_rule = None
    for name, charge, make in kinds:
        acct = make()
        if isinstance(charge, Iterator):  # a new charge object each call
            low, median = _timings(lambda a=acct, c=charge: a.charge(next(c)), calls)
        else:
            low, median = _timings(lambda a=acct, c=charge: a.charge(c), calls)
        base = base or low
        if name.startswith("PrivacyCost, pld rule"):
            same_rule = low
        versus = low / same_rule if same_rule and "pld rule" in name else low / base
        print(f"{name:40s} {low:8.2f} {median:10.2f} {low / base:15.2f} {versus:12.2f}")
    print("goal: every ratio within 2 (min / baseline: against a PrivacyCost under the basic "
          "rule; / same rule: against a PrivacyCost under the same rule), for the charges "
          "reused as a mechanism reuses its own; the fresh-sigma row is their slow sibling")


def bench_logging(calls: int = 20_000, repeats: int = 9) -> None:
    """Part 3: ``charge`` with no handler, vs the method as it was, vs a listener."""
    import logging

    from dpaccount.accountant import charge_jointly, check_text, revalidate
    from dpaccount.charges import cost_of

    class Unlogged(Accountant):
        """Accountant.charge as it was before issue 29, verbatim (no logging)."""

        def charge(self, charge: object, *, label: str | None = None,
                   query_id: str | None = None) -> object:  # type: ignore[override]
            if self._parents:
                return charge_jointly([self, *self._parents], charge, label=label,
                                      query_id=query_id)[0]
            charge = self.as_charge(charge)
            cost = cost_of(charge)
            revalidate(cost)
            check_text(label, "label")
            check_text(query_id, "query_id")
            return self.append(charge, cost, label, query_id)

    cost = PrivacyCost("0.01")
    quiet, heard = Accountant(Budget(10**12), name="a"), Accountant(Budget(10**12), name="c")
    by_hand = Unlogged(Budget(10**12), name="b")

    def unlogged() -> object:
        return by_hand.charge(cost, label="count")

    class Discard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            self.format(record)

    logger = logging.getLogger("dpaccount")
    level = logger.level
    results: dict[str, list[float]] = {"charge, no handler": [], "before (no logging)": [],
                                       "charge, a handler at INFO": []}
    for _ in range(repeats):  # alternated, so drift on a shared machine hits all alike
        results["charge, no handler"].append(
            _per_call(lambda: quiet.charge(cost, label="count"), calls, 1))
        results["before (no logging)"].append(_per_call(unlogged, calls, 1))
        handler = Discard()
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            results["charge, a handler at INFO"].append(
                _per_call(lambda: heard.charge(cost, label="count"), calls // 4, 1))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
    base = min(results["before (no logging)"])
    print(f"\n{'path (basic rule, PrivacyCost)':34s} {'min us':>8} {'/ before':>10}")
    for name, times in results.items():
        print(f"{name:34s} {min(times):8.2f} {min(times) / base:10.3f}")
    print("goal: 'charge, no handler' / 'before' within 1.03")


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
    parser.add_argument("--kinds-only", action="store_true", help="only part 2")
    parser.add_argument("--logging", action="store_true", help="only part 3")
    args = parser.parse_args()
    if args.logging:
        bench_logging()
        return
    if args.kinds_only:
        bench_kinds()
        return
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
    bench_kinds()


if __name__ == "__main__":
    main()
