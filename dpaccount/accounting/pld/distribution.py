"""`PrivacyLossDistribution`: a composable PLD with certified upper and lower ends.

The type holds the four discretisations of a mechanism's privacy loss
(`dpaccount.accounting.pld.directions`); its class methods build one from a mechanism
(the work is in `dpaccount.accounting.pld.build`); `compose()` and `self_compose()`
compose by FFT (`dpaccount.accounting.pld.discrete`), and `epsilon()` / `delta()` read
it as intervals of exact Fractions. The construction and its theorems are described in
`dpaccount.accounting.pld`.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dpaccount._numeric import check_delta, check_epsilon, down, float_down, float_up, up
from dpaccount.accounting.pld import build
from dpaccount.accounting.pld.build import DEFAULT_INTERVAL, DEFAULT_TAIL_MASS
from dpaccount.accounting.pld.directions import _compose_support, _Directions, _Support
from dpaccount.accounting.pld.discrete import DiscretePLD
from dpaccount.charges import Atom, Relation, Scheme
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["PrivacyLossDistribution"]


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

    # -- construction (the work is in `build`) -------------------------------------

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
        return cls(*build.gaussian(
            sigma, sensitivity, sampling_rate=sampling_rate, scheme=scheme,
            value_discretization_interval=value_discretization_interval, tail_mass=tail_mass,
            lower=lower,
        ))

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
        return cls(*build.laplace(
            scale, sensitivity, sampling_rate=sampling_rate, scheme=scheme,
            value_discretization_interval=value_discretization_interval, tail_mass=tail_mass,
            lower=lower,
        ))

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
        return cls(*build.discrete_gaussian(
            sigma, sensitivity, value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass, lower=lower,
        ))

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
        return cls(*build.discrete_laplace(
            scale, sensitivity, value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass, lower=lower,
        ))

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
        return cls(*build.from_privacy_parameters(
            epsilon, delta, value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass, lower=lower,
        ))

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
        return cls(*build.randomized_response(
            epsilon, categories, value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass, lower=lower,
        ))

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
        return cls(*build.bounded_range(
            epsilon, value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass, lower=lower,
        ))

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
        return cls(*build.from_charge(
            charge, relation=relation, value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass, lower=lower,
        ))

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
