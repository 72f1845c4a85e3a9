"""Sampling without replacement under substitution: the PLD holds against an adaptive analyst.

Under substitution, one pair of neighbouring datasets realises both orders of the
subsampled pair: a query with f(x) = 1, f(x') = 0 (other records 0) gives the order
R = ((1-q) N(0) + q N(mu), N(0)), its negation the order A = (N(0), (1-q) N(0) + q N(mu)).
An analyst may pick the order of each step from the earlier outputs. The value of the best
such analyst is computed here by dynamic programming, independently of the engine:

    W_0(e) = (1 - e^e)_+,
    W_j(e) = max over t in {R, A} of  integral p_t(y) W_{j-1}(e - L_t(y)) dy,

with L_t = ln(p_t / q_t). Why: the hockey-stick divergence of the composition at epsilon
is E_P[(1 - e^{epsilon - total loss})_+]; after the first output y the rest is the same
problem at epsilon - L(y) (the first step's loss is spent), and the analyst's best choice
of the next order is the one with the larger continuation value. W_k(epsilon) is then the
delta the best adaptive analyst attains after k steps. W_1 is computed by direct numerical
integration of (p - e^e q)_+, so nothing here uses the engine's closed forms.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaccount import Accountant, Budget
from dpaccount.accounting import PrivacyLossDistribution
from dpaccount.accounting.pld.subsampled import (
    SubsampledGaussianPair,
    SubsampledLaplacePair,
    SymmetrisedPair,
)
from dpaccount.charges import GaussianCharge, LaplaceCharge, Repeated, Subsampled
from dpaccount.errors import BudgetExceededError


def _orders(kind: str, shift: float, q: float, y: np.ndarray) -> dict[str, tuple]:
    if kind == "gaussian":
        base, moved = stats.norm.pdf(y), stats.norm.pdf(y - shift)
    else:
        base, moved = 0.5 * np.exp(-np.abs(y)), 0.5 * np.exp(-np.abs(y - shift))
    mix = (1 - q) * base + q * moved
    return {"R": (mix, base), "A": (base, mix)}


def analyst_delta(
    kind: str, shift: float, q: float, steps: int, epsilon: float, *,
    adaptive: bool = True, order: str = "R", h: float = 0.005, span: float = 14.0,
) -> float:
    """delta at epsilon of the best analyst (adaptive, or keeping one ``order``)."""
    y = -span + h * np.arange(round((2 * span + shift) / h) + 1)
    weights = np.full(y.size, h)
    weights[0] = weights[-1] = h / 2  # trapezoid rule; the Laplace kinks are grid points
    pairs = _orders(kind, shift, q, y)
    if not adaptive:
        pairs = {order: pairs[order]}
    grid = np.arange(-span, span + h / 2, h)

    value = np.zeros_like(grid)
    for p, qq in pairs.values():
        one = np.empty_like(grid)
        for i in range(0, grid.size, 256):
            gamma = np.exp(grid[i:i + 256])[:, None]
            one[i:i + 256] = np.maximum(p - gamma * qq, 0.0) @ weights
        value = np.maximum(value, one)
    for _ in range(steps - 1):
        new = np.zeros_like(grid)
        for p, qq in pairs.values():
            loss = np.log(p) - np.log(qq)
            pw = p * weights
            step = np.empty_like(grid)
            for i in range(0, grid.size, 256):
                e = grid[i:i + 256][:, None] - loss
                w = np.interp(e, grid, value, left=np.nan, right=0.0)
                # below the grid the continuation is at least 1 - e^e; take it exactly
                w = np.where(np.isnan(w), -np.expm1(np.minimum(e, 0.0)), w)
                step[i:i + 256] = w @ pw
            new = np.maximum(new, step)
        value = new
    return float(np.interp(epsilon, grid, value))


def _certified_epsilon(charge: Subsampled, steps: int, delta: float) -> float:
    pld = PrivacyLossDistribution.from_charge(charge, relation="substitution")
    _low, high = pld.self_compose(steps).epsilon(delta)
    assert high is not None
    return float(high)


def test_the_reviewed_example_now_holds_against_the_adaptive_analyst() -> None:
    # k = 2, Gaussian sigma = 1, q = 0.3, target delta = 0.01 (issue: the old engine
    # certified 1.29510, where an adaptive analyst reaches delta = 0.010287).
    charge = Subsampled(GaussianCharge(sigma=1, sensitivity=1, epsilon=1), "0.3",
                        "without_replacement")
    eps = _certified_epsilon(charge, 2, 0.01)
    assert analyst_delta("gaussian", 1.0, 0.3, 2, eps) <= 0.01
    # The analyst really does beat every analyst that keeps one order: at the old
    # certificate (the larger of the two fixed orders' epsilons) it exceeds 0.01.
    old = 1.29510  # rounded to five decimals, hence the 1e-4 tolerance below
    assert analyst_delta("gaussian", 1.0, 0.3, 2, old, adaptive=False, order="R") <= 0.010001
    assert analyst_delta("gaussian", 1.0, 0.3, 2, old, adaptive=False, order="A") <= 0.010001
    assert analyst_delta("gaussian", 1.0, 0.3, 2, old) > 0.0102
    assert eps > old


@pytest.mark.parametrize(
    ("kind", "noise", "q", "steps", "delta"),
    [
        ("gaussian", 1.0, 0.3, 3, 0.01),
        ("gaussian", 2.0, 0.5, 2, 1e-3),
        ("gaussian", 0.8, 0.1, 3, 1e-4),
        ("laplace", 1.0, 0.3, 2, 0.01),
        ("laplace", 2.0, 0.5, 3, 1e-3),
        ("laplace", 0.5, 0.2, 3, 1e-3),
    ],
)
def test_certified_epsilon_bounds_the_adaptive_analyst(
    kind: str, noise: float, q: float, steps: int, delta: float
) -> None:
    inner = (
        GaussianCharge(sigma=noise, sensitivity=1, epsilon=1)
        if kind == "gaussian"
        else LaplaceCharge(scale=noise, sensitivity=1)
    )
    charge = Subsampled(inner, Fraction(q).limit_denominator(1000), "without_replacement")
    eps = _certified_epsilon(charge, steps, delta)
    if kind == "gaussian":
        attained = analyst_delta(kind, 1.0 / noise, q, steps, eps)
        assert attained <= delta
    else:
        # The Laplace loss has atoms, and interpolating the continuation value between
        # grid points overestimates it by O(h^2): measured on (scale 2, q 0.5, k 3) the
        # relative excess over the limit is 3.5e-3, 1.3e-3, 2.4e-4, 5e-5 at h = 0.01,
        # 0.005, 0.0025, 0.00125. At h = 0.0025 a tolerance of 5e-4 covers that error
        # and still catches any real violation of that size (the reviewed bug was 2.9%).
        attained = analyst_delta(kind, 1.0 / noise, q, steps, eps, h=0.0025, span=10.0)
        assert attained <= delta * (1 + 5e-4)
    # ... and the certificate is not vacuous: the analyst gets within a factor of two.
    assert attained >= delta / 2


def test_poisson_add_remove_keeps_composing_each_direction() -> None:
    # Poisson under add/remove is unchanged: its directions are fixed for a whole run,
    # so the result equals the larger of the two directions composed on their own,
    # and is below the symmetrised (order-choosing) value.
    poisson = PrivacyLossDistribution.gaussian(1, sampling_rate="0.3").self_compose(2)
    wor = PrivacyLossDistribution.gaussian(
        1, sampling_rate="0.3", scheme="without_replacement"
    ).self_compose(2)
    p_eps = float(poisson.epsilon(0.01)[1] or 0)
    w_eps = float(wor.epsilon(0.01)[1] or 0)
    assert p_eps < w_eps
    # The non-adaptive analyst of the fixed remove direction attains delta ~ 0.01 there.
    assert analyst_delta("gaussian", 1.0, 0.3, 2, p_eps, adaptive=False) == pytest.approx(
        0.01, rel=2e-3
    )


def test_the_pld_rule_refuses_what_the_adaptive_analyst_could_exploit() -> None:
    # Budget (1.3, 0.01) under substitution: a plan of two runs of the example costs
    # 1.3177 > 1.3 under the fixed engine (the old engine certified 1.29510 and admitted
    # it, while an adaptive analyst reaches delta 0.010287 at 1.29510).
    charge = Subsampled(GaussianCharge(sigma=1, sensitivity=1, epsilon=1), "0.3",
                        "without_replacement")
    plan = [Repeated(charge, 2)]
    acct = Accountant(Budget("1.3", "0.01"), rule="pld", relation="substitution", plan=plan)
    with pytest.raises(BudgetExceededError):
        acct.charge(charge)
    assert len(acct.records) == 0
    roomy = Accountant(Budget("1.32", "0.01"), rule="pld", relation="substitution", plan=plan)
    roomy.charge(charge)
    roomy.charge(charge)
    assert float(roomy.spent.epsilon) == pytest.approx(1.3177, abs=1e-3)


@settings(max_examples=30, deadline=None)
@given(
    shift=st.floats(0.05, 4.0),
    q=st.floats(0.01, 0.99),
    eps=st.lists(st.floats(-3.0, 6.0), min_size=1, max_size=8),
    laplace=st.booleans(),
)
def test_symmetrised_profile_dominates_both_orders(
    shift: float, q: float, eps: list[float], laplace: bool
) -> None:
    kind = SubsampledLaplacePair if laplace else SubsampledGaussianPair
    r, a = kind(shift, q, remove=True), kind(shift, q, remove=False)
    grid = np.array(eps)
    sym = SymmetrisedPair(r, a).profile(grid)
    assert np.all(sym >= r.profile(grid))
    assert np.all(sym >= a.profile(grid))
    # and it is still a privacy profile: at most 1, at least (1 - e^eps)_+ (minus float noise)
    assert np.all(sym <= 1.0)
    assert np.all(sym >= -np.expm1(np.minimum(grid, 0.0)) - 1e-9)


@settings(max_examples=15, deadline=None)
@given(sigma=st.floats(0.5, 4.0), q=st.floats(0.02, 0.9), steps=st.integers(1, 6))
def test_without_replacement_is_never_below_either_fixed_order(
    sigma: float, q: float, steps: int
) -> None:
    options = {"sampling_rate": q, "value_discretization_interval": 1e-3, "lower": False}
    wor = PrivacyLossDistribution.gaussian(sigma, scheme="without_replacement", **options)
    poisson = PrivacyLossDistribution.gaussian(sigma, **options)  # the max of R^k and A^k
    for delta in (1e-2, 1e-5):
        w = wor.self_compose(steps).epsilon(delta)[1]
        p = poisson.self_compose(steps).epsilon(delta)[1]
        assert w is not None and p is not None
        assert w >= p
