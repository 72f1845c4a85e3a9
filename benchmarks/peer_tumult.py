"""The engines benchmark's job in Tumult Analytics, run by ``bench_engines.py --tumult``.

Tumult Analytics pins pandas < 2 and PySpark < 3.6, so it lives in a virtual environment
of its own (``python -m venv /tmp/tumult && /tmp/tumult/bin/pip install tmlt.analytics
pyarrow``) and this script runs there, reading the same rows (a Parquet file written by
``bench_engines.py``). It prints one JSON object: per trial, the time of one release
(count and mean per region) and the noisy means.

The job matches dpaccount's: the privacy unit is ``user`` (``AddRowsWithID``), each
person is truncated to 2 regions (``MaxGroupsPerID``) and 5 rows per region
(``MaxRowsPerGroupPerID``), the regions are public (a ``KeySet``), the values are
clamped to [0, 100], and the count and the mean are each released under pure DP with
epsilon 1 (Laplace-type noise on both sides).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(path: str, trials: int, regions: list[str]) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need tmlt too
    from pyspark.sql import SparkSession
    from tmlt.analytics import (
        AddRowsWithID,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    spark = (SparkSession.builder.master("local[2]").appName("peer")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "8")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    frame = spark.read.parquet(path).cache()
    frame.count()
    keys = KeySet.from_dict({"region": regions})

    def bounded() -> QueryBuilder:
        return (QueryBuilder("data").enforce(MaxGroupsPerID("region", 2))
                .enforce(MaxRowsPerGroupPerID("region", 5)))

    out = []
    for _ in range(trials + 1):  # the first is a warm-up (JVM and query planning)
        start = time.perf_counter()
        session = Session.from_dataframe(
            privacy_budget=PureDPBudget(2), source_id="data", dataframe=frame,
            protected_change=AddRowsWithID(id_column="user"))
        counts = session.evaluate(bounded().groupby(keys).count(), PureDPBudget(1)).collect()
        means = session.evaluate(
            bounded().groupby(keys).average("x", low=0, high=100), PureDPBudget(1)
        ).collect()
        elapsed = time.perf_counter() - start
        out.append({
            "seconds": elapsed,
            "means": {row["region"]: float(row["x_average"]) for row in means},
            "counts": {row["region"]: int(row["count"]) for row in counts},
        })
    print(json.dumps({"trials": out[1:]}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))
