"""Walking a charge tree and describing it: multiplicity, relation, text.

`atoms` is the one place multiplicity is applied (``Repeated(c, k)`` is exactly k
charges of ``c`` under every rule); `relation_of` reads the relation a tree is tied
to; `describe` and `shown` put a charge into words for tables, logs and error messages
(a tree by its shape, never by its size).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dpaccount.charges.combinators import (
    _LEAF_TYPES,
    _NESTED_TYPES,
    MAX_NESTING,
    Atom,
    Charge,
    Parallel,
    RepeatAndSelect,
    Repeated,
    Subsampled,
    _clipped,
    _shown_other,
)
from dpaccount.charges.leaves import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    RandomizedResponseCharge,
)
from dpaccount.charges.relations import Relation
from dpaccount.costs import PrivacyCost, format_number
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

__all__ = ["atoms", "describe", "relation_of", "shown"]


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


def _parts(node: Any) -> tuple[Any, ...]:
    """The charges directly inside ``node`` (none for a leaf)."""
    kind = type(node)
    if kind is Parallel:
        return node.partitions  # type: ignore[no-any-return]
    if kind is Subsampled or kind is Repeated or kind is RepeatAndSelect:
        return (node.charge,)
    return ()


def relation_of(charge: Charge) -> Relation | None:
    """The neighbouring relation a charge is tied to, or None if it is stated for any."""
    for atom, _count in atoms(charge):
        if isinstance(atom, MixtureOfGaussiansCharge):
            return Relation.ADD_REMOVE
        if isinstance(atom, (Subsampled, Parallel)):
            return atom.relation
        if isinstance(atom, RepeatAndSelect):
            return relation_of(atom.charge)
    return None


def _level_name(charge: Charge) -> str:
    if isinstance(charge, Subsampled):
        return f"Subsampled({charge.scheme.value})"
    if isinstance(charge, Parallel):
        return f"Parallel({charge.relation.value})"
    if isinstance(charge, RepeatAndSelect):
        return f"RepeatAndSelect({charge.distribution.value})"
    return type(charge).__name__


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
    if isinstance(charge, MixtureOfGaussiansCharge):
        return (f"mixture of {len(charge.sensitivities)} Gaussians(sigma="
                f"{f(charge.sigma)}, max sens={f(max(charge.sensitivities))})")
    if isinstance(charge, Subsampled):
        return f"{charge.scheme.value}(q={f(charge.rate)}) of {describe(charge.charge)}"
    if isinstance(charge, Parallel):
        return f"parallel over {len(charge.partitions)} partitions"
    if isinstance(charge, Repeated):
        return f"{charge.count} x {describe(charge.charge)}"
    if isinstance(charge, RepeatAndSelect):
        shape = "" if charge.shape is None else f", shape={f(charge.shape)}"
        return (f"best of {charge.distribution.value}(mean={f(charge.mean)}{shape}) runs "
                f"of {describe(charge.charge)}")
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
        return _clipped(f"{_level_name(charge)}: {describe(charge)}")
    if kind in _LEAF_TYPES:
        return _clipped(repr(charge))
    return _shown_other(charge)
