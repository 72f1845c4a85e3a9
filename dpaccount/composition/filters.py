"""A privacy filter for fully adaptive composition (Whitehouse, Ramdas, Rogers, Wu 2023).

Whitehouse, Ramdas, Rogers and Wu, "Fully-Adaptive Composition in Differential Privacy"
(ICML 2023), Thm 3.2 (the filter for approximate DP): let each mechanism A_n be
(epsilon_n, delta_n)-DP *given the previous outputs* (so epsilon_n, delta_n may be chosen
at run time), and split the budget delta = delta' + delta'' with delta' > 0. Stopping
before the first n for which

    epsilon < sqrt(2 ln(1/delta') sum_{m<=n} epsilon_m^2) + (1/2) sum_{m<=n} epsilon_m^2
    or delta'' < sum_{m<=n} delta_m

makes the whole interaction (epsilon, delta)-DP. This matches the constants of advanced
composition while allowing the parameters to be chosen adaptively.

`FilterRule` keeps the two running sums exactly, or, once a sum's denominator would
outgrow `dpaccount._numeric.SUM_BITS` bits (distinct run-time epsilons with coprime
denominators), rounded up to a multiple of 2^-4096 (`bounded_up`): an upper bound
within 2^-4096 per charge, O(1) per charge. Larger sums only make the filter stop
sooner, so the theorem's guarantee holds for the rounded sums. It admits a charge only
if, after it, the stopping condition is not met:
sqrt(2 ln(1/delta') S2) + S2 / 2 <= epsilon (rounded up) and sum delta_m <= delta - delta'.

Examples:
    >>> c = filter_epsilon([PrivacyCost("0.01")] * 393, "5e-6")
    >>> float(c.epsilon) <= 1.0
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import ZERO, bounded_up, float_up, up
from dpaccount.charges import Atom, cost_of
from dpaccount.composition.advanced import check_slack, log_inv_up
from dpaccount.composition.base import Adaptivity, ByIdentity, Rule, SpentMeaning
from dpaccount.composition.plans import as_cost, remaining_per_query
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["FilterRule", "FilterState", "filter_epsilon", "filter_value"]

THEOREM_FILTER = (
    "Whitehouse, Ramdas, Rogers and Wu 2023 (ICML), Thm 3.2: privacy filter for "
    "approximate DP, stop when sqrt(2 ln(1/delta') sum eps_m^2) + sum eps_m^2 / 2 would "
    "exceed epsilon or sum delta_m would exceed delta - delta'; fully adaptive"
)


def filter_value(eps_sq: Fraction, delta_slack: Fraction) -> Fraction:
    """sqrt(2 ln(1/delta') S2) + S2 / 2, rounded up (exact 0 for S2 = 0).

    Examples:
        >>> filter_value(Fraction(0), Fraction(1, 10))
        Fraction(0, 1)
    """
    if eps_sq == 0:
        return ZERO
    s2 = float_up(eps_sq)
    return up(math.sqrt(2 * log_inv_up(delta_slack) * s2) + s2 / 2, 16)


def filter_epsilon(costs: Iterable[Any], delta_slack: Any) -> PrivacyCost:
    """What the filter's stopping rule reads after ``costs``: Whitehouse et al. 2023, Thm 3.2.

    Returns (sqrt(2 ln(1/delta') sum eps^2) + sum eps^2 / 2, delta' + sum delta), the
    smallest budget under which the filter would have admitted this sequence of charges.
    A ledger run with the filter and budget (epsilon, delta) is (epsilon, delta)-DP even
    when each epsilon_m and delta_m was chosen at run time (fully adaptive).

    Args:
        costs: The charges' costs, in any order (the bound depends on sums only).
        delta_slack: delta' in (0, 1).

    Examples:
        >>> c = filter_epsilon([PrivacyCost("0.01")] * 100, "5e-6")
        >>> 0.49 < float(c.epsilon) < 0.50, c.delta
        (True, Fraction(1, 200000))
    """
    slack = check_slack(delta_slack)
    eps_sq = ZERO
    delta = ZERO
    for item in costs:
        cost = as_cost(item)
        eps_sq += cost.epsilon * cost.epsilon
        delta += cost.delta
    total_delta = slack + delta
    if total_delta >= 1:
        raise InvalidCostError("delta", total_delta, "delta_slack + sum of deltas reaches 1")
    return trusted_cost(filter_value(eps_sq, slack), total_delta)


def _filter_terms(atom: Atom) -> tuple[Fraction, Fraction]:
    cost = cost_of(atom)
    return cost.epsilon * cost.epsilon, cost.delta


@attrs.frozen
class FilterState:
    """The filter's running sums: sum epsilon_m^2 and sum delta_m, exact or rounded up to
    the dyadic grid of `dpaccount._numeric.bounded_up`."""

    eps_sq: Fraction
    delta: Fraction


class FilterRule(Rule[FilterState]):
    """Accountant rule: the Whitehouse-Ramdas-Rogers-Wu privacy filter (fully adaptive).

    ``admits`` is the filter's stopping rule for the ledger's budget (epsilon, delta):
    continue while sqrt(2 ln(1/delta') S2) + S2/2 <= epsilon and
    sum delta_m <= delta - delta'. The ledger is then (epsilon, delta)-DP however the
    parameters were chosen (Whitehouse et al. 2023, Thm 3.2). ``total`` reports the
    stopping rule's running value (delta' + sum delta_m in the delta coordinate): the
    part of the budget the filter has used, not a standalone guarantee for an arbitrary
    budget chosen afterwards (that would be an odometer).

    This filter is not always tighter than basic composition (one charge of 0.5 under
    budget (1, 1e-5) is refused by it and admitted by basic); both are valid filters,
    but switching between them at run time is not covered by either theorem, so the
    choice is made once, when the ledger is created (see ``best_rule``).

    Args:
        delta_slack: delta' in (0, budget delta). If omitted, half of ``budget``'s delta.
        budget: The ledger's budget (only for the default delta_slack).

    Examples:
        >>> from dpaccount.charges import Repeated
        >>> rule = FilterRule(delta_slack="5e-6")
        >>> s = rule.extend(rule.start(), Repeated(PrivacyCost("0.01"), 393))
        >>> rule.admits(s, Budget(1, "1e-5"))
        True
        >>> rule.admits(rule.extend(s, PrivacyCost("0.01")), Budget(1, "1e-5"))
        False
    """

    name = "filter"
    adaptivity = Adaptivity.FULLY_ADAPTIVE
    spent_meaning = SpentMeaning.FILTER
    theorem = THEOREM_FILTER
    order_free = True  # sums of epsilon^2 and delta
    bounded = True  # each sum rounded up to the dyadic grid once it would outgrow it

    def __init__(self, delta_slack: Any = None, *, budget: Budget | None = None) -> None:
        if delta_slack is None:
            if budget is None or budget.delta == 0:
                raise ConfigError(
                    "the filter needs a delta_slack > 0 (e.g. half the budget's delta), or "
                    "budget= with a delta > 0; with a pure-epsilon budget use rule='basic'"
                )
            delta_slack = budget.delta / 2
        self.delta_slack = check_slack(delta_slack)
        if budget is not None and self.delta_slack > budget.delta:
            raise ConfigError(
                f"delta_slack {self.delta_slack} exceeds the budget's delta {budget.delta}"
            )
        self._log_inv = log_inv_up(self.delta_slack)
        # A charge met again is not costed and squared again: (epsilon^2, delta).
        self._terms = ByIdentity[tuple[Fraction, Fraction]]()

    def start(self) -> FilterState:
        return FilterState(ZERO, ZERO)

    def add(self, state: FilterState, atom: Atom, count: int) -> FilterState:
        e2, delta = self._terms.get(atom, lambda: _filter_terms(atom))
        if count == 1:
            return FilterState(bounded_up(state.eps_sq + e2), bounded_up(state.delta + delta))
        return FilterState(bounded_up(state.eps_sq + e2 * count),
                           bounded_up(state.delta + delta * count))

    def bounded_sums(self, state: FilterState) -> tuple[Fraction, ...]:
        return state.eps_sq, state.delta

    def bounded_terms(self, atom: Atom) -> tuple[Fraction, ...]:
        return self._terms.get(atom, lambda: _filter_terms(atom))

    def value(self, state: FilterState) -> Fraction:
        """sqrt(2 ln(1/delta') S2) + S2/2 for this state, rounded up."""
        if state.eps_sq == 0:
            return ZERO
        s2 = float_up(state.eps_sq)
        return up(math.sqrt(2 * self._log_inv * s2) + s2 / 2, 16)

    def total(self, state: FilterState) -> PrivacyCost:
        if state.eps_sq == 0 and state.delta == 0:
            return trusted_cost(ZERO, ZERO)
        delta = self.delta_slack + state.delta
        if delta >= 1:
            raise InvalidCostError("delta", delta, "delta_slack + sum of deltas reaches 1")
        return trusted_cost(self.value(state), delta)

    def admits(self, state: FilterState, budget: Budget) -> bool:
        if state.delta + self.delta_slack > budget.delta:
            return False
        if budget.epsilon is None:
            return True
        return self.value(state) <= budget.epsilon

    def remaining(self, state: FilterState, budget: Budget, k: int) -> Budget:
        """Largest per-query cost for ``k`` more charges; delta split evenly."""
        left = budget.delta - self.delta_slack - state.delta
        per_delta = max(left, ZERO) / k
        cost = remaining_per_query(self, state, budget, k, delta=per_delta)
        return Budget(cost.epsilon if budget.epsilon is not None else None, cost.delta)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "delta_slack": str(self.delta_slack)}
