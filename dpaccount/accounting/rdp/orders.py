"""The grids of Renyi orders, and what every Renyi value computed here shares.

`DEFAULT_ORDERS` is the dense grid on which a declared plan is composed (Mironov 2017,
Prop. 1), `FILTER_ORDERS` the short grid of the Renyi filter (Feldman and Zrnic 2021,
Thm 3.1), whose target delta is split evenly among its orders. Every RDP value computed
in this package is rounded up by a relative margin (`_push`); an order is a finite
number > 1 (`_check_order`). Any order gives a valid bound, so the search for the best
one (`_minimize_bounded`) only affects how tight a result is, never whether it holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from dpaccount.errors import InvalidCostError

__all__ = ["DEFAULT_ORDERS", "FILTER_ORDERS", "Array"]

Array = npt.NDArray[np.float64]

#: Orders for composition with fixed parameters: dense where DP-SGD optima lie.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 20 for x in range(1, 200)]
    + [11 + x / 2 for x in range(0, 106)]
    + [64.0, 72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 1024.0]
)
#: Orders of the Renyi filter (the target delta is split evenly among them).
FILTER_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0,
    10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0,
)

#: Relative margin added to every computed RDP value (covers the float error of the
#: log-sum-exp and of the quadrature, which is requested to 1e-12 relative).
_REL = 1e-9


def _push(value: float) -> float:
    """Round a non-negative computed RDP value up by the relative margin."""
    if math.isnan(value):
        raise InvalidCostError("rdp", value, "computation produced NaN")
    return math.nextafter(value * (1 + _REL) + 1e-300, math.inf) if value >= 0 else 0.0


def _check_order(alpha: float) -> float:
    if isinstance(alpha, bool) or not alpha > 1 or math.isinf(alpha):
        raise InvalidCostError("alpha", alpha, "the order must be a finite number > 1")
    return float(alpha)


_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _minimize_bounded(f: Callable[[float], float], lo: float, hi: float, xatol: float) -> float:
    """A minimiser of a unimodal ``f`` on [lo, hi] to within ``xatol``, by golden-section
    search (Kiefer 1953). Only where the optimum lies depends on it, never whether a
    bound holds: every caller re-evaluates a valid bound at the returned point. (No
    scipy.optimize: importing it costs ~0.1 s, more than a warm call.)"""
    a, b = lo, hi
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > xatol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return c if fc <= fd else d
