"""The zcdp rule and zCDP budgets (issue 29, item 9): closed forms, an independent
conversion in mpmath, the ledger settings round trip, and what is refused."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import mpmath as mp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpaccount import Accountant, Budget, PrivacyCost, open_ledger
from dpaccount.charges import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    Repeated,
    Subsampled,
)
from dpaccount.composition import make_rule
from dpaccount.composition.zcdp import ZCDPRule, charge_rho, rho_of, zcdp_conversion
from dpaccount.errors import BudgetExceededError, ConfigError, UnsupportedChargeError
from dpaccount.mechanisms import GaussianMechanism

mp.mp.dps = 40


def cks_epsilon(rho: Fraction, delta: Fraction) -> mp.mpf:
    """min over every alpha > 1 of Canonne, Kamath and Steinke 2020, Prop. 12 at order
    alpha for rho alpha: the stationary point solves (alpha - 1)^2 rho = ln(1/delta) -
    ln(alpha) (the objective decreases, then increases), found here by bisection."""
    r, d = mp.mpf(rho.numerator) / rho.denominator, mp.mpf(delta.numerator) / delta.denominator

    def f(a: mp.mpf) -> mp.mpf:
        return a * r + mp.log(1 - 1 / a) - (mp.log(d) + mp.log(a)) / (a - 1)

    lo, hi = mp.mpf(1), mp.mpf(2)
    while (hi - 1) ** 2 * r - mp.log(1 / d) + mp.log(hi) < 0:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if (mid - 1) ** 2 * r - mp.log(1 / d) + mp.log(mid) < 0:
            lo = mid
        else:
            hi = mid
    return f(hi)


def gaussian_delta(eps: mp.mpf, mu: mp.mpf) -> mp.mpf:
    """The Gaussian's exact profile (Balle and Wang 2018, Thm 8)."""
    return mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2)


def gaussian_epsilon(mu: mp.mpf, delta: mp.mpf) -> mp.mpf:
    """The exact epsilon at delta of the Gaussian with mu (bisection)."""
    lo, hi = mp.mpf(0), mp.mpf(1)
    if gaussian_delta(lo, mu) <= delta:
        return lo
    while gaussian_delta(hi, mu) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
    return hi


rhos = st.fractions(min_value=Fraction(1, 10**6), max_value=200).filter(lambda r: r > 0)
deltas = st.sampled_from([Fraction(1, 10**k) for k in (2, 3, 5, 6, 9, 12, 30, 100)])


@given(rhos, deltas)
def test_the_conversion_is_never_below_the_exact_optimum_nor_the_gaussian(
        rho: Fraction, delta: Fraction) -> None:
    reported = zcdp_conversion(rho, delta)
    assert reported.delta == delta
    best = cks_epsilon(rho, delta)
    assert reported.epsilon >= Fraction(str(mp.nstr(max(best, 0), 30)))  # rounded up
    assert float(reported.epsilon) <= float(max(best, 0)) * (1 + 1e-3) + 1e-12  # a fine grid
    # Any conversion valid for rho-zCDP holds for the Gaussian with mu = sqrt(2 rho),
    # whose exact epsilon is a second, independent floor.
    exact = gaussian_epsilon(mp.sqrt(2 * mp.mpf(rho.numerator) / rho.denominator),
                             mp.mpf(delta.numerator) / delta.denominator)
    assert float(reported.epsilon) >= float(exact)


@given(rhos, deltas)
def test_the_conversion_is_within_bun_steinke_prop_1_3(rho: Fraction, delta: Fraction) -> None:
    r = float(rho)
    closed_form = r + 2 * math.sqrt(r * math.log(1 / float(delta)))
    assert float(zcdp_conversion(rho, delta).epsilon) <= closed_form * (1 + 1e-9)


def test_each_charge_has_its_cited_rho() -> None:
    assert charge_rho(GaussianCharge(sigma=4, sensitivity=2, epsilon=1)) == Fraction(1, 8)
    dg = DiscreteGaussianCharge(sigma=10, sensitivity=3, epsilon=1, delta="1e-6")
    assert charge_rho(dg) == Fraction(9, 200)  # S^2 / (2 sigma^2), CKS 2020 Thm 4
    assert charge_rho(LaplaceCharge(scale=2, sensitivity=1)) == Fraction(1, 8)  # (1/2)^2/2
    assert charge_rho(BoundedRangeCharge(1)) == Fraction(1, 8)  # eps^2 / 8, not 1/2
    assert charge_rho(PrivacyCost("0.2")) == Fraction(1, 50)
    pure_sub = Subsampled(PrivacyCost(1), "0.01", "poisson")  # pure amplified epsilon
    assert charge_rho(pure_sub) == pure_sub.cost.epsilon ** 2 / 2
    parts = [GaussianCharge(sigma=1, sensitivity=1, epsilon=1), Repeated(PrivacyCost(1), 3),
             PrivacyCost("0.5")]
    assert charge_rho(Parallel(parts)) == Fraction(3, 2)  # the largest part: 3 x 1/2
    assert charge_rho(Parallel(parts, relation="substitution")) == Fraction(2)  # two largest
    assert rho_of(Repeated(GaussianCharge(sigma=10, sensitivity=1, epsilon=1), 7)) == \
        Fraction(7, 200)


def test_charges_without_a_rho_are_refused_by_name() -> None:
    rule = ZCDPRule(target_delta="1e-6")
    sgm = Subsampled(GaussianCharge(sigma=1, sensitivity=1, epsilon=1), "0.01", "poisson")
    with pytest.raises(UnsupportedChargeError, match=r"subsampled.*rdp"):
        rule.extend(rule.start(), sgm)
    with pytest.raises(UnsupportedChargeError, match="no zCDP bound"):
        rule.extend(rule.start(), PrivacyCost(1, "1e-6"))


def test_a_rho_budget_admits_exactly_what_sums_to_it() -> None:
    # OpenDP users hold rho: ten Gaussians of rho = 1/20 each fill Budget(rho=1/2).
    acct = Accountant(Budget(rho="0.5", delta="1e-6"), rule="zcdp")
    g = Repeated(GaussianCharge(sigma=10, sensitivity=1, epsilon=1), 10)  # rho 10/200
    for _ in range(10):
        acct.charge(g)
    assert acct.rule.rho_limit(acct.budget) == Fraction(1, 2)
    with pytest.raises(BudgetExceededError, match=r"ρ=0\.5"):
        acct.charge(GaussianCharge(sigma=1000, sensitivity=1, epsilon=1))
    assert len(acct.records) == 10
    assert acct.spent == zcdp_conversion("0.5", "1e-6")
    left = acct.remaining
    assert left.rho == 0 and left.epsilon == 0


def test_an_epsilon_delta_budget_is_turned_into_its_largest_rho() -> None:
    rule = ZCDPRule(budget=Budget(1, "1e-5"))
    limit = rule.epsilon_limit(Fraction(1), Fraction(1, 10**5))
    assert rule.epsilon(limit, Fraction(1, 10**5)) <= 1
    above = Fraction(math.nextafter(float(limit), math.inf))
    assert rule.epsilon(above, Fraction(1, 10**5)) > 1  # the largest float that fits
    # Against the exact optimum: the limit is within 1e-3 of the rho whose conversion is 1.
    lo, hi = mp.mpf(0), mp.mpf(1)
    for _ in range(100):
        mid = (lo + hi) / 2
        if cks_epsilon(Fraction(str(mid)), Fraction(1, 10**5)) <= 1:
            lo = mid
        else:
            hi = mid
    assert float(lo) * (1 - 1e-3) <= float(limit) <= float(lo) * (1 + 1e-9)


def test_both_limits_hold_when_a_budget_has_rho_and_epsilon() -> None:
    rule = ZCDPRule(target_delta="1e-5")
    both = Budget(1, "1e-5", rho="0.001")
    assert rule.rho_limit(both) == Fraction(1, 1000)
    loose = Budget(1, "1e-5", rho=10)
    assert rule.rho_limit(loose) == rule.epsilon_limit(Fraction(1), Fraction(1, 10**5))


def test_the_gaussian_mechanism_charges_its_discrete_rho() -> None:
    mech = GaussianMechanism(epsilon=1, delta="1e-6", sensitivity=1)
    acct = Accountant(Budget(rho=1, delta="1e-6"), rule="zcdp")
    acct.charge(mech)
    charge = mech.charge
    assert isinstance(charge, DiscreteGaussianCharge)
    assert acct.rule.total(acct.state).epsilon == acct.spent.epsilon
    assert acct.state.rho == charge.sensitivity**2 / (2 * charge.sigma**2)


def test_rules_that_do_not_take_rho_refuse_a_rho_budget() -> None:
    for rule in ("basic", "filter", "gdp", "rdp", "advanced"):
        with pytest.raises(ConfigError, match="does not take a zCDP budget"):
            Accountant(Budget(rho="0.5", delta="1e-6"), rule=rule,
                       plan=(PrivacyCost("0.1"), 3) if rule == "advanced" else None)
    with pytest.raises(ConfigError, match="target delta"):
        Accountant(Budget(rho="0.5"), rule="zcdp")
    with pytest.raises(ConfigError, match="delta > 0"):
        Accountant(Budget(1), rule="zcdp", rule_options={"target_delta": "1e-6"})
    ok = Accountant(Budget(rho="0.5"), rule="zcdp", rule_options={"target_delta": "1e-6"})
    assert ok.rule.describe() == {"name": "zcdp", "target_delta": "1/1000000"}


def test_a_budget_needs_epsilon_or_rho() -> None:
    from dpaccount.errors import InvalidCostError

    with pytest.raises(InvalidCostError, match="rho"):
        Budget()
    with pytest.raises(InvalidCostError, match="rho"):
        Budget(rho=-1)
    with pytest.raises(InvalidCostError, match="rho"):
        Budget(rho=float("inf"))
    assert not Budget(rho=0).is_unlimited and Budget.unlimited().is_unlimited
    assert str(Budget(rho="0.5", delta="1e-6")) == "(δ=1e-06, ρ=0.5)"
    assert repr(Budget(1, rho="0.25")) == "Budget(epsilon=1, delta=0, rho=0.25)"
    assert repr(Budget(1, "1e-6")) == "Budget(epsilon=1, delta=1e-06)"  # as before


def test_rho_is_stored_with_the_ledger_and_compared_on_open(sqlite_url: str) -> None:
    budget = Budget(rho="0.5", delta="1e-6")
    with open_ledger(sqlite_url, name="opendp", budget=budget, rule="zcdp") as acct:
        acct.charge(GaussianCharge(sigma=10, sensitivity=1, epsilon=1))
        stored = json.loads(acct.meta.model_dump_json())
        assert stored["budget_rho"] == "1/2" and stored["budget_epsilon"] is None
    with open_ledger(sqlite_url, name="opendp") as again:  # by name: settings stored
        assert again.budget == budget and again.rule.name == "zcdp"
        assert again.state.rho == Fraction(1, 200)
    with pytest.raises(ConfigError, match="created with"):
        open_ledger(sqlite_url, name="opendp", budget=Budget(rho="0.6", delta="1e-6"),
                    rule="zcdp")
    with open_ledger(sqlite_url, name="plain", budget=Budget(1)) as plain:
        assert "budget_rho" not in json.loads(plain.meta.model_dump_json())  # as before


def test_the_rule_is_rebuilt_from_its_description() -> None:
    rule = make_rule("zcdp", target_delta="1e-7")
    from dpaccount.composition import rule_from_description

    assert rule_from_description(rule.describe()).describe() == rule.describe()


def test_the_state_survives_a_snapshot_exactly() -> None:
    from dpaccount.composition.states import decode_state, encode_state
    from dpaccount.composition.zcdp import ZCDPState

    state = ZCDPState(Fraction(7, 3) + Fraction(1, 10**40))
    text = encode_state(state)
    assert text is not None and '"kind":"zcdp"' in text
    assert decode_state(text) == state


def test_the_command_line_shows_the_rho_left_of_a_rho_budget(tmp_path: Path) -> None:
    # ledger list and show print what is left as the rule reads it (as acct.remaining):
    # the rho left, budget less the charges' rho (Bun and Steinke 2016, Prop. 1.6 for a
    # Gaussian of sigma and sensitivity 1: 1 / (2 sigma^2)), not "epsilon inf"
    import io

    from dpaccount.ledger_cli import ledger_main

    url = f"sqlite:///{tmp_path}/rho.db"
    with open_ledger(url, name="z", budget=Budget(rho="0.5", delta="1e-6"),
                     rule="zcdp") as acct:
        acct.charge(GaussianCharge(sigma=2, sensitivity=1, epsilon=1))
        left = acct.remaining
    assert left.rho is not None and left.rho <= Fraction(1, 2) - Fraction(1, 8)
    assert left.rho > Fraction(1, 2) - Fraction(1, 8) - Fraction(1, 10**6)
    for command in (["list", url], ["show", url, "--name", "z"]):
        out = io.StringIO()
        assert ledger_main(["ledger", *command], out=out) == 0
        text = out.getvalue()
        assert "epsilon inf" not in text
        assert f"rho {float(left.rho):.6g}"[:10] in text, text
