"""The Accountant's basic-rule path through a store that decides on its own sums.

A fake :class:`~dpaccount.storage.base.SumLimitedStore` keeps records in a list and
decides with exact Fractions; "other writers" append behind the accountant's back. The
tests check what the accountant does with the store's answer: missed records folded in,
refusals reported with the true totals, a store whose totals disagree with its records
refused as corrupt, duplicate query ids refused. The re-numbering of payloads (which
the SQL stores rely on) is checked here without a database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from fractions import Fraction

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.accountant import Accountant
from dpaccount.charges import LaplaceCharge, cost_of
from dpaccount.composition import BasicRule
from dpaccount.costs import PrivacyCost
from dpaccount.errors import (
    BudgetExceededError,
    DeltaWarning,
    DuplicateQueryError,
    LedgerConflictError,
    LedgerCorruptError,
    StorageError,
)
from dpaccount.records import LedgerMeta, LedgerRecord, canonical_bytes
from dpaccount.storage._sql import split_at_seq
from dpaccount.storage.base import AppendResult, Store, SumLimitedStore


class FakeSumStore:
    """An in-process store with the sum-limited capability (not a MemoryStore).

    Args:
        lie: Refuse every append_within, whatever the sums (totals that disagree).
        before_decide: Called at the start of each append_within (another writer).
    """

    def __init__(self, lie: bool = False,
                 before_decide: Callable[[FakeSumStore], None] | None = None) -> None:
        self.meta: LedgerMeta | None = None
        self.records: list[LedgerRecord] = []
        self.lie = lie
        self.before_decide = before_decide
        self.calls = {"append": 0, "append_within": 0, "read": 0}
        self.limits: list[tuple[Fraction | None, Fraction, Fraction | None]] = []

    def initialize(self, meta: LedgerMeta) -> LedgerMeta:
        if self.meta is None:
            self.meta = meta
        return self.meta

    def head(self) -> int:
        return len(self.records)

    def read(self, start: int = 0) -> Sequence[LedgerRecord]:
        self.calls["read"] += 1
        return tuple(self.records[start:])

    def append(self, expected_head: int, record: LedgerRecord) -> None:
        self.calls["append"] += 1
        if expected_head != len(self.records) or record.seq != expected_head:
            raise LedgerConflictError("lost the race")
        self._store(record)

    def _store(self, record: LedgerRecord) -> None:
        if record.query_id is not None and self.find(record.query_id) is not None:
            raise LedgerConflictError(f"query_id {record.query_id!r} already recorded")
        self.records.append(record)

    def find(self, query_id: str) -> LedgerRecord | None:
        return next((r for r in self.records if r.query_id == query_id), None)

    def close(self) -> None:
        """Nothing to release."""

    def other_writer(self, cost: PrivacyCost, query_id: str | None = None) -> None:
        """Append as another process would, unseen by the accountant."""
        self._store(record(len(self.records), cost, query_id))

    def append_within(self, known_head: int, rec: LedgerRecord,
                      epsilon_limit: Fraction | None, delta_limit: Fraction,
                      delta_below: Fraction | None) -> AppendResult:
        self.calls["append_within"] += 1
        self.limits.append((epsilon_limit, delta_limit, delta_below))
        if self.before_decide is not None:
            self.before_decide(self)
        head = len(self.records)
        missed = tuple(self.records[known_head:])
        eps = sum((r.cost.epsilon for r in self.records), rec.cost.epsilon)
        delta = sum((r.cost.delta for r in self.records), rec.cost.delta)
        fits = ((epsilon_limit is None or eps <= epsilon_limit) and delta <= delta_limit
                and (delta_below is None or delta < delta_below))
        if self.lie or not fits:
            return AppendResult(False, head, missed)
        self._store(attrs.evolve(rec, seq=head))
        return AppendResult(True, head, missed)


def record(seq: int, cost: PrivacyCost, query_id: str | None = None) -> LedgerRecord:
    return LedgerRecord(seq=seq, label=None, charge=cost, cost=cost, rule="basic",
                        timestamp=datetime(2026, 1, 1, tzinfo=UTC), query_id=query_id)


def test_the_fake_has_the_capability() -> None:
    store = FakeSumStore()
    assert isinstance(store, Store) and isinstance(store, SumLimitedStore)


def test_basic_rule_charges_go_through_append_within_without_reads() -> None:
    store = FakeSumStore()
    acct = Accountant((1, "1e-6"), store=store)
    for i in range(3):
        assert acct.charge(PrivacyCost("1/4")).seq == i
    assert store.calls["append_within"] == 3
    assert store.calls["append"] == 0
    assert store.limits[0] == (Fraction(1), Fraction(1, 10**6), None)


def test_missed_records_are_folded_in_and_the_record_gets_the_store_seq() -> None:
    store = FakeSumStore()
    acct = Accountant((1, "1e-6"), store=store)
    acct.charge(PrivacyCost("1/10"))
    store.other_writer(PrivacyCost("1/5", "1e-7"))
    store.other_writer(PrivacyCost("1/20"))
    reads = store.calls["read"]
    mine = acct.charge(PrivacyCost("1/4"), label="late", query_id="q")
    assert mine.seq == 3
    assert store.records[3] == mine  # what the accountant returns is what is stored
    assert store.calls["read"] == reads  # folded from the result, not re-read
    expected = PrivacyCost(Fraction(1, 10) + Fraction(1, 5) + Fraction(1, 20) + Fraction(1, 4),
                           Fraction(1, 10**7))
    assert acct.spent == expected
    assert acct.charge(PrivacyCost("1/100")).seq == 4  # its head follows the store's


def test_a_refusal_after_catching_up_reports_the_true_totals() -> None:
    store = FakeSumStore()
    acct = Accountant(1, store=store)
    acct.charge(PrivacyCost("1/2"))
    store.other_writer(PrivacyCost("3/10"))  # the accountant still believes 1/2 is spent
    with pytest.raises(BudgetExceededError) as info:
        acct.charge(PrivacyCost("1/4"))  # fits 1/2 locally, not the true 4/5
    err = info.value
    assert err.spent == PrivacyCost(Fraction(4, 5))
    assert err.would_be == PrivacyCost(Fraction(21, 20))
    assert err.requested == PrivacyCost(Fraction(1, 4))
    assert store.head() == 2  # nothing written
    assert acct.charge(PrivacyCost("1/5")).seq == 2  # exactly 1 fits


def test_the_declared_dataset_size_is_passed_and_its_refusal_explained() -> None:
    store = FakeSumStore()
    with pytest.warns(DeltaWarning):  # a budget delta this large warns; 1/n binds first
        acct = Accountant((1, "1e-3"), store=store, dataset_size=10_000)
    acct.charge(PrivacyCost("1/10", "1e-5"))
    store.other_writer(PrivacyCost(0, "8e-5"))
    with pytest.raises(BudgetExceededError, match="1/n"):
        acct.charge(PrivacyCost(0, "1e-5"))  # 1e-5 + 8e-5 + 1e-5 reaches 1/n = 1e-4
    assert store.limits[-1] == (Fraction(1), Fraction(1, 1000), Fraction(1, 10_000))
    assert store.head() == 2


def test_a_store_whose_totals_disagree_is_corrupt() -> None:
    store = FakeSumStore(lie=True)
    acct = Accountant(1, store=store)
    with pytest.raises(LedgerCorruptError, match="disagree"):
        acct.charge(PrivacyCost("1/10"))
    assert store.head() == 0


def test_a_store_that_appends_at_an_unexpected_seq_is_corrupt() -> None:
    class Skipping(FakeSumStore):
        def append_within(self, known_head: int, rec: LedgerRecord,
                          epsilon_limit: Fraction | None, delta_limit: Fraction,
                          delta_below: Fraction | None) -> AppendResult:
            result = super().append_within(known_head, rec, epsilon_limit, delta_limit,
                                           delta_below)
            return attrs.evolve(result, seq=result.seq + 1)

    acct = Accountant(1, store=Skipping())
    with pytest.raises(LedgerCorruptError):
        acct.charge(PrivacyCost("1/10"))


def test_a_duplicate_query_id_is_refused_before_and_during_the_append() -> None:
    store = FakeSumStore()
    acct = Accountant(1, store=store)
    first = acct.charge(PrivacyCost("1/10"), query_id="job")
    with pytest.raises(DuplicateQueryError) as info:
        acct.charge(PrivacyCost("1/10"), query_id="job")
    assert info.value.record == first
    # Another writer records the same id between the accountant's check and its append.
    racing = FakeSumStore(before_decide=lambda s: s.other_writer(PrivacyCost("1/5"), "race")
                          if s.find("race") is None else None)
    acct2 = Accountant(1, store=racing)
    with pytest.raises(DuplicateQueryError) as info2:
        acct2.charge(PrivacyCost("1/10"), query_id="race")
    assert info2.value.record.cost == PrivacyCost("1/5")
    assert acct2.spent == PrivacyCost("1/5")  # the winner's record was folded in
    assert racing.head() == 1


def test_a_conflict_without_a_duplicate_is_reported() -> None:
    class Failing(FakeSumStore):
        def append_within(self, known_head: int, rec: LedgerRecord,
                          epsilon_limit: Fraction | None, delta_limit: Fraction,
                          delta_below: Fraction | None) -> AppendResult:
            raise LedgerConflictError("the store says no")

    with pytest.raises(LedgerConflictError):
        Accountant(1, store=Failing()).charge(PrivacyCost("1/10"), query_id="x")


def test_storage_errors_pass_through_and_record_nothing() -> None:
    class Broken(FakeSumStore):
        def append_within(self, known_head: int, rec: LedgerRecord,
                          epsilon_limit: Fraction | None, delta_limit: Fraction,
                          delta_below: Fraction | None) -> AppendResult:
            raise StorageError("lost the connection")

    acct = Accountant(1, store=Broken())
    with pytest.raises(StorageError):
        acct.charge(PrivacyCost("1/10"))
    assert acct.spent == PrivacyCost(0)


def test_a_rule_other_than_exactly_basic_keeps_compare_and_append() -> None:
    class MyBasic(BasicRule):
        """Basic composition under another class: not trusted to be the store's sum."""

    store = FakeSumStore()
    acct = Accountant(1, store=store, rule=MyBasic())
    acct.charge(PrivacyCost("1/4"))
    assert (store.calls["append"], store.calls["append_within"]) == (1, 0)


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.fractions(min_value=0, max_value=Fraction(1, 2),
                                               max_denominator=50)),
        min_size=1, max_size=25,
    )
)
def test_two_writers_admit_exactly_what_the_exact_sums_allow(
    steps: list[tuple[bool, Fraction]],
) -> None:
    """Two accountants share a store: each charge is admitted iff the exact total fits.

    A refusal decided by the store reports the true total spent; one the accountant
    makes on its own (stale, hence smaller) total before asking the store reports that.
    """
    store = FakeSumStore()
    writers = [Accountant(2, store=store), Accountant(2, store=store)]
    total = Fraction(0)
    for who, eps in steps:
        fits = total + eps <= 2
        try:
            writers[who].charge(PrivacyCost(eps))
        except BudgetExceededError as exc:
            assert not fits
            assert exc.spent.epsilon <= total and exc.would_be.epsilon > 2
        else:
            assert fits
            total += eps
    assert [r.seq for r in store.records] == list(range(len(store.records)))
    assert sum((r.cost.epsilon for r in store.records), Fraction(0)) == total
    assert writers[0].spent == writers[1].spent == PrivacyCost(total)


# -- the payload re-numbering the SQL stores rely on -------------------------------------

LABELS = st.one_of(
    st.text(st.sampled_from(['"', "\\", "s", "e", "q", ":", ",", "1", "é", "😀", "\n",
                             "\x00"]), max_size=24),
    st.sampled_from(['"seq":1,', '"seq":0,', '\\"seq\\":1,', '"seq":1,"timestamp":"x"}']),
    st.text(max_size=16),
)


@settings(max_examples=150, deadline=None)
@given(label=LABELS, query_id=st.one_of(st.none(), LABELS), seq=st.integers(0, 10**6),
       new_seq=st.integers(0, 10**12), nested=st.booleans())
def test_renumbering_the_payload_equals_encoding_the_renumbered_record(
    label: str, query_id: str | None, seq: int, new_seq: int, nested: bool
) -> None:
    charge = LaplaceCharge(1, 2) if nested else PrivacyCost("1/3", "1e-9")
    rec = LedgerRecord(seq=seq, label=label, charge=charge, cost=cost_of(charge),
                       rule="basic", timestamp=datetime(2026, 5, 1, tzinfo=UTC),
                       query_id=query_id)
    payload = canonical_bytes(rec).decode()
    assert payload.count(f'"seq":{seq},') == 1  # the claim split_at_seq rests on
    prefix, suffix = split_at_seq(payload, seq)
    assert f"{prefix}{new_seq}{suffix}".encode() == canonical_bytes(
        attrs.evolve(rec, seq=new_seq))


def test_split_at_seq_refuses_an_ambiguous_or_missing_seq() -> None:
    with pytest.raises(StorageError):
        split_at_seq('{"a":{"seq":1,"x":0},"seq":1,"t":0}', 1)
    with pytest.raises(StorageError):
        split_at_seq('{"seq":2,"t":0}', 1)
