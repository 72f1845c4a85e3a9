"""Gaussian differential privacy: the fully adaptive Gaussian-DP filter, and its epsilon.

A mechanism is mu-GDP when it is as hard to tell apart as N(0, 1) from N(mu, 1) (Dong,
Roth and Su 2019); its privacy profile is the Gaussian mechanism's (Balle and Wang 2018,
Thm 8). Gaussians whose mu_t = Delta_t / sigma_t are chosen at run time compose to
sqrt(sum mu_t^2)-GDP while that sum stays within a limit fixed in advance (Smith and
Thakurta 2022, Thm 1.1): `GDPFilterRule` keeps the sum exactly until its denominator
would outgrow `dpaccount._numeric.SUM_BITS` bits (each fresh float sigma brings a new odd
factor: 10^4 of them made a 10^6-bit denominator and a quadratic cost), and from there
rounded up to a multiple of 2^-4096 (`bounded_up`); `gdp_epsilon` converts it. A
concept of its own, sharing no mathematics with the Renyi engine;
`dpaccount.accounting.rdp` re-exports these names, which it first defined.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import bounded_up, float_up, gaussian_delta_up
from dpaccount.accounting._plans import BUDGET_CACHE, target_delta_of
from dpaccount.charges import Atom, GaussianCharge, shown
from dpaccount.composition.base import Adaptivity, ByIdentity, Rule, SpentMeaning
from dpaccount.costs import Budget, PrivacyCost, trusted_cost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = ["GDPFilterRule", "GDPState", "gdp_epsilon"]

#: The bit pattern of +inf: non-negative floats are ordered as their bit patterns.
_INF_BITS = struct.unpack("<q", struct.pack("<d", math.inf))[0]


def _float_of_bits(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value


@attrs.frozen
class GDPState:
    """The running sum of mu_i^2 = (sensitivity_i / sigma_i)^2: exact, or rounded up to
    the dyadic grid of `dpaccount._numeric.bounded_up`."""

    mu_squared: Fraction


class GDPFilterRule(Rule[GDPState]):
    """Gaussian-DP filter for adaptively chosen Gaussian mechanisms.

    Smith and Thakurta 2022 ("Fully adaptive composition for Gaussian differential
    privacy"), Thm 1.1: if each Gaussian's mu_t = Delta_t / sigma_t is chosen at run
    time and sum mu_t^2 <= mu^2 always, the interaction is mu-GDP. The sum is exact, or
    rounded up by less than 2^-4096 per charge once its denominator would outgrow 4096
    bits (`bounded_up`): a larger sum only stops the filter sooner, so the theorem holds
    for the rounded sum, and a charge stays O(1) however many distinct sigmas ran. The
    epsilon at ``target_delta`` is from the exact GDP profile (Balle and Wang 2018,
    Thm 8), rounded up. Only plain (not subsampled) continuous Gaussian charges are
    accepted: a `DiscreteGaussianCharge` is refused, because
    the discrete Gaussian is not mu-GDP with the continuous mu in general (at small
    sigma its privacy profile exceeds the continuous one) and no theorem gives it a
    Gaussian-DP filter; use the ``rdp`` rule for it.

    Examples:
        >>> from dpaccount.charges import GaussianCharge
        >>> rule = GDPFilterRule(target_delta="1e-5")
        >>> state = rule.add(rule.start(), GaussianCharge(sigma=10, sensitivity=1, epsilon=1), 100)
        >>> 4.37 < float(rule.total(state).epsilon) < 4.38   # mu = 1
        True
    """

    name = "gdp"
    adaptivity = Adaptivity.FULLY_ADAPTIVE
    spent_meaning = SpentMeaning.FILTER
    theorem = "Smith and Thakurta 2022, Thm 1.1 (fully adaptive Gaussian-DP filter)"
    order_free = True  # a sum of mu^2
    bounded = True  # rounded up to the dyadic grid once it would outgrow it

    def __init__(
        self, target_delta: Any = None, *, budget: Budget | None = None, plan: Any = None
    ) -> None:
        self.target_delta = target_delta_of(target_delta, budget, self.name)
        if self.target_delta == 0:
            raise ConfigError("the gdp rule needs target_delta > 0")
        #: (epsilon, delta) -> the limit on sum mu^2, for the last few budgets asked about.
        self._limit: dict[tuple[Fraction, Fraction], Fraction | None] = {}
        #: Each charge's mu^2, as `RDPRule` keeps its vectors.
        self._mu_squared = ByIdentity[Fraction]()

    def start(self) -> GDPState:
        return GDPState(Fraction(0))

    def add(self, state: GDPState, atom: Atom, count: int) -> GDPState:
        if not isinstance(atom, GaussianCharge):
            raise UnsupportedChargeError(
                f"the gdp filter composes plain Gaussian charges only, not {shown(atom)}"
            )
        mu_squared = self._mu_squared.get(atom, lambda: (atom.sensitivity / atom.sigma) ** 2)
        if count == 1:
            return GDPState(bounded_up(state.mu_squared + mu_squared))
        return GDPState(bounded_up(state.mu_squared + count * mu_squared))

    def bounded_sums(self, state: GDPState) -> tuple[Fraction, ...]:
        return (state.mu_squared,)

    def bounded_terms(self, atom: Atom) -> tuple[Fraction, ...]:
        if not isinstance(atom, GaussianCharge):
            return ()  # `add` refuses it
        return (self._mu_squared.get(atom, lambda: (atom.sensitivity / atom.sigma) ** 2),)

    def total(self, state: GDPState) -> PrivacyCost:
        if state.mu_squared == 0:
            return trusted_cost(Fraction(0), Fraction(0))
        return trusted_cost(gdp_epsilon(state.mu_squared, self.target_delta), self.target_delta)

    def admits(self, state: GDPState, budget: Budget) -> bool:
        """Whether sum mu^2 is at most the budget's limit (`mu_squared_limit`)."""
        if state.mu_squared == 0:
            return True
        if budget.epsilon is None:
            return self.target_delta <= budget.delta
        limit = self.mu_squared_limit(budget.epsilon, budget.delta)
        return limit is not None and state.mu_squared <= limit

    def fits(self, mu_squared: float, epsilon: Fraction, delta: Fraction) -> bool:
        """The check at a float sum: mu = sqrt(sum mu^2), rounded up, and the rounded-up
        Gaussian profile delta(epsilon) at mu (Balle and Wang 2018, Thm 8) <= delta."""
        mu = Fraction(math.nextafter(math.sqrt(mu_squared), math.inf))
        try:
            return gaussian_delta_up(epsilon, mu) <= delta
        except (InvalidCostError, OverflowError, ZeroDivisionError):
            return False

    def mu_squared_limit(self, epsilon: Fraction, delta: Fraction) -> Fraction | None:
        """A float L with `fits` (L) true, found by bisection over the positive floats
        (None: not even the smallest fits).

        The filter stops before sum mu^2 would pass L, so the interaction is
        sqrt(L)-GDP (Smith and Thakurta 2022, Thm 1.1; fully adaptive), and
        (epsilon, delta)-DP because the exact profile is increasing in mu:
        delta_true(epsilon; sqrt(S)) <= delta_true(epsilon; mu(L)) <=
        gaussian_delta_up(epsilon, mu(L)) <= delta. A float sum x is at most L exactly
        when the exact sum rounded up is, so this is the per-charge check at every sum up
        to L; the search finds the largest such L wherever the rounded profile is
        non-decreasing in mu (tested against it, and against the exact profile).
        """
        if (epsilon, delta) in self._limit:
            return self._limit[epsilon, delta]
        limit: Fraction | None = None
        if self.fits(_float_of_bits(1), epsilon, delta):  # the smallest positive float
            lo, hi = 1, _INF_BITS  # float bit patterns: lo fits, hi does not (inf)
            while hi - lo > 1:
                middle = (lo + hi) // 2
                if self.fits(_float_of_bits(middle), epsilon, delta):
                    lo = middle
                else:
                    hi = middle
            limit = Fraction(_float_of_bits(lo))
        if len(self._limit) >= BUDGET_CACHE:
            self._limit.clear()
        self._limit[epsilon, delta] = limit
        return limit

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "target_delta": str(self.target_delta)}


def gdp_epsilon(mu_squared: Fraction, delta: Fraction) -> Fraction:
    """The smallest epsilon (up to 1e-9 relative) with delta_mu(epsilon) <= delta.

    Bisection on the exact Gaussian profile (Balle and Wang 2018, Thm 8; Dong, Roth and
    Su 2019, Cor. 2.13), each step checked with the rounded-up profile, so the result is
    certified.

    Examples:
        >>> 91.81 < float(gdp_epsilon(Fraction(100), Fraction(1, 10**5))) < 91.83
        True
    """
    mu = Fraction(math.nextafter(math.sqrt(float_up(mu_squared)), math.inf))
    lo, hi = Fraction(0), Fraction(1)
    if gaussian_delta_up(lo, mu) <= delta:
        return lo
    while gaussian_delta_up(hi, mu) > delta:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = Fraction(float((lo + hi) / 2))
        if mid <= lo or mid >= hi:
            break
        if gaussian_delta_up(mid, mu) <= delta:
            hi = mid
        else:
            lo = mid
    return hi
