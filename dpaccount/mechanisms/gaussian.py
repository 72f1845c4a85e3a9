"""The Gaussian mechanism, implemented exactly with the discrete Gaussian on a lattice.

The answer (scalar or vector, L2 sensitivity ``sensitivity``) is rounded to the lattice
``g * Z^d`` and integer noise from the discrete Gaussian N_Z(0, s²) (s = sigma / g) is
added in each coordinate, drawn exactly (Canonne, Kamath and Steinke 2020, "The Discrete
Gaussian for Differential Privacy", Algorithm 3). No float sample is ever added, so the
low-bit attack on floating-point noise (Mironov 2012) does not apply.

**Lattice sensitivity.** Rounding moves each coordinate by at most g/2, so neighbouring
answers land on integer points whose difference v has
``||v||_2 <= sensitivity / g + sqrt(d)``. In one dimension |v| is an integer, so
``|v| <= S = floor(sensitivity / g) + 1``; in d dimensions ``||v||_2² <= S2² =
floor((sensitivity / g + sqrt(d))²)`` (computed upward).

**What is charged (the sampler's own guarantee, never the continuous one).**

* d = 1: for an integer shift s the exact privacy profile of the discrete Gaussian is
  delta_s(eps) = P[Y > eps s²_σ / s - s/2] - e^eps P[Y > eps s²_σ / s + s/2], Y ~ N_Z(0, s²_σ)
  (Canonne, Kamath and Steinke 2020, Thm 7; it is the hockey-stick divergence evaluated
  on the event {privacy loss > eps}). The charge uses max over s = 1..S, with the
  discrete tails bounded rigorously (exact partial sums with a floating-point error
  margin, or integral sandwich bounds for very large s_σ) and rounded upward.
* d > 1: the discrete Gaussian with integer shift v satisfies
  D_alpha <= alpha ||v||² / (2 s²_σ) (its moment generating function is dominated by the
  continuous one, CKS 2020 Cor. 9, giving rho-zCDP with rho = S2² / (2 s²_σ), CKS 2020
  Thm 14), and rho-zCDP implies (eps, delta)-DP with
  delta = inf_{alpha > 1} exp((alpha - 1)(alpha rho - eps)) (1 - 1/alpha)^(alpha - 1) / alpha
  (CKS 2020 Cor. 13). This is a little looser than the one-dimensional exact profile.

**Calibration.** ``sigma`` is first set by the chosen continuous calibration at the
lattice sensitivity (``S * g``; ``S2 * g`` for vectors), then raised, if needed, until
the discrete guarantee above is within the requested (epsilon, delta). The lattice
sigma s = sigma / g is rounded up to 26 significant bits, so that s² (the sampler's
parameter) is exact. The charge is a
`DiscreteGaussianCharge` ``(s, S, epsilon, delta_charged,
dimension)`` whose cost is ``PrivacyCost(epsilon, delta_charged)`` with
``delta_charged <= delta``, the sampler's proven bound; tight engines read s and S
(Renyi DP, and the exact discrete PLD for a scalar). (A
`GaussianCharge` is not used: tight engines read it as
continuous Gaussian noise, and the discrete profile is not proven to be dominated by
the continuous one.)

Calibrations (each refuses parameters outside its proof):

* ``"analytic"`` (default): Balle and Wang 2018, "Improving the Gaussian Mechanism for
  Differential Privacy", Thm 8: the smallest sigma whose exact delta(eps) is <= delta,
  found by bisection and verified with `dpaccount._numeric.gaussian_delta_up()`.
  Any eps > 0.
* ``"classic"``: Dwork and Roth 2014, Thm A.1: sigma = sqrt(2 ln(1.25/delta)) Δ / eps,
  proven only for eps < 1 (refused otherwise).
* ``"chernoff"``: the Chernoff tail bound P[ξ > t] <= exp(-t²/2) on the privacy loss
  (Dwork and Roth 2014, proof of Thm A.1 / Lemma 3.17 route): eps sigma/Δ - Δ/(2 sigma)
  >= sqrt(2 ln(1/delta)), solved exactly for sigma. Any eps > 0.
* ``"mills"``: the Mills-ratio tail P[ξ > t] <= φ(t)/t with t >= 1:
  eps sigma/Δ - Δ/(2 sigma) >= max(1, sqrt(ln(1/(2π delta²)))). Any eps > 0.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import special

from dpaccount._numeric import (
    bisect_geometric,
    check_delta,
    check_float_delta,
    check_positive,
    float_down,
    float_up,
    gaussian_delta_up,
    up,
)
from dpaccount.charges import DiscreteGaussianCharge
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms._sampling import (
    RandomSource,
    check_dimension,
    from_lattice,
    power_of_two_at_most,
    resolve_rng,
    sample_discrete_gaussian,
    to_lattice,
)
from dpaccount.mechanisms.base import Mechanism

__all__ = [
    "CALIBRATIONS",
    "GaussianMechanism",
    "continuous_sigma",
    "discrete_gaussian_delta_up",
    "zcdp_delta_up",
]

CALIBRATIONS = ("analytic", "classic", "chernoff", "mills")

#: Default lattice: granularity <= sensitivity / (_FINENESS * dimension). The lattice
#: sensitivity is then at most 1 + 1 / 2048 times the true one (in d dimensions
#: 1 + 1 / (2048 sqrt d)), so the lattice adds at most 0.049 % to sigma; sampling time
#: does not depend on it (measured: 38 us per scalar release at 256 and at 2048).
_FINENESS = 2048
#: Exact partial sums are used up to this many terms; beyond, integral sandwich bounds.
_MAX_TERMS = 2_000_000
#: Largest one-dimensional lattice sensitivity accepted (every shift is evaluated).
_MAX_SHIFT = 1_000_000
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
# The mechanism
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


class GaussianMechanism(Mechanism):
    """Discrete Gaussian noise on a lattice for an L2-sensitivity query.

    Proven (epsilon, delta)-DP for one release (see the module docstring for the
    theorems: Canonne, Kamath and Steinke 2020, Thm 7 in one dimension, Thm 14 with
    Cor. 13 in several; calibrations from Balle and Wang 2018 Thm 8, Dwork and Roth 2014
    Thm A.1). It is one mechanism with fixed parameters; an accountant composes it.

    Args:
        epsilon: > 0.
        delta: In (0, 1).
        sensitivity: L2 sensitivity of the query, > 0 (for the float answers given).
        calibration: ``"analytic"`` (default), ``"classic"`` (epsilon < 1 only),
            ``"chernoff"`` or ``"mills"``.
        dimension: The number of coordinates (1 for a scalar).
        granularity: Lattice spacing g; default the largest power of two
            <= sensitivity / (2048 * dimension), which adds at most 0.049 % to sigma.
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Raises:
        InvalidCostError: An invalid parameter, or one outside the calibration's proof.
        ConfigError: An unknown calibration.

    Examples:
        >>> from dpaccount.mechanisms._sampling import RandomSource
        >>> m = GaussianMechanism(1, "1e-5", 1, rng=RandomSource.seeded(0))
        >>> 3.72 < m.sigma < 3.74          # Balle-Wang: 3.73 at the lattice sensitivity
        True
        >>> m.charge.epsilon, m.charge.delta <= Fraction(1, 100000)
        (Fraction(1, 1), True)
        >>> m.charge.sigma ** 2 == m.lattice_sigma2, m.charge.sensitivity   # S = 2048 + 1
        (True, Fraction(2049, 1))
        >>> isinstance(m.release(10.0), float)
        True
    """

    def __init__(
        self,
        epsilon: Any,
        delta: Any,
        sensitivity: Any,
        *,
        calibration: str = "analytic",
        dimension: int = 1,
        granularity: Any = None,
        rng: Any = None,
    ) -> None:
        eps = check_positive(epsilon, "epsilon")
        dlt = check_float_delta(check_delta(delta), "delta")
        if dlt == 0:
            raise InvalidCostError("delta", delta, "the Gaussian mechanism needs delta > 0")
        self._setup(sensitivity, dimension, granularity, rng)
        self._calibration = calibration
        start = continuous_sigma(calibration, eps, dlt, self.lattice_sensitivity_bound)
        sigma = self._raise_until(eps, dlt, start)
        self._set_sigma(sigma)
        self._point: tuple[Fraction, Fraction] | None = (eps, self.delta_for(eps))

    @classmethod
    def from_sigma(
        cls,
        sigma: Any,
        sensitivity: Any,
        *,
        epsilon: Any = None,
        delta: Any = None,
        dimension: int = 1,
        granularity: Any = None,
        rng: Any = None,
    ) -> GaussianMechanism:
        """A mechanism with a given noise ``sigma``; its guarantee is a curve.

        ``delta_for(epsilon)`` and ``epsilon_for(delta)`` report upper bounds on the
        curve. The charge is taken at ``epsilon`` (delta = delta_for(epsilon)) or at
        ``delta`` (epsilon = epsilon_for(delta)); give one of them to charge it.

        Examples:
            >>> m = GaussianMechanism.from_sigma(4, 1, delta="1e-5")
            >>> 0.9 < float(m.charge.epsilon) < 1.0
            True
            >>> float(m.delta_for(1)) < 1e-5
            True
        """
        self = cls.__new__(cls)
        sig = check_positive(sigma, "sigma")
        self._setup(sensitivity, dimension, granularity, rng)
        self._calibration = "given"
        self._set_sigma(float_up(sig))
        if epsilon is not None and delta is not None:
            raise ConfigError("give epsilon or delta for the charge, not both")
        self._point = None
        if epsilon is not None:
            eps = check_positive(epsilon, "epsilon")
            self._point = (eps, self.delta_for(eps))
        elif delta is not None:
            dlt = check_float_delta(check_delta(delta), "delta")
            self._point = (self.epsilon_for(dlt), dlt)
        return self

    # -- construction helpers -------------------------------------------------------------

    def _setup(self, sensitivity: Any, dimension: int, granularity: Any, rng: Any) -> None:
        self._sensitivity = check_positive(sensitivity, "sensitivity")
        self._dimension = check_dimension(dimension)
        if granularity is None:
            self._granularity = power_of_two_at_most(
                self._sensitivity / (_FINENESS * self._dimension)
            )
        else:
            self._granularity = check_positive(granularity, "granularity")
        ratio = self._sensitivity / self._granularity
        if self._dimension == 1:
            self._shift = math.floor(ratio) + 1
            if self._shift > _MAX_SHIFT:
                raise InvalidCostError(
                    "granularity",
                    granularity,
                    f"too fine: the lattice sensitivity {self._shift} exceeds {_MAX_SHIFT} "
                    "steps (the exact privacy profile is evaluated at every shift)",
                )
            self._shift2 = Fraction(self._shift**2)
        else:
            # ||v||² <= (ratio + sqrt(d))², an integer: floor of an upper bound.
            sqrt_d = Fraction(math.nextafter(math.sqrt(self._dimension), math.inf))
            self._shift2 = Fraction(math.floor((ratio + sqrt_d) ** 2))
            self._shift = 0
        self._rng: RandomSource = resolve_rng(rng)

    @property
    def lattice_sensitivity_bound(self) -> Fraction:
        """The sensitivity on the lattice in the answer's units (S * g, or an upper bound
        on S2 * g for vectors)."""
        if self._dimension == 1:
            return self._shift * self._granularity
        n = int(self._shift2)
        return (math.isqrt(n - 1) + 1) * self._granularity  # ceil(sqrt(S2²)) * g

    def _lattice_sigma(self, sigma: float) -> float:
        """sigma / g rounded up to 26 significant bits, so that its square is exact."""
        return _coarse_up(float_up(Fraction(sigma) / self._granularity))

    def _set_sigma(self, sigma: float) -> None:
        # The sampler's parameter s²_σ = s² with s = sigma / g rounded up to 26 bits: s²
        # is an exact double and an exact Fraction, so the charge can carry s itself and
        # every bound below is computed for exactly this value.
        s = self._lattice_sigma(sigma)
        self._lattice_s = Fraction(s)
        self._lattice_sigma2 = self._lattice_s**2
        self._sigma = float_up(self._lattice_s * self._granularity)

    def _delta_at(self, epsilon: Fraction, lattice_sigma2: float) -> Fraction:
        if self._dimension == 1:
            return discrete_gaussian_delta_up(epsilon, lattice_sigma2, self._shift)
        rho = float(self._shift2) / (2.0 * lattice_sigma2) * (1 + 1e-14)
        return zcdp_delta_up(epsilon, rho)

    def _raise_until(self, epsilon: Fraction, delta: Fraction, sigma: float) -> float:
        """The smallest sigma >= ``sigma`` (to ~1e-6 relative) whose discrete bound fits."""

        def ok(sig: float) -> bool:
            s = self._lattice_sigma(sig)
            return self._delta_at(epsilon, s * s) <= delta

        if ok(sigma):
            return sigma
        lo, hi = sigma, sigma * 1.01
        while not ok(hi):
            lo, hi = hi, hi * 1.25
        return bisect_geometric(ok, lo, hi, 1e-6)

    # -- the interface ----------------------------------------------------------------------

    @property
    def charge(self) -> DiscreteGaussianCharge:
        """The sampler described in lattice units, with its proven (epsilon, delta).

        ``DiscreteGaussianCharge(s, S, epsilon, delta, dimension)``: s = sigma / g (the
        sampler's exact parameter, s² = `lattice_sigma2`), S the lattice
        sensitivity (the integer shift bound for a scalar; an upper bound on the L2 norm
        of the integer shift for vectors); its cost is ``PrivacyCost(epsilon, delta)``.

        Raises:
            ConfigError: A ``from_sigma`` mechanism built without ``epsilon``/``delta``.
        """
        if self._point is None:
            raise ConfigError(
                "this mechanism was built from sigma without a point of its privacy "
                "curve; use GaussianMechanism.from_sigma(..., epsilon=...) or delta=..."
            )
        # Built once: the mechanism's parameters do not change after construction, and a
        # charge is validated when it is built (the per-charge cost of a mechanism).
        built = getattr(self, "_built_charge", None)
        if built is None or built[0] != (self._lattice_s, self._point, self._dimension):
            charge = DiscreteGaussianCharge(
                self._lattice_s,
                self._lattice_steps(),
                self._point[0],
                self._point[1],
                self._dimension,
            )
            built = ((self._lattice_s, self._point, self._dimension), charge)
            self._built_charge = built
        return built[1]

    def _lattice_steps(self) -> Fraction:
        """The shift bound in lattice steps: S, or a dyadic >= sqrt(S2²) for vectors."""
        if self._dimension == 1:
            return Fraction(self._shift)
        n = int(self._shift2)
        root = Fraction(math.sqrt(n))
        while root * root < n:
            root = Fraction(math.nextafter(float(root), math.inf))
        return root

    @property
    def sigma(self) -> float:
        """The standard-deviation parameter of the noise, in the answer's units."""
        return self._sigma

    @property
    def lattice_sigma2(self) -> Fraction:
        """The discrete Gaussian's parameter s²_σ in lattice units (exact)."""
        return self._lattice_sigma2

    @property
    def granularity(self) -> Fraction:
        """The lattice spacing g."""
        return self._granularity

    @property
    def sensitivity(self) -> Fraction:
        """The declared L2 sensitivity."""
        return self._sensitivity

    @property
    def dimension(self) -> int:
        """The number of coordinates ``release`` expects."""
        return self._dimension

    @property
    def calibration(self) -> str:
        """The calibration used (``"given"`` for `from_sigma()`)."""
        return self._calibration

    def delta_for(self, epsilon: Any) -> Fraction:
        """An upper bound on delta at ``epsilon`` for this sampler (exact Fraction)."""
        eps = check_positive(epsilon, "epsilon")
        return self._delta_at(eps, float(self._lattice_sigma2))

    def epsilon_for(self, delta: Any) -> Fraction:
        """An epsilon (rounded up) at which the sampler is (epsilon, delta)-DP.

        Raises:
            InvalidCostError: For delta = 0 (the Gaussian has no pure guarantee).
        """
        dlt = check_float_delta(check_delta(delta), "delta")
        if dlt == 0:
            raise InvalidCostError("delta", delta, "the Gaussian mechanism needs delta > 0")
        hi = 1.0
        while self.delta_for(Fraction(hi)) > dlt:
            hi *= 2.0
            if hi > 1e6:
                raise InvalidCostError("delta", delta, "no epsilon below 1e6 reaches it")
        lo = 0.0
        for _ in range(50):
            mid = (lo + hi) / 2.0
            if mid > 0 and self.delta_for(Fraction(mid)) <= dlt:
                hi = mid
            else:
                lo = mid
        return Fraction(hi)

    def release(self, value: Any) -> Any:
        """The answer rounded to the lattice plus discrete Gaussian noise.

        Args:
            value: A finite real number, or an array of ``dimension`` of them.

        Returns:
            A float for a scalar input, else a plain float64 numpy array of the input's
            shape. Only the noised numbers come out: a pandas Series' or DataFrame's
            index, name and columns, a structured array's fields and any other label
            are dropped (labels computed from data are data; a guard gives declared
            labels back, see `dpaccount.mechanisms.labels`).
        """
        k, shape = to_lattice(value, self._granularity, self._dimension)
        s2 = self._lattice_sigma2
        noisy = [x + sample_discrete_gaussian(s2, self._rng) for x in k]
        return from_lattice(noisy, self._granularity, shape)

    def __repr__(self) -> str:
        return (
            f"GaussianMechanism(sigma={self._sigma!r}, "
            f"sensitivity={float(self._sensitivity)!r}, dimension={self._dimension}, "
            f"calibration={self._calibration!r})"
        )
