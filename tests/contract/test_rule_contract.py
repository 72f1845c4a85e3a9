"""The contract every composition Rule satisfies, subclassed per implementation."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dpaccount.charges import Repeated
from dpaccount.composition.advanced import AdvancedRule
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.composition.basic import BasicRule
from dpaccount.composition.best import best_rule
from dpaccount.composition.filters import FilterRule
from dpaccount.composition.heterogeneous import HeterogeneousRule
from dpaccount.composition.optimal import OptimalRule
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

BUDGET = Budget(1, "1e-5")
UNIT = PrivacyCost("0.01")
PLAN = (UNIT, 500)


class RuleContract:
    """Subclasses provide ``make`` (a fresh rule) and may narrow ``unit``."""

    unit: PrivacyCost = UNIT
    fixed_plan: bool = False

    def make(self) -> Rule[Any]:
        raise NotImplementedError

    def test_declares_name_adaptivity_and_theorem(self) -> None:
        rule = self.make()
        assert isinstance(rule.name, str) and rule.name
        assert isinstance(rule.adaptivity, Adaptivity)
        assert re.search(r"(19|20)\d\d", rule.theorem)
        assert re.search(r"Thm|Theorem", rule.theorem)
        assert rule.__doc__ and len(rule.__doc__) > 40

    def test_empty_ledger_costs_nothing(self) -> None:
        rule = self.make()
        assert rule.total(rule.start()) == PrivacyCost(0)

    def test_add_is_pure(self) -> None:
        rule = self.make()
        state = rule.extend(rule.start(), self.unit)
        before = rule.total(state)
        rule.extend(state, Repeated(self.unit, 3))
        assert rule.total(state) == before

    def test_repeated_equals_separate_charges(self) -> None:
        rule = self.make()
        separate = rule.start()
        for _ in range(7):
            separate = rule.extend(separate, self.unit)
        once = rule.extend(rule.start(), Repeated(self.unit, 7))
        nested = rule.extend(rule.start(), Repeated(Repeated(self.unit, 7), 1))
        assert rule.total(separate) == rule.total(once) == rule.total(nested)

    def test_total_is_monotone_and_admits_agrees_with_total(self) -> None:
        rule = self.make()
        state = rule.start()
        previous = rule.total(state)
        for _ in range(60):
            state = rule.extend(state, Repeated(self.unit, 5))
            total = rule.total(state)
            assert total.epsilon >= previous.epsilon
            assert total.delta >= previous.delta
            assert rule.admits(state, BUDGET) == total.fits(BUDGET)
            previous = total

    def test_never_more_than_basic_for_fixed_plans(self) -> None:
        rule = self.make()
        state = rule.start()
        for n in range(1, 50):
            state = rule.extend(state, self.unit)
            total = rule.total(state)
            basic = self.unit.times(n)
            # Either the rule is tighter in epsilon, or it reports basic itself.
            assert total.epsilon < basic.epsilon or total == basic or not self.fixed_plan

    def test_refusal_leaves_the_state_usable(self) -> None:
        rule = self.make()
        state = rule.extend(rule.start(), self.unit)
        before = rule.total(state)
        with pytest.raises((InvalidCostError, UnsupportedChargeError)):
            rule.extend(state, "not a charge")  # type: ignore[arg-type]
        assert rule.total(state) == before
        assert rule.total(rule.extend(state, self.unit)).epsilon >= before.epsilon

    def test_describe_is_json_and_deterministic(self) -> None:
        description = self.make().describe()
        assert description["name"] == self.make().name
        assert json.loads(json.dumps(description)) == description
        assert self.make().describe() == description

    def test_remaining_is_admitted(self) -> None:
        rule = self.make()
        state = rule.extend(rule.start(), Repeated(self.unit, 10))
        per_query = rule.remaining(state, BUDGET, 5)
        cost = PrivacyCost(per_query.epsilon, per_query.delta)
        assert rule.admits(rule.extend(state, Repeated(cost, 5)), BUDGET)


class TestBasicRule(RuleContract):
    def make(self) -> Rule[Any]:
        return BasicRule()


class TestFilterRule(RuleContract):
    def make(self) -> Rule[Any]:
        return FilterRule(budget=BUDGET)


class TestAdvancedRule(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        return AdvancedRule(plan=PLAN, budget=BUDGET)


class TestAdvancedRuleAEpsilon(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        return AdvancedRule(plan=PLAN, delta_slack="1e-6", form="a_epsilon")


class TestHeterogeneousRule(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        return HeterogeneousRule(plan=PLAN, budget=BUDGET)


class TestOptimalRule(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        return OptimalRule(plan=PLAN, budget=BUDGET)


class TestBestRule(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        return best_rule("adaptive_mechanisms", plan=PLAN, budget=BUDGET)


class TestZCDPRule(RuleContract):
    def make(self) -> Rule[Any]:
        from dpaccount.composition.zcdp import ZCDPRule

        return ZCDPRule(budget=BUDGET)

    def test_declares_full_adaptivity_and_takes_rho(self) -> None:
        rule = self.make()
        assert rule.adaptivity is Adaptivity.FULLY_ADAPTIVE and rule.takes_rho


class FixedPlanContract:
    """Extra promises of the fixed-plan rules: charges outside the plan are refused."""

    def make(self) -> Rule[Any]:
        raise NotImplementedError

    def test_refuses_more_than_planned(self) -> None:
        rule = self.make()
        with pytest.raises(UnsupportedChargeError, match="declared"):
            rule.extend(rule.start(), PrivacyCost("0.02"))

    def test_refuses_past_the_end(self) -> None:
        rule = self.make()
        state = rule.extend(rule.start(), Repeated(UNIT, 500))
        with pytest.raises(UnsupportedChargeError, match="plan of 500"):
            rule.extend(state, UNIT)
        with pytest.raises(UnsupportedChargeError):
            rule.extend(rule.start(), Repeated(UNIT, 501))

    def test_declares_adaptive_mechanisms_only(self) -> None:
        assert self.make().adaptivity is Adaptivity.ADAPTIVE_MECHANISMS


class TestAdvancedPlan(FixedPlanContract):
    def make(self) -> Rule[Any]:
        return AdvancedRule(plan=PLAN, budget=BUDGET)


class TestHeterogeneousPlan(FixedPlanContract):
    def make(self) -> Rule[Any]:
        return HeterogeneousRule(plan=PLAN, budget=BUDGET)


class TestOptimalPlan(FixedPlanContract):
    def make(self) -> Rule[Any]:
        return OptimalRule(plan=PLAN, budget=BUDGET)


# -- the tight engines of dpaccount.accounting ---------------------------------------

class TestPLDRule(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        from dpaccount.accounting import PLDRule

        return PLDRule(plan=PLAN, budget=BUDGET)

    def test_remaining_is_admitted(self) -> None:
        rule = self.make()
        with pytest.raises(UnsupportedChargeError):  # only planned charges are accepted
            rule.remaining(rule.start(), BUDGET, 5)


class TestPLDPlan(FixedPlanContract):
    def make(self) -> Rule[Any]:
        from dpaccount.accounting import PLDRule

        return PLDRule(plan=PLAN, budget=BUDGET)

    def test_refuses_more_than_planned(self) -> None:
        rule = self.make()
        with pytest.raises(UnsupportedChargeError):
            rule.extend(rule.start(), PrivacyCost("0.02"))

    def test_refuses_past_the_end(self) -> None:
        rule = self.make()
        state = rule.extend(rule.start(), Repeated(UNIT, 500))
        with pytest.raises(UnsupportedChargeError):
            rule.extend(state, UNIT)


class TestRDPFilterRule(RuleContract):
    def make(self) -> Rule[Any]:
        from dpaccount.accounting import RDPRule

        return RDPRule(budget=BUDGET)

    def test_declares_full_adaptivity(self) -> None:
        assert self.make().adaptivity is Adaptivity.FULLY_ADAPTIVE


class TestRDPCompositionRule(RuleContract):
    fixed_plan = True

    def make(self) -> Rule[Any]:
        from dpaccount.accounting import RDPRule

        return RDPRule(budget=BUDGET, adaptive=False, plan=PLAN)

    def test_remaining_is_admitted(self) -> None:
        rule = self.make()
        with pytest.raises(UnsupportedChargeError):  # only planned charges are accepted
            rule.remaining(rule.start(), BUDGET, 5)


class TestRDPPlan(FixedPlanContract):
    """``rdp`` with ``adaptive=False`` holds a declared plan (issue: soundness, item 3)."""

    def make(self) -> Rule[Any]:
        from dpaccount.accounting import RDPRule

        return RDPRule(budget=BUDGET, adaptive=False, plan=PLAN)

    def test_needs_a_plan(self) -> None:
        from dpaccount.accounting import RDPRule
        from dpaccount.errors import ConfigError

        with pytest.raises(ConfigError, match="declared plan"):
            RDPRule(budget=BUDGET, adaptive=False)


class TestGDPFilterRule(RuleContract):
    def make(self) -> Rule[Any]:
        from dpaccount.accounting import GDPFilterRule

        return GDPFilterRule(budget=BUDGET)

    @property
    def unit(self) -> Any:  # type: ignore[override]
        from dpaccount.charges import GaussianCharge

        return GaussianCharge(sigma=100, sensitivity=1, epsilon="0.01")

    def test_never_more_than_basic_for_fixed_plans(self) -> None:
        # Replaced for Gaussian charges: the total is the Gaussian-DP closed form of
        # mu = sqrt(n) / sigma (Dong, Roth and Su 2019, Cor. 2.13), solved here by brentq.
        import math

        from scipy.optimize import brentq
        from scipy.stats import norm

        rule = self.make()
        state = rule.extend(rule.start(), Repeated(self.unit, 40))
        mu = math.sqrt(40) / 100

        def excess(eps: float) -> float:
            curve = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
            return float(curve) - 1e-5

        expected = brentq(excess, 1e-9, 50, xtol=1e-14)
        got = float(rule.total(state).epsilon)
        assert expected <= got <= expected * (1 + 1e-6)

    def test_remaining_is_admitted(self) -> None:
        rule = self.make()
        with pytest.raises(UnsupportedChargeError):  # it takes Gaussian charges only
            rule.extend(rule.start(), PrivacyCost("0.01"))
