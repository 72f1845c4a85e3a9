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

The calibrations and the bounds on the discrete profile are computed in
`dpaccount.mechanisms.gaussian_calibration`, and imported from here as before.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dpaccount._numeric import (
    bisect_geometric,
    check_delta,
    check_float_delta,
    check_positive,
    float_up,
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
from dpaccount.mechanisms.gaussian_calibration import (
    CALIBRATIONS,
    _coarse_up,
    continuous_sigma,
    discrete_gaussian_delta_up,
    zcdp_delta_up,
)

__all__ = [
    "CALIBRATIONS",
    "GaussianMechanism",
    "continuous_sigma",
    "discrete_gaussian_delta_up",
    "zcdp_delta_up",
]

#: Default lattice: granularity <= sensitivity / (_FINENESS * dimension). The lattice
#: sensitivity is then at most 1 + 1 / 2048 times the true one (in d dimensions
#: 1 + 1 / (2048 sqrt d)), so the lattice adds at most 0.049 % to sigma; sampling time
#: does not depend on it (measured: 38 us per scalar release at 256 and at 2048).
_FINENESS = 2048
#: Largest one-dimensional lattice sensitivity accepted (every shift is evaluated).
_MAX_SHIFT = 1_000_000


# ---------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------


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
