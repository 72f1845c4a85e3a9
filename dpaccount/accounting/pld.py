"""Privacy loss distributions (PLD): tight (epsilon, delta) for declared plans.

The engine represents a mechanism by the distribution of its privacy loss on a grid of
spacing ``value_discretization_interval`` and composes by FFT convolution (Koskela,
Jalko and Honkela 2020, "Computing tight differential privacy guarantees using FFT",
AISTATS; Koskela, Jalko, Prediger and Honkela 2021, AISTATS). Every result is an interval
(lower, upper):

* the upper end comes from a *pessimistic* discretisation, the "connect the dots"
  construction of Doroshenko, Ghazi, Kamath, Kumar and Manurangsi 2022 ("Connect the
  dots: tighter discrete approximations of privacy loss distributions", PETS): its
  privacy profile dominates the mechanism's, so the composed value is a certified
  upper bound (tails truncated with the truncated mass added to delta; floating-point
  error of every FFT bounded and added to delta);
* the lower end comes from an *optimistic* discretisation: the output is binned by its
  loss (post-processing) and each bin's loss rounded down to the grid (Meiser and
  Mohammadi 2018, "Tight on budget?", CCS, round down without binning).

Self-composition raises one FFT to the k-th power on a window chosen by a Chernoff
bound (the mass outside is bounded and added to delta); heterogeneous composition
convolves in sequence.

Mechanisms: Gaussian (sigma, sensitivity), Laplace (scale, sensitivity), any
(epsilon, delta) guarantee through its dominating pair (Kairouz, Oh and Viswanath 2015,
Thm 2.4: the randomized response pair; composing those gives the optimal composition of
the declared plan), Poisson-subsampled Gaussian and Laplace under add/remove (both the
remove and the add direction are composed; the result is the larger of the two: the
direction is the same at every step, Zhu, Dong and Wang 2022, "Optimal accounting of
differential privacy via characteristic function", AISTATS), and
without-replacement-subsampled Gaussian and Laplace under substitution. For the latter the
analyst may choose at every step which of the two orders the differing records take, so
each step uses one pair whose profile is the maximum of both orders' profiles
(`SymmetrisedPair`; Lebeda, Regehr, Kamath and
Steinke 2024, arXiv:2405.20769, on why composing each order on its own is unsound there;
ZDW 2022, Thm 10, for the adaptive composition of dominating pairs). Gaussians
without subsampling are composed exactly first: k Gaussians of noise multipliers s_i
are one Gaussian of mu = sqrt(sum 1/s_i^2) (Dong, Roth and Su 2019, Cor. 3.3).

Adaptivity: the PLD composition theorem holds for mechanisms chosen adaptively as long
as the *sequence of dominating pairs* (mechanism kinds and parameters) is fixed in
advance (composition of dominating pairs, Zhu, Dong and Wang 2022; Dong, Roth and Su 2019,
Thm 3.2): ``ADAPTIVE_MECHANISMS``. Parameters chosen at run time are *not* covered: the
natural "stop when the composed PLD crosses the budget" filter is not valid in general,
so `PLDRule` only takes a declared plan.

Examples:
    >>> pld = PrivacyLossDistribution.gaussian(sigma=1, value_discretization_interval=1e-3)
    >>> low, high = pld.epsilon(1e-5)
    >>> 4.36 < float(low) <= float(high) < 4.39   # exact (Balle-Wang) 4.3772 at mu = 1
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import (
    at_most,
    check_count,
    check_delta,
    check_epsilon,
    check_positive,
    check_rate,
    down,
    float_down,
    float_up,
    log1p_expm1_scaled_up,
    up,
)
from dpaccount.accounting._discrete import DiscretePLD, from_pair, upper_from_profile
from dpaccount.accounting._pairs import (
    MAX_DISCRETE_TERMS,
    BoundedRangePair,
    DiscreteGaussianPair,
    DiscreteLaplacePair,
    GaussianPair,
    KaryRandomizedResponsePair,
    LaplacePair,
    Pair,
    RandomizedResponsePair,
    SubsampledGaussianPair,
    SubsampledLaplacePair,
    SymmetrisedPair,
)
from dpaccount.accounting._plans import DeclaredPlan, as_charges
from dpaccount.charges import (
    SCHEME_RELATION,
    Atom,
    BoundedRangeCharge,
    Charge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
    atoms,
    cost_of,
)
from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = ["PLDRule", "PrivacyLossDistribution", "compose_plan"]

#: Default grid spacing of loss values (dp_accounting's default too).
DEFAULT_INTERVAL = 1e-4
#: Default P-mass dropped per tail per truncation (moved to delta in the upper bound).
DEFAULT_TAIL_MASS = 1e-15

_THEOREM = (
    "Privacy loss distributions: Koskela, Jalko and Honkela 2020 (FFT accounting); "
    "Doroshenko, Ghazi, Kamath, Kumar and Manurangsi 2022 (connect-the-dots pessimistic "
    "discretisation); Dong, Roth and Su 2019, Thm 3.2 and Zhu, Dong and Wang 2022 "
    "(composition of dominating pairs, subsampling); valid for adaptively chosen "
    "mechanisms with a fixed, declared sequence of privacy parameters"
)


def _check_interval(value: Any) -> float:
    interval = float_down(check_positive(value, "value_discretization_interval"))
    if interval > 1:
        raise InvalidCostError("value_discretization_interval", value, "must be <= 1")
    return interval


def _check_tail(value: Any) -> float:
    tail = float_down(check_positive(value, "tail_mass"))
    if tail > 1e-6:
        raise InvalidCostError("tail_mass", value, "must be <= 1e-6")
    return tail


#: Bits kept by `_Support` when a survival probability's exact denominator grows.
_SURVIVAL_BITS = 256


def _round_down(value: Fraction) -> Fraction:
    """``value`` rounded down to a multiple of 2^-256 once its denominator is larger."""
    if value.denominator.bit_length() <= _SURVIVAL_BITS:
        return value
    scale = 1 << _SURVIVAL_BITS
    return Fraction(value.numerator * scale // value.denominator, scale)


@attrs.frozen
class _Support:
    """Certified facts about the privacy loss of a pair with bounded finite losses.

    Every finite loss is at most ``top`` and P(L = +inf) is at most ``1 - survival``,
    so delta(eps) <= 1 - survival for eps >= top, and epsilon(delta) <= top for
    delta >= 1 - survival. Both are exact rationals (rounded toward more privacy loss:
    ``top`` up, ``survival`` down), so the pure-DP answer at delta = 0 is exact where
    the grid's floating-point allowances cannot reach it. Under composition the
    finite losses add and the mass at +inf composes as 1 - prod(1 - m_i) (the losses
    of a product pair add; Dong, Roth and Su 2019, Thm 3.2; Zhu, Dong and Wang 2022,
    Thm 10 for adaptive composition).
    """

    top: Fraction
    survival: Fraction

    def compose(self, other: _Support) -> _Support:
        return _Support(self.top + other.top, _round_down(self.survival * other.survival))

    def power(self, count: int) -> _Support:
        survival, base, k = Fraction(1), self.survival, count
        while k:
            if k & 1:
                survival = _round_down(survival * base)
            k >>= 1
            if k:
                base = _round_down(base * base)
        return _Support(self.top * count, survival)

    def epsilon_cap(self, delta: Fraction) -> Fraction | None:
        """``top`` if ``delta`` covers the mass at +inf, else None (no cap)."""
        return self.top if delta >= 1 - self.survival else None


def _compose_support(a: _Support | None, b: _Support | None) -> _Support | None:
    return None if a is None or b is None else a.compose(b)


def _subsampled_tops(e0: float, rate: float) -> tuple[Fraction, Fraction]:
    """Upper bounds on the largest loss of an e0-DP pair subsampled at ``rate``.

    Remove: ln(1 + q (e^e0 - 1)); add: -ln(1 + q (e^-e0 - 1)) (the two extreme
    likelihood ratios of the mixture; Balle, Barthe and Gaboardi 2018, Thm 8 for the
    amplification; both increase with e0 and q, which callers round up).
    """
    add = -math.log1p(rate * math.expm1(-e0))
    return log1p_expm1_scaled_up(Fraction(rate), Fraction(e0)), up(add * (1 + 1e-14), ulps=8)


@attrs.frozen(eq=False)
class _Directions:
    """The four discretisations of one privacy loss distribution.

    ``remove``/``add`` are the two orders of an add/remove pair; where one discretisation
    serves both orders (a symmetric mechanism, or the symmetrised upper bound of
    sampling without replacement) the two fields hold the same object, composed once.
    The upper and the lower ends are symmetric or not independently.
    """

    upper_remove: DiscretePLD
    upper_add: DiscretePLD
    lower_remove: DiscretePLD | None
    lower_add: DiscretePLD | None
    support_remove: _Support | None = None
    support_add: _Support | None = None

    @property
    def symmetric(self) -> bool:
        return self.upper_remove is self.upper_add

    @property
    def lower_symmetric(self) -> bool:
        return self.lower_remove is self.lower_add


class PrivacyLossDistribution:
    """A composable privacy loss distribution with certified upper and lower bounds.

    Build one with the class methods (`gaussian()`, `laplace()`,
    `from_privacy_parameters()`, `from_charge()`), compose with
    `compose()` and `self_compose()`, and read `epsilon()` and
    `delta()`, each as a pair ``(lower, upper)`` of exact Fractions: the true value
    of the *mechanism* is at most ``upper``; ``lower`` is what the optimistic
    discretisation gives, a lower bound on the value of these dominating pairs (0 when
    built with ``lower=False``).

    Examples:
        >>> pld = PrivacyLossDistribution.laplace(scale=1, value_discretization_interval=1e-3)
        >>> low, high = pld.delta(0.5)     # exact: 1 - exp((0.5 - 1) / 2) = 0.2212
        >>> float(low) <= 0.2211992169 <= float(high) < 0.2212
        True
    """

    __slots__ = ("_d", "interval", "tail_mass")

    def __init__(self, directions: _Directions, interval: float, tail_mass: float) -> None:
        self._d = directions
        self.interval = interval
        self.tail_mass = tail_mass

    # -- construction --------------------------------------------------------------

    @classmethod
    def _from_pairs(
        cls,
        remove: Pair,
        add: Pair | None,
        interval: float,
        tail_mass: float,
        lower: bool = True,
        support: tuple[_Support | None, _Support | None] = (None, None),
    ) -> PrivacyLossDistribution:
        up_r = from_pair(remove, interval, tail_mass, pessimistic=True)
        low_r = from_pair(remove, interval, tail_mass, pessimistic=False) if lower else None
        if add is None:
            directions = _Directions(up_r, up_r, low_r, low_r, support[0], support[0])
            return cls(directions, interval, tail_mass)
        up_a = from_pair(add, interval, tail_mass, pessimistic=True)
        low_a = from_pair(add, interval, tail_mass, pessimistic=False) if lower else None
        return cls(_Directions(up_r, up_a, low_r, low_a, *support), interval, tail_mass)

    @classmethod
    def _from_either_order(
        cls,
        first: Pair,
        second: Pair,
        interval: float,
        tail_mass: float,
        lower: bool,
        support: tuple[_Support | None, _Support | None] = (None, None),
    ) -> PrivacyLossDistribution:
        """One step whose order the analyst may choose: upper bound from both orders.

        The upper end is the connect-the-dots discretisation of the pointwise maximum
        of the two orders' profiles (`SymmetrisedPair`), so it composes validly
        when the order changes from step to step. The lower end composes each order on
        its own: an analyst who keeps one order throughout attains it.
        """
        upper = upper_from_profile(SymmetrisedPair(first, second), interval, tail_mass)
        low_1 = from_pair(first, interval, tail_mass, pessimistic=False) if lower else None
        low_2 = from_pair(second, interval, tail_mass, pessimistic=False) if lower else None
        both = None
        if support[0] is not None and support[1] is not None:
            both = _Support(
                max(support[0].top, support[1].top),
                min(support[0].survival, support[1].survival),
            )
        return cls(_Directions(upper, upper, low_1, low_2, both, both), interval, tail_mass)

    @classmethod
    def _subsampled(
        cls, remove: Pair, add: Pair, scheme: Scheme, interval: float, tail: float,
        lower: bool, support: tuple[_Support | None, _Support | None] = (None, None),
    ) -> PrivacyLossDistribution:
        if scheme is Scheme.WITHOUT_REPLACEMENT:
            return cls._from_either_order(remove, add, interval, tail, lower, support)
        return cls._from_pairs(remove, add, interval, tail, lower, support)

    @classmethod
    def gaussian(
        cls,
        sigma: Any,
        sensitivity: Any = 1,
        *,
        sampling_rate: Any = 1,
        scheme: Scheme | str = Scheme.POISSON,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The PLD of a Gaussian mechanism, optionally subsampled.

        Args:
            sigma: Noise standard deviation, > 0.
            sensitivity: L2 sensitivity, > 0.
            sampling_rate: The sampling rate in (0, 1].
            scheme: ``"poisson"`` (add/remove neighbours; each direction composed on its
                own) or ``"without_replacement"`` (substitution neighbours; one pair
                dominating both orders, valid when the order changes between steps).
            value_discretization_interval: Grid spacing of the loss (accuracy).
            tail_mass: Mass truncated per tail (added to delta in the upper bound).
            lower: Also build the optimistic discretisation; without it (about half
                the work) the lower end of every result is reported as 0.
        """
        mu = _mu(check_positive(sigma, "sigma"), check_positive(sensitivity, "sensitivity"))
        rate, the_scheme = _rate(sampling_rate), _scheme(scheme)
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        if rate >= 1:
            return cls._from_pairs(GaussianPair(mu), None, interval, tail, lower)
        return cls._subsampled(
            SubsampledGaussianPair(mu, rate, remove=True),
            SubsampledGaussianPair(mu, rate, remove=False),
            the_scheme,
            interval,
            tail,
            lower,
        )

    @classmethod
    def laplace(
        cls,
        scale: Any,
        sensitivity: Any = 1,
        *,
        sampling_rate: Any = 1,
        scheme: Scheme | str = Scheme.POISSON,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The PLD of a Laplace mechanism, optionally subsampled (see `gaussian()`)."""
        scale_f = check_positive(scale, "scale")
        e0 = float_up(check_positive(sensitivity, "sensitivity") / scale_f)
        rate, the_scheme = _rate(sampling_rate), _scheme(scheme)
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        if rate >= 1:
            # Every loss lies in [-e0, e0] (an exact Fraction; the pair uses e0 rounded up).
            support = _Support(check_positive(sensitivity, "sensitivity") / scale_f, Fraction(1))
            return cls._from_pairs(LaplacePair(e0), None, interval, tail, lower, (support, None))
        top_r, top_a = _subsampled_tops(e0, rate)
        return cls._subsampled(
            SubsampledLaplacePair(e0, rate, remove=True),
            SubsampledLaplacePair(e0, rate, remove=False),
            the_scheme,
            interval,
            tail,
            lower,
            (_Support(top_r, Fraction(1)), _Support(top_a, Fraction(1))),
        )

    @classmethod
    def discrete_gaussian(
        cls,
        sigma: Any,
        sensitivity: Any = 1,
        *,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The exact PLD of the scalar discrete Gaussian N_Z(0, sigma^2), integer shifts.

        The pair (N_Z(S, sigma^2), N_Z(0, sigma^2)) with S = ``sensitivity`` dominates
        every integer shift |v| <= S; its loss takes values on an arithmetic progression
        with the pmf's masses (see `DiscreteGaussianPair`
        for the rigorous tail sums). Canonne, Kamath and Steinke 2020, Thm 7 (the
        profile); it is symmetric, so add and remove coincide.

        Args:
            sigma: The discrete Gaussian's sigma in lattice steps, > 0.
            sensitivity: The largest integer shift S >= 1.

        Raises:
            InvalidCostError: A non-integer sensitivity, or sigma too large for the
                exact sums (more than 2e6 terms); use the charge's (epsilon, delta).

        Examples:
            >>> pld = PrivacyLossDistribution.discrete_gaussian(
            ...     2, 1, value_discretization_interval=1e-3)
            >>> low, high = pld.delta(0)    # total variation: P[Y = 0] of N_Z(0, 4)
            >>> 0.1994 < float(low) <= float(high) < 0.1996
            True
        """
        sig = check_positive(sigma, "sigma")
        shift = check_positive(sensitivity, "sensitivity")
        if shift.denominator != 1:
            raise InvalidCostError("sensitivity", sensitivity, "must be an integer (lattice steps)")
        sigma2 = float_up(sig * sig)
        if math.ceil(14 * math.sqrt(sigma2)) + 2 > MAX_DISCRETE_TERMS:
            raise InvalidCostError("sigma", sigma, "too large for the exact discrete PLD")
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        pair = DiscreteGaussianPair(sigma2, int(shift))
        return cls._from_pairs(pair, None, interval, tail, lower)

    @classmethod
    def discrete_laplace(
        cls,
        scale: Any,
        sensitivity: Any = 1,
        *,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The exact PLD of the scalar discrete Laplace (P[y] ∝ exp(-|y|/scale)), integer
        shifts up to S = ``sensitivity``.

        The pair (DLap(S, b), DLap(0, b)) dominates every integer shift |v| <= S; its
        losses are (2j - S)/b, j = 0..S (see
        `DiscreteLaplacePair`). Symmetric.

        Examples:
            >>> pld = PrivacyLossDistribution.discrete_laplace(
            ...     1, 1, value_discretization_interval=1e-3)
            >>> low, high = pld.delta(0)   # total variation tanh(1/2) = 0.4621171572600
            >>> float(low) <= 0.46211715726 <= float(high) < 0.4621172
            True
        """
        scale_f = check_positive(scale, "scale")
        shift = check_positive(sensitivity, "sensitivity")
        if shift.denominator != 1:
            raise InvalidCostError("sensitivity", sensitivity, "must be an integer (lattice steps)")
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        # A smaller scale only raises the loss: round b down (1/b up).
        pair = DiscreteLaplacePair(float_down(scale_f), int(shift))
        support = _Support(shift / scale_f, Fraction(1))  # losses lie in [-S/b, S/b]
        return cls._from_pairs(pair, None, interval, tail, lower, (support, None))

    @classmethod
    def from_privacy_parameters(
        cls,
        epsilon: Any,
        delta: Any = 0,
        *,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The PLD of the dominating pair of any (epsilon, delta)-DP mechanism.

        Kairouz, Oh and Viswanath 2015, Thm 2.4 (randomized response dominates).

        Examples:
            >>> pld = PrivacyLossDistribution.from_privacy_parameters(1, 0,
            ...     value_discretization_interval=1e-3)
            >>> low, high = pld.self_compose(2).delta(0)   # KOV: (e-1)/(e+1) = 0.4621172
            >>> float(low) <= 0.46211715726 <= float(high) < 0.4622
            True
        """
        eps_exact, delta_exact = check_epsilon(epsilon), check_delta(delta)
        eps, dlt = float_up(eps_exact), float_up(delta_exact)
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        # Finite losses are +-epsilon and the mass at +inf is delta, exactly.
        support = _Support(eps_exact, 1 - delta_exact)
        pair = RandomizedResponsePair(eps, dlt)
        return cls._from_pairs(pair, None, interval, tail, lower, (support, None))

    @classmethod
    def randomized_response(
        cls,
        epsilon: Any,
        categories: int = 2,
        *,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The exact PLD of one k-ary randomized response report with ratio e^epsilon.

        Losses +eps, 0 and -eps with masses p, (k-2) q and q (see
        `KaryRandomizedResponsePair`); symmetric.

        Examples:
            >>> pld = PrivacyLossDistribution.randomized_response(
            ...     math.log(17), 4, value_discretization_interval=1e-3)
            >>> low, high = pld.delta(0)     # (e^eps - 1) / (e^eps + k - 1) = 16 / 20
            >>> float(low) <= 0.8 <= float(high) < 0.80001
            True
        """
        eps = check_epsilon(epsilon)
        k = check_count(categories, "categories", minimum=2)
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        pair = KaryRandomizedResponsePair(float_up(eps), k)
        support = _Support(eps, Fraction(1))
        return cls._from_pairs(pair, None, interval, tail, lower, (support, None))

    @classmethod
    def bounded_range(
        cls,
        epsilon: Any,
        *,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """A PLD dominating every epsilon-bounded-range mechanism (the exponential mechanism).

        The upper end discretises the maximum of the profiles of all epsilon-BR pairs
        (`BoundedRangePair`; Dong, Durfee and Rogers 2020, Sec. 4), which is valid for
        adaptive composition; the lower end is the randomized response of epsilon / 2,
        the epsilon-BR pair with t = epsilon / 2 (an exponential mechanism over two
        candidates attains it).

        Examples:
            >>> pld = PrivacyLossDistribution.bounded_range(1, value_discretization_interval=1e-3)
            >>> low, high = pld.delta(0)     # tanh(1/4) = 0.244919; an eps-DP pair: 0.462117
            >>> float(low) <= math.tanh(0.25) <= float(high) < 0.24492
            True
        """
        eps = check_epsilon(epsilon)
        if eps == 0:  # a 0-bounded-range mechanism's output does not depend on the data
            return cls.from_privacy_parameters(
                0, 0, value_discretization_interval=value_discretization_interval,
                tail_mass=tail_mass, lower=lower,
            )
        interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
        upper = upper_from_profile(BoundedRangePair(float_up(eps)), interval, tail)
        low = None
        if lower:
            half = RandomizedResponsePair(float_down(eps / 2), 0.0)
            low = from_pair(half, interval, tail, pessimistic=False)
        support = _Support(eps, Fraction(1))
        return cls(_Directions(upper, upper, low, low, support, support), interval, tail)

    @classmethod
    def from_charge(
        cls,
        charge: Atom,
        *,
        relation: Relation | str = Relation.ADD_REMOVE,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
        lower: bool = True,
    ) -> PrivacyLossDistribution:
        """The PLD of one charge (a single run; see `compose_plan()` for plans).

        Gaussian and Laplace charges (also inside `Subsampled`
        with the scheme that matches ``relation``) use their exact pairs; every other
        charge uses the dominating pair of its (epsilon, delta) guarantee.

        Raises:
            UnsupportedChargeError: A subsampled charge whose scheme's relation is not
                ``relation``.
        """
        rel = Relation(relation)
        options = {
            "value_discretization_interval": value_discretization_interval,
            "tail_mass": tail_mass,
            "lower": lower,
        }
        if isinstance(charge, Subsampled):
            if SCHEME_RELATION[charge.scheme] is not rel:
                raise UnsupportedChargeError(
                    f"a {charge.scheme.value}-subsampled charge is proven for "
                    f"{charge.relation.value} neighbours, not {rel.value}"
                )
            inner = charge.charge
            if isinstance(inner, GaussianCharge):
                return cls.gaussian(
                    inner.sigma, inner.sensitivity, sampling_rate=charge.rate,
                    scheme=charge.scheme, **options,
                )
            if isinstance(inner, LaplaceCharge):
                return cls.laplace(
                    inner.scale, inner.sensitivity, sampling_rate=charge.rate,
                    scheme=charge.scheme, **options,
                )
        if isinstance(charge, Parallel) and charge.relation is not rel:
            raise UnsupportedChargeError(
                f"a parallel charge stated for {charge.relation.value} neighbours cannot be "
                f"composed under {rel.value}"
            )
        if (
            isinstance(charge, Parallel)
            and rel is Relation.ADD_REMOVE
            and _one_part(charge.partitions)
            and not isinstance(charge.partitions[0], (Parallel, Repeated))
        ):
            # one record is in one part and the other parts' outputs are equal and
            # independent of it, so the privacy loss is that part's: its pair dominates
            # (McSherry 2009, Thm 4, in the privacy-loss form; a group-by's parts)
            return cls.from_charge(charge.partitions[0], relation=rel, **options)
        if isinstance(charge, GaussianCharge):
            return cls.gaussian(charge.sigma, charge.sensitivity, **options)
        if isinstance(charge, LaplaceCharge):
            return cls.laplace(charge.scale, charge.sensitivity, **options)
        if isinstance(charge, RandomizedResponseCharge):
            return cls.randomized_response(charge.epsilon, charge.categories, **options)
        if isinstance(charge, BoundedRangeCharge):
            return cls.bounded_range(charge.epsilon, **options)
        if isinstance(charge, DiscreteLaplaceCharge) and charge.dimension == 1:
            return cls.discrete_laplace(charge.scale, charge.sensitivity, **options)
        if (
            isinstance(charge, DiscreteGaussianCharge)
            and charge.dimension == 1
            and math.ceil(14 * float_up(charge.sigma)) + 2 <= MAX_DISCRETE_TERMS
        ):
            return cls.discrete_gaussian(charge.sigma, charge.sensitivity, **options)
        cost = cost_of(charge)
        return cls.from_privacy_parameters(cost.epsilon, cost.delta, **options)

    # -- composition --------------------------------------------------------------

    def compose(self, other: PrivacyLossDistribution) -> PrivacyLossDistribution:
        """The PLD of running both mechanisms (same grid spacing required)."""
        if other.interval != self.interval:
            raise ConfigError(
                "cannot compose PLDs with different value_discretization_interval "
                f"({self.interval} and {other.interval})"
            )
        tail = min(self.tail_mass, other.tail_mass)
        a, b = self._d, other._d
        up_r = a.upper_remove.compose(b.upper_remove, tail)
        up_a = (
            up_r if a.symmetric and b.symmetric else a.upper_add.compose(b.upper_add, tail)
        )
        low_r = _lower_op(a.lower_remove, b.lower_remove, tail)
        low_a = (
            low_r
            if a.lower_symmetric and b.lower_symmetric
            else _lower_op(a.lower_add, b.lower_add, tail)
        )
        sup_r = _compose_support(a.support_remove, b.support_remove)
        sup_a = (
            sup_r if a.symmetric and b.symmetric
            else _compose_support(a.support_add, b.support_add)
        )
        return PrivacyLossDistribution(
            _Directions(up_r, up_a, low_r, low_a, sup_r, sup_a), self.interval, tail
        )

    def self_compose(self, count: int) -> PrivacyLossDistribution:
        """``count`` runs of this mechanism, by repeated squaring."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidCostError("count", count, "must be an integer >= 1")
        if count == 1:
            return self
        d, tail = self._d, self.tail_mass
        up_r = d.upper_remove.self_compose(count, tail)
        up_a = up_r if d.symmetric else d.upper_add.self_compose(count, tail)
        low_r = None if d.lower_remove is None else d.lower_remove.self_compose(count, tail)
        if d.lower_symmetric:
            low_a = low_r
        else:
            low_a = None if d.lower_add is None else d.lower_add.self_compose(count, tail)
        sup_r = None if d.support_remove is None else d.support_remove.power(count)
        if d.symmetric:
            sup_a = sup_r
        else:
            sup_a = None if d.support_add is None else d.support_add.power(count)
        return PrivacyLossDistribution(
            _Directions(up_r, up_a, low_r, low_a, sup_r, sup_a), self.interval, tail
        )

    # -- reading ----------------------------------------------------------------

    def _uppers(self) -> tuple[tuple[DiscretePLD, _Support | None], ...]:
        d = self._d
        remove = (d.upper_remove, d.support_remove)
        return (remove,) if d.symmetric else (remove, (d.upper_add, d.support_add))

    def _lowers(self) -> tuple[DiscretePLD, ...]:
        d = self._d
        found = (d.lower_remove,) if d.lower_symmetric else (d.lower_remove, d.lower_add)
        return tuple(p for p in found if p is not None)

    def epsilon(self, delta: Any) -> tuple[Fraction, Fraction | None]:
        """epsilon(delta) as ``(lower, upper)``; ``upper`` is None if unbounded.

        The upper end is the smallest epsilon at which the pessimistic PLD (of both
        directions) certifies ``delta``, rounded up, capped by the largest finite loss
        where that is known and ``delta`` covers the mass at +inf (pure DP: exact at
        delta = 0); the lower end is the optimistic counterpart, rounded down.
        """
        exact = check_delta(delta, "delta")
        target = float_down(exact)
        upper: Fraction | None = Fraction(0)
        for pld, support in self._uppers():
            high = pld.epsilon(target)
            value = None if math.isinf(high) else up(high)
            cap = None if support is None else support.epsilon_cap(exact)
            if cap is not None:
                value = cap if value is None else min(value, cap)
            upper = None if value is None or upper is None else max(upper, value)
        lows = [p.epsilon(target) for p in self._lowers()] or [0.0]
        low = max(lows)
        lower = down(low) if math.isfinite(low) else Fraction(0)
        if upper is not None:
            lower = min(lower, upper)
        return lower, upper

    def delta(self, epsilon: Any) -> tuple[Fraction, Fraction]:
        """delta(epsilon) as ``(lower, upper)``, exact Fractions, upper rounded up."""
        eps = check_epsilon(epsilon)
        upper = Fraction(0)
        for pld, support in self._uppers():
            value = min(up(pld.delta(float_down(eps))), Fraction(1))
            if support is not None and eps >= support.top:
                value = min(value, 1 - support.survival)
            upper = max(upper, value)
        low = max([p.delta(float_up(eps)) for p in self._lowers()] or [0.0])
        return min(down(low), upper), upper


def _lower_op(
    a: DiscretePLD | None, b: DiscretePLD | None, tail: float
) -> DiscretePLD | None:
    return None if a is None or b is None else a.compose(b, tail)


def _mu(sigma: Fraction, sensitivity: Fraction) -> float:
    return float_up(sensitivity / sigma)


def _scheme(value: Any) -> Scheme:
    try:
        return Scheme(value)
    except ValueError:
        raise ConfigError(
            f"unknown sampling scheme {value!r}; use 'poisson' or 'without_replacement'"
        ) from None


def _rate(value: Any) -> float:
    rate = check_rate(value, "sampling_rate")
    return 1.0 if rate == 1 else float_up(rate)


def compose_plan(
    charges: Iterable[Charge],
    *,
    relation: Relation | str = Relation.ADD_REMOVE,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> PrivacyLossDistribution:
    """The PLD of a declared plan of charges (heterogeneous, with repetitions).

    Equal atoms are grouped and self-composed by repeated squaring; plain Gaussians are
    merged exactly into one (Dong, Roth and Su 2019, Cor. 3.3); the groups are then
    convolved in sequence.

    Raises:
        UnsupportedChargeError: A charge outside ``relation``.
        InvalidCostError: An empty plan.

    Examples:
        >>> from dpaccount.charges import GaussianCharge, Repeated
        >>> pld = compose_plan([Repeated(GaussianCharge(sigma=10, sensitivity=1, epsilon=1), 100)],
        ...                    value_discretization_interval=1e-3)
        >>> low, high = pld.epsilon(1e-5)     # = one Gaussian of mu = 1
        >>> 4.36 < float(low) <= float(high) < 4.39
        True
    """
    rel = Relation(relation)
    items = DeclaredPlan(charges, "pld", "").items
    if not items:
        raise InvalidCostError("charges", [], "the plan is empty")
    options = {
        "value_discretization_interval": value_discretization_interval,
        "tail_mass": tail_mass,
        "lower": lower,
    }
    mu_squared = Fraction(0)
    parts: list[PrivacyLossDistribution] = []
    for atom, count in items:
        if isinstance(atom, GaussianCharge):
            mu_squared += count * (atom.sensitivity / atom.sigma) ** 2
            continue
        single = PrivacyLossDistribution.from_charge(atom, relation=rel, **options)
        parts.append(single.self_compose(count))
    if mu_squared:
        # sigma = 1 / sqrt(sum mu_i^2), rounded down (more noise never: less).
        mu = math.sqrt(float_up(mu_squared))
        mu = math.nextafter(mu, math.inf)
        parts.append(PrivacyLossDistribution.gaussian(Fraction(1), Fraction(mu), **options))
    result = parts[0]
    for part in parts[1:]:
        result = result.compose(part)
    return result


@attrs.frozen
class PLDState:
    """How many runs of each plan item have been charged, and their basic sums."""

    used: tuple[int, ...]
    epsilon: Fraction
    delta: Fraction


def plan_runs(plan: Any) -> list[tuple[Charge, int]]:
    """A declared plan read as ``(atom, count)`` runs, in order (see `as_charges()`)."""
    runs: list[tuple[Charge, int]] = []
    for charge in as_charges(plan):
        runs.extend(atoms(charge))
    return runs


class PLDRule(Rule[PLDState]):
    """Accountant rule for a declared plan, accounted on the privacy loss distribution.

    The plan (charges with their multiplicities, in any order) is composed once at
    construction. After some charges, `total()` is the better of two valid bounds:
    the certified PLD epsilon of the *whole* plan at ``target_delta`` (which bounds
    every part of the plan, by post-processing) and basic composition of what has run
    (Dwork and Roth 2014, Thm 3.16). `add()` is O(1): it checks that the atom is in
    the plan, that its declared count is not exhausted, and adds to the basic sums.

    Adaptivity: ``ADAPTIVE_MECHANISMS`` -- which mechanism runs may depend on earlier
    answers, but the sequence of privacy parameters is the declared plan (Zhu, Dong and
    Wang 2022; Dong, Roth and Su 2019, Thm 3.2). Run-time parameters need
    `RDPRule` (a Renyi filter) or
    `GDPFilterRule`.

    Args:
        plan: The declared charges: ``(charge, k)``, a list of charges (``Repeated``
            and ``(charge, k)`` pairs allowed) or a planning ``Plan``.
        target_delta: The delta at which epsilon is reported; default the budget's.
        budget: The ledger's budget (only for the default ``target_delta``).
        relation: The neighbouring relation of the ledger.
        value_discretization_interval: Accuracy of the PLD grid.
        tail_mass: Mass truncated per tail and step (added to delta).

    Examples:
        >>> from dpaccount.charges import GaussianCharge
        >>> g = GaussianCharge(sigma=2, sensitivity=1, epsilon=1)
        >>> rule = PLDRule((g, 4), target_delta="1e-5", value_discretization_interval=1e-3)
        >>> state = rule.add(rule.start(), g, 2)
        >>> 4.36 < float(rule.total(state).epsilon) < 4.39    # 4 x sigma 2 = mu 1
        True
        >>> rule.admits(state, Budget(5, "1e-5")), rule.admits(state, Budget(4, "1e-5"))
        (True, False)
    """

    name = "pld"
    adaptivity = Adaptivity.ADAPTIVE_MECHANISMS
    theorem = _THEOREM

    def __init__(
        self,
        plan: Any = None,
        target_delta: Any = None,
        *,
        budget: Budget | None = None,
        relation: Relation | str = Relation.ADD_REMOVE,
        value_discretization_interval: Any = DEFAULT_INTERVAL,
        tail_mass: Any = DEFAULT_TAIL_MASS,
    ) -> None:
        charges = as_charges(plan)
        if target_delta is None:
            if budget is None:
                raise ConfigError("the pld rule needs target_delta (or budget=)")
            target_delta = budget.delta
        self.relation = Relation(relation)
        self.target_delta = check_delta(target_delta, "target_delta")
        self._plan = DeclaredPlan(charges, "pld", "use the rdp rule for run-time parameters")
        self._items = self._plan.items
        if not self._items:
            raise ConfigError("the pld rule needs a non-empty declared plan")
        self._pld = compose_plan(
            charges,
            relation=self.relation,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
            lower=False,
        )
        self.interval = self._pld.interval
        _low, upper = self._pld.epsilon(self.target_delta)
        self._total: PrivacyCost | None = (
            None if upper is None else trusted_cost(upper, self.target_delta)
        )

    @property
    def distribution(self) -> PrivacyLossDistribution:
        """The composed PLD of the whole plan."""
        return self._pld

    def start(self) -> PLDState:
        return PLDState((0,) * len(self._items), Fraction(0), Fraction(0))

    def add(self, state: PLDState, atom: Atom, count: int) -> PLDState:
        used, cost = self._plan.use(state.used, atom, count)
        if count == 1:
            return PLDState(used, state.epsilon + cost.epsilon, state.delta + cost.delta)
        return PLDState(
            used, state.epsilon + cost.epsilon * count, state.delta + cost.delta * count
        )

    def total(self, state: PLDState) -> PrivacyCost:
        basic = state.delta.numerator < state.delta.denominator  # delta < 1
        if not any(state.used):
            return trusted_cost(Fraction(0), Fraction(0))
        plan = self._total
        if plan is None or (
            basic and at_most(state.epsilon, plan.epsilon) and at_most(state.delta, plan.delta)
        ):
            if not basic:
                raise InvalidCostError("delta", state.delta, "the summed delta reaches 1")
            return trusted_cost(state.epsilon, state.delta)
        return plan

    def admits(self, state: PLDState, budget: Budget) -> bool:
        if not any(state.used):
            return True
        try:
            return self.total(state).fits(budget)
        except InvalidCostError:
            return False

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target_delta": str(self.target_delta),
            "relation": self.relation.value,
            "value_discretization_interval": self.interval,
            "plan": [[repr(atom), count] for atom, count in self._items],
        }


def _one_part(parts: tuple[Any, ...]) -> bool:
    """Whether every part equals the first (by identity first: hashing or comparing a
    tree of shared parts part by part takes time exponential in its depth)."""
    first = parts[0]
    return all(part is first or part == first for part in parts)
