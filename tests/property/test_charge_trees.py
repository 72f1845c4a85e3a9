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

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Accountant, Budget
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
