"""Dominating pairs of the lattice mechanisms: integer shifts of integer noise.

The discrete Gaussian and the discrete Laplace of our own samplers, with an integer
shift S (the sensitivity in lattice steps): the noise is symmetric and log-concave, so
the privacy loss is non-decreasing in the output and the profile is attained on an
upper set, which `_IntegerShiftPair` evaluates with rigorous bounds on the tail sums.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpaccount.accounting.pld.pairs import Array, _z

__all__ = ["MAX_DISCRETE_TERMS", "DiscreteGaussianPair", "DiscreteLaplacePair"]

_U = 2.0**-53
#: Largest number of pmf terms summed exactly for one discrete Gaussian (beyond it the
#: engine falls back to the charge's (epsilon, delta) pair).
MAX_DISCRETE_TERMS = 2_000_000
#: Terms of N_Z(0, s^2) beyond 14 s weigh less than exp(-98) relative to the mode.
_TAIL_SIGMAS = 14.0


class _IntegerShiftPair:
    """(law of Y + S, law of Y) for symmetric, log-concave integer noise Y, integer S >= 1.

    The privacy loss L(y) = ln(P[Y = y - S] / P[Y = y]) is non-decreasing in the output
    y (log-concavity), so the hockey-stick divergence is attained on an upper set
    {y >= m}: delta(eps) = max_m G(m - S) - e^eps G(m) with G(m) = P[Y >= m], and
    ``{y > c(eps)}`` (c from `_threshold()`) is the optimal set. Any set gives a
    value <= delta(eps), so `profile()` evaluates m = floor(c) + 1 and its two
    neighbours (covering float error in c), the empty set and the whole set, each with
    rigorous upper bounds on G(m - S) and lower bounds on G(m), and returns their
    maximum: an upper bound on delta(eps).

    Shift S dominates every integer shift 0 < s <= S (and, by symmetry, -S <= s < 0):
    the optimal tests of (Y + s, Y) are the randomised thresholds at the same levels
    alpha_m = G(m) for every s, with type-II error 1 - G(m - s) >= 1 - G(m - S), so the
    trade-off function of shift S lies below that of shift s at every knot and hence
    everywhere (both are linear between knots; Dong, Roth and Su 2019, Def. 2.3).
    P and Q swap under the reflection y -> S - y, so the pair is symmetric (add and
    remove give the same PLD).
    """

    infinity_mass = 0.0

    def __init__(self, shift: int) -> None:
        self.shift = shift

    def _bounds(self, m: Array) -> tuple[Array, Array]:
        """Rigorous (lower, upper) bounds on G(m) = P[Y >= m] for integer-valued m."""
        raise NotImplementedError

    def _threshold(self, eps: Array) -> Array:
        """c with L(y) > eps iff y > c (up to float error in c)."""
        raise NotImplementedError

    def profile(self, eps: Array) -> Array:
        eps = np.asarray(eps, dtype=np.float64)
        m0 = np.floor(self._threshold(eps)) + 1.0
        ex_low = np.exp(np.minimum(eps, 700.0)) * (1 - 4 * _U)
        whole = -np.expm1(np.minimum(eps, 0.0)) * (1 + 4 * _U)  # the set of all outputs
        best = np.maximum(whole, 0.0)  # the empty set gives 0
        for step in (-1.0, 0.0, 1.0):
            m = m0 + step
            g_lo, _unused = self._bounds(m)
            _unused2, g_hi = self._bounds(m - self.shift)
            value = (g_hi - ex_low * g_lo) * (1 + 4 * _U)
            best = np.maximum(best, value)
        return np.asarray(np.clip(best, 0.0, 1.0), dtype=np.float64)

    def sf(self, t: Array) -> Array:
        t = np.asarray(t, dtype=np.float64)
        c = self._threshold(t)
        m = np.ceil(c)  # L(y) >= t iff y >= ceil(c), up to ties on atoms
        lo, hi = self._bounds(m - self.shift)
        return np.asarray((lo + hi) / 2, dtype=np.float64)


class DiscreteGaussianPair(_IntegerShiftPair):
    """(N_Z(S, s^2), N_Z(0, s^2)): the scalar discrete Gaussian with integer shift S.

    The loss is L(y) = (2 S y - S^2) / (2 s^2), so under P it takes the values
    S^2 / (2 s^2) + (S / s^2) k, k in Z, with the masses of N_Z(0, s^2) (Canonne, Kamath
    and Steinke 2020, Thm 7 gives the same profile). G is computed from exact suffix
    sums of exp(-k^2 / (2 s^2)) over 0 <= k <= K = ceil(14 s) + 2, with rigorous error
    bounds: each term within a relative 1e-12 (exp and the float parameter s^2), each
    suffix of n terms within a relative n u (recursive summation of positive terms;
    Higham 2002, Lemma 3.1), and the terms beyond K bounded by the integral
    s sqrt(pi/2) erfc(K / (s sqrt 2)) (the terms decrease).
    """

    def __init__(self, sigma2: float, shift: int) -> None:
        super().__init__(shift)
        self.sigma2 = sigma2
        self.sigma = math.sqrt(sigma2)
        k_max = math.ceil(_TAIL_SIGMAS * self.sigma) + 2
        if k_max > MAX_DISCRETE_TERMS:
            raise ValueError("sigma too large for exact discrete Gaussian sums")
        self.k_max = k_max
        k = np.arange(k_max + 1, dtype=np.float64)
        terms = np.exp(-(k * k) / (2.0 * sigma2))
        suffix = np.cumsum(terms[::-1])[::-1]
        self._suffix = np.append(suffix, 0.0)  # index k_max + 1: the empty suffix
        self._count = np.append(k_max + 1 - k, 0.0)  # terms in each suffix
        arg = k_max / (self.sigma * math.sqrt(2.0))
        self._beyond = 2.0 * self.sigma * math.sqrt(math.pi / 2) * float(special.erfc(arg))
        self._beyond += 1e-300
        t1 = float(self._suffix[1])
        rel1 = 1e-12 + (k_max + 4) * 1.01 * _U
        self._z_lo = (1.0 + 2.0 * t1 * (1 - rel1)) * (1 - 4 * _U)
        self._z_hi = (1.0 + 2.0 * (t1 * (1 + rel1) + self._beyond)) * (1 + 4 * _U)

    def _bounds(self, m: Array) -> tuple[Array, Array]:
        positive = m >= 1
        k = np.where(positive, m, 1.0 - m)  # G(m) = 1 - G(1 - m) for m <= 0
        idx = np.minimum(k, float(self.k_max + 1)).astype(np.int64)
        t = self._suffix[idx]
        rel = 1e-12 + (self._count[idx] + 4) * 1.01 * _U
        g_lo = t * (1 - rel) / self._z_hi * (1 - 4 * _U)
        g_hi = (t * (1 + rel) + self._beyond) / self._z_lo * (1 + 4 * _U)
        lo = np.where(positive, g_lo, (1.0 - g_hi) * (1 - 2 * _U))
        hi = np.where(positive, g_hi, (1.0 - g_lo) * (1 + 2 * _U))
        return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)

    def _threshold(self, eps: Array) -> Array:
        return np.asarray(eps * self.sigma2 / self.shift + self.shift / 2, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        z = _z(tail)
        half = (z * self.sigma + 1.0) * self.shift / self.sigma2
        centre = self.shift * self.shift / (2.0 * self.sigma2)
        return centre - half, centre + half


class DiscreteLaplacePair(_IntegerShiftPair):
    """(DLap(S, b), DLap(0, b)): the scalar discrete Laplace with integer shift S.

    P[Y = y] = (1 - q) / (1 + q) q^|y| with q = e^{-1/b}, so G(m) = q^m / (1 + q) for
    m >= 1 (and 1 - G(1 - m) for m <= 0). The loss (|y| - |y - S|) / b lies on
    {(2j - S) / b : j = 0..S}, with atoms at -S/b and S/b (Ghosh, Roughgarden and
    Sundararajan 2009 for the distribution). Each G is within a relative
    (|m| / b + 8) 2u of its float value (one rounding in 1/b scaled by m, exp and a
    division).
    """

    def __init__(self, scale: float, shift: int) -> None:
        super().__init__(shift)
        self.scale = scale
        self._inv = 1.0 / scale
        self._one_plus_q = 1.0 + math.exp(-self._inv)
        # The largest loss S / b, rounded up: above it the profile is exactly 0.
        self.e0 = math.nextafter(shift / scale, math.inf)

    def profile(self, eps: Array) -> Array:
        eps = np.asarray(eps, dtype=np.float64)
        return np.asarray(np.where(eps >= self.e0, 0.0, super().profile(eps)), dtype=np.float64)

    def _bounds(self, m: Array) -> tuple[Array, Array]:
        positive = m >= 1
        k = np.where(positive, m, 1.0 - m)
        g = np.exp(-k * self._inv) / self._one_plus_q
        rel = (k * self._inv + 8.0) * 2 * _U + 1e-15
        g_lo = g * (1 - rel)
        g_hi = g * (1 + rel) + 1e-300
        lo = np.where(positive, g_lo, (1.0 - g_hi) * (1 - 2 * _U))
        hi = np.where(positive, g_hi, (1.0 - g_lo) * (1 + 2 * _U))
        return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)

    def _threshold(self, eps: Array) -> Array:
        return np.asarray((eps * self.scale + self.shift) / 2, dtype=np.float64)

    def sf(self, t: Array) -> Array:
        t = np.asarray(t, dtype=np.float64)
        inside = super().sf(np.clip(t, -self.e0, self.e0))
        out = np.where(t <= -self.e0, 1.0, np.where(t > self.e0, 0.0, inside))
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        return -self.e0, self.e0
