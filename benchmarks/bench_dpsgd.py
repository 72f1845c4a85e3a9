"""DP-SGD: epsilon and noise calibration, dpaccount beside Opacus and dp_accounting.

Run (after ``pip install torch==2.13.0 opacus -e ".[bench]"``)::

    .venv/bin/python benchmarks/bench_dpsgd.py [--repeats 3]

The workload is the issue's MNIST-sized run: q = 256/60000, 14,063 steps, delta = 1e-5;
epsilon at sigma = 1.1, and sigma calibrated for epsilon = 2. Every accountant runs in
the same process, imports are done before any timer starts, each measurement is
repeated (min / median printed), and the first ("cold") call of each is reported
separately from the warm ones. Times are CPU time (``time.process_time``).

dpaccount memoises the Renyi curves of a charge (``functools.lru_cache`` in
``accounting.rdp``) and charges' costs: a repeat of identical arguments reads the memo
(about 1 ms) instead of computing (17-29 ms). So every dpaccount row is timed
*computed*: all of dpaccount's memo caches are cleared before each call (outside the
timer), and the ratios use those times. The memoised repeats are printed beside them,
labelled ``memo``, and used in no ratio. Ratios are dpaccount's computed warm median
over each anchor's warm median.

Tolerances differ by design and are printed: Opacus' ``get_noise_multiplier`` stops when
epsilon is within 0.01 of the target; dp_accounting's ``calibrate_dp_mechanism`` at its
default tolerance; dpaccount at a relative 1e-3 on sigma, certified.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from _bytecode import compile_dpaccount

from dpaccount.accounting import calibrate_dpsgd_noise, dpsgd_epsilon

Q, STEPS, DELTA, SIGMA, TARGET = 256 / 60000, 14063, 1e-5, 1.1, 2.0


def clear_memos() -> int:
    """Clear every memo cache of dpaccount's loaded modules (each ``functools.lru_cache``
    and the charges' cost cache); how many were cleared."""
    cleared = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("dpaccount") or module is None:
            continue
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()
                cleared += 1
    from dpaccount.charges import leaves

    leaves._costs.clear()
    return cleared + 1


def measure(fn: Callable[[], Any], repeats: int, before: Callable[[], object] | None = None
            ) -> tuple[Any, float, float, float]:
    """(value, cold seconds, warm min, warm median) in CPU time; ``before`` runs before
    each call, outside the timer."""
    if before is not None:
        before()
    start = time.process_time()
    value = fn()
    cold = time.process_time() - start
    warm = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.process_time()
        fn()
        warm.append(time.process_time() - start)
    return value, cold, min(warm), statistics.median(warm)


def anchors() -> dict[str, dict[str, Callable[[], Any]]]:
    out: dict[str, dict[str, Callable[[], Any]]] = {"epsilon": {}, "calibrate": {}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from opacus.accountants import PRVAccountant, RDPAccountant
            from opacus.accountants.utils import get_noise_multiplier

        def opacus_eps(cls: Any) -> Callable[[], float]:
            def run() -> float:
                acct = cls()
                acct.history = [(SIGMA, Q, STEPS)]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return float(acct.get_epsilon(DELTA))
            return run

        def opacus_cal(name: str) -> Callable[[], float]:
            def run() -> float:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return float(get_noise_multiplier(
                        target_epsilon=TARGET, target_delta=DELTA, sample_rate=Q,
                        steps=STEPS, accountant=name))
            return run

        out["epsilon"]["opacus rdp"] = opacus_eps(RDPAccountant)
        out["epsilon"]["opacus prv"] = opacus_eps(PRVAccountant)
        out["calibrate"]["opacus rdp (eps tol 0.01)"] = opacus_cal("rdp")
        out["calibrate"]["opacus prv (eps tol 0.01)"] = opacus_cal("prv")
    except ImportError:
        print("opacus: not installed (skipped)")
    try:
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        def event(sigma: float) -> Any:
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)),
                STEPS)

        def fresh_pld() -> Any:
            return pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)

        def dpa_eps(make: Callable[[], Any]) -> Callable[[], float]:
            return lambda: float(make().compose(event(SIGMA)).get_epsilon(DELTA))

        def dpa_cal(make: Callable[[], Any]) -> Callable[[], float]:
            return lambda: float(dp_accounting.calibrate_dp_mechanism(
                make, event, TARGET, DELTA))

        out["epsilon"]["dp_accounting pld"] = dpa_eps(fresh_pld)
        out["epsilon"]["dp_accounting rdp"] = dpa_eps(rdp_privacy_accountant.RdpAccountant)
        out["calibrate"]["dp_accounting pld"] = dpa_cal(fresh_pld)
        out["calibrate"]["dp_accounting rdp"] = dpa_cal(rdp_privacy_accountant.RdpAccountant)
    except ImportError:
        print("dp_accounting: not installed (skipped)")
    return out


def ours() -> dict[str, dict[str, Callable[[], Any]]]:
    run = {"sampling_rate": Q, "steps": STEPS, "target_delta": DELTA}
    return {
        "epsilon": {
            "dpaccount pld": lambda: dpsgd_epsilon(noise_multiplier=SIGMA, **run),
            "dpaccount rdp": lambda: dpsgd_epsilon(noise_multiplier=SIGMA, accountant="rdp",
                                                   **run),
        },
        "calibrate": {
            "dpaccount pld (sigma tol 1e-3)": lambda: calibrate_dpsgd_noise(
                target_epsilon=TARGET, **run),
            "dpaccount rdp (sigma tol 1e-3)": lambda: calibrate_dpsgd_noise(
                target_epsilon=TARGET, accountant="rdp", **run),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    compile_dpaccount()  # its first calls load bytecode, as the anchors' do
    theirs, mine = anchors(), ours()
    for task in ("epsilon", "calibrate"):
        what = f"epsilon at sigma={SIGMA}" if task == "epsilon" else f"sigma for eps={TARGET}"
        print(f"\n== {task}: {what}, q={Q:.6f}, T={STEPS}, delta={DELTA} "
              f"(cold = first call; warm = min / median of {args.repeats})")
        results: dict[str, tuple[Any, float, float, float]] = {}
        for name, fn in [*mine[task].items(), *theirs[task].items()]:
            ours_row = name.startswith("dpaccount")
            results[name] = measure(fn, args.repeats, clear_memos if ours_row else None)
            value, cold, low, med = results[name]
            label = " (computed: memos cleared)" if ours_row else ""
            print(f"{name:34s} {float(value):10.5f}  cold {cold:7.3f}s  warm {low:7.3f}s"
                  f" / {med:7.3f}s{label}")
            if ours_row:  # the memoised repeat, labelled, in no ratio
                _, _, memo_low, memo_med = measure(fn, args.repeats)
                print(f"{'  ' + name + ' memo':34s} {'':10s}  {'':13s}  warm {memo_low:7.3f}s"
                      f" / {memo_med:7.3f}s (memoised: identical arguments repeated)")
        print("ratios (dpaccount computed warm median / anchor warm median):")
        for name, (_v, _c, _l, med) in results.items():
            if name.startswith("dpaccount"):
                continue
            kind = "pld" if ("pld" in name or "prv" in name) else "rdp"
            mine_name = next(n for n in mine[task] if kind in n)
            print(f"  {mine_name} / {name}: {results[mine_name][3] / med:.2f}")


if __name__ == "__main__":
    main()
