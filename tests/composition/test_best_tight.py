"""`best` with the tight engines: proven for the declared adaptivity, and the tightest."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpaccount import Accountant, Budget, BudgetExceededError, GaussianCharge, Subsampled
from dpaccount.composition import Adaptivity, BasicRule, FilterRule, best_rule

BUDGET = Budget(3, "1e-5")
STEP = Subsampled(GaussianCharge(Fraction(11, 10), 1, 1), Fraction(256, 60000), "poisson")


def admitted(acct: Accountant, charge: object, limit: int) -> int:
    n = 0
    while n < limit:
        try:
            acct.charge(charge)  # type: ignore[arg-type]
        except BudgetExceededError:
            break
        n += 1
    return n


def test_fully_adaptive_forecast_of_dpsgd_steps_picks_the_renyi_filter() -> None:
    rule = best_rule("fully_adaptive", plan=(STEP, 2000), budget=BUDGET)
    assert rule.name == "rdp"
    assert rule.adaptivity is Adaptivity.FULLY_ADAPTIVE
    # basic and the (epsilon, delta) filter admit no step at all: each step's delta at its
    # epsilon = 1 point (~3e-4) is already above the budget's delta
    for other in (BasicRule(), FilterRule(budget=BUDGET)):
        assert not other.admits(other.extend(other.start(), STEP), BUDGET)
    assert admitted(Accountant(BUDGET, rule=rule), STEP, 2000) == 2000


def test_fully_adaptive_forecast_of_plain_gaussians_picks_the_gdp_filter() -> None:
    gaussian = GaussianCharge(10, 1, 1)
    rule = best_rule("fully_adaptive", plan=[(gaussian, 50)], budget=BUDGET)
    assert rule.name == "gdp" and rule.adaptivity is Adaptivity.FULLY_ADAPTIVE
    rdp = best_rule("fully_adaptive", plan=[(STEP, 1)], budget=BUDGET)
    assert admitted(Accountant(BUDGET, rule=rule), gaussian, 10**4) >= admitted(
        Accountant(BUDGET, rule=rdp), gaussian, 10**4
    )


def test_declared_plan_of_charges_picks_the_pld() -> None:
    acct = Accountant(BUDGET, rule="best", plan=(STEP, 14063))
    assert acct.rule.name == "pld"
    assert acct.rule.adaptivity is Adaptivity.ADAPTIVE_MECHANISMS
    assert 2.37 < float(acct.rule.total(acct.rule.extend(acct.rule.start(), STEP)).epsilon) < 2.39


def test_fully_adaptive_without_a_forecast_is_the_filter() -> None:
    assert best_rule("fully_adaptive", budget=BUDGET).name == "filter"
    assert best_rule("fully_adaptive", budget=Budget(3)).name == "basic"


@pytest.mark.parametrize("adaptivity", ["fixed_plan", "adaptive_mechanisms", "fully_adaptive"])
def test_best_is_always_proven_for_the_declared_adaptivity(adaptivity: str) -> None:
    rule = best_rule(adaptivity, plan=(STEP, 100), budget=BUDGET)
    assert rule.adaptivity >= Adaptivity[adaptivity.upper()]
