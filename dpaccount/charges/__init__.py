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

The package holds one concept a module, and every name is imported from here:

* `relations`: the neighbouring relations and sampling schemes.
* `leaves`: the leaf charges, one run of one mechanism described by its noise.
* `combinators`: `Subsampled`, `Parallel`, `Repeated` and `RepeatAndSelect`, the
  bounds on a tree, and `cost_of`.
* `counts`: `RunCount`, the random number of runs of a `RepeatAndSelect`.
* `walks`: `atoms`, `relation_of`, `describe` and `shown`.
* `checks`: `check_relations` and `check_nesting`, where a charge enters a ledger.

Examples:
    >>> c = Repeated(PrivacyCost("0.1"), 3)
    >>> list(atoms(c))
    [(PrivacyCost(epsilon=0.1, delta=0), 3)]
    >>> cost_of(c)
    PrivacyCost(epsilon=0.3, delta=0)
"""

from __future__ import annotations

from dpaccount.charges.checks import check_nesting, check_relations
from dpaccount.charges.combinators import (
    CHARGE_TYPES,
    MAX_NESTING,
    MAX_PARTS,
    Atom,
    Charge,
    Parallel,
    RepeatAndSelect,
    Repeated,
    Subsampled,
    cost_of,
)
from dpaccount.charges.counts import RunCount
from dpaccount.charges.leaves import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    RandomizedResponseCharge,
)
from dpaccount.charges.relations import SCHEME_RELATION as SCHEME_RELATION  # the engines read it
from dpaccount.charges.relations import Relation, Scheme
from dpaccount.charges.walks import atoms, describe, relation_of, shown
from dpaccount.costs import PrivacyCost  # noqa: F401 - the doctests above use it

#: In the order of the concepts (relations, leaves, combinators, walks and checks), the
#: order the API page shows them in.
__all__ = [  # noqa: RUF022
    "Relation",
    "Scheme",
    "MAX_NESTING",
    "MAX_PARTS",
    "LaplaceCharge",
    "GaussianCharge",
    "DiscreteLaplaceCharge",
    "DiscreteGaussianCharge",
    "RandomizedResponseCharge",
    "BoundedRangeCharge",
    "MixtureOfGaussiansCharge",
    "Subsampled",
    "Parallel",
    "Repeated",
    "RunCount",
    "RepeatAndSelect",
    "Atom",
    "Charge",
    "CHARGE_TYPES",
    "atoms",
    "check_nesting",
    "cost_of",
    "relation_of",
    "check_relations",
    "describe",
    "shown",
]
