"""A declared plan on the privacy loss distribution: `compose_plan()` and `PLDRule`.

`compose_plan()` composes a declared plan of charges (equal atoms self-composed by
repeated squaring, plain Gaussians merged exactly first); `PLDRule` is the accountant
rule that composes its plan once and then certifies the better of the whole plan's
epsilon and basic composition of what has run. Proven for adaptively chosen mechanisms
with a fixed, declared sequence of privacy parameters (``ADAPTIVE_MECHANISMS``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import at_most, check_delta, float_up
from dpaccount.accounting._plans import DeclaredPlan, as_charges
from dpaccount.accounting.pld.build import DEFAULT_INTERVAL, DEFAULT_TAIL_MASS
from dpaccount.accounting.pld.distribution import PrivacyLossDistribution
from dpaccount.charges import Atom, Charge, GaussianCharge, Relation, atoms
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["PLDRule", "PLDState", "compose_plan", "plan_runs"]

_THEOREM = (
    "Privacy loss distributions: Koskela, Jalko and Honkela 2020 (FFT accounting); "
    "Doroshenko, Ghazi, Kamath, Kumar and Manurangsi 2022 (connect-the-dots pessimistic "
    "discretisation); Dong, Roth and Su 2019, Thm 3.2 and Zhu, Dong and Wang 2022 "
    "(composition of dominating pairs, subsampling); valid for adaptively chosen "
    "mechanisms with a fixed, declared sequence of privacy parameters"
)


def compose_plan(
    charges: Iterable[Charge],
    *,
    relation: Relation | str = Relation.ADD_REMOVE,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> PrivacyLossDistribution:
    """The PLD of a declared plan of charges (heterogeneous, with repetitions).

    Equal atoms are grouped and self-composed by repeated squaring; plain Gaussians are
    merged exactly into one (Dong, Roth and Su 2019, Cor. 3.3); the groups are then
    convolved in sequence.

    Raises:
        UnsupportedChargeError: A charge outside ``relation``.
        InvalidCostError: An empty plan.

    Examples:
        >>> from dpaccount.charges import GaussianCharge, Repeated
        >>> pld = compose_plan([Repeated(GaussianCharge(sigma=10, sensitivity=1, epsilon=1), 100)],
        ...                    value_discretization_interval=1e-3)
        >>> low, high = pld.epsilon(1e-5)     # = one Gaussian of mu = 1
        >>> 4.36 < float(low) <= float(high) < 4.39
        True
    """
    rel = Relation(relation)
    items = DeclaredPlan(charges, "pld", "").items
    if not items:
        raise InvalidCostError("charges", [], "the plan is empty")
    options = {
        "value_discretization_interval": value_discretization_interval,
        "tail_mass": tail_mass,
        "lower": lower,
    }
    mu_squared = Fraction(0)
    parts: list[PrivacyLossDistribution] = []
    for atom, count in items:
        if isinstance(atom, GaussianCharge):
            mu_squared += count * (atom.sensitivity / atom.sigma) ** 2
            continue
        single = PrivacyLossDistribution.from_charge(atom, relation=rel, **options)
        parts.append(single.self_compose(count))
    if mu_squared:
        # sigma = 1 / sqrt(sum mu_i^2), rounded down (more noise never: less).
        mu = math.sqrt(float_up(mu_squared))
        mu = math.nextafter(mu, math.inf)
        parts.append(PrivacyLossDistribution.gaussian(Fraction(1), Fraction(mu), **options))
    result = parts[0]
    for part in parts[1:]:
        result = result.compose(part)
    return result


@attrs.frozen
class PLDState:
    """How many runs of each plan item have been charged, and their basic sums."""

    used: tuple[int, ...]
    epsilon: Fraction
    delta: Fraction


def plan_runs(plan: Any) -> list[tuple[Charge, int]]:
    """A declared plan read as ``(atom, count)`` runs, in order (see `as_charges()`)."""
    runs: list[tuple[Charge, int]] = []
    for charge in as_charges(plan):
        runs.extend(atoms(charge))
    return runs


class PLDRule(Rule[PLDState]):
    """Accountant rule for a declared plan, accounted on the privacy loss distribution.

    The plan (charges with their multiplicities, in any order) is composed once at
    construction. After some charges, `total()` is the better of two valid bounds:
    the certified PLD epsilon of the *whole* plan at ``target_delta`` (which bounds
    every part of the plan, by post-processing) and basic composition of what has run
    (Dwork and Roth 2014, Thm 3.16). `add()` is O(1): it checks that the atom is in
    the plan, that its declared count is not exhausted, and adds to the basic sums.

    Adaptivity: ``ADAPTIVE_MECHANISMS`` -- which mechanism runs may depend on earlier
    answers, but the sequence of privacy parameters is the declared plan (Zhu, Dong and
    Wang 2022; Dong, Roth and Su 2019, Thm 3.2). Run-time parameters need
    `RDPRule` (a Renyi filter) or
    `GDPFilterRule`.

    Args:
        plan: The declared charges: ``(charge, k)``, a list of charges (``Repeated``
            and ``(charge, k)`` pairs allowed) or a planning ``Plan``.
        target_delta: The delta at which epsilon is reported; default the budget's.
        budget: The ledger's budget (only for the default ``target_delta``).
        relation: The neighbouring relation of the ledger.
        value_discretization_interval: Accuracy of the PLD grid.
        tail_mass: Mass truncated per tail and step (added to delta).

    Examples:
        >>> from dpaccount.charges import GaussianCharge
        >>> g = GaussianCharge(sigma=2, sensitivity=1, epsilon=1)
        >>> rule = PLDRule((g, 4), target_delta="1e-5", value_discretization_interval=1e-3)
        >>> state = rule.add(rule.start(), g, 2)
        >>> 4.36 < float(rule.total(state).epsilon) < 4.39    # 4 x sigma 2 = mu 1
        True
        >>> rule.admits(state, Budget(5, "1e-5")), rule.admits(state, Budget(4, "1e-5"))
        (True, False)
    """

    name = "pld"
    adaptivity = Adaptivity.ADAPTIVE_MECHANISMS
    theorem = _THEOREM

    def __init__(
        self,
        plan: Any = None,
        target_delta: Any = None,
        *,
        budget: Budget | None = None,
        relation: Relation | str = Relation.ADD_REMOVE,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
    ) -> None:
        charges = as_charges(plan)
        if target_delta is None:
            if budget is None:
                raise ConfigError("the pld rule needs target_delta (or budget=)")
            target_delta = budget.delta
        self.relation = Relation(relation)
        self.target_delta = check_delta(target_delta, "target_delta")
        self._plan = DeclaredPlan(charges, "pld", "use the rdp rule for run-time parameters")
        self._items = self._plan.items
        if not self._items:
            raise ConfigError("the pld rule needs a non-empty declared plan")
        self._pld = compose_plan(
            charges,
            relation=self.relation,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
            lower=False,
        )
        self.interval = self._pld.interval
        _low, upper = self._pld.epsilon(self.target_delta)
        self._total: PrivacyCost | None = (
            None if upper is None else trusted_cost(upper, self.target_delta)
        )

    @property
    def distribution(self) -> PrivacyLossDistribution:
        """The composed PLD of the whole plan."""
        return self._pld

    def start(self) -> PLDState:
        return PLDState((0,) * len(self._items), Fraction(0), Fraction(0))

    def add(self, state: PLDState, atom: Atom, count: int) -> PLDState:
        used, cost = self._plan.use(state.used, atom, count)
        if count == 1:
            return PLDState(used, state.epsilon + cost.epsilon, state.delta + cost.delta)
        return PLDState(
            used, state.epsilon + cost.epsilon * count, state.delta + cost.delta * count
        )

    def total(self, state: PLDState) -> PrivacyCost:
        basic = state.delta.numerator < state.delta.denominator  # delta < 1
        if not any(state.used):
            return trusted_cost(Fraction(0), Fraction(0))
        plan = self._total
        if plan is None or (
            basic and at_most(state.epsilon, plan.epsilon) and at_most(state.delta, plan.delta)
        ):
            if not basic:
                raise InvalidCostError("delta", state.delta, "the summed delta reaches 1")
            return trusted_cost(state.epsilon, state.delta)
        return plan

    def admits(self, state: PLDState, budget: Budget) -> bool:
        if not any(state.used):
            return True
        try:
            return self.total(state).fits(budget)
        except InvalidCostError:
            return False

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target_delta": str(self.target_delta),
            "relation": self.relation.value,
            "value_discretization_interval": self.interval,
            "plan": [[repr(atom), count] for atom, count in self._items],
        }
