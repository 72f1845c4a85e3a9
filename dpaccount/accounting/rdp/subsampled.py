"""Renyi moments of the subsampled Gaussian, and the fast epsilon of DP-SGD.

* Poisson subsampling, add/remove neighbours: Mironov, Talwar and Zhang 2019 ("Renyi
  differential privacy of the sampled Gaussian mechanism"), Sec. 3.3: the exact
  A_alpha = E_{z ~ N(0, s^2)} [((1-q) + q e^{(2z-1)/(2 s^2)})^alpha], by the binomial
  expansion at integer orders (also vectorised over many orders, `_sgm_integer_rdp`)
  and by quadrature at fractional ones;
* sampling without replacement, substitution neighbours: Wang, Balle and
  Kasiviswanathan 2019 ("Subsampled Renyi differential privacy and analytical moments
  accountant", AISTATS), Thm 27 of arXiv:1808.00087 (the Gaussian-specific form with
  forward differences) up to order `WOR_DIFFERENCE_ORDERS` and Thm 9 above, at integer
  orders; a fractional order interpolates the convex cumulant between its integer
  neighbours (their Cor. 10).

`sgm_epsilon` is steps of the Poisson-subsampled Gaussian converted to (epsilon, delta)
with few evaluations (DP-SGD's case).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special

from dpaccount._numeric import (
    check_delta,
    check_float_delta,
    check_positive,
    check_rate,
    float_down,
    float_up,
)
from dpaccount.accounting.rdp.conversion import _conversion, _round_eps
from dpaccount.accounting.rdp.orders import (
    _REL,
    DEFAULT_ORDERS,
    Array,
    _check_order,
    _minimize_bounded,
    _push,
)
from dpaccount.errors import InvalidCostError

__all__ = [
    "SGM_INTEGER_ORDERS",
    "WOR_DIFFERENCE_ORDERS",
    "sgm_epsilon",
    "subsampled_gaussian_rdp",
    "wor_subsampled_gaussian_rdp",
]


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
