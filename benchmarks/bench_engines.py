"""Group-by with a privacy unit on pandas, Dask and Spark, against the same query without DP.

Run (needs the test extra for Dask and PySpark, Java 17 for Spark)::

    python benchmarks/bench_engines.py [--rows 10000000] [--repeats 3] [--engines pandas,dask,spark]
        [--peer-rows 1000000] [--peer-trials 3] [--tumult /tmp/tumult/bin/python]

Tumult Analytics cannot share this environment (it pins pandas < 2 and PySpark < 3.6);
give it one of its own::

    python3 -m venv /tmp/tumult && /tmp/tumult/bin/pip install tmlt.analytics pyarrow

The query: per region (five public keys), the count of rows and the mean of a value
clipped to [0, 100], with a privacy unit (``user``, 10 rows per person on average,
at most 2 groups and 5 rows per group kept). On each engine it runs once with dpaccount
(contribution bounding, exact lattice totals, noise, one charge for each statistic) and
once as the plain engine query without privacy (``groupby().agg(count, mean)``), in the
same run, alternating; imports and engine start-up happen before any timer. Prints the
minimum and median time of each and the overhead ratios dpaccount / plain. Goal
(issue 12): <= 1.5. A third column runs the plain query *with* the same contribution
bounding written in the engine's own terms (random order, ``groupby().cumcount()`` on
pandas and Dask after a shuffle by person, ``row_number()`` windows on Spark), the
ratio dpaccount / bounded says what dpaccount adds beyond bounding itself. And the
private query runs two ways: two calls (a count and a mean at epsilon 1 each, each
bounding afresh) and one call (the mean at epsilon 2, whose frame comes with the count
it paid for at epsilon 1: one bounding pass; same total budget, and its mean uses
epsilon 1 for the sum where the two-call mean used 1/2).
Then, where it installs, the same job against PipelineDP's local backend (`peer`) and,
with ``--tumult PYTHON`` (a virtual environment with ``tmlt.analytics``, which pins
pandas < 2), against Tumult Analytics on Spark (`tumult`, via ``peer_tumult.py``): the
error and time ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from dpaccount import Accountant, Budget
from dpaccount import aggregates as agg

REGIONS = ["north", "south", "east", "west", "centre"]


def data(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "user": rng.integers(0, max(1, rows // 10), rows),
        "region": pd.Categorical(rng.choice(REGIONS, rows)).astype(str),
        "x": rng.uniform(0, 120, rows),
    })


def private(frame: Any) -> Callable[[], Any]:
    def run() -> Any:
        acct = Accountant(Budget(2))
        g = agg.groupby(frame, "region", keys=REGIONS, privacy_unit="user",
                        max_groups_per_unit=2, max_rows_per_unit=5)
        return g.count(acct, 1).frame, g.mean("x", acct, 1, lower=0, upper=100).frame

    return run


def private_one_call(frame: Any) -> Callable[[], Any]:
    """The same budget in one call: the mean at epsilon 2 releases its count at epsilon
    1 (``count_share`` 1/2) and its sum at epsilon 1, one bounding pass for both."""

    def run() -> Any:
        acct = Accountant(Budget(2))
        g = agg.groupby(frame, "region", keys=REGIONS, privacy_unit="user",
                        max_groups_per_unit=2, max_rows_per_unit=5)
        res = g.mean("x", acct, 2, lower=0, upper=100)
        return res.counts, res.frame

    return run


def plain_pandas(frame: pd.DataFrame) -> Callable[[], Any]:
    return lambda: frame.groupby("region")["x"].agg(["count", "mean"])


def plain_dask(frame: Any) -> Callable[[], Any]:
    return lambda: frame.groupby("region")["x"].agg(["count", "mean"]).compute()


def plain_spark(frame: Any) -> Callable[[], Any]:
    from pyspark.sql import functions as f

    return lambda: frame.groupBy("region").agg(f.count("x"), f.mean("x")).collect()


# -- the same query without privacy but with the same contribution bounding --------------
# (each person's rows in random order; at most 5 rows per (person, region) and 2 regions
# per person kept), written with each engine's own tools: what an engineer would write to
# bound contributions without dpaccount. Not a DP computation (no noise, a seeded order).

def _bounded_totals(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    f = frame.assign(_r=rng.random(len(frame))).sort_values("_r")
    f = f[f.groupby(["user", "region"], sort=False).cumcount() < 5]
    pairs = f.drop_duplicates(["user", "region"])  # the pairs in random order
    pairs = pairs[pairs.groupby("user", sort=False).cumcount() < 2][["user", "region"]]
    kept = f.merge(pairs, on=["user", "region"])
    return kept.assign(x=kept["x"].clip(0, 100)).groupby("region")["x"].agg(["count", "sum"])


def bounded_pandas(frame: pd.DataFrame) -> Callable[[], Any]:
    def run() -> Any:
        t = _bounded_totals(frame, 1)
        return t["count"], t["sum"] / t["count"]

    return run


def bounded_dask(frame: Any) -> Callable[[], Any]:
    def run() -> Any:
        by_user = frame.shuffle("user")  # a person's rows in one partition (timed)
        parts = by_user.map_partitions(
            _bounded_totals, 1, meta={"count": "i8", "sum": "f8"}).compute()
        t = parts.groupby(level=0).sum()
        return t["count"], t["sum"] / t["count"]

    return run


def bounded_spark(frame: Any) -> Callable[[], Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    def run() -> Any:
        rows = frame.withColumn("rn", f.row_number().over(
            Window.partitionBy("user", "region").orderBy(f.rand(1)))).filter("rn <= 5")
        pairs = rows.select("user", "region").distinct().withColumn("r", f.rand(2))
        pairs = pairs.withColumn("pn", f.row_number().over(
            Window.partitionBy("user").orderBy("r"))).filter("pn <= 2").drop("r", "pn")
        kept = rows.join(pairs, ["user", "region"])
        return kept.groupBy("region").agg(
            f.count("x"), f.mean(f.least(f.greatest("x", f.lit(0)), f.lit(100)))).collect()

    return run


def best(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="pandas,dask,spark")
    parser.add_argument("--peer-rows", type=int, default=1_000_000,
                        help="rows for the PipelineDP comparison (0: skip it)")
    parser.add_argument("--peer-trials", type=int, default=3)
    parser.add_argument("--tumult", metavar="PYTHON",
                        help="the python of a virtual environment with tmlt.analytics "
                             "(it pins pandas < 2): compare with Tumult Analytics too")
    args = parser.parse_args(argv)
    df = data(args.rows)
    engines = args.engines.split(",")
    cases: list[tuple[str, Any, Callable[[], Any], Callable[[], Any]]] = []
    if "pandas" in engines:
        cases.append(("pandas", df, plain_pandas(df), bounded_pandas(df)))
    if "dask" in engines:
        import dask
        import dask.dataframe as dd

        dask.config.set(scheduler="threads")
        lazy = dd.from_pandas(df, npartitions=8).persist()
        cases.append(("dask", lazy, plain_dask(lazy), bounded_dask(lazy)))
    if "spark" in engines:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "8")
                 .config("spark.driver.memory", "4g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        frame = spark.createDataFrame(df).repartition(8).cache()
        frame.count()
        cases.append(("spark", frame, plain_spark(frame), bounded_spark(frame)))
    print(f"{args.rows} rows, 5 public regions, privacy unit with G=2, R=5; "
          f"count and mean per region; min and median of {args.repeats}")
    print("two calls: count and mean (epsilon 1 each); one call: the mean at epsilon 2 and "
          "the count it releases (epsilon 1 each); plain: the query without privacy; "
          "bounded: without privacy, with the same contribution bounding in the engine's "
          "own terms")
    print(f"{'engine':<8}{'':<8}{'two calls':>10}{'one call':>10}{'plain':>8}{'bounded':>9}"
          f"{'2/plain':>9}{'1/plain':>9}{'2/bounded':>11}{'1/bounded':>11}")
    for name, data_, theirs, bounded in cases:
        runs = {"two": private(data_), "one": private_one_call(data_), "plain": theirs,
                "bounded": bounded}
        for run in runs.values():  # warm: first-call imports and JIT paths are not timed
            run()
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeats):  # alternating, so all see the same machine
            for key, run in runs.items():
                times[key].append(best(run, 1))
        for label, pick in (("min", min), ("median", lambda v: float(np.median(v)))):
            t = {k: pick(v) for k, v in times.items()}
            print(f"{name:<8}{label:<8}{t['two']:>10.2f}{t['one']:>10.2f}{t['plain']:>8.2f}"
                  f"{t['bounded']:>9.2f}{t['two'] / t['plain']:>9.1f}"
                  f"{t['one'] / t['plain']:>9.1f}{t['two'] / t['bounded']:>11.2f}"
                  f"{t['one'] / t['bounded']:>11.2f}")
    if args.peer_rows:
        peer(args.peer_rows, args.peer_trials)
        if args.tumult:
            tumult(args.tumult, args.peer_rows, args.peer_trials)


def peer(rows: int, trials: int) -> None:
    """dpaccount (pandas) against PipelineDP's local backend on the same job and budget.

    Both bound each person to 2 regions and 5 rows per region, release the count and the
    mean per region with epsilon 1 each (PipelineDP: total epsilon 2 over its two
    metrics) and public regions. Error: the 95th percentile over regions and trials of
    |noisy mean - exact mean of all values clipped to [0, 100]| (both sides pay the
    bias of bounding); time: the median of one release.
    """
    try:
        import pipeline_dp
    except ImportError:
        print("PipelineDP is not installed (pip install pipeline-dp): peer comparison skipped")
        return
    df = data(rows, seed=1)
    exact = df.assign(x=df["x"].clip(0, 100)).groupby("region")["x"].mean()
    records = list(df.itertuples(index=False))

    def theirs() -> pd.Series:
        acc = pipeline_dp.NaiveBudgetAccountant(total_epsilon=2, total_delta=1e-6)
        engine = pipeline_dp.DPEngine(acc, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.MEAN],
            max_partitions_contributed=2, max_contributions_per_partition=5,
            min_value=0, max_value=100,
        )
        extract = pipeline_dp.DataExtractors(
            partition_extractor=lambda r: r.region, privacy_id_extractor=lambda r: r.user,
            value_extractor=lambda r: r.x,
        )
        out = engine.aggregate(records, params, extract, public_partitions=REGIONS)
        acc.compute_budgets()
        return pd.Series({k: m.mean for k, m in out})

    def ours() -> pd.Series:
        return private(df)()[1]["value"]

    errors: dict[str, list[float]] = {"ours": [], "theirs": []}
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for _ in range(trials):
        for name, run in (("ours", ours), ("theirs", theirs)):
            start = time.perf_counter()
            means = run()
            times[name].append(time.perf_counter() - start)
            errors[name].extend(abs(means[k] - exact[k]) for k in REGIONS)
    e_ours, e_theirs = (float(np.quantile(errors[k], 0.95)) for k in ("ours", "theirs"))
    t_ours, t_theirs = (float(np.median(times[k])) for k in ("ours", "theirs"))
    print(f"\nagainst PipelineDP (local backend), {rows} rows, {trials} trials:")
    print(f"{'':<12}{'mean err':>10}{'time s':>9}")
    print(f"{'dpaccount':<12}{e_ours:>10.4g}{t_ours:>9.2f}")
    print(f"{'PipelineDP':<12}{e_theirs:>10.4g}{t_theirs:>9.2f}")
    print(f"{'ratio':<12}{e_ours / e_theirs:>10.3f}{t_ours / t_theirs:>9.3f}")


def tumult(python: str, rows: int, trials: int) -> None:
    """dpaccount against Tumult Analytics on the same rows, job and budget.

    Tumult runs in its own environment (``peer_tumult.py``, on Spark in local mode, as
    it always runs); dpaccount runs the job on pandas and on Spark in local mode in this
    one. Error and time as in `peer`; Tumult's time is that of a warm session.
    """
    import json
    import subprocess
    import tempfile

    df = data(rows, seed=1)
    exact = df.assign(x=df["x"].clip(0, 100)).groupby("region")["x"].mean()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rows.parquet")
        df.to_parquet(path, index=False)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_tumult.py")
        done = subprocess.run([python, script, path, str(trials), ",".join(REGIONS)],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"Tumult Analytics failed to run ({python}): "
              f"{done.stderr.strip().splitlines()[-1:]}")
        return
    runs = json.loads(done.stdout.strip().splitlines()[-1])["trials"]
    errors = {"theirs": [abs(r["means"][k] - exact[k]) for r in runs for k in REGIONS]}
    times = {"theirs": [r["seconds"] for r in runs]}
    sides: list[tuple[str, Callable[[], Any]]] = [("pandas", private(df))]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "8")
             .config("spark.driver.memory", "4g").getOrCreate())
    frame = spark.createDataFrame(df).repartition(8).cache()
    frame.count()
    sides.append(("spark", private(frame)))
    for name, run in sides:
        run()  # warm, as Tumult's first trial is
        errors[name], times[name] = [], []
        for _ in range(trials):
            start = time.perf_counter()
            means = run()[1]["value"]
            times[name].append(time.perf_counter() - start)
            errors[name].extend(abs(means[k] - exact[k]) for k in REGIONS)
    e_theirs = float(np.quantile(errors["theirs"], 0.95))
    t_theirs = float(np.median(times["theirs"]))
    print(f"\nagainst Tumult Analytics (Spark local[2]), {rows} rows, {trials} trials:")
    print(f"{'':<22}{'mean err':>10}{'time s':>9}{'err ratio':>11}{'time ratio':>12}")
    print(f"{'Tumult Analytics':<22}{e_theirs:>10.4g}{t_theirs:>9.2f}")
    for name in ("pandas", "spark"):
        e = float(np.quantile(errors[name], 0.95))
        t = float(np.median(times[name]))
        print(f"{'dpaccount (' + name + ')':<22}{e:>10.4g}{t:>9.2f}{e / e_theirs:>11.3f}"
              f"{t / t_theirs:>12.3f}")


if __name__ == "__main__":
    main()
