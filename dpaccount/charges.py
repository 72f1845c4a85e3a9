"""What one query costs: immutable descriptions that rules compose.

A *charge* describes a query's privacy cost before it runs. The simplest is a
`PrivacyCost`; richer charges keep what tight accountants need
(the noise of a Gaussian, the scale of a Laplace, a sampling rate) while still reporting
a valid (epsilon, delta) guarantee through `cost_of()`.

Multiplicity is applied in one place, `atoms()`: ``Repeated(c, k)`` is *exactly* k
charges of ``c`` under every rule.

A charge tree is nested at most `MAX_NESTING` levels deep (a plain charge is one level;
each `Subsampled`, `Parallel` or `Repeated` adds one) and holds at most `MAX_PARTS`
charges (a part shared by several parents counted each time): a larger one is refused
with `InvalidCostError` when it is built, so every walk over a tree is bounded.

Examples:
    >>> c = Repeated(PrivacyCost("0.1"), 3)
    >>> list(atoms(c))
    [(PrivacyCost(epsilon=0.1, delta=0), 3)]
    >>> cost_of(c)
    PrivacyCost(epsilon=0.3, delta=0)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from fractions import Fraction
from typing import Any, TypeAlias

import attrs

from dpaccount._numeric import (
    check_count,
    check_delta,
    check_epsilon,
    check_positive,
    check_rate,
    gaussian_delta_up,
    laplace_epsilon_up,
    log1p_expm1_scaled_up,
)
from dpaccount.costs import PrivacyCost, _trusted, format_number
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

__all__ = [
    "CHARGE_TYPES",
    "MAX_NESTING",
    "MAX_PARTS",
    "Atom",
    "BoundedRangeCharge",
    "Charge",
    "DiscreteGaussianCharge",
    "DiscreteLaplaceCharge",
    "GaussianCharge",
    "LaplaceCharge",
    "Parallel",
    "RandomizedResponseCharge",
    "Relation",
    "Repeated",
    "Scheme",
    "Subsampled",
    "atoms",
    "check_nesting",
    "check_relations",
    "cost_of",
    "describe",
    "relation_of",
    "shown",
]


class Relation(enum.StrEnum):
    """The neighbouring relation a guarantee is stated for.

    ``ADD_REMOVE``: datasets differ by adding or removing one record (unbounded DP).
    ``SUBSTITUTION``: datasets of equal size differ in one record's value (bounded DP).
    """

    ADD_REMOVE = "add_remove"
    SUBSTITUTION = "substitution"


class Scheme(enum.StrEnum):
    """How a subsample is drawn.

    ``POISSON``: each record independently with probability ``rate``.
    ``WITHOUT_REPLACEMENT``: a uniformly random subset of fixed size ``rate * n``.
    """

    POISSON = "poisson"
    WITHOUT_REPLACEMENT = "without_replacement"


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


def _partitions(value: Iterable[Charge]) -> tuple[Charge, ...]:
    return tuple(value)


def _count(value: Any) -> int:
    return check_count(value, "count")


#: The deepest a charge tree may be nested: a plain charge is one level, and each
#: `Subsampled`, `Parallel` or `Repeated` around it adds one. Real charges use a few (a
#: DP-SGD run is ``Repeated(Subsampled(GaussianCharge))``, 3; a group-by of privacy units
#: at most 4). The limit bounds every walk over a tree (costing, checking, describing,
#: storing: each takes a few Python frames per level, far below the interpreter's
#: recursion limit) and keeps a stored record (one JSON object per level) well inside
#: what the record decoder reads back (pydantic-core's JSON parser stops at 200 levels).
MAX_NESTING = 64
#: The most charges a tree may hold, counting a part each time it occurs: a part shared
#: by several parents (``Parallel([c, c])``) is walked, costed and stored once per
#: occurrence, so a tree of shared parts can double at each level. 2**20 leaves room for
#: a group-by over hundreds of thousands of declared keys (one part each) and bounds
#: every walk and every stored record (charging the largest tree takes well under a
#: second in memory, where shared parts are walked once; storing it, which cannot share,
#: up to a minute and some 60 MB of JSON).
MAX_PARTS = 2**20


def _nesting(self: Any, parts: Sequence[Any]) -> None:
    """Set ``self``'s depth (1 + its deepest part's) and size (1 + its parts' sizes);
    refuse a tree deeper than `MAX_NESTING` or larger than `MAX_PARTS` (the parts are
    already checked to be charges)."""
    nested = [p for p in parts if type(p) in _NESTED_TYPES]  # (a leaf: one level, one part)
    depth = 1 + max((p._depth for p in nested), default=1)
    if depth > MAX_NESTING:
        raise InvalidCostError(
            "charge", f"<{type(self).__name__} nested {depth} levels deep>",
            f"a charge tree may be nested at most {MAX_NESTING} levels deep",
        )
    size = 1 + len(parts) - len(nested) + sum(p._size for p in nested)
    if size > MAX_PARTS:
        raise InvalidCostError(
            "charge", f"<{type(self).__name__} of {size} parts>",
            f"a charge tree may hold at most {MAX_PARTS} charges (a part shared by "
            "several parents counts each time)",
        )
    object.__setattr__(self, "_depth", depth)
    object.__setattr__(self, "_size", size)


#: The relation each sampling scheme's amplification theorem is proven for
#: (Balle, Barthe and Gaboardi 2018, Table 1 and Thms 8 and 9).
SCHEME_RELATION = {
    Scheme.POISSON: Relation.ADD_REMOVE,
    Scheme.WITHOUT_REPLACEMENT: Relation.SUBSTITUTION,
}


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
        lambda: _trusted(laplace_epsilon_up(scale, sensitivity), Fraction(0)),
    )


def _ratio_cost(sensitivity: Fraction, scale: Fraction) -> PrivacyCost:
    return _cached(
        ("ratio", *_key(sensitivity, scale)),
        lambda: _trusted(sensitivity / scale, Fraction(0)),
    )


def _gaussian_cost(sigma: Fraction, sensitivity: Fraction, epsilon: Fraction) -> PrivacyCost:
    def compute() -> PrivacyCost:
        delta = gaussian_delta_up(epsilon, sensitivity / sigma)
        if delta >= 1:
            raise InvalidCostError("epsilon", epsilon, "delta(epsilon) rounds to 1")
        return _trusted(epsilon, delta)

    return _cached(("gaussian", *_key(sigma, sensitivity, epsilon)), compute)


def _subsampled_cost(rate: Fraction, epsilon: Fraction, delta: Fraction) -> PrivacyCost:
    return _cached(
        ("subsampled", *_key(rate, epsilon, delta)),
        lambda: _trusted(log1p_expm1_scaled_up(rate, epsilon), delta * rate),
    )


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
        return _trusted(self.epsilon, self.delta)


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
        return _trusted(self.epsilon, Fraction(0))


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
        return _trusted(self.epsilon, Fraction(0))


@attrs.frozen(cache_hash=True)  # a tree of shared parts hashes in linear time
class Subsampled:
    """A charge run on a random subsample of the data (privacy amplification).

    The (epsilon, delta) guarantee is epsilon' = ln(1 + rate (e^epsilon - 1)),
    delta' = rate * delta: Balle, Barthe and Gaboardi 2018, Thm 8 (Poisson sampling,
    add/remove neighbours) and Thm 9 (sampling without replacement, substitution
    neighbours). The relation is fixed by the scheme; other pairings are not covered by
    those theorems and are refused by `relation_of()` users.

    Examples:
        >>> s = Subsampled(PrivacyCost(1), rate="0.01", scheme=Scheme.POISSON)
        >>> 0.0170 < float(s.cost.epsilon) < 0.0171      # ln(1 + 0.01 (e - 1))
        True
    """

    charge: Charge = attrs.field()
    rate: Fraction = attrs.field(converter=check_rate)
    scheme: Scheme = attrs.field(converter=Scheme)
    #: How deep the tree is and how many charges it holds (set when it is built; see
    #: `MAX_NESTING` and `MAX_PARTS`).
    _depth: int = attrs.field(init=False, eq=False, repr=False, hash=False)
    _size: int = attrs.field(init=False, eq=False, repr=False, hash=False)

    @charge.validator
    def _check_inner(self, _attribute: Any, value: Any) -> None:
        _check_charge(value)

    def __attrs_post_init__(self) -> None:
        _nesting(self, (self.charge,))

    @property
    def relation(self) -> Relation:
        """The neighbouring relation the amplification theorem holds for."""
        return SCHEME_RELATION[self.scheme]

    @property
    def cost(self) -> PrivacyCost:
        """The amplified (epsilon, delta) guarantee of one run."""
        inner = cost_of(self.charge)
        return _subsampled_cost(self.rate, inner.epsilon, inner.delta)


@attrs.frozen(cache_hash=True)  # a tree of shared parts hashes in linear time
class Parallel:
    """One query run separately on disjoint, declared partitions of the data.

    Each partition's part is a charge of its own. When the partition of a record is fixed
    by data-independent rules, adding or removing one record touches one partition, so
    the guarantee is the maximum over partitions (McSherry 2009, Thm 4, "parallel
    composition"). Under substitution a changed record may move between two partitions,
    so the two largest epsilons and deltas are added.

    Examples:
        >>> Parallel([PrivacyCost(1), PrivacyCost(2), PrivacyCost(3)]).cost
        PrivacyCost(epsilon=3, delta=0)
        >>> Parallel([PrivacyCost(1), PrivacyCost(2), PrivacyCost(3)],
        ...          relation="substitution").cost
        PrivacyCost(epsilon=5, delta=0)
    """

    partitions: tuple[Charge, ...] = attrs.field(converter=_partitions)
    relation: Relation = attrs.field(default=Relation.ADD_REMOVE, converter=Relation)
    #: How deep the tree is and how many charges it holds (set when it is built; see
    #: `MAX_NESTING` and `MAX_PARTS`).
    _depth: int = attrs.field(init=False, eq=False, repr=False, hash=False)
    _size: int = attrs.field(init=False, eq=False, repr=False, hash=False)

    @partitions.validator
    def _check_partitions(self, _attribute: Any, value: tuple[Any, ...]) -> None:
        if not value:
            raise InvalidCostError("partitions", value, "at least one partition is needed")
        for part in value:
            _check_charge(part)

    def __attrs_post_init__(self) -> None:
        _nesting(self, self.partitions)

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) guarantee of the whole parallel query."""
        known: dict[int, PrivacyCost] = {}  # a part that occurs again is costed once
        costs = []
        for part in self.partitions:
            cost = known.get(id(part))
            if cost is None:
                cost = known[id(part)] = cost_of(part)
            costs.append(cost)
        epsilons = sorted((c.epsilon for c in costs), reverse=True)
        deltas = sorted((c.delta for c in costs), reverse=True)
        take = 1 if self.relation is Relation.ADD_REMOVE else 2
        delta = sum(deltas[:take], Fraction(0))
        if delta >= 1:
            raise InvalidCostError("delta", delta, "the partitions' deltas reach 1")
        return _trusted(sum(epsilons[:take], Fraction(0)), delta)


@attrs.frozen(cache_hash=True)  # a tree of shared parts hashes in linear time
class Repeated:
    """``count`` runs of the same charge (adaptively chosen, same parameters).

    Every rule treats it exactly as ``count`` separate charges (see `atoms()`).

    Examples:
        >>> Repeated(PrivacyCost(1, "1e-6"), 4).cost
        PrivacyCost(epsilon=4, delta=4e-06)
    """

    charge: Charge = attrs.field()
    count: int = attrs.field(converter=_count)
    #: How deep the tree is and how many charges it holds (set when it is built; see
    #: `MAX_NESTING` and `MAX_PARTS`).
    _depth: int = attrs.field(init=False, eq=False, repr=False, hash=False)
    _size: int = attrs.field(init=False, eq=False, repr=False, hash=False)

    @charge.validator
    def _check_inner(self, _attribute: Any, value: Any) -> None:
        _check_charge(value)

    def __attrs_post_init__(self) -> None:
        _nesting(self, (self.charge,))

    @property
    def cost(self) -> PrivacyCost:
        """The basic composition of ``count`` runs."""
        return cost_of(self.charge).times(self.count)


#: A charge that is not a `Repeated`: one run of one mechanism.
Atom: TypeAlias = (
    PrivacyCost
    | LaplaceCharge
    | GaussianCharge
    | DiscreteLaplaceCharge
    | DiscreteGaussianCharge
    | RandomizedResponseCharge
    | BoundedRangeCharge
    | Subsampled
    | Parallel
)
#: Anything the accountant can be charged with.
Charge: TypeAlias = Atom | Repeated

#: Every charge type: what the accountant can be charged with (`Charge`), as a tuple
#: for ``isinstance``.
CHARGE_TYPES = (
    PrivacyCost,
    LaplaceCharge,
    GaussianCharge,
    DiscreteLaplaceCharge,
    DiscreteGaussianCharge,
    RandomizedResponseCharge,
    BoundedRangeCharge,
    Subsampled,
    Parallel,
    Repeated,
)


#: Charges that hold other charges, and those that hold none (the latter state no
#: neighbouring relation of their own).
_NESTED_TYPES = frozenset((Subsampled, Parallel, Repeated))
_LEAF_TYPES = frozenset(t for t in CHARGE_TYPES if t not in _NESTED_TYPES)


def _check_charge(value: Any) -> None:
    if not isinstance(value, CHARGE_TYPES):
        raise InvalidCostError(
            "charge",
            value,
            "expected a PrivacyCost, a charge from dpaccount.charges, or a mechanism",
        )


def atoms(charge: Charge) -> Iterator[tuple[Atom, int]]:
    """Flatten nested `Repeated` charges into ``(atom, multiplicity)`` pairs.

    This is the one place multiplicity is applied.

    Raises:
        InvalidCostError: More than `MAX_NESTING` `Repeated` levels (only a tree forged
            past its constructors, such as one that holds itself, can have them).
    """
    count, levels = 1, 0
    while isinstance(charge, Repeated):
        levels += 1
        if levels >= MAX_NESTING:
            raise _too_deep(levels + 1)
        count *= charge.count
        charge = charge.charge
    yield charge, count


def _too_deep(level: int) -> InvalidCostError:
    return InvalidCostError(
        "charge", f"<a tree nested at least {level} levels deep>",
        f"a charge tree may be nested at most {MAX_NESTING} levels deep (this one was "
        "changed after it was built, or holds itself)",
    )


def check_nesting(charge: Charge) -> None:
    """Refuse a tree deeper than `MAX_NESTING`, walking it without recursion.

    Trees built by the constructors never are; this catches one forged past them (a
    level set with ``object.__setattr__``, a tree that holds itself) before a recursive
    walk (costing, storing) meets it. Each shared subtree is walked once per level it
    occurs at, so a tree that shares its parts is walked in time linear in its distinct
    parts (times at most `MAX_NESTING`).

    Raises:
        InvalidCostError: The tree is nested deeper than `MAX_NESTING` levels.
    """
    if type(charge) not in _NESTED_TYPES:
        return
    stack: list[tuple[Any, int]] = [(charge, 1)]
    seen: set[tuple[int, int]] = set()
    while stack:
        node, level = stack.pop()
        if level > MAX_NESTING:
            raise _too_deep(level)
        if (id(node), level) in seen:
            continue
        seen.add((id(node), level))
        stack.extend((part, level + 1) for part in _parts(node))


def _parts(node: Any) -> tuple[Any, ...]:
    """The charges directly inside ``node`` (none for a leaf)."""
    kind = type(node)
    if kind is Parallel:
        return node.partitions  # type: ignore[no-any-return]
    if kind is Subsampled or kind is Repeated:
        return (node.charge,)
    return ()


def cost_of(charge: Charge) -> PrivacyCost:
    """The (epsilon, delta) guarantee of a charge under basic composition."""
    if isinstance(charge, PrivacyCost):
        return charge
    if isinstance(charge, CHARGE_TYPES):
        return charge.cost
    raise UnsupportedChargeError(f"cannot compute the cost of {shown(charge)}")


def relation_of(charge: Charge) -> Relation | None:
    """The neighbouring relation a charge is tied to, or None if it is stated for any."""
    for atom, _count in atoms(charge):
        if isinstance(atom, (Subsampled, Parallel)):
            return atom.relation
    return None



def _level_name(charge: Charge) -> str:
    if isinstance(charge, Subsampled):
        return f"Subsampled({charge.scheme.value})"
    if isinstance(charge, Parallel):
        return f"Parallel({charge.relation.value})"
    return type(charge).__name__


def _relations_text(relations: frozenset[Relation]) -> str:
    return " and ".join(sorted(r.value for r in relations))


def check_relations(charge: Charge, relation: Relation | str) -> None:
    """Check that every level of a charge tree meets its theorem's hypotheses.

    Each level's guarantee must hold for the neighbouring relation(s) its parent (or the
    ledger, at the top) needs, and each level passes on what its theorem needs of the
    level below:

    * `Subsampled`, Poisson: proven for add/remove neighbours only, and needs an
      inner mechanism that is DP under add/remove on the subsample (Balle, Barthe and
      Gaboardi 2018, Thm 8).
    * `Subsampled`, without replacement: proven for substitution only, and needs
      an inner mechanism that is DP under substitution on the subsample (BBG 2018, Thm 9).
    * `Parallel` under add/remove (McSherry 2009, Thm 4): one record is added to
      or removed from one partition, so each part must be DP under add/remove.
    * `Parallel` under substitution: a changed record either stays in its
      partition (a substitution there) or moves between two (a removal from one and an
      addition to the other), so each part must be DP under *both* relations.
    * `Repeated`: the same as its inner charge.
    * A plain cost or mechanism charge states no relation of its own: it is the
      caller's claim, for whatever relation its level needs.

    Args:
        charge: The charge tree.
        relation: The ledger's relation (what the whole charge must hold for).

    Raises:
        UnsupportedChargeError: Naming the first level (1 = the charge itself) whose
            theorem does not cover what its parent needs.
        InvalidCostError: The tree is nested deeper than `MAX_NESTING` levels (only
            one changed past its constructors can be; it is walked without recursion).

    Examples:
        >>> inner = Subsampled(PrivacyCost(0), "0.5", "without_replacement")
        >>> check_relations(Subsampled(inner, "0.5", "poisson"), "add_remove")
        Traceback (most recent call last):
        ...
        dpaccount.errors.UnsupportedChargeError: level 2 of this charge, ...
    """
    rel = relation if type(relation) is Relation else Relation(relation)
    kind = type(charge)
    if kind in _LEAF_TYPES:  # states no relation of its own: nothing to check
        return
    if (
        isinstance(charge, Subsampled)
        and type(charge.charge) in _LEAF_TYPES
        and SCHEME_RELATION[charge.scheme] is rel
    ):
        return  # the common DP-SGD step: one level, its theorem's relation
    _check_levels(charge, frozenset({rel}))


def _check_levels(charge: Charge, needed: frozenset[Relation]) -> None:
    """Every level against what the level above needs, depth first and without
    recursion; a level (a shared part) met again at the same depth and need is not
    walked again, and a tree deeper than `MAX_NESTING` (forged past the constructors) is
    refused."""
    stack: list[tuple[Any, frozenset[Relation], int, str]] = [(charge, needed, 1, "the ledger")]
    seen: set[tuple[int, frozenset[Relation], int]] = set()
    while stack:
        node, needed, level, parent = stack.pop()
        if level > MAX_NESTING:
            raise _too_deep(level)
        key = (id(node), needed, level)
        if key in seen:
            continue
        seen.add(key)
        own: Relation | None = None
        below = needed
        if isinstance(node, Subsampled):
            own = node.relation
            below = frozenset({own})
        elif isinstance(node, Parallel):
            own = node.relation
            below = frozenset(Relation) if own is Relation.SUBSTITUTION else frozenset({own})
        if own is not None and needed != {own}:
            raise UnsupportedChargeError(
                f"level {level} of this charge, {_level_name(node)}, is proven for "
                f"{own.value} neighbours only, but {parent} needs a guarantee for "
                f"{_relations_text(needed)}. Build the charge so that every level's "
                "theorem covers the relation above it (Poisson subsampling and add/remove "
                "parallel parts under add/remove; sampling without replacement under "
                "substitution)."
            )
        parts = _parts(node)
        if parts:  # reversed: the first part is checked first, as a recursive walk would
            here = f"level {level} ({_level_name(node)})"
            stack.extend((part, below, level + 1, here) for part in reversed(parts))


def describe(charge: Charge) -> str:
    """A short human-readable description of a charge (for tables and logs).

    Examples:
        >>> describe(Repeated(Subsampled(GaussianCharge(2, 1, 1), "0.01", "poisson"), 3))
        '3 x poisson(q=0.01) of Gaussian(sigma=2, sens=1)'
        >>> describe(PrivacyCost("0.5", "1e-6"))
        '(ε=0.5, δ=1e-06)'
    """
    f = format_number
    if isinstance(charge, PrivacyCost):
        return str(charge)
    if isinstance(charge, LaplaceCharge):
        return f"Laplace(scale={f(charge.scale)}, sens={f(charge.sensitivity)})"
    if isinstance(charge, GaussianCharge):
        return f"Gaussian(sigma={f(charge.sigma)}, sens={f(charge.sensitivity)})"
    if isinstance(charge, DiscreteLaplaceCharge):
        return f"discrete Laplace(b={f(charge.scale)}, S={f(charge.sensitivity)})"
    if isinstance(charge, DiscreteGaussianCharge):
        return f"discrete Gaussian(sigma={f(charge.sigma)}, S={f(charge.sensitivity)})"
    if isinstance(charge, RandomizedResponseCharge):
        return f"{charge.categories}-ary randomized response(ε={f(charge.epsilon)})"
    if isinstance(charge, BoundedRangeCharge):
        return f"bounded range(ε={f(charge.epsilon)})"
    if isinstance(charge, Subsampled):
        return f"{charge.scheme.value}(q={f(charge.rate)}) of {describe(charge.charge)}"
    if isinstance(charge, Parallel):
        return f"parallel over {len(charge.partitions)} partitions"
    if isinstance(charge, Repeated):
        return f"{charge.count} x {describe(charge.charge)}"
    raise UnsupportedChargeError(f"cannot describe {shown(charge)}")


def shown(charge: Any) -> str:
    """A charge for an error message: its repr when it holds no other charge, else its
    `describe()` (a tree's repr can be as large as the tree), at most 200 characters.

    Examples:
        >>> shown(PrivacyCost(1))
        'PrivacyCost(epsilon=1, delta=0)'
        >>> shown(Parallel([PrivacyCost(1)] * 1000))
        'Parallel(add_remove): parallel over 1000 partitions'
    """
    kind = type(charge)
    if kind in _NESTED_TYPES:
        text = f"{_level_name(charge)}: {describe(charge)}"
    elif kind in _LEAF_TYPES:
        text = repr(charge)
    else:
        text = f"<{kind.__name__}>"
    return text if len(text) <= 200 else f"{text[:180]}... ({len(text)} characters)"
