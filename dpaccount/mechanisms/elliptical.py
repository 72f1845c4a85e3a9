"""The elliptical Gaussian mechanism: per-coordinate noise for per-coordinate bounds.

Setting (Pagh and Lebeda, "Private vector aggregation when coordinates have different
sensitivity", 2023). A vector query f (typically a sum of records) whose coordinate j
moves by at most Delta_j between neighbouring datasets: the difference vector lies in
the box prod_j [-Delta_j, Delta_j]. The isotropic Gaussian mechanism must use the box's
L2 radius ||Delta||_2 for every coordinate; the elliptical one adds N(0, sigma_j²) to
coordinate j with its own sigma_j.

**Privacy by reduction to the isotropic Gaussian.** Divide coordinate j by sigma_j: the
noise becomes N(0, I) and the rescaled query's difference vector v_j / sigma_j has L2
norm at most D = sqrt(sum_j Delta_j² / sigma_j²) (attained at a corner of the box). So
the elliptical mechanism is the isotropic Gaussian mechanism of unit noise on a query of
L2 sensitivity D, followed by the data-independent rescaling back (post-processing);
it has exactly the guarantee of the Gaussian mechanism at mu = D (Balle and Wang 2018,
Thm 8 for continuous noise).

**The optimal scales.** Minimising the expected squared error sum_j sigma_j² subject to
sum_j Delta_j² / sigma_j² = D² (Lagrange: 1 = lambda Delta_j² / sigma_j⁴) gives
sigma_j² = (sum_k Delta_k) Delta_j / D²: noise standard deviation proportional to
sqrt(Delta_j) (Pagh and Lebeda 2023). The expected squared error is
(sum_j Delta_j)² / D², against d ||Delta||_2² / D² for the isotropic mechanism at the
same (epsilon, delta): the ratio (sum_j Delta_j)² / (d sum_j Delta_j²) is at most 1
(Cauchy-Schwarz), with equality only when all bounds are equal.

**What is implemented and charged.** As in `dpaccount.mechanisms.gaussian`, no
float noise is added. Coordinate j is rounded to its own lattice g_j Z (g_j a power of
two <= Delta_j / 2048) and discrete Gaussian noise N_Z(0, t_j²) is added in lattice units
(Canonne, Kamath and Steinke 2020, Algorithm 3). Rounding moves each coordinate by at
most g_j / 2, so the integer difference in coordinate j is at most
S_j = floor(Delta_j / g_j) + 1. The product of independent discrete Gaussians with
integer shift v is rho-zCDP with rho = sum_j v_j² / (2 t_j²) <= sum_j S_j² / (2 t_j²)
(CKS 2020, Thm 14, which allows a different t_j per coordinate), and rho-zCDP gives
(epsilon, delta) by CKS 2020, Cor. 13. The optimum above is applied to the lattice
bounds: t_j² = C S_j / g_j (noise variance C S_j g_j, proportional to the effective
bound S_j g_j), with C set so that the converted delta is at most the requested one.
The charge is ``PrivacyCost(epsilon, delta_bound)`` at the exact t_j² used.
It is one mechanism with fixed parameters; the accountant composes it.

Examples:
    >>> from dpaccount.mechanisms._sampling import RandomSource
    >>> m = EllipticalGaussianMechanism(1, "1e-5", [1, 1, 16, 64],
    ...                                 rng=RandomSource.seeded(0))
    >>> m.charge.delta <= Fraction(1, 10**5)
    True
    >>> s = m.sigmas                           # proportional to sqrt(bound)
    >>> bool(7.9 < s[3] / s[0] < 8.1)
    True
    >>> m.release([0.0, 0.0, 0.0, 0.0]).shape
    (4,)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpaccount._numeric import bisect_geometric, check_delta, check_positive, float_up
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError, unreleasable
from dpaccount.mechanisms._sampling import (
    RandomSource,
    _as_float_array,
    power_of_two_at_most,
    resolve_rng,
    sample_discrete_gaussian,
)
from dpaccount.mechanisms.base import Mechanism
from dpaccount.mechanisms.gaussian_calibration import zcdp_delta_up

__all__ = [
    "EllipticalGaussianMechanism",
    "elliptical_error_ratio",
    "optimal_sigmas",
]

#: Default lattice per coordinate: g_j = largest power of two <= Delta_j / _FINENESS.
_FINENESS = 2048


def optimal_sigmas(bounds: Any, mu: Any) -> npt.NDArray[np.float64]:
    """The continuous optimum: sigma_j = sqrt(Delta_j sum_k Delta_k) / mu.

    ``mu`` is the largest L2 sensitivity / sigma the isotropic Gaussian mechanism may
    have at the target (epsilon, delta) (e.g. Balle and Wang 2018, Thm 8). Floats, for
    planning and comparisons; the mechanism itself uses exact lattice parameters.

    Examples:
        >>> optimal_sigmas([1.0, 4.0], 1.0).tolist()    # sqrt(1*5), sqrt(4*5)
        [2.23606797749979, 4.47213595499958]
    """
    b = np.asarray(bounds, dtype=np.float64)
    return np.sqrt(b * b.sum()) / float(mu)  # type: ignore[no-any-return]


def elliptical_error_ratio(bounds: Any) -> float:
    """Expected squared error of the optimal elliptical over the isotropic Gaussian.

    (sum_j Delta_j)² / (d sum_j Delta_j²), independent of (epsilon, delta).

    Examples:
        >>> elliptical_error_ratio([1, 1, 1, 1])
        1.0
        >>> round(elliptical_error_ratio([1, 100]), 4)     # 101² / (2 * 10001)
        0.51
    """
    b = np.asarray(bounds, dtype=np.float64)
    return float(b.sum() ** 2 / (b.size * (b * b).sum()))


def _check_bounds(bounds: Any) -> list[Fraction]:
    if isinstance(bounds, str | bytes) or np.ndim(bounds) != 1:
        raise InvalidCostError("bounds", bounds, "must be a 1-D sequence of positive numbers")
    values = [check_positive(b, "bounds") for b in bounds]
    if not values:
        raise InvalidCostError("bounds", bounds, "at least one coordinate is needed")
    return values


class EllipticalGaussianMechanism(Mechanism):
    """Discrete Gaussian noise with per-coordinate scales ∝ sqrt(Delta_j).

    Theorem: privacy by reduction to the isotropic Gaussian mechanism on the rescaled
    query (see the module docstring); for the implemented discrete noise, Canonne,
    Kamath and Steinke 2020, Thm 14 (multivariate discrete Gaussian, per-coordinate
    scales, zCDP) and Cor. 13 (conversion to (epsilon, delta)). Noise scales: Pagh and
    Lebeda 2023. One mechanism with fixed parameters; any adaptivity is the
    accountant's business.

    Args:
        epsilon: > 0.
        delta: In (0, 1).
        bounds: Delta_j > 0 per coordinate: the largest change of coordinate j between
            neighbouring datasets (under the accountant's relation).
        granularity: Lattice spacings g_j (a sequence) or ``None`` for the default
            (largest power of two <= Delta_j / 2048).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Raises:
        InvalidCostError: An invalid parameter (naming it).
    """

    def __init__(
        self,
        epsilon: Any,
        delta: Any,
        bounds: Any,
        *,
        granularity: Any = None,
        rng: Any = None,
    ) -> None:
        eps = check_positive(epsilon, "epsilon")
        dlt = check_delta(delta)
        if dlt == 0:
            raise InvalidCostError("delta", delta, "the Gaussian mechanism needs delta > 0")
        self._bounds = _check_bounds(bounds)
        d = len(self._bounds)
        if granularity is None:
            self._g = [power_of_two_at_most(b / _FINENESS) for b in self._bounds]
        else:
            if np.ndim(granularity) != 1 or len(granularity) != d:
                raise InvalidCostError(
                    "granularity", granularity, f"must hold {d} positive numbers"
                )
            self._g = [check_positive(g, "granularity") for g in granularity]
        self._shifts = [
            math.floor(b / g) + 1 for b, g in zip(self._bounds, self._g, strict=True)
        ]
        self._rng: RandomSource = resolve_rng(rng)
        self._epsilon = eps
        self._t2 = self._calibrate(eps, dlt)
        self._rho = self._rho_of(self._t2)
        self._delta = zcdp_delta_up(eps, float_up(self._rho))
        self._charge = PrivacyCost(eps, self._delta)

    # -- calibration ----------------------------------------------------------------------

    def _t2_for(self, c: float) -> list[Fraction]:
        # t_j² = C S_j / g_j, rounded up to a float (more noise is always safe).
        return [
            Fraction(float_up(Fraction(c) * s / g))
            for s, g in zip(self._shifts, self._g, strict=True)
        ]

    def _rho_of(self, t2: list[Fraction]) -> Fraction:
        return sum(
            (Fraction(s * s) / (2 * t) for s, t in zip(self._shifts, t2, strict=True)),
            Fraction(0),
        )

    def _calibrate(self, epsilon: Fraction, delta: Fraction) -> list[Fraction]:
        def ok(c: float) -> bool:
            rho = self._rho_of(self._t2_for(c))
            return zcdp_delta_up(epsilon, float_up(rho)) <= delta

        # sum_j S_j g_j / (2 C) = rho: start from the rho where the conversion is ~delta.
        total = float(sum((s * g for s, g in zip(self._shifts, self._g, strict=True)),
                                  Fraction(0)))
        hi = total / (2.0 * 0.01)
        while not ok(hi):
            hi *= 2.0
        lo = hi
        while ok(lo) and lo > 1e-300:
            hi, lo = lo, lo / 2.0
        hi = bisect_geometric(ok, lo, hi, 1e-7)
        return self._t2_for(hi)

    # -- the interface ----------------------------------------------------------------------

    @property
    def charge(self) -> PrivacyCost:
        """``PrivacyCost(epsilon, delta_bound)``, proven for the discrete sampler."""
        return self._charge

    @property
    def dimension(self) -> int:
        """The number of coordinates."""
        return len(self._bounds)

    @property
    def bounds(self) -> tuple[Fraction, ...]:
        """The declared per-coordinate bounds Delta_j."""
        return tuple(self._bounds)

    @property
    def granularity(self) -> tuple[Fraction, ...]:
        """The lattice spacings g_j."""
        return tuple(self._g)

    @property
    def lattice_shifts(self) -> tuple[int, ...]:
        """S_j = floor(Delta_j / g_j) + 1: each coordinate's sensitivity in lattice steps."""
        return tuple(self._shifts)

    @property
    def lattice_sigma2(self) -> tuple[Fraction, ...]:
        """t_j²: each coordinate's discrete Gaussian parameter, in lattice units (exact)."""
        return tuple(self._t2)

    @property
    def rho(self) -> Fraction:
        """The zCDP parameter sum_j S_j² / (2 t_j²) (exact)."""
        return self._rho

    @property
    def sigmas(self) -> npt.NDArray[np.float64]:
        """sigma_j = g_j t_j: each coordinate's noise scale in the answer's units."""
        return np.asarray(
            [float(g) * math.sqrt(float(t)) for g, t in zip(self._g, self._t2, strict=True)]
        )

    @property
    def expected_squared_error(self) -> float:
        """An upper bound on E||noise||²: sum_j g_j² t_j² (each discrete Gaussian's variance
        is below its parameter t_j²; Canonne, Kamath and Steinke 2020)."""
        return float(sum((g * g * t for g, t in zip(self._g, self._t2, strict=True)),
                                 Fraction(0)))

    def release(self, value: Any) -> npt.NDArray[np.float64]:
        """Round each coordinate to its lattice and add discrete Gaussian noise.

        Args:
            value: A 1-D array of ``dimension`` finite reals.

        Returns:
            A float64 array of the same length.
        """
        expected = f"a 1-D array of {self.dimension} finite real numbers"
        arr = None if isinstance(value, str | bytes) else _as_float_array(value)
        if arr is None or arr.ndim != 1:
            raise unreleasable(value, expected)
        if arr.size != self.dimension:
            raise unreleasable(value, expected, f"It has {arr.size} coordinates.")
        if not np.all(np.isfinite(arr)):
            raise unreleasable(value, expected, "It holds NaN or an infinity.")
        out = np.empty(arr.size, dtype=np.float64)
        for j, (v, g, t2) in enumerate(zip(arr.tolist(), self._g, self._t2, strict=True)):
            k = round(Fraction(v) / g)  # exact nearest lattice point
            out[j] = float((k + sample_discrete_gaussian(t2, self._rng)) * g)
        return out

    def __repr__(self) -> str:
        return (
            f"EllipticalGaussianMechanism(dimension={self.dimension}, "
            f"epsilon={float(self._epsilon)!r}, delta={float(self._delta)!r})"
        )


