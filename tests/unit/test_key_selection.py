"""Key selection: the optimal partition selection (Desfontaines, Voss, Gipson and
Mandayam 2022, "Differentially private partition selection", PoPETs 2022) is exactly
(epsilon, delta)-DP per key, needs fewer people per key than Laplace thresholding, and
its preview states what it would release before anything is charged."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget, ConfigError, InvalidCostError, PrivacyCost
from dpaccount.aggregates import (
    OptimalSelection,
    SelectionPreview,
    ThresholdSelection,
    groupby,
)
from dpaccount.mechanisms._sampling import RandomSource

mpmath = pytest.importorskip("mpmath")

GRID = [
    (Fraction(1), Fraction(1, 10**6)),
    (Fraction(1, 10), Fraction(1, 10**9)),
    (Fraction(1, 4), Fraction(1, 10**6)),
    (Fraction(3), Fraction(1, 100)),
    (Fraction(1, 50), Fraction(1, 10**12)),
    (Fraction(2), Fraction(1, 10**10)),
]


def probabilities(sel: OptimalSelection) -> list[Fraction]:
    """p_0 = 0, p_1, ..., p_N = 1 and one more 1 (the released-surely tail)."""
    return [sel.keep_probability(n) for n in range(len(sel.keep) + 2)]


def assert_exactly_dp(sel: OptimalSelection) -> None:
    """The (epsilon, delta) inequalities between n and n + 1 for every n, exactly."""
    # L is a lower bound on e^epsilon, checked at 60 digits
    mpmath.mp.dps = 60
    e_eps = mpmath.exp(mpmath.mpf(sel.epsilon.numerator) / sel.epsilon.denominator)
    lower = sel.exp_lower
    assert mpmath.mpf(lower.numerator) / lower.denominator <= e_eps
    assert lower >= 1
    p = probabilities(sel)
    d = sel.delta
    assert p[0] == 0 and p[-1] == 1 and p[-2] == 1
    for n in range(len(p) - 1):
        a, b = p[n], p[n + 1]
        assert a <= b  # monotone: the two reverse inequalities then hold too
        assert b <= lower * a + d  # P[released | n+1] <= e^eps P[released | n] + delta
        assert 1 - a <= lower * (1 - b) + d  # the same for "not released"


@pytest.mark.parametrize(("eps", "delta"), GRID)
def test_optimal_probabilities_satisfy_the_dp_inequalities_exactly(
    eps: Fraction, delta: Fraction
) -> None:
    sel = OptimalSelection.calibrate(eps, delta)
    assert_exactly_dp(sel)
    assert sel.cost == PrivacyCost(eps, delta)  # the exact delta, no rounding up needed
    assert sel.keep_probability(1) <= delta  # a lone person's key: at most delta


@settings(max_examples=40, deadline=None)
@given(
    eps=st.fractions(min_value=Fraction(1, 20), max_value=Fraction(6)),
    exponent=st.integers(min_value=1, max_value=14),
    mantissa=st.integers(min_value=1, max_value=9),
)
def test_optimal_probabilities_are_exactly_dp_for_any_parameters(
    eps: Fraction, exponent: int, mantissa: int
) -> None:
    assert_exactly_dp(OptimalSelection.calibrate(eps, Fraction(mantissa, 10**exponent)))


@pytest.mark.parametrize(("eps", "delta"), GRID)
def test_optimal_probabilities_match_the_papers_recursion_and_closed_form(
    eps: Fraction, delta: Fraction
) -> None:
    """The unrounded recursion of Desfontaines et al. 2022 at 60 digits: ours
    is below it (rounding down) by a negligible amount; while the first term is the
    minimum, pi_n = delta (e^{n eps} - 1) / (e^eps - 1) (summing the geometric series)."""
    mpmath.mp.dps = 60
    e = mpmath.exp(mpmath.mpf(eps.numerator) / eps.denominator)
    dl = mpmath.mpf(delta.numerator) / delta.denominator
    sel = OptimalSelection.calibrate(eps, delta)
    pi = mpmath.mpf(0)
    for n in range(1, len(sel.keep) + 3):
        pi = min(e * pi + dl, 1 - (1 - pi - dl) / e, mpmath.mpf(1))
        ours = sel.keep_probability(n)
        ours_mp = mpmath.mpf(ours.numerator) / ours.denominator
        assert ours_mp <= pi + mpmath.mpf(10) ** -50
        assert pi - ours_mp <= mpmath.mpf(10) ** -12
        closed = dl * (e**n - 1) / (e - 1)
        if closed <= mpmath.mpf("0.25"):
            assert abs(ours_mp - closed) <= mpmath.mpf(10) ** -12 * max(closed, 1e-30) + (
                mpmath.mpf(2) ** -sel.bits * n)


def test_optimal_needs_fewer_people_per_key_than_the_threshold() -> None:
    """People per key for release at 1/2 and 0.95, at the same per-key (eps, delta)."""
    savings = []
    for eps, delta in [(Fraction(1), Fraction(1, 10**6)), (Fraction(1, 10), Fraction(1, 10**9)),
                       (Fraction(1, 4), Fraction(1, 10**6)), (Fraction(1, 2), Fraction(1, 10**8)),
                       (Fraction(1, 100), Fraction(1, 10**12))]:
        opt = OptimalSelection.calibrate(eps, delta).preview()
        old = ThresholdSelection.calibrate(eps, delta).preview()
        assert opt.people_for_half < old.people_for_half
        assert opt.people_for_95 < old.people_for_95
        savings.append(1 - opt.people_for_half / old.people_for_half)
    assert min(savings) >= 0.05 and max(savings) <= 0.25  # 6.7 % to 17 % on this grid


def test_threshold_preview_is_its_threshold_and_its_tail() -> None:
    sel = ThresholdSelection.calibrate(Fraction(1), Fraction(1, 10**6))
    p = sel.preview()
    # P[n + Y >= T] crosses 1/2 at n = T: P[Y >= 0] = 1/(1+q) > 1/2 > q/(1+q) = P[Y >= 1]
    assert p.people_for_half == sel.threshold == 15
    q = np.exp(-1.0)
    n95 = next(n for n in range(15, 40) if 1 - q ** (n - 15 + 1) / (1 + q) >= 0.95)
    assert p.people_for_95 == n95
    assert sel.release_probability(1) <= 1e-6 and sel.release_probability(0) == 0


def test_optimal_keeps_with_its_probability() -> None:
    """A seeded Monte Carlo check of the exact Bernoulli draw (5 sigma)."""
    sel = OptimalSelection.calibrate(Fraction(1, 2), Fraction(1, 10**6))
    n = sel.people_for(0.5)
    p = sel.release_probability(n)
    rng = RandomSource.seeded(3)
    draws = 20_000
    kept = sum(sel.keeps(n, rng) for _ in range(draws))
    assert abs(kept / draws - p) <= 5 * (p * (1 - p) / draws) ** 0.5
    assert not sel.keeps(0, rng) and sel.keeps(len(sel.keep) + 5, rng)
    assert sel.select([0, len(sel.keep)], rng) == [False, True]


def test_pipelinedp_probability_of_keep_agrees() -> None:
    """PyDP's truncated geometric selection (PipelineDP's default), the same optimal rule."""
    pytest.importorskip("pipeline_dp")
    from pydp.algorithms import partition_selection

    for eps, delta in [(Fraction(1), Fraction(1, 10**6)), (Fraction(1, 4), Fraction(1, 10**6)),
                       (Fraction(1, 10), Fraction(1, 10**9))]:
        sel = OptimalSelection.calibrate(eps, delta)
        theirs = partition_selection.create_truncated_geometric_partition_strategy(
            float(eps), float(delta), 1)
        for n in range(1, len(sel.keep) + 3):
            ours = sel.release_probability(n)
            assert ours == pytest.approx(theirs.probability_of_keep(n), rel=1e-6, abs=1e-15)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(InvalidCostError):
        OptimalSelection.calibrate(Fraction(1), Fraction(0))
    with pytest.raises(InvalidCostError):
        OptimalSelection.calibrate(Fraction(1, 10**7), Fraction(1, 10**12))
    with pytest.raises(InvalidCostError, match="key_counts"):
        OptimalSelection.calibrate(Fraction(1), Fraction(1, 10**6)).preview([3, -1])
    with pytest.raises(InvalidCostError, match="key_counts"):
        OptimalSelection.calibrate(Fraction(1), Fraction(1, 10**6)).preview("abc")


# -- the group-by: default method, the old one kept, preview before spending -------------


def industries(seed: int = 0) -> pd.DataFrame:
    """People in 12 industries of very different sizes (one row each)."""
    rng = np.random.default_rng(seed)
    sizes = [400, 200, 120, 60, 40, 25, 15, 10, 6, 3, 2, 1]
    labels = [f"i{k}" for k, s in enumerate(sizes) for _ in range(s)]
    return pd.DataFrame({"industry": labels, "wage": rng.uniform(0, 100, len(labels))})


SIZES = [400, 200, 120, 60, 40, 25, 15, 10, 6, 3, 2, 1]


def test_groupby_uses_the_optimal_selection_by_default_and_keeps_the_threshold() -> None:
    df = industries()
    acct = Accountant(Budget(10, "1e-4"))
    res = groupby(df, "industry", rng=RandomSource.seeded(5)).count(acct, 1, delta="1e-6")
    old = groupby(df, "industry", key_selection="threshold", rng=RandomSource.seeded(5)).count(
        acct, 1, delta="1e-6")
    assert res.keys_selected and old.keys_selected
    assert res.cost == PrivacyCost(1, "1e-6")  # the optimal one uses all of delta, exactly
    assert old.cost.epsilon == 1 and old.cost.delta <= Fraction(1, 10**6)  # its tail
    assert set(res.frame.index) >= {"i0", "i1", "i2", "i3"}  # far above either threshold
    assert "i11" not in res.frame.index  # one person: at most 1e-6
    with pytest.raises(ConfigError, match="key_selection"):
        groupby(df, "industry", key_selection="magic")
    assert len(acct.records) == 2


def test_preview_states_threshold_and_expected_keys_before_spending() -> None:
    df = industries()
    acct = Accountant(Budget(2, "1e-5"))
    g = groupby(df, "industry")
    p = g.preview("count", acct, 1, delta="1e-6", key_counts=SIZES)
    assert len(acct.records) == 0 and p.admitted
    keys = p.keys
    assert isinstance(keys, SelectionPreview) and keys.method == "optimal"
    # the plan: a quarter of epsilon and all of delta select keys (Laplace noise)
    sel = OptimalSelection.calibrate(Fraction(1, 4), Fraction(1, 10**6))
    assert (keys.epsilon, keys.delta) == (sel.epsilon, sel.delta)
    assert keys.people_for_half == sel.people_for(0.5)
    assert keys.people_for_95 == sel.people_for(0.95)
    expected = sum(float(sel.keep_probability(n)) for n in SIZES)
    assert keys.expected_released == pytest.approx(expected, rel=1e-12)
    assert keys.keys_declared == 12
    old = groupby(df, "industry", key_selection="threshold").preview(
        "count", acct, 1, delta="1e-6", key_counts={f"i{k}": s for k, s in enumerate(SIZES)})
    assert old.keys is not None and old.keys.method == "threshold"
    assert old.keys.people_for_half > keys.people_for_half
    assert old.keys.expected_released is not None
    assert old.keys.expected_released <= keys.expected_released
    m = g.preview("mean", acct, "wage", 1, delta="1e-6", lower=0, upper=100)
    assert m.keys is not None and m.keys.expected_released is None
    declared = groupby(df, "industry", keys=["i0", "i1"]).preview("count", acct, 1)
    assert declared.keys is None
    with pytest.raises(ConfigError, match="key_counts"):
        groupby(df, "industry", keys=["i0"]).preview("count", acct, 1, key_counts=[3])
    assert len(acct.records) == 0


def test_substitution_and_many_groups_split_the_selection(tmp_path: Any) -> None:
    """G = 2 groups per person under add/remove: each key's selection gets eps/4/2."""
    df = industries().assign(user=np.arange(len(industries())) // 2)
    acct = Accountant(Budget(2, "1e-5"))
    g = groupby(df, "industry", privacy_unit="user", max_groups_per_unit=2)
    keys = g.preview("count", acct, 1, delta="1e-6").keys
    assert keys is not None
    assert (keys.epsilon, keys.delta) == (Fraction(1, 8), Fraction(1, 2 * 10**6))
