"""Blocks sound by construction (issue 29, item 6): what a person whose records span
blocks gets is computed by the library, and the old advice (add up the budgets of the
blocks they appear in) fails on the issue's two counterexamples, reproduced here with
independent computations (closed forms, mpmath)."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpaccount import Budget, PrivacyCost
from dpaccount.budgets import BlockLedgers
from dpaccount.charges import GaussianCharge, LaplaceCharge
from dpaccount.composition.groups import group_cost
from dpaccount.composition.zcdp import zcdp_conversion
from dpaccount.errors import ConfigError, InvalidCostError

mp.mp.dps = 40


def gaussian_delta(eps: mp.mpf, mu: mp.mpf) -> mp.mpf:
    """delta(eps) of mu-GDP, the Gaussian's exact profile (Balle and Wang 2018, Thm 8;
    Dong, Roth and Su 2022, Cor. 2.13)."""
    return mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2)


def mu_for(eps: float, delta: str) -> mp.mpf:
    """The mu whose profile gives exactly delta at eps (bisection, delta is decreasing
    in 1/mu)."""
    lo, hi = mp.mpf("0.001"), mp.mpf(20)
    for _ in range(200):
        mid = (lo + hi) / 2
        if gaussian_delta(mp.mpf(eps), mid) > mp.mpf(delta):
            hi = mid
        else:
            lo = mid
    return lo


def laplace_loss(eps: Fraction, shift: int) -> Fraction:
    """The largest privacy loss of Laplace noise of scale 1/eps on a count that moves by
    ``shift``: |y - c - shift| - |y - c| <= shift, reached for y <= c, times eps."""
    return eps * shift


def test_two_events_in_one_block_cost_twice_the_block_budget() -> None:
    eps = Fraction(1, 2)
    blocks = BlockLedgers("memory://", "events", budget_per_block=Budget(eps),
                          max_blocks_per_unit=1, max_records_per_block=2)
    blocks.charge(LaplaceCharge(scale=2, sensitivity=1), ["d1"])  # a count, eps = 1/2
    # The person's two events move the count by 2: the loss is 2 eps, not the block's eps.
    assert laplace_loss(eps, 2) == 2 * eps > blocks.budget.epsilon  # the old advice
    assert blocks.unit_guarantee().cost == PrivacyCost(2 * eps)
    blocks.close()


def test_the_gdp_counterexample_of_the_issue() -> None:
    # gdp blocks at (3, 1e-6): one window query over two blocks uses both budgets, and a
    # person with one event in each block moves its answer by 2 sensitivities.
    blocks = BlockLedgers("memory://", "events", budget_per_block=Budget(3, "1e-6"),
                          rule="gdp", max_blocks_per_unit=2, max_records_per_block=1)
    limit = blocks.block_rule().mu_squared_limit(Fraction(3), Fraction(1, 10**6))
    sigma = Fraction(math.nextafter(1 / math.sqrt(float(limit)), math.inf))
    blocks.charge(GaussianCharge(sigma=sigma, sensitivity=1, epsilon=1), ["d1", "d2"])
    mu = mu_for(3, "1e-6")  # independent of the library
    assert abs(float(mu) - float(1 / sigma)) < 1e-6
    true_delta = gaussian_delta(mp.mpf(6), 2 * mu)  # the person's mu is 2 mu
    assert 7.74e-6 < true_delta < 7.75e-6  # the issue's "7.93e-6", recomputed
    assert true_delta > 3.8 * 2e-6  # nearly 4x the promised sum of the deltas
    # ... and 9.55x at (5, 1e-9) per block (the issue: "9.9x")
    ratio = gaussian_delta(mp.mpf(10), 2 * mu_for(5, "1e-9")) / mp.mpf("2e-9")
    assert 9.5 < ratio < 9.6
    # Disjoint queries alone would compose to sqrt(2) mu (Dong, Roth and Su 2022, Cor.
    # 3.3) and keep the promise: the window over both blocks is what breaks it.
    assert gaussian_delta(mp.mpf(6), mp.sqrt(2) * mu) < 2e-6
    # The library does not promise (6, 2e-6): it computes 2 mu-GDP.
    unit = blocks.unit_guarantee(delta="2e-6")
    assert unit.mu_squared == 4 * limit
    assert float(unit.cost.epsilon) > 6
    assert gaussian_delta(mp.mpf(unit.cost.epsilon.numerator) / unit.cost.epsilon.denominator,
                          2 * mp.sqrt(mp.mpf(limit.numerator) / limit.denominator)) <= 2e-6
    blocks.close()


@given(st.integers(1, 6), st.integers(1, 4),
       st.sampled_from([Fraction(1, 10), Fraction(1), Fraction(3, 2)]),
       st.sampled_from([Fraction(0), Fraction(1, 10**6), Fraction(1, 10**9)]))
def test_basic_blocks_give_the_group_privacy_closed_form(
        blocks_per_unit: int, per_block: int, eps: Fraction, delta: Fraction) -> None:
    g = blocks_per_unit * per_block
    blocks = BlockLedgers("memory://", "s", budget_per_block=Budget(eps, delta),
                          max_blocks_per_unit=blocks_per_unit, max_records_per_block=per_block)
    expected = mp.mpf(delta.numerator) / delta.denominator * mp.fsum(
        mp.e ** (i * mp.mpf(eps.numerator) / eps.denominator) for i in range(g))
    if expected >= 1:  # no guarantee is left for the group: said, not hidden
        with pytest.raises(ConfigError, match="no guarantee"):
            blocks.unit_guarantee()
        return
    unit = blocks.unit_guarantee().cost
    assert unit.epsilon == g * eps  # Dwork and Roth 2014, Thm 2.2
    got = mp.mpf(unit.delta.numerator) / unit.delta.denominator
    assert got * (1 + mp.mpf("1e-30")) >= expected  # (mpmath's own rounding: 1e-40)
    assert float(unit.delta) <= float(expected) * (1 + 1e-9)


def test_the_basic_bound_is_attained_by_one_window_over_all_blocks() -> None:
    blocks = BlockLedgers("memory://", "s", budget_per_block=Budget("0.25"),
                          max_blocks_per_unit=3, max_records_per_block=2)
    blocks.charge(LaplaceCharge(scale=4, sensitivity=1), ["a", "b", "c"])  # uses all three
    # Two records in each of the three blocks move this count by 6.
    assert laplace_loss(Fraction(1, 4), 6) == blocks.unit_guarantee().cost.epsilon
    blocks.close()


def test_gdp_and_zcdp_units_in_closed_form() -> None:
    gdp = BlockLedgers("memory://", "g", budget_per_block=Budget(1, "1e-6"), rule="gdp",
                       max_blocks_per_unit=3, max_records_per_block=2)
    limit = gdp.block_rule().mu_squared_limit(Fraction(1), Fraction(1, 10**6))
    unit = gdp.unit_guarantee()
    assert unit.mu_squared == 36 * limit and unit.cost.delta == Fraction(1, 10**6)
    mu = 6 * mp.sqrt(mp.mpf(limit.numerator) / limit.denominator)
    eps = mp.mpf(unit.cost.epsilon.numerator) / unit.cost.epsilon.denominator
    assert gaussian_delta(eps, mu) <= 1e-6 < gaussian_delta(eps * (1 - 1e-6), mu)
    zcdp = BlockLedgers("memory://", "z", budget_per_block=Budget(rho="0.01", delta="1e-6"),
                        rule="zcdp", max_blocks_per_unit=3, max_records_per_block=2)
    unit = zcdp.unit_guarantee()
    assert unit.rho == Fraction(36, 100)  # (k m)^2 rho, Bun and Steinke 2016, Prop. 1.9
    assert unit.cost == zcdp_conversion(Fraction(36, 100), "1e-6")
    assert zcdp.unit_guarantee(delta="1e-9").cost == zcdp_conversion(Fraction(36, 100), "1e-9")


def test_a_unit_budget_is_checked_when_the_stream_is_opened() -> None:
    with pytest.raises(ConfigError, match="more than the unit budget"):
        BlockLedgers("memory://", "s", budget_per_block=Budget(1), max_blocks_per_unit=30,
                     max_records_per_block=2, unit_budget=Budget(10))
    ok = BlockLedgers("memory://", "s", budget_per_block=Budget("0.1"),
                      max_blocks_per_unit=30, max_records_per_block=2, unit_budget=Budget(6))
    assert ok.unit_guarantee().cost == PrivacyCost(6)
    with pytest.raises(ConfigError, match="more than the unit budget"):
        BlockLedgers("memory://", "z", budget_per_block=Budget(rho="0.01", delta="1e-6"),
                     rule="zcdp", max_blocks_per_unit=3, max_records_per_block=2,
                     unit_budget=Budget(rho="0.3"))
    BlockLedgers("memory://", "z", budget_per_block=Budget(rho="0.01", delta="1e-6"),
                 rule="zcdp", max_blocks_per_unit=3, max_records_per_block=2,
                 unit_budget=Budget(rho="0.36"))
    with pytest.raises(ConfigError, match="needs max_blocks_per_unit"):
        BlockLedgers("memory://", "s", budget_per_block=1, unit_budget=Budget(10))


def test_declarations_are_checked() -> None:
    with pytest.raises(ConfigError, match="both"):
        BlockLedgers("memory://", "s", budget_per_block=1, max_blocks_per_unit=2)
    with pytest.raises(ConfigError, match="declare max_blocks_per_unit"):
        BlockLedgers("memory://", "s", budget_per_block=1).unit_guarantee()
    with pytest.raises(ConfigError, match=r"one \(epsilon, delta\) point"):
        BlockLedgers("memory://", "s", budget_per_block=1, max_blocks_per_unit=1,
                     max_records_per_block=1).unit_guarantee(delta="1e-6")
    with pytest.raises(ConfigError, match="unlimited"):
        BlockLedgers("memory://", "s", budget_per_block=Budget.unlimited(),
                     max_blocks_per_unit=1, max_records_per_block=1).unit_guarantee()
    with pytest.raises(ConfigError, match="no guarantee"):  # the group's delta reaches 1
        BlockLedgers("memory://", "s", budget_per_block=Budget(5, "1e-3"),
                     max_blocks_per_unit=5, max_records_per_block=2).unit_guarantee()
    with pytest.raises(InvalidCostError, match="must be"):
        BlockLedgers("memory://", "s", budget_per_block=1, max_blocks_per_unit=0,
                     max_records_per_block=1)


def test_substitution_needs_blocks_fixed_by_something_public() -> None:
    with pytest.raises(ConfigError, match="public_blocks=True"):
        BlockLedgers("memory://", "s", budget_per_block=1, relation="substitution")
    with pytest.raises(ConfigError, match="declaration"):
        BlockLedgers("memory://", "s", budget_per_block=1, public_blocks="yes")  # type: ignore[arg-type]
    with BlockLedgers("memory://", "s", budget_per_block=1, relation="substitution",
                      public_blocks=True) as blocks:
        blocks.charge(PrivacyCost("0.5"), ["a"])
        assert blocks.ledger("a").relation.value == "substitution"


@given(st.fractions(min_value=0, max_value=5, max_denominator=1000),
       st.sampled_from([Fraction(0), Fraction(1, 10**8), Fraction(1, 10**12)]),
       st.integers(1, 40))
def test_group_cost_is_never_below_the_chain_bound(eps: Fraction, delta: Fraction,
                                                   size: int) -> None:
    try:
        got = group_cost(PrivacyCost(eps, delta), size)
    except InvalidCostError:  # only when the chain bound itself reaches 1
        e = mp.mpf(eps.numerator) / eps.denominator
        total = mp.mpf(delta.numerator) / delta.denominator * mp.fsum(
            mp.e ** (i * e) for i in range(size))
        assert total >= mp.mpf("0.999999")
        return
    assert got.epsilon == eps * size
    e = mp.mpf(eps.numerator) / eps.denominator
    chain = mp.mpf(delta.numerator) / delta.denominator * mp.fsum(
        mp.e ** (i * e) for i in range(size))
    assert mp.mpf(got.delta.numerator) / got.delta.denominator * (1 + mp.mpf("1e-30")) >= chain
    assert float(got.delta) <= float(chain) * (1 + 1e-9) + 1e-300
    if size > 1:
        assert group_cost(PrivacyCost(eps, delta), size - 1).delta <= got.delta


def test_a_rho_unit_budget_needs_zcdp_blocks() -> None:
    with pytest.raises(ConfigError, match="zcdp rule"):
        BlockLedgers("memory://", "s", budget_per_block=Budget(1, "1e-6"),
                     max_blocks_per_unit=1, max_records_per_block=1,
                     unit_budget=Budget(rho=1))


def test_zcdp_blocks_are_charged_jointly_and_their_rho_is_stored(url: str) -> None:
    from dpaccount import open_ledger
    from dpaccount.errors import BudgetExceededError

    budget = Budget(rho="0.01", delta="1e-6")
    g = GaussianCharge(sigma=10, sensitivity=1, epsilon=1)  # rho = 1/200
    with BlockLedgers(url, "z", budget_per_block=budget, rule="zcdp") as blocks:
        blocks.charge(g, ["a", "b"])
        blocks.charge(g, ["b"])  # b is full: 2/200
        with pytest.raises(BudgetExceededError) as refused:
            blocks.charge(g, ["a", "b"])
        assert refused.value.ledger == "z/b"
        assert blocks.ledger("a").state.rho == Fraction(1, 200)  # all or nothing
    with open_ledger(url, name="z/b") as stored:
        assert stored.budget == budget and stored.state.rho == Fraction(1, 100)
