"""Declared plans, the fixed-plan rule machinery, and calibration inverses.

A `Plan` is the sequence of per-query costs declared *before* the first query.
Fixed-plan theorems (Dwork-Rothblum-Vadhan, Kairouz-Oh-Viswanath) are proven only when
the privacy parameters are fixed in advance; a `FixedPlanRule` therefore refuses,
with `UnsupportedChargeError`, any charge that costs more than
the plan declared for its position, or that runs past the end of the plan.

The inverses (`remaining_per_query()`, `max_queries()`) solve numerically and then
re-check their answer with the rule's own `admits()`, so they err toward privacy.

The rules build on this module (`advanced`, `heterogeneous` and `optimal` are
`FixedPlanRule` subclasses), so it imports none of them; `per_query_epsilon()`, which
builds a rule by name, sits above them in `dpaccount.composition.planning`, which also
re-exports everything here.

Examples:
    >>> plan = Plan.repeat(PrivacyCost("0.1"), 3)
    >>> plan.count, plan.is_homogeneous
    (3, True)
    >>> Plan.of([PrivacyCost("0.1"), PrivacyCost("0.1"), PrivacyCost("0.2")]).runs[1]
    (PrivacyCost(epsilon=0.2, delta=0), 1)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import ZERO, check_count, float_down, to_fraction
from dpaccount.charges import Atom, Repeated, cost_of
from dpaccount.composition.base import Rule
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import (
    ConfigError,
    InvalidCostError,
    UnsupportedChargeError,
)

__all__ = [
    "FixedPlanRule",
    "Plan",
    "PlanState",
    "as_cost",
    "as_plan",
    "last_fitting",
    "max_queries",
    "remaining_per_query",
]


def as_cost(value: Any, field: str = "cost") -> PrivacyCost:
    """A PrivacyCost from a PrivacyCost, a charge, or an ``(epsilon, delta)`` pair.

    Raises:
        InvalidCostError: For anything else (the message names ``field``).

    Examples:
        >>> as_cost((0.5, "1/4"))
        PrivacyCost(epsilon=0.5, delta=0.25)
    """
    if isinstance(value, PrivacyCost):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return PrivacyCost(*value)
    try:
        return cost_of(value)
    except UnsupportedChargeError:
        raise InvalidCostError(
            field, value, "expected a PrivacyCost, an (epsilon, delta) pair or a charge"
        ) from None


def _runs_converter(value: Any) -> tuple[tuple[PrivacyCost, int], ...]:
    runs: list[tuple[PrivacyCost, int]] = []
    for item in value:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise InvalidCostError("plan", item, "each run must be a (cost, count) pair")
        cost = as_cost(item[0], "plan cost")
        count = check_count(item[1], "plan count")
        if runs and runs[-1][0] == cost:
            runs[-1] = (cost, runs[-1][1] + count)
        else:
            runs.append((cost, count))
    if not runs:
        raise InvalidCostError("plan", value, "a plan needs at least one query")
    return tuple(runs)


@attrs.frozen
class Plan:
    """The per-query costs of a fixed plan, in order, as runs of equal costs.

    Build one with `repeat()` (k queries of one cost) or `of()` (a list of
    costs); `as_plan()` also takes ``(cost, k)`` or a list.

    Attributes:
        runs: ``(cost, count)`` pairs; adjacent equal costs are merged.
    """

    runs: tuple[tuple[PrivacyCost, int], ...] = attrs.field(converter=_runs_converter)

    @classmethod
    def repeat(cls, cost: Any, k: int) -> Plan:
        """``k`` queries, each costing ``cost``."""
        return cls(((as_cost(cost), check_count(k, "k")),))

    @classmethod
    def of(cls, costs: Iterable[Any]) -> Plan:
        """One query per entry of ``costs``, in that order."""
        return cls([(as_cost(c), 1) for c in costs])

    @property
    def count(self) -> int:
        """The number of queries in the plan."""
        return sum(n for _, n in self.runs)

    @property
    def is_homogeneous(self) -> bool:
        """Whether every query has the same cost."""
        return len(self.runs) == 1

    def costs(self) -> Iterable[tuple[PrivacyCost, int]]:
        """The runs, as ``(cost, count)`` pairs."""
        return iter(self.runs)

    def describe(self) -> list[list[Any]]:
        """A JSON-ready form: ``[[epsilon, delta, count], ...]`` with exact strings."""
        return [[str(c.epsilon), str(c.delta), n] for c, n in self.runs]


def as_plan(value: Any) -> Plan:
    """A `Plan` from a Plan, a ``(cost, k)`` pair, or a sequence of costs.

    Raises:
        ConfigError: If no plan is given.
        InvalidCostError: If the plan holds invalid costs or counts.

    Examples:
        >>> as_plan((PrivacyCost(1), 2)).count
        2
    """
    if value is None:
        raise ConfigError(
            "this rule is proven for a fixed plan only: declare plan=(cost, k) or a list "
            "of costs when the accountant is created"
        )
    if isinstance(value, Plan):
        return value
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
        and not isinstance(value[0], (int, float, str, Fraction))
    ):
        return Plan.repeat(value[0], value[1])
    if isinstance(value, (list, tuple)):
        return Plan.of(value)
    raise ConfigError(f"cannot read a plan from {value!r}; use (cost, k) or a list of costs")


@attrs.frozen
class PlanState:
    """How far a ledger has gone through its plan.

    Attributes:
        position: Queries consumed so far.
        run: Index of the current run.
        used: Queries consumed within the current run.
    """

    position: int
    run: int
    used: int


class FixedPlanRule(Rule[PlanState]):
    """Shared machinery of rules proven for a plan declared in advance.

    A charge is accepted at position j only if its (epsilon, delta) is at most the
    plan's cost at j in both coordinates (a mechanism that is (epsilon', delta')-DP with
    epsilon' <= epsilon and delta' <= delta is also (epsilon, delta)-DP, so the theorem
    still applies). ``add`` is O(1) per run crossed.

    ``total`` after j charges is the subclass's theorem applied to the first j planned
    queries (a prefix of a fixed plan is itself a fixed plan), or basic composition of
    that prefix when basic is at least as good in both coordinates.
    """

    def __init__(self, plan: Any) -> None:
        self.plan = as_plan(plan)
        eps_before: list[Fraction] = []
        delta_before: list[Fraction] = []
        eps, delta = ZERO, ZERO
        for cost, n in self.plan.runs:
            eps_before.append(eps)
            delta_before.append(delta)
            eps += cost.epsilon * n
            delta += cost.delta * n
        self._eps_before = eps_before
        self._delta_before = delta_before
        self._fits_cache: dict[Budget, bool] = {}

    # -- Rule interface -------------------------------------------------------------

    def start(self) -> PlanState:
        return PlanState(0, 0, 0)

    def add(self, state: PlanState, atom: Atom, count: int) -> PlanState:
        cost = cost_of(atom)
        runs = self.plan.runs
        position, run, used = state.position, state.run, state.used
        remaining = count
        while remaining:
            if run >= len(runs):
                raise UnsupportedChargeError(
                    f"the {self.name!r} rule is proven for the declared plan of "
                    f"{self.plan.count} queries; this charge would be query "
                    f"{position + 1}. Declare a longer plan or use rule='filter' "
                    "(fully adaptive)."
                )
            planned, size = runs[run]
            if cost.epsilon > planned.epsilon or cost.delta > planned.delta:
                raise UnsupportedChargeError(
                    f"the {self.name!r} rule is proven for the declared plan only: query "
                    f"{position + 1} was declared to cost {planned}, this charge costs "
                    f"{cost}. Fixed-plan theorems do not cover parameters chosen at run "
                    "time; use rule='filter' for that."
                )
            take = min(remaining, size - used)
            remaining -= take
            position += take
            used += take
            if used == size:
                run += 1
                used = 0
        return PlanState(position, run, used)

    def total(self, state: PlanState) -> PrivacyCost:
        if state.position == 0:
            return trusted_cost(ZERO, ZERO)
        plain = self.basic_total(state)
        bound = self.bound(state)
        if bound is None or (plain.epsilon <= bound.epsilon and plain.delta <= bound.delta):
            return plain
        return bound

    def admits(self, state: PlanState, budget: Budget) -> bool:
        # Fast path: if the theorem's bound for the whole plan fits, so does its bound
        # for every prefix (monotone in the plan), and basic is only chosen when it is
        # at least as good in both coordinates.
        if self._whole_plan_fits(budget):
            return True
        return self.total(state).fits(budget)

    def remaining(self, state: PlanState, budget: Budget, k: int) -> Budget:
        """The largest per-query cost for ``k`` more planned queries (see planning)."""
        if state.run >= len(self.plan.runs):
            return Budget(ZERO if budget.epsilon is not None else None, ZERO)
        delta = self.plan.runs[state.run][0].delta
        cost = remaining_per_query(self, state, budget, k, delta=delta)
        return Budget(cost.epsilon if budget.epsilon is not None else None, cost.delta)

    # -- helpers --------------------------------------------------------------------

    def basic_total(self, state: PlanState) -> PrivacyCost:
        """Basic composition of the planned costs of the first ``state.position`` queries."""
        runs = self.plan.runs
        if state.run >= len(runs):
            last = len(runs) - 1
            cost, n = runs[last]
            eps = self._eps_before[last] + cost.epsilon * n
            delta = self._delta_before[last] + cost.delta * n
        else:
            cost = runs[state.run][0]
            eps = self._eps_before[state.run] + cost.epsilon * state.used
            delta = self._delta_before[state.run] + cost.delta * state.used
        if delta >= 1:
            raise InvalidCostError("delta", delta, "the summed delta reaches 1")
        return trusted_cost(eps, delta)

    def _whole_plan_fits(self, budget: Budget) -> bool:
        cached = self._fits_cache.get(budget)
        if cached is None:
            end = PlanState(self.plan.count, len(self.plan.runs), 0)
            try:
                bound = self.bound(end)
            except InvalidCostError:
                bound = None
            cached = bound is not None and bound.fits(budget)
            if len(self._fits_cache) > 16:
                self._fits_cache.clear()
            self._fits_cache[budget] = cached
        return cached

    @abc.abstractmethod
    def bound(self, state: PlanState) -> PrivacyCost | None:
        """The theorem's bound for the first ``state.position`` planned queries.

        Returns None where the theorem gives nothing (basic composition is used).
        """

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "plan": self.plan.describe()}


# -- calibration --------------------------------------------------------------------

#: Bisection steps for the inverses (on floats; the answer is then rounded down).
_BISECT_STEPS = 64


def _fits_after(rule: Rule[Any], state: Any, budget: Budget, charge: Any) -> bool:
    try:
        return rule.admits(rule.extend(state, charge), budget)
    except (UnsupportedChargeError, InvalidCostError):
        return False


def remaining_per_query(
    rule: Rule[Any],
    state: Any,
    budget: Budget,
    k: int,
    *,
    delta: Any = 0,
) -> PrivacyCost:
    """The largest per-query cost (epsilon, ``delta``) such that ``k`` more fit.

    Bisection on epsilon with the rule's own `admits()`; the result is rounded
    down to a float and re-checked, so ``k`` charges of it are always admitted.

    Args:
        rule: The composition rule.
        state: The rule's current state (what is already spent).
        budget: The ledger's budget.
        k: How many equal queries are planned.
        delta: The per-query delta to assume (default 0).

    Returns:
        ``PrivacyCost(epsilon, delta)``; ``PrivacyCost(0, 0)`` if not even k queries of
        (0, ``delta``) fit.

    Examples:
        >>> from dpaccount.composition.basic import BasicRule
        >>> r = BasicRule()
        >>> remaining_per_query(r, r.start(), Budget(1), 4)
        PrivacyCost(epsilon=0.25, delta=0)
    """
    k = check_count(k, "k")
    rule.check_budget(budget)
    per_delta = to_fraction(delta, "delta")
    if per_delta < 0 or per_delta >= 1:
        raise InvalidCostError("delta", delta, "must be in [0, 1)")

    def fits(epsilon: Fraction) -> bool:
        return _fits_after(rule, state, budget, Repeated(trusted_cost(epsilon, per_delta), k))

    if not fits(ZERO):
        return trusted_cost(ZERO, ZERO)
    if budget.epsilon is None:
        return trusted_cost(ZERO, per_delta)  # no epsilon limit: nothing to solve
    hi = float(budget.epsilon) if budget.epsilon > 0 else 1.0
    steps = 0
    while fits(Fraction(hi)) and steps < 64:
        hi *= 2
        steps += 1
    lo = 0.0
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if fits(Fraction(mid)):
            lo = mid
        else:
            hi = mid
    answer = Fraction(float_down(Fraction(lo)))
    while answer > 0 and not fits(answer):  # re-check (defensive; lo was checked)
        answer = Fraction(float_down(answer * Fraction(999, 1000)))
    return trusted_cost(answer, per_delta)


#: max_queries stops searching here and reports ``None`` (no practical limit).
_MAX_SEARCH = 10**12


def max_queries(rule: Rule[Any], state: Any, budget: Budget, cost: Any) -> int | None:
    """How many more charges of ``cost`` the rule admits from ``state``.

    Exponential then binary search with `admits()` (the rule must be monotone
    in the number of charges, which every rule here is).

    Returns:
        The count, or None if more than 10**12 fit (e.g. a zero cost).

    Examples:
        >>> from dpaccount.composition.basic import BasicRule
        >>> r = BasicRule()
        >>> max_queries(r, r.start(), Budget(1), PrivacyCost("0.3"))
        3
    """
    rule.check_budget(budget)
    charge = as_cost(cost) if isinstance(cost, tuple) else cost

    def fits(n: int) -> bool:
        if n == 0:
            return True
        return _fits_after(rule, state, budget, Repeated(charge, n))

    lo, hi = 0, 1
    while fits(hi):
        lo = hi
        hi *= 2
        if hi > _MAX_SEARCH:
            return None
    return last_fitting(fits, lo, hi)


def last_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest j in [lo, hi) with ``fits(j)``, by bisection.

    ``fits`` must be monotone (true up to some point, false after), ``fits(lo)`` true and
    ``fits(hi)`` false (or ``hi`` past the range searched).

    Examples:
        >>> last_fitting(lambda j: j * j <= 50, 0, 100)
        7
    """
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
