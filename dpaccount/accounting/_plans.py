"""What the tight rules share: the declared plan of charges that the fixed-plan rules
(``pld``, ``rdp`` with ``adaptive=False``) hold (which atoms, how many runs of each, and
what is used up), and the target delta and budget cache of the filters (``rdp``,
``gdp``)."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from dpaccount._numeric import check_delta, check_float_delta
from dpaccount.charges import CHARGE_TYPES, Atom, Charge, Repeated, atoms, cost_of, shown
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, UnsupportedChargeError

__all__ = ["BUDGET_CACHE", "DeclaredPlan", "as_charges", "target_delta_of"]

#: How many budgets a filter keeps its limits for.
BUDGET_CACHE = 16


def target_delta_of(target_delta: Any, budget: Budget | None, name: str) -> Fraction:
    """The delta a filter reports at: ``target_delta``, or else the budget's.

    Raises:
        ConfigError: Neither is given (``name`` is the rule's, for the message).
        InvalidCostError: Not a delta in [0, 1), or a positive one below 1e-300 (which
            the floating-point bounds do not support).
    """
    if target_delta is None:
        if budget is None:
            raise ConfigError(f"the {name} rule needs target_delta (or budget=)")
        target_delta = budget.delta
    return check_float_delta(check_delta(target_delta, "target_delta"))


class DeclaredPlan:
    """Equal atoms of a plan grouped with their declared counts (in first-seen order).

    Args:
        charges: The plan's charges (``Repeated`` allowed).
        rule: The rule's name, for messages.
        instead: What to use for parameters chosen at run time, for messages.
    """

    def __init__(self, charges: Iterable[Charge], rule: str, instead: str) -> None:
        grouped: dict[Atom, int] = {}
        for charge in charges:
            for atom, count in atoms(charge):
                grouped[atom] = grouped.get(atom, 0) + count
        self.items: list[tuple[Atom, int]] = list(grouped.items())
        self._index = {atom: i for i, (atom, _count) in enumerate(self.items)}
        # The plan's own atom objects, by identity: charging the very object that was
        # planned (a mechanism's charge) skips hashing its exact values.
        self._by_id = {id(atom): i for i, (atom, _count) in enumerate(self.items)}
        self._costs = [cost_of(atom) for atom, _count in self.items]
        self._rule = rule
        self._instead = instead

    def use(self, used: tuple[int, ...], atom: Atom, count: int
            ) -> tuple[tuple[int, ...], PrivacyCost]:
        """The runs used after ``count`` more runs of ``atom``, and one run's cost.

        Raises:
            UnsupportedChargeError: The atom is not in the plan, or its runs are used up.
        """
        index = self._by_id.get(id(atom))
        if index is None or self.items[index][0] is not atom:
            try:
                index = self._index.get(atom)
            except TypeError:  # unhashable: certainly not a planned charge
                index = None
        if index is None:
            raise UnsupportedChargeError(
                f"{shown(atom)} is not in the declared plan of the {self._rule} rule (a "
                f"fixed-plan rule cannot take charges outside its plan; {self._instead})"
            )
        total = used[index] + count
        declared = self.items[index][1]
        if total > declared:
            raise UnsupportedChargeError(
                f"the declared plan of {declared} runs of {shown(atom)} is used up ({total} "
                "requested); a fixed-plan rule cannot take charges outside its plan"
            )
        return (*used[:index], total, *used[index + 1 :]), self._costs[index]


#: One run of one charge (anything but `Repeated`).
_SINGLE_CHARGES = tuple(kind for kind in CHARGE_TYPES if kind is not Repeated)


def as_charges(plan: Any) -> list[Charge]:
    """Read a plan: ``(charge, k)``, a list of charges and ``(charge, k)`` pairs, or a
    `Plan` (its runs of costs)."""
    runs = getattr(plan, "runs", None)
    if runs is not None:
        plan = list(runs)
    if isinstance(plan, (Repeated, *_SINGLE_CHARGES)):
        plan = [plan]
    if (
        isinstance(plan, tuple)
        and len(plan) == 2
        and isinstance(plan[1], int)
        and not isinstance(plan[1], bool)
        and not isinstance(plan[0], (int, float, str, Fraction))
    ):
        plan = [plan]
    if plan is None or isinstance(plan, (str, bytes)) or not isinstance(plan, Iterable):
        raise ConfigError(
            "the pld rule is proven for a declared plan: pass plan=(charge, k) or a list "
            "of charges when the accountant is created"
        )
    charges: list[Charge] = []
    for item in plan:
        if isinstance(item, tuple) and len(item) == 2:
            charges.append(Repeated(item[0], item[1]))
        else:
            charges.append(item)
    return charges
