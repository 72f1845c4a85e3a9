"""Basic composition: epsilons add up and deltas add up."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

import attrs

from dpaccount._numeric import bounded_up
from dpaccount.charges import Atom, Charge, cost_of
from dpaccount.composition.base import Adaptivity, Rule, SpentMeaning
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import InvalidCostError

__all__ = ["BasicRule", "basic"]

_THEOREM = (
    "Dwork and Roth 2014, Thm 3.16 (basic composition); valid for adaptively chosen "
    "parameters by Rogers, Roth, Ullman and Vadhan 2016, Thm 3.6 (basic composition "
    "is a valid privacy filter)"
)


@attrs.frozen
class BasicState:
    """Running sums of epsilon and delta: exact, or rounded up to the dyadic grid of
    `dpaccount._numeric.bounded_up` once exact ones would outgrow it."""

    epsilon: Fraction
    delta: Fraction


class BasicRule(Rule[BasicState]):
    """Basic composition: the epsilons add up and the deltas add up.

    Proven for the fully adaptive case: Dwork and Roth 2014, Thm 3.16 for adaptively
    chosen mechanisms, and Rogers, Roth, Ullman and Vadhan 2016 (Thm 3.6) show that
    stopping when the sum would exceed the budget is a valid privacy filter, so each
    query's epsilon and delta may be chosen at run time. Sums are exact, until a sum's
    denominator would outgrow `dpaccount._numeric.SUM_BITS` bits (distinct run-time
    values with coprime denominators, such as epsilon = 1 / scale for fresh float
    scales): from there it is rounded up to a multiple of 2^-4096 (`bounded_up`), an
    upper bound within 2^-4096 per charge, so a charge stays O(1). A rounded sum only
    ever refuses what the exact one would admit, never the other way.

    Examples:
        >>> rule = BasicRule()
        >>> s = rule.extend(rule.start(), PrivacyCost("0.25", "1e-6"))
        >>> rule.total(rule.extend(s, PrivacyCost("0.5")))
        PrivacyCost(epsilon=0.75, delta=1e-06)
    """

    name = "basic"
    adaptivity = Adaptivity.FULLY_ADAPTIVE
    spent_meaning = SpentMeaning.SUM
    theorem = _THEOREM
    order_free = True  # sums of epsilon and delta: replays fold each charge once
    bounded = True  # each sum rounded up to the dyadic grid once it would outgrow it

    def start(self) -> BasicState:
        return BasicState(Fraction(0), Fraction(0))

    def add(self, state: BasicState, atom: Atom, count: int) -> BasicState:
        cost = cost_of(atom)
        if count == 1:
            return BasicState(bounded_up(state.epsilon + cost.epsilon),
                              bounded_up(state.delta + cost.delta))
        return BasicState(
            bounded_up(state.epsilon + cost.epsilon * count),
            bounded_up(state.delta + cost.delta * count),
        )

    def extend_costed(self, state: BasicState, charge: Charge, cost: PrivacyCost
                      ) -> BasicState:
        """``cost_of(charge)`` is the sum of its atoms' costs times their counts
        (`Repeated.cost` multiplies exactly), which is what `extend` adds (each sum
        bounded the same way, so a replay gives the same state)."""
        return BasicState(bounded_up(state.epsilon + cost.epsilon),
                          bounded_up(state.delta + cost.delta))

    def bounded_sums(self, state: BasicState) -> tuple[Fraction, ...]:
        return state.epsilon, state.delta

    def bounded_terms(self, atom: Atom) -> tuple[Fraction, ...]:
        cost = cost_of(atom)
        return cost.epsilon, cost.delta

    def total(self, state: BasicState) -> PrivacyCost:
        if state.delta >= 1:
            raise InvalidCostError("delta", state.delta, "the summed delta reaches 1")
        return trusted_cost(state.epsilon, state.delta)

    def admits(self, state: BasicState, budget: Budget) -> bool:
        # Exact cross-multiplied comparisons (denominators are positive): the same as
        # Fraction's <= without its type dispatch, on the per-charge path.
        eps, limit = state.epsilon, budget.epsilon
        if limit is not None and eps.numerator * limit.denominator > (
            limit.numerator * eps.denominator
        ):
            return False
        delta, dlimit = state.delta, budget.delta
        return delta.numerator * dlimit.denominator <= dlimit.numerator * delta.denominator


    def remaining(self, state: BasicState, budget: Budget, k: int) -> Budget:
        """(budget - spent) / k in each coordinate, exactly (0 when over)."""
        delta = max(budget.delta - state.delta, Fraction(0)) / k
        if budget.epsilon is None:
            return Budget.unlimited(delta)
        return Budget(max(budget.epsilon - state.epsilon, Fraction(0)) / k, delta)


def basic(costs: Iterable[Charge]) -> PrivacyCost:
    """Compose charges by basic composition (sums), valid under full adaptivity.

    Dwork and Roth 2014, Thm 3.16; as a filter, Rogers et al. 2016, Thm 3.6.

    Args:
        costs: Charges (PrivacyCost or any charge from `dpaccount.charges`).

    Returns:
        The exact sum of epsilons and of deltas.

    Examples:
        >>> basic([PrivacyCost("0.1")] * 10)
        PrivacyCost(epsilon=1, delta=0)
    """
    rule = BasicRule()
    state = rule.start()
    for charge in costs:
        state = rule.extend(state, charge)
    return rule.total(state)
