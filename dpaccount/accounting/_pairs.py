"""Dominating pairs of the mechanisms the PLD engine knows, as privacy profiles.

Each pair (P, Q) is described by what the discretisations in :mod:`dpaccount.accounting.pld`
need, all vectorised over numpy arrays:

* ``profile(eps)``: the hockey-stick divergence delta(eps) = sup_S P(S) - e^eps Q(S)
  (the privacy profile; Balle and Wang 2018, Thm 5 / Zhu, Dong and Wang 2022, Def. 2);
* ``sf(t)``: P(L >= t) for the finite part of the privacy loss L = ln(P/Q) under P;
* ``infinity_mass``: P(L = +inf);
* ``loss_range(tail)``: an interval of losses outside which P has mass <= ``tail``.

The pairs are normalised (noise scale 1, shift = sensitivity / scale).
Subsampled pairs follow Zhu, Dong and Wang 2022 ("Optimal accounting of differential
privacy via characteristic function", AISTATS), the Poisson-subsampling result (
add/remove neighbours: the *remove* pair ((1-q) Q + q P, Q) and the *add* pair
(Q, (1-q) Q + q P)) and the without-replacement result (substitution
neighbours: the pair ((1-q) Q + q P, Q); we also take its swap, the maximum of the two
directions, which can only be more conservative).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import numpy.typing as npt
from scipy import special

Array = npt.NDArray[np.float64]

__all__ = [
    "Array",
    "GaussianPair",
    "LaplacePair",
    "Pair",
    "RandomizedResponsePair",
    "SubsampledGaussianPair",
    "SubsampledLaplacePair",
]


class Pair(Protocol):
    """What the PLD engine needs of a dominating pair."""

    infinity_mass: float

    def profile(self, eps: Array) -> Array:
        """delta(eps), the hockey-stick divergence of the pair."""

    def sf(self, t: Array) -> Array:
        """P(L >= t) for the finite part of the privacy loss distribution."""

    def loss_range(self, tail: float) -> tuple[float, float]:
        """Losses outside the returned interval have P-mass at most ``tail``."""


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
