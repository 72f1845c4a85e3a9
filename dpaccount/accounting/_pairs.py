"""Dominating pairs of the mechanisms the PLD engine knows, as privacy profiles.

Each pair (P, Q) is described by what the discretisations in `dpaccount.accounting.pld`
need, all vectorised over numpy arrays:

* ``profile(eps)``: the hockey-stick divergence delta(eps) = sup_S P(S) - e^eps Q(S)
  (the privacy profile; Balle and Wang 2018, Thm 5 / Zhu, Dong and Wang 2022, Def. 2);
* ``sf(t)``: P(L >= t) for the finite part of the privacy loss L = ln(P/Q) under P;
* ``infinity_mass``: P(L = +inf);
* ``loss_range(tail)``: an interval of losses outside which P has mass <= ``tail``.

The pairs are normalised (noise scale 1, shift = sensitivity / scale).
Subsampled pairs follow Zhu, Dong and Wang 2022 ("Optimal accounting of differential
privacy via characteristic function", AISTATS, arXiv:2106.08567): Poisson subsampling
under add/remove neighbours has the *remove* pair ((1-q) Q + q P, Q) and the *add* pair
(Q, (1-q) Q + q P). The direction is fixed for a whole composition (the added record is
the same in every step), so each direction is composed on its own and the larger result
reported.

Sampling without replacement under substitution is different: the two orders R =
((1-q) Q + q P, Q) and A = (Q, (1-q) Q + q P) are both realised by one pair of
neighbouring datasets (a query with f(x) = 1, f(x') = 0 gives R, its negation gives A),
and an analyst may pick the order afresh at every step. Composing R k times and A k times
and taking the larger is then *not* an upper bound (Lebeda, Regehr, Kamath and Steinke
2024, "Avoiding pitfalls for privacy accounting of subsampled mechanisms under
composition", arXiv:2405.20769, who show that the worst case of one step need not be the
worst case of a composition). `SymmetrisedPair` gives one pair that dominates
both orders: its privacy profile is the pointwise maximum of the two profiles.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import numpy.typing as npt
from scipy import special

Array = npt.NDArray[np.float64]

__all__ = [
    "MAX_DISCRETE_TERMS",
    "Array",
    "BoundedRangePair",
    "DiscreteGaussianPair",
    "DiscreteLaplacePair",
    "GaussianPair",
    "KaryRandomizedResponsePair",
    "LaplacePair",
    "Pair",
    "RandomizedResponsePair",
    "SubsampledGaussianPair",
    "SubsampledLaplacePair",
    "SymmetrisedPair",
    "UpperPair",
]


class UpperPair(Protocol):
    """What the pessimistic (connect-the-dots) discretisation needs: a privacy profile."""

    infinity_mass: float

    def profile(self, eps: Array) -> Array:
        """delta(eps), the hockey-stick divergence of the pair."""

    def loss_range(self, tail: float) -> tuple[float, float]:
        """Losses outside the returned interval have P-mass at most ``tail``."""


class Pair(UpperPair, Protocol):
    """What the PLD engine needs of a dominating pair (both discretisations)."""

    def sf(self, t: Array) -> Array:
        """P(L >= t) for the finite part of the privacy loss distribution."""


def _z(tail: float) -> float:
    """The standard normal quantile z with Phi(-z) = tail."""
    return float(-special.ndtri(tail))


class GaussianPair:
    """(N(mu, 1), N(0, 1)): the Gaussian mechanism with mu = sensitivity / sigma.

    The loss is N(mu^2/2, mu^2) under P; the profile is Balle and Wang 2018, Thm 8.
    The pair is symmetric (add and remove give the same PLD).
    """

    infinity_mass = 0.0

    def __init__(self, mu: float) -> None:
        self.mu = mu

    def profile(self, eps: Array) -> Array:
        mu = self.mu
        first = special.ndtr(-eps / mu + mu / 2)
        second = np.exp(eps + special.log_ndtr(-eps / mu - mu / 2))
        return np.asarray(np.clip(first - second, 0.0, 1.0), dtype=np.float64)

    def sf(self, t: Array) -> Array:
        mu = self.mu
        return np.asarray(special.ndtr((mu * mu / 2 - t) / mu), dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        z = _z(tail)
        mean = self.mu * self.mu / 2
        return mean - z * self.mu, mean + z * self.mu


class LaplacePair:
    """(Lap(e0, 1), Lap(0, 1)): the Laplace mechanism with e0 = sensitivity / scale.

    The loss lies in [-e0, e0] with atoms of mass 1/2 at e0 and e^-e0 / 2 at -e0; the
    profile is delta(eps) = 1 - exp((eps - e0) / 2) on [-e0, e0] (zero above, 1 - e^eps
    below). The pair is symmetric.
    """

    infinity_mass = 0.0

    def __init__(self, e0: float) -> None:
        self.e0 = e0

    def profile(self, eps: Array) -> Array:
        e0 = self.e0
        middle = -np.expm1((np.minimum(eps, e0) - e0) / 2)
        below = -np.expm1(np.minimum(eps, 0.0))
        out = np.where(eps >= e0, 0.0, np.where(eps < -e0, below, middle))
        return np.asarray(out, dtype=np.float64)

    def sf(self, t: Array) -> Array:
        e0 = self.e0
        middle = 1 - np.exp(-(e0 - np.clip(t, -e0, e0)) / 2) / 2
        out = np.where(t <= -e0, 1.0, np.where(t > e0, 0.0, middle))
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        return -self.e0, self.e0


class RandomizedResponsePair:
    """The dominating pair of any (epsilon, delta)-DP mechanism.

    P puts delta on +inf, (1-delta) e^eps / (1+e^eps) on loss eps and
    (1-delta) / (1+e^eps) on -eps; its profile is the (epsilon, delta) randomized
    response's (Kairouz, Oh and Viswanath 2015, Thm 2.4; Murtagh and Vadhan 2016), which
    dominates every (epsilon, delta)-DP mechanism, so composing these pairs gives the
    optimal composition of the declared (epsilon_i, delta_i).
    """

    def __init__(self, epsilon: float, delta: float) -> None:
        self.epsilon = epsilon
        self.infinity_mass = delta
        self._high = (1 - delta) / (1 + math.exp(-epsilon))
        self._low = (1 - delta) / (1 + math.exp(epsilon))

    def profile(self, eps: Array) -> Array:
        e = self.epsilon
        up = self._high * np.maximum(-np.expm1(np.minimum(eps - e, 0.0)), 0.0)
        down = self._low * np.maximum(-np.expm1(np.minimum(eps + e, 0.0)), 0.0)
        return np.asarray(self.infinity_mass + up + down, dtype=np.float64)

    def sf(self, t: Array) -> Array:
        e = self.epsilon
        out = np.where(t <= e, self._high, 0.0) + np.where(t <= -e, self._low, 0.0)
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        return -self.epsilon, self.epsilon


class KaryRandomizedResponsePair:
    """k-ary randomized response with ratio e^eps, between two different true values.

    P puts p = 1 / (1 + (k-1) e^-eps) on loss eps, (k-2) q on 0 and q = e^-eps p on
    -eps (Kairouz, Oh and Viswanath 2016, k-RR); the same for every pair of values and
    for both orders, so it is symmetric. For k = 2 it is `RandomizedResponsePair`
    with delta = 0.
    """

    infinity_mass = 0.0

    def __init__(self, epsilon: float, k: int) -> None:
        self.epsilon = epsilon
        self._high = 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))
        self._low = math.exp(-epsilon) * self._high
        self._zero = (k - 2) * self._low

    def profile(self, eps: Array) -> Array:
        e = self.epsilon
        lost = [
            (self._high, e), (self._zero, 0.0), (self._low, -e),
        ]
        out = np.zeros_like(np.asarray(eps, dtype=np.float64))
        for mass, loss in lost:
            out = out + mass * np.maximum(-np.expm1(np.minimum(eps - loss, 0.0)), 0.0)
        return np.asarray(out, dtype=np.float64)

    def sf(self, t: Array) -> Array:
        e = self.epsilon
        out = (
            np.where(t <= e, self._high, 0.0)
            + np.where(t <= 0, self._zero, 0.0)
            + np.where(t <= -e, self._low, 0.0)
        )
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        return -self.epsilon, self.epsilon


class BoundedRangePair:
    """A pair dominating every epsilon-bounded-range pair, in both orders (upper only).

    Every epsilon-BR pair is a post-processing of the generalised randomized response
    R_t whose losses are t (mass p_t = (e^eps - e^t) / (e^eps - 1)) and t - eps, for
    some t in [0, eps] (Dong, Durfee and Rogers 2020, Sec. 4); the swapped pair is
    R_(eps - t). The pointwise maximum of the R_t's profiles is, for 0 <= x < eps,
    max_t p_t (1 - e^(x - t)) = (e^(eps/2) - e^(x/2))^2 / (e^eps - 1), attained at
    t = (eps + x) / 2 (with u = e^t the objective (e^eps - u)(1 - e^x / u) / (e^eps - 1)
    is maximal at u = e^((eps + x)/2); derived here), 0 for x >= eps, and for x < 0
    the profile identity delta(x) = 1 - e^x + e^x delta_swapped(-x) gives
    -expm1(x) + expm1((eps + x)/2)^2 / expm1(eps) on (-eps, 0) and 1 - e^x below. The
    maximum of convex, non-increasing profiles (in e^x) is one, so its connect-the-dots
    discretisation dominates every R_t and so the mechanism at every step, also when the
    analyst chooses neighbours and t adaptively (Zhu, Dong and Wang 2022, Thm 10; the
    argument of `SymmetrisedPair`). At x = 0 it is tanh(eps / 4), against
    tanh(eps / 2) for a generic eps-DP pair.
    """

    infinity_mass = 0.0

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon
        self._scale = math.expm1(epsilon)

    def profile(self, eps: Array) -> Array:
        e = self.epsilon
        x = np.asarray(eps, dtype=np.float64)
        above = np.clip(x, 0.0, e)
        upper = np.exp(above) * np.expm1((e - above) / 2) ** 2 / self._scale
        below = np.clip(x, -e, 0.0)
        middle = -np.expm1(below) + np.expm1((e + below) / 2) ** 2 / self._scale
        out = np.where(
            x >= e, 0.0, np.where(x >= 0, upper, np.where(x > -e, middle, -np.expm1(x)))
        )
        return np.asarray(np.clip(out, 0.0, 1.0), dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        return -self.epsilon, self.epsilon


def _log_expm1_plus(t: Array, q: float) -> Array:
    """ln(e^t - 1 + q) for e^t > 1 - q, computed without overflow."""
    big = t > 1.0
    safe_big = np.where(big, t, 1.0)
    safe_small = np.where(big, 0.0, t)
    high = safe_big + np.log1p((q - 1) * np.exp(-safe_big))
    with np.errstate(divide="ignore", invalid="ignore"):
        low = np.log(np.expm1(safe_small) + q)
    return np.asarray(np.where(big, high, low), dtype=np.float64)


class SubsampledGaussianPair:
    """The Gaussian pair mixed by a sampling rate q, in one direction.

    ``remove``: P = (1-q) N(0,1) + q N(mu,1), Q = N(0,1); ``add``: the swap
    P = N(0,1), Q = (1-q) N(0,1) + q N(mu,1). Both losses are monotone in the output x,
    so the profile has the closed form used here (Zhu, Dong and Wang 2022, subsampling results).
    """

    infinity_mass = 0.0

    def __init__(self, mu: float, q: float, remove: bool) -> None:
        if not 0 < q < 1:
            raise ValueError("use GaussianPair for q = 1")
        self.mu = mu
        self.q = q
        self.remove = remove
        self._log_q = math.log(q)
        self._log_1mq = math.log1p(-q)

    def _threshold(self, s: Array) -> Array:
        """x with (1-q) + q e^(mu x - mu^2/2) = e^s, for e^s > 1 - q."""
        mu = self.mu
        return (_log_expm1_plus(s, self.q) - self._log_q + mu * mu / 2) / mu

    def _loss(self, x: float) -> float:
        mu = self.mu
        value = float(np.logaddexp(self._log_1mq, self._log_q + mu * x - mu * mu / 2))
        return value if self.remove else -value

    def profile(self, eps: Array) -> Array:
        mu, q = self.mu, self.q
        if self.remove:
            valid = eps > self._log_1mq
            e = np.where(valid, eps, 1.0)
            x = self._threshold(e)
            first = np.exp(self._log_q + special.log_ndtr(mu - x))
            second = np.exp(_log_expm1_plus(e, q) + special.log_ndtr(-x))
            out = np.where(valid, first - second, -np.expm1(np.minimum(eps, 0.0)))
        else:
            valid = -eps > self._log_1mq
            e = np.where(valid, eps, -1.0)
            x = self._threshold(-e)
            first = special.ndtr(x) - np.exp(e + self._log_1mq + special.log_ndtr(x))
            second = np.exp(e + self._log_q + special.log_ndtr(x - mu))
            out = np.where(valid, first - second, 0.0)
        return np.asarray(np.clip(out, 0.0, 1.0), dtype=np.float64)

    def sf(self, t: Array) -> Array:
        mu, q = self.mu, self.q
        if self.remove:
            valid = t > self._log_1mq
            x = self._threshold(np.where(valid, t, 1.0))
            tail = (1 - q) * special.ndtr(-x) + q * special.ndtr(mu - x)
            out = np.where(valid, tail, 1.0)
        else:
            valid = -t > self._log_1mq
            x = self._threshold(np.where(valid, -t, 1.0))
            out = np.where(valid, special.ndtr(x), 0.0)
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        z = _z(tail)
        if self.remove:
            return self._loss(-z), self._loss(self.mu + z)
        return self._loss(z), self._loss(-z)


class SubsampledLaplacePair:
    """The Laplace pair mixed by a sampling rate q, in one direction.

    ``remove``: P = (1-q) Lap(0,1) + q Lap(e0,1), Q = Lap(0,1); ``add``: the swap.
    The base loss L0(x) = |x| - |x - e0| is non-decreasing in x, which gives the closed
    forms below (Zhu, Dong and Wang 2022, subsampling results).
    """

    infinity_mass = 0.0

    def __init__(self, e0: float, q: float, remove: bool) -> None:
        if not 0 < q < 1:
            raise ValueError("use LaplacePair for q = 1")
        self.e0 = e0
        self.q = q
        self.remove = remove
        self._log_q = math.log(q)
        self._log_1mq = math.log1p(-q)

    @staticmethod
    def _tail0(c: Array) -> Array:
        """P(X > c) for X ~ Lap(0, 1)."""
        return np.asarray(
            np.where(c >= 0, np.exp(-np.abs(c)) / 2, 1 - np.exp(-np.abs(c)) / 2),
            dtype=np.float64,
        )

    def _base_threshold(self, s: Array) -> Array:
        """The base loss level L0 with (1-q) + q e^L0 = e^s, for e^s > 1 - q."""
        return np.asarray(_log_expm1_plus(s, self.q) - self._log_q, dtype=np.float64)

    def profile(self, eps: Array) -> Array:
        e0, q = self.e0, self.q
        t0 = self._tail0
        if self.remove:
            valid = eps > self._log_1mq
            s = self._base_threshold(np.where(valid, eps, 1.0))
            c = (np.clip(s, -e0, e0) + e0) / 2
            ex = np.exp(np.minimum(eps, 700.0))
            middle = (1 - q) * t0(c) + q * t0(c - e0) - ex * t0(c)
            all_lost = -np.expm1(np.minimum(eps, 0.0))
            out = np.where(~valid | (s < -e0), all_lost, np.where(s >= e0, 0.0, middle))
        else:
            valid = -eps > self._log_1mq
            s = self._base_threshold(np.where(valid, -eps, 1.0))
            c = (np.clip(s, -e0, e0) + e0) / 2
            ex = np.exp(np.minimum(eps, 700.0))
            below_p = 1 - t0(c)
            below_q = (1 - q) * (1 - t0(c)) + q * (1 - t0(c - e0))
            middle = below_p - ex * below_q
            all_lost = -np.expm1(np.minimum(eps, 0.0))
            out = np.where(
                ~valid | (s <= -e0), 0.0, np.where(s > e0, all_lost, middle)
            )
        return np.asarray(np.clip(out, 0.0, 1.0), dtype=np.float64)

    def sf(self, t: Array) -> Array:
        e0, q = self.e0, self.q
        t0 = self._tail0
        if self.remove:
            valid = t > self._log_1mq
            s = self._base_threshold(np.where(valid, t, 1.0))
            c = (np.clip(s, -e0, e0) + e0) / 2
            middle = (1 - q) * t0(c) + q * t0(c - e0)
            out = np.where(~valid | (s <= -e0), 1.0, np.where(s > e0, 0.0, middle))
        else:
            valid = -t > self._log_1mq
            s = self._base_threshold(np.where(valid, -t, 1.0))
            c = (np.clip(s, -e0, e0) + e0) / 2
            middle = 1 - t0(c)
            out = np.where(~valid | (s < -e0), 0.0, np.where(s >= e0, 1.0, middle))
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        low = math.log1p(self.q * math.expm1(-self.e0))
        high = math.log1p(self.q * math.expm1(self.e0))
        return (low, high) if self.remove else (-high, -low)


# ---------------------------------------------------------------------------------------
# Discrete (lattice) mechanisms: integer shifts of symmetric log-concave integer noise
# ---------------------------------------------------------------------------------------

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


class SymmetrisedPair:
    """A pair dominating both orders of a neighbouring pair: profile max(delta_1, delta_2).

    Why this is a dominating pair. A privacy profile, as a function of gamma = e^eps, is
    convex and non-increasing; the maximum of two such functions is again convex and
    non-increasing, so its connect-the-dots discretisation (Doroshenko, Ghazi, Kamath,
    Kumar and Manurangsi 2022), which interpolates it linearly in gamma between grid
    points, is an explicit discrete pair whose hockey-stick divergence is at least
    max(delta_1, delta_2) at every eps. If every ordered pair of neighbouring outputs
    (M(x), M(x')) has a profile at most delta_1 or delta_2 (here: the orders R and A of
    a subsampled mechanism under substitution), that discrete pair dominates M in the
    sense of Zhu, Dong and Wang 2022 (Def. 7), and the product of dominating pairs
    dominates the *adaptive* composition (ZDW 2022, Thm 10): the analyst may choose the
    order at every step. Only the pessimistic discretisation is built from this pair
    (it has no closed-form loss distribution); lower bounds come from each order alone.

    Examples:
        >>> import numpy as np
        >>> r = SubsampledGaussianPair(1.0, 0.3, remove=True)
        >>> a = SubsampledGaussianPair(1.0, 0.3, remove=False)
        >>> eps = np.array([-0.3, 0.0, 0.3])
        >>> bool(np.all(SymmetrisedPair(r, a).profile(eps) >= r.profile(eps)))
        True
    """

    def __init__(self, first: UpperPair, second: UpperPair) -> None:
        self.first = first
        self.second = second
        self.infinity_mass = max(first.infinity_mass, second.infinity_mass)

    def profile(self, eps: Array) -> Array:
        return np.asarray(
            np.maximum(self.first.profile(eps), self.second.profile(eps)), dtype=np.float64
        )

    def loss_range(self, tail: float) -> tuple[float, float]:
        low_1, high_1 = self.first.loss_range(tail)
        low_2, high_2 = self.second.loss_range(tail)
        return min(low_1, low_2), max(high_1, high_2)
