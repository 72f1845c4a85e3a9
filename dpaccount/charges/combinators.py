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

from dpaccount._numeric import (
    check_count,
    check_delta,
    check_epsilon,
    check_rate,
    float_down,
    float_up,
    log1p_expm1_scaled_up,
    to_fraction,
)
from dpaccount.charges.counts import RunCount, tail_up, tnb_gamma_down
from dpaccount.charges.leaves import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
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
    "RepeatAndSelect",
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


def _mean(value: Any) -> Fraction:
    mean = to_fraction(value, "mean")
    if not mean >= 1:
        raise InvalidCostError("mean", value, "the mean number of runs must be >= 1")
    return mean


def _run_count(value: Any) -> RunCount:
    try:
        return RunCount(value)
    except ValueError:
        raise InvalidCostError(
            "distribution", value, f"use one of {[c.value for c in RunCount]}"
        ) from None


def _shape(value: Any) -> Fraction | None:
    if value is None:
        return None
    shape = check_epsilon(value, "shape")
    if shape > 1000:
        raise InvalidCostError("shape", value, "must be at most 1000")
    return shape


#: The largest number of runs the (epsilon, delta) cost of a `RepeatAndSelect` truncates
#: at (beyond it the tail is charged to delta whole).
_MAX_TRUNCATION = 2**40


@attrs.frozen(cache_hash=True)
class RepeatAndSelect:
    """A charge run a random number K of times, only the best run's output released.

    Hyperparameter tuning: train (``charge``, one whole run) K times on the same data
    with independent randomness and keep the best model (its score computed inside the
    run). K is drawn, independently of the data, from a Poisson distribution of mean
    ``mean`` or a truncated negative binomial of that mean and shape eta (``shape``; 1
    is the geometric, 0 the logarithmic distribution; `RunCount`). Papernot and Steinke
    2022 ("Hyperparameter tuning with Renyi differential privacy", ICLR,
    arXiv:2110.03620) bound its Renyi DP from the run's (Thm 2, truncated negative
    binomial; Thm 6, Poisson), which the RDP engine uses. The whole selection is one
    mechanism: it composes with other charges under a rule's own adaptivity (its
    parameters are fixed when it is charged; the runs are not chosen adaptively).

    Its (epsilon, delta) ``cost``, which the (epsilon, delta) rules compose:

    * a truncated negative binomial count and a pure epsilon-DP run: ((2 + eta)
      epsilon, 0), Papernot and Steinke 2022, Thm 2 in its limit lambda, lambda_hat ->
      infinity (an epsilon-DP run is (lambda, epsilon)-RDP at every order, and RDP of
      order infinity is pure DP); eta = 1 is Liu and Talwar 2019's 3 epsilon;
    * otherwise, at the declared ``delta``: (T epsilon, delta) for the smallest T with
      E[K] delta_run + P[K > T] <= delta. Proof: given K = k the output is a
      post-processing of k runs, (k epsilon, k delta_run)-DP by basic composition
      (Dwork and Roth 2014, Thm 3.16), so for any event S, P[A(x) in S] <=
      sum_{k <= T} P[K = k] (e^{T epsilon} P[A_k(x') in S] + k delta_run) + P[K > T]
      <= e^{T epsilon} P[A(x') in S] + E[K] delta_run + P[K > T].

    The PLD engine has no sound privacy loss distribution for it and uses this cost;
    the zCDP rule uses a pure cost; the Gaussian-DP filter refuses it.

    Attributes:
        charge: One run.
        mean: E[K] >= 1.
        distribution: ``"poisson"`` or ``"truncated_negative_binomial"``.
        shape: eta >= 0 for the truncated negative binomial; None for Poisson.
        delta: The delta at which ``cost`` is stated when no pure bound holds (0 where
            one does).

    Examples:
        >>> r = RepeatAndSelect(PrivacyCost(1), mean=10,
        ...                     distribution="truncated_negative_binomial", shape=1)
        >>> r.cost   # the geometric count: 3 epsilon
        PrivacyCost(epsilon=3, delta=0)
    """

    charge: Charge = attrs.field()
    mean: Fraction = attrs.field(converter=_mean)
    distribution: RunCount = attrs.field(converter=_run_count)
    shape: Fraction | None = attrs.field(default=None, converter=_shape)
    delta: Fraction = attrs.field(default=Fraction(0), converter=check_delta)
    #: How deep the tree is and how many charges it holds (set when it is built; see
    #: `MAX_NESTING` and `MAX_PARTS`).
    _depth: int = attrs.field(init=False, eq=False, repr=False, hash=False)
    _size: int = attrs.field(init=False, eq=False, repr=False, hash=False)

    @charge.validator
    def _check_inner(self, _attribute: Any, value: Any) -> None:
        _check_charge(value)

    def __attrs_post_init__(self) -> None:
        poisson = self.distribution is RunCount.POISSON
        if poisson and self.shape is not None:
            raise InvalidCostError("shape", self.shape, "a Poisson count takes no shape")
        if not poisson and self.shape is None:
            raise InvalidCostError(
                "shape", None, "a truncated negative binomial count needs its shape eta >= 0"
            )
        if float_up(self.mean) > 1e12:
            raise InvalidCostError("mean", self.mean, "at most 1e12 runs on average")
        _nesting(self, (self.charge,))
        self.cost  # noqa: B018 - a cost that cannot be stated is refused where it is built

    @property
    def gamma(self) -> float:
        """The truncated negative binomial's gamma for ``mean``, rounded down (1.0 for a
        Poisson count, where it is unused)."""
        if self.shape is None:
            return 1.0
        return tnb_gamma_down(float_up(self.mean), float_down(self.shape))

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) guarantee of the whole selection (see the class)."""
        inner = cost_of(self.charge)
        return _cached(
            ("repeat_and_select", *_key(inner.epsilon, inner.delta, self.mean,
                                        Fraction(-1) if self.shape is None else self.shape,
                                        self.delta),
             self.distribution.value),
            lambda: self._cost(inner),
        )

    def _cost(self, inner: PrivacyCost) -> PrivacyCost:
        if self.shape is not None and inner.delta == 0:
            return trusted_cost((2 + self.shape) * inner.epsilon, Fraction(0))
        if inner.epsilon == 0 and inner.delta == 0:
            return trusted_cost(Fraction(0), Fraction(0))
        spare = self.delta - self.mean * inner.delta
        if not spare > 0:
            raise InvalidCostError(
                "delta", self.delta,
                "no pure bound holds for this count and run: declare delta > E[K] times "
                "the run's delta, at which the (epsilon, delta) cost is stated",
            )
        mean, gamma = float_up(self.mean), self.gamma
        eta = 0.0 if self.shape is None else float_down(self.shape)

        def fits(t: int) -> bool:
            return Fraction(tail_up(self.distribution, mean, eta, gamma, t)) <= spare

        hi = 1
        while not fits(hi):
            hi *= 2
            if hi > _MAX_TRUNCATION:
                raise InvalidCostError("delta", self.delta, "too small for this count")
        lo = hi // 2 + 1 if hi > 1 else 1
        while lo < hi:  # the smallest t that fits, in (hi / 2, hi]
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return trusted_cost(hi * inner.epsilon, self.delta)


#: A charge that is not a `Repeated`: one run of one mechanism.
Atom: TypeAlias = (
    PrivacyCost
    | LaplaceCharge
    | GaussianCharge
    | DiscreteLaplaceCharge
    | DiscreteGaussianCharge
    | RandomizedResponseCharge
    | BoundedRangeCharge
    | MixtureOfGaussiansCharge
    | Subsampled
    | Parallel
    | RepeatAndSelect
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
    MixtureOfGaussiansCharge,
    Subsampled,
    Parallel,
    RepeatAndSelect,
    Repeated,
)


#: Charges that hold other charges, and those that hold none (the latter state no
#: neighbouring relation of their own).
_NESTED_TYPES = frozenset((Subsampled, Parallel, RepeatAndSelect, Repeated))
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
