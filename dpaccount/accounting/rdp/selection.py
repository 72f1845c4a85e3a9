"""The Renyi curve of repeat-and-select (Papernot and Steinke 2022), from a run's curve.

A `dpaccount.charges.RepeatAndSelect` runs a mechanism Q a random number K of times
and releases the best run. Papernot and Steinke 2022 ("Hyperparameter tuning with Renyi
differential privacy", ICLR; theorem numbers of arXiv:2110.03620v2) bound its RDP
from Q's:

* K ~ TNB(eta, gamma) (Thm 2): if Q is (lambda, eps)- and (lambda_hat, eps_hat)-RDP,
  the selection is (lambda, eps')-RDP with eps' = eps + (1 + eta)(1 - 1/lambda_hat)
  eps_hat + (1 + eta) ln(1/gamma) / lambda_hat + ln(E[K]) / (lambda - 1); lambda_hat is
  free, so the best order of the grid is taken (one constant for every lambda).
* K ~ Poisson(mu) (Thm 6): if Q is (lambda, eps)-RDP and (eps_hat, delta_hat)-DP with
  e^eps_hat <= 1 + 1/(lambda - 1), the selection is (lambda, eps + mu delta_hat +
  ln(mu) / (lambda - 1))-RDP. delta_hat is Q's delta at eps_hat = ln(1 + 1/(lambda -
  1)) (rounded down), from Q's curve by the conversion of Canonne, Kamath and Steinke
  2020, Prop. 12: delta <= e^{(beta - 1)(rdp_beta - eps)} (1 - 1/beta)^{beta - 1} /
  beta, at the best order beta of the grid.

Renyi divergence does not decrease with the order, so a bound at an order lambda' >=
lambda holds at lambda too: each value is the least over the orders of the grid at or
above it (as dp_accounting does for the truncated negative binomial). Every value is
rounded up; the functions take the run's curve as floats already rounded up and return
the bound at any order, computed once a charge.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dpaccount.accounting.rdp.orders import Array

__all__ = ["Bound", "poisson_selection", "tnb_selection"]

#: Relative margin on the float arithmetic of the bounds (a few operations on values
#: already rounded up).
_MARGIN = 1e-12


#: The bound at one order: ``(alpha, the run's RDP at alpha) -> the selection's RDP``,
#: built once a charge from the run's curve on a grid (`tnb_selection`,
#: `poisson_selection`).
Bound = Callable[[float, float], float]


def _up(value: float) -> float:
    return math.nextafter(value * (1 + _MARGIN) + 1e-300, math.inf) if value > 0 else 0.0


def _with_monotonicity(own: Callable[[float, float], float], grid: Array, values: Array
                       ) -> Bound:
    """The bound at alpha: the least of ``own`` there and ``values`` at grid orders
    >= alpha (RDP does not decrease with the order), rounded up."""
    # suffix minima: least[i] = min(values[i:]) (the grid is increasing)
    least = np.minimum.accumulate(values[::-1])[::-1]

    def bound(alpha: float, at_alpha: float) -> float:
        i = int(np.searchsorted(grid, alpha, side="left"))
        above = float(least[i]) if i < grid.size else math.inf
        return _up(min(own(alpha, at_alpha), above))

    return bound


def tnb_selection(grid: Array, run: Array, mean: float, eta: float, gamma: float,
                  pure: float = math.inf) -> Bound:
    """The selection's RDP for a truncated negative binomial count (Thm 2).

    Args:
        grid: Increasing orders (> 1) the run's curve is known at.
        run: The run's RDP at ``grid``, rounded up.
        mean: E[K] (>= 1), rounded up.
        eta: The shape (>= 0), rounded up (it multiplies a non-negative constant).
        gamma: The TNB's gamma, rounded down (`dpaccount.charges.counts.tnb_gamma_down`).
        pure: The run's pure epsilon (rounded up), if it has one: its RDP is at most
            that at every order, so as lambda_hat grows the term in lambda_hat tends to
            it (Thm 2 holds at every lambda_hat, hence at their infimum). As lambda_hat
            falls to 1 the term tends to ln(1/gamma) (the run's RDP there is at most its
            value at the grid's first order), the other end of the infimum.
    """
    log_inv_gamma = -math.log(gamma) if gamma < 1 else 0.0
    least = min(float(np.min((1 - 1 / grid) * run + log_inv_gamma / grid)), pure,
                log_inv_gamma)
    constant = (1 + eta) * least
    log_mean = math.log(mean)

    def own(alpha: float, at_alpha: float) -> float:
        return at_alpha + constant + log_mean / (alpha - 1)

    return _with_monotonicity(own, grid, run + constant + log_mean / (grid - 1))


def _log_delta_at(epsilon: Array, grid: Array, run: Array) -> Array:
    """ln of the run's delta at each ``epsilon`` from its curve (CKS 2020, Prop. 12),
    the least over the grid's orders (not yet rounded)."""
    g, r = grid[None, :], run[None, :]
    e = np.asarray(epsilon, dtype=np.float64)[:, None]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        log_delta = (g - 1) * (r - e) + (g - 1) * np.log1p(-1 / g) - np.log(g)
    return np.asarray(np.min(log_delta, axis=1), dtype=np.float64)


def _delta_hat(orders: Array, grid: Array, run: Array) -> Array:
    """The run's delta at eps_hat = ln(1 + 1/(lambda - 1)) (rounded down), rounded up."""
    eps_hat = np.log1p(1 / (orders - 1)) * (1 - 1e-12)
    log_delta = _log_delta_at(eps_hat, grid, run)
    return np.minimum(1.0, np.exp(np.minimum(log_delta, 0.0)) * (1 + 1e-9) + 1e-300)


def poisson_selection(
    grid: Array, run: Array, mean: float, point: tuple[float, float] = (math.inf, 1.0)
) -> Bound:
    """The selection's RDP for a Poisson count of mean ``mean`` (>= 1, rounded up; Thm 6).

    Args:
        grid, run, mean: As `tnb_selection`.
        point: An (epsilon, delta) guarantee of the run, both rounded up (its cost).
            Every (epsilon, delta)-DP pair is a post-processing of the four-point
            (epsilon, delta) randomized response (Kairouz, Oh and Viswanath 2015, "The
            composition theorem for differential privacy", ICML, Sec. 2), so at
            eps_hat <= epsilon
            delta_hat <= delta + (1 - delta)(e^epsilon - e^eps_hat) / (1 + e^epsilon),
            and delta_hat <= delta above it: for a pure run delta_hat -> 0 as eps_hat
            reaches epsilon, which the curve's conversion at finite orders only nears.
    """
    log_mean = math.log(mean)
    eps_c, delta_c = point

    def delta_hat(orders: Array) -> Array:
        from_curve = _delta_hat(orders, grid, run)
        eps_hat = np.log1p(1 / (orders - 1)) * (1 - 1e-12)
        with np.errstate(over="ignore", invalid="ignore"):
            gap = np.maximum(-np.expm1(eps_hat - eps_c), 0.0) / (1 + math.exp(-eps_c))
        from_point = (delta_c + (1 - delta_c) * gap) * (1 + 1e-9)
        return np.minimum(from_curve, np.where(np.isfinite(from_point), from_point, 1.0))

    def own(alpha: float, at_alpha: float) -> float:
        delta = float(delta_hat(np.array([alpha]))[0])
        return at_alpha + mean * delta + log_mean / (alpha - 1)

    values = run + mean * delta_hat(grid) + log_mean / (grid - 1)
    return _with_monotonicity(own, grid, values)
