"""Parallel charges in the tight engines: a group-by costs one group's, not a generic pair.

Reference values come from the Gaussian's closed-form Renyi divergence,
alpha * sensitivity**2 / (2 sigma**2) (Mironov 2017, Prop. 7), computed here.
"""

from __future__ import annotations

from fractions import Fraction

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget, GaussianCharge, Parallel, Relation, Repeated
from dpaccount.accounting.pld import PrivacyLossDistribution
from dpaccount.accounting.rdp import charge_rdp
from dpaccount.aggregates import groupby
from dpaccount.mechanisms import IntegerGaussianMechanism


def closed(sigma: float, alpha: float) -> float:
    return alpha / (2 * sigma**2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 20), min_size=1, max_size=6), st.floats(1.5, 64))
def test_rdp_of_parallel_is_the_largest_part_or_two(sigmas: list[float], alpha: float
                                                    ) -> None:
    parts = tuple(GaussianCharge(s, 1, 1) for s in sigmas)
    exact = sorted((closed(s, alpha) for s in sigmas), reverse=True)
    add_remove = charge_rdp(Parallel(parts), alpha)
    assert exact[0] <= add_remove <= exact[0] * (1 + 1e-8) + 1e-12  # not the sum
    substitution = charge_rdp(Parallel(parts, "substitution"), alpha,
                              relation=Relation.SUBSTITUTION)
    two = sum(exact[:2])
    assert two <= substitution <= two * (1 + 1e-8) + 1e-12


def test_a_repeated_part_counts_its_runs() -> None:
    part = Repeated(GaussianCharge(2, 1, 1), 3)
    value = charge_rdp(Parallel((part, GaussianCharge(1, 1, 1))), 4.0)
    assert value == pytest.approx(max(3 * closed(2, 4.0), closed(1, 4.0)), rel=1e-8)


def test_a_gaussian_group_by_is_accepted_by_the_renyi_filter_at_one_group_s_cost() -> None:
    df = pd.DataFrame({"k": ["a", "b", "c"] * 30, "x": [1.0] * 90})
    acct = Accountant(Budget(2, "1e-5"), rule="rdp")
    res = groupby(df, "k", keys=["a", "b", "c"]).count(acct, 1, delta="1e-6")
    alone = Accountant(Budget(2, "1e-5"), rule="rdp")
    alone.charge(res.record.charge.partitions[0])
    assert acct.spent == alone.spent


def test_pld_of_identical_parts_is_the_part_s() -> None:
    part = IntegerGaussianMechanism(1, Fraction(1, 10**6), 1).charge
    one = PrivacyLossDistribution.from_charge(part)
    five = PrivacyLossDistribution.from_charge(Parallel((part,) * 5))
    assert five.epsilon(1e-6) == one.epsilon(1e-6)
    mixed = PrivacyLossDistribution.from_charge(
        Parallel((part, IntegerGaussianMechanism(2, Fraction(1, 10**6), 1).charge)))
    assert mixed.epsilon(1e-6) >= one.epsilon(1e-6)  # generic pair of the max cost
