"""Integer-valued noise for integer queries: discrete Laplace and discrete Gaussian.

The query's answer is already an exact integer (a count, a sum on a lattice, a vector of
bin counts), so no rounding is needed: the noise is drawn exactly on the integers
(Canonne, Kamath and Steinke 2020, "The Discrete Gaussian for Differential Privacy",
Algorithms 2 and 3), and the charge is the discrete charge the tight engines read
(`DiscreteLaplaceCharge`, `DiscreteGaussianCharge`). The guarded aggregates
(`dpaccount.aggregates`) take their noise from here: one calibration, one charge type.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import special

from dpaccount._numeric import bisect_geometric, check_delta, check_positive, float_up
from dpaccount.charges import DiscreteGaussianCharge, DiscreteLaplaceCharge
from dpaccount.errors import InvalidCostError, unreleasable
from dpaccount.mechanisms._sampling import (
    RandomSource,
    resolve_rng,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from dpaccount.mechanisms.base import Mechanism
from dpaccount.mechanisms.gaussian_calibration import (
    _coarse_up,
    continuous_sigma,
    discrete_gaussian_delta_up,
    zcdp_delta_up,
)

__all__ = ["IntegerGaussianMechanism", "IntegerLaplaceMechanism", "IntegerNoise"]

#: The exact 1-D discrete Gaussian profile is evaluated for shifts up to this many steps;
#: beyond, the zCDP bound is used (it needs no per-shift work).
_EXACT_PROFILE_MAX_SHIFT = 4096


def _laplace_tail_halfwidth(scale: Fraction, level: float) -> int:
    """Smallest w with P[|Y| <= w] >= level for the discrete Laplace of ``scale``.

    P[|Y| >= m] = 2 q^m / (1 + q), q = exp(-1 / scale), for m >= 1 (geometric series).
    """
    # q^m is computed as exp(m log q): q itself may underflow to 0 (a tiny scale) or
    # round to within 1e-16 of 1 (a huge one), where q**m would be far off
    log_q = -1.0 / float(scale)
    q = math.exp(log_q)
    miss = 1.0 - level

    def tail(m: int) -> float:  # P[|Y| >= m], with a margin for the roundings
        return 2.0 * math.exp(m * log_q) / (1.0 + q) * (1.0 + 1e-9)

    m = max(1, math.ceil(math.log(miss * (1.0 + q) / 2.0) / log_q))
    step = 1
    while tail(m) > miss:  # a few steps: the estimate is within rounding of the answer
        m += step
        step *= 2
    while m > 1 and tail(m - 1) <= miss:  # back to the smallest such m
        m -= 1
    return m - 1


def _gaussian_tail_halfwidth(sigma2: Fraction, level: float) -> int:
    """A w with P[|Y| <= w] >= level for the discrete Gaussian N_Z(0, sigma2).

    With f(k) = exp(-k² / (2 sigma2)): sum_{k >= m} f(k) <= int_{m-1}^inf f, and the
    normaliser Z = sum_k f(k) >= sigma sqrt(2 pi) - 1 (sum and integral of a unimodal
    function with maximum 1 differ by at most 1), so
    P[|Y| >= m] <= 2 sigma sqrt(2 pi) Q((m - 1) / sigma) / (sigma sqrt(2 pi) - 1).
    Small sigma: the probabilities are summed directly.
    """
    s2 = float(sigma2)
    sigma = math.sqrt(s2)
    miss = 1.0 - level
    if sigma < 8.0:
        k = np.arange(0, int(40 * sigma) + 40, dtype=np.float64)
        f = np.exp(-(k * k) / (2.0 * s2))
        z = f[0] + 2.0 * f[1:].sum()
        tail = 2.0 * np.cumsum(f[::-1])[::-1] / z  # tail[m] = P[|Y| >= m], m >= 1
        for m in range(1, k.size):
            if tail[m] * (1.0 + 1e-9) <= miss:
                return m - 1
        return k.size
    norm = sigma * math.sqrt(2.0 * math.pi)
    # Q(t) <= miss (norm - 1) / (2 norm): t from the inverse survival function, then
    # checked (and stepped) in the safe direction.
    target = miss * (norm - 1.0) / (2.0 * norm)
    t = float(-special.ndtri(target))
    m = math.ceil(t * sigma + 1.0)
    while 2.0 * norm * float(special.ndtr(-(m - 1) / sigma)) / (norm - 1.0) > miss:
        m += 1
    return m - 1


class IntegerLaplaceMechanism(Mechanism):
    """Discrete Laplace noise of scale S / epsilon on an integer (vector) query.

    For an integer-valued query whose answers on neighbours differ by a vector v with
    ``||v||_1 <= S``, adding independent discrete Laplace noise P[Y = y] ∝ exp(-|y| / b)
    with b = S / epsilon to each coordinate is epsilon-DP: the output density ratio is
    at most exp(||v||_1 / b) (Dwork and Roth 2014, Thm 3.6, discrete form; Ghosh,
    Roughgarden and Sundararajan 2009). The noise is drawn exactly (Canonne, Kamath and
    Steinke 2020, Algorithm 2). No lattice rounding is needed: the answer is an integer.

    The charge is a `DiscreteLaplaceCharge` (b, S, coordinates), whose cost is
    ``PrivacyCost(epsilon)`` exactly; when a neighbour changes one coordinate
    (``coordinates=1``) the other coordinates' noise does not depend on the data, so the
    tight engines may use the exact scalar pair.

    Args:
        epsilon: > 0.
        sensitivity: The L1 sensitivity S, a positive integer (in the query's units).
        coordinates: How many coordinates a neighbour can change (1 or more).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Examples:
        >>> m = IntegerLaplaceMechanism(1, 1)
        >>> m.charge.cost, m.scale
        (PrivacyCost(epsilon=1, delta=0), Fraction(1, 1))
        >>> isinstance(m.release(10), int)
        True
    """

    def __init__(
        self, epsilon: Any, sensitivity: int, *, coordinates: int = 1, rng: Any = None
    ) -> None:
        self._epsilon = check_positive(epsilon, "epsilon")
        self._sensitivity = _check_int_sensitivity(sensitivity)
        self._scale = Fraction(self._sensitivity) / self._epsilon
        self._rng: RandomSource = resolve_rng(rng)
        self._charge = DiscreteLaplaceCharge(
            self._scale, self._sensitivity, _check_coordinates(coordinates)
        )

    @property
    def charge(self) -> DiscreteLaplaceCharge:
        """``DiscreteLaplaceCharge(S / epsilon, S, coordinates)``; its cost is
        ``PrivacyCost(epsilon)``, exact."""
        return self._charge

    @property
    def scale(self) -> Fraction:
        """b = S / epsilon, in the query's integer units."""
        return self._scale

    @property
    def variance(self) -> float:
        """The noise variance per coordinate, 2 q / (1 - q)², q = exp(-1 / b)."""
        q = math.exp(-1.0 / float(self._scale))
        return 2.0 * q / (1.0 - q) ** 2

    def release(self, value: Any) -> Any:
        """Add noise to an int (returns an int) or to each int of a 1-D sequence (returns
        a list of ints; a list, tuple, numpy array or Series: its labels are dropped).

        Raises:
            UnreleasableResultError: Not integers (names the type and shape only).
        """
        found = _integers(value)
        if isinstance(found, int):
            return found + sample_discrete_laplace(self._scale, self._rng)
        if found is None:
            raise unreleasable(value, _INTEGERS)
        return [v + sample_discrete_laplace(self._scale, self._rng) for v in found]

    def halfwidth(self, level: float) -> int:
        """w with P[|noise| <= w] >= level in one coordinate."""
        return _laplace_tail_halfwidth(self._scale, level)


class IntegerGaussianMechanism(Mechanism):
    """Discrete Gaussian noise on an integer (vector) query, calibrated to (epsilon, delta).

    The neighbouring answers differ by an integer vector v with at most ``coordinates``
    non-zero entries, each of absolute value at most ``shift``. Guarantee used:

    * one coordinate: the exact privacy profile of N_Z(0, s²) under integer shifts
      1..shift (Canonne, Kamath and Steinke 2020, Thm 7), for shift <= 4096;
    * otherwise: N_Z(0, s²) added to each coordinate is rho-zCDP with
      rho = ||v||_2² / (2 s²) <= coordinates * shift² / (2 s²) (CKS 2020, Thm 14),
      converted to (epsilon, delta) by CKS 2020, Cor. 13.

    s² is the smallest dyadic value found by bisection whose bound is <= delta; the
    charge is ``PrivacyCost(epsilon, delta_bound)`` at that s² (never above delta).

    Args:
        epsilon: > 0.
        delta: In (0, 1).
        shift: Largest change of one coordinate, a positive integer.
        coordinates: Largest number of coordinates that change (1 or more).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Examples:
        >>> m = IntegerGaussianMechanism(1, "1e-5", 1)
        >>> 3.5 < math.sqrt(m.sigma2) < 4.0      # continuous analytic sigma: 3.73
        True
        >>> m.charge.delta <= Fraction(1, 100000)
        True
    """

    def __init__(
        self, epsilon: Any, delta: Any, shift: int, *, coordinates: int = 1, rng: Any = None
    ) -> None:
        eps = check_positive(epsilon, "epsilon")
        dlt = check_delta(delta)
        if dlt == 0:
            raise InvalidCostError("delta", delta, "the Gaussian mechanism needs delta > 0")
        self._shift = _check_int_sensitivity(shift)
        self._coordinates = _check_coordinates(coordinates)
        self._exact = coordinates == 1 and self._shift <= _EXACT_PROFILE_MAX_SHIFT
        l2 = Fraction(self._shift) * Fraction(math.isqrt(coordinates - 1) + 1)
        start = continuous_sigma("analytic", eps, dlt, l2)
        self._sigma2 = self._calibrate(eps, dlt, start)
        self._delta = self._delta_at(eps, self._sigma2)
        self._rng: RandomSource = resolve_rng(rng)
        # ||v||_2 <= shift sqrt(coordinates), rounded up to an integer
        squared = coordinates * self._shift**2
        l2_steps = math.isqrt(squared - 1) + 1 if squared > 1 else 1
        self._charge = DiscreteGaussianCharge(
            self._sigma, l2_steps, eps, self._delta, coordinates
        )

    def _delta_at(self, epsilon: Fraction, sigma2: Fraction) -> Fraction:
        if self._exact:
            return discrete_gaussian_delta_up(epsilon, float(sigma2), self._shift)
        rho = float_up(Fraction(self._coordinates * self._shift**2) / (2 * sigma2))
        return zcdp_delta_up(epsilon, math.nextafter(rho, math.inf))

    def _calibrate(self, epsilon: Fraction, delta: Fraction, sigma: float) -> Fraction:
        def ok(s2: float) -> bool:
            return self._delta_at(epsilon, Fraction(s2)) <= delta

        lo = hi = sigma * sigma
        while not ok(hi):
            lo, hi = hi, hi * 1.5
        if lo == hi:
            lo = hi / 1.5
            while ok(lo) and lo > 1e-300:
                hi, lo = lo, lo / 1.5
        hi = bisect_geometric(ok, lo, hi, 1e-6)
        # s rounded up to 26 significant bits, so that s^2 is exact and the charge can
        # carry s itself; raised again should the bound at s^2 not fit
        s = _coarse_up(math.sqrt(hi))
        while not ok(s * s):
            s = _coarse_up(s * (1 + 2.0**-20))
        self._sigma = Fraction(s)
        return self._sigma**2

    @property
    def charge(self) -> DiscreteGaussianCharge:
        """``DiscreteGaussianCharge(s, L, epsilon, delta_bound, coordinates)`` with
        L = ceil(shift sqrt(coordinates)) and s^2 = `sigma2` exactly; its cost is
        ``PrivacyCost(epsilon, delta_bound)``, proven for the discrete sampler."""
        return self._charge

    @property
    def sigma2(self) -> Fraction:
        """The discrete Gaussian's parameter s² (exact, integer units)."""
        return self._sigma2

    @property
    def variance(self) -> float:
        """An upper bound on the noise variance per coordinate: s² (the discrete Gaussian's
        variance is below its parameter s²; Canonne, Kamath and Steinke 2020)."""
        return float(self._sigma2)

    def release(self, value: Any) -> Any:
        """Add noise to an int (returns an int) or to each int of a 1-D sequence (returns
        a list of ints; a list, tuple, numpy array or Series: its labels are dropped).

        Raises:
            UnreleasableResultError: Not integers (names the type and shape only).
        """
        found = _integers(value)
        if isinstance(found, int):
            return found + sample_discrete_gaussian(self._sigma2, self._rng)
        if found is None:
            raise unreleasable(value, _INTEGERS)
        return [v + sample_discrete_gaussian(self._sigma2, self._rng) for v in found]

    def halfwidth(self, level: float) -> int:
        """w with P[|noise| <= w] >= level in one coordinate."""
        return _gaussian_tail_halfwidth(self._sigma2, level)


_INTEGERS = "an integer, or a 1-D sequence of integers"


def _integer(value: Any) -> int | None:
    """One integer (an int, a numpy integer, or an integral float), else None."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and math.isfinite(value) and value == int(value):
        return int(value)
    return None


def _integers(value: Any) -> int | list[int] | None:
    """``value`` as an int or a list of ints, else None; never raises (no exception
    holding the value may become the context of the refusal)."""
    one = _integer(value)
    if one is not None:
        return one
    try:
        if type(value) is list or type(value) is tuple:
            items = value
        else:
            if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
                return None
            arr = np.asarray(value)
            if arr.dtype.kind not in "iufO" or arr.ndim > 1:
                return None
            if arr.ndim == 0:
                return _integer(arr.item())
            items = arr.tolist()
        out: list[int] = []
        for v in items:
            one = _integer(v)
            if one is None:
                return None
            out.append(one)
    except Exception:  # a hostile __array__ or __len__ may raise anything, value inside
        return None
    return out


def _check_int_sensitivity(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidCostError("sensitivity", value, "must be a positive integer")
    return int(value)


def _check_coordinates(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidCostError("coordinates", value, "must be an integer >= 1")
    return value


#: The integer noise an aggregate adds.
IntegerNoise = IntegerLaplaceMechanism | IntegerGaussianMechanism
