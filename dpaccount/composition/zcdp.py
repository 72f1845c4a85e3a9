"""Zero-concentrated DP: a fully adaptive zCDP filter, each charge's rho, and (epsilon, delta).

A mechanism is rho-zCDP when, for every pair of neighbours and every order alpha > 1,
the Renyi divergence of its outputs is at most rho * alpha (Bun and Steinke 2016, Def.
1.1). What this module uses, each result with its place:

* **The filter.** Run each charge only while the exact sum of the rho_t stays within
  the budget rho, with each rho_t chosen at run time from earlier answers; then the
  whole interaction is rho-zCDP. This is the Renyi filter of Feldman and Zrnic 2021,
  Thm 3.1 (fully adaptive), applied at every order alpha with the budget rho * alpha:
  charge t costs rho_t * alpha at order alpha, so the stopping rule
  "sum rho_t <= rho" is the same at every order, and the stopped interaction is
  (alpha, rho alpha)-RDP for every alpha at once, i.e. rho-zCDP. (Whitehouse, Ramdas,
  Rogers and Wu 2023 derive a filter for approximate zCDP; at delta = 0 it is this
  stopping rule.)
* **Each charge's rho** (`charge_rho`), under the ledger's relation: a Gaussian of
  sigma on an L2-sensitivity Delta query, Delta^2 / (2 sigma^2) (Bun and Steinke 2016,
  Prop. 1.6); a discrete Gaussian, S^2 / (2 sigma^2) in lattice units (Canonne, Kamath
  and Steinke 2020, Thm 4 for a scalar, Thm 14 for vectors); an epsilon-bounded-range
  charge (the exponential mechanism), epsilon^2 / 8 (Cesar and Rogers 2021: the privacy
  loss lies in an interval of length epsilon, so Hoeffding's lemma bounds its moment
  generating function); any other pure epsilon-DP charge, epsilon^2 / 2 (Bun and Steinke
  2016, Prop. 1.4); a `Parallel` charge, the largest part's rho under add/remove and the
  sum of the two largest under substitution (the Renyi divergence of independent parts
  adds, Mironov 2017, Prop. 1, and a record changes one part, or moves between two).
  A charge with delta > 0 and no noise description, and so a subsampled Gaussian, has
  no rho: it is refused by name (the ``rdp`` and ``pld`` rules account for them).
* **From rho to (epsilon, delta)** (`zcdp_conversion`): epsilon =
  min over alpha of rho alpha + ln(1 - 1/alpha) - (ln delta + ln alpha) / (alpha - 1),
  Canonne, Kamath and Steinke 2020, Prop. 12 at each order of a fixed grid (its Cor. 13
  for zCDP), rounded up. It is never above Bun and Steinke 2016, Prop. 1.3,
  rho + 2 sqrt(rho ln(1/delta)), which is the same minimisation without the two
  negative terms.

Examples:
    >>> rule = ZCDPRule(target_delta="1e-6")
    >>> from dpaccount.charges import GaussianCharge
    >>> g = GaussianCharge(sigma=10, sensitivity=1, epsilon=1)        # rho = 1/200
    >>> state = rule.add(rule.start(), g, 100)
    >>> state.rho
    Fraction(1, 2)
    >>> 5.22 < float(rule.total(state).epsilon) < 5.23
    True
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from typing import Any

import attrs
import numpy as np

from dpaccount._numeric import (
    ZERO,
    bounded_up,
    check_delta,
    check_epsilon,
    check_float_delta,
    float_down,
    float_up,
    log_inv_bounds,
    up,
)
from dpaccount.charges import (
    Atom,
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    GaussianCharge,
    Parallel,
    Relation,
    Subsampled,
    atoms,
    cost_of,
    shown,
)
from dpaccount.composition.base import Adaptivity, ByIdentity, Rule, SpentMeaning
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = ["ZCDPRule", "ZCDPState", "charge_rho", "rho_of", "zcdp_conversion"]

THEOREM_ZCDP = (
    "zCDP filter: Feldman and Zrnic 2021, Thm 3.1 (Renyi filter) at every order with "
    "budget rho * alpha, so sum rho_t <= rho gives rho-zCDP, fully adaptive; rho of a "
    "charge: Bun and Steinke 2016, Prop. 1.4 and 1.6, Canonne, Kamath and Steinke 2020, "
    "Thm 4 and 14, Cesar and Rogers 2021; conversion Canonne, Kamath and Steinke 2020, "
    "Prop. 12"
)

#: The orders of the conversion: alpha - 1 = 2^(j/64) for j in [-640, 1280] (alpha from
#: about 1.001 to 10^6 + 1). Any order gives a valid bound; a fixed grid makes the
#: converted epsilon non-decreasing in rho, so a budget's limit on rho is found once.
#: (Steps of 2^(1/32) left the minimum 0.1001 % above the exact optimum at epsilon about
#: 6e-4; with 2^(1/64) the worst seen is 0.06 % there and 0.02 % over 1,500 random rho
#: in [1e-6, 200] and delta in [1e-100, 1e-2].)
_ORDERS = 1.0 + np.exp2(np.arange(-640, 1281) / 64.0)
#: Relative margin on every computed term (covers float error of a few ulps).
_REL = 1e-12
#: How many budgets (and deltas) a rule keeps its limits (and grid terms) for.
_CACHE = 16
_INF_BITS = struct.unpack("<q", struct.pack("<d", math.inf))[0]


def _float_of_bits(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value


def _order_terms(delta: Fraction) -> np.ndarray[Any, np.dtype[np.float64]]:
    """c_alpha = ln(1 - 1/alpha) + (ln(1/delta) - ln alpha) / (alpha - 1) at each order,
    rounded up (ln(1/delta) from above, every term pushed up by a relative margin)."""
    _low, log_inv = log_inv_bounds(delta)
    shrink = np.log1p(-1.0 / _ORDERS)
    tail = (log_inv - np.log(_ORDERS)) / (_ORDERS - 1.0)
    terms = shrink + tail + _REL * (np.abs(shrink) + np.abs(tail)) + 1e-300
    return np.asarray(terms, dtype=np.float64)


def _epsilon_up(rho: float, terms: np.ndarray[Any, np.dtype[np.float64]]) -> Fraction:
    """min over the grid of rho alpha + c_alpha, rounded up; 0 where it is not positive
    (a negative epsilon of Prop. 12 gives (0, delta), a stronger statement).

    Non-decreasing in ``rho``: each step (a float product, a float sum, the margin, the
    minimum over a fixed grid, the floor, the rounding up) is."""
    linear = _ORDERS * rho
    values = linear + terms
    values = values + _REL * (linear + np.abs(terms))
    best = float(np.min(values))
    if math.isnan(best) or math.isinf(best):
        raise InvalidCostError("rho", rho, "the zCDP conversion overflowed")
    return up(best) if best > 0 else ZERO


def zcdp_conversion(rho: Any, delta: Any) -> PrivacyCost:
    """An (epsilon, delta) guarantee of a rho-zCDP mechanism, epsilon rounded up.

    Canonne, Kamath and Steinke 2020, Prop. 12 (Cor. 13 for zCDP) at the orders of a
    fixed grid; never above Bun and Steinke 2016, Prop. 1.3.

    Raises:
        InvalidCostError: ``rho`` negative or infinite; ``delta`` not in (0, 1) or below
            1e-300 (zCDP gives no finite epsilon at delta = 0).

    Examples:
        >>> c = zcdp_conversion("0.5", "1e-6")
        >>> 5.22 < float(c.epsilon) < 5.23, c.delta
        (True, Fraction(1, 1000000))
        >>> float(c.epsilon) < 0.5 + 2 * math.sqrt(0.5 * math.log(1e6))   # Prop. 1.3
        True
    """
    exact_rho = check_epsilon(rho, "rho")
    exact_delta = check_float_delta(check_delta(delta), "delta")
    if exact_delta == 0:
        raise InvalidCostError("delta", delta, "zCDP gives no finite epsilon at delta = 0")
    if exact_rho == 0:
        return trusted_cost(ZERO, exact_delta)
    return trusted_cost(_epsilon_up(float_up(exact_rho), _order_terms(exact_delta)),
                        exact_delta)


def charge_rho(atom: Atom) -> Fraction:
    """The rho of one run of ``atom`` (see the module docstring for each result).

    Raises:
        UnsupportedChargeError: The charge has no rho (delta > 0 and no noise
            description; a subsampled Gaussian), naming it.

    Examples:
        >>> charge_rho(GaussianCharge(sigma=2, sensitivity=1, epsilon=1))
        Fraction(1, 8)
        >>> charge_rho(PrivacyCost("0.5")), charge_rho(BoundedRangeCharge("0.5"))
        (Fraction(1, 8), Fraction(1, 32))
    """
    if isinstance(atom, GaussianCharge):
        return (atom.sensitivity / atom.sigma) ** 2 / 2
    if isinstance(atom, DiscreteGaussianCharge):
        return atom.sensitivity**2 / (2 * atom.sigma**2)
    if isinstance(atom, BoundedRangeCharge):
        return atom.epsilon**2 / 8
    if isinstance(atom, Parallel):
        return _parallel_rho(atom)
    cost = cost_of(atom)
    if cost.delta == 0:
        return cost.epsilon**2 / 2
    if isinstance(atom, Subsampled):
        raise UnsupportedChargeError(
            f"{shown(atom)}: a subsampled charge with delta > 0 has no zCDP bound (the "
            "subsampled Gaussian's Renyi curve is not linear in the order); use "
            "rule='rdp' or rule='pld' for it"
        )
    raise UnsupportedChargeError(
        f"{shown(atom)} has delta > 0 and no noise description, so no zCDP bound; "
        "describe it as a GaussianCharge (or a pure-epsilon charge) or use another rule"
    )


def _parallel_rho(charge: Parallel) -> Fraction:
    """Disjoint parts run with independent noise: the largest part's rho under
    add/remove, the two largest added under substitution (each part's bound holds for
    both relations there: `dpaccount.charges.check_relations`)."""
    known: dict[int, Fraction] = {}
    values = []
    for part in charge.partitions:
        value = known.get(id(part))
        if value is None:
            value = known[id(part)] = rho_of(part)
        values.append(value)
    values.sort(reverse=True)
    take = 1 if charge.relation is Relation.ADD_REMOVE else 2
    return sum(values[:take], ZERO)


def rho_of(charge: Any) -> Fraction:
    """The rho of a whole charge: its atoms' rho times their counts (zCDP composes by
    adding rho, Bun and Steinke 2016, Lemma 1.7).

    Examples:
        >>> from dpaccount.charges import Repeated
        >>> rho_of(Repeated(PrivacyCost("0.1"), 10))
        Fraction(1, 20)
    """
    return sum((charge_rho(atom) * count for atom, count in atoms(charge)), ZERO)


@attrs.frozen
class ZCDPState:
    """The running sum of the charges' rho: exact, or rounded up to the dyadic grid of
    `dpaccount._numeric.bounded_up` once an exact one would outgrow it (a fresh float
    sigma each charge); a larger sum only stops the filter sooner."""

    rho: Fraction


class ZCDPRule(Rule[ZCDPState]):
    """Accountant rule: the fully adaptive zCDP filter, sum rho_t <= rho.

    The budget may be given in rho (``Budget(rho="0.5")``, as OpenDP users hold it), in
    (epsilon, delta), or both. A rho budget is the filter's own limit; an (epsilon,
    delta) budget is turned, once per budget, into the largest rho whose conversion at
    the budget's delta is within its epsilon (`rho_limit`): the stopped interaction is
    then that-rho-zCDP (the filter, Feldman and Zrnic 2021, Thm 3.1 at every order) and
    so (epsilon, delta)-DP (Canonne, Kamath and Steinke 2020, Prop. 12). The parameters
    may be chosen at run time (fully adaptive). ``total`` is the conversion of the exact
    sum at ``target_delta``, rounded up: what the filter certifies so far.

    Args:
        target_delta: The delta at which ``spent`` is stated; default the budget's
            (required for a rho budget with no delta).
        budget: The ledger's budget (for the default ``target_delta``).

    Raises:
        ConfigError: No target delta, or an epsilon budget with delta 0 (zCDP gives no
            finite epsilon at delta = 0).

    Examples:
        >>> rule = ZCDPRule(budget=Budget(rho="0.5", delta="1e-6"))
        >>> state = rule.extend(rule.start(), PrivacyCost(1))        # rho = 1/2
        >>> rule.admits(state, Budget(rho="0.5")), rule.admits(state, Budget(rho="0.49"))
        (True, False)
    """

    name = "zcdp"
    adaptivity = Adaptivity.FULLY_ADAPTIVE
    spent_meaning = SpentMeaning.FILTER
    theorem = THEOREM_ZCDP
    order_free = True  # a sum of rho
    bounded = True  # rounded up to the dyadic grid once it would outgrow it (bounded_up)
    takes_rho = True

    def __init__(self, target_delta: Any = None, *, budget: Budget | None = None) -> None:
        if target_delta is None:
            if budget is None or budget.delta == 0:
                raise ConfigError(
                    "the zcdp rule states what is spent as (epsilon, delta) at a target "
                    "delta: give rule_options={'target_delta': '1e-6'}, or a budget with "
                    "a delta, e.g. Budget(rho='0.5', delta='1e-6')"
                )
            target_delta = budget.delta
        self.target_delta = check_float_delta(check_delta(target_delta, "target_delta"))
        if self.target_delta == 0:
            raise ConfigError("the zcdp rule needs target_delta > 0")
        if budget is not None and budget.epsilon is not None and budget.delta == 0:
            raise ConfigError(
                "an epsilon budget under the zcdp rule needs a delta > 0 (zCDP gives no "
                "finite epsilon at delta = 0); give one, or a budget in rho alone"
            )
        self._terms: dict[Fraction, np.ndarray[Any, np.dtype[np.float64]]] = {}
        self._limits: dict[tuple[Fraction, Fraction], Fraction] = {}
        self._rho = ByIdentity[Fraction]()
        self._last: tuple[Budget, Fraction | None] | None = None

    def start(self) -> ZCDPState:
        return ZCDPState(ZERO)

    def add(self, state: ZCDPState, atom: Atom, count: int) -> ZCDPState:
        rho = self._rho.get(atom, lambda: charge_rho(atom))
        if count == 1:
            return ZCDPState(bounded_up(state.rho + rho))
        return ZCDPState(bounded_up(state.rho + rho * count))

    def bounded_sums(self, state: ZCDPState) -> tuple[Fraction, ...]:
        return (state.rho,)

    def bounded_terms(self, atom: Atom) -> tuple[Fraction, ...]:
        return (self._rho.get(atom, lambda: charge_rho(atom)),)

    def terms(self, delta: Fraction) -> np.ndarray[Any, np.dtype[np.float64]]:
        """The grid's constant terms at ``delta`` (cached)."""
        found = self._terms.get(delta)
        if found is None:
            if len(self._terms) >= _CACHE:
                self._terms.clear()
            found = self._terms[delta] = _order_terms(delta)
        return found

    def epsilon(self, rho: Fraction, delta: Fraction) -> Fraction:
        """The conversion of ``rho`` at ``delta`` (`zcdp_conversion`), rounded up."""
        if rho == 0:
            return ZERO
        return _epsilon_up(float_up(rho), self.terms(delta))

    def total(self, state: ZCDPState) -> PrivacyCost:
        if state.rho == 0:
            return trusted_cost(ZERO, ZERO)
        return trusted_cost(self.epsilon(state.rho, self.target_delta), self.target_delta)

    def epsilon_limit(self, epsilon: Fraction, delta: Fraction) -> Fraction:
        """The largest float L whose conversion at ``delta`` is within ``epsilon``
        (0 if none), found once per budget by bisection over the floats' bit patterns.

        The conversion is non-decreasing in rho (`_epsilon_up`), so a sum S is at most L
        exactly when its conversion (of S rounded up to a float) is within epsilon:
        admitting while S <= L is the same decision as comparing `total` with the budget.
        """
        key = (epsilon, delta)
        found = self._limits.get(key)
        if found is not None:
            return found
        terms = self.terms(delta)

        def fits(bits: int) -> bool:
            return _epsilon_up(_float_of_bits(bits), terms) <= epsilon

        limit = ZERO
        if fits(1):  # the smallest positive float
            lo, hi = 1, _INF_BITS
            while hi - lo > 1:
                middle = (lo + hi) // 2
                if fits(middle):
                    lo = middle
                else:
                    hi = middle
            limit = Fraction(_float_of_bits(lo))
        if len(self._limits) >= _CACHE:
            self._limits.clear()
        self._limits[key] = limit
        return limit

    def rho_limit(self, budget: Budget) -> Fraction | None:
        """The largest sum of rho the filter admits under ``budget``: its rho, and the
        limit of its (epsilon, delta) (`epsilon_limit`), whichever is smaller; None for
        a budget with neither (no limit)."""
        last = self._last
        if last is not None and last[0] is budget:  # a ledger asks with one budget object
            return last[1]
        limits = [] if budget.rho is None else [budget.rho]
        if budget.epsilon is not None:
            limits.append(self.epsilon_limit(budget.epsilon, budget.delta)
                          if budget.delta > 0 else ZERO)
        found = min(limits) if limits else None
        self._last = (budget, found)  # (budgets are immutable: the answer stays true)
        return found

    def admits(self, state: ZCDPState, budget: Budget) -> bool:
        if state.rho == 0:
            return True
        limit = self.rho_limit(budget)
        if limit is None:
            return self.target_delta <= budget.delta
        return state.rho <= limit

    def remaining(self, state: ZCDPState, budget: Budget, k: int) -> Budget:
        """Each of ``k`` more charges may cost rho = (limit - spent) / k, exactly: a
        Gaussian with Delta^2 / (2 sigma^2) at most that, or a pure epsilon of at most
        sqrt(2 rho) (rounded down, then checked)."""
        limit = self.rho_limit(budget)
        if limit is None:
            raise UnsupportedChargeError("the zcdp rule has no limit under this budget")
        per_query = max(limit - state.rho, ZERO) / k
        epsilon = Fraction(float_down(Fraction(math.sqrt(float_down(2 * per_query)))))
        while epsilon > 0 and epsilon**2 / 2 > per_query:
            epsilon = Fraction(math.nextafter(float(epsilon), 0.0))
        return Budget(epsilon, ZERO, rho=per_query)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "target_delta": str(self.target_delta)}
