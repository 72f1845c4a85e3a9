"""Dominating pairs of the mechanisms without subsampling, and what a pair must offer.

Each pair (P, Q) is described by what the discretisations of
`dpaccount.accounting.pld.discrete` need, all vectorised over numpy arrays:

* ``profile(eps)``: the hockey-stick divergence delta(eps) = sup_S P(S) - e^eps Q(S)
  (the privacy profile; Balle and Wang 2018, Thm 5 / Zhu, Dong and Wang 2022, Def. 2);
* ``sf(t)``: P(L >= t) for the finite part of the privacy loss L = ln(P/Q) under P;
* ``infinity_mass``: P(L = +inf);
* ``loss_range(tail)``: an interval of losses outside which P has mass <= ``tail``.

The pairs are normalised (noise scale 1, shift = sensitivity / scale). Here: the
Gaussian, the Laplace, the (epsilon, delta) randomized response that dominates any
(epsilon, delta)-DP mechanism, k-ary randomized response and bounded range; the
subsampled pairs are in `dpaccount.accounting.pld.subsampled`, the lattice (integer
shift) pairs in `dpaccount.accounting.pld.lattice`.
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
    "BoundedRangePair",
    "GaussianPair",
    "KaryRandomizedResponsePair",
    "LaplacePair",
    "Pair",
    "RandomizedResponsePair",
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
        self._low = (1 - delta) * math.exp(-epsilon) / (1 + math.exp(-epsilon))  # no overflow

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
