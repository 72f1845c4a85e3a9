"""The dominating pairs of the mixture-of-Gaussians mechanism, in one direction each.

Choquette-Choo, Ganesh, Steinke and Thakurta 2023 ("Privacy amplification for matrix
mechanisms", arXiv:2310.15526): under add/remove neighbours the mechanism outputs
Q = N(0, 1) on one dataset and P = sum_i p_i N(c_i, 1) on the other (shifts c_i >= 0 in
noise units; a vector mechanism is dominated by the scalar one with each sensitivity
vector replaced by its norm, their Cor. 4.7). ``remove`` is the pair (P, Q), ``add``
the pair (Q, P); each direction is composed on its own, as for Poisson subsampling
(Zhu, Dong and Wang 2022), which it generalises (shifts {0, mu}, probabilities
{1 - q, q}). The loss L(x) = ln sum_i p_i e^{c_i x - c_i^2 / 2} is increasing in x, so
every set {L > eps} is a half-line whose end is found by Newton's method to full precision
(the profile is stationary in that end, so its float error moves the profile by a
second-order amount).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpaccount.accounting.pld.pairs import Array, _z

__all__ = ["MixtureGaussianPair"]


class MixtureGaussianPair:
    """(sum_i p_i N(c_i, 1), N(0, 1)) if ``remove``, else the swap.

    Examples:
        >>> import numpy as np
        >>> from dpaccount.accounting.pld.subsampled import SubsampledGaussianPair
        >>> m = MixtureGaussianPair([0.0, 1.0], [0.9, 0.1], remove=True)
        >>> s = SubsampledGaussianPair(1.0, 0.1, remove=True)
        >>> eps = np.array([0.0, 0.5, 1.0])
        >>> bool(np.allclose(m.profile(eps), s.profile(eps), rtol=1e-9))
        True
    """

    infinity_mass = 0.0

    def __init__(self, shifts: list[float], probs: list[float], remove: bool) -> None:
        self.c = np.asarray(shifts, dtype=np.float64)
        self.p = np.asarray(probs, dtype=np.float64)
        self.remove = remove
        self._log_p = np.log(self.p)
        zero = self.p[self.c == 0].sum()
        #: L at x -> -infinity: ln P[shift 0] (-inf if no shift is 0)
        self._floor = math.log(zero) if zero > 0 else -math.inf
        self._c_max = float(self.c.max())

    def _loss(self, x: Array) -> Array:
        terms = self._log_p[None, :] + np.outer(x, self.c) - self.c[None, :] ** 2 / 2
        return np.asarray(special.logsumexp(terms, axis=1), dtype=np.float64)

    def _threshold(self, s: Array) -> Array:
        """x with L(x) = s where s > the floor (else -inf): a start interpolated from a
        table of L, then Newton's method. L is convex and increasing (a log-sum-exp of
        increasing affine functions), so from the first step on the iterates approach
        the root from above, and converge quadratically."""
        s = np.asarray(s, dtype=np.float64)
        ok = s > self._floor
        target = np.where(ok, s, self._floor + 1 if math.isfinite(self._floor) else 0.0)
        table = np.linspace(-40.0 - self._c_max, 40.0 + 2 * self._c_max, 2049)
        x = np.interp(target, self._loss(table), table)
        active = np.arange(x.size)
        for _ in range(40):  # Newton on the points not yet converged
            xa = x[active]
            terms = (self._log_p[None, :] + np.outer(xa, self.c)
                     - self.c[None, :] ** 2 / 2)
            value = special.logsumexp(terms, axis=1)
            slope = (special.softmax(terms, axis=1) * self.c[None, :]).sum(axis=1)
            step = (value - target[active]) / np.maximum(slope, 1e-300)
            x[active] = xa - step
            active = active[np.abs(step) > 1e-13 * (1 + np.abs(xa))]
            if active.size == 0:
                break
        return np.asarray(np.where(ok, x, -np.inf), dtype=np.float64)

    def _p_above(self, x: Array) -> Array:
        """P(X > x) under the mixture."""
        return np.asarray(
            (self.p[None, :] * special.ndtr(self.c[None, :] - x[:, None])).sum(axis=1),
            dtype=np.float64)

    def _p_below(self, x: Array) -> Array:
        return np.asarray(
            (self.p[None, :] * special.ndtr(x[:, None] - self.c[None, :])).sum(axis=1),
            dtype=np.float64)

    def profile(self, eps: Array) -> Array:
        eps = np.asarray(eps, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.remove:
                x = self._threshold(eps)
                first = np.where(np.isinf(x), 1.0, self._p_above(np.where(np.isinf(x), 0, x)))
                second = np.where(np.isinf(x), np.exp(np.minimum(eps, 0.0)),
                                  np.exp(eps + special.log_ndtr(-x)))
            else:
                x = self._threshold(-eps)  # {L < -eps} = {X < x}
                safe = np.where(np.isinf(x), 0.0, x)
                first = np.where(np.isinf(x), 0.0, special.ndtr(safe))
                second = np.where(np.isinf(x), 0.0,
                                  np.exp(np.minimum(eps, 700.0)) * self._p_below(safe))
            out = first - second
        return np.asarray(np.clip(np.nan_to_num(out, nan=0.0), 0.0, 1.0), dtype=np.float64)

    def sf(self, t: Array) -> Array:
        t = np.asarray(t, dtype=np.float64)
        if self.remove:
            x = self._threshold(t)
            safe = np.where(np.isinf(x), 0.0, x)
            out = np.where(np.isinf(x), 1.0, self._p_above(safe))
        else:
            x = self._threshold(-t)
            safe = np.where(np.isinf(x), 0.0, x)
            out = np.where(np.isinf(x), 0.0, special.ndtr(safe))
        return np.asarray(out, dtype=np.float64)

    def loss_range(self, tail: float) -> tuple[float, float]:
        z = _z(tail / 2)
        if self.remove:  # X ~ mixture: in [-z, c_max + z] but for mass <= tail
            ends = self._loss(np.array([-z, self._c_max + z]))
            return float(ends[0]), float(ends[1])
        ends = self._loss(np.array([-z, z]))  # X ~ N(0, 1); the loss is -L(X)
        return float(-ends[1]), float(-ends[0])
