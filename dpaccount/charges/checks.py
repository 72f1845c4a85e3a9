"""The checks of a whole charge tree where it enters a ledger.

`check_relations` checks every level against what its theorem needs of the level
below (the neighbouring relation); `check_nesting` refuses a tree forged past its
constructors to be deeper than `MAX_NESTING`. Both walk the tree without recursion and
walk a shared part once.
"""

from __future__ import annotations

from typing import Any

from dpaccount.charges.combinators import (
    _LEAF_TYPES,
    _NESTED_TYPES,
    MAX_NESTING,
    Charge,
    Parallel,
    Subsampled,
)
from dpaccount.charges.leaves import MixtureOfGaussiansCharge
from dpaccount.charges.relations import SCHEME_RELATION, Relation
from dpaccount.charges.walks import _level_name, _parts, _too_deep
from dpaccount.costs import PrivacyCost  # noqa: F401 - the doctest of check_relations uses it
from dpaccount.errors import UnsupportedChargeError

__all__ = ["check_nesting", "check_relations"]


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
    * `Repeated` and `RepeatAndSelect`: the same as their inner charge.
    * `MixtureOfGaussiansCharge`: stated for add/remove neighbours only.
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
    if kind in _LEAF_TYPES and kind is not MixtureOfGaussiansCharge:
        # states no relation of its own: nothing to check
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
        elif isinstance(node, MixtureOfGaussiansCharge):
            own = Relation.ADD_REMOVE  # its theorem's neighbours (it holds no parts)
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
