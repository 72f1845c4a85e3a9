"""Guarded aggregates for pipelines: count, sum, mean, histogram and quantile.

Each function takes the data (a numpy array, a pandas Series, or any 1-D sequence), the
`Accountant` to charge and the privacy parameters, and
follows the same order:

1. validate every parameter and build the mechanism (its cost is then known);
2. **charge the accountant** (a refusal raises
   `BudgetExceededError` and the data is never read);
3. compute the true answer with the implemented arithmetic below, add noise, and
   return an `AggregateResult` with the noisy value, the ledger record, the
   sensitivity used and an accuracy statement (an interval that holds with probability
   at least ``level``).

**Sensitivity is exact for the implemented arithmetic.** Summing floats in floating point
can change by more than the ideal ``upper - lower`` when one record changes, because
rounding depends on the other records and on their order (Casacuberta, Shoemate, Vadhan
and Wagaman 2022, "Widespread Underestimation of Sensitivity in Differentially Private
Libraries and How to Fix It", ACM CCS). Here each value is clipped to the declared
bounds and rounded to the lattice ``g * Z`` (g a power of two, so ``x / g`` is exact),
and the integers are summed exactly (int64 in chunks that cannot overflow, Python ints
across chunks). Clipping and rounding are monotone, so every record maps to an integer in
``[a, b]`` with ``a = rint(lower / g)`` and ``b = rint(upper / g)``; the sensitivities
below are in those integer units, exactly, whatever the other records and their order.

**Noise** is integer-valued and sampled exactly (Canonne, Kamath and Steinke 2020, "The
Discrete Gaussian for Differential Privacy", Algorithms 2 and 3): the discrete Laplace
with scale S / epsilon is epsilon-DP for an integer query of L1 sensitivity S (Dwork and
Roth 2014, Thm 3.6 in its discrete form: the density ratio is exp(|v| / scale)); the
discrete Gaussian's guarantee is its exact one-dimensional privacy profile (CKS 2020,
Thm 7) for small shifts and its zCDP bound otherwise (CKS 2020, Thm 14 with Cor. 13).
Each release is one mechanism with fixed parameters; the accountant composes them.

**Neighbouring relations** (the accountant's relation decides which bound is used). The
data passed is "the records of the dataset that this query reads": it may be a column
selected by a data-independent rule (a filter on each record's own value), so under
substitution a changed record may also move in or out of the selection.

| aggregate | add/remove | substitution (value change, or in/out of the selection) |
|---|---|---|
| count | 1 | 1 |
| sum | max(abs(a), abs(b)) | max(b - a, abs(a), abs(b)) |
| mean | centred sum: max(b-c, c-a) and count: 1 | centred sum: b - a; count: 1 |
| histogram | one bin by 1 (L1 = L2² = 1) | two bins by 1 each (L1 = L2² = 2) |
| quantile | max(q, 1 - q) (utility) | 1 (utility) |

Missing values: NaN is replaced by ``fill`` (default: 0 clipped into the bounds) in
``sum``/``mean``; ``+inf``/``-inf`` clip to the bounds. ``histogram`` drops values outside
every bin and NaN; ``quantile`` counts NaN as above every candidate. None of this can
raise after the charge, so an exception never reveals a record.

Examples:
    >>> import numpy as np
    >>> from dpaccount import Accountant
    >>> from dpaccount.mechanisms._sampling import RandomSource
    >>> acct = Accountant(2)
    >>> ages = np.array([23.0, 35.5, 41.0, 67.0, 19.0])
    >>> res = sum(ages, acct, "0.5", lower=0, upper=100, rng=RandomSource.seeded(1))
    >>> res.cost
    PrivacyCost(epsilon=0.5, delta=0)
    >>> res.sensitivity        # max(|lower|, |upper|) under add/remove
    Fraction(100, 1)
    >>> lo, hi = res.interval
    >>> lo <= res.value <= hi
    True
"""

from dpaccount.aggregates.grouping import GroupBy, GroupedResult, groupby
from dpaccount.aggregates.lattice import (
    FixedPoint,
    exact_sum,
    histogram_counts,
    lattice_sum,
    quantile_utilities,
    sum_sensitivity,
)
from dpaccount.aggregates.partitions import (
    OptimalSelection,
    SelectionPreview,
    ThresholdSelection,
)
from dpaccount.aggregates.results import AggregatePreview, AggregateResult
from dpaccount.aggregates.scalar import count, histogram, mean, preview, quantile, sum
from dpaccount.aggregates.units import ContributionBounds, bound_contributions
from dpaccount.mechanisms.integer import IntegerGaussianMechanism, IntegerLaplaceMechanism

__all__ = [
    "AggregatePreview",
    "AggregateResult",
    "ContributionBounds",
    "FixedPoint",
    "GroupBy",
    "GroupedResult",
    "IntegerGaussianMechanism",
    "IntegerLaplaceMechanism",
    "OptimalSelection",
    "SelectionPreview",
    "ThresholdSelection",
    "bound_contributions",
    "count",
    "exact_sum",
    "groupby",
    "histogram",
    "histogram_counts",
    "lattice_sum",
    "mean",
    "preview",
    "quantile",
    "quantile_utilities",
    "sum",
    "sum_sensitivity",
]
