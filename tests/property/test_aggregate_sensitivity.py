"""Property tests: the implemented (pre-noise) answers of the guarded aggregates move by
at most the declared sensitivity when one record is added, removed or changed.

The inputs are adversarial on purpose (Casacuberta, Shoemate, Vadhan and Wagaman 2022):
values at, near and far outside the clipping bounds, NaN and infinities, subnormals,
huge counts of tiny values, and arbitrary orderings. The implemented sum is an exact
integer sum on a power-of-two lattice, so the bound must hold with no tolerance at all.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpaccount.aggregates import (
    FixedPoint,
    histogram_counts,
    lattice_sum,
    quantile_utilities,
    sum_sensitivity,
)
from dpaccount.charges import Relation

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
FINITE = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


@st.composite
def bounds(draw: st.DrawFn) -> tuple[float, float]:
    lo = draw(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
    width = draw(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False))
    hi = lo + width
    assume(hi > lo and math.isfinite(hi))
    return lo, hi


@st.composite
def near_bounds(draw: st.DrawFn, lo: float, hi: float) -> float:
    """Values at, just inside and just outside the bounds, or anywhere."""
    base = draw(st.sampled_from([lo, hi, 0.0, (lo + hi) / 2]))
    steps = draw(st.integers(-3, 3))
    value = base
    for _ in range(abs(steps)):
        value = math.nextafter(value, math.inf if steps > 0 else -math.inf)
    return draw(st.one_of(st.just(value), ANY_FLOAT, FINITE))


@st.composite
def dataset_and_record(draw: st.DrawFn) -> tuple[float, float, list[float], float]:
    lo, hi = draw(bounds())
    values = draw(st.lists(near_bounds(lo, hi), max_size=40))
    tiny = draw(st.sampled_from([0.0, 5e-324, 1e-300, lo / 3 if lo > 0 else 1e-12]))
    values += [tiny] * draw(st.sampled_from([0, 1, 5_000]))  # huge counts of tiny values
    record = draw(near_bounds(lo, hi))
    order = draw(st.randoms(use_true_random=False))
    order.shuffle(values)
    return lo, hi, values, record


RELATIONS = st.sampled_from(list(Relation))


@settings(max_examples=100, deadline=None)
@given(dataset_and_record(), RELATIONS)
def test_sum_moves_at_most_the_declared_sensitivity(
    case: tuple[float, float, list[float], float], relation: Relation
) -> None:
    lo, hi, values, record = case
    fp = FixedPoint.build(lo, hi)
    s = sum_sensitivity(fp, relation)
    base = lattice_sum(values, fp)
    # add / remove one record (also "moves in or out of the selection" under substitution)
    assert abs(lattice_sum([*values, record], fp) - base) <= s
    assert abs(lattice_sum([record, *values], fp) - base) <= s
    if values:
        changed = [record, *values[1:]]
        if relation is Relation.SUBSTITUTION:
            assert abs(lattice_sum(changed, fp) - base) <= s
        assert abs(lattice_sum(values[1:], fp) - base) <= s


@settings(max_examples=100, deadline=None)
@given(dataset_and_record(), RELATIONS)
def test_centred_sum_of_the_mean_moves_at_most_its_sensitivity(
    case: tuple[float, float, list[float], float], relation: Relation
) -> None:
    lo, hi, values, record = case
    fp = FixedPoint.build(lo, hi)
    c = (fp.a + fp.b) // 2
    s = sum_sensitivity(fp, relation, c)
    base = lattice_sum(values, fp, c)
    assert abs(lattice_sum([*values, record], fp, c) - base) <= s
    if values and relation is Relation.SUBSTITUTION:
        assert abs(lattice_sum([*values[:-1], record], fp, c) - base) <= s
    # The mean's centred sensitivity is about half the range, never more than b - a.
    assert s <= max(fp.b - fp.a, 1)


@settings(max_examples=100, deadline=None)
@given(dataset_and_record())
def test_the_implemented_sum_ignores_order_and_is_the_exact_clipped_sum(
    case: tuple[float, float, list[float], float],
) -> None:
    lo, hi, values, _record = case
    fp = FixedPoint.build(lo, hi)
    forward = lattice_sum(values, fp)
    assert lattice_sum(values[::-1], fp) == forward
    assert lattice_sum(sorted(values, key=lambda v: (math.isnan(v), v)), fp) == forward
    # Independent computation with exact rationals: clip, round half to even, add.
    g = fp.granularity
    total = 0
    for v in values:
        x = fp.fill if math.isnan(v) else min(max(v, lo), hi)
        total += round(Fraction(x) / g)
    assert forward == total


@settings(max_examples=100, deadline=None)
@given(
    st.lists(ANY_FLOAT, max_size=60),
    ANY_FLOAT,
    st.fractions(min_value=0, max_value=1, max_denominator=100),
    st.lists(FINITE, min_size=1, max_size=20),
)
def test_quantile_utilities_move_at_most_the_sensitivity(
    values: list[float], record: float, q: Fraction, grid: list[float]
) -> None:
    base = quantile_utilities(values, grid, q)
    added = quantile_utilities([*values, record], grid, q)
    assert max(abs(a - b) for a, b in zip(added, base, strict=True)) <= max(q, 1 - q)
    if values:
        changed = quantile_utilities([record, *values[1:]], grid, q)
        assert max(abs(a - b) for a, b in zip(changed, base, strict=True)) <= 1


@settings(max_examples=100, deadline=None)
@given(
    st.lists(ANY_FLOAT, max_size=60),
    ANY_FLOAT,
    st.lists(FINITE, min_size=2, max_size=10, unique=True),
)
def test_histogram_counts_move_by_one_bin_or_two(
    values: list[float], record: float, edges: list[float]
) -> None:
    edges = sorted(edges)
    base = np.array(histogram_counts(values, edges))
    added = np.array(histogram_counts([*values, record], edges))
    assert np.abs(added - base).sum() <= 1
    if values:
        changed = np.array(histogram_counts([record, *values[1:]], edges))
        assert np.abs(changed - base).sum() <= 2
        assert np.abs(changed - base).max() <= 1
