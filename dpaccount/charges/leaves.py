"""The leaf charges: one run of one mechanism, described by its noise.

`LaplaceCharge` and `GaussianCharge` (continuous noise), `DiscreteLaplaceCharge` and
`DiscreteGaussianCharge` (noise on the integer lattice, in lattice units),
`RandomizedResponseCharge` (a k-ary report) and `BoundedRangeCharge` (the exponential
mechanism). Each is an immutable, validated value with a `.cost`, its (epsilon, delta)
guarantee, rounded toward more privacy loss; the tight engines read the noise itself.
None of them states a neighbouring relation of its own.

The costs that take exact arithmetic share one cache (`_cached`), also used by
`Subsampled` in `dpaccount.charges.combinators`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import (
    check_count,
    check_delta,
    check_epsilon,
    check_positive,
    gaussian_delta_up,
    laplace_epsilon_up,
    to_fraction,
)
from dpaccount.costs import PrivacyCost, trusted_cost
from dpaccount.errors import InvalidCostError

__all__ = [
    "BoundedRangeCharge",
    "DiscreteGaussianCharge",
    "DiscreteLaplaceCharge",
    "GaussianCharge",
    "LaplaceCharge",
    "MixtureOfGaussiansCharge",
    "RandomizedResponseCharge",
]


def _scale(value: Any) -> Fraction:
    return check_positive(value, "scale")


def _sensitivity(value: Any) -> Fraction:
    return check_positive(value, "sensitivity")


def _sigma(value: Any) -> Fraction:
    return check_positive(value, "sigma")


def _dimension(value: Any) -> int:
    return check_count(value, "dimension")


def _lattice_steps(value: Any) -> Fraction:
    steps = check_positive(value, "sensitivity")
    if steps.denominator != 1:
        raise InvalidCostError(
            "sensitivity", value, "must be a positive integer number of lattice steps"
        )
    return steps


def _categories(value: Any) -> int:
    return check_count(value, "categories", minimum=2)


# Costs that take exact arithmetic are cached by the values they depend on (not by the
# charge object: a charge forged past attrs is costed from its current fields), so a
# mechanism charged many times pays for the arithmetic once. Keys are the exact values'
# integer numerators and denominators, which hash far faster than Fractions.
_COST_CACHE = 4096
_costs: dict[tuple[Any, ...], PrivacyCost] = {}


def _key(*values: Fraction) -> tuple[Any, ...]:
    # a forged field that is not a Fraction is keyed by the value itself
    return tuple([v.as_integer_ratio() if type(v) is Fraction else v for v in values])


def _cached(key: tuple[Any, ...], compute: Any) -> PrivacyCost:
    cost = _costs.get(key)
    if cost is None:
        cost = compute()
        if len(_costs) >= _COST_CACHE:
            _costs.clear()
        _costs[key] = cost
    return cost


def _laplace_cost(scale: Fraction, sensitivity: Fraction) -> PrivacyCost:
    return _cached(
        ("laplace", *_key(scale, sensitivity)),
        lambda: trusted_cost(laplace_epsilon_up(scale, sensitivity), Fraction(0)),
    )


def _ratio_cost(sensitivity: Fraction, scale: Fraction) -> PrivacyCost:
    return _cached(
        ("ratio", *_key(sensitivity, scale)),
        lambda: trusted_cost(sensitivity / scale, Fraction(0)),
    )


def _gaussian_cost(sigma: Fraction, sensitivity: Fraction, epsilon: Fraction) -> PrivacyCost:
    def compute() -> PrivacyCost:
        delta = gaussian_delta_up(epsilon, sensitivity / sigma)
        if delta >= 1:
            raise InvalidCostError("epsilon", epsilon, "delta(epsilon) rounds to 1")
        return trusted_cost(epsilon, delta)

    return _cached(("gaussian", *_key(sigma, sensitivity, epsilon)), compute)


@attrs.frozen
class LaplaceCharge:
    """One run of the Laplace mechanism: noise of ``scale`` on an L1-``sensitivity`` query.

    Its guarantee is pure epsilon = sensitivity / scale (Dwork and Roth 2014, Thm 3.6);
    the PLD engine uses the scale itself.

    Examples:
        >>> LaplaceCharge(scale=10, sensitivity=1).cost
        PrivacyCost(epsilon=0.1, delta=0)
    """

    scale: Fraction = attrs.field(converter=_scale)
    sensitivity: Fraction = attrs.field(converter=_sensitivity)

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, 0) guarantee of one run."""
        return _laplace_cost(self.scale, self.sensitivity)


@attrs.frozen
class GaussianCharge:
    """One run of the Gaussian mechanism with standard deviation ``sigma``.

    Reported at the point ``epsilon`` of its privacy profile, with delta from the exact
    condition of Balle and Wang 2018 (Thm 8), computed and rounded upward. Tight engines
    use ``sigma / sensitivity`` and the whole profile instead.

    Examples:
        >>> c = GaussianCharge(sigma=1, sensitivity=1, epsilon=1)
        >>> 0.1269 < float(c.cost.delta) < 0.1270   # Balle-Wang delta(1) at mu = 1
        True
    """

    sigma: Fraction = attrs.field(converter=_sigma)
    sensitivity: Fraction = attrs.field(converter=_sensitivity)
    epsilon: Fraction = attrs.field(converter=check_epsilon)

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta(epsilon)) guarantee of one run."""
        return _gaussian_cost(self.sigma, self.sensitivity, self.epsilon)


@attrs.frozen
class DiscreteLaplaceCharge:
    """One run of the discrete Laplace mechanism on the integer lattice Z^dimension.

    Everything is in lattice units: integer noise with P[Y = y] ∝ exp(-|y| / scale) is
    added to each coordinate of an integer answer whose L1 sensitivity is the integer
    ``sensitivity`` S. For the product pmf, |y| - |y - v| <= |v| coordinate-wise, so the
    probability ratio is at most exp(S / scale): the guarantee is pure
    epsilon = S / scale, exactly (Ghosh, Roughgarden and Sundararajan 2009; Dwork and
    Roth 2014, Thm 3.6 in its discrete form; sampler: Canonne, Kamath and Steinke 2020,
    Algorithm 2). It is one mechanism with fixed parameters (composition is the
    rule's business). The PLD engine uses its exact discrete privacy loss distribution
    in one dimension (it is *not* dominated by the continuous Laplace of the same scale,
    so this is not a `LaplaceCharge`).

    Attributes:
        scale: The discrete Laplace parameter b > 0, in lattice steps.
        sensitivity: The L1 sensitivity S, a positive integer number of lattice steps.
        dimension: The number of coordinates (1 for a scalar).

    Examples:
        >>> DiscreteLaplaceCharge(scale=1025, sensitivity=1025).cost
        PrivacyCost(epsilon=1, delta=0)
    """

    scale: Fraction = attrs.field(converter=_scale)
    sensitivity: Fraction = attrs.field(converter=_lattice_steps)
    dimension: int = attrs.field(default=1, converter=_dimension)

    @property
    def cost(self) -> PrivacyCost:
        """The pure (S / scale, 0) guarantee of one run, exact."""
        return _ratio_cost(self.sensitivity, self.scale)


@attrs.frozen
class DiscreteGaussianCharge:
    """One run of the discrete Gaussian mechanism on the integer lattice Z^dimension.

    Everything is in lattice units: noise N_Z(0, sigma^2), P[Y = y] ∝
    exp(-y^2 / (2 sigma^2)), is added to each coordinate of an integer answer whose
    integer shifts v between neighbours satisfy ||v||_2 <= ``sensitivity`` (for a
    scalar, the integer S). ``epsilon`` and ``delta`` are the guarantee the mechanism
    certified for its sampler (Canonne, Kamath and Steinke 2020, Thm 7 for a scalar;
    Thm 14 with Cor. 13 for vectors), computed and rounded up by
    `GaussianMechanism`; they are trusted as given, so a
    hand-built charge must carry a proven pair. Tight engines use sigma and the
    sensitivity instead: Renyi DP alpha S^2 / (2 sigma^2) at every order (CKS 2020,
    Prop. 5 for a scalar; additivity over coordinates for vectors), and in one
    dimension the exact discrete privacy loss distribution. It is one mechanism with
    fixed parameters.

    Attributes:
        sigma: The discrete Gaussian's sigma > 0, in lattice steps.
        sensitivity: The L2 lattice sensitivity bound: a positive integer for
            ``dimension == 1``, any positive number (>= the true bound) otherwise.
        epsilon: The certified epsilon.
        delta: The certified delta, in (0, 1).
        dimension: The number of coordinates (1 for a scalar).

    Examples:
        >>> c = DiscreteGaussianCharge(sigma=5, sensitivity=1, epsilon=1, delta="1e-6")
        >>> c.cost
        PrivacyCost(epsilon=1, delta=1e-06)
    """

    sigma: Fraction = attrs.field(converter=_sigma)
    sensitivity: Fraction = attrs.field(converter=_sensitivity)
    epsilon: Fraction = attrs.field(converter=check_epsilon)
    delta: Fraction = attrs.field(converter=check_delta)
    dimension: int = attrs.field(default=1, converter=_dimension)

    def __attrs_post_init__(self) -> None:
        if self.dimension == 1 and self.sensitivity.denominator != 1:
            raise InvalidCostError(
                "sensitivity",
                self.sensitivity,
                "a scalar discrete Gaussian needs an integer number of lattice steps",
            )
        if self.delta == 0:
            raise InvalidCostError(
                "delta", self.delta, "the discrete Gaussian has no pure guarantee: delta > 0"
            )

    @property
    def cost(self) -> PrivacyCost:
        """The certified (epsilon, delta) guarantee of one run."""
        return trusted_cost(self.epsilon, self.delta)


@attrs.frozen
class RandomizedResponseCharge:
    """One k-ary randomized response report whose likelihood ratio is at most e^epsilon.

    The report keeps the true category with probability p = e^eps / (e^eps + k - 1) and
    is each other category with probability q = 1 / (e^eps + k - 1) (the k-RR of Kairouz,
    Oh and Viswanath 2016, "Extremal mechanisms for local differential privacy", JMLR).
    Between two different true values the privacy loss is +eps (the first value's
    category), -eps (the second's) or 0 (any other), with masses p, q and (k - 2) q,
    the same for every pair of values, so the PLD and RDP engines use this three-point
    distribution exactly. Its (epsilon, delta) guarantee is pure epsilon (Dwork and Roth
    2014, Def. 2.4). A k-RR with a smaller ratio is a post-processing of this one (apply
    another k-RR to the report), so an epsilon rounded up stays a valid description.
    Like a `PrivacyCost`, it states no neighbouring relation of its own.

    Examples:
        >>> RandomizedResponseCharge(1, categories=4).cost
        PrivacyCost(epsilon=1, delta=0)
    """

    epsilon: Fraction = attrs.field(converter=check_epsilon)
    categories: int = attrs.field(default=2, converter=_categories)

    @property
    def cost(self) -> PrivacyCost:
        """The pure (epsilon, 0) guarantee of one report."""
        return trusted_cost(self.epsilon, Fraction(0))


@attrs.frozen
class BoundedRangeCharge:
    """One run of an epsilon-bounded-range mechanism, such as the exponential mechanism.

    M is epsilon-bounded range (epsilon-BR) if for all neighbours x, x' and outputs y,
    y' the privacy losses differ by at most epsilon: ln(P[y|x] / P[y|x']) -
    ln(P[y'|x] / P[y'|x']) <= epsilon (Durfee and Rogers 2019, "Practical differentially
    private top-k selection with pay-what-you-get composition", NeurIPS). The
    exponential mechanism with weights exp(epsilon u / (2 Δ)) is epsilon-BR, and so is the
    monotone one with exp(epsilon u / Δ) (ibid.). Every epsilon-BR pair is a
    post-processing of a generalised randomized response whose losses are t and
    t - epsilon for some t in [0, epsilon] (Dong, Durfee and Rogers 2020, "Optimal
    differential privacy composition for exponential mechanisms", ICML, Sec. 4), which
    the PLD and RDP engines use; it is epsilon-DP, so its (epsilon, delta) guarantee is
    pure epsilon, but composes much better: its KL divergence is at most 0.1233 at
    epsilon = 1 where an epsilon-DP pair's reaches 0.4621 (Cesar and Rogers 2021,
    "Bounding, concentrating, and truncating", ALT). It states no neighbouring relation
    of its own.

    Examples:
        >>> BoundedRangeCharge("0.5").cost
        PrivacyCost(epsilon=0.5, delta=0)
    """

    epsilon: Fraction = attrs.field(converter=check_epsilon)

    @property
    def cost(self) -> PrivacyCost:
        """The pure (epsilon, 0) guarantee of one run."""
        return trusted_cost(self.epsilon, Fraction(0))


def _sensitivities(value: Any) -> tuple[Fraction, ...]:
    items = tuple(to_fraction(v, "sensitivities") for v in value)
    if not 1 <= len(items) <= 1000:
        raise InvalidCostError("sensitivities", f"<{len(items)} values>",
                               "give between 1 and 1000 sensitivities")
    if any(v < 0 for v in items) or not any(v > 0 for v in items):
        raise InvalidCostError("sensitivities", "<values>",
                               "must be >= 0, and at least one > 0")
    return items


def _probabilities(value: Any) -> tuple[Fraction, ...]:
    return tuple(check_positive(v, "probabilities") for v in value)


@attrs.frozen
class MixtureOfGaussiansCharge:
    """One run of the mixture-of-Gaussians mechanism (amplified matrix factorization).

    Under add/remove neighbours it outputs N(0, sigma^2) on one dataset and
    sum_i p_i N(c_i, sigma^2) on the other: the sensitivity is c_i with probability p_i
    (Choquette-Choo, Ganesh, Steinke and Thakurta 2023, "Privacy amplification for
    matrix mechanisms", arXiv:2310.15526; a vector mechanism is dominated by the scalar
    one with each sensitivity vector replaced by its norm, their Cor. 4.7). Shifts {0, 1}
    with probabilities {1 - q, q} are the Poisson-subsampled Gaussian. It is stated for
    add/remove neighbours only (`dpaccount.charges.check_relations` refuses it under
    substitution). The PLD engine uses its exact pair in each direction; the RDP,
    Gaussian-DP and zCDP rules refuse it by name.

    Its (epsilon, delta) ``cost`` is at the declared ``epsilon``, with delta =
    sum_i p_i delta_i, delta_i the Gaussian delta(epsilon) at shift c_i (Balle and Wang
    2018, Thm 8, rounded up): the hockey-stick divergence is jointly convex, so each
    direction's profile is at most the p-weighted sum of the Gaussians' (Balle, Barthe
    and Gaboardi 2018, Thm 2, joint convexity).

    Attributes:
        sigma: The noise's standard deviation.
        sensitivities: The shifts c_i >= 0 (at least one > 0).
        probabilities: The p_i > 0, summing exactly to 1 (give decimal strings or
            Fractions: floats such as 0.9 and 0.1 do not sum to 1 exactly).
        epsilon: Where the (epsilon, delta) cost is stated.

    Examples:
        >>> c = MixtureOfGaussiansCharge(1, ["0", "1"], ["0.9", "0.1"], epsilon=1)
        >>> 0.0126 < float(c.cost.delta) < 0.0127   # 0.1 x Balle-Wang delta(1) at mu = 1
        True
    """

    sigma: Fraction = attrs.field(converter=_sigma)
    sensitivities: tuple[Fraction, ...] = attrs.field(converter=_sensitivities)
    probabilities: tuple[Fraction, ...] = attrs.field(converter=_probabilities)
    epsilon: Fraction = attrs.field(converter=check_epsilon)

    def __attrs_post_init__(self) -> None:
        if len(self.probabilities) != len(self.sensitivities):
            raise InvalidCostError("probabilities", f"<{len(self.probabilities)} values>",
                                   "give one probability per sensitivity")
        if sum(self.probabilities, Fraction(0)) != 1:
            raise InvalidCostError("probabilities", "<values>", "must sum exactly to 1")

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta(epsilon)) guarantee of one run (see the class)."""
        def compute() -> PrivacyCost:
            delta = sum((p * gaussian_delta_up(self.epsilon, c / self.sigma)
                         for c, p in zip(self.sensitivities, self.probabilities, strict=True)
                         if c > 0), Fraction(0))
            if delta >= 1:
                raise InvalidCostError("epsilon", self.epsilon, "delta(epsilon) rounds to 1")
            return trusted_cost(self.epsilon, delta)

        return _cached(("mixture", *_key(self.sigma, self.epsilon, *self.sensitivities,
                                         *self.probabilities)), compute)
