"""Renyi differential privacy (RDP), zCDP, and the Renyi and Gaussian-DP filters.

RDP of order alpha bounds the Renyi divergence D_alpha(M(D) || M(D')) (Mironov 2017,
"Renyi differential privacy", CSF, Def. 4). RDP values add up under composition
(Mironov 2017, Prop. 1), also for adaptively chosen mechanisms; with the Renyi filter
(Feldman and Zrnic 2021, "Individual privacy accounting via a Renyi filter", NeurIPS,
Thm 3.1) they add up even when each mechanism's parameters are chosen at run time, as
long as the running sum stays within a budget fixed in advance.

Values computed here (all in nats, all rounded up by a relative margin):

* Gaussian: alpha * Delta^2 / (2 sigma^2) (Mironov 2017, Prop. 7); the same for the
  discrete Gaussian of our own mechanisms (Canonne, Kamath and Steinke 2020, Prop. 5);
* Laplace: Mironov 2017, Prop. 6;
* Poisson-subsampled Gaussian, add/remove: Mironov, Talwar and Zhang 2019 ("Renyi
  differential privacy of the sampled Gaussian mechanism"), Sec. 3.3: the exact
  A_alpha = E_{z ~ N(0, s^2)} [((1-q) + q e^{(2z-1)/(2 s^2)})^alpha], by the binomial
  expansion at integer orders and by quadrature at fractional ones;
* Gaussian subsampled without replacement, substitution: Wang, Balle and
  Kasiviswanathan 2019 ("Subsampled Renyi differential privacy and analytical moments
  accountant", AISTATS), Thm 27 of arXiv:1808.00087 (the Gaussian-specific form with
  forward differences) up to order 256 and Thm 9 above, at integer orders; a fractional
  order interpolates the convex cumulant between its integer neighbours (their Cor. 10).

Conversion to (epsilon, delta): epsilon = rdp + ln((alpha-1)/alpha)
- (ln delta + ln alpha) / (alpha - 1) (Canonne, Kamath and Steinke 2020, Prop. 12;
Balle, Barthe, Gaboardi, Hsu and Sato 2020, Thm 21), minimised over a grid of orders and
refined continuously; epsilon = 0 when delta >= sqrt(1 - e^{-rdp}) (total variation
against KL, Bretagnolle and Huber 1979).

Examples:
    >>> eps, order = rdp_epsilon([gaussian_rdp(1, 1, a) for a in (8.0, 9.0, 10.0)],
    ...                          [8.0, 9.0, 10.0], 1e-5)
    >>> 5.2 < eps < 5.22 and order == 8.0
    True
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
from scipy import special

from dpaccount._numeric import (
    check_delta,
    check_epsilon,
    check_float_delta,
    check_positive,
    check_rate,
    float_down,
    float_up,
    gaussian_delta_up,
    up,
)
from dpaccount.accounting._plans import DeclaredPlan, as_charges
from dpaccount.charges import (
    SCHEME_RELATION,
    Atom,
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Scheme,
    Subsampled,
    atoms,
    cost_of,
    shown,
)
from dpaccount.composition.base import Adaptivity, ByIdentity, Rule, SpentMeaning
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = [
    "DEFAULT_ORDERS",
    "FILTER_ORDERS",
    "GDPFilterRule",
    "RDPRule",
    "bounded_range_rdp",
    "charge_rdp",
    "discrete_gaussian_rdp",
    "discrete_laplace_rdp",
    "gaussian_rdp",
    "gaussian_zcdp",
    "gdp_epsilon",
    "laplace_rdp",
    "randomized_response_rdp",
    "rdp_epsilon",
    "sgm_epsilon",
    "subsampled_gaussian_rdp",
    "wor_subsampled_gaussian_rdp",
    "zcdp_epsilon",
]

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
    allowance = 16 * 2.0**-52 * (abs(order * t) + abs(log_inner) + tangent + 1e-300)
    value = (h + tangent + allowance) / order
    zcdp = a * eps * eps / 8 * (1 + 1e-15)
    return _push(min(max(value, 0.0), zcdp, eps))


@functools.lru_cache(maxsize=4096)
def _sgm_log_a(q: float, sigma: float, alpha: float) -> float:
    """ln A_alpha of the sampled Gaussian mechanism (sensitivity 1, noise sigma)."""
    if float(alpha).is_integer():
        n = int(alpha)
        k = np.arange(n + 1, dtype=np.float64)
        log_binom = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
        with np.errstate(divide="ignore"):
            terms = (
                log_binom
                + (n - k) * math.log1p(-q)
                + k * math.log(q)
                + (k * k - k) / (2 * sigma * sigma)
            )
        return float(special.logsumexp(terms))
    # Fractional order: integrate in log space around the mode of the integrand.
    log_q, log_1mq = math.log(q), math.log1p(-q)

    def log_integrand(z: float) -> float:
        log_ratio = float(np.logaddexp(log_1mq, log_q + (2 * z - 1) / (2 * sigma * sigma)))
        return -z * z / (2 * sigma * sigma) - 0.5 * math.log(2 * math.pi * sigma * sigma) + (
            alpha * log_ratio
        )

    # Find the mode to centre the integration (the integrand is log-concave-ish).
    mode = _minimize_bounded(lambda z: -log_integrand(z), -50 * sigma, 50 * sigma + alpha,
                             1e-10)
    peak = log_integrand(mode)
    width = sigma * 40 + 10
    from scipy import integrate  # only fractional orders need it (~0.13 s to import)

    value, _err = integrate.quad(
        lambda z: math.exp(log_integrand(z) - peak),
        mode - width,
        mode + width,
        points=[mode],
        limit=400,
        epsabs=0.0,
        epsrel=1e-12,
    )
    return peak + math.log(value)


def subsampled_gaussian_rdp(rate: Any, noise_multiplier: Any, alpha: float) -> float:
    """RDP of the Poisson-subsampled Gaussian mechanism under add/remove neighbours.

    Mironov, Talwar and Zhang 2019, Sec. 3.3 (exact for integer and fractional
    orders); ``noise_multiplier`` is sigma / sensitivity.

    Examples:
        >>> r = subsampled_gaussian_rdp(0.01, 1.0, 2.0)   # q^2 (e^{1/s^2} - 1) to 1st order
        >>> 1.7e-4 < r < 1.72e-4
        True
    """
    a = _check_order(alpha)
    q = check_rate(rate, "sampling_rate")
    sigma = float_down(check_positive(noise_multiplier, "noise_multiplier"))
    if q == 1:
        return _push(a / (2 * sigma * sigma))
    log_a = _sgm_log_a(float_up(q), sigma, a)
    return _push(max(log_a, 0.0) / (a - 1))


#: Orders up to which the forward-difference bound (WBK 2019, Thm 27) is used; above,
#: the general Thm 9 (the same cut as TensorFlow Privacy's and dp_accounting's).
WOR_DIFFERENCE_ORDERS = 256


@functools.lru_cache(maxsize=64)
def _wor_even_differences(s: float, top: int) -> tuple[float, ...]:
    """ln of upper bounds on the even forward differences Delta^(2m) a at 0, m = 0..top.

    a_j = exp((j - 1) eps(j)) with eps(j) = j / (2 s^2) the Gaussian's RDP, so a_j =
    E[X^j] for the log-normal X = exp(Z / s - 1 / (2 s^2)), Z ~ N(0, 1), and
    Delta^(2m) a_0 = E[(X - 1)^(2m)] > 0. The alternating binomial sum cancels heavily
    (for large s by hundreds of digits), so it is summed in decimal arithmetic at a
    precision raised until the rigorous bound on its rounding error (every term is
    within a relative 10^(2 - prec) of its value; decimal's exp is correctly rounded)
    is below 10^-20 of the result; that bound is then added.
    """
    from decimal import Decimal, localcontext

    n = 2 * top
    digits = 50
    while True:
        with localcontext() as ctx:
            ctx.prec = digits
            c = Decimal(1) / (2 * Decimal(s) * Decimal(s))
            powers = [(c * (j * (j - 1))).exp() for j in range(n + 1)]
            unit = Decimal(10) ** (2 - digits)
            logs: list[float] = [0.0]  # Delta^0 a_0 = a_0 = 1
            for m in range(1, top + 1):
                order = 2 * m
                total, size = Decimal(0), Decimal(0)
                for j in range(order + 1):
                    term = math.comb(order, j) * powers[j]
                    total = total - term if (order - j) % 2 else total + term
                    size += term
                error = size * unit * (order + 4)
                if total <= 0 or error > total * Decimal("1e-20"):
                    break
                logs.append(float((total + error).ln()))
            else:
                # the float ln is within an ulp; a relative 1e-15 covers it
                return tuple(v + abs(v) * 1e-15 + 1e-300 for v in logs)
        digits *= 2


def wor_subsampled_gaussian_rdp(rate: Any, noise_multiplier: Any, alpha: float) -> float:
    """RDP of the Gaussian mechanism on a subsample drawn without replacement.

    Substitution neighbours, s = sigma / substitution sensitivity, eps(j) = j / (2 s^2)
    the Gaussian's RDP. For integer orders up to `WOR_DIFFERENCE_ORDERS`: Wang, Balle
    and Kasiviswanathan 2019 ("Subsampled Renyi differential privacy and analytical
    moments accountant", AISTATS), Thm 27 of arXiv:1808.00087 (their Gaussian-specific
    strengthening of Thm 9): the j-th term of the binomial sum is
    q^j C(alpha, j) min{4 sqrt(Delta^(2 floor(j/2)) a_0 Delta^(2 ceil(j/2)) a_0),
    2 e^((j-1) eps(j))} for j >= 3 (`_wor_even_differences()`), and
    q^2 C(alpha, 2) min{4 (e^eps(2) - 1), 2 e^eps(2)} for j = 2. Above that order, their
    general Thm 9 (j-th term 2 q^j C(alpha, j) e^((j-1) eps(j))). A fractional order
    interpolates the cumulant (alpha - 1) RDP(alpha), which is convex in alpha,
    between the neighbouring integers (their Cor. 10), with 0 at alpha = 1.

    Examples:
        >>> 0 < wor_subsampled_gaussian_rdp(0.01, 1.0, 2.0) < 1e-3
        True
    """
    a = _check_order(alpha)
    g = float_up(check_rate(rate, "sampling_rate"))
    s = float_down(check_positive(noise_multiplier, "noise_multiplier"))
    if g >= 1:
        return _push(a / (2 * s * s))
    if a.is_integer():
        return _push(_wor_log_a(g, s, int(a)) / (a - 1))
    low, high = math.floor(a), math.ceil(a)
    t = a - low
    cumulant_low = _wor_log_a(g, s, low) if low >= 2 else 0.0
    value = ((1 - t) * cumulant_low + t * _wor_log_a(g, s, high)) / (a - 1)
    return _push(value)


@functools.lru_cache(maxsize=4096)
def _wor_log_a(g: float, s: float, n: int) -> float:
    """ln of the bound on E[(P/Q)^n] at integer order n >= 2 (see the caller)."""

    def eps(j: int) -> float:
        return j / (2 * s * s)

    e2 = eps(2)
    terms = [0.0]
    # j = 2: gamma^2 C(n,2) min{4(e^{eps(2)} - 1), 2 e^{eps(2)}}
    two = min(math.log(4) + math.log(math.expm1(e2)), math.log(2) + e2)
    terms.append(2 * math.log(g) + math.log(n * (n - 1) / 2) + two)
    diffs = _wor_even_differences(s, (n + 1) // 2) if n <= WOR_DIFFERENCE_ORDERS else None
    log_g = math.log(g)
    for j in range(3, n + 1):
        log_binom = float(
            special.gammaln(n + 1) - special.gammaln(j + 1) - special.gammaln(n - j + 1)
        )
        general = math.log(2) + (j - 1) * eps(j)
        if diffs is not None:
            forward = math.log(4) + 0.5 * (diffs[j // 2] + diffs[(j + 1) // 2])
            general = min(general, forward)
        terms.append(j * log_g + log_binom + general)
    return float(special.logsumexp(terms))


#: Integer orders of the fast DP-SGD path (`sgm_epsilon`): every order up to 64, then
#: a sparse tail; the fractional optimum is then found between the best one's neighbours.
SGM_INTEGER_ORDERS: tuple[int, ...] = (
    *range(2, 65), 72, 80, 96, 112, 128, 160, 192, 256, 384, 512, 1024,
)


@functools.lru_cache(maxsize=8)
def _binomial_layout(orders: tuple[int, ...]) -> tuple[Array, Array, Array, npt.NDArray[np.intp]]:
    """Flattened (n, k, ln C(n, k)) for k = 0..n of every order n, and segment starts."""
    n = np.concatenate([np.full(o + 1, o, dtype=np.float64) for o in orders])
    k = np.concatenate([np.arange(o + 1, dtype=np.float64) for o in orders])
    log_binom = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
    starts = np.cumsum([0] + [o + 1 for o in orders[:-1]]).astype(np.intp)
    return n, k, log_binom, starts


def _sgm_integer_rdp(q: float, sigma: float, orders: tuple[int, ...]) -> Array:
    """RDP of the Poisson-subsampled Gaussian at integer ``orders``, in one pass.

    The binomial expansion of Mironov, Talwar and Zhang 2019, Sec. 3.3 (the same sum as
    `subsampled_gaussian_rdp` at an integer order), vectorised over all orders with a
    segmented log-sum-exp, and rounded up like every RDP value here.
    """
    a = np.asarray(orders, dtype=np.float64)
    if q >= 1:
        values = a / (2 * sigma * sigma)
    else:
        n, k, log_binom, starts = _binomial_layout(orders)
        terms = log_binom + (n - k) * math.log1p(-q) + k * math.log(q) + (
            (k * k - k) / (2 * sigma * sigma)
        )
        peak = np.maximum.reduceat(terms, starts)
        sizes = np.diff(np.append(starts, terms.size))
        total = np.add.reduceat(np.exp(terms - np.repeat(peak, sizes)), starts)
        values = np.maximum(peak + np.log(total), 0.0) / (a - 1)
    if np.isnan(values).any():
        raise InvalidCostError("rdp", "NaN", "computation produced NaN")
    pushed = np.nextafter(values * (1 + _REL) + 1e-300, np.inf)
    return np.asarray(pushed, dtype=np.float64)


def sgm_epsilon(
    rate: Any, noise_multiplier: Any, steps: int, delta: Any, *, refine: bool = True
) -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussians by RDP, fast (DP-SGD's case).

    The same bound as minimising over every order, found with far fewer evaluations:
    all integer orders of `SGM_INTEGER_ORDERS` in one vectorised pass, then a continuous
    search of the fractional orders between the best integer order's neighbours (by
    quadrature, as `subsampled_gaussian_rdp`). Every order gives a valid bound
    (composition: Mironov 2017, Prop. 1; conversion: Canonne, Kamath and Steinke 2020,
    Prop. 12), so the search can only affect how tight the result is, never whether it
    holds. Rounded up.

    ``refine=False`` skips the fractional search (a valid, slightly larger bound, in
    well under a millisecond: what calibration tries first).

    Examples:
        >>> 2.59 < sgm_epsilon(256 / 60000, 1.1, 14063, 1e-5) < 2.60
        True
    """
    q = float_up(check_rate(rate, "sampling_rate"))
    sigma = float_down(check_positive(noise_multiplier, "noise_multiplier"))
    d = float(check_float_delta(check_delta(delta, "target_delta")))
    if d <= 0:
        raise InvalidCostError("target_delta", delta, "must be > 0 for RDP")
    orders = SGM_INTEGER_ORDERS
    a = np.asarray(orders, dtype=np.float64)
    integer_rdp = steps * _sgm_integer_rdp(q, sigma, orders)
    if integer_rdp[0] < 40 * -math.log1p(-d * d):
        # Total variation against KL (see `_conversion`) at the smallest order of the
        # full grid: RDP there bounds KL; epsilon = 0 when it is small against delta.
        low_order = DEFAULT_ORDERS[0]
        if _conversion(np.array([steps * subsampled_gaussian_rdp(q, sigma, low_order)]),
                       np.array([low_order]), d)[0] == 0:
            return 0.0
    eps = _conversion(integer_rdp, a, d)
    i = int(np.argmin(eps))
    best = _round_eps(float(eps[i]))
    lo = float(a[i - 1]) if i > 0 else 1.0 + 1e-6
    hi = float(a[min(i + 1, a.size - 1)])
    if best == 0 or hi <= lo or not refine:
        return best

    def objective(alpha: float) -> float:
        rdp = steps * subsampled_gaussian_rdp(q, sigma, alpha)
        return float(_conversion(np.array([rdp]), np.array([alpha]), d)[0])

    return min(best, _round_eps(objective(_minimize_bounded(objective, lo, hi, 1e-3))))


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


@functools.lru_cache(maxsize=1024)
def _atom_vector(
    atom: Atom, orders: tuple[float, ...], relation: Relation
) -> npt.NDArray[np.object_]:
    """The charge's RDP at each order, as exact integers in units of 2^-52, rounded up.

    Long grids (a declared plan's) interpolate the subsampled Gaussian's fractional
    orders; the filter's short grid evaluates each of them exactly.
    """
    return _as_units(_atom_values(atom, orders, relation, interpolate=len(orders) > 64))


#: Charges whose RDP `_atom_values` evaluates in one vectorised pass at any orders.
_CLOSED_FORMS = frozenset({GaussianCharge, LaplaceCharge})


@functools.lru_cache(maxsize=1024)
def _atom_floats(atom: Atom, orders: tuple[float, ...], relation: Relation) -> Array:
    """The charge's RDP at each order as floats, rounded up (a declared plan's grid)."""
    values = _atom_values(atom, orders, relation, interpolate=len(orders) > 64)
    values.setflags(write=False)
    return values


def _as_units(values: Array) -> npt.NDArray[np.object_]:
    """Floats rounded up to exact integers in units of 2^-52 (the scaling is exact)."""
    if not np.all(np.isfinite(values)):
        raise InvalidCostError("rdp", "inf", "a Renyi divergence is unbounded at some order")
    return np.array([int(v) for v in np.ceil(values * float(_SCALE)).tolist()], dtype=object)


def _atom_values(
    atom: Atom, orders: tuple[float, ...], relation: Relation, *, interpolate: bool = True
) -> Array:
    """The charge's RDP at each order (floats, rounded up), vectorised where cheap.

    Plain Gaussians (alpha rho) are evaluated in one pass. For the Poisson-subsampled
    Gaussian the integer orders come from the vectorised binomial sum, and a fractional
    order between two integers n < alpha < n + 1 takes the linear interpolation of the
    cumulant (alpha - 1) RDP(alpha), which is convex in alpha (log-convexity of the
    moments E_Q[(P/Q)^alpha], Hoelder's inequality; a supremum over neighbouring pairs of
    convex functions is convex), so the interpolation of upper bounds is an upper bound
    (as Wang, Balle and Kasiviswanathan 2019, Cor. 10); below 2 it interpolates from
    0 at alpha = 1. Exact fractional values are used only where the optimum lies
    (`_refined_plan_epsilon`). Every other charge is evaluated order by order.
    """
    a = np.asarray(orders, dtype=np.float64)
    if type(atom) is GaussianCharge:
        rho = float_up(atom.sensitivity**2 / (2 * atom.sigma**2))
        return np.nextafter(a * rho * (1 + _REL) + 1e-300, np.inf)
    if type(atom) is LaplaceCharge:
        inv = float_up(atom.sensitivity / atom.scale)
        with np.errstate(over="ignore"):
            value = np.logaddexp(
                np.log(a / (2 * a - 1)) + (a - 1) * inv,
                np.log((a - 1) / (2 * a - 1)) - a * inv,
            ) / (a - 1)
        value = np.minimum(value, inv)
        return np.nextafter(np.maximum(value, 0.0) * (1 + _REL) + 1e-300, np.inf)
    if (
        interpolate
        and type(atom) is Subsampled
        and type(atom.charge) is GaussianCharge
        and atom.scheme is Scheme.POISSON
        and relation is Relation.ADD_REMOVE
        and atom.rate < 1
    ):
        inner = atom.charge
        q = float_up(atom.rate)
        sigma = float_down(check_positive(inner.sigma / inner.sensitivity, "noise_multiplier"))
        low = np.floor(a).astype(np.int64)
        high = np.ceil(a).astype(np.int64)
        needed = tuple(sorted({int(n) for n in np.concatenate((low, high)) if n >= 2}))
        at = dict(zip(needed, _sgm_integer_rdp(q, sigma, needed).tolist(), strict=True))
        cumulant = {n: (n - 1) * r for n, r in at.items()} | {1: 0.0}  # K(n), K(1) = 0
        k_low = np.array([cumulant[int(n)] for n in low])
        k_high = np.array([cumulant[int(n)] for n in high])
        frac = a - low
        values = np.where(frac == 0, k_low / (a - 1),
                          ((1 - frac) * k_low + frac * k_high) / (a - 1))
        return np.nextafter(np.maximum(values, 0.0) * (1 + _REL) + 1e-300, np.inf)
    return np.array([charge_rdp(atom, float(x), relation=relation) for x in a])


#: Fixed-point scale of the RDP running sums (exact integer sums: charging k times and
#: charging Repeated(c, k) once give identical states).
_SCALE = 2**52
#: The largest Renyi sum (units of 2^-52) an order limit takes: past it a sum is no
#: longer a finite float (a limit of this much admits at most this much).
_MAX_UNITS = 2**1023
#: How many budgets a filter keeps its limits for.
_BUDGET_CACHE = 16
#: The bit pattern of +inf: non-negative floats are ordered as their bit patterns.
_INF_BITS = struct.unpack("<q", struct.pack("<d", math.inf))[0]


def _float_of_bits(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value


def charge_rdp(atom: Atom, alpha: float, *, relation: Relation = Relation.ADD_REMOVE) -> float:
    """The RDP at order ``alpha`` of one run of a charge.

    Gaussian, Laplace, the discrete Gaussian (`discrete_gaussian_rdp()`),
    Poisson-subsampled Gaussian (add/remove) and without-replacement-subsampled
    Gaussian (substitution) have their own bounds; a pure
    epsilon-DP charge has RDP at most min(eps, alpha eps^2 / 2) (Bun and
    Steinke 2016, Prop. 1.4). Other charges (delta > 0 and no noise description) have no
    RDP bound.

    Raises:
        UnsupportedChargeError: For a charge with no RDP bound or the wrong relation.
    """
    a = _check_order(alpha)
    if isinstance(atom, Subsampled):
        if SCHEME_RELATION[atom.scheme] is not relation:
            raise UnsupportedChargeError(
                f"a {atom.scheme.value}-subsampled charge is proven for "
                f"{atom.relation.value} neighbours, not {relation.value}"
            )
        inner = atom.charge
        if isinstance(inner, GaussianCharge):
            s = inner.sigma / inner.sensitivity
            if atom.scheme is Scheme.POISSON:
                return subsampled_gaussian_rdp(atom.rate, s, a)
            return wor_subsampled_gaussian_rdp(atom.rate, s, a)
    if isinstance(atom, Parallel) and atom.relation is not relation:
        raise UnsupportedChargeError(
            f"a parallel charge stated for {atom.relation.value} neighbours cannot be "
            f"composed under {relation.value}"
        )
    if isinstance(atom, Parallel):
        return _parallel_rdp(atom, a)
    if isinstance(atom, GaussianCharge):
        return gaussian_rdp(atom.sigma, atom.sensitivity, a)
    if isinstance(atom, LaplaceCharge):
        return laplace_rdp(atom.scale, atom.sensitivity, a)
    if isinstance(atom, DiscreteGaussianCharge):
        return discrete_gaussian_rdp(atom.sigma, atom.sensitivity, a)
    if isinstance(atom, DiscreteLaplaceCharge) and atom.dimension == 1:
        return discrete_laplace_rdp(atom.scale, atom.sensitivity, a)
    if isinstance(atom, RandomizedResponseCharge):
        return randomized_response_rdp(atom.epsilon, atom.categories, a)
    if isinstance(atom, BoundedRangeCharge):
        return bounded_range_rdp(atom.epsilon, a)
    cost = cost_of(atom)
    if cost.delta == 0:
        e = float_up(cost.epsilon)
        return min(_push(min(e, a * e * e / 2)), randomized_response_rdp(cost.epsilon, 2, a))
    raise UnsupportedChargeError(
        f"{shown(atom)} has delta > 0 and no noise description, so no Renyi-DP bound; "
        "describe it as a GaussianCharge/LaplaceCharge or use another rule"
    )


def _parallel_rdp(charge: Parallel, alpha: float) -> float:
    """The RDP at order ``alpha`` of disjoint parts run with independent noise.

    The outputs are independent given the data, and the Renyi divergence of a product of
    independent pairs is the sum of the pairs' divergences (Mironov 2017, Prop. 1, in its
    non-adaptive form). Under add/remove a record is in one part, so one pair differs and
    the others are equal: the largest part's RDP. Under substitution a record changes
    within one part or moves between two, so at most two pairs differ, each covered by
    its part's bound (which `check_relations` makes hold for both relations): the sum of
    the two largest. A part given as `Repeated` counts as its count of runs. Each part's
    bound is taken under the parallel charge's relation; for the leaf charges that
    parallel parts are (noise on a query) the bound is the same under either.
    """
    values = []
    known: dict[int, float] = {}  # a part that occurs again is bounded once
    for part in charge.partitions:
        value = known.get(id(part))
        if value is None:
            runs = list(atoms(part))
            if len(runs) == 1 and runs[0][1] == 1:  # one run: its bound is rounded up
                value = charge_rdp(runs[0][0], alpha, relation=charge.relation)
            else:  # products and sums may round down: push the total up
                value = _push(math.fsum(
                    count * charge_rdp(inner, alpha, relation=charge.relation)
                    for inner, count in runs
                ))
            known[id(part)] = value
        values.append(value)
    values.sort(reverse=True)
    if charge.relation is Relation.ADD_REMOVE:
        return values[0]  # each value is already rounded up
    return _push(math.fsum(values[:2]))  # a sum of two may round down: push it up


def _target_delta(target_delta: Any, budget: Budget | None, name: str) -> Fraction:
    if target_delta is None:
        if budget is None:
            raise ConfigError(f"the {name} rule needs target_delta (or budget=)")
        target_delta = budget.delta
    return check_float_delta(check_delta(target_delta, "target_delta"))


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
        self.target_delta = _target_delta(target_delta, budget, self.name)
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
        if len(self._limits) >= _BUDGET_CACHE:
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


@attrs.frozen
class GDPState:
    """The exact running sum of mu_i^2 = (sensitivity_i / sigma_i)^2."""

    mu_squared: Fraction


class GDPFilterRule(Rule[GDPState]):
    """Gaussian-DP filter for adaptively chosen Gaussian mechanisms.

    Smith and Thakurta 2022 ("Fully adaptive composition for Gaussian differential
    privacy"), Thm 1.1: if each Gaussian's mu_t = Delta_t / sigma_t is chosen at run
    time and sum mu_t^2 <= mu^2 always, the interaction is mu-GDP. The sum is exact; the
    epsilon at ``target_delta`` is from the exact GDP profile (Balle and Wang 2018,
    Thm 8), rounded up. Only plain (not subsampled) continuous Gaussian charges are
    accepted: a `DiscreteGaussianCharge` is refused, because
    the discrete Gaussian is not mu-GDP with the continuous mu in general (at small
    sigma its privacy profile exceeds the continuous one) and no theorem gives it a
    Gaussian-DP filter; use the ``rdp`` rule for it.

    Examples:
        >>> from dpaccount.charges import GaussianCharge
        >>> rule = GDPFilterRule(target_delta="1e-5")
        >>> state = rule.add(rule.start(), GaussianCharge(sigma=10, sensitivity=1, epsilon=1), 100)
        >>> 4.37 < float(rule.total(state).epsilon) < 4.38   # mu = 1
        True
    """

    name = "gdp"
    adaptivity = Adaptivity.FULLY_ADAPTIVE
    spent_meaning = SpentMeaning.FILTER
    theorem = "Smith and Thakurta 2022, Thm 1.1 (fully adaptive Gaussian-DP filter)"
    order_free = True  # an exact sum of mu^2

    def __init__(
        self, target_delta: Any = None, *, budget: Budget | None = None, plan: Any = None
    ) -> None:
        self.target_delta = _target_delta(target_delta, budget, self.name)
        if self.target_delta == 0:
            raise ConfigError("the gdp rule needs target_delta > 0")
        #: (epsilon, delta) -> the limit on sum mu^2, for the last few budgets asked about.
        self._limit: dict[tuple[Fraction, Fraction], Fraction | None] = {}
        #: Each charge's mu^2, as `RDPRule` keeps its vectors.
        self._mu_squared = ByIdentity[Fraction]()

    def start(self) -> GDPState:
        return GDPState(Fraction(0))

    def add(self, state: GDPState, atom: Atom, count: int) -> GDPState:
        if not isinstance(atom, GaussianCharge):
            raise UnsupportedChargeError(
                f"the gdp filter composes plain Gaussian charges only, not {shown(atom)}"
            )
        mu_squared = self._mu_squared.get(atom, lambda: (atom.sensitivity / atom.sigma) ** 2)
        if count == 1:
            return GDPState(state.mu_squared + mu_squared)
        return GDPState(state.mu_squared + count * mu_squared)

    def total(self, state: GDPState) -> PrivacyCost:
        if state.mu_squared == 0:
            return trusted_cost(Fraction(0), Fraction(0))
        return trusted_cost(gdp_epsilon(state.mu_squared, self.target_delta), self.target_delta)

    def admits(self, state: GDPState, budget: Budget) -> bool:
        """Whether sum mu^2 is at most the budget's limit (`mu_squared_limit`)."""
        if state.mu_squared == 0:
            return True
        if budget.epsilon is None:
            return self.target_delta <= budget.delta
        limit = self.mu_squared_limit(budget.epsilon, budget.delta)
        return limit is not None and state.mu_squared <= limit

    def fits(self, mu_squared: float, epsilon: Fraction, delta: Fraction) -> bool:
        """The check at a float sum: mu = sqrt(sum mu^2), rounded up, and the rounded-up
        Gaussian profile delta(epsilon) at mu (Balle and Wang 2018, Thm 8) <= delta."""
        mu = Fraction(math.nextafter(math.sqrt(mu_squared), math.inf))
        try:
            return gaussian_delta_up(epsilon, mu) <= delta
        except (InvalidCostError, OverflowError, ZeroDivisionError):
            return False

    def mu_squared_limit(self, epsilon: Fraction, delta: Fraction) -> Fraction | None:
        """A float L with `fits` (L) true, found by bisection over the positive floats
        (None: not even the smallest fits).

        The filter stops before sum mu^2 would pass L, so the interaction is
        sqrt(L)-GDP (Smith and Thakurta 2022, Thm 1.1; fully adaptive), and
        (epsilon, delta)-DP because the exact profile is increasing in mu:
        delta_true(epsilon; sqrt(S)) <= delta_true(epsilon; mu(L)) <=
        gaussian_delta_up(epsilon, mu(L)) <= delta. A float sum x is at most L exactly
        when the exact sum rounded up is, so this is the per-charge check at every sum up
        to L; the search finds the largest such L wherever the rounded profile is
        non-decreasing in mu (tested against it, and against the exact profile).
        """
        if (epsilon, delta) in self._limit:
            return self._limit[epsilon, delta]
        limit: Fraction | None = None
        if self.fits(_float_of_bits(1), epsilon, delta):  # the smallest positive float
            lo, hi = 1, _INF_BITS  # float bit patterns: lo fits, hi does not (inf)
            while hi - lo > 1:
                middle = (lo + hi) // 2
                if self.fits(_float_of_bits(middle), epsilon, delta):
                    lo = middle
                else:
                    hi = middle
            limit = Fraction(_float_of_bits(lo))
        if len(self._limit) >= _BUDGET_CACHE:
            self._limit.clear()
        self._limit[epsilon, delta] = limit
        return limit

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "target_delta": str(self.target_delta)}


def gdp_epsilon(mu_squared: Fraction, delta: Fraction) -> Fraction:
    """The smallest epsilon (up to 1e-9 relative) with delta_mu(epsilon) <= delta.

    Bisection on the exact Gaussian profile (Balle and Wang 2018, Thm 8; Dong, Roth and
    Su 2019, Cor. 2.13), each step checked with the rounded-up profile, so the result is
    certified.

    Examples:
        >>> 91.81 < float(gdp_epsilon(Fraction(100), Fraction(1, 10**5))) < 91.83
        True
    """
    mu = Fraction(math.nextafter(math.sqrt(float_up(mu_squared)), math.inf))
    lo, hi = Fraction(0), Fraction(1)
    if gaussian_delta_up(lo, mu) <= delta:
        return lo
    while gaussian_delta_up(hi, mu) > delta:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = Fraction(float((lo + hi) / 2))
        if mid <= lo or mid >= hi:
            break
        if gaussian_delta_up(mid, mu) <= delta:
            hi = mid
        else:
            lo = mid
    return hi
