"""From Renyi DP to (epsilon, delta), and zCDP through it.

epsilon = rdp + ln((alpha-1)/alpha) - (ln delta + ln alpha) / (alpha - 1) (Canonne,
Kamath and Steinke 2020, Prop. 12; Balle, Barthe, Gaboardi, Hsu and Sato 2020, Thm 21),
minimised over a grid of orders and refined continuously; epsilon = 0 when
delta >= sqrt(1 - e^{-rdp}) (total variation against KL, Bretagnolle and Huber 1979).
Every result is rounded up. zCDP is RDP at every order (Bun and Steinke 2016, Def. 1.1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpaccount._numeric import (
    check_delta,
    check_epsilon,
    check_float_delta,
    float_down,
    float_up,
    up,
)
from dpaccount.accounting.rdp.orders import DEFAULT_ORDERS, Array, _minimize_bounded, _push
from dpaccount.errors import InvalidCostError

__all__ = ["rdp_epsilon", "zcdp_epsilon"]


def _conversion(rdp: Array, orders: Array, delta: float) -> Array:
    """The improved RDP-to-(epsilon, delta) conversion at each order (not minimised)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = rdp + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    eps = np.where(delta * delta + np.expm1(-rdp) > 0, 0.0, eps)
    return np.asarray(np.maximum(eps, 0.0), dtype=np.float64)


def rdp_epsilon(
    rdp: Sequence[float] | Array, orders: Sequence[float] | Array, delta: float
) -> tuple[float, float]:
    """The smallest epsilon of the improved conversion over the given orders.

    Canonne, Kamath and Steinke 2020, Prop. 12 / Balle et al. 2020, Thm 21. The result
    is rounded up (a relative 1e-12 plus ulps).

    Returns:
        ``(epsilon, order)``; ``(inf, nan)`` if ``delta`` is 0.
    """
    if delta <= 0:
        return math.inf, math.nan
    r = np.asarray(rdp, dtype=np.float64)
    a = np.asarray(orders, dtype=np.float64)
    eps = _conversion(r, a, delta)
    i = int(np.argmin(eps))
    return _round_eps(float(eps[i])), float(a[i])


def _round_eps(value: float) -> float:
    if value <= 0:
        return 0.0
    return math.nextafter(value * (1 + 1e-12), math.inf)


def _refined_epsilon(
    rdp_at: Callable[[float], float], orders: Sequence[float], delta: float
) -> float:
    """Grid search over ``orders``, then a continuous search around the best order."""
    a = np.asarray(orders, dtype=np.float64)
    values = np.array([rdp_at(float(x)) for x in a])
    best, order = rdp_epsilon(values, a, delta)
    i = int(np.searchsorted(a, order))
    lo = float(a[max(i - 1, 0)])
    hi = float(a[min(i + 1, a.size - 1)])
    if best == 0 or hi <= lo:
        return best

    def objective(alpha: float) -> float:
        return float(_conversion(np.array([rdp_at(alpha)]), np.array([alpha]), delta)[0])

    refined = objective(_minimize_bounded(objective, lo, hi, 1e-6))  # any order is valid
    return min(best, _round_eps(refined))


def zcdp_epsilon(rho: Any, delta: Any) -> Fraction:
    """epsilon(delta) of rho-zCDP through RDP of every order (rho alpha), rounded up.

    Bun and Steinke 2016, Def. 1.1 (zCDP is RDP at all orders) with the improved
    conversion, optimised over the order continuously.

    Examples:
        >>> 4.72 < float(zcdp_epsilon("0.5", "1e-5")) < 4.74
        True
    """
    r = float_up(check_epsilon(rho, "rho"))
    d = float_down(check_float_delta(check_delta(delta), "delta"))
    if r == 0:
        return Fraction(0)
    if d == 0:
        raise InvalidCostError("delta", delta, "zCDP gives no finite epsilon at delta = 0")
    eps = _refined_epsilon(lambda a: _push(a * r), DEFAULT_ORDERS, d)
    return up(eps)
