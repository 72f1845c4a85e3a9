"""Every level of a nested charge meets its theorem's hypotheses (issue: soundness, item 2).

The accountant's verdict on random charge trees is compared with a reference validator
written here bottom-up, independently of ``charges.check_relations`` (which works
top-down): each node *provides* the set of relations its guarantee holds for.

* a plain cost or mechanism charge: the caller's claim, for any relation;
* Poisson subsampling (Balle, Barthe and Gaboardi 2018, Thm 8): add/remove, if its
  inner charge provides add/remove;
* sampling without replacement (BBG 2018, Thm 9): substitution, if its inner charge
  provides substitution;
* parallel parts under add/remove (McSherry 2009): add/remove, if every part provides it;
* parallel parts under substitution: substitution, if every part provides both
  relations (a changed record may stay in its partition or move to another);
* repetition: whatever its inner charge provides.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget
from dpaccount._numeric import log1p_expm1_scaled_up
from dpaccount.charges import (
    BoundedRangeCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Repeated,
    Subsampled,
)
from dpaccount.costs import PrivacyCost
from dpaccount.errors import UnsupportedChargeError

ANY = frozenset({"add_remove", "substitution"})


def provides(charge: object) -> frozenset[str]:
    if isinstance(charge, Subsampled):
        wanted = "add_remove" if charge.scheme.value == "poisson" else "substitution"
        return frozenset({wanted}) if wanted in provides(charge.charge) else frozenset()
    if isinstance(charge, Parallel):
        parts = [provides(p) for p in charge.partitions]
        if charge.relation.value == "add_remove":
            ok = all("add_remove" in p for p in parts)
        else:
            ok = all(p >= ANY for p in parts)
        return frozenset({charge.relation.value}) if ok else frozenset()
    if isinstance(charge, Repeated):
        return provides(charge.charge)
    return ANY


leaves = st.sampled_from([
    PrivacyCost(0),
    PrivacyCost("0.01", "1e-9"),
    LaplaceCharge(scale=100, sensitivity=1),
    GaussianCharge(sigma=50, sensitivity=1, epsilon="0.1"),
    RandomizedResponseCharge("0.05", categories=3),
    BoundedRangeCharge("0.05"),
])


def _extend(children: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(
        st.builds(Subsampled, children, st.sampled_from(["0.1", "0.5"]),
                  st.sampled_from(["poisson", "without_replacement"])),
        st.builds(Parallel, st.lists(children, min_size=1, max_size=3),
                  st.sampled_from(["add_remove", "substitution"])),
        st.builds(Repeated, children, st.integers(1, 3)),
    )


trees = st.recursive(leaves, _extend, max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(tree=trees, relation=st.sampled_from(list(Relation)))
def test_accountant_verdict_matches_the_reference_validator(tree: object, relation: Relation
                                                            ) -> None:
    acct = Accountant(Budget.unlimited("0.5"), relation=relation)
    expected = relation.value in provides(tree)
    if expected:
        acct.charge(tree)  # type: ignore[arg-type]
        assert len(acct.records) == 1
    else:
        with pytest.raises(UnsupportedChargeError, match=r"level \d+"):
            acct.charge(tree)  # type: ignore[arg-type]
        assert len(acct.records) == 0


def test_the_reviewed_nested_example_is_refused_naming_its_level() -> None:
    # Poisson around without-replacement at cost (0, 0) on an add/remove ledger: the
    # output reveals the Poisson sample's size, so the inner theorem does not apply.
    inner = Subsampled(PrivacyCost(0), "0.5", "without_replacement")
    acct = Accountant(Budget(1))
    with pytest.raises(UnsupportedChargeError, match=r"level 2.*without_replacement"):
        acct.charge(Subsampled(inner, "0.5", "poisson"))
    assert acct.spent == PrivacyCost(0)


def test_parallel_of_the_other_relation_around_a_subsample_is_refused() -> None:
    poisson_part = Subsampled(PrivacyCost(1), "0.1", "poisson")
    acct = Accountant(Budget(10), relation="substitution")
    with pytest.raises(UnsupportedChargeError, match="level 2"):
        acct.charge(Parallel([poisson_part, PrivacyCost(1)], relation="substitution"))
    wor_part = Subsampled(PrivacyCost(1), "0.1", "without_replacement")
    acct = Accountant(Budget(10))
    with pytest.raises(UnsupportedChargeError, match="level 2"):
        acct.charge(Parallel([wor_part], relation="add_remove"))
    # Consistent trees are admitted.
    acct.charge(Parallel([poisson_part.charge, Subsampled(PrivacyCost(1), "0.1", "poisson")]))
    assert len(acct.records) == 1


@settings(max_examples=300, deadline=None)
@given(rate=st.fractions(min_value=Fraction(1, 10**6), max_value=1, max_denominator=10**6),
       epsilon=st.fractions(min_value=0, max_value=10**5, max_denominator=1000))
def test_amplified_epsilon_is_an_upper_bound_at_any_epsilon(rate: Fraction,
                                                             epsilon: Fraction) -> None:
    """ln(1 + q (e^eps - 1)) (Balle, Barthe and Gaboardi 2018, Thm 8) is never under-counted,
    is within 1e-9 of the exact value, and is finite where e^eps overflows a float
    (regression: a subsample of a charge with eps > 709.8 raised OverflowError)."""
    mpmath.mp.dps = 50
    q, eps = mpmath.mpf(rate.numerator) / rate.denominator, \
        mpmath.mpf(epsilon.numerator) / epsilon.denominator
    exact = eps + mpmath.log(q + (1 - q) * mpmath.exp(-eps)) if eps > 0 else mpmath.mpf(0)
    bound = log1p_expm1_scaled_up(rate, epsilon)
    assert mpmath.mpf(bound.numerator) / bound.denominator >= exact
    assert bound - Fraction(mpmath.nstr(exact, 40)) <= Fraction(1, 10**9) * max(1, epsilon)
