"""Unit tests of the guarded aggregates: charge before data, costs, relations, results."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpaccount import Accountant, Budget, BudgetExceededError, PrivacyCost
from dpaccount import aggregates as agg
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms import RandomSource


class _Untouchable:
    """Data that fails the test if anything reads it."""

    def __len__(self) -> int:
        raise AssertionError("the data was read")

    def __iter__(self) -> Any:
        raise AssertionError("the data was read")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the data was read")

    def to_numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the data was read")

    def tolist(self) -> Any:
        raise AssertionError("the data was read")


class _Spy(list[float]):
    """A list that records the ledger's spent epsilon when it is first read."""

    def __init__(self, values: list[float], acct: Accountant) -> None:
        super().__init__(values)
        self.acct = acct
        self.seen: list[Fraction] = []

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        self.seen.append(self.acct.spent.epsilon)
        return np.asarray(list(self), dtype=dtype)

    def __len__(self) -> int:
        self.seen.append(self.acct.spent.epsilon)
        return super().__len__()


CALLS = [
    lambda d, a, r: agg.count(d, a, 1, rng=r),
    lambda d, a, r: agg.sum(d, a, 1, lower=0, upper=10, rng=r),
    lambda d, a, r: agg.mean(d, a, 1, lower=0, upper=10, rng=r),
    lambda d, a, r: agg.histogram(d, a, 1, bins=[0, 5, 10], rng=r),
    lambda d, a, r: agg.quantile(d, a, 1, "0.5", lower=0, upper=10, grid_size=11, rng=r),
]


@pytest.mark.parametrize("call", CALLS)
def test_refusal_happens_before_the_data_is_read(call: Any) -> None:
    acct = Accountant(Budget("0.5"))
    with pytest.raises(BudgetExceededError):
        call(_Untouchable(), acct, RandomSource.seeded(0))
    assert acct.spent == PrivacyCost(0)
    assert len(acct.records) == 0


@pytest.mark.parametrize("call", CALLS)
def test_the_charge_is_recorded_before_the_data_is_read(call: Any) -> None:
    acct = Accountant(Budget(5))
    data = _Spy([1.0, 2.0, 7.0], acct)
    res = call(data, acct, RandomSource.seeded(0))
    assert data.seen and all(seen == 1 for seen in data.seen)
    assert res.cost.epsilon == 1 and acct.spent.epsilon == 1


def test_pandas_series_with_missing_values_and_nullable_dtypes() -> None:
    acct = Accountant(10)
    rng = RandomSource.seeded(1)
    s = pd.Series([1.0, np.nan, 3.0, 50.0])
    n = pd.Series([1, None, 3, 50], dtype="Int64")
    for data in (s, n):
        res = agg.sum(data, acct, 1, lower=0, upper=10, rng=rng)
        assert res.interval is not None
        lo, hi = res.interval
        assert lo <= res.value <= hi
    # The implemented true answer: NaN -> fill 0, 50 clipped to 10: 1 + 0 + 3 + 10.
    fp = agg.FixedPoint.build(0, 10)
    assert agg.lattice_sum(s, fp) * fp.granularity == 14
    assert agg.lattice_sum(n, fp) * fp.granularity == 14


def test_count_accepts_a_dataframe() -> None:
    df = pd.DataFrame({"a": range(30)})
    res = agg.count(df, Accountant(1), 1, rng=RandomSource.seeded(2))
    assert res.value == pytest.approx(30, abs=30)


def test_sensitivities_follow_the_accountants_relation() -> None:
    add = Accountant(100)
    sub = Accountant(100, relation="substitution")
    kw: dict[str, Any] = {"lower": -2, "upper": 6, "granularity": 1}
    assert agg.sum([1.0], add, 1, **kw).sensitivity == 6          # max(|a|, |b|)
    assert agg.sum([1.0], sub, 1, **kw).sensitivity == 8          # b - a
    assert agg.mean([1.0], add, 1, **kw).sensitivity == 4         # centred at 2
    assert agg.mean([1.0], sub, 1, **kw).sensitivity == 8
    assert agg.histogram([1.0], add, 1, bins=[0, 1, 2]).sensitivity == 1
    assert agg.histogram([1.0], sub, 1, bins=[0, 1, 2]).sensitivity == 2
    q = agg.quantile([1.0], add, 1, "0.25", candidates=[0, 1])
    assert q.sensitivity == Fraction(3, 4)
    assert agg.quantile([1.0], sub, 1, "0.25", candidates=[0, 1]).sensitivity == 1
    assert agg.count([1.0], sub, 1).sensitivity == 1


def test_gaussian_variants_charge_at_most_the_requested_delta() -> None:
    acct = Accountant((100, "1e-3"))
    data = np.linspace(0, 10, 101)
    for fn in (agg.count, agg.histogram):
        kwargs: dict[str, Any] = {"bins": [0, 5, 10]} if fn is agg.histogram else {}
        res = fn(data, acct, 1, delta="1e-6", **kwargs)
        assert 0 < res.cost.delta <= Fraction(1, 10**6) and res.cost.epsilon == 1
    res = agg.sum(data, acct, 1, lower=0, upper=10, delta="1e-6")
    assert 0 < res.cost.delta <= Fraction(1, 10**6)
    res = agg.mean(data, acct, 1, lower=0, upper=10, delta="1e-6")
    assert res.cost.epsilon == 1 and 0 < res.cost.delta <= Fraction(1, 10**6)


def test_mean_splits_epsilon_and_stays_in_bounds() -> None:
    acct = Accountant(10)
    res = agg.mean([5.0] * 1000, acct, 1, lower=0, upper=10, count_share="1/4",
                   rng=RandomSource.seeded(3))
    assert res.cost == PrivacyCost(1)
    assert len(acct.records) == 1
    assert res.interval is not None
    lo, hi = res.interval
    assert 0 <= lo <= res.value <= hi <= 10


def test_intervals_cover_at_the_stated_level() -> None:
    # 1000 independent noisy counts with 95% intervals: misses ~ Binomial(1000, <= 0.05),
    # mean <= 50, sd <= 6.9; more than 85 misses has probability < 1e-6 for a correct
    # interval. Same for sums.
    acct = Accountant(Budget.unlimited())
    rng = RandomSource.seeded(4)
    misses_count = misses_sum = 0
    data = np.full(40, 2.5)
    for _ in range(1000):
        c = agg.count(data, acct, "0.3", rng=rng)
        assert c.interval is not None
        misses_count += not c.interval[0] <= 40 <= c.interval[1]
        s = agg.sum(data, acct, "0.3", lower=0, upper=4, rng=rng)
        assert s.interval is not None
        misses_sum += not s.interval[0] <= 100 <= s.interval[1]
    assert misses_count <= 85 and misses_sum <= 85
    # ... and are not absurdly wide: the discrete Laplace 95% half-width at scale
    # 1/0.3 is about ln(20) / 0.3 ~ 10.
    assert c.error_bound <= 11


def test_quantile_lands_within_its_rank_error_bound() -> None:
    # The bound holds with probability >= level = 1 - 1e-6 (Dwork and Roth 2014, Thm 3.11).
    acct = Accountant(Budget.unlimited())
    data = np.arange(1000, dtype=np.float64)
    res = agg.quantile(data, acct, 2, "0.5", lower=0, upper=999, grid_size=1000,
                       level=1 - 1e-6, rng=RandomSource.seeded(5))
    rank = np.searchsorted(data, res.value, side="right")
    assert abs(rank - 500) <= res.error_bound + 1


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda a: agg.sum([1.0], a, 1, lower=1, upper=1), InvalidCostError),
        (lambda a: agg.sum([1.0], a, 1, lower=0, upper=float("nan")), InvalidCostError),
        (lambda a: agg.sum([1.0], a, 1, lower=0, upper=1, granularity=3), InvalidCostError),
        (lambda a: agg.sum([1.0], a, 1, lower=0, upper=1, level=1), InvalidCostError),
        (lambda a: agg.sum([1.0], a, 0, lower=0, upper=1), InvalidCostError),
        (lambda a: agg.count([1.0], a, 1, mechanism="laplace", delta="1e-6"), ConfigError),
        (lambda a: agg.count([1.0], a, 1, mechanism="gaussian"), InvalidCostError),
        (lambda a: agg.count([1.0], a, 1, mechanism="cauchy"), ConfigError),
        (lambda a: agg.histogram([1.0], a, 1, bins=[2, 1]), InvalidCostError),
        (lambda a: agg.histogram([1.0], a, 1), ConfigError),
        (lambda a: agg.quantile([1.0], a, 1, "1.5", candidates=[1]), InvalidCostError),
        (lambda a: agg.quantile([1.0], a, 1, "0.5"), ConfigError),
        (lambda a: agg.mean([1.0], a, 1, lower=0, upper=1, count_share=1), InvalidCostError),
    ],
)
def test_invalid_parameters_are_refused_before_charging(call: Any, error: type) -> None:
    acct = Accountant(10)
    with pytest.raises(error):
        call(acct)
    assert len(acct.records) == 0


def test_not_an_accountant_is_refused() -> None:
    with pytest.raises(ConfigError):
        agg.count([1], object(), 1)  # type: ignore[arg-type]


def test_non_numeric_data_fails_after_the_charge_without_echoing_values() -> None:
    acct = Accountant(10)
    with pytest.raises(InvalidCostError) as info:
        agg.sum(["secret-value"], acct, 1, lower=0, upper=1)
    assert "secret" not in str(info.value)
    assert acct.spent.epsilon == 1  # no refunds


def test_histogram_with_categories() -> None:
    res = agg.histogram(["a", "b", "b", "z", ["unhashable"]], Accountant(1), 1,
                        categories=["a", "b"], rng=RandomSource.seeded(6))
    assert res.value.shape == (2,)
    assert res.interval is not None
    lo, hi = res.interval
    assert np.all(lo <= res.value) and np.all(res.value <= hi)


def test_integer_mechanisms_charge_exactly() -> None:
    lap = agg.IntegerLaplaceMechanism("0.5", 3)
    assert lap.charge.cost == PrivacyCost("0.5") and lap.scale == 6
    # the charge describes the sampler for the tight engines: b, S, changed coordinates
    assert (lap.charge.scale, lap.charge.sensitivity, lap.charge.dimension) == (6, 3, 1)
    # Variance of the discrete Laplace: 2q / (1 - q)², q = exp(-1/6).
    q = math.exp(-1 / 6)
    assert lap.variance == pytest.approx(2 * q / (1 - q) ** 2)
    gau = agg.IntegerGaussianMechanism(1, "1e-6", 1)
    assert gau.charge.delta <= Fraction(1, 10**6)
    assert gau.charge.sigma ** 2 == gau.sigma2 and gau.charge.sensitivity == 1
    # two changed coordinates of shift 3: the L2 bound ceil(3 sqrt 2) = 5
    assert agg.IntegerGaussianMechanism(1, "1e-6", 3, coordinates=2).charge.sensitivity == 5
    # The continuous analytic Gaussian (Balle and Wang 2018, Thm 8) needs sigma = 4.2247
    # at (1, 1e-6) and sensitivity 1 (root of Phi(1/(2s) - s) - e Phi(-1/(2s) - s) = 1e-6,
    # solved with scipy.optimize.brentq); the discrete one must be within 2 %.
    assert 4.2 < math.sqrt(gau.sigma2) < 4.31


class _LazyFrame:
    """Stands for a polars LazyFrame: a plan of work with collect(), no data."""

    def __len__(self) -> int:
        raise AssertionError("a lazy frame must not be read")

    def collect(self) -> None:
        raise AssertionError("a lazy frame must not be run")


@pytest.mark.parametrize("data", [_LazyFrame(), (x for x in range(3)), "123", {"a": 1}, 5],
                         ids=lambda d: type(d).__name__)
def test_containers_that_cannot_be_read_are_refused_before_the_charge(data: object) -> None:
    # Issue (pipelines, item 4): a polars LazyFrame used to cost epsilon = 0.5, then raise.
    from dpaccount import aggregates

    acct = Accountant(Budget(10))
    for call in (
        lambda: aggregates.count(data, acct, "0.5"),
        lambda: aggregates.sum(data, acct, "0.5", lower=0, upper=1),
        lambda: aggregates.mean(data, acct, "0.5", lower=0, upper=1),
        lambda: aggregates.histogram(data, acct, "0.5", bins=[0, 1, 2]),
        lambda: aggregates.quantile(data, acct, "0.5", q="0.5", lower=0, upper=10),
    ):
        with pytest.raises(InvalidCostError, match="data"):
            call()
    assert len(acct.records) == 0


def test_aggregates_take_a_query_id_and_never_charge_twice() -> None:
    from dpaccount import DuplicateQueryError, aggregates

    acct = Accountant(Budget(10))
    values = np.array([1.0, 2.0, 3.0])
    aggregates.sum(values, acct, "0.5", lower=0, upper=5, query_id="nightly-sum")
    with pytest.raises(DuplicateQueryError):
        aggregates.sum(values, acct, "0.5", lower=0, upper=5, query_id="nightly-sum")
    aggregates.count(values, acct, "0.5", query_id="nightly-count")
    assert [r.query_id for r in acct.records] == ["nightly-sum", "nightly-count"]


def test_clamping_and_rounding_are_free_post_processing() -> None:
    # Issue (pipelines, item 6): noisy counts could be negative with no option.
    from dpaccount import aggregates

    acct = Accountant(Budget(100))
    source = RandomSource.seeded(3)
    results = [aggregates.count([], acct, "0.05", rng=source) for _ in range(20)]
    assert any(r.value < 0 for r in results)  # at epsilon 0.05 about half are negative
    for r in results:
        c = r.clamped()
        assert c.value >= 0 and c.interval is not None and c.interval[0] >= 0
        assert c.record is r.record  # the same charge: nothing new is recorded
        rounded = r.clamped().rounded()
        assert float(rounded.value).is_integer()
        assert rounded.interval[0] <= c.interval[0] and rounded.interval[1] >= c.interval[1]
    assert len(acct.records) == 20
    hist = aggregates.histogram(np.array([0.5]), acct, "0.05", bins=[0, 1, 2], rng=source)
    assert np.all(hist.clamped().value >= 0)
    assert len(acct.records) == 21


@pytest.mark.parametrize(
    ("aggregate", "options"),
    [
        (agg.count, {}),
        (agg.count, {"delta": "1e-6"}),
        (agg.sum, {"lower": 0, "upper": 100}),
        (agg.histogram, {"bins": [0, 50, 100]}),
        (agg.histogram, {"categories": [1, 2, 3], "delta": "1e-6", "level": 0.9}),
    ],
)
def test_preview_is_what_the_aggregate_then_does(aggregate: Any, options: dict[str, Any]
                                                ) -> None:
    data = np.array([1.0, 2.0, 3.0, 70.0])
    acct = Accountant(Budget(1, "1e-5"))
    seen = agg.preview(aggregate, data, acct, "0.4", **options)
    assert acct.records == ()  # nothing charged
    assert seen.admitted and seen.charge.spent == PrivacyCost(0)
    result = aggregate(data, acct, "0.4", rng=RandomSource.seeded(1), **options)
    assert result.cost == seen.cost
    assert float(result.error_bound) == pytest.approx(seen.error_bound)
    assert acct.spent == seen.charge.spent_after


def test_preview_reads_no_data_and_refuses_other_aggregates() -> None:
    acct = Accountant(Budget(1, "1e-5"))
    with pytest.raises(AssertionError):  # the real count reads len(); preview must not
        agg.count(_Sized(), acct, "0.1")
    acct = Accountant(Budget(1, "1e-5"))
    assert agg.preview(agg.count, _Sized(), acct, "0.1").admitted
    with pytest.raises(ConfigError, match="count, sum, mean, histogram and quantile"):
        agg.preview(len, [1.0], acct, "0.1")
    assert not agg.preview(agg.count, [1], acct, 5).admitted


def test_preview_of_mean_and_quantile() -> None:
    acct = Accountant(Budget(1))
    mean = agg.preview(agg.mean, _Sized(), acct, "0.5", lower=0, upper=1)
    assert mean.cost == PrivacyCost("0.5") and mean.error_bound is None
    seen = agg.preview(agg.quantile, _Sized(), acct, "0.5", q="0.5", lower=0, upper=10,
                       grid_size=11)
    ran = agg.quantile([1.0, 5.0], acct, "0.5", q="0.5", lower=0, upper=10, grid_size=11)
    assert seen.error_bound == ran.error_bound and seen.cost == ran.cost
    with pytest.raises(InvalidCostError):  # the aggregate's own checks run
        agg.preview(agg.quantile, [1.0], acct, "0.5", q=2, lower=0, upper=1)
    assert len(acct.records) == 1


class _Sized:
    """A container whose contents must not be read."""

    def __len__(self) -> int:
        raise AssertionError("preview read the data")


# -- privacy units on one column ---------------------------------------------------------


def test_privacy_unit_bounds_each_persons_rows_and_scales_the_sensitivity() -> None:
    from dpaccount import aggregates
    from dpaccount.mechanisms import IntegerLaplaceMechanism

    # one person with 1,000 rows, 10 people with one row each
    units = np.array([0] * 1000 + list(range(1, 11)))
    values = np.ones(units.size)
    acct = Accountant(Budget(10**6))
    res = aggregates.count(values, acct, 10**5, privacy_unit=units, max_rows_per_unit=3,
                           rng=RandomSource.seeded(1))
    assert res.value == 13.0  # noise of scale 3e-5 is zero with overwhelming probability
    assert res.sensitivity == 3
    assert res.record.charge == IntegerLaplaceMechanism(10**5, 3).charge
    total = aggregates.sum(values * 5, acct, 10**5, lower=0, upper=10, granularity=1,
                           privacy_unit=units, max_rows_per_unit=2)
    assert total.value == 60.0 and total.sensitivity == 20
    hist = aggregates.histogram(values, acct, 10**5, bins=[0, 2, 4], privacy_unit=units,
                                max_rows_per_unit=2)
    assert hist.value.tolist() == [12.0, 0.0] and hist.sensitivity == 2
    mean = aggregates.mean(values, acct, 10**5, lower=0, upper=2, privacy_unit=units,
                           max_rows_per_unit=2)
    assert abs(mean.value - 1.0) < 1e-3  # noise of a few lattice steps of 2**-29


def test_privacy_unit_mistakes_are_refused_before_the_charge() -> None:
    from dpaccount import ConfigError, aggregates

    acct = Accountant(Budget(10))
    with pytest.raises(ConfigError, match="privacy_unit"):
        aggregates.count([1, 2], acct, 1, max_rows_per_unit=2)
    with pytest.raises(InvalidCostError, match="same length"):
        aggregates.sum([1.0, 2.0], acct, 1, lower=0, upper=1, privacy_unit=[1])
    with pytest.raises(InvalidCostError, match="max_rows_per_unit"):
        aggregates.mean([1.0], acct, 1, lower=0, upper=1, privacy_unit=[1],
                        max_rows_per_unit=0)
    assert len(acct.records) == 0


@pytest.mark.parametrize("scale", [Fraction(1, 10**4), Fraction(1), Fraction(10**3),
                                   Fraction(2**41, 3)])
def test_laplace_halfwidth_is_the_smallest_at_any_scale(scale: Fraction) -> None:
    """Against the tail in exact-ish arithmetic (mpmath), for tiny and huge scales."""
    mpmath = pytest.importorskip("mpmath")
    from dpaccount.mechanisms.integer import _laplace_tail_halfwidth

    mpmath.mp.dps = 50
    q = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
    w = _laplace_tail_halfwidth(scale, 0.95)
    # P[|Y| > w] = 2 q^(w+1) / (1 + q): at most 5% at w, and at w - 1 more than 5% up to
    # the relative margin of 1e-9 the search keeps for its roundings
    assert 2 * q ** (w + 1) / (1 + q) <= mpmath.mpf("0.05")
    assert w == 0 or 2 * q**w / (1 + q) > mpmath.mpf("0.05") * (1 - mpmath.mpf("1e-8"))


def test_histogram_of_a_series_is_a_series_labelled_by_bin_or_category() -> None:
    from dpaccount import aggregates

    acct = Accountant(Budget(10**6))
    colours = pd.Series(["red", "blue", "red", "green"], name="colour")
    res = aggregates.histogram(colours, acct, 10**5, categories=["red", "blue"])
    # the declared categories label the counts; the data's own name is not released
    # (issue 28, item 1: a name can come from the data)
    assert list(res.value.index) == ["red", "blue"] and res.value.name is None
    assert res.value.tolist() == [2.0, 1.0]
    assert list(res.interval[0].index) == ["red", "blue"]
    ages = pd.Series([1.0, 5.0, 9.0])
    binned = aggregates.histogram(ages, acct, 10**5, bins=[0, 4, 10])
    assert list(binned.value.index) == ["[0, 4)", "[4, 10]"]
    plain = aggregates.histogram([1.0, 5.0], acct, 1, bins=[0, 4, 10])
    assert isinstance(plain.value, np.ndarray)
