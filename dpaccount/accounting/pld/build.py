"""Building a privacy loss distribution from a mechanism: its pairs and loss facts.

One function per constructor of `PrivacyLossDistribution` (same name, same arguments,
documented there): each checks its arguments, chooses the mechanism's dominating pair
or pairs (`dpaccount.accounting.pld.pairs`, `.subsampled`, `.lattice`), discretises
them (`dpaccount.accounting.pld.discrete`) and states what is certified exactly about
the losses (`_Support`). It returns the parts the distribution is made of,
``(directions, interval, tail_mass)``. Poisson subsampling composes the remove and the
add direction each on its own (Zhu, Dong and Wang 2022); sampling without replacement
uses one pair dominating both orders (`SymmetrisedPair`; Lebeda, Regehr, Kamath and
Steinke 2024).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, TypeAlias

from dpaccount._numeric import (
    check_count,
    check_delta,
    check_epsilon,
    check_positive,
    check_rate,
    float_down,
    float_up,
    log1p_expm1_scaled_up,
    up,
)
from dpaccount.accounting.pld.directions import _Directions, _Support
from dpaccount.accounting.pld.discrete import from_pair, upper_from_profile
from dpaccount.accounting.pld.lattice import (
    MAX_DISCRETE_TERMS,
    DiscreteGaussianPair,
    DiscreteLaplacePair,
)
from dpaccount.accounting.pld.mixture import MixtureGaussianPair
from dpaccount.accounting.pld.pairs import (
    BoundedRangePair,
    GaussianPair,
    KaryRandomizedResponsePair,
    LaplacePair,
    Pair,
    RandomizedResponsePair,
)
from dpaccount.accounting.pld.subsampled import (
    SubsampledGaussianPair,
    SubsampledLaplacePair,
    SymmetrisedPair,
)
from dpaccount.charges import (
    SCHEME_RELATION,
    Atom,
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
    cost_of,
)
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_TAIL_MASS",
    "Built",
    "bounded_range",
    "discrete_gaussian",
    "discrete_laplace",
    "from_charge",
    "from_privacy_parameters",
    "gaussian",
    "laplace",
    "randomized_response",
]

#: Default grid spacing of loss values (dp_accounting's default too).
DEFAULT_INTERVAL = 1e-4
#: Default P-mass dropped per tail per truncation (moved to delta in the upper bound).
DEFAULT_TAIL_MASS = 1e-15

#: What a distribution is made of: its discretisations, grid spacing and tail mass.
Built: TypeAlias = tuple[_Directions, float, float]


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


def _subsampled_tops(e0: float, rate: float) -> tuple[Fraction, Fraction]:
    """Upper bounds on the largest loss of an e0-DP pair subsampled at ``rate``.

    Remove: ln(1 + q (e^e0 - 1)); add: -ln(1 + q (e^-e0 - 1)) (the two extreme
    likelihood ratios of the mixture; Balle, Barthe and Gaboardi 2018, Thm 8 for the
    amplification; both increase with e0 and q, which callers round up).
    """
    add = -math.log1p(rate * math.expm1(-e0))
    return log1p_expm1_scaled_up(Fraction(rate), Fraction(e0)), up(add * (1 + 1e-14), ulps=8)


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


def _from_pairs(
    remove: Pair,
    add: Pair | None,
    interval: float,
    tail_mass: float,
    lower: bool = True,
    support: tuple[_Support | None, _Support | None] = (None, None),
) -> Built:
    up_r = from_pair(remove, interval, tail_mass, pessimistic=True)
    low_r = from_pair(remove, interval, tail_mass, pessimistic=False) if lower else None
    if add is None:
        directions = _Directions(up_r, up_r, low_r, low_r, support[0], support[0])
        return directions, interval, tail_mass
    up_a = from_pair(add, interval, tail_mass, pessimistic=True)
    low_a = from_pair(add, interval, tail_mass, pessimistic=False) if lower else None
    return _Directions(up_r, up_a, low_r, low_a, *support), interval, tail_mass


def _from_either_order(
    first: Pair,
    second: Pair,
    interval: float,
    tail_mass: float,
    lower: bool,
    support: tuple[_Support | None, _Support | None] = (None, None),
) -> Built:
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
    return _Directions(upper, upper, low_1, low_2, both, both), interval, tail_mass


def _subsampled(
    remove: Pair, add: Pair, scheme: Scheme, interval: float, tail: float,
    lower: bool, support: tuple[_Support | None, _Support | None] = (None, None),
) -> Built:
    if scheme is Scheme.WITHOUT_REPLACEMENT:
        return _from_either_order(remove, add, interval, tail, lower, support)
    return _from_pairs(remove, add, interval, tail, lower, support)


def gaussian(
    sigma: Any,
    sensitivity: Any = 1,
    *,
    sampling_rate: Any = 1,
    scheme: Scheme | str = Scheme.POISSON,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.gaussian()` (see there)."""
    mu = _mu(check_positive(sigma, "sigma"), check_positive(sensitivity, "sensitivity"))
    rate, the_scheme = _rate(sampling_rate), _scheme(scheme)
    interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
    if rate >= 1:
        return _from_pairs(GaussianPair(mu), None, interval, tail, lower)
    return _subsampled(
        SubsampledGaussianPair(mu, rate, remove=True),
        SubsampledGaussianPair(mu, rate, remove=False),
        the_scheme,
        interval,
        tail,
        lower,
    )


def laplace(
    scale: Any,
    sensitivity: Any = 1,
    *,
    sampling_rate: Any = 1,
    scheme: Scheme | str = Scheme.POISSON,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.laplace()` (see there)."""
    scale_f = check_positive(scale, "scale")
    e0 = float_up(check_positive(sensitivity, "sensitivity") / scale_f)
    rate, the_scheme = _rate(sampling_rate), _scheme(scheme)
    interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
    if rate >= 1:
        # Every loss lies in [-e0, e0] (an exact Fraction; the pair uses e0 rounded up).
        support = _Support(check_positive(sensitivity, "sensitivity") / scale_f, Fraction(1))
        return _from_pairs(LaplacePair(e0), None, interval, tail, lower, (support, None))
    top_r, top_a = _subsampled_tops(e0, rate)
    return _subsampled(
        SubsampledLaplacePair(e0, rate, remove=True),
        SubsampledLaplacePair(e0, rate, remove=False),
        the_scheme,
        interval,
        tail,
        lower,
        (_Support(top_r, Fraction(1)), _Support(top_a, Fraction(1))),
    )


def discrete_gaussian(
    sigma: Any,
    sensitivity: Any = 1,
    *,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.discrete_gaussian()` (see there)."""
    sig = check_positive(sigma, "sigma")
    shift = check_positive(sensitivity, "sensitivity")
    if shift.denominator != 1:
        raise InvalidCostError("sensitivity", sensitivity, "must be an integer (lattice steps)")
    sigma2 = float_up(sig * sig)
    if math.ceil(14 * math.sqrt(sigma2)) + 2 > MAX_DISCRETE_TERMS:
        raise InvalidCostError("sigma", sigma, "too large for the exact discrete PLD")
    interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
    pair = DiscreteGaussianPair(sigma2, int(shift))
    return _from_pairs(pair, None, interval, tail, lower)


def discrete_laplace(
    scale: Any,
    sensitivity: Any = 1,
    *,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.discrete_laplace()` (see there)."""
    scale_f = check_positive(scale, "scale")
    shift = check_positive(sensitivity, "sensitivity")
    if shift.denominator != 1:
        raise InvalidCostError("sensitivity", sensitivity, "must be an integer (lattice steps)")
    interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
    # A smaller scale only raises the loss: round b down (1/b up).
    pair = DiscreteLaplacePair(float_down(scale_f), int(shift))
    support = _Support(shift / scale_f, Fraction(1))  # losses lie in [-S/b, S/b]
    return _from_pairs(pair, None, interval, tail, lower, (support, None))


def from_privacy_parameters(
    epsilon: Any,
    delta: Any = 0,
    *,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.from_privacy_parameters()` (see there)."""
    eps_exact, delta_exact = check_epsilon(epsilon), check_delta(delta)
    eps, dlt = float_up(eps_exact), float_up(delta_exact)
    interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
    # Finite losses are +-epsilon and the mass at +inf is delta, exactly.
    support = _Support(eps_exact, 1 - delta_exact)
    pair = RandomizedResponsePair(eps, dlt)
    return _from_pairs(pair, None, interval, tail, lower, (support, None))


def randomized_response(
    epsilon: Any,
    categories: int = 2,
    *,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.randomized_response()` (see there)."""
    eps = check_epsilon(epsilon)
    k = check_count(categories, "categories", minimum=2)
    interval, tail = _check_interval(value_discretization_interval), _check_tail(tail_mass)
    pair = KaryRandomizedResponsePair(float_up(eps), k)
    support = _Support(eps, Fraction(1))
    return _from_pairs(pair, None, interval, tail, lower, (support, None))


def bounded_range(
    epsilon: Any,
    *,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.bounded_range()` (see there)."""
    eps = check_epsilon(epsilon)
    if eps == 0:  # a 0-bounded-range mechanism's output does not depend on the data
        return from_privacy_parameters(
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
    return _Directions(upper, upper, low, low, support, support), interval, tail


def from_charge(
    charge: Atom,
    *,
    relation: Relation | str = Relation.ADD_REMOVE,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    tail_mass: Any = DEFAULT_TAIL_MASS,
    lower: bool = True,
) -> Built:
    """The parts of `PrivacyLossDistribution.from_charge()` (see there)."""
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
            return gaussian(
                inner.sigma, inner.sensitivity, sampling_rate=charge.rate,
                scheme=charge.scheme, **options,
            )
        if isinstance(inner, LaplaceCharge):
            return laplace(
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
        return from_charge(charge.partitions[0], relation=rel, **options)
    if isinstance(charge, MixtureOfGaussiansCharge):
        return _mixture(charge, rel, **options)
    if isinstance(charge, GaussianCharge):
        return gaussian(charge.sigma, charge.sensitivity, **options)
    if isinstance(charge, LaplaceCharge):
        return laplace(charge.scale, charge.sensitivity, **options)
    if isinstance(charge, RandomizedResponseCharge):
        return randomized_response(charge.epsilon, charge.categories, **options)
    if isinstance(charge, BoundedRangeCharge):
        return bounded_range(charge.epsilon, **options)
    if isinstance(charge, DiscreteLaplaceCharge) and charge.dimension == 1:
        return discrete_laplace(charge.scale, charge.sensitivity, **options)
    if (
        isinstance(charge, DiscreteGaussianCharge)
        and charge.dimension == 1
        and math.ceil(14 * float_up(charge.sigma)) + 2 <= MAX_DISCRETE_TERMS
    ):
        return discrete_gaussian(charge.sigma, charge.sensitivity, **options)
    cost = cost_of(charge)
    return from_privacy_parameters(cost.epsilon, cost.delta, **options)


def _one_part(parts: tuple[Any, ...]) -> bool:
    """Whether every part equals the first (by identity first: hashing or comparing a
    tree of shared parts part by part takes time exponential in its depth)."""
    first = parts[0]
    return all(part is first or part == first for part in parts)


def _mixture(
    charge: MixtureOfGaussiansCharge, rel: Relation, *,
    value_discretization_interval: Any, tail_mass: Any, lower: bool,
) -> Built:
    """The remove and add pairs of a mixture of Gaussians (`MixtureGaussianPair`), each
    composed on its own; add/remove neighbours only. Shifts are rounded up, the
    probabilities taken as floats (their sum stays 1 to within a few ulps)."""
    if rel is not Relation.ADD_REMOVE:
        raise UnsupportedChargeError(
            "a MixtureOfGaussiansCharge is proven for add_remove neighbours, not "
            f"{rel.value} (Choquette-Choo, Ganesh, Steinke and Thakurta 2023)"
        )
    interval = _check_interval(value_discretization_interval)
    tail = _check_tail(tail_mass)
    shifts = [float_up(c / charge.sigma) for c in charge.sensitivities]
    probs = [float(p) for p in charge.probabilities]
    return _from_pairs(MixtureGaussianPair(shifts, probs, remove=True),
                       MixtureGaussianPair(shifts, probs, remove=False),
                       interval, tail, lower)
