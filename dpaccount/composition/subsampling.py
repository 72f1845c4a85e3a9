"""Privacy amplification by subsampling (Balle, Barthe and Gaboardi 2018).

Running an (epsilon, delta)-DP mechanism on a random subsample of rate r gives
(ln(1 + r (e^epsilon - 1)), r delta)-DP, for Poisson sampling with add/remove
neighbours (Balle, Barthe and Gaboardi 2018, Thm 8) and for sampling without
replacement with substitution neighbours (Thm 9). Other pairings of scheme and relation
are not covered by those theorems and are refused. Amplification is per mechanism run,
so it holds whatever the adaptivity of the composition that follows.

Examples:
    >>> c = subsample(PrivacyCost(1), "0.01", "poisson", "add_remove")
    >>> 0.0170 < float(c.epsilon) < 0.0171   # ln(1 + 0.01 (e - 1))
    True
"""

from __future__ import annotations

from typing import Any

from dpaccount.charges import SCHEME_RELATION, Relation, Scheme, Subsampled
from dpaccount.composition.plans import as_cost
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

__all__ = ["THEOREM_SUBSAMPLING", "subsample", "subsampled"]

THEOREM_SUBSAMPLING = (
    "Balle, Barthe and Gaboardi 2018, Thm 8 (Poisson, add/remove) and Thm 9 (without "
    "replacement, substitution): ln(1 + r (e^epsilon - 1)), r delta"
)


def subsampled(cost: Any, rate: Any, scheme: Any, relation: Any) -> Subsampled:
    """The `Subsampled` charge, after checking the pairing.

    Raises:
        InvalidCostError: Unknown scheme or relation, or an invalid rate or cost.
        UnsupportedChargeError: A scheme whose theorem is not for this relation.
    """
    try:
        scheme_v = Scheme(scheme)
    except ValueError:
        raise InvalidCostError(
            "scheme", scheme, f"use one of {[s.value for s in Scheme]}"
        ) from None
    try:
        relation_v = Relation(relation)
    except ValueError:
        raise InvalidCostError(
            "relation", relation, f"use one of {[r.value for r in Relation]}"
        ) from None
    proven = SCHEME_RELATION[scheme_v]
    if proven is not relation_v:
        raise UnsupportedChargeError(
            f"amplification for {scheme_v.value} sampling is proven for {proven.value} "
            f"neighbours (Balle, Barthe and Gaboardi 2018, Thms 8 and 9), not "
            f"{relation_v.value}"
        )
    return Subsampled(as_cost(cost), rate, scheme_v)


def subsample(cost: Any, rate: Any, scheme: Any, relation: Any) -> PrivacyCost:
    """The amplified cost of running a mechanism of ``cost`` on a subsample.

    epsilon' = ln(1 + rate (e^epsilon - 1)) rounded up and delta' = rate delta (Balle,
    Barthe and Gaboardi 2018, Thm 8 for Poisson sampling with add/remove neighbours,
    Thm 9 for sampling without replacement with substitution neighbours).

    Args:
        cost: The mechanism's (epsilon, delta) on the subsample.
        rate: The sampling rate in (0, 1].
        scheme: ``"poisson"`` or ``"without_replacement"``.
        relation: ``"add_remove"`` or ``"substitution"``; must match the scheme.

    Raises:
        UnsupportedChargeError: Mismatched scheme and relation.

    Examples:
        >>> subsample(PrivacyCost(1), "0.5", "poisson", "substitution")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dpaccount.errors.UnsupportedChargeError: amplification for poisson ... not substitution
    """
    return subsampled(cost, rate, scheme, relation).cost
