"""Per-group statistics: dpaccount's groupby against OpenDP's polars API, same data and epsilon.

Run (needs the bench extra: ``pip install -e ".[bench]"``, which pins the polars that
OpenDP's wheel was built against)::

    python benchmarks/bench_groupby.py [--trials 100] [--rows 100000]

The job is the one of the pipelines issue: 100,000 rows, five regions (public keys), an
income column clipped to [0, 200000], one row per person, epsilon = 1 for the whole
group-by. Each trial releases the per-region statistic once on each side (alternating,
a fresh ledger / OpenDP context each time, imports before any timer). Prints, per
statistic, the 95th percentile of the absolute error over all (region, trial) pairs
against the exact clipped statistic, the median time of one release (setting up the
guard or context included), and the ratios dpaccount / OpenDP. Goal (issue 10): error
ratio <= 1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import opendp.prelude as dp
import pandas as pd
import polars as pl

from dpaccount import Accountant, Budget
from dpaccount import aggregates as agg

dp.enable_features("contrib")

REGIONS = ["north", "south", "east", "west", "centre"]
LOWER, UPPER = 0.0, 200_000.0
EPSILON = 1.0


def data(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "region": rng.choice(REGIONS, rows).tolist(),
        "income": rng.lognormal(10.5, 0.6, rows),
    })


def truth(df: pd.DataFrame, statistic: str) -> pd.Series:
    clipped = df.assign(income=df["income"].clip(LOWER, UPPER)).groupby("region")["income"]
    return clipped.mean() if statistic == "mean" else clipped.size().astype(float)


def ours(df: pd.DataFrame, statistic: str) -> Callable[[], pd.Series]:
    def run() -> pd.Series:
        acct = Accountant(Budget(EPSILON))
        g = agg.groupby(df, "region", keys=REGIONS)
        if statistic == "mean":
            res = g.mean("income", acct, EPSILON, lower=LOWER, upper=UPPER)
        else:
            res = g.count(acct, EPSILON)
        return res.frame["value"]

    return run


def theirs(df: pd.DataFrame, statistic: str) -> Callable[[], pd.Series]:
    frame = pl.DataFrame({"region": df["region"].tolist(), "income": df["income"].to_numpy()})

    def run() -> pd.Series:
        ctx = dp.Context.compositor(
            data=frame.lazy(),
            privacy_unit=dp.unit_of(contributions=1),
            privacy_loss=dp.loss_of(epsilon=EPSILON),
            split_evenly_over=1,
            margins=[dp.polars.Margin(by=["region"], invariant="keys",
                                      max_length=len(frame), max_groups=len(REGIONS))],
        )
        if statistic == "mean":
            expr = pl.col("income").fill_null(0).dp.mean((LOWER, UPPER))
        else:
            expr = dp.len(signed=True)  # unclamped, as dpaccount's
        out = ctx.query().group_by("region").agg(expr).release().collect()
        column = "income" if statistic == "mean" else "len"
        return pd.Series(out[column].to_list(), index=out["region"].to_list(), dtype=float)

    return run


def measure(run: Callable[[], pd.Series], exact: pd.Series, errors: list[float],
            times: list[float]) -> None:
    start = time.perf_counter()
    out = run()
    times.append(time.perf_counter() - start)
    errors.extend(abs(out[key] - exact[key]) for key in REGIONS)


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args(argv)
    df = data(args.rows)
    print(f"{args.rows} rows, {len(REGIONS)} public regions, epsilon = {EPSILON}, "
          f"{args.trials} trials; error = 95th percentile of |noisy - exact| per region")
    print(f"{'statistic':<10}{'dpaccount err':>15}{'OpenDP err':>13}{'err ratio':>11}"
          f"{'dpaccount ms':>14}{'OpenDP ms':>11}{'time ratio':>12}")
    for statistic in ("count", "mean"):
        exact = truth(df, statistic)
        mine, other = ours(df, statistic), theirs(df, statistic)
        e_ours: list[float] = []
        e_theirs: list[float] = []
        t_ours: list[float] = []
        t_theirs: list[float] = []
        for _ in range(args.trials):
            measure(mine, exact, e_ours, t_ours)
            measure(other, exact, e_theirs, t_theirs)
        q_ours, q_theirs = np.quantile(e_ours, 0.95), np.quantile(e_theirs, 0.95)
        m_ours, m_theirs = statistics.median(t_ours), statistics.median(t_theirs)
        print(f"{statistic:<10}{q_ours:>15.4g}{q_theirs:>13.4g}{q_ours / q_theirs:>11.3f}"
              f"{m_ours * 1e3:>14.2f}{m_theirs * 1e3:>11.2f}{m_ours / m_theirs:>12.3f}")


if __name__ == "__main__":
    main()
