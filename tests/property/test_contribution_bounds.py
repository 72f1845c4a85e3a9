"""Contribution bounding: no unit ever exceeds its bounds, and no more is dropped than needed.

Also the adversarial inputs of the pipelines issue (one unit with a million rows, missing
keys and units, keys outside the declared set) and a uniformity check of the sampling.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaccount import Accountant, Budget, Parallel
from dpaccount.aggregates import ContributionBounds, bound_contributions, groupby
from dpaccount.aggregates.units import _by_segment_then_priority
from dpaccount.mechanisms import IntegerLaplaceMechanism
from dpaccount.mechanisms._sampling import RandomSource

codes = st.lists(
    st.tuples(st.integers(-1, 6), st.integers(-1, 5)), min_size=0, max_size=300
)


def _check(units: np.ndarray, groups: np.ndarray, bounds: ContributionBounds,
           kept: np.ndarray) -> None:
    valid = (units >= 0) & (groups >= 0)
    assert np.all(valid[kept]), "a row with a missing unit or group was kept"
    assert np.all(np.diff(kept) > 0), "indices are ascending and distinct"
    for u in set(units[valid].tolist()):
        mine = kept[units[kept] == u]
        per_group = Counter(groups[mine].tolist())
        # the bounds hold ...
        assert len(per_group) <= bounds.max_groups_per_unit
        assert all(c <= bounds.max_rows_per_unit for c in per_group.values())
        # ... and nothing more is dropped than they require
        all_groups = Counter(groups[valid & (units == u)].tolist())
        assert len(per_group) == min(bounds.max_groups_per_unit, len(all_groups))
        for g, c in per_group.items():
            assert c == min(bounds.max_rows_per_unit, all_groups[g])


@settings(max_examples=200, deadline=None)
@given(codes, st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**32))
def test_no_unit_exceeds_its_bounds(pairs: list[tuple[int, int]], g: int, r: int,
                                    seed: int) -> None:
    units = np.array([p[0] for p in pairs], dtype=np.int64)
    groups = np.array([p[1] for p in pairs], dtype=np.int64)
    bounds = ContributionBounds(g, r)
    kept = bound_contributions(units, groups, bounds, RandomSource.seeded(seed))
    _check(units, groups, bounds, kept)


def test_one_unit_with_a_million_rows() -> None:
    n = 1_000_000
    units = np.zeros(n, dtype=np.int64)
    units[::1000] = np.arange(1, n // 1000 + 1)  # a thousand other units, one row each
    groups = np.arange(n, dtype=np.int64) % 7
    bounds = ContributionBounds(2, 3)
    kept = bound_contributions(units, groups, bounds, RandomSource())  # the OS CSPRNG
    big = kept[units[kept] == 0]
    assert len(set(groups[big].tolist())) == 2 and len(big) == 6
    assert np.sum(units[kept] != 0) == n // 1000


def test_adversarial_frame_counts_respect_the_bounds() -> None:
    # one unit floods a group; keys outside the declared set, missing keys and units
    rows = (
        [("flood", "a", 1.0)] * 50_000
        + [("u1", "a", 1.0), ("u1", "b", 1.0), ("u1", "zz", 1.0)]
        + [("u2", None, 1.0), (None, "a", 1.0), ("u3", float("nan"), 1.0)]
    )
    df = pd.DataFrame(rows, columns=["user", "key", "x"])
    acct = Accountant(Budget(10**6))
    g = groupby(df, "key", keys=["a", "b"], privacy_unit="user",
                max_groups_per_unit=1, max_rows_per_unit=2, rng=RandomSource.seeded(4))
    res = g.count(acct, 10**5)  # noise scale 2e-5: zero with overwhelming probability
    counts = res.frame["value"]
    # flood: 2 rows in a; u1: one of a, b (its third key is not declared); others dropped
    assert counts["a"] + counts["b"] == 3
    assert counts["a"] >= 2
    part = IntegerLaplaceMechanism(Fraction(10**5), 2).charge
    assert res.record.charge == Parallel((part, part))


def test_the_rows_kept_are_uniform() -> None:
    """Each of a unit's 5 rows is kept with probability 1/5 (R = 1).

    Chi-square goodness of fit over 5,000 seeded draws; false-positive rate 1e-6.
    """
    units = np.zeros(5, dtype=np.int64)
    groups = np.zeros(5, dtype=np.int64)
    source = RandomSource.seeded(11)
    hits = Counter(
        int(bound_contributions(units, groups, ContributionBounds(1, 1), source)[0])
        for _ in range(5_000)
    )
    observed = [hits[i] for i in range(5)]
    assert stats.chisquare(observed).pvalue > 1e-6


def test_bounds_without_a_privacy_unit_are_refused() -> None:
    from dpaccount import ConfigError

    with pytest.raises(ConfigError, match="privacy_unit"):
        groupby(pd.DataFrame({"k": ["a"]}), "k", max_groups_per_unit=2)


_SMALL = pd.DataFrame({"user": [1, 1, 2, 3], "k": ["a", "b", "a", "c"], "x": [1.0, 2.0, 3.0, 4.0]})


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4), st.integers(1, 4), st.sampled_from(["add_remove", "substitution"]),
    st.fractions(Fraction(1, 100), 5), st.sampled_from(["count", "sum", "mean", "quantile"]),
    st.booleans(),
)
def test_the_group_by_record_is_one_parallel_charge_costing_epsilon(
    g: int, r: int, relation: str, eps: Fraction, statistic: str, declared: bool
) -> None:
    acct = Accountant(Budget(10, "1e-3"), relation=relation)
    by = groupby(_SMALL, "k", keys=["a", "b", "c"] if declared else None, privacy_unit="user",
                 max_groups_per_unit=g, max_rows_per_unit=r, rng=RandomSource.seeded(0))
    delta = 0 if declared else Fraction(1, 10**6)
    if statistic == "count":
        res = by.count(acct, eps, delta=delta)
    elif statistic == "quantile":
        res = by.quantile("x", acct, eps, "0.5", lower=0, upper=4, grid_size=5, delta=delta)
    else:
        res = getattr(by, statistic)("x", acct, eps, lower=0, upper=4, delta=delta)
    assert len(acct.records) == 1
    charge = res.record.charge
    if g > 1:
        assert charge.count == g
        charge = charge.charge
    assert isinstance(charge, Parallel) and charge.relation.value == relation
    assert len(set(charge.partitions)) == 1  # every group is charged alike
    assert len(charge.partitions) == (3 if declared else 2)
    parts = g * (1 if relation == "add_remove" else 2)
    part = charge.partitions[0]
    part_cost = part if isinstance(part, type(res.cost)) else part.cost
    assert part_cost.epsilon * parts == eps  # exact: the record costs what was asked
    assert res.cost.epsilon == eps and res.cost.delta <= delta


def test_keyed_hash_bounding_is_uniform_too() -> None:
    """groupby's keyed-hash priorities keep each of a person's 5 rows with probability 1/5.

    Fresh 112-bit key per trial (as per statistic); the kept row is read off the exact
    sum. Chi-square goodness of fit over 1,500 trials; false-positive rate 1e-6.
    """
    from dpaccount.aggregates import FixedPoint
    from dpaccount.aggregates.engines import BoundingKey, TotalsSpec, partial_totals

    df = pd.DataFrame({"user": [7] * 5, "k": ["a"] * 5, "x": [0.0, 1.0, 2.0, 3.0, 4.0]})
    fp = FixedPoint.build(0, 4, granularity=1)
    hits: Counter[int] = Counter()
    for _ in range(1_500):
        spec = TotalsSpec("k", ("a",), "user", ContributionBounds(1, 1), BoundingKey.draw(),
                          column="x", fp=fp)
        hits[partial_totals(df, spec)[0].total] += 1
    assert sorted(hits) == [0, 1, 2, 3, 4]
    assert stats.chisquare([hits[i] for i in range(5)]).pvalue > 1e-6


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(0, 300), segment_bits=st.integers(0, 40),
       priority_bits=st.sampled_from([1, 3, 20, 64]))
def test_the_packed_sort_orders_exactly_as_lexsort(data: st.DataObject, n: int,
                                                   segment_bits: int,
                                                   priority_bits: int) -> None:
    """Ranking within units packs (segment, priority) into one key; its order is
    ``np.lexsort((priority, segment))`` exactly, ties (few priority bits) and segments
    too wide to pack (> 32 bits) included, so the rows kept never depend on the path."""
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    segment = rng.integers(0, 2**segment_bits, n, dtype=np.int64) if segment_bits else \
        np.zeros(n, dtype=np.int64)
    top = 2**priority_bits - 1 if priority_bits < 64 else 2**64 - 1
    priority = rng.integers(0, top, n, dtype=np.uint64, endpoint=True)
    assert _by_segment_then_priority(segment, priority).tolist() == \
        np.lexsort((priority, segment)).tolist()

