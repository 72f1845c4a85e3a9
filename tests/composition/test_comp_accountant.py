"""The new rules inside an Accountant (passed as Rule instances)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpaccount.accountant import Accountant
from dpaccount.charges import Repeated
from dpaccount.composition.advanced import AdvancedRule
from dpaccount.composition.best import best_rule
from dpaccount.composition.optimal import OptimalRule, optimal
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import BudgetExceededError, UnsupportedChargeError


def test_fixed_plan_accountant_refuses_off_plan_charges() -> None:
    budget = Budget(5, "1e-5")
    acct = Accountant(budget, rule=AdvancedRule(plan=(PrivacyCost("0.05"), 200), budget=budget))
    acct.charge(Repeated(PrivacyCost("0.05"), 150))
    spent = acct.spent
    with pytest.raises(UnsupportedChargeError, match="declared to cost"):
        acct.charge(PrivacyCost("0.06"))
    with pytest.raises(UnsupportedChargeError, match="plan of 200"):
        acct.charge(Repeated(PrivacyCost("0.05"), 51))
    assert acct.spent == spent  # refusals change nothing
    acct.charge(Repeated(PrivacyCost("0.05"), 50))
    assert acct.spent.epsilon < 10  # advanced beats basic's 200 x 0.05 = 10


def test_optimal_accountant_refuses_over_budget_and_reports_the_optimum() -> None:
    budget = Budget(2, "1e-6")
    acct = Accountant(budget, rule=OptimalRule(plan=(PrivacyCost("0.02"), 1000), budget=budget))
    admitted = 0
    with pytest.raises(BudgetExceededError):
        for _ in range(1000):
            acct.charge(Repeated(PrivacyCost("0.02"), 10))
            admitted += 10
    assert acct.spent == optimal(PrivacyCost("0.02"), admitted, "1e-6")
    assert optimal(PrivacyCost("0.02"), admitted + 10, "1e-6").epsilon > 2


def test_best_rule_in_an_accountant_records_its_theorem() -> None:
    budget = Budget(1, "1e-5")
    rule = best_rule(budget=budget)
    acct = Accountant(budget, rule=rule)
    assert acct.rule.name == "filter"
    assert "Whitehouse" in acct.rule.theorem
    remaining = acct.remaining_for(10)
    # sqrt(2 ln(2e5) 10) eps + 5 eps^2 = 1 at eps = 0.06274...
    assert remaining.epsilon is not None
    assert Fraction(627, 10**4) < remaining.epsilon < Fraction(628, 10**4)
    acct.charge(Repeated(PrivacyCost(remaining.epsilon, remaining.delta), 10))
    with_plan = best_rule(plan=(PrivacyCost("0.01"), 1000), budget=budget)
    assert with_plan.name == "optimal"
