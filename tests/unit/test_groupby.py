"""Group-by: one Parallel record, checks before the charge, keys, privacy units, outputs."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpaccount import (
    Accountant,
    Budget,
    ConfigError,
    InvalidCostError,
    Parallel,
    PrivacyCost,
    Repeated,
    aggregates,
)
from dpaccount.aggregates import ThresholdSelection, groupby
from dpaccount.errors import DuplicateQueryError
from dpaccount.mechanisms import ExponentialMechanism, IntegerLaplaceMechanism
from dpaccount.mechanisms._sampling import RandomSource
from dpaccount.mechanisms.integer import IntegerGaussianMechanism

REGIONS = ["north", "south", "east", "west", "centre"]


def columns(n: int = 2_000, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "user": rng.integers(0, n // 4, n),
        "region": rng.choice(REGIONS, n).tolist(),
        "income": rng.uniform(0, 100, n),
    }


def frame(n: int = 2_000, seed: int = 0) -> pd.DataFrame:
    return pd.DataFrame(columns(n, seed))


def seeded(seed: int = 1) -> RandomSource:
    return RandomSource.seeded(seed)


# -- the record: one Parallel, its cost exactly what was asked --------------------------


def test_count_is_one_parallel_record_of_the_one_group_mechanism() -> None:
    acct = Accountant(Budget(1))
    res = groupby(frame(), "region", keys=REGIONS).count(acct, "0.5")
    expected_part = IntegerLaplaceMechanism(Fraction(1, 2), 1).charge
    assert res.record.charge == Parallel((expected_part,) * 5)
    assert res.cost == PrivacyCost("0.5")
    assert len(acct.records) == 1


def test_substitution_counts_two_groups_and_each_part_holds_for_both() -> None:
    acct = Accountant(Budget(1), relation="substitution")
    res = groupby(frame(), "region", keys=REGIONS).sum(
        "income", acct, "0.5", lower=0, upper=100, granularity=1
    )
    # a row moved between groups: two groups change, each at epsilon / 2; the sum's
    # sensitivity is the substitution one, which also covers an addition or removal
    part = IntegerLaplaceMechanism(Fraction(1, 4), 100).charge
    assert res.record.charge == Parallel((part,) * 5, "substitution")
    assert res.cost == PrivacyCost("0.5")


def test_several_groups_per_unit_repeat_the_parallel_record() -> None:
    acct = Accountant(Budget(3))
    g = groupby(frame(), "region", keys=REGIONS, privacy_unit="user",
                max_groups_per_unit=3, max_rows_per_unit=2, rng=seeded())
    res = g.count(acct, "1.5")
    part = IntegerLaplaceMechanism(Fraction(1, 2), 2).charge  # epsilon / G, sensitivity R
    assert res.record.charge == Repeated(Parallel((part,) * 5), 3)
    assert res.cost == PrivacyCost("1.5")
    assert res.sensitivity == 2


def test_mean_histogram_and_quantile_parts() -> None:
    acct = Accountant(Budget(10, "1e-5"))
    g = groupby(frame(), "region", keys=REGIONS)
    mean = g.mean("income", acct, 1, lower=0, upper=100, granularity=1)
    assert isinstance(mean.record.charge, Parallel)
    assert mean.cost == PrivacyCost(1)
    hist = g.histogram("income", acct, 1, bins=[0, 50, 100], delta="1e-6")
    gauss = IntegerGaussianMechanism(1, "1e-6", 1).charge
    assert hist.record.charge == Parallel((gauss,) * 5)
    assert hist.cost.delta <= Fraction(1, 10**6)
    quant = g.quantile("income", acct, 1, "0.5", lower=0, upper=100, grid_size=101)
    assert quant.record.charge == Parallel((ExponentialMechanism(1, Fraction(1, 2)).charge,) * 5)
    assert list(hist.frame.index.names) == ["region", "bin"]
    assert len(hist.frame) == 10


# -- checks before the charge ----------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda df, acct: groupby(df, "nope", keys=REGIONS),
        lambda df, acct: groupby(df, "region", keys=["a", "a"]),
        lambda df, acct: groupby(df, "region", keys=[]),
        lambda df, acct: groupby(df, "region", max_rows_per_unit=2),
        lambda df, acct: groupby(df, "region", privacy_unit="nobody"),
        lambda df, acct: groupby(df, "region", privacy_unit="user", max_groups_per_unit=0),
        lambda df, acct: groupby(df["income"], "region"),
        lambda df, acct: groupby(df, "region", keys=REGIONS).sum(
            "region", acct, 1, lower=0, upper=1),
        lambda df, acct: groupby(df, "region", keys=REGIONS).mean(
            "missing", acct, 1, lower=0, upper=1),
        lambda df, acct: groupby(df, "region", keys=REGIONS).sum(
            "income", acct, 1, lower=1, upper=0),
        lambda df, acct: groupby(df, "region").count(acct, 1),  # private keys need delta
        lambda df, acct: groupby(df, "region", keys=REGIONS).count(acct, float("nan")),
        lambda df, acct: groupby(df, "region", keys=REGIONS).quantile(
            "income", acct, 1, 2, lower=0, upper=1),
    ],
)
def test_bad_input_is_refused_before_anything_is_charged(call: Any) -> None:
    acct = Accountant(Budget(10, "1e-5"))
    with pytest.raises((ConfigError, InvalidCostError)):
        call(frame(), acct)
    assert len(acct.records) == 0


def test_a_polars_lazy_frame_is_refused_before_the_charge() -> None:
    pl = pytest.importorskip("polars")
    lazy = pl.DataFrame(columns()).lazy()
    with pytest.raises(InvalidCostError, match="lazy frame"):
        groupby(lazy, "region", keys=REGIONS)


def test_query_id_makes_a_retry_a_refusal_not_a_second_charge() -> None:
    acct = Accountant(Budget(10))
    g = groupby(frame(), "region", keys=REGIONS)
    g.count(acct, 1, query_id="nightly-2026-11-25")
    with pytest.raises(DuplicateQueryError):
        g.count(acct, 1, query_id="nightly-2026-11-25")
    assert len(acct.records) == 1


# -- what is computed ------------------------------------------------------------------


def test_declared_keys_keep_their_order_and_other_keys_are_dropped() -> None:
    df = pd.DataFrame({
        "region": ["north", "north", "mars", None, np.nan, "south", "south", "south"],
        "income": [1.0, 2.0, 100.0, 100.0, 100.0, 3.0, 3.0, 3.0],
    })
    acct = Accountant(Budget(10**6))
    keys = ["south", "north", "empty"]
    g = groupby(df, "region", keys=keys, rng=seeded())
    counts = g.count(acct, 10**5)  # noise scale 1e-5: zero with overwhelming probability
    assert list(counts.frame.index) == keys
    assert counts.frame["value"].tolist() == [3.0, 2.0, 0.0]
    sums = g.sum("income", acct, 10**5, lower=0, upper=10, granularity="0.5")
    assert sums.frame["value"].tolist() == [9.0, 3.0, 0.0]


def test_mean_intervals_cover_the_clipped_means() -> None:
    df = frame(20_000)
    acct = Accountant(Budget(10))
    res = groupby(df, "region", keys=REGIONS, rng=seeded(5)).mean(
        "income", acct, 1, lower=0, upper=100)
    truth = df.groupby("region")["income"].mean()
    for key in REGIONS:
        row = res.frame.loc[key]
        assert row["low"] <= row["value"] <= row["high"]
        assert row["high"] - row["low"] < 1.0  # 4,000 rows a group at epsilon 1
        assert abs(row["value"] - truth[key]) < 1.0


def test_a_mean_carries_the_count_it_paid_for() -> None:
    # The noisy count the mean divides by comes with it, with the interval a count
    # call at the mean's count share would give: one charge, one pass, both answers.
    df = frame(20_000)
    acct = Accountant(Budget(10))
    g = groupby(df, "region", keys=REGIONS, privacy_unit="user", max_groups_per_unit=2,
                max_rows_per_unit=3, rng=seeded(7))
    res = g.mean("income", acct, 2, lower=0, upper=100, count_share="1/4")
    assert len(acct.records) == 1
    assert list(res.frame.columns) == ["value", "low", "high"]  # the frame is unchanged
    alone = g.count(acct, "0.5")  # the same mechanism: epsilon 2 * 1/4
    assert alone.cost == PrivacyCost("0.5")
    assert res.counts is not None and alone.counts is None
    assert list(res.counts.index) == list(alone.frame.index)
    for key in REGIONS:
        row = res.counts.loc[key]
        assert row["low"] <= row["value"] <= row["high"]
        assert row["high"] - row["value"] == pytest.approx(alone.error_bound)
        # both estimate a bounded count of about 2,600 rows (their bounding samples
        # differ): far apart only if the bounded counts were not the same quantity
        assert abs(row["value"] - alone.frame.loc[key, "value"]) < 0.2 * row["value"]
    exact = groupby(df, "region", keys=REGIONS).mean("income", Accountant(Budget(10**6)),
                                                    10**5, lower=0, upper=100)
    sizes = df.groupby("region").size()
    assert exact.counts is not None
    for key in REGIONS:  # no unit, epsilon 10**5: the count is the group's size
        assert round(exact.counts.loc[key, "value"]) == sizes[key]
    assert res.clamped(0, 100).counts is res.counts  # post-processing of the mean only


def test_private_keys_release_big_groups_and_not_a_lone_person() -> None:
    df = frame(5_000)
    lone = pd.DataFrame({"user": [10**9], "region": ["only-me"], "income": [1.0]})
    acct = Accountant(Budget(5, "1e-5"))
    res = groupby(pd.concat([df, lone]), "region", rng=seeded(2)).count(
        acct, 1, delta="1e-6")
    assert res.keys_selected
    assert sorted(res.frame.index) == sorted(REGIONS)  # ~1,000 rows each: far above T
    charge = res.record.charge
    assert isinstance(charge, Parallel) and len(charge.partitions) == 2  # domain not recorded
    assert res.cost.epsilon == 1 and res.cost.delta <= Fraction(1, 10**6)


def test_threshold_selection_delta_is_the_exact_tail_and_the_threshold_minimal() -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    for eps, delta in [(Fraction(1), Fraction(1, 10**6)), (Fraction(1, 10), Fraction(1, 10**9)),
                       (Fraction(3), Fraction(1, 100))]:
        sel = ThresholdSelection.calibrate(eps, delta)
        q = mpmath.e ** (-mpmath.mpf(eps.numerator) / eps.denominator)
        exact = _tail(mpmath, q, sel.threshold - 1)
        as_mpf = mpmath.mpf(sel.delta.numerator) / sel.delta.denominator
        assert exact <= as_mpf <= mpmath.mpf(delta.numerator) / delta.denominator
        # no smaller threshold fits
        assert sel.threshold == 2 or _tail(mpmath, q, sel.threshold - 2) > (
            mpmath.mpf(delta.numerator) / delta.denominator)


def _tail(mpmath: Any, q: Any, m: int) -> Any:
    """P[Y >= m] for P[Y = y] = (1 - q) / (1 + q) q^|y|, summed term by term."""
    return mpmath.nsum(lambda y: (1 - q) / (1 + q) * q**y, [m, mpmath.inf])


def test_polars_in_and_out() -> None:
    pl = pytest.importorskip("polars")
    df = pl.DataFrame(columns())
    acct = Accountant(Budget(2))
    res = groupby(df, "region", keys=REGIONS).mean("income", acct, 1, lower=0, upper=100)
    out = res.to_polars()
    assert out.columns == ["region", "value", "low", "high"]
    assert out.height == 5


def test_clamped_is_free_post_processing() -> None:
    acct = Accountant(Budget(1))
    res = groupby(frame(), "region", keys=[*REGIONS, "empty"]).count(acct, "0.01")
    clamped = res.clamped()
    assert (clamped.frame[["value", "low", "high"]] >= 0).all().all()
    assert clamped.record is res.record and len(acct.records) == 1


def test_error_bound_matches_the_noise_tail() -> None:
    acct = Accountant(Budget(1))
    res = groupby(frame(), "region", keys=REGIONS).count(acct, 1)
    # discrete Laplace of scale 1: P[|Y| >= m] = 2 e^-m / (1 + e^-1) <= 0.05 from m = 4
    q = math.exp(-1)
    m = next(m for m in range(1, 50) if 2 * q**m / (1 + q) <= 0.05)
    assert res.error_bound == m - 1
    assert "GroupedResult(5 rows" in repr(res)


def test_aggregates_exports_groupby() -> None:
    assert aggregates.groupby is groupby


def test_preview_states_cost_admission_and_error_without_charging() -> None:
    acct = Accountant(Budget(1))
    g = groupby(frame(), "region", keys=REGIONS)
    p = g.preview("count", acct, "0.5")
    assert p.cost == PrivacyCost("0.5") and p.admitted and len(acct.records) == 0
    ran = g.count(acct, "0.5")
    assert p.error_bound == ran.error_bound and p.charge.cost == ran.cost
    over = g.preview("mean", acct, "income", 1, lower=0, upper=100)
    assert not over.admitted and over.error_bound is None and len(acct.records) == 1
    q = g.preview("quantile", acct, "income", "0.5", "0.5", lower=0, upper=100, grid_size=11)
    assert q.error_bound is not None and q.error_bound > 0
    with pytest.raises(ConfigError, match="unknown statistic"):
        g.preview("median", acct, "income", 1)
    with pytest.raises(ConfigError):  # the statistic's own checks run
        g.preview("sum", acct, "missing", 1, lower=0, upper=1)
    assert len(acct.records) == 1
