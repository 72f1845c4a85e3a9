"""The interface every composition rule implements, and the adaptivity it is proven for.

A rule is pure: it folds charges into an immutable *state* and says whether a state is
within a budget. The accountant keeps one state as its running total, so a charge costs
O(1) whatever the ledger's length.
"""

from __future__ import annotations

import abc
import enum
import itertools
from collections.abc import Callable, Hashable, Iterable
from fractions import Fraction
from typing import Any, Generic, TypeVar

from dpaccount._numeric import fits_grid
from dpaccount.charges import Atom, Charge, atoms
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, UnsupportedChargeError

__all__ = ["Adaptivity", "ByIdentity", "Rule", "SpentMeaning", "count_distinct"]

State = TypeVar("State")
T = TypeVar("T")


class Adaptivity(enum.IntEnum):
    """What a rule's theorem is proven for, from weakest to strongest.

    ``FIXED_PLAN``: the number of queries and their parameters are declared before the
    first query (Dwork-Rothblum-Vadhan / Kairouz-Oh-Viswanath as stated).
    ``ADAPTIVE_MECHANISMS``: each mechanism may be chosen after seeing earlier answers,
    but the sequence of privacy parameters is fixed in advance.
    ``FULLY_ADAPTIVE``: the privacy parameters themselves are chosen at run time (a
    privacy filter, Rogers, Roth, Ullman and Vadhan 2016).

    A rule proven for a stronger level is valid for every weaker one.
    """

    FIXED_PLAN = 1
    ADAPTIVE_MECHANISMS = 2
    FULLY_ADAPTIVE = 3


class SpentMeaning(enum.StrEnum):
    """What a rule's ``total`` (the accountant's ``spent``) is a guarantee *of*.

    ``FILTER``: the value a privacy filter certifies against its **finite** budget. The
    filter theorems (Whitehouse, Ramdas, Rogers and Wu 2023; Feldman and Zrnic 2021;
    Smith and Thakurta 2022) prove that the whole interaction, stopped by the filter, is
    within the budget; they make no claim about the running value on its own when
    parameters are chosen at run time (that would be a privacy odometer, Rogers, Roth,
    Ullman and Vadhan 2016, which needs its own theorem). Filters therefore refuse an
    unlimited budget.
    ``SUM``: basic composition's exact sums. Against a finite budget it is a filter
    (Rogers et al. 2016); with an unlimited budget it is a running total, a valid
    ex-post bound for pure-epsilon charges (each step's privacy loss is at most its own
    epsilon), and bookkeeping, not a cited odometer, when deltas are positive.
    ``PLAN``: a fixed-plan theorem's bound for the declared plan (or the part of it that
    has run, where the theorem covers prefixes).
    """

    FILTER = "filter"
    SUM = "sum"
    PLAN = "plan"


def count_distinct(items: Iterable[T], key: Callable[[T], Hashable] = id
                   ) -> list[tuple[T, int]]:
    """Each distinct item (told apart by ``key``; by default by identity: a decoded ledger
    shares its charge and cost objects, and hashing a Fraction is slow) with how often it
    occurs, in the order first seen. Equal items in two objects are merely counted apart,
    which leaves any sum over them the same.

    Examples:
        >>> a, b = object(), object()
        >>> count_distinct([a, b, a]) == [(a, 2), (b, 1)]
        True
    """
    counts: dict[Hashable, list[Any]] = {}  # key -> [item, count]
    for item in items:
        k = key(item)
        entry = counts.get(k)
        if entry is None:
            counts[k] = [item, 1]
        else:
            entry[1] += 1
    return [(item, count) for item, count in counts.values()]


class ByIdentity(Generic[T]):
    """A value computed once per object, found by the object's identity (a ledger's
    charges are mostly the same few objects, and hashing them, Fractions included, is
    slow). An entry keeps its object alive, so its id is not reused while cached; past
    ``size`` entries the cache starts over.

    Examples:
        >>> squares = ByIdentity[int]()
        >>> seven = 7.0
        >>> squares.get(seven, lambda: 49), squares.get(seven, lambda: 0), len(squares)
        (49, 49, 1)
    """

    def __init__(self, size: int = 256) -> None:
        self._entries: dict[int, tuple[Any, T]] = {}
        self._size = size

    def get(self, obj: Any, compute: Callable[[], T]) -> T:
        """The value for ``obj``: cached, or ``compute()`` stored for it."""
        entry = self._entries.get(id(obj))
        if entry is None or entry[0] is not obj:
            if len(self._entries) >= self._size:
                self._entries.clear()
            entry = (obj, compute())
            self._entries[id(obj)] = entry
        return entry[1]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class Rule(abc.ABC, Generic[State]):
    """A composition rule: how a ledger's charges add up to a guarantee.

    Subclasses set `name`, `adaptivity` and `theorem`, and implement
    `start()`, `add()`, `total()` and `admits()`. ``add`` must be O(1)
    in the number of charges already folded in.
    """

    #: The name used in ``Accountant(rule=...)`` and stored in records.
    name: str
    #: The strongest adaptivity the theorem is proven for.
    adaptivity: Adaptivity
    #: The citation (paper, year, theorem number).
    theorem: str
    #: What ``total`` (the accountant's ``spent``) is a guarantee of.
    spent_meaning: SpentMeaning = SpentMeaning.PLAN
    #: Whether the state is an exact sum of per-atom terms, linear in each count (so
    #: ``add(add(s, a, m), a, n) == add(s, a, m + n)`` and the order of folding is
    #: irrelevant): then `extend_all` folds each distinct charge once, times its count.
    order_free: bool = False
    #: Whether the state's sums are bounded (`dpaccount._numeric.bounded_up`: rounded up
    #: to a dyadic grid once an exact sum would outgrow it, so a charge of a fresh
    #: run-time parameter costs O(1)). Rounding is not associative, so such a rule's
    #: `extend_all` groups equal charges only where every sum stays exact
    #: (`stays_exact`), and otherwise folds the charges in order, one by one, as they
    #: were charged: a replay then gives the very state the live ledger had.
    bounded: bool = False
    #: Whether ``admits`` reads a budget's zCDP ``rho`` (`Budget.rho`): a ledger refuses a
    #: budget with a rho under a rule that would ignore it (only ``zcdp`` takes one).
    takes_rho: bool = False

    @abc.abstractmethod
    def start(self) -> State:
        """The state of an empty ledger."""

    @abc.abstractmethod
    def add(self, state: State, atom: Atom, count: int) -> State:
        """The state after ``count`` more runs of ``atom``; never mutates ``state``.

        Raises:
            UnsupportedChargeError: The rule cannot compose this atom (outside a declared
                plan, an unsupported relation or mechanism).
        """

    @abc.abstractmethod
    def total(self, state: State) -> PrivacyCost:
        """The (epsilon, delta) guarantee of everything folded into ``state``.

        For a privacy filter this is what the filter certifies so far; it is a proven
        upper bound in every case.
        """

    @abc.abstractmethod
    def admits(self, state: State, budget: Budget) -> bool:
        """Whether a ledger in ``state`` is still within ``budget`` (the stopping rule)."""

    def check_budget(self, budget: Budget) -> None:
        """Refuse a budget this rule cannot enforce: a zCDP ``rho`` under a rule that
        does not read it (`takes_rho`), which would otherwise be ignored.

        Raises:
            ConfigError: Naming the rule that takes a rho budget.
        """
        if budget.rho is not None and not self.takes_rho:
            raise ConfigError(
                f"the {self.name!r} rule does not take a zCDP budget (rho); use "
                "rule='zcdp', or give the budget as (epsilon, delta)"
            )

    def extend(self, state: State, charge: Charge) -> State:
        """Fold a whole charge (with its multiplicity) into ``state``."""
        for atom, count in atoms(charge):
            state = self.add(state, atom, count)
        return state

    def extend_costed(self, state: State, charge: Charge, cost: PrivacyCost) -> State:
        """`extend`, given ``cost = cost_of(charge)`` already computed by the caller (the
        accountant costs every charge first); rules that need only the cost use it
        instead of costing the charge again."""
        return self.extend(state, charge)

    def extend_all(self, state: State, charges: Iterable[Charge]) -> State:
        """Fold many charges in order (a replay, or the records other writers appended);
        an `order_free` rule folds each distinct charge object (a decoded ledger shares
        them) once, times how often it occurs."""
        if not self.order_free:
            for charge in charges:
                state = self.extend(state, charge)
            return state
        items = charges if isinstance(charges, list) else list(charges)
        groups = count_distinct(items)
        if self.bounded and not self.stays_exact(state, [c for c, _ in groups]):
            for charge in items:
                state = self.extend(state, charge)
            return state
        for charge, times in groups:
            for atom, count in atoms(charge):
                state = self.add(state, atom, count * times)
        return state

    def bounded_sums(self, state: State) -> tuple[Fraction, ...]:
        """A `bounded` rule's running sums in ``state`` (none for other rules)."""
        return ()

    def bounded_terms(self, atom: Atom) -> tuple[Fraction, ...]:
        """What one run of ``atom`` adds to each of a `bounded` rule's sums."""
        return ()

    def stays_exact(self, state: State, charges: Iterable[Charge]) -> bool:
        """Whether folding any multiples of ``charges`` into ``state``, in any order, keeps
        every bounded sum exact (`dpaccount._numeric.fits_grid` of their denominators):
        then no rounding happens and grouping equal charges gives the in-order state."""
        return fits_grid(itertools.chain(
            (value.denominator for value in self.bounded_sums(state)),
            (value.denominator for charge in charges for atom, _ in atoms(charge)
             for value in self.bounded_terms(atom)),
        ))

    def remaining(self, state: State, budget: Budget, k: int) -> Budget:
        """The largest per-query cost such that ``k`` more equal charges fit.

        Rules override this with their own inverse; the result must err toward privacy
        (re-checked with `admits()` after solving).

        Raises:
            UnsupportedChargeError: The rule offers no inverse.
        """
        raise UnsupportedChargeError(f"the {self.name!r} rule does not compute remaining(k)")

    def describe(self) -> dict[str, Any]:
        """What is stored with a ledger to identify this rule and its parameters."""
        return {"name": self.name}
