"""Dominating pairs of subsampled mechanisms, and the pair that dominates both orders.

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

import numpy as np
from scipy import special

from dpaccount.accounting.pld.pairs import Array, UpperPair, _z

__all__ = ["SubsampledGaussianPair", "SubsampledLaplacePair", "SymmetrisedPair"]


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
