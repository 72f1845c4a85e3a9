"""`RDPRule`: the Renyi filter (fully adaptive) and Renyi composition of a declared plan.

The state is exact integer sums of the charges' curves at the rule's orders
(`dpaccount.accounting.rdp.charge_curves`); the total converts them to (epsilon, delta)
(`dpaccount.accounting.rdp.conversion`). The theorems and the two modes are stated on
the class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from dpaccount._numeric import float_down, up
from dpaccount.accounting._plans import BUDGET_CACHE, DeclaredPlan, as_charges, target_delta_of
from dpaccount.accounting.rdp.charge_curves import (
    _CLOSED_FORMS,
    _SCALE,
    _atom_floats,
    _atom_values,
    _atom_vector,
)
from dpaccount.accounting.rdp.conversion import _conversion, _round_eps
from dpaccount.accounting.rdp.orders import (
    DEFAULT_ORDERS,
    FILTER_ORDERS,
    Array,
    _check_order,
    _minimize_bounded,
)
from dpaccount.charges import Atom, Relation
from dpaccount.composition.base import Adaptivity, ByIdentity, Rule, SpentMeaning
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = ["RDPRule", "RDPState"]

#: The largest Renyi sum (units of 2^-52) an order limit takes: past it a sum is no
#: longer a finite float (a limit of this much admits at most this much).
_MAX_UNITS = 2**1023


@attrs.frozen(eq=False)
class RDPState:
    """Exact running sums of RDP at the rule's orders, in units of 2^-52 (Python ints).

    With a declared plan (``adaptive=False``) also the runs used of each planned charge
    and the exact basic sums of what has run.
    """

    rdp: npt.NDArray[np.object_]
    used: tuple[int, ...] = ()
    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    def as_float(self) -> Array:
        """The sums as floats, rounded up."""
        # int -> float is correctly rounded; the power-of-two scale is exact.
        values = self.rdp.astype(np.float64) * (1.0 / _SCALE)
        return np.asarray(np.nextafter(values, np.inf), dtype=np.float64)


class RDPRule(Rule[RDPState]):
    """Accountant rule on Renyi DP: running sums at a fixed grid of orders.

    ``add`` is one numpy addition of a cached per-charge vector (O(#orders)).

    Two modes:

    * ``adaptive=True`` (default), ``FULLY_ADAPTIVE``: a Renyi filter. For each order
      alpha of the grid, the process stopped when alpha's sum would pass its budget is
      (alpha, B_alpha)-RDP even when each charge's parameters are chosen at run time
      (Feldman and Zrnic 2021, Thm 3.1). The rule admits a charge while *some* order
      stays within its budget; on the transcripts where order alpha stayed within
      budget the rule and alpha's own filter behave identically, so the hockey-stick
      divergence splits into one term per order and the target delta is split evenly
      among the orders (this combination is our argument, written out in
      docs/tight-accounting.md). Use few orders (`FILTER_ORDERS`).
    * ``adaptive=False``, ``ADAPTIVE_MECHANISMS``: RDP composition (Mironov 2017,
      Prop. 1) of a **declared plan** over a dense grid, minimised over the order. The
      plan (charges with multiplicities, run in any order) is required, and a charge
      outside it, or beyond its declared count, is refused, like every fixed-plan rule.
      Since the order of the planned charges may depend on earlier answers, what is
      certified is the whole plan's epsilon (at every order the sum over any prefix is
      at most the plan's, so Feldman and Zrnic 2021, Thm 3.1, with the plan's sums as
      the budget, covers it) or basic composition of what has run, whichever is
      smaller, as for `PLDRule`.

    Args:
        target_delta: The delta at which epsilon is reported and checked; default the
            budget's.
        budget: The ledger's budget (only for the default ``target_delta``).
        plan: The declared plan, required with ``adaptive=False`` (``(charge, k)``, a
            list of charges and ``(charge, k)`` pairs); ignored by the filter.
        orders: The grid (default `FILTER_ORDERS` or `DEFAULT_ORDERS`).
        adaptive: Filter mode (see above).
        relation: The ledger's neighbouring relation.

    Raises:
        ConfigError: ``adaptive=False`` without a plan.

    Examples:
        >>> from dpaccount.charges import GaussianCharge
        >>> rule = RDPRule(target_delta="1e-5")
        >>> g = GaussianCharge(sigma=10, sensitivity=1, epsilon=1)
        >>> state = rule.add(rule.start(), g, 100)
        >>> 5.0 < float(rule.total(state).epsilon) < 6.0
        True
        >>> planned = RDPRule(target_delta="1e-5", adaptive=False, plan=(g, 100))
        >>> planned.total(planned.add(planned.start(), g, 1)).epsilon   # basic is smaller
        Fraction(1, 1)
        >>> 4.6 < float(planned.total(planned.add(planned.start(), g, 100)).epsilon) < 4.8
        True
    """

    name = "rdp"
    theorem = (
        "Renyi DP: Mironov 2017, Prop. 1 (composition) and Feldman and Zrnic 2021, "
        "Thm 3.1 (Renyi filter, fully adaptive); conversion Canonne, Kamath and "
        "Steinke 2020, Prop. 12"
    )

    def __init__(
        self,
        target_delta: Any = None,
        *,
        budget: Budget | None = None,
        plan: Any = None,
        orders: Sequence[float] | None = None,
        adaptive: bool = True,
        relation: Relation | str = Relation.ADD_REMOVE,
    ) -> None:
        self.target_delta = target_delta_of(target_delta, budget, self.name)
        if self.target_delta == 0:
            raise ConfigError("the rdp rule needs target_delta > 0")
        chosen = orders if orders is not None else (FILTER_ORDERS if adaptive else DEFAULT_ORDERS)
        self.orders = (
            chosen if chosen is DEFAULT_ORDERS or chosen is FILTER_ORDERS  # checked, sorted
            else tuple(sorted({_check_order(float(a)) for a in chosen}))
        )
        if not self.orders:
            raise ConfigError("the rdp rule needs at least one order")
        self.adaptive = bool(adaptive)
        # The filter's state is exact integer Renyi sums per order (order-free); a
        # declared plan's state also tracks how much of the plan is used.
        self.order_free = self.adaptive
        self.adaptivity = Adaptivity.FULLY_ADAPTIVE if adaptive else Adaptivity.ADAPTIVE_MECHANISMS
        self.spent_meaning = SpentMeaning.FILTER if adaptive else SpentMeaning.PLAN
        self.relation = Relation(relation)
        self._orders = np.array(self.orders, dtype=np.float64)
        self._delta = float_down(self.target_delta)
        self._split = self._delta / len(self.orders) if adaptive else self._delta
        self._items: list[tuple[Atom, int]] = []
        self._plan_total: PrivacyCost | None = None
        # A charge met again skips hashing the atom and the grid for its vector.
        self._vectors = ByIdentity[npt.NDArray[np.object_]]()
        #: epsilon -> each order's limit, for the last few budgets asked about.
        self._limits: dict[Fraction, tuple[int, ...]] = {}
        if not self.adaptive:
            self._set_plan(plan)

    def _set_plan(self, plan: Any) -> None:
        if plan is None:
            raise ConfigError(
                "the rdp rule with adaptive=False is proven for a declared plan (Renyi "
                "composition needs the parameters fixed in advance): pass plan=(charge, k) "
                "or a list of charges, or use adaptive=True (a Renyi filter) for "
                "parameters chosen at run time"
            )
        self._plan = DeclaredPlan(as_charges(plan), "rdp (adaptive=False)",
                                  "use adaptive=True, a Renyi filter")
        self._items = self._plan.items
        # The whole plan's RDP in floats: each value is rounded up, and the sum of n
        # non-negative terms is pushed up by its rounding bound (n u relative).
        whole = np.zeros(len(self.orders))
        for atom, count in self._items:
            whole = whole + count * _atom_floats(atom, self.orders, self.relation)
        whole = np.nextafter(whole * (1 + 2 * (len(self._items) + 1) * 2.0**-52), np.inf)
        if not np.any(whole > 1e-300):
            self._plan_total = trusted_cost(Fraction(0), Fraction(0))
            return
        if not np.all(np.isfinite(whole)):
            raise InvalidCostError("rdp", "inf", "a Renyi divergence is unbounded at some order")
        eps = _conversion(whole, self._orders, self._delta)
        i = int(np.argmin(eps))
        grid = _round_eps(float(eps[i]))
        if math.isinf(grid):
            raise InvalidCostError("epsilon", grid, "the Renyi sums overflowed")
        refined = None if grid == 0 else self._refined_plan_epsilon(i)
        best = up(grid) if refined is None or refined >= up(grid) else refined
        self._plan_total = trusted_cost(best, self.target_delta)

    def _refined_plan_epsilon(self, i: int) -> Fraction | None:
        """The plan's epsilon at the best order around the grid's best one (index ``i``),
        with every charge's exact RDP there (any order gives a valid bound)."""
        # the neighbours, and at least one unit each side: interpolated fractional orders
        # lie above the exact ones, so the exact optimum may sit past a neighbour
        best = float(self._orders[i])
        lo = max(min(float(self._orders[max(i - 1, 0)]), best - 1), 1 + 1e-6)
        hi = max(float(self._orders[min(i + 1, len(self.orders) - 1)]), best + 1)
        if hi <= lo:
            return None

        if all(type(atom) in _CLOSED_FORMS for atom, _count in self._items):
            # closed forms: one vectorised pass over a fine grid of orders
            fine = tuple(np.linspace(lo, hi, 129).tolist())
            total = sum(count * _atom_values(atom, fine, self.relation, interpolate=False)
                        for atom, count in self._items)
            values = _conversion(np.asarray(total), np.asarray(fine), self._delta)
            value = float(np.min(values))
            return up(_round_eps(value)) if math.isfinite(value) else None

        def objective(alpha: float) -> float:
            at = (alpha,)
            total = sum(
                count * float(_atom_values(atom, at, self.relation, interpolate=False)[0])
                for atom, count in self._items
            )
            return float(_conversion(np.array([total]), np.array([alpha]), self._delta)[0])

        value = objective(_minimize_bounded(objective, lo, hi, 1e-3))  # at the order used
        if not math.isfinite(value):
            return None
        return up(_round_eps(value))

    def start(self) -> RDPState:
        zeros = np.array([0] * len(self.orders), dtype=object)
        return RDPState(zeros, (0,) * len(self._items))

    def add(self, state: RDPState, atom: Atom, count: int) -> RDPState:
        if self.adaptive:
            vector = self._vectors.get(
                atom, lambda: _atom_vector(atom, self.orders, self.relation))
            total = state.rdp + vector * count
            total.setflags(write=False)
            return RDPState(total)
        # A declared plan: its total was composed once; a charge only uses up the plan
        # (O(1), no Renyi sums) and adds to the basic sums.
        used, cost = self._plan.use(state.used, atom, count)
        if count == 1:
            return RDPState(state.rdp, used, state.epsilon + cost.epsilon,
                            state.delta + cost.delta)
        return RDPState(
            state.rdp, used, state.epsilon + cost.epsilon * count,
            state.delta + cost.delta * count,
        )

    def remaining(self, state: RDPState, budget: Budget, k: int) -> Budget:
        """The largest pure epsilon such that ``k`` more charges of it are admitted.

        Bisection on epsilon (pure charges have RDP min(eps, alpha eps^2 / 2)); the
        answer is re-checked with `admits()`.

        Raises:
            UnsupportedChargeError: If not even a tiny charge fits.
        """
        count = int(k)
        lo, hi = Fraction(0), Fraction(1)
        while self.admits(self.add(state, PrivacyCost(hi), count), budget) and hi < 10**6:
            lo, hi = hi, hi * 2
        for _ in range(50):
            mid = Fraction(float((lo + hi) / 2))
            if mid <= lo or mid >= hi:
                break
            if self.admits(self.add(state, PrivacyCost(mid), count), budget):
                lo = mid
            else:
                hi = mid
        if lo == 0 or not self.admits(self.add(state, PrivacyCost(lo), count), budget):
            raise UnsupportedChargeError(f"no pure-epsilon charge fits {count} more times")
        return Budget(lo, 0)

    def _epsilon(self, rdp: Array, delta: float) -> float:
        eps = _conversion(rdp, self._orders, delta)
        return _round_eps(float(np.min(eps)))

    def total(self, state: RDPState) -> PrivacyCost:
        if not (any(state.rdp) if self.adaptive else any(state.used)):
            return trusted_cost(Fraction(0), Fraction(0))
        plan = self._plan_total
        if plan is not None:
            basic = state.delta < 1
            if basic and state.epsilon <= plan.epsilon and state.delta <= plan.delta:
                return trusted_cost(state.epsilon, state.delta)
            return plan
        eps = self._epsilon(state.as_float(), self._split)
        if math.isinf(eps):
            raise InvalidCostError("epsilon", eps, "the Renyi sums overflowed")
        return trusted_cost(up(eps), self.target_delta)

    def admits(self, state: RDPState, budget: Budget) -> bool:
        """Whether ``total(state)`` is within ``budget``: for the filter, whether some
        order's sum is at most that order's limit (`order_limits`), which is the same
        decision in a few integer comparisons."""
        if not (any(state.rdp) if self.adaptive else any(state.used)):
            return True
        if budget.delta < self.target_delta:
            return False
        if budget.epsilon is None:
            return True
        if not self.adaptive:
            return self.total(state).epsilon <= budget.epsilon
        limits = self.order_limits(budget.epsilon)
        return any(s <= t for s, t in zip(state.rdp.tolist(), limits, strict=True))

    def order_limits(self, epsilon: Fraction) -> tuple[int, ...]:
        """For each order, the largest Renyi sum (in units of 2^-52) at which `total`'s
        conversion at that order alone is within ``epsilon``; -1 where none is.

        `total` reports up(round(min over orders of conv_alpha(x_alpha))), where x_alpha
        is the order's sum as a float rounded up and conv_alpha is the conversion of
        Canonne, Kamath and Steinke 2020, Prop. 12. Every step is non-decreasing in the
        sum (x_alpha, then conv_alpha = x_alpha + a constant, clipped below at 0, then the
        roundings), and a minimum of non-decreasing functions is within epsilon exactly
        when one of them is. So a state is within epsilon exactly when some order's sum
        is at most its limit: a Renyi filter with one budget per order (Feldman and Zrnic
        2021, Thm 3.1), found once per budget by a search that evaluates the very
        expressions `total` evaluates, at each order's own position of the grid.
        """
        cached = self._limits.get(epsilon)
        if cached is not None:
            return cached
        k = len(self.orders)

        def fits(sums: list[int]) -> list[bool]:
            floats = RDPState(np.array(sums, dtype=object)).as_float()
            out = []
            for value in _conversion(floats, self._orders, self._split).tolist():
                rounded = _round_eps(value)
                out.append(math.isfinite(rounded) and up(rounded) <= epsilon)
            return out

        lo = [-1] * k  # the largest sum known to fit (-1: none yet)
        hi = [_MAX_UNITS + 1] * k  # the smallest known not to (past the cap: none)
        probe = [0] * k
        growing = [True] * k
        while any(growing):  # 0, 1, 3, 7, ...: up to the first sum that does not fit
            for i, ok in enumerate(fits(probe)):
                if not growing[i]:
                    continue
                if not ok:
                    hi[i], growing[i] = probe[i], False
                elif probe[i] >= _MAX_UNITS:
                    lo[i], growing[i] = probe[i], False
                else:
                    lo[i], probe[i] = probe[i], min(2 * probe[i] + 1, _MAX_UNITS)
        while any(h - low > 1 for low, h in zip(lo, hi, strict=True)):
            middle = [(low + h) // 2 if h - low > 1 else max(low, 0)
                      for low, h in zip(lo, hi, strict=True)]
            for i, ok in enumerate(fits(middle)):
                if hi[i] - lo[i] > 1:
                    if ok:
                        lo[i] = middle[i]
                    else:
                        hi[i] = middle[i]
        limits = tuple(lo)
        if len(self._limits) >= BUDGET_CACHE:
            self._limits.clear()
        self._limits[epsilon] = limits
        return limits

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target_delta": str(self.target_delta),
            "orders": list(self.orders),
            "adaptive": self.adaptive,
            "relation": self.relation.value,
            **({"plan": [[repr(a), n] for a, n in self._items]} if self._items else {}),
        }
