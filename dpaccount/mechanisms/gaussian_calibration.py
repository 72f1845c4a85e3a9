"""How much Gaussian noise: the continuous calibrations and the discrete profile.

`continuous_sigma` gives the continuous Gaussian mechanism's sigma under each of the
`CALIBRATIONS` (Balle and Wang 2018, Thm 8; Dwork and Roth 2014, Thm A.1; the Chernoff
and Mills-ratio tail bounds); `discrete_gaussian_delta_up` bounds the exact privacy
profile of the one-dimensional discrete Gaussian (Canonne, Kamath and Steinke 2020,
Thm 7) with rigorous tail bounds, and `zcdp_delta_up` converts rho-zCDP to (epsilon,
delta) (CKS 2020, Cor. 13). Every bound is rounded toward more privacy loss.
`dpaccount.mechanisms.gaussian` (whose docstring states the theorems) and
`dpaccount.mechanisms.integer` calibrate their samplers with them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy import special

from dpaccount._numeric import float_down, float_up, gaussian_delta_up, up
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = [
    "CALIBRATIONS",
    "continuous_sigma",
    "discrete_gaussian_delta_up",
    "zcdp_delta_up",
]

CALIBRATIONS = ("analytic", "classic", "chernoff", "mills")

#: Exact partial sums are used up to this many terms; beyond, integral sandwich bounds.
_MAX_TERMS = 2_000_000
#: Terms beyond 14 s_σ weigh less than exp(-98) relative to the mode.
_TAIL_SIGMAS = 14.0
_SQRT_2PI = math.sqrt(2.0 * math.pi)


# ---------------------------------------------------------------------------------------
# Rigorous tail bounds of the one-dimensional discrete Gaussian
# ---------------------------------------------------------------------------------------


class _Tails:
    """Upper and lower bounds on G(m) = P[Y >= m], m >= 1, for Y ~ N_Z(0, sigma2)."""

    def __init__(self, sigma2: float) -> None:
        self.sigma2 = sigma2
        self.sigma = math.sqrt(sigma2)
        k_max = math.ceil(_TAIL_SIGMAS * self.sigma) + 2
        self.exact = k_max <= _MAX_TERMS
        if self.exact:
            k = np.arange(k_max + 1, dtype=np.float64)
            f = np.exp(-(k * k) / (2.0 * sigma2))
            # suffix[m] = sum_{k >= m}^{k_max} f(k), computed by a reversed cumsum.
            self.suffix = np.cumsum(f[::-1])[::-1]
            self.k_max = k_max
            # Per-term relative error (exp of an argument <= 98 in size: ~1e-14) plus
            # the cumulative-sum rounding (<= n ulps), in the safe direction.
            self.rel = 1e-13 + (k_max + 8) * 2.3e-16
            beyond = self._integral_from(float(k_max))  # >= sum_{k > k_max} f(k)
            self.beyond = beyond * (1 + 1e-12)
            t1 = float(self.suffix[1])
            self.z_lo = 1.0 + 2.0 * t1 * (1 - self.rel)
            self.z_hi = 1.0 + 2.0 * (t1 * (1 + self.rel) + self.beyond)
        else:
            self.z_lo = (1.0 + 2.0 * self._integral_from(1.0)) * (1 - 1e-12)
            self.z_hi = (1.0 + 2.0 * self._integral_from(0.0)) * (1 + 1e-12)

    def _integral_from(self, x: float) -> float:
        # int_x^inf exp(-t²/(2 sigma2)) dt = sigma sqrt(2 pi) Q(x / sigma)
        return self.sigma * _SQRT_2PI * float(special.ndtr(-x / self.sigma))

    def _t_bounds(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bounds on T(m) = sum_{k >= m} f(k) for integer m >= 1 (vectorised)."""
        if self.exact:
            inside = m <= self.k_max
            idx = np.minimum(m, self.k_max).astype(np.int64)
            s = self.suffix[idx]
            lo = np.where(inside, s * (1 - self.rel), 0.0)
            hi = np.where(inside, s * (1 + self.rel) + self.beyond, 0.0)
            # Far tail (m > k_max): integral sandwich.
            far = ~inside
            if np.any(far):
                mf = m[far].astype(np.float64)
                q_lo = np.array([self._integral_from(x) for x in mf])
                q_hi = np.array([self._integral_from(x - 1.0) for x in mf])
                lo[far] = q_lo * (1 - 1e-12)
                hi[far] = q_hi * (1 + 1e-12)
            return lo, hi
        mf = m.astype(np.float64)
        # f decreasing on [m - 1, inf): int_m^inf f <= T(m) <= int_{m-1}^inf f.
        lo = self.sigma * _SQRT_2PI * special.ndtr(-mf / self.sigma) * (1 - 1e-12)
        hi = self.sigma * _SQRT_2PI * special.ndtr(-(mf - 1.0) / self.sigma) * (1 + 1e-12)
        return lo, hi

    def at_least(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bounds (lo, hi) on P[Y >= m] for integer m (vectorised)."""
        pos = m >= 1
        mm = np.where(pos, m, 1 - m)  # for m <= 0: P[Y >= m] = 1 - P[Y >= 1 - m]
        t_lo, t_hi = self._t_bounds(mm)
        g_lo = t_lo / self.z_hi
        g_hi = np.minimum(t_hi / self.z_lo, 1.0)
        lo = np.where(pos, g_lo, 1.0 - g_hi)
        hi = np.where(pos, g_hi, 1.0 - g_lo)
        return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def discrete_gaussian_delta_up(epsilon: Fraction, sigma2: float, shift: int) -> Fraction:
    """An upper bound on delta(epsilon) of the 1-D discrete Gaussian, all shifts <= ``shift``.

    Canonne, Kamath and Steinke 2020, Thm 7: for an integer-valued query of sensitivity
    s, adding Y ~ N_Z(0, sigma2) is (eps, delta_s)-DP with
    delta_s = P[Y > eps sigma2 / s - s/2] - e^eps P[Y > eps sigma2 / s + s/2], and this is
    tight. Every integer shift 1..``shift`` is evaluated and the maximum returned, with
    the first probability bounded above, the second below, and thresholds nudged in the
    safe direction.

    Args:
        epsilon: The point of the privacy profile, >= 0.
        sigma2: The discrete Gaussian's parameter (lattice units), > 0.
        shift: The largest integer shift (the lattice sensitivity), >= 1.

    Examples:
        >>> d = discrete_gaussian_delta_up(Fraction(1), 400.0, 20)   # s_σ/shift = 1
        >>> 0.126 < float(d) < 0.128    # continuous Balle-Wang delta(1) at mu=1: 0.1269
        True
    """
    tails = _Tails(sigma2)
    s = np.arange(1, shift + 1, dtype=np.int64)
    sf = s.astype(np.float64)
    eps = float(epsilon)
    # The optimal event is {Y >= m} against {Y >= m + s} with m = floor(a) + 1,
    # a = eps sigma2 / s - s/2. Any other event gives a *smaller* value, so the exact m
    # must be among those tried: a is bracketed by [a_lo, a_hi] and both ends are used.
    a = float(epsilon) * sigma2 / sf - sf / 2
    pad = 1e-12 * (np.abs(a) + sf + 1.0)
    e_eps_lo = math.exp(float_down(epsilon)) * (1 - 1e-15) if eps < 700 else math.inf
    deltas = np.full(shift, -np.inf)
    for edge in (a - pad, a + pad):
        m = np.floor(edge).astype(np.int64) + 1
        _, p1_hi = tails.at_least(m)
        p2_lo, _ = tails.at_least(m + s)
        with np.errstate(invalid="ignore", over="ignore"):
            second = np.where(p2_lo > 0, e_eps_lo * p2_lo, 0.0)
        deltas = np.maximum(deltas, p1_hi - second)
    worst = float(np.max(deltas))
    if not math.isfinite(worst):
        raise InvalidCostError("epsilon", epsilon, "delta(epsilon) is not computable")
    return min(up(max(worst, 0.0) + 1e-300, ulps=8), Fraction(1))


def zcdp_delta_up(epsilon: Fraction, rho: float) -> Fraction:
    """An upper bound on delta(eps) of any rho-zCDP mechanism (CKS 2020 Cor. 13).

    delta = inf_{alpha > 1} exp((alpha - 1)(alpha rho - eps)) (1 - 1/alpha)^(alpha - 1) / alpha;
    any alpha gives a valid bound, so an approximately optimal alpha is used and the
    value there is rounded up.

    Examples:
        >>> 0 < float(zcdp_delta_up(Fraction(1), 0.05)) < 1e-2
        True
    """
    eps = float_down(epsilon)

    def log_delta(alpha: float) -> float:
        return (
            (alpha - 1.0) * (alpha * rho - eps)
            + (alpha - 1.0) * math.log1p(-1.0 / alpha)
            - math.log(alpha)
        )

    # The exponent is convex-ish in alpha; golden-section search on a log grid start.
    grid = [1.0 + 10.0 ** (k / 8.0) for k in range(-48, 49)]
    best = min(grid, key=log_delta)
    lo, hi = max(1.0 + 1e-9, best / 1.5), best * 1.5
    for _ in range(80):
        m1 = lo + (hi - lo) * 0.382
        m2 = lo + (hi - lo) * 0.618
        if log_delta(m1) < log_delta(m2):
            hi = m2
        else:
            lo = m1
    alpha = (lo + hi) / 2.0
    value = log_delta(alpha)
    # log_delta uses ~6 float operations on inputs rounded in the safe direction; pad it.
    bound = math.exp(value + 1e-12 * (1.0 + abs(value)))
    return min(up(bound + 1e-300, ulps=8), Fraction(1))


# ---------------------------------------------------------------------------------------
# Continuous calibrations (used as the starting point)
# ---------------------------------------------------------------------------------------


def _analytic_sigma(epsilon: Fraction, delta: Fraction, sensitivity: Fraction) -> float:
    """Balle-Wang 2018 Thm 8: smallest sigma with delta(eps) <= delta (bisection)."""

    def ok(sig: float) -> bool:
        return gaussian_delta_up(epsilon, sensitivity / Fraction(sig)) <= delta

    hi = float(sensitivity)
    while not ok(hi):
        hi *= 2.0
    lo = hi / 2.0
    while ok(lo) and lo > 1e-300:
        hi, lo = lo, lo / 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _quadratic_sigma(epsilon: Fraction, t: float, sensitivity: Fraction) -> float:
    """Smallest sigma with eps sigma/Δ - Δ/(2 sigma) >= t, rounded up.

    The root of the quadratic: sigma = Δ (t + sqrt(t² + 2 eps)) / (2 eps).
    """
    eps_lo = float_down(epsilon)
    t_hi = math.nextafter(t, math.inf)
    root = math.nextafter(math.sqrt(t_hi * t_hi * (1 + 1e-15) + 2.0 * float_up(epsilon)), math.inf)
    u = (t_hi + root) / (2.0 * eps_lo) * (1 + 1e-14)
    return float(float_up(Fraction(u) * sensitivity)) * (1 + 1e-15)


def continuous_sigma(
    calibration: str, epsilon: Fraction, delta: Fraction, sensitivity: Fraction
) -> float:
    """sigma for the continuous Gaussian mechanism under the named calibration.

    Raises:
        ConfigError: An unknown calibration.
        InvalidCostError: Parameters outside the calibration's theorem.
    """
    if calibration == "analytic":
        return _analytic_sigma(epsilon, delta, sensitivity)
    if calibration == "classic":
        if epsilon >= 1:
            raise InvalidCostError(
                "epsilon",
                epsilon,
                "the classic calibration (Dwork and Roth 2014, Thm A.1) is proven only "
                "for epsilon < 1; use calibration='analytic'",
            )
        c = math.sqrt(2.0 * math.log(1.25 / float_down(delta)))
        c = math.nextafter(c * (1 + 1e-14), math.inf)  # strictly c² > 2 ln(1.25/δ)
        return float(float_up(Fraction(c) * sensitivity / epsilon)) * (1 + 1e-15)
    if calibration == "chernoff":
        t = math.sqrt(2.0 * math.log(1.0 / float_down(delta))) * (1 + 1e-14)
        return _quadratic_sigma(epsilon, t, sensitivity)
    if calibration == "mills":
        inner = math.log(1.0 / (2.0 * math.pi * float_down(delta) ** 2))
        t = max(1.0, math.sqrt(max(inner, 0.0)) * (1 + 1e-14))
        return _quadratic_sigma(epsilon, t, sensitivity)
    raise ConfigError(
        f"unknown calibration {calibration!r}; choose one of {', '.join(CALIBRATIONS)}"
    )


# ---------------------------------------------------------------------------------------
# The sampler's parameter
# ---------------------------------------------------------------------------------------


def _coarse_up(x: float) -> float:
    """The smallest float >= x with at most 26 significant bits (its square is exact).

    Examples:
        >>> _coarse_up(1.0), _coarse_up(3.0) ** 2
        (1.0, 9.0)
        >>> y = _coarse_up(math.pi); y >= math.pi and (y * y) == float(Fraction(y) ** 2)
        True
    """
    mantissa, exponent = math.frexp(x)
    return math.ldexp(math.ceil(math.ldexp(mantissa, 26)), exponent - 26)

