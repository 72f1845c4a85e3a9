"""Hypothesis strategies shared by tests: every kind of charge a ledger can store."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import strategies as st

from dpaccount.charges import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
    cost_of,
)
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError

fractions = st.fractions(min_value=0, max_value=100, max_denominator=10**6)
deltas = st.fractions(min_value=0, max_value=Fraction(1, 1000), max_denominator=10**9)
positive = st.fractions(min_value=Fraction(1, 1000), max_value=100, max_denominator=10**6)


def _built(kind: object, *args: object) -> object | None:
    """``kind(*args)``, or None where the kind refuses the combination or its cost."""
    try:
        charge = kind(*args)  # type: ignore[operator]
        cost_of(charge)
    except InvalidCostError:
        return None
    return charge


rates = st.fractions(min_value=Fraction(1, 1000), max_value=1, max_denominator=1000)
atoms = st.one_of(
    st.builds(PrivacyCost, fractions, deltas),
    st.builds(LaplaceCharge, positive, positive),
    st.builds(_built, st.just(GaussianCharge), positive, positive, positive),
    st.builds(DiscreteLaplaceCharge, positive, st.integers(1, 5), st.integers(1, 4)),
    st.builds(_built, st.just(DiscreteGaussianCharge), positive, st.integers(1, 5), positive,
              st.fractions(min_value=Fraction(1, 10**6), max_value=Fraction(1, 2)),
              st.integers(1, 4)),
    st.builds(RandomizedResponseCharge, positive, st.integers(2, 9)),
    st.builds(BoundedRangeCharge, positive),
).filter(lambda c: c is not None)
#: Every kind of charge a ledger stores, nested (subsampled, parallel, repeated).
every_charge = st.recursive(atoms, lambda inner: st.one_of(
    st.builds(_built, st.just(Subsampled), inner, rates, st.sampled_from(Scheme)),
    st.builds(_built, st.just(Parallel), st.lists(inner, min_size=1, max_size=3),
              st.sampled_from(Relation)),
    st.builds(_built, st.just(Repeated), inner, st.integers(1, 9)),
).filter(lambda c: c is not None), max_leaves=6)


