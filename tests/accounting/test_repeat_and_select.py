"""Repeat-and-select (hyperparameter tuning, Papernot and Steinke 2022) as a charge.

Independent checks: dp_accounting's RDP accountant on the same event (skipped when it is
not installed; ours must be at most 1.001x its epsilon), the closed forms of Papernot and
Steinke 2022 (Cors. 3 and 4, Thm 6 at a pure run) as dp_accounting's own tests state
them, and a lower bound: a selection whose score ignores the data releases one run
exactly, so its epsilon(delta) is never below the run's exact Gaussian one (Balle and
Wang 2018, Thm 8, by bisection here with scipy's normal cdf).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaccount import Accountant
from dpaccount.accounting.rdp import RDPRule
from dpaccount.accounting.rdp.charge_curves import charge_rdp
from dpaccount.charges import (
    GaussianCharge,
    LaplaceCharge,
    RepeatAndSelect,
    Repeated,
    RunCount,
    Subsampled,
    check_relations,
    cost_of,
    describe,
)
from dpaccount.charges.counts import tail_up, tnb_gamma_down, tnb_mean
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

TNB = "truncated_negative_binomial"


def _selection(sigma: float, mean: float, shape: float | None, **kw: object) -> RepeatAndSelect:
    run = GaussianCharge(sigma, 1, 50)
    if shape is None:
        return RepeatAndSelect(run, mean=mean, distribution="poisson", delta="1e-3", **kw)
    return RepeatAndSelect(run, mean=mean, distribution=TNB, shape=shape, delta="1e-3", **kw)


def _planned_epsilon(charge: RepeatAndSelect, delta: str = "1e-6") -> float:
    rule = RDPRule(target_delta=delta, adaptive=False, plan=(charge, 1))
    return float(rule.total(rule.add(rule.start(), charge, 1)).epsilon)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon(delta) of the Gaussian mechanism (Balle and Wang 2018, Thm 8)."""
    def d(eps: float) -> float:
        return float(stats.norm.cdf(mu / 2 - eps / mu)
                     - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu))
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return lo


# -- against dp_accounting ---------------------------------------------------------


@pytest.mark.parametrize("shape", [None, 0.0, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize(("sigma", "mean"), [(3.0, 10.0), (1.0, 2.0), (10.0, 100.0),
                                             (2.0, 1.0)])
def test_within_dp_accounting_and_above_the_run(shape: float | None, sigma: float,
                                                mean: float) -> None:
    """dp_accounting 0.6's RdpAccountant (rdp_privacy_accountant.py,
    _compute_rdp_repeat_and_select) on RepeatAndSelectDpEvent(GaussianDpEvent(sigma),
    mean, shape): ours is at most 1.001x its epsilon, and at least the run's exact one."""
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    rdp_accountant = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    accountant = rdp_accountant.RdpAccountant()
    accountant.compose(dp_event.RepeatAndSelectDpEvent(
        dp_event.GaussianDpEvent(sigma), mean, math.inf if shape is None else shape))
    theirs = accountant.get_epsilon(1e-6)
    ours = _planned_epsilon(_selection(sigma, mean, shape))
    assert ours <= theirs * 1.001
    assert ours >= _gaussian_epsilon(1 / sigma, 1e-6)


def test_the_issue_figures_are_dp_accounting_0_6s() -> None:
    """Issue 31 quotes 4.761 (Poisson) and 3.508 (geometric) for sigma = 3, mean 10,
    delta = 1e-6; dp_accounting 0.6.0 gives 3.3824 and 3.0336 for that event (the
    Poisson by shape = inf, the geometric by shape = 1), and ours is at or below them."""
    assert _planned_epsilon(_selection(3.0, 10.0, None)) <= 3.3825
    assert _planned_epsilon(_selection(3.0, 10.0, 1.0)) <= 3.0337
    assert _planned_epsilon(_selection(3.0, 10.0, None)) > 3.38
    assert _planned_epsilon(_selection(3.0, 10.0, 1.0)) > 3.03


# -- closed forms (ported from dp_accounting's rdp_privacy_accountant_test.py) ------


@pytest.mark.parametrize(("eps", "mean", "shape"), [
    (0.1, 10, 0), ("0.5", 2, "0.5"), (1, 1, 1), (2, 100, 5), ("0.01", "1e6", 1)])
def test_pure_run_truncated_negative_binomial(eps: object, mean: object, shape: object) -> None:
    """test_repeat_select_pure_negative_binomial: a pure epsilon-DP run selected
    TNB(eta)-many times is (2 + eta) epsilon-DP (Papernot and Steinke 2022, Cor. 3),
    exactly, and the RDP engine's bound at a very large order is at most that (it may be
    below: Thm 2 at a finite lambda_hat can beat the corollary's limit) and at least the
    run's own."""
    charge = RepeatAndSelect(PrivacyCost(eps), mean=mean, distribution=TNB, shape=shape)
    expected = (2 + charge.shape) * PrivacyCost(eps).epsilon  # type: ignore[operator]
    assert charge.cost == PrivacyCost(expected)
    laplace = RepeatAndSelect(LaplaceCharge(1 / PrivacyCost(eps).epsilon, 1), mean=mean,
                              distribution=TNB, shape=shape)
    value = charge_rdp(laplace, 1e8)
    assert charge_rdp(laplace.charge, 1e8) <= value <= float(expected) * (1 + 1e-6) + 1e-6


@pytest.mark.parametrize(("rho", "gamma", "shape"), [
    (0.01, 0.01, 0), (1, 0.1, 0), (10, 0.99, 0), (0.01, 0.01, 1), (1, 0.1, 1),
    (10, 0.99, 1), (1, 0.1, 5), (0.01, 0.01, 5), (1, 0.1, 0.5)])
def test_gaussian_truncated_negative_binomial(rho: float, gamma: float, shape: float) -> None:
    """test_repeat_select_gaussian_negative_binomial (Papernot and Steinke 2022, Cor. 4):
    at every order, ours is at least the corollary's exact optimum over lambda_hat
    (Thm 2 cannot do better) and within 1% of it (ours takes it on a grid)."""
    mean = tnb_mean(gamma, shape)
    rho = min(rho, -math.log(gamma))
    sigma = math.sqrt(0.5 / rho)
    charge = RepeatAndSelect(GaussianCharge(sigma, 1, 50), mean=mean, distribution=TNB,
                             shape=shape, delta="0.5")
    for order in (1.5, 2.0, 3.0, 10.0, 100.0):
        if order <= 1 + math.sqrt(math.log(mean) / rho):
            eps = (2 * math.sqrt(rho * math.log(mean))
                   + 2 * (1 + shape) * math.sqrt(-rho * math.log(gamma)) - shape * rho)
        else:
            eps = (rho * (order - 1) + math.log(mean) / (order - 1)
                   + 2 * (1 + shape) * math.sqrt(-rho * math.log(gamma)) - shape * rho)
        ours = charge_rdp(charge, order)
        assert eps * (1 - 1e-9) <= ours <= eps * 1.01 + 1e-9, order


@pytest.mark.parametrize(("eps", "mean"), [
    (1, 1), (0.1, 2), (0.001, 100), (2, 1000), (1, 1e10)])
def test_pure_run_poisson(eps: float, mean: float) -> None:
    """test_repeat_and_select_pure_poisson (Papernot and Steinke 2022, Thm 6 with
    delta_hat = 0 at eps_hat = eps): within 1.001x of the closed form at its order."""
    alpha = 1 + 1 / math.expm1(eps)
    expected = (eps + math.log1p(math.expm1((1 - 2 * alpha) * eps) * (alpha - 1)
                                 / (2 * alpha - 1)) / (alpha - 1)
                + math.log(mean) * math.expm1(eps))
    charge = RepeatAndSelect(LaplaceCharge(Fraction(1) / Fraction(eps), 1), mean=mean,
                             distribution="poisson", delta="0.5")
    ours = charge_rdp(charge, alpha)
    assert ours <= expected * 1.001
    assert ours >= charge_rdp(LaplaceCharge(Fraction(1) / Fraction(eps), 1), alpha)


def test_mean_one_is_the_run_itself() -> None:
    """test_repeat_select_trivial: with mean 1 a TNB count is always 1, and the bound
    is the run's own at every order (the constant and ln E[K] vanish)."""
    run = GaussianCharge(2, 1, 3)
    for shape in (0, "0.5", 1, 2):
        charge = RepeatAndSelect(run, mean=1, distribution=TNB, shape=shape, delta="0.5")
        for order in (1.5, 2.0, 8.0, 64.0):
            assert charge_rdp(charge, order) == pytest.approx(charge_rdp(run, order),
                                                              rel=1e-8)


# -- the (epsilon, delta) cost --------------------------------------------------------


def test_truncated_cost_geometric_exact() -> None:
    """For a geometric count P[K > T] = (1 - 1/mean)^T exactly: the cost's T is the
    smallest with E[K] delta_run + P[K > T] <= delta, computed here in exact rationals."""
    run = PrivacyCost("0.25", "1e-9")
    charge = RepeatAndSelect(run, mean=4, distribution=TNB, shape=1, delta="1e-4")
    spare = Fraction("1e-4") - 4 * Fraction("1e-9")
    t = 1
    while Fraction(3, 4) ** t > spare:
        t += 1
    assert charge.cost == PrivacyCost(t * Fraction("0.25"), Fraction("1e-4"))


def test_cost_of_a_poisson_selection_is_truncated() -> None:
    charge = RepeatAndSelect(PrivacyCost("0.1"), mean=10, distribution="poisson",
                             delta="1e-6")
    t = round(charge.cost.epsilon / Fraction("0.1"))
    assert stats.poisson.sf(t, 10) <= 1e-6 < stats.poisson.sf(t - 1, 10)
    assert charge.cost.delta == Fraction("1e-6")


@pytest.mark.parametrize("kwargs", [
    {"mean": "0.5", "distribution": "poisson", "delta": "1e-6"},
    {"mean": float("nan"), "distribution": "poisson", "delta": "1e-6"},
    {"mean": 10, "distribution": "uniform", "delta": "1e-6"},
    {"mean": 10, "distribution": "poisson", "shape": 1, "delta": "1e-6"},
    {"mean": 10, "distribution": TNB, "delta": "1e-6"},
    {"mean": 10, "distribution": TNB, "shape": -1},
    {"mean": 10, "distribution": "poisson"},  # no pure bound: a delta is needed
    {"mean": 10, "distribution": "poisson", "delta": 1},
])
def test_bad_parameters_are_typed_errors_before_any_charge(kwargs: dict[str, object]) -> None:
    acct = Accountant(10, rule="basic")
    with pytest.raises(InvalidCostError):
        acct.charge(RepeatAndSelect(PrivacyCost("0.1"), **kwargs))  # type: ignore[arg-type]
    assert acct.records == ()


def test_rules_hold_it_or_refuse_it_by_name() -> None:
    run = Repeated(Subsampled(GaussianCharge(1, 1, 5), "0.01", "poisson"), 100)
    charge = RepeatAndSelect(run, mean=10, distribution=TNB, shape=1, delta="1e-3")
    rdp = Accountant((10, "1e-5"), rule="rdp")
    rdp.charge(charge)
    assert 0 < rdp.spent.epsilon < 3
    for rule in ("gdp", "zcdp"):
        acct = Accountant((10, "1e-5"), rule=rule)
        with pytest.raises(UnsupportedChargeError, match="RepeatAndSelect"):
            acct.charge(charge)
        assert acct.records == ()
    basic = Accountant((10**5, "1e-2"), rule="basic")
    basic.charge(charge)  # its (epsilon, delta) cost, sound but loose
    assert basic.spent == cost_of(charge)
    with pytest.raises(UnsupportedChargeError, match="Subsampled"):
        check_relations(charge, "substitution")
    assert "best of truncated_negative_binomial(mean=10, shape=1)" in describe(charge)


# -- properties -----------------------------------------------------------------------

sigmas = st.floats(0.5, 20)
means = st.floats(1, 1e4)
shapes = st.one_of(st.none(), st.floats(0, 10))
orders = st.sampled_from([1.25, 1.5, 2.0, 3.0, 8.0, 32.0, 256.0])


@settings(max_examples=40, deadline=None)
@given(sigmas, means, shapes, orders)
def test_selection_never_below_one_run(sigma: float, mean: float, shape: float | None,
                                       order: float) -> None:
    run = GaussianCharge(sigma, 1, 50)
    assert charge_rdp(_selection(sigma, mean, shape), order) >= charge_rdp(run, order)


@settings(max_examples=40, deadline=None)
@given(sigmas, means, st.floats(1, 10), shapes, orders)
def test_more_runs_never_cost_less(sigma: float, mean: float, factor: float,
                                   shape: float | None, order: float) -> None:
    low = charge_rdp(_selection(sigma, mean, shape), order)
    assert charge_rdp(_selection(sigma, mean * factor, shape), order) >= low * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(means, st.floats(0, 10), st.integers(1, 200))
def test_count_facts(mean: float, eta: float, t: int) -> None:
    """gamma is rounded down (its mean is at least the declared one) and the tail bound
    is at least scipy's tail of that distribution."""
    gamma = tnb_gamma_down(mean, eta)
    assert 0 < gamma <= 1
    assert tnb_mean(gamma, eta) >= mean * (1 - 1e-12)
    tail = tail_up(RunCount.TRUNCATED_NEGATIVE_BINOMIAL, mean, eta, gamma, t)
    assert 0 <= tail <= 1
    if gamma < 1 and eta == 1:
        assert tail >= (1 - gamma) ** t * (1 - 1e-12)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 5), shapes, sigmas)
def test_multiplicity_in_one_place(k: int, shape: float | None, sigma: float) -> None:
    """Charging it k times and Repeated(it, k) once give the same RDP total."""
    charge = _selection(sigma, 10, shape)
    one = Accountant((1000, "1e-5"), rule="rdp")
    one.charge(Repeated(charge, k))
    many = Accountant((1000, "1e-5"), rule="rdp")
    for _ in range(k):
        many.charge(charge)
    assert one.spent == many.spent


def test_a_sql_ledger_refuses_it_unchanged(tmp_path: object) -> None:
    """Stored records are a closed world (dpaccount.records) that has no kind for it
    yet: a SQLite ledger refuses the charge before anything is stored, and stays usable."""
    from pathlib import Path

    from dpaccount.storage.sqlite import SQLiteStore

    store = SQLiteStore(Path(str(tmp_path)) / "l.db", name="L")
    acct = Accountant(10, rule="basic", store=store, name="L")
    charge = RepeatAndSelect(PrivacyCost(1), mean=10, distribution=TNB, shape=1)
    with pytest.raises(InvalidCostError, match="cannot be stored"):
        acct.charge(charge)
    assert len(acct.records) == 0
    acct.charge(PrivacyCost(1))
    assert acct.spent == PrivacyCost(1)


def test_the_pld_engine_takes_a_very_large_pure_cost() -> None:
    """The (epsilon, delta) randomized response pair of a cost of epsilon = 800 (a
    selection's truncated cost can be that large) no longer overflows e^epsilon; its
    epsilon at delta is exactly 800 + ln(1 - delta) (the pair's profile is
    1 - e^{eps - 800} between 0 and 800)."""
    from dpaccount.accounting.pld import compose_plan

    _low, high = compose_plan([PrivacyCost(800)], lower=False).epsilon(1e-6)
    assert float(high) == pytest.approx(800 + math.log1p(-1e-6), abs=1e-3)
    assert float(high) >= 800 + math.log1p(-1e-6) - 1e-9
