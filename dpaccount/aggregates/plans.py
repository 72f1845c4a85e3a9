"""What a group-by statistic charges, decided on the driver before any data is read.

**Why one group's cost pays for all.** Each group's statistic reads only the rows of its
group, and a privacy unit's rows fall in at most G = ``max_groups_per_unit`` groups (G = 1
when one row is one person). Under add/remove of a unit, at most G groups change, each by
at most that unit's bounded rows, and the groups' noise is independent. With G = 1 the
guarantee is the largest group's (McSherry 2009, "Privacy Integrated Queries", Thm 4,
parallel composition); with G > 1 it is the composition of G group mechanisms (Dwork and
Roth 2014, Thm 3.16, with parallel composition inside each of the G runs). Under
substitution a changed unit leaves up to G groups and enters up to G others, and a group
it stays in sees a substitution, so each group's mechanism is built to hold under both
relations and twice as many groups count. The record is therefore

* ``Parallel(parts, relation)`` for G = 1, one part per declared key, or
* ``Repeated(Parallel(parts, relation), G)`` for G > 1,

each part calibrated to epsilon / (G m) (and delta / (G m)), m = 1 under add/remove and
2 under substitution, so that the record's cost is exactly the epsilon (and at most the
delta) asked for. This holds for any adaptivity the ledger's rule allows: the record is
one charge with fixed parameters.

Without declared keys, the keys are selected privately (`OptimalSelection` by default,
`ThresholdSelection` with ``key_selection="threshold"``): a share
``selection_share`` of epsilon (and, for Gaussian noise, of delta; all of delta for
Laplace noise) pays for the selection, whose per-key cost joins each part, and the
record holds two parts standing for the undeclared key domain.

`plan_statistic` runs a statistic's checks and splits its budget; `record_charge`
builds the one charge the ledger records. Both read only declared parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, TypeAlias

from dpaccount._numeric import check_delta, check_positive, to_fraction
from dpaccount.aggregates._checks import (
    PreviewOf,
    check_accountant,
    check_level,
    choose_mechanism,
)
from dpaccount.aggregates.partitions import KeySelection, calibrate_selection
from dpaccount.aggregates.units import ContributionBounds
from dpaccount.charges import Charge, Parallel, Relation, Repeated, cost_of
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["Plan", "plan_statistic", "record_charge"]

#: What a statistic will charge: the ledger's relation, the noise (``"laplace"`` or
#: ``"gaussian"``), the confidence level, each part's epsilon and delta, and the
#: selection of undeclared keys (None when the keys are declared).
Plan: TypeAlias = tuple[Relation, str, float, Fraction, Fraction, KeySelection | None]


def plan_statistic(
    bounds: ContributionBounds, keys: Sequence[Any] | None, accountant: Any, epsilon: Any,
    delta: Any, mechanism: str | None, level: Any, selection_share: Any,
    key_selection: str = "optimal",
) -> Plan:
    """Checks, and the per-part epsilon/delta of the statistic and of the selection
    (``key_selection``: the method, one of `SELECTION_METHODS`). In a preview, the
    selection is left on the stand-in accountant for `SelectionPreview`."""
    relation = check_accountant(accountant)
    eps, dlt = check_positive(epsilon, "epsilon"), check_delta(delta)
    lvl = check_level(level)
    parts = bounds.max_groups_per_unit * (1 if relation is Relation.ADD_REMOVE else 2)
    selection: KeySelection | None = None
    if keys is None:
        share = to_fraction(selection_share, "selection_share")
        if not 0 < share < 1:
            raise InvalidCostError("selection_share", selection_share, "must be in (0, 1)")
        if dlt == 0:
            raise ConfigError(
                "the keys are not declared, so they are selected privately, which needs "
                "delta > 0 (e.g. delta=1e-6); or declare the public keys with keys=[...]"
            )
        kind = choose_mechanism(
            mechanism or "laplace", dlt if mechanism == "gaussian" else Fraction(0)
        )
        sel_delta = dlt if kind == "laplace" else dlt * share
        selection = calibrate_selection(key_selection, eps * share / parts, sel_delta / parts)
        if isinstance(accountant, PreviewOf):
            accountant.selection = selection
        eps, dlt = eps * (1 - share), (Fraction(0) if kind == "laplace" else dlt - sel_delta)
    else:
        kind = choose_mechanism(mechanism, dlt)
    return relation, kind, lvl, eps / parts, dlt / parts, selection


def record_charge(
    part: Charge, relation: Relation, selection: KeySelection | None,
    bounds: ContributionBounds, keys: Sequence[Any] | None,
) -> Charge:
    """The one charge for all groups: ``part`` for each declared key (or two stand-ins
    for the undeclared key domain), in parallel, repeated G times for G > 1."""
    if selection is not None:  # the undeclared key domain: two stand-in parts
        part = cost_of(part) + selection.cost
        parallel = Parallel((part, part), relation)
    else:
        parallel = Parallel((part,) * len(keys or ()), relation)
    g = bounds.max_groups_per_unit
    return parallel if g == 1 else Repeated(parallel, g)
