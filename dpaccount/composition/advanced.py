"""Advanced composition (Dwork, Rothblum and Vadhan 2010) and its variants.

All three are proven for k-fold *adaptive* composition: each mechanism may be chosen
after seeing earlier answers, but k and the per-query (epsilon, delta) are fixed in
advance (`ADAPTIVE_MECHANISMS`). Using them
with epsilons chosen at run time is not covered; that is what
`dpaccount.composition.filters` is for.

Floating-point results are rounded upward (inputs are rounded toward more loss, the
result is pushed up by 16 ulps, which covers the few correctly-rounded-or-1-ulp
operations involved); deltas are exact.

Examples:
    >>> c = advanced(PrivacyCost("0.1"), 1000, "1e-6")
    >>> round(float(c.epsilon), 2), c.delta == Fraction(1, 10**6)
    (27.14, True)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dpaccount._numeric import (
    check_count,
    check_delta,
    float_up,
    log_inv_bounds,
    up,
)
from dpaccount.composition.base import Adaptivity
from dpaccount.composition.plans import FixedPlanRule, PlanState, as_cost
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = [
    "AdvancedRule",
    "advanced",
    "advanced_adaptive",
    "advanced_simplified",
]

#: ulps added to a float bound built from a handful of elementary operations.
_ULPS = 16
#: exp overflows a double above this; the bounds are meaningless there anyway.
_MAX_EXP_ARG = 700.0

THEOREM_ADVANCED = (
    "Dwork, Rothblum and Vadhan 2010, Thm III.3, as stated in Dwork and Roth 2014, "
    "Thm 3.20 (advanced composition); k-fold adaptive composition with fixed parameters"
)
THEOREM_ADAPTIVE = (
    "Dwork, Rothblum and Vadhan 2010, Thm III.3 (Azuma step with increments bounded by "
    "epsilon + a(epsilon)), with a(epsilon) = min(epsilon (e^epsilon - 1), epsilon) from "
    "the KL bound of Dwork and Roth 2014, Lemma 3.18; adaptive composition, fixed parameters"
)
THEOREM_SIMPLIFIED = (
    "Dwork and Roth 2014, Thm 3.20 and Cor. 3.21 (2 epsilon sqrt(2k ln(1/delta')), valid "
    "when k (e^epsilon - 1)^2 <= 2 ln(1/delta')); adaptive composition, fixed parameters"
)


def check_slack(value: Any, field: str = "delta_slack") -> Fraction:
    """Validate a slack delta': a number in (0, 1)."""
    slack = check_delta(value, field)
    if slack == 0:
        raise InvalidCostError(field, value, "must be > 0 (ln(1/delta') is infinite at 0)")
    return slack


def _float_eps(epsilon: Fraction) -> float:
    eps = float_up(epsilon)
    if eps > _MAX_EXP_ARG:
        raise InvalidCostError(
            "epsilon", epsilon, "too large for this bound (e^epsilon overflows); use basic"
        )
    return eps


def _delta_total(slack: Fraction, k: int, delta: Fraction) -> Fraction:
    total = slack + k * delta
    if total >= 1:
        raise InvalidCostError(
            "delta", total, f"delta_slack + {k} x delta reaches 1: no guarantee is left"
        )
    return total


def log_inv_up(delta: Fraction) -> float:
    """A float >= ln(1/delta) for 0 < delta < 1 (any delta, however small)."""
    return log_inv_bounds(delta)[1]


def log_inv_down(delta: Fraction) -> float:
    """A float <= ln(1/delta) for 0 < delta < 1 (any delta, however small)."""
    return log_inv_bounds(delta)[0]


def advanced(cost: Any, k: int, delta_slack: Any) -> PrivacyCost:
    """k-fold advanced composition of an (epsilon, delta)-DP mechanism.

    epsilon' = sqrt(2k ln(1/delta')) epsilon + k epsilon (e^epsilon - 1) and
    delta' + k delta: Dwork, Rothblum and Vadhan 2010 (Thm III.3) as stated in Dwork and
    Roth 2014, Thm 3.20. Proven for k-fold adaptive composition in which each mechanism
    may be chosen adaptively but k and (epsilon, delta) are fixed in advance.

    Args:
        cost: The per-query (epsilon, delta) (a PrivacyCost, a pair, or a charge).
        k: The number of queries, >= 1.
        delta_slack: delta' in (0, 1).

    Returns:
        The composed cost, epsilon rounded up, delta exact.

    Raises:
        InvalidCostError: For invalid inputs or a total delta reaching 1.

    Examples:
        >>> c = advanced(PrivacyCost("0.1"), 1000, "1e-5")
        >>> 25.6 < float(c.epsilon) < 25.8
        True
    """
    cost = as_cost(cost)
    k = check_count(k, "k")
    slack = check_slack(delta_slack)
    eps = _float_eps(cost.epsilon)
    value = math.sqrt(2 * k * log_inv_up(slack)) * eps + k * eps * math.expm1(eps)
    return trusted_cost(up(value, _ULPS), _delta_total(slack, k, cost.delta))


def _a_of(eps: float) -> float:
    """a(epsilon) = min(epsilon (e^epsilon - 1), epsilon), as a float rounded up."""
    return min(math.nextafter(eps * math.expm1(eps), math.inf) * (1 + 2**-50), eps)


def advanced_adaptive(cost: Any, k: int, delta_slack: Any) -> PrivacyCost:
    """Advanced composition in the a(epsilon) form, for adaptively chosen mechanisms.

    epsilon' = k a(epsilon) + sqrt(2k ln(1/delta')) (epsilon + a(epsilon)) and
    delta' + k delta, where a(epsilon) = epsilon (e^epsilon - 1) for epsilon <= ln 2 and
    epsilon above (so a(epsilon) = min(epsilon (e^epsilon - 1), epsilon)) bounds the
    expected privacy loss (KL divergence; Dwork and Roth 2014, Lemma 3.18). The Azuma
    step of Dwork, Rothblum and Vadhan 2010 (Thm III.3) with martingale increments
    bounded by epsilon + a(epsilon) gives this bound. Proven for k-fold adaptive
    composition with fixed parameters.

    It is **never tighter** than the better of basic composition and `advanced()`:
    for epsilon <= ln 2 it equals `advanced()` plus sqrt(2k ln(1/delta'))
    a(epsilon), and for epsilon > ln 2 it equals basic's k epsilon plus
    2 epsilon sqrt(2k ln(1/delta')). It is kept for comparison with texts that state it;
    `best_rule()` and ``compose_by_name("best")`` never
    use it.

    Args:
        cost: The per-query (epsilon, delta).
        k: The number of queries, >= 1.
        delta_slack: delta' (the Azuma failure probability) in (0, 1).

    Examples:
        >>> c = advanced_adaptive(PrivacyCost(1), 10, "1e-6")
        >>> 43.2 < float(c.epsilon) < 43.3    # a(1) = 1: 10 + 2 sqrt(20 ln 1e6)
        True
    """
    cost = as_cost(cost)
    k = check_count(k, "k")
    slack = check_slack(delta_slack)
    eps = _float_eps(cost.epsilon)
    a = _a_of(eps)
    value = k * a + math.sqrt(2 * k * log_inv_up(slack)) * (eps + a)
    return trusted_cost(up(value, _ULPS), _delta_total(slack, k, cost.delta))


def advanced_simplified(cost: Any, k: int, delta_slack: Any) -> PrivacyCost:
    """The simplified form 2 epsilon sqrt(2k ln(1/delta')), where it is valid.

    It bounds `advanced()` from above exactly when
    k epsilon (e^epsilon - 1) <= epsilon sqrt(2k ln(1/delta')), i.e. when
    k (e^epsilon - 1)^2 <= 2 ln(1/delta') (Dwork and Roth 2014, Thm 3.20 and the
    argument of Cor. 3.21). Outside that range it is not a proven bound and is refused.
    Proven for k-fold adaptive composition with fixed parameters.

    Raises:
        UnsupportedChargeError: Outside the validity range (use `advanced()`).

    Examples:
        >>> c = advanced_simplified(PrivacyCost("0.01"), 100, "1e-5")
        >>> 0.95 < float(c.epsilon) < 0.96
        True
        >>> advanced_simplified(PrivacyCost(1), 100, "1e-5")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dpaccount.errors.UnsupportedChargeError: ...
    """
    cost = as_cost(cost)
    k = check_count(k, "k")
    slack = check_slack(delta_slack)
    eps = _float_eps(cost.epsilon)
    delta = _delta_total(slack, k, cost.delta)
    # Validity check with directed rounding: left side up, right side down.
    growth = math.nextafter(math.expm1(eps), math.inf) * (1 + 2**-50)
    lhs = k * growth * growth * (1 + 2**-48)
    rhs = 2 * log_inv_down(slack) * (1 - 2**-50)
    if lhs > rhs:
        raise UnsupportedChargeError(
            f"the simplified bound 2 epsilon sqrt(2k ln(1/delta')) is proven only when "
            f"k (e^epsilon - 1)^2 <= 2 ln(1/delta'); here k={k}, epsilon={cost.epsilon}, "
            f"delta'={slack} give {lhs:.6g} > {rhs:.6g}. Use advanced() instead."
        )
    value = 2 * eps * math.sqrt(2 * k * log_inv_up(slack))
    return trusted_cost(up(value, _ULPS), delta)


class AdvancedRule(FixedPlanRule):
    """Accountant rule: advanced composition over a declared homogeneous plan.

    After j charges the total is `advanced()` of the plan's cost for k = j (or
    basic composition when that is no worse in both coordinates). Proven for k-fold
    adaptive composition with parameters fixed in advance (Dwork, Rothblum and Vadhan
    2010, Thm III.3; Dwork and Roth 2014, Thm 3.20); any charge outside the plan is
    refused with `UnsupportedChargeError`.

    Args:
        plan: ``(cost, k)`` or a `Plan` with one
            cost (for different costs use ``"heterogeneous"``).
        delta_slack: delta' in (0, 1). If omitted, ``budget`` must be given and delta'
            is what the budget leaves after the plan's deltas.
        budget: The ledger's budget (only to choose the default delta_slack).
        form: ``"dwork_roth"`` (Thm 3.20, default) or ``"a_epsilon"``
            (`advanced_adaptive()`).

    Examples:
        >>> rule = AdvancedRule(plan=(PrivacyCost("0.1"), 1000), delta_slack="1e-6")
        >>> s = rule.extend(rule.start(), PrivacyCost("0.1"))
        >>> rule.total(s)                 # one query: basic is better
        PrivacyCost(epsilon=0.1, delta=0)
    """

    name = "advanced"
    adaptivity = Adaptivity.ADAPTIVE_MECHANISMS
    theorem = THEOREM_ADVANCED

    def __init__(
        self,
        plan: Any = None,
        delta_slack: Any = None,
        *,
        budget: Budget | None = None,
        form: str = "dwork_roth",
    ) -> None:
        super().__init__(plan)
        if not self.plan.is_homogeneous:
            raise ConfigError(
                "advanced composition (Dwork-Roth Thm 3.20) is stated for k queries of one "
                "cost; for a plan of different costs use rule='heterogeneous'"
            )
        self.cost, self.k = self.plan.runs[0]
        if form not in ("dwork_roth", "a_epsilon"):
            raise ConfigError(f"unknown form {form!r}; use 'dwork_roth' or 'a_epsilon'")
        self.form = form
        if form == "a_epsilon":
            self.theorem = THEOREM_ADAPTIVE
        if delta_slack is None:
            if budget is None:
                raise ConfigError("the advanced rule needs delta_slack (or budget=)")
            delta_slack = budget.delta - self.k * self.cost.delta
            if delta_slack <= 0:
                raise ConfigError(
                    f"the budget's delta {budget.delta} leaves no slack after the plan's "
                    f"{self.k} x {self.cost.delta}"
                )
        self.delta_slack = check_slack(delta_slack)
        self._formula = advanced if form == "dwork_roth" else advanced_adaptive

    def bound(self, state: PlanState) -> PrivacyCost | None:
        try:
            return self._formula(self.cost, state.position, self.delta_slack)
        except InvalidCostError:
            return None

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "delta_slack": str(self.delta_slack),
            "form": self.form,
        }
