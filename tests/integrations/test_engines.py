"""Group-by on Dask and Spark: the same totals as in memory, whatever the partitioning.

Dask runs on its local (synchronous) scheduler and Spark in local mode. Each engine's
tests skip with the reason when it cannot start, except under
``DPACCOUNT_REQUIRE_ENGINES=1`` (as in ``.ci/run``), where they fail instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget
from dpaccount.aggregates import ContributionBounds, FixedPoint, groupby
from dpaccount.aggregates.engines import BoundingKey, TotalsSpec, engine_of, totals
from dpaccount.mechanisms._sampling import RandomSource

REQUIRED = os.environ.get("DPACCOUNT_REQUIRE_ENGINES") == "1"
KEYS = ("a", "b", "c", "d")


def _need(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if REQUIRED:
            raise
        pytest.skip(f"{module} is not installed ({exc}); pip install 'dpaccount[{module}]'")


def table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-5, 15, n)
    x[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame({
        "user": rng.integers(0, max(1, n // 3), n),
        "key": rng.choice(["a", "b", "c", "d", "zz"], n).tolist(),
        "x": x,
    })


def specs(with_unit: bool, declared: bool) -> list[TotalsSpec]:
    unit = "user" if with_unit else None
    bounds = ContributionBounds(2, 2) if with_unit else ContributionBounds()
    key = BoundingKey.draw() if with_unit else None
    keys = KEYS if declared else None
    base = {"by": "key", "keys": keys, "unit": unit, "bounds": bounds, "key": key}
    fp = FixedPoint.build(0, 10, granularity="0.25")
    return [
        TotalsSpec(**base),
        TotalsSpec(**base, column="x", fp=fp, centre=20),
        TotalsSpec(**base, column="x", edges=np.array([-5.0, 0.0, 5.0, 15.0])),
        TotalsSpec(**base, column="x", grid=np.linspace(-5, 15, 9)),
    ]


def as_plain(found: dict[Any, Any]) -> dict[Any, tuple[int, int, int, list[int]]]:
    return {k: (t.rows, t.units, t.total, list(t.bins)) for k, t in found.items()}


# -- Dask ------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 300), st.integers(0, 2**16), st.integers(1, 7), st.booleans(),
       st.booleans())
def test_dask_totals_equal_the_in_memory_ones(n: int, seed: int, parts: int,
                                              with_unit: bool, declared: bool) -> None:
    dd = _need("dask.dataframe")
    df = table(n, seed)
    shuffled = df.sample(frac=1.0, random_state=seed)  # another order, too
    lazy = dd.from_pandas(shuffled, npartitions=parts)
    for spec in specs(with_unit, declared):
        assert as_plain(totals(lazy, spec)) == as_plain(totals(df, spec))


def test_dask_group_by_result_equals_pandas() -> None:
    dd = _need("dask.dataframe")
    df = table(2_000, 3)
    lazy = dd.from_pandas(df, npartitions=5)
    assert engine_of(lazy) == "dask"
    frames = []
    for data in (df, lazy):
        acct = Accountant(Budget(10, "1e-5"))
        g = groupby(data, "key", privacy_unit="user", max_groups_per_unit=2,
                    max_rows_per_unit=3, rng=RandomSource.seeded(9))
        res = g.mean("x", acct, 1, lower=0, upper=10, delta="1e-6")
        frames.append(res.frame)
        frames.append(res.counts)  # the count the mean paid for: the same on both
        assert len(acct.records) == 1
    pd.testing.assert_frame_equal(frames[0], frames[2])
    pd.testing.assert_frame_equal(frames[1], frames[3])


def test_dask_checks_before_the_charge() -> None:
    dd = _need("dask.dataframe")
    lazy = dd.from_pandas(pd.DataFrame({"key": ["a"], "x": ["text"]}), npartitions=1)
    acct = Accountant(Budget(1))
    with pytest.raises(Exception, match="numeric"):
        groupby(lazy, "key", keys=["a"]).sum("x", acct, 1, lower=0, upper=1)
    assert len(acct.records) == 0


# -- Spark -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    _need("pyspark")
    from pyspark.sql import SparkSession

    # the workers run this interpreter (with pandas and pyarrow), not the system python3
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    try:
        session = (
            SparkSession.builder.master("local[2]").appName("dpaccount-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "3")
            # small Arrow batches: mapInPandas hands a partition over in many pieces,
            # and a person's rows must still be bounded together
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", "37")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.pyspark.driver.python", sys.executable)
            .getOrCreate()
        )
    except Exception as exc:  # no Java, no local ports
        if REQUIRED:
            raise
        pytest.skip(f"Spark cannot start here: {type(exc).__name__}")
    yield session
    session.stop()


@pytest.mark.parametrize("with_unit", [False, True], ids=["rows", "units"])
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "private"])
def test_spark_totals_equal_the_in_memory_ones(spark: Any, with_unit: bool,
                                               declared: bool) -> None:
    df = table(400, 11)
    for parts in (1, 4):
        frame = spark.createDataFrame(df).repartition(parts)
        for spec in specs(with_unit, declared):
            assert as_plain(totals(frame, spec)) == as_plain(totals(df, spec))


def test_spark_group_by_result_equals_pandas(spark: Any) -> None:
    df = table(1_000, 5)
    frames = []
    for data in (df, spark.createDataFrame(df)):
        acct = Accountant(Budget(10))
        g = groupby(data, "key", keys=list(KEYS), privacy_unit="user",
                    max_rows_per_unit=2, rng=RandomSource.seeded(4))
        frames.append(g.count(acct, 1).frame)
        mean = g.mean("x", acct, 1, lower=0, upper=10)
        frames += [mean.frame, mean.counts]  # with the count the mean paid for
    for mine, theirs in zip(frames[:3], frames[3:], strict=True):
        pd.testing.assert_frame_equal(mine, theirs)


def test_spark_checks_before_the_charge(spark: Any) -> None:
    frame = spark.createDataFrame(pd.DataFrame({"key": ["a"], "x": ["text"]}))
    acct = Accountant(Budget(1))
    with pytest.raises(Exception, match="numeric"):
        groupby(frame, "key", keys=["a"]).mean("x", acct, 1, lower=0, upper=1)
    with pytest.raises(Exception, match="not a column"):
        groupby(frame, "nope", keys=["a"])
    assert len(acct.records) == 0


def test_whole_table_statistic_equals_the_one_column_aggregate() -> None:
    from dpaccount import aggregates as agg

    df = table(500, 8)
    acct = Accountant(Budget(10))
    whole = groupby(df, None, rng=RandomSource.seeded(2)).sum(
        "x", acct, 1, lower=0, upper=10, granularity="0.25")
    alone = agg.sum(df["x"], acct, 1, lower=0, upper=10, granularity="0.25",
                    rng=RandomSource.seeded(2))
    assert list(whole.frame.index) == ["all"]
    assert whole.frame["value"].iloc[0] == alone.value
    assert whole.cost == alone.cost


def test_dask_whole_table_with_a_privacy_unit() -> None:
    dd = _need("dask.dataframe")
    df = table(1_000, 6)
    results = []
    for data in (df, dd.from_pandas(df, npartitions=3)):
        acct = Accountant(Budget(10))
        g = groupby(data, None, privacy_unit="user", max_rows_per_unit=2,
                    rng=RandomSource.seeded(3))
        results.append(g.count(acct, 1).frame)
    pd.testing.assert_frame_equal(results[0], results[1])


def test_undeclared_keys_of_other_types_are_refused_before_the_charge() -> None:
    dd = _need("dask.dataframe")
    from dpaccount import ConfigError

    frame = dd.from_pandas(pd.DataFrame({"day": pd.to_datetime(["2026-11-24"] * 3),
                                         "x": [1.0, 2.0, 3.0]}), npartitions=1)
    with pytest.raises(ConfigError, match="declare the keys"):
        groupby(frame, "day")
    assert groupby(frame, "day", keys=[pd.Timestamp("2026-11-24")]) is not None


# -- one column on an engine: count, sum and mean take it as they take a pandas column ----


def _scalar_results(data: Any, unit: Any = None) -> list[Any]:
    """count, sum and mean of ``data`` with fixed seeds, each on a fresh ledger."""
    from dpaccount import aggregates as agg

    extra = {} if unit is None else {"privacy_unit": unit, "max_rows_per_unit": 2}
    out = []
    for call, options in (
        (agg.count, {}),
        (agg.sum, {"lower": 0, "upper": 10, "granularity": "0.25"}),
        (agg.mean, {"lower": 0, "upper": 10, "granularity": "0.25"}),
    ):
        acct = Accountant(Budget(10))
        res = call(data, acct, 1, rng=RandomSource.seeded(7), **options, **extra)
        assert len(acct.records) == 1
        out.append(res)
    return out


def test_dask_columns_give_the_pandas_answers_and_charges() -> None:
    dd = _need("dask.dataframe")
    df = table(1_500, 12)
    lazy = dd.from_pandas(df, npartitions=4)
    expected = _scalar_results(df["x"])
    for data in (lazy["x"], lazy[["x"]]):  # a Series, and a one-column frame
        got = _scalar_results(data)
        for mine, theirs in zip(got, expected, strict=True):
            assert mine.value == theirs.value and mine.interval == theirs.interval
            assert mine.record.charge == theirs.record.charge
    # with a privacy unit: a person's rows bounded by keyed hashes, as the group-by does
    with_unit = _scalar_results(lazy["x"], lazy["user"])
    g = groupby(df, None, privacy_unit="user", max_rows_per_unit=2,
                rng=RandomSource.seeded(7))
    whole = g.count(Accountant(Budget(10)), 1)
    assert with_unit[0].value == whole.frame["value"].iloc[0]
    assert with_unit[0].value < expected[0].value  # ~500 people keep 2 rows at most


def test_dask_columns_are_checked_before_the_charge() -> None:
    dd = _need("dask.dataframe")
    from dpaccount import InvalidCostError
    from dpaccount import aggregates as agg

    lazy = dd.from_pandas(table(100, 1).assign(t=["x"] * 100), npartitions=2)
    acct = Accountant(Budget(1))
    with pytest.raises(InvalidCostError, match="numeric"):
        agg.sum(lazy["t"], acct, 1, lower=0, upper=1)
    with pytest.raises(InvalidCostError, match="one column"):
        agg.mean(lazy[["x", "user"]], acct, 1, lower=0, upper=1)
    with pytest.raises(InvalidCostError, match="Dask Series"):
        agg.count(lazy["x"], acct, 1, privacy_unit=np.arange(100), max_rows_per_unit=2)
    with pytest.raises(InvalidCostError, match="lazy frame"):
        agg.histogram(lazy["x"], acct, 1, bins=[0, 1, 2])
    assert len(acct.records) == 0
    assert agg.count(lazy, acct, 1).cost.epsilon == 1  # a count reads any frame's rows


def test_output_is_checked_and_the_table_follows_it() -> None:
    from dpaccount import ConfigError

    df = table(300, 4).assign(sparkSession=1.0)  # a column named like Spark's attribute
    with pytest.raises(ConfigError, match="output"):
        groupby(df, "key", output="arrow")
    res = groupby(df, "key", keys=list(KEYS)).count(Accountant(Budget(1)), 1)
    assert res.output == "pandas" and res.table is res.frame and res.session is None
    assert res.clamped().output == "pandas"
    pl = pytest.importorskip("polars")
    res = groupby(df, "key", keys=list(KEYS), output="polars").count(Accountant(Budget(1)), 1)
    assert isinstance(res.table, pl.DataFrame) and res.table.columns == [
        "key", "value", "low", "high"]
    assert res.clamped().output == "polars"


def test_dask_output_hands_back_a_dask_frame_of_noisy_values() -> None:
    dd = _need("dask.dataframe")
    df = table(800, 2)
    acct = Accountant(Budget(10, "1e-5"))
    g = groupby(dd.from_pandas(df, npartitions=3), "key", output="dask",
                rng=RandomSource.seeded(1))
    res = g.sum("x", acct, 1, lower=0, upper=10, delta="1e-6")
    assert isinstance(res.table, dd.DataFrame)
    got = res.table.compute().reset_index(drop=True)
    pd.testing.assert_frame_equal(got, res.frame.reset_index(), check_dtype=False)
    assert list(got.columns) == ["key", "value", "low", "high"]  # no other column
    assert set(got["key"]) <= {"a", "b", "c", "d", "zz"}


def test_spark_columns_and_spark_output(spark: Any) -> None:
    """One session for all: a one-column Spark frame gives the pandas answers; a Column
    and a privacy unit are refused before the charge; output="spark" hands back a table."""
    from dpaccount import InvalidCostError
    from dpaccount import aggregates as agg

    df = table(600, 13)
    frame = spark.createDataFrame(df).repartition(3)
    expected = _scalar_results(df["x"])
    for mine, theirs in zip(_scalar_results(frame.select("x")), expected, strict=True):
        assert mine.value == theirs.value and mine.record.charge == theirs.record.charge
    acct = Accountant(Budget(1))
    with pytest.raises(InvalidCostError, match="expression"):
        agg.sum(frame["x"], acct, 1, lower=0, upper=1)
    with pytest.raises(InvalidCostError, match="privacy_unit"):
        agg.count(frame.select("x"), acct, 1, privacy_unit=frame.select("user"),
                  max_rows_per_unit=2)
    with pytest.raises(InvalidCostError, match="one column"):
        agg.sum(frame, acct, 1, lower=0, upper=1)
    assert len(acct.records) == 0
    res = groupby(frame, "key", keys=list(KEYS), output="spark",
                  rng=RandomSource.seeded(2)).count(Accountant(Budget(1)), 1)
    table_ = res.table
    assert type(table_).__module__.startswith("pyspark") and table_.columns == [
        "key", "value", "low", "high"]
    rows = sorted((r["key"], r["value"], r["low"], r["high"]) for r in table_.collect())
    assert rows == sorted(res.frame.reset_index().itertuples(index=False, name=None))
