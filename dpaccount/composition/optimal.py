"""Exact optimal composition of k (epsilon, delta)-DP mechanisms (Kairouz, Oh, Viswanath 2015).

Kairouz, Oh and Viswanath 2015 (Thm 3.3) show that the k-fold adaptive composition of
(epsilon0, delta0)-DP mechanisms is dominated by the k-fold product of one
randomized-response pair, and that this is tight. Its privacy profile is

    delta(epsilon) = 1 - (1 - delta0)^k (1 - delta_pure(epsilon)),
    delta_pure(epsilon) = sum over l with (k - 2l) epsilon0 > epsilon of
        C(k, l) e^{-l epsilon0} / (1 + e^{-epsilon0})^k * (1 - e^{epsilon - (k - 2l) epsilon0}),

which at epsilon = (k - 2i) epsilon0 is the theorem's delta_i (the same sum appears in
Murtagh and Vadhan 2016, Thm 1.5, for any epsilon). Proven for adaptively chosen
mechanisms with parameters fixed in advance.

`optimal()` returns the smallest epsilon with delta(epsilon) <= target_delta: the
active set of l is located by bisection on the grid (k - 2i) epsilon0, the equation
A - e^epsilon B = allowed is solved in closed form inside it, and the answer is then
*certified*: delta_pure is re-evaluated in log space (all terms positive, so no
cancellation) with a rigorous margin for the floating-point error of the log-binomials,
the exponent differences and the summation, and epsilon is nudged up until the certified
value is within the target. Only the terms near the active boundary are summed: the
binomial mass of the rest is bounded by a Chernoff bound and added (`_tail_start`), so
the cost is O(sqrt(k)) vectorised work, about 2 ms at k = 10^7.

Examples:
    >>> c = optimal(PrivacyCost("0.1"), 1000, "1e-5")
    >>> 17.7 < float(c.epsilon) < 17.9
    True
"""

from __future__ import annotations

import math
from collections import OrderedDict
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import special

from dpaccount._numeric import (
    ONE,
    ZERO,
    check_count,
    check_delta,
    check_epsilon,
    float_down,
    float_up,
)
from dpaccount.composition.base import Adaptivity
from dpaccount.composition.plans import FixedPlanRule, PlanState, as_cost, last_fitting
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["OptimalRule", "optimal", "optimal_delta"]

THEOREM_OPTIMAL = (
    "Kairouz, Oh and Viswanath 2015, Thm 3.3 (optimal composition of k "
    "(epsilon, delta)-DP mechanisms; profile at any epsilon as in Murtagh and Vadhan "
    "2016, Thm 1.5); adaptive composition with fixed parameters"
)

_U = 2.0**-53
_MAX_EPS0 = 700.0


def _tail_start(eps0: float, k: int, floor_log: float) -> tuple[int, float]:
    """(a, ln bound): l <= a carries P-mass at most e^bound <= e^floor_log, or (-1, -inf).

    The number of "down" outcomes L of the k-fold pair is Binomial(k, q) with
    q = 1 / (1 + e^eps0) (the masses C(k, l) e^{-l eps0} / (1 + e^{-eps0})^k), and for
    a < k q the Chernoff bound P(L <= a) <= exp(-k KL(a/k || q)) holds (Hoeffding 1963,
    Thm 1, in its relative-entropy form). Two nats of margin cover the floating-point
    error of the KL evaluation.
    """
    q = 1.0 / (1.0 + math.exp(eps0))
    mean = k * q

    def exponent(a: int) -> float:
        x = a / k
        first = x * math.log(x / q) if x > 0 else 0.0
        return k * (first + (1 - x) * (math.log1p(-x) - math.log1p(-q)))

    need = -floor_log + 2.0
    lo, hi = -1, math.ceil(mean) - 1  # exponent decreases in a on [0, mean)
    if hi < 0 or exponent(0) < need:
        return -1, -math.inf
    lo = 0
    while hi - lo > 1:  # largest a with exponent(a) >= need
        mid = (lo + hi) // 2
        if exponent(mid) >= need:
            lo = mid
        else:
            hi = mid
    if exponent(hi) >= need:
        lo = hi
    return lo, -exponent(lo) + 2.0


class _Profile:
    """The randomized-response k-fold privacy profile for one (epsilon0, k).

    Only the terms l > a are summed, where the P-mass of l <= a is below e^floor_log by
    a Chernoff bound (`_tail_start`); that mass is added to every certified value, so
    the sum stays an upper bound while its length is O(sqrt(k)) instead of O(k).
    """

    def __init__(self, eps0: float, k: int, floor_log: float = -745.0) -> None:
        self.k = k
        self.eps0 = eps0
        m = (k + 1) // 2  # l = 0..m-1 are the l with k - 2l >= 1
        a, self.log_tail = _tail_start(eps0, k, floor_log)
        start = min(a + 1, max(m - 1, 0))  # omits l < start, a subset of l <= a
        ls = np.arange(start, m, dtype=np.float64)
        log_norm = k * math.log1p(math.exp(-eps0))
        lg_k = float(special.gammaln(k + 1))
        self.log_p = lg_k - special.gammaln(ls + 1) - special.gammaln(k - ls + 1)
        self.log_p -= ls * eps0 + log_norm
        self.g = (k - 2 * ls) * eps0  # descending, exact integer times eps0 (one rounding)
        self.top = k * eps0  # the largest loss, also of the omitted terms
        # Absolute error of each log term: a few ulps of every large quantity involved.
        self.err_log = 8 * _U * (3 * lg_k + k * eps0 + log_norm + 2 * k * eps0 + 64)

    def active(self, epsilon: float) -> int:
        """How many l have (k - 2l) epsilon0 > epsilon."""
        return int(np.searchsorted(-self.g, -epsilon, side="left"))

    def log_delta(self, epsilon: float, certified: bool) -> float:
        """ln delta_pure(epsilon); with ``certified`` an upper bound (else an estimate)."""
        n = self.active(epsilon)
        if n == 0:
            # only omitted terms can be active (their mass is below the tail bound)
            return self.log_tail if certified and epsilon < self.top else -math.inf
        log_p = self.log_p[:n]
        values = log_p + np.log(-np.expm1(epsilon - self.g[:n]))
        top = float(values.max())
        total = float(np.sum(np.exp(values - top)))
        if not certified:
            return top + math.log(total)
        # Terms that underflowed are each below e^(top - 745).
        log_s = top + math.log(total + n * math.exp(-700.0))
        # The exponent epsilon - g_l carries an absolute error of at most
        # 2u(|g_l| + |epsilon|); each term moves by at most P(l) times that.
        p_top = float(log_p.max())
        log_a = p_top + math.log(float(np.sum(np.exp(log_p - p_top))) + n * math.exp(-700.0))
        log_m = log_a + math.log(4 * _U * (float(self.g[0]) + abs(epsilon)) + 1e-300) + 1.0
        log_total = float(np.logaddexp(log_s, log_m))
        slack = self.err_log + (math.log2(n) + 16) * 4 * _U + abs(log_total) * 4 * _U
        return float(np.logaddexp(log_total + slack, self.log_tail))

    def solve(self, allowed_log: float, allowed: float) -> float:
        """An estimate of the smallest epsilon with delta_pure(epsilon) = allowed."""
        m = len(self.g)
        # Largest i with delta_pure(g_i) <= allowed (i = 0 always qualifies).
        lo, hi = 0, m
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.log_delta(float(self.g[mid]), certified=False) <= allowed_log:
                lo = mid
            else:
                hi = mid
        i = lo
        floor = float(self.g[i + 1]) if i + 1 < m else 0.0
        log_p = self.log_p[: i + 1]
        top = float(log_p.max())
        log_a = top + math.log(float(np.sum(np.exp(log_p - top))))
        shifted = log_p - self.g[: i + 1]
        top_b = float(shifted.max())
        log_b = top_b + math.log(float(np.sum(np.exp(shifted - top_b))))
        ratio = allowed / math.exp(log_a) if log_a > -700 else 1.0
        if ratio >= 1.0:
            return float(self.g[i])
        candidate = log_a + math.log1p(-ratio) - log_b
        return min(max(candidate, floor, 0.0), float(self.g[i]))


def _allowed_pure(delta0: Fraction, k: int, target: Fraction) -> Fraction:
    """A lower bound on 1 - (1 - target) / (1 - delta0)^k: what delta_pure may use."""
    if delta0 == 0:
        return target
    log_pow = k * math.log1p(-float_up(delta0))
    for _ in range(4):
        log_pow = math.nextafter(log_pow, -math.inf)
    pow_low = math.exp(log_pow) * (1 - 4 * _U)
    if pow_low <= 0:
        return Fraction(-1)
    return ONE - (ONE - target) / Fraction(pow_low)


#: The largest k the exact optimum is computed for (its windowed profile is O(sqrt(k))
#: terms, a few milliseconds at 10^7); beyond it use a closed-form rule.
MAX_OPTIMAL_COUNT = 10**7


def _check_inputs(cost: Any, k: int) -> tuple[PrivacyCost, int, float]:
    cost = as_cost(cost)
    k = check_count(k, "k")
    if k > MAX_OPTIMAL_COUNT:
        raise InvalidCostError(
            "k", k, f"the optimal rule is computed for k <= {MAX_OPTIMAL_COUNT:,}; use "
            "'heterogeneous' or 'advanced' (closed forms) for more queries"
        )
    eps0 = float_up(cost.epsilon)
    if eps0 > _MAX_EPS0:
        raise InvalidCostError("epsilon", cost.epsilon, "too large (e^epsilon overflows)")
    return cost, k, eps0


def optimal_delta(cost: Any, k: int, epsilon: Any) -> Fraction:
    """A certified upper bound on the optimal delta(epsilon) of k-fold composition.

    1 - (1 - delta0)^k (1 - delta_pure(epsilon)), KOV 2015 Thm 3.3 (see module doc).

    Examples:
        >>> optimal_delta(PrivacyCost(1), 1, 1)       # at epsilon = epsilon0 only delta0
        Fraction(0, 1)
        >>> float(optimal_delta(PrivacyCost(1), 2, 0))  # doctest: +ELLIPSIS
        0.46211715726...
        >>> import math; math.tanh(0.5)                 # = (e - 1)/(e + 1)  # doctest: +ELLIPSIS
        0.46211715726...
    """
    cost, k, eps0 = _check_inputs(cost, k)
    epsilon = check_epsilon(epsilon)
    if cost.epsilon == 0 or epsilon >= k * cost.epsilon:
        pure = ZERO
    else:
        profile = _Profile(eps0, k)
        log_d = profile.log_delta(float_down(epsilon), certified=True)
        pure = min(Fraction(math.exp(log_d) * (1 + 8 * _U)), ONE)
    if cost.delta == 0:
        return pure
    log_pow = k * math.log1p(-float_up(cost.delta))
    for _ in range(4):
        log_pow = math.nextafter(log_pow, -math.inf)
    pow_low = Fraction(max(math.exp(log_pow) * (1 - 4 * _U), 0.0))
    return min(ONE - pow_low * (ONE - pure), ONE)


def optimal(cost: Any, k: int, target_delta: Any) -> PrivacyCost:
    """The smallest epsilon such that k-fold composition is (epsilon, target_delta)-DP.

    Kairouz, Oh and Viswanath 2015, Thm 3.3: exact optimal composition of k
    (epsilon0, delta0)-DP mechanisms, proven for adaptively chosen mechanisms with
    parameters fixed in advance. The answer is certified (see the module docstring):
    the delta at the returned epsilon, bounded from above, is <= ``target_delta``; it
    is never above basic composition's k epsilon0.

    Args:
        cost: The per-query (epsilon0, delta0).
        k: The number of queries (tested up to 10^5 and beyond).
        target_delta: The total delta, in [0, 1).

    Returns:
        ``PrivacyCost(epsilon, target_delta)``.

    Raises:
        InvalidCostError: Invalid input, or a target_delta below 1 - (1 - delta0)^k,
            which no epsilon reaches.

    Examples:
        >>> optimal(PrivacyCost(1), 1, 0)
        PrivacyCost(epsilon=1, delta=0)
    """
    cost, k, eps0 = _check_inputs(cost, k)
    target = check_delta(target_delta, "target_delta")
    allowed = _allowed_pure(cost.delta, k, target)
    if allowed < 0:
        raise InvalidCostError(
            "target_delta",
            target_delta,
            f"below 1 - (1 - delta)^k for k={k}, delta={cost.delta}: no epsilon reaches it",
        )
    basic_eps = k * cost.epsilon
    if cost.epsilon == 0:
        return trusted_cost(ZERO, target)
    allowed_f = float_down(allowed)
    if allowed_f <= 0:
        return trusted_cost(basic_eps, target)
    allowed_log = math.log(allowed_f)
    allowed_log = math.nextafter(math.nextafter(allowed_log, -math.inf), -math.inf)
    # terms whose total mass is below e^-30 of what delta may use are bounded, not summed
    profile = _Profile(eps0, k, floor_log=allowed_log - 30.0)

    def certified(epsilon: float) -> bool:
        return profile.log_delta(epsilon, certified=True) <= allowed_log

    if certified(0.0):
        return trusted_cost(ZERO, target)
    candidate = profile.solve(allowed_log, allowed_f)
    step = max(candidate, 1e-12) * 2.0**-45
    top = profile.top
    while not certified(candidate):
        candidate += step
        step *= 2
        if candidate >= top:
            return trusted_cost(basic_eps, target)
    return trusted_cost(min(Fraction(candidate), basic_eps), target)


class OptimalRule(FixedPlanRule):
    """Accountant rule: exact optimal composition over a declared homogeneous plan.

    After j charges the total is `optimal()` of the plan's cost for k = j at
    ``target_delta`` (or basic composition when that is no worse in both coordinates).
    Proven for adaptively chosen mechanisms with parameters fixed in advance (KOV 2015,
    Thm 3.3); charges outside the plan are refused. ``total`` costs O(sqrt(j))
    (cached); ``admits`` is O(1) after its first call for a budget, whether the plan
    fits the budget or not.

    Args:
        plan: ``(cost, k)`` or a one-cost Plan.
        target_delta: The delta at which epsilon is reported; if omitted, the budget's.
        budget: The ledger's budget (only for the default target_delta).

    Examples:
        >>> from dpaccount.charges import Repeated
        >>> rule = OptimalRule(plan=(PrivacyCost("0.1"), 1000), target_delta="1e-5")
        >>> s = rule.extend(rule.start(), Repeated(PrivacyCost("0.1"), 1000))
        >>> 17.7 < float(rule.total(s).epsilon) < 17.9
        True
    """

    name = "optimal"
    adaptivity = Adaptivity.ADAPTIVE_MECHANISMS
    theorem = THEOREM_OPTIMAL

    def __init__(
        self, plan: Any = None, target_delta: Any = None, *, budget: Budget | None = None
    ) -> None:
        super().__init__(plan)
        if not self.plan.is_homogeneous:
            raise ConfigError(
                "optimal composition is implemented for k queries of one cost (for "
                "different costs it is #P-hard, Murtagh and Vadhan 2016); use "
                "rule='heterogeneous'"
            )
        self.cost, self.k = self.plan.runs[0]
        if target_delta is None:
            if budget is None:
                raise ConfigError("the optimal rule needs target_delta (or budget=)")
            target_delta = budget.delta
        self.target_delta = check_delta(target_delta, "target_delta")
        self._cache: OrderedDict[int, PrivacyCost | None] = OrderedDict()
        self._through: dict[Budget, int] = {}

    def bound(self, state: PlanState) -> PrivacyCost | None:
        j = state.position
        if j in self._cache:
            self._cache.move_to_end(j)
            return self._cache[j]
        try:
            result: PrivacyCost | None = optimal(self.cost, j, self.target_delta)
        except InvalidCostError:
            result = None
        self._cache[j] = result
        if len(self._cache) > 64:
            self._cache.popitem(last=False)
        return result

    def admits(self, state: PlanState, budget: Budget) -> bool:
        # O(1) after the first call for a budget: the optimal bound grows with the number
        # of queries at a fixed target delta (k + 1 runs dominate k), so the prefixes
        # whose bound fits are exactly those up to one position, found once by
        # bisection. Where the bound fits, so does the reported total (basic is only
        # reported when it is at least as good in both coordinates).
        if self._whole_plan_fits(budget) or state.position <= self._fits_through(budget):
            return True
        return self.total(state).fits(budget)

    def _fits_through(self, budget: Budget) -> int:
        """The largest j whose optimal bound fits ``budget`` (0 if none)."""
        cached = self._through.get(budget)
        if cached is not None:
            return cached

        def fits(j: int) -> bool:
            try:
                return optimal(self.cost, j, self.target_delta).fits(budget)
            except InvalidCostError:
                return False

        lo = last_fitting(fits, 0, self.k + 1)  # fits(0): nothing spent; k + 1: past
        if len(self._through) > 16:
            self._through.clear()
        self._through[budget] = lo
        return lo

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "target_delta": str(self.target_delta)}
