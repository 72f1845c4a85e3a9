"""The combinators that build a charge tree: `Subsampled`, `Parallel` and `Repeated`.

Each wraps other charges and states the neighbouring relation its theorem is proven
for (amplification by subsampling, parallel composition) or repeats a charge. Where a
tree is built its size is bounded: it is nested at most `MAX_NESTING` levels deep and
holds at most `MAX_PARTS` charges. `cost_of` is the (epsilon, delta) of any charge,
which a combinator's own cost is computed from; `CHARGE_TYPES` is every charge type.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any, TypeAlias

import attrs

from dpaccount._numeric import check_count, check_rate, log1p_expm1_scaled_up
from dpaccount.charges.leaves import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    RandomizedResponseCharge,
    _cached,
    _key,
)
from dpaccount.charges.relations import SCHEME_RELATION, Relation, Scheme
from dpaccount.costs import PrivacyCost, trusted_cost
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

__all__ = [
    "CHARGE_TYPES",
    "MAX_NESTING",
    "MAX_PARTS",
    "Atom",
    "Charge",
    "Parallel",
    "Repeated",
    "Subsampled",
    "cost_of",
]


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


def _subsampled_cost(rate: Fraction, epsilon: Fraction, delta: Fraction) -> PrivacyCost:
    return _cached(
        ("subsampled", *_key(rate, epsilon, delta)),
        lambda: trusted_cost(log1p_expm1_scaled_up(rate, epsilon), delta * rate),
    )


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
        return trusted_cost(sum(epsilons[:take], Fraction(0)), delta)


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


def cost_of(charge: Charge) -> PrivacyCost:
    """The (epsilon, delta) guarantee of a charge under basic composition."""
    if isinstance(charge, PrivacyCost):
        return charge
    if isinstance(charge, CHARGE_TYPES):
        return charge.cost
    raise UnsupportedChargeError(f"cannot compute the cost of {_shown_other(charge)}")


def _shown_other(value: Any) -> str:
    """How `dpaccount.charges.shown` names a value of no charge type: by its type."""
    return _clipped(f"<{type(value).__name__}>")


def _clipped(text: str) -> str:
    """``text`` for an error message: at most 200 characters."""
    return text if len(text) <= 200 else f"{text[:180]}... ({len(text)} characters)"
