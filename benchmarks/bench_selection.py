"""Key selection: people per key and expected released keys, optimal against threshold.

Run::

    python benchmarks/bench_selection.py [--repeats 5]

For a grid of per-key (epsilon, delta), prints how many distinct people a key needs to be
released with probability 1/2 and 0.95 under the optimal partition selection of
Desfontaines, Voss, Gipson and Mandayam 2022 (`OptimalSelection`, the default) and under
Laplace thresholding (`ThresholdSelection`, ``key_selection="threshold"``), and the
saving. Then, for a panel like the issue's (545 people in 12 industries, one row per
person and year reduced to one industry per person), the expected number of released
industries of a group-by count at a few budgets, from `GroupBy.preview` (nothing is
charged). Last, CPU time (time.process_time, single-threaded) of calibrating each method,
paired and alternated in one run, beside PyDP's truncated geometric strategy (the
anchor, PipelineDP's default) when ``pipeline-dp`` is installed, and of selecting among
10,000 keys. The probabilities are exact in both (no sampling in this benchmark).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pandas as pd

from dpaccount import Accountant, Budget
from dpaccount import aggregates as agg
from dpaccount.aggregates import OptimalSelection, ThresholdSelection
from dpaccount.mechanisms._sampling import RandomSource

GRID_EPS = ["0.05", "0.1", "0.25", "0.5", "1", "2"]
GRID_DELTA = ["1e-5", "1e-6", "1e-8", "1e-10"]
#: People per industry in a panel of 545 (the issue's data set's shape: a few large
#: industries and a long tail).
INDUSTRIES = [130, 95, 70, 55, 45, 38, 30, 25, 20, 17, 12, 8]


def people_table() -> list[tuple[str, str, int, int, int, int]]:
    rows = []
    for e in GRID_EPS:
        for d in GRID_DELTA:
            eps, delta = Fraction(e), Fraction(d)
            opt = OptimalSelection.calibrate(eps, delta).preview()
            old = ThresholdSelection.calibrate(eps, delta).preview()
            rows.append((e, d, opt.people_for_half, old.people_for_half,
                         opt.people_for_95, old.people_for_95))
    return rows


def expected_keys() -> list[tuple[str, str, str, float, float, int, int]]:
    df = pd.DataFrame({"industry": [f"i{k}" for k, n in enumerate(INDUSTRIES)
                                    for _ in range(n)]})
    out = []
    for eps, delta, share in (("1", "1e-6", "1/4"), ("0.5", "1e-6", "1/4"),
                              ("1", "1e-9", "1/4"), ("1", "1e-6", "1/2")):
        acct = Accountant(Budget(10, "1e-3"))
        found = []
        for method in ("optimal", "threshold"):
            g = agg.groupby(df, "industry", key_selection=method)
            p = g.preview("count", acct, eps, delta=delta, selection_share=share,
                          key_counts=INDUSTRIES)
            assert p.keys is not None and p.keys.expected_released is not None
            found.append((p.keys.expected_released, p.keys.people_for_half))
        out.append((eps, delta, share, found[0][0], found[1][0], found[0][1], found[1][1]))
        assert len(acct.records) == 0
    return out


def cpu(call: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        call()
        times.append(time.process_time() - t)
    return statistics.median(times)


def timings(repeats: int) -> None:
    try:
        from pydp.algorithms import partition_selection
    except ImportError:
        partition_selection = None
    print("\nCPU time of calibrating, per call (median; alternated in one run)")
    print(f"{'eps':>6} {'delta':>7} {'optimal':>10} {'threshold':>10} {'PyDP':>10} "
          f"{'opt/thr':>8} {'opt/PyDP':>9}")
    for e, d in (("1", "1e-6"), ("0.1", "1e-9"), ("0.01", "1e-12")):
        eps, delta = Fraction(e), Fraction(d)
        res: dict[str, list[float]] = {"opt": [], "thr": [], "pydp": []}
        for _ in range(repeats):  # alternate the three, one call each per round
            res["opt"].append(cpu(lambda e=eps, d=delta: OptimalSelection.calibrate(e, d), 1))
            res["thr"].append(cpu(lambda e=eps, d=delta: ThresholdSelection.calibrate(e, d), 1))
            if partition_selection is not None:
                res["pydp"].append(cpu(
                    lambda e=eps, d=delta: (
                        partition_selection.create_truncated_geometric_partition_strategy(
                            float(e), float(d), 1)), 1))
        opt, thr = statistics.median(res["opt"]), statistics.median(res["thr"])
        pydp = statistics.median(res["pydp"]) if res["pydp"] else float("nan")
        print(f"{e:>6} {d:>7} {opt * 1e3:>8.3f}ms {thr * 1e3:>8.3f}ms {pydp * 1e3:>8.3f}ms "
              f"{opt / max(thr, 1e-9):>8.1f} {opt / max(pydp, 1e-9):>9.1f}")
    keys = [n % 40 for n in range(10_000)]
    opt_sel = OptimalSelection.calibrate(Fraction(1, 4), Fraction(1, 10**6))
    thr_sel = ThresholdSelection.calibrate(Fraction(1, 4), Fraction(1, 10**6))
    rng = RandomSource()
    t_opt, t_thr = [], []
    for _ in range(repeats):
        t_opt.append(cpu(lambda: opt_sel.select(keys, rng), 1))
        t_thr.append(cpu(lambda: thr_sel.select(keys, rng), 1))
    o, t = statistics.median(t_opt), statistics.median(t_thr)
    print(f"selecting among 10,000 keys (OS CSPRNG): optimal {o * 1e3:.1f} ms, threshold "
          f"{t * 1e3:.1f} ms (optimal/threshold {o / t:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("People per key for release at 1/2 and at 0.95, per-key (eps, delta)")
    print(f"{'eps':>5} {'delta':>6} | {'opt 50%':>7} {'thr 50%':>7} {'saving':>6} | "
          f"{'opt 95%':>7} {'thr 95%':>7} {'saving':>6}")
    savings = []
    for e, d, o50, t50, o95, t95 in people_table():
        s50, s95 = 1 - o50 / t50, 1 - o95 / t95
        savings += [s50, s95]
        print(f"{e:>5} {d:>6} | {o50:>7} {t50:>7} {s50:>6.1%} | {o95:>7} {t95:>7} "
              f"{s95:>6.1%}")
    print(f"saving: {min(savings):.1%} to {max(savings):.1%} "
          f"(median {statistics.median(savings):.1%})")
    print("\nExpected released industries of 12 (545 people; group-by count, G = 1)")
    print(f"{'eps':>4} {'delta':>6} {'share':>5} | {'optimal':>7} {'threshold':>9} | "
          f"{'people 50% opt':>14} {'thr':>4}")
    for eps, delta, share, e_opt, e_thr, p_opt, p_thr in expected_keys():
        print(f"{eps:>4} {delta:>6} {share:>5} | {e_opt:>7.2f} {e_thr:>9.2f} | "
              f"{p_opt:>14} {p_thr:>4}")
    timings(args.repeats)


if __name__ == "__main__":
    main()
