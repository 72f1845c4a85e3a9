"""The neighbouring relations a guarantee is stated for, and the sampling schemes.

Each amplification theorem is proven for one relation (`SCHEME_RELATION`); the
combinators of `dpaccount.charges.combinators` and the checks of
`dpaccount.charges.checks` read it.
"""

from __future__ import annotations

import enum

__all__ = ["SCHEME_RELATION", "Relation", "Scheme"]


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


#: The relation each sampling scheme's amplification theorem is proven for
#: (Balle, Barthe and Gaboardi 2018, Table 1 and Thms 8 and 9).
SCHEME_RELATION = {
    Scheme.POISSON: Relation.ADD_REMOVE,
    Scheme.WITHOUT_REPLACEMENT: Relation.SUBSTITUTION,
}
