"""Renyi curves of one run of a mechanism without subsampling (in nats, rounded up).

Each function is the RDP of order alpha of one mechanism; RDP values add up under
composition (Mironov 2017, Prop. 1), also for adaptively chosen mechanisms:

* Gaussian: alpha Delta^2 / (2 sigma^2) (Mironov 2017, Prop. 7), the same for the
  discrete Gaussian (Canonne, Kamath and Steinke 2020, Prop. 5); zCDP of the Gaussian
  (Bun and Steinke 2016, Prop. 1.6);
* Laplace: Mironov 2017, Prop. 6; the discrete Laplace (derived at the function);
* k-ary randomized response, exactly; bounded range (the exponential mechanism; Dong,
  Durfee and Rogers 2020, Sec. 4).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import special

from dpaccount._numeric import check_epsilon, check_positive, float_down, float_up
from dpaccount.accounting.rdp.orders import _check_order, _push
from dpaccount.errors import InvalidCostError

__all__ = [
    "bounded_range_rdp",
    "discrete_gaussian_rdp",
    "discrete_laplace_rdp",
    "gaussian_rdp",
    "gaussian_zcdp",
    "laplace_rdp",
    "randomized_response_rdp",
]


def gaussian_rdp(sigma: Any, sensitivity: Any, alpha: float) -> float:
    """RDP of the Gaussian mechanism: alpha Delta^2 / (2 sigma^2) (Mironov 2017, Prop. 7).

    Examples:
        >>> 1.0 < gaussian_rdp(1, 1, 2.0) < 1.0000001
        True
    """
    a = _check_order(alpha)
    rho = float_up(check_positive(sensitivity, "sensitivity") ** 2
                   / (2 * check_positive(sigma, "sigma") ** 2))
    return _push(a * rho)


def discrete_gaussian_rdp(sigma: Any, sensitivity: Any, alpha: float) -> float:
    """RDP of the discrete Gaussian N_Z(0, sigma^2) per coordinate, integer shifts with
    ||v||_2 <= ``sensitivity``: alpha sensitivity^2 / (2 sigma^2), as for the continuous
    Gaussian.

    Canonne, Kamath and Steinke 2020, Prop. 5 (scalar) and Thm 14 (multivariate). The
    scalar step, written out: for an integer shift v, completing the square gives
    sum_y p(y - v)^alpha p(y)^(1 - alpha) = e^{alpha (alpha - 1) v^2 / (2 sigma^2)}
    theta(alpha v) / theta(0) with theta(t) = sum_y exp(-(y - t)^2 / (2 sigma^2)), and
    theta(t) <= theta(0) for every real t (Poisson summation writes theta as a cosine
    series with positive coefficients). Renyi divergences of product distributions add
    up over the coordinates, which gives the vector bound. Holds for any order > 1.

    Examples:
        >>> 0.75 <= discrete_gaussian_rdp(2, 2, 1.5) < 0.7500001   # 1.5 * 2^2 / (2 * 2^2)
        True
    """
    return gaussian_rdp(sigma, sensitivity, alpha)


def discrete_laplace_rdp(scale: Any, sensitivity: Any, alpha: float) -> float:
    """RDP of the scalar discrete Laplace (P[y] ∝ e^(-|y|/b)) for integer shifts <= S.

    With q = e^(-1/b) the moment sum_y P(y - S)^alpha P(y)^(1 - alpha) splits into
    three geometric series (y <= 0, 0 < y < S, y >= S):
    (1 - q)/(1 + q) [q^(alpha S) / (1 - q) + q^((1 - alpha) S) / (1 - q)
    + q^(alpha S) r (r^(S-1) - 1) / (r - 1)], r = q^(1 - 2 alpha) (derived here). It
    grows with the shift (a smaller integer shift is a post-processing of the larger
    one, `DiscreteLaplacePair`), so S covers every shift up to S. For S = 1 it is the
    binary randomized response's curve, the bound for pure (1/b)-DP; for large S it
    approaches the continuous Laplace's (Mironov 2017, Prop. 6). Computed in log space
    with an absolute allowance for the rounding of its terms, and never above the
    randomized-response bound of epsilon = S / b.

    Examples:
        >>> r = discrete_laplace_rdp(1, 1, 2.0)      # = randomized_response_rdp(1, 2, 2)
        >>> abs(r - randomized_response_rdp(1, 2, 2.0)) < 1e-8
        True
    """
    a = _check_order(alpha)
    b = float_down(check_positive(scale, "scale"))
    shift = check_positive(sensitivity, "sensitivity")
    if shift.denominator != 1:
        raise InvalidCostError("sensitivity", sensitivity, "must be an integer (lattice steps)")
    big_s = int(shift)
    epsilon = float_up(shift / check_positive(scale, "scale"))
    ceiling = randomized_response_rdp(epsilon, 2, a)
    log_q = -1.0 / b
    log_1mq = math.log(-math.expm1(log_q))
    terms = [a * big_s * log_q - log_1mq, (1 - a) * big_s * log_q - log_1mq]
    if big_s > 1:
        log_r = (1 - 2 * a) * log_q
        terms.append(
            a * big_s * log_q + log_r + _log_expm1((big_s - 1) * log_r) - _log_expm1(log_r)
        )
    log_norm = log_1mq - math.log1p(math.exp(log_q))
    log_moment = log_norm + float(special.logsumexp(terms))
    allowance = 64 * 2.0**-52 * (abs(log_norm) + max(abs(t) for t in terms) + 1.0)
    value = (log_moment + allowance) / (a - 1)
    return min(_push(max(value, 0.0)), ceiling)


def _log_expm1(x: float) -> float:
    """ln(e^x - 1) for x > 0, without overflow."""
    return x + math.log1p(-math.exp(-x)) if x > 1 else math.log(math.expm1(x))


def gaussian_zcdp(sigma: Any, sensitivity: Any = 1) -> Fraction:
    """zCDP of the Gaussian mechanism: rho = Delta^2 / (2 sigma^2), exactly.

    Bun and Steinke 2016 ("Concentrated differential privacy"), Prop. 1.6.

    Examples:
        >>> gaussian_zcdp(2)
        Fraction(1, 8)
    """
    return check_positive(sensitivity, "sensitivity") ** 2 / (
        2 * check_positive(sigma, "sigma") ** 2
    )


def laplace_rdp(scale: Any, sensitivity: Any, alpha: float) -> float:
    """RDP of the Laplace mechanism (Mironov 2017, Prop. 6), with lambda = scale/Delta.

    (1/(alpha-1)) ln(alpha/(2 alpha-1) e^{(alpha-1)/lambda}
    + (alpha-1)/(2 alpha-1) e^{-alpha/lambda}).

    Examples:
        >>> 0.0 < laplace_rdp(1, 1, 2.0) < 1.0
        True
    """
    a = _check_order(alpha)
    inv = float_up(check_positive(sensitivity, "sensitivity") / check_positive(scale, "scale"))
    value = np.logaddexp(
        math.log(a / (2 * a - 1)) + (a - 1) * inv,
        math.log((a - 1) / (2 * a - 1)) - a * inv,
    ) / (a - 1)
    return _push(min(float(value), inv))


def randomized_response_rdp(epsilon: Any, categories: int, alpha: float) -> float:
    """RDP of one k-ary randomized response report with ratio e^epsilon, exactly.

    D_alpha = ln(1 + N / (e^eps + k - 1)) / (alpha - 1) with
    N = e^(alpha eps) + e^((1 - alpha) eps) - e^eps - 1
    = expm1((alpha - 1) eps) expm1(alpha eps) e^(-(alpha - 1) eps) (a product of
    positive factors: no cancellation at small epsilon); the divergence of the
    distributions (p, q, ..., q) and (q, p, q, ..., q), the same for every pair of
    values. For k = 2 it is the largest RDP of any pure epsilon-DP mechanism: the binary
    randomized response dominates every epsilon-DP pair (Kairouz, Oh and Viswanath
    2015, Thm 2.4) and Renyi divergences obey data processing (van Erven and Harremoes
    2014, Thm 9).

    Examples:
        >>> r = randomized_response_rdp(1, 2, 2.0)    # ln((e^2 + e^-1) / (e + 1))
        >>> abs(r - math.log((math.e**2 + math.exp(-1)) / (math.e + 1))) < 1e-9
        True
    """
    a = _check_order(alpha)
    eps = float_up(check_epsilon(epsilon))
    if eps == 0:
        return 0.0
    k = int(categories)
    order = a - 1
    log_n = _log_expm1(order * eps) + _log_expm1(a * eps) - order * eps
    log_den = eps + math.log1p((k - 1) * math.exp(-eps))
    value = float(np.logaddexp(0.0, log_n - log_den)) / order
    return _push(min(value, eps))


def bounded_range_rdp(epsilon: Any, alpha: float) -> float:
    """RDP of an epsilon-bounded-range mechanism (the exponential mechanism), exactly.

    Every epsilon-BR pair is a post-processing of some R_t, the generalised randomized
    response with losses t (mass p_t = (e^eps - e^t) / (e^eps - 1)) and t - eps,
    t in [0, eps] (Dong, Durfee and Rogers 2020, Sec. 4), so the RDP is
    max_t h(t) / (alpha - 1) with h(t) = ln E[e^((alpha-1) L)] =
    (alpha-1) t + ln(c + (1 - c) p_t), c = e^(-(alpha-1) eps). h is concave (a linear
    term plus the log of a positive concave function of t), with its stationary point
    at e^t = (alpha - 1)(e^eps - c) / (alpha (1 - c)) (derived here); the value is
    taken there, clamped to [0, eps], plus the tangent bound max h <= h(t) +
    h'(t)(s - t) over s in [0, eps] and a floating-point allowance, so it is an upper
    bound. Also at most alpha eps^2 / 8 (Cesar and Rogers 2021, epsilon-BR is
    eps^2/8-zCDP) and the epsilon-DP bound.

    Examples:
        >>> r = bounded_range_rdp(1, 1.0001)        # ~ KL, 0.1233 (0.4621 for eps-DP)
        >>> 0.1232 < r < 0.1234
        True
    """
    a = _check_order(alpha)
    eps = float_up(check_epsilon(epsilon))
    if eps == 0:
        return 0.0
    order = a - 1
    c = math.exp(-order * eps)
    one_minus_c = -math.expm1(-order * eps)
    scale = -math.expm1(-eps)  # (e^eps - 1) e^-eps
    log_t = (
        math.log(order) - math.log(a) + eps + math.log1p(-math.exp(-a * eps))
        - math.log(one_minus_c)
    )
    t = min(max(log_t, 0.0), eps)
    p = -math.expm1(t - eps) / scale
    inner = c + one_minus_c * p
    log_inner = math.log(inner)
    h = order * t + log_inner
    slope = order - one_minus_c * math.exp(t - eps) / (scale * inner)
    tangent = max(-slope * t, slope * (eps - t), 0.0)
    # ln(inner) is off by the relative rounding of inner (a few u, absolute in the log,
    # however small ln(inner) is) plus u |ln(inner)|: hence the 1.
    allowance = 16 * 2.0**-52 * (abs(order * t) + abs(log_inner) + tangent + 1.0)
    value = (h + tangent + allowance) / order
    zcdp = a * eps * eps / 8 * (1 + 1e-15)
    return _push(min(max(value, 0.0), zcdp, eps))
