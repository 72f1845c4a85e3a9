"""One contract every ledger store passes: memory, SQLite and PostgreSQL.

The base class :class:`StoreContract` states the Store protocol's behaviour; each
backend subclasses it and says how to open (and reopen) a store. The durable backends
also pass :class:`DurableContract`: persistence, append-only triggers, tamper detection,
explicit migrations and many ledgers per database.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import pg_schema, pg_url

from dpaccount.accountant import Accountant
from dpaccount.charges import GaussianCharge, LaplaceCharge, Relation, Repeated, cost_of
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DuplicateQueryError,
    LedgerConflictError,
    LedgerCorruptError,
    StorageError,
)
from dpaccount.ledgers import open_ledger
from dpaccount.records import LedgerMeta, LedgerRecord, canonical_bytes, chain_hash_payload
from dpaccount.storage._sql import sums_follow
from dpaccount.storage.base import DecidingStore, GroupAppend, Store, SumLimitedStore
from dpaccount.storage.memory import MemoryStore
from dpaccount.storage.sqlite import SQLiteStore

#: Labels and query ids that could confuse a textual re-numbering of the payload.
LABELS = st.one_of(
    st.text(st.sampled_from(['"', "\\", "s", "e", "q", ":", ",", "1", "0", "é", "€", "😀",
                             "\n", "\x00", "{", "}"]), max_size=24),
    st.sampled_from(['"seq":1,', '"seq":0,', '\\"seq\\":1,', '","seq":1,"', "\\",
                     '"seq":1,"timestamp":"x"}']),
    st.text(max_size=16),
)

META = LedgerMeta.build("main", Budget(1, "1e-6"), {"name": "basic"}, Relation.ADD_REMOVE)
#: A ledger whose stored budget is far above what the raw appends of some tests spend:
#: PostgreSQL enforces a basic ledger's stored budget on every append, whatever limits a
#: caller passes (see the hostile-writer tests at the end of unit/test_roles.py).
ROOMY = LedgerMeta.build("main", Budget(10**6, "1/2"), {"name": "basic"},
                         Relation.ADD_REMOVE)


def rec(
    seq: int, eps: str = "1/10", query_id: str | None = None, charge: Any = None
) -> LedgerRecord:
    charge = PrivacyCost(eps) if charge is None else charge

    return LedgerRecord(
        seq=seq,
        label=f"q{seq}",
        charge=charge,
        cost=cost_of(charge),
        rule="basic",
        timestamp=datetime(2026, 1, 1, 12, 0, seq % 60, tzinfo=UTC),
        query_id=query_id,
    )


class StoreContract:
    """Behaviour every :class:`Store` must have."""

    durable = False

    @pytest.fixture
    def opener(self) -> Callable[[str], Store]:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def store(self, opener: Callable[[str], Store]) -> Iterator[Store]:
        s = opener("main")
        s.initialize(META)
        yield s
        s.close()

    @pytest.fixture
    def roomy(self, opener: Callable[[str], Store]) -> Iterator[Store]:
        """The ledger ``main`` with the `ROOMY` budget, for raw appends that spend more
        than `META`'s."""
        s = opener("main")
        s.initialize(ROOMY)
        yield s
        s.close()

    def test_is_a_store(self, store: Store) -> None:
        assert isinstance(store, Store)

    def test_initialize_keeps_the_first_meta(self, store: Store) -> None:
        other = LedgerMeta.build("main", Budget(5), {"name": "basic"}, Relation.SUBSTITUTION)
        assert store.initialize(other) == META
        assert store.initialize(META) == META

    def test_empty_ledger(self, store: Store) -> None:
        assert store.head() == 0
        assert list(store.read()) == []
        assert store.find("nope") is None

    def test_append_and_read_round_trip(self, roomy: Store) -> None:
        store = roomy
        charges = [PrivacyCost("1/3", "1e-9"), LaplaceCharge(2, 1),
                   Repeated(GaussianCharge(4, 1, "1/200"), 3)]
        records = [rec(i, charge=c, query_id=f"id{i}") for i, c in enumerate(charges)]
        for r in records:
            store.append(r.seq, r)
        assert store.head() == 3
        assert list(store.read()) == records
        assert list(store.read(1)) == records[1:]
        assert list(store.read(3)) == []
        assert store.find("id2") == records[2]

    def test_append_with_a_stale_head_conflicts_and_writes_nothing(self, store: Store) -> None:
        store.append(0, rec(0))
        with pytest.raises(LedgerConflictError):
            store.append(0, rec(0, eps="1/2"))
        with pytest.raises(LedgerConflictError):
            store.append(2, rec(2))
        assert store.head() == 1
        assert [r.cost.epsilon for r in store.read()] == [Fraction(1, 10)]

    def test_duplicate_query_id_conflicts(self, store: Store) -> None:
        store.append(0, rec(0, query_id="same"))
        with pytest.raises(LedgerConflictError):
            store.append(1, rec(1, query_id="same"))
        assert store.head() == 1
        found = store.find("same")
        assert found is not None and found.seq == 0

    def test_records_without_query_id_do_not_collide(self, store: Store) -> None:
        for i in range(3):
            store.append(i, rec(i))
        assert store.head() == 3

    def test_threads_racing_never_lose_or_duplicate(self, opener: Callable[[str], Store],
                                                    roomy: Store) -> None:
        store = roomy
        per_thread, threads = 15, 4
        stores = [store] + [opener("main") if self.durable else store for _ in range(threads - 1)]
        for s in stores[1:]:
            s.initialize(ROOMY)

        def worker(s: Store, t: int) -> None:
            done = 0
            while done < per_thread:
                head = s.head()
                try:
                    s.append(head, rec(head, query_id=f"t{t}-{done}"))
                except LedgerConflictError:
                    continue
                done += 1

        pool = [threading.Thread(target=worker, args=(s, t)) for t, s in enumerate(stores)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        records = store.read()
        assert [r.seq for r in records] == list(range(per_thread * threads))
        assert len({r.query_id for r in records}) == per_thread * threads
        for s in stores[1:]:
            if s is not store:
                s.close()

    def test_accountant_enforces_the_budget_on_this_store(self, store: Store) -> None:
        acct = Accountant(Budget(1, "1e-6"), store=store, name="main")
        for _ in range(4):
            acct.charge(PrivacyCost("1/4"))
        with pytest.raises(BudgetExceededError):
            acct.charge(PrivacyCost("1/100"))
        assert store.head() == 4

    def test_accountant_refuses_a_retried_query_id(self, store: Store) -> None:
        acct = Accountant(Budget(1, "1e-6"), store=store, name="main")
        first = acct.charge(PrivacyCost("1/4"), query_id="job-7")
        with pytest.raises(DuplicateQueryError) as info:
            acct.charge(PrivacyCost("1/4"), query_id="job-7")
        assert info.value.record == first
        assert acct.spent == PrivacyCost("1/4")


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def opener(self) -> Callable[[str], Store]:
        return lambda name: MemoryStore()


class DurableContract(StoreContract):
    """What the SQL stores add: persistence, triggers, verification, migration."""

    durable = True

    def raw(self, sql: str, params: tuple[Any, ...] = ()) -> None:  # pragma: no cover
        raise NotImplementedError

    def unprotect(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def url(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def fill(self, store: Store, n: int = 5) -> list[LedgerRecord]:
        records = [rec(i, eps=f"{i + 1}/100") for i in range(n)]
        for r in records:
            store.append(r.seq, r)
        return records

    def test_records_persist_across_reopen(self, opener: Callable[[str], Store],
                                           store: Store) -> None:
        records = self.fill(store)
        store.close()
        again = opener("main")
        assert again.initialize(META) == META
        assert list(again.read()) == records
        again.close()

    def test_tip_caches_exact_sums(self, store: Store) -> None:
        self.fill(store, 4)
        tip = store.verify()  # type: ignore[attr-defined]
        assert tip.head == 4
        assert tip.epsilon_sum == Fraction(1 + 2 + 3 + 4, 100)

    def test_triggers_refuse_update_and_delete(self, store: Store) -> None:
        self.fill(store, 2)
        for sql in ("UPDATE {s}records SET payload = 'x'", "DELETE FROM {s}records"):
            with pytest.raises(Exception, match="append-only") as info:
                self.raw(sql)
            assert isinstance(info.value, (sqlite3.Error, self.db_error()))
        assert store.head() == 2
        store.verify()  # type: ignore[attr-defined]

    def db_error(self) -> type[Exception]:
        return sqlite3.Error

    @pytest.mark.parametrize(
        ("tamper", "bad_seq"),
        [
            ("UPDATE {s}records SET payload = replace(payload, '\"3/100\"', '\"1/100\"') "
             "WHERE seq = 2", 2),
            ("UPDATE {s}records SET payload = replace(payload, '\"q2\"', '\"qq\"') "
             "WHERE seq = 2", 2),
            ("DELETE FROM {s}records WHERE seq = 1", 1),
            ("DELETE FROM {s}records WHERE seq = 4", 4),
            ("UPDATE {s}records SET hash = 'f' || substr(hash, 2) WHERE seq = 3", 3),
            ("UPDATE {s}ledgers SET epsilon_sum = '1/1000'", 4),
        ],
    )
    def test_tampering_is_detected_by_verify_and_on_open(
        self, opener: Callable[[str], Store], store: Store, tamper: str, bad_seq: int
    ) -> None:
        self.fill(store)
        self.unprotect()
        self.raw(tamper)
        with pytest.raises(LedgerCorruptError) as info:
            store.verify()  # type: ignore[attr-defined]
        assert info.value.seq == bad_seq
        again = opener("main")
        with pytest.raises(LedgerCorruptError):
            again.initialize(META)
        with pytest.raises(LedgerCorruptError):
            open_ledger(self.url(), name="main", budget=Budget(1, "1e-6"))
        again.close()

    @pytest.mark.parametrize(
        "tamper",
        [
            "UPDATE {s}ledgers SET epsilon_sum = '0/1', delta_sum = '0/1'",
            "UPDATE {s}ledgers SET head = 0, epsilon_sum = '0/1', delta_sum = '0/1'",
            "UPDATE {s}ledgers SET head = head + 2",
        ],
    )
    def test_the_cached_tip_cannot_be_reset_while_triggers_stand(self, store: Store,
                                                                 tamper: str) -> None:
        # Integrity review: setting the cached sums back to 0 let a writer opened earlier
        # keep charging past the budget. The database itself now refuses it.
        self.fill(store, 3)
        with pytest.raises(self.db_error(), match="forward"):
            self.raw(tamper)
        assert store.head() == 3
        store.verify()  # type: ignore[attr-defined]

    def test_a_tip_advanced_without_the_new_records_cost_is_refused(self, store: Store
                                                                     ) -> None:
        # With the triggers standing, an attacker could still insert a valid next record
        # and advance the tip to it while leaving its cost out of the cached sums: a
        # writer opened earlier would then admit that much more. The database refuses.
        self.fill(store, 2)
        prev = self.fetch("SELECT hash FROM {s}records WHERE seq = 1")[0][0]
        payload = canonical_bytes(rec(2, eps="9/10")).decode()
        link = chain_hash_payload(prev, payload)
        self.raw("INSERT INTO {s}records VALUES ('main', 2, ?, ?, ?, NULL)",
                 (payload, prev, link))
        with pytest.raises(self.db_error(), match="forward"):
            self.raw("UPDATE {s}ledgers SET head = 3, last_hash = ?", (link,))
        total = sum(Fraction(i + 1, 100) for i in range(2)) + Fraction(9, 10)
        self.raw("UPDATE {s}ledgers SET head = 3, last_hash = ?, epsilon_sum = ?",
                 (link, f"{total.numerator}/{total.denominator}"))  # with the cost: fine
        assert store.verify().head == 3  # type: ignore[attr-defined]

    def test_a_cost_spelled_inside_a_label_does_not_stand_in_for_the_records_cost(
        self, store: Store
    ) -> None:
        # The sums trigger reads the record's cost from its payload by position: a label
        # spelling out a cost of 0 must not be taken for it.
        self.fill(store, 2)
        prev = self.fetch("SELECT hash FROM {s}records WHERE seq = 1")[0][0]
        decoy = attrs.evolve(rec(2, eps="9/10"),
                             label='"cost":{"delta":"0/1","epsilon":"0/1","kind":"cost"}')
        payload = canonical_bytes(decoy).decode()
        link = chain_hash_payload(prev, payload)
        self.raw("INSERT INTO {s}records VALUES ('main', 2, ?, ?, ?, NULL)",
                 (payload, prev, link))
        with pytest.raises(self.db_error(), match="forward"):
            self.raw("UPDATE {s}ledgers SET head = 3, last_hash = ?", (link,))
        total = Fraction(1, 100) + Fraction(2, 100) + Fraction(9, 10)
        self.raw("UPDATE {s}ledgers SET head = 3, last_hash = ?, epsilon_sum = ?",
                 (link, f"{total.numerator}/{total.denominator}"))
        assert store.verify().head == 3  # type: ignore[attr-defined]

    def reset_behind(self) -> None:  # pragma: no cover - overridden
        """Reset the cached sums to 0 around the triggers, leaving them standing."""
        raise NotImplementedError

    def test_every_write_path_refuses_a_tip_reset_behind_its_back(self, store: Store
                                                                  ) -> None:
        # Fail closed inside the deciding transaction (issue 28, item 3): the cached tip
        # reset where the triggers did not see it no longer extends the tip this store
        # saw, so no write path writes anything.
        self.fill(store, 3)
        self.reset_behind()
        s: Any = store
        attempts: dict[str, Callable[[], object]] = {
            "append": lambda: s.append(3, rec(3)),
            "append_within": lambda: s.append_within(3, rec(3), None, Fraction(0), None),
            "append_decided": lambda: s.append_decided(3, rec(3), lambda missed: True),
            "append_group": lambda: s.append_group(
                [GroupAppend("main", 3, rec(3), None, lambda missed: True)]),
            "write_snapshot": lambda: s.write_snapshot(3, "{}", None),
            "migrate": lambda: s.migrate(META.model_copy(update={"budget_delta": "0/1"})),
        }
        for name, attempt in attempts.items():
            with pytest.raises(LedgerCorruptError):
                attempt()
                raise AssertionError(f"{name} wrote on a reset tip")
        assert self.fetch("SELECT count(*) FROM {s}records") == [(3,)]
        assert self.fetch("SELECT count(*) FROM {s}snapshots") == [(0,)]
        assert self.fetch("SELECT count(*) FROM {s}meta_history") == [(1,)]

    def test_meta_edit_without_migration_is_detected(self, store: Store) -> None:
        self.fill(store, 1)
        self.raw("UPDATE {s}ledgers SET meta = replace(meta, '\"1/1\"', '\"9/1\"')")
        with pytest.raises(LedgerCorruptError, match="migration"):
            store.verify()  # type: ignore[attr-defined]

    def test_reopen_with_other_settings_is_refused_unless_migrated(self, store: Store) -> None:
        store.close()
        acct = open_ledger(self.url(), name="main", budget=Budget(1, "1e-6"))
        acct.charge(PrivacyCost("1/2"))
        acct.store.close()
        with pytest.raises(ConfigError):
            open_ledger(self.url(), name="main", budget=Budget(2, "1e-6"))
        with pytest.raises(ConfigError):
            open_ledger(self.url(), name="main", budget=Budget(1, "1e-6"),
                        relation="substitution")
        bigger = open_ledger(self.url(), name="main", budget=Budget(2, "1e-6"), migrate=True)
        assert bigger.spent == PrivacyCost("1/2")
        assert bigger.remaining.epsilon == Fraction(3, 2)
        history = bigger.store.meta_history()  # type: ignore[attr-defined]
        assert [(v, h, m.budget.epsilon) for v, _, h, m in history] == [
            (0, 0, Fraction(1)), (1, 1, Fraction(2))]
        bigger.store.close()
        same = open_ledger(self.url(), name="main", budget=Budget(2, "1e-6"))
        assert same.spent == PrivacyCost("1/2")
        same.store.close()

    def test_many_named_ledgers_share_a_database(self, store: Store) -> None:
        store.close()
        a = open_ledger(self.url(), name="census", budget=1)
        b = open_ledger(self.url(), name="survey", budget=2)
        a.charge(PrivacyCost("1/4"), query_id="x")
        b.charge(PrivacyCost("1"), query_id="x")  # the same id in another ledger is fine
        assert (a.spent.epsilon, b.spent.epsilon) == (Fraction(1, 4), Fraction(1))
        assert set(a.store.names()) >= {"census", "survey", "main"}  # type: ignore[attr-defined]
        a.store.close()
        b.store.close()


    # -- append_decided: the caller decides under the store's write lock ----------------

    def deciding(self, store: Store) -> DecidingStore:
        assert isinstance(store, DecidingStore)
        return store

    def test_append_decided_hands_over_the_missed_records_and_appends_at_the_head(
        self, opener: Callable[[str], Store], store: Store
    ) -> None:
        other = opener("main")
        other.initialize(META)
        winners = self.fill(other, 3)  # this store still believes the head is 0
        seen: list[list[LedgerRecord]] = []

        def decide(missed: Sequence[LedgerRecord]) -> bool:
            seen.append(list(missed))
            return True

        mine = rec(0, eps="1/7", query_id="late")
        result = self.deciding(store).append_decided(0, mine, decide)
        assert (result.appended, result.seq, list(result.missed)) == (True, 3, winners)
        assert seen == [winners]
        assert list(store.read()) == [*winners, attrs.evolve(mine, seq=3)]
        again = self.deciding(store).append_decided(4, rec(4), decide)
        assert (again.appended, again.seq, again.missed) == (True, 4, ())
        other.append(5, rec(5))  # the lock was released, and the chain continues
        tip = store.verify()  # type: ignore[attr-defined]
        assert (tip.head, tip.epsilon_sum) == (
            6, Fraction(1 + 2 + 3, 100) + Fraction(1, 7) + Fraction(2, 10))
        other.close()

    def test_append_decided_refused_or_failed_writes_nothing_and_releases_the_lock(
        self, opener: Callable[[str], Store], store: Store
    ) -> None:
        self.fill(store, 2)
        s = self.deciding(store)
        refused = s.append_decided(2, rec(2), lambda missed: False)
        assert (refused.appended, refused.seq, refused.missed) == (False, 2, ())

        def broken(missed: Sequence[LedgerRecord]) -> bool:
            raise ValueError("the decision failed")

        with pytest.raises(ValueError, match="the decision failed"):
            s.append_decided(2, rec(2), broken)
        store.append(2, rec(2, query_id="once"))
        with pytest.raises(LedgerConflictError):  # a query_id recorded before
            s.append_decided(3, rec(3, query_id="once"), lambda missed: True)
        assert store.head() == 3
        other = opener("main")  # nothing holds the lock: another writer appends at once
        other.initialize(META)
        other.append(3, rec(3))
        assert s.append_decided(4, rec(4), lambda missed: True).appended
        assert store.verify().head == 5  # type: ignore[attr-defined]
        other.close()

    # -- append_within: the store decides the basic rule on its own sums ---------------

    def within(self, store: Store) -> SumLimitedStore:
        assert isinstance(store, SumLimitedStore)
        return store

    def fetch(self, sql: str) -> list[tuple[Any, ...]]:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_append_within_appends_at_the_current_head(
        self, opener: Callable[[str], Store], store: Store
    ) -> None:
        other = opener("main")
        other.initialize(META)
        winners = self.fill(other, 3)  # this store still believes the head is 0
        mine = rec(0, eps="1/7", query_id="late")
        result = self.within(store).append_within(0, mine, Fraction(1), Fraction(0), None)
        assert (result.appended, result.seq) == (True, 3)
        assert list(result.missed) == winners
        stored = list(store.read())
        assert stored == [*winners, attrs.evolve(mine, seq=3)]
        tip = store.verify()  # type: ignore[attr-defined]
        assert (tip.head, tip.epsilon_sum) == (4, Fraction(1 + 2 + 3, 100) + Fraction(1, 7))
        # Appending again from a fresh head misses nothing.
        again = self.within(store).append_within(4, rec(4), Fraction(1), Fraction(0), None)
        assert (again.appended, again.seq, again.missed) == (True, 4, ())
        # The compare-and-append path still works after it (its tip cache is current).
        store.append(5, rec(5, eps="1/1000"))
        assert store.verify().head == 6  # type: ignore[attr-defined]
        other.close()

    def test_append_within_compares_the_exact_sums_with_the_limits(self, roomy: Store) -> None:
        store = roomy
        s = self.within(store)
        third = PrivacyCost("1/3", "1/3000000")
        for i in range(2):
            assert s.append_within(i, rec(i, charge=third), Fraction(1), Fraction(1, 10**6),
                                   None).appended
        # 1/3 + 1/3 + 1/3 is exactly 1 (a float sum would not be): admitted at the limit.
        assert s.append_within(2, rec(2, charge=third), Fraction(1), Fraction(1, 10**6),
                               None).appended
        tiny = rec(3, charge=PrivacyCost(Fraction(1, 10**30)))
        refused = s.append_within(3, tiny, Fraction(1), Fraction(1, 10**6), None)
        assert (refused.appended, refused.seq, refused.missed) == (False, 3, ())
        # No epsilon limit: only delta counts; delta_below is strict, delta_limit is not.
        eps_only = rec(3, charge=PrivacyCost(5))
        assert s.append_within(3, eps_only, None, Fraction(1, 10**6), None).appended
        last = rec(4, charge=PrivacyCost(0, Fraction(1, 10**6)))
        assert not s.append_within(4, last, None, Fraction(1), Fraction(2, 10**6)).appended
        assert not s.append_within(4, last, None, Fraction(19, 10**7), None).appended
        assert s.append_within(4, last, None, Fraction(2, 10**6), None).appended
        tip = store.verify()  # type: ignore[attr-defined]
        assert (tip.head, tip.epsilon_sum, tip.delta_sum) == (5, Fraction(6),
                                                              Fraction(2, 10**6))
        # The cached sums are stored reduced ("num/den" in lowest terms).
        assert self.fetch("SELECT epsilon_sum, delta_sum FROM {s}ledgers WHERE name = 'main'"
                          ) == [("6/1", "1/500000")]

    def test_append_within_refusal_writes_nothing_and_reports_the_missed(
        self, opener: Callable[[str], Store], store: Store
    ) -> None:
        other = opener("main")
        other.initialize(META)
        winners = self.fill(other, 4)  # epsilon 1/100 + ... + 4/100 = 1/10
        result = self.within(store).append_within(
            1, rec(1, eps="91/100"), Fraction(1), Fraction(0), None
        )
        assert (result.appended, result.seq, list(result.missed)) == (False, 4, winners[1:])
        assert store.head() == 4
        fits = self.within(store).append_within(4, rec(4, eps="9/10"), Fraction(1),
                                                Fraction(0), None)
        assert (fits.appended, fits.seq) == (True, 4)  # 1/10 + 9/10 is exactly 1
        other.close()

    def test_append_within_duplicate_query_id_conflicts(self, store: Store) -> None:
        s = self.within(store)
        assert s.append_within(0, rec(0, query_id="same"), None, Fraction(0), None).appended
        with pytest.raises(LedgerConflictError):
            s.append_within(1, rec(1, query_id="same"), None, Fraction(0), None)
        with pytest.raises(LedgerConflictError):  # also when appended at another head
            s.append_within(0, rec(0, query_id="same"), None, Fraction(0), None)
        assert store.head() == 1
        assert store.verify().head == 1  # type: ignore[attr-defined]

    def test_append_within_ahead_of_the_ledger_is_corruption(self, store: Store) -> None:
        self.fill(store, 2)
        with pytest.raises(LedgerCorruptError):
            self.within(store).append_within(5, rec(5), None, Fraction(0), None)
        assert store.head() == 2

    def test_append_within_threads_admit_exactly_the_limit(
        self, opener: Callable[[str], Store], store: Store
    ) -> None:
        threads, per_thread, limit = 4, 12, 30  # 48 attempts of 1/100, 30 fit in 3/10
        stores = [store] + [opener("main") for _ in range(threads - 1)]
        for s in stores[1:]:
            s.initialize(META)
        outcomes: list[bool] = []
        lock = threading.Lock()

        def worker(s: Store, t: int) -> None:
            head = 0
            for i in range(per_thread):
                r = rec(head, eps="1/100", query_id=f"t{t}-{i}")
                result = self.within(s).append_within(head, r, Fraction(limit, 100),
                                                      Fraction(0), None)
                assert [m.seq for m in result.missed] == list(range(head, result.seq))
                head = result.seq + result.appended
                with lock:
                    outcomes.append(result.appended)

        pool = [threading.Thread(target=worker, args=(s, t)) for t, s in enumerate(stores)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        assert len(outcomes) == threads * per_thread
        assert sum(outcomes) == limit
        tip = store.verify()  # type: ignore[attr-defined]
        assert (tip.head, tip.epsilon_sum) == (limit, Fraction(limit, 100))
        for s in stores[1:]:
            s.close()

    def test_append_within_stores_the_canonical_payload_and_hash(self, roomy: Store) -> None:
        """The re-numbered payload is the canonical encoding; its hash is Python's.

        Labels and query ids full of quotes, backslashes, non-ASCII text and the text
        ``"seq":1,`` cannot confuse the re-numbering (see ``split_at_seq``).
        """
        store = roomy

        @settings(max_examples=25, deadline=None)
        # A query_id is a text column: PostgreSQL refuses NUL there (a StorageError).
        @given(label=LABELS,
               query_id=st.one_of(st.none(), LABELS.filter(lambda t: "\x00" not in t)))
        def check(label: str, query_id: str | None) -> None:
            if query_id is not None and store.find(query_id) is not None:
                return  # the same id drawn twice: a duplicate, tested elsewhere
            head = store.head()
            store.append(head, rec(head))  # another writer: the record below is behind
            mine = attrs.evolve(rec(head, eps="1/1000"), label=label, query_id=query_id)
            result = self.within(store).append_within(head, mine, None, Fraction(0), None)
            assert (result.appended, result.seq) == (True, head + 1)
            expected = canonical_bytes(attrs.evolve(mine, seq=head + 1)).decode()
            rows = self.fetch(
                "SELECT seq, payload, prev_hash, hash FROM {s}records "
                f"WHERE ledger = 'main' AND seq >= {head} ORDER BY seq"
            )
            assert [r[0] for r in rows] == [head, head + 1]
            (_, payload, prev, stored_hash) = rows[1]
            assert payload == expected
            assert prev == rows[0][3] == chain_hash_payload(rows[0][2], canonical_bytes(rec(head)))
            assert stored_hash == chain_hash_payload(prev, expected)
            assert list(store.read(head + 1)) == [attrs.evolve(mine, seq=head + 1)]

        check()


class TestSQLiteStore(DurableContract):
    @pytest.fixture(autouse=True)
    def _path(self, tmp_path: Path) -> None:
        self.path = tmp_path / "ledger.db"

    @pytest.fixture
    def opener(self) -> Callable[[str], Store]:
        return lambda name: SQLiteStore(self.path, name=name)

    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def raw(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        # The attacker is given dpaccount's trigger function (without it the sqlite3
        # shell cannot move a ledger's tip at all).
        with sqlite3.connect(self.path) as conn:
            conn.create_function("dpaccount_sums_follow", 5, sums_follow)
            conn.execute(sql.format(s=""), params)
        conn.close()

    def fetch(self, sql: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.path) as conn:
            rows = conn.execute(sql.format(s="")).fetchall()
        conn.close()
        return rows

    def unprotect(self) -> None:
        with sqlite3.connect(self.path) as conn:
            for t in ("records_append_only_update", "records_append_only_delete",
                      "ledgers_tip_moves_forward"):
                conn.execute(f"DROP TRIGGER {t}")
        conn.close()

    def reset_behind(self) -> None:
        from dpaccount.storage.sqlite.schema import SCHEMA

        with sqlite3.connect(self.path) as conn:  # dropped, reset, re-created as it was
            conn.execute("DROP TRIGGER ledgers_tip_moves_forward")
            conn.execute("UPDATE ledgers SET epsilon_sum = '0/1'")
            conn.execute(next(s for s in SCHEMA if "ledgers_tip_moves_forward" in s))
        conn.close()

    def test_file_settings(self, store: Store) -> None:
        with sqlite3.connect(self.path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            types = {r[2] for t in ("ledgers", "records")
                     for r in conn.execute(f"PRAGMA table_info({t})")}
        conn.close()
        assert "REAL" not in types

    def test_a_lock_held_too_long_fails_closed(self) -> None:
        s = SQLiteStore(self.path, name="main", lock_timeout=0.3)
        s.initialize(META)
        blocker = sqlite3.connect(self.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StorageError, match="could not lock") as info:
                s.append(0, rec(0))
            assert not isinstance(info.value, LedgerConflictError)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert s.head() == 0
        s.close()

    def test_not_a_database_fails_closed(self, tmp_path: Path) -> None:
        junk = tmp_path / "junk.db"
        junk.write_bytes(b"this is not a database file at all" * 100)
        with pytest.raises(StorageError):
            SQLiteStore(junk).initialize(META)


class TestSQLiteStoreSyncCommit(TestSQLiteStore):
    """The whole contract again with ``commit="sync"`` (``synchronous=FULL``)."""

    @pytest.fixture
    def opener(self) -> Callable[[str], Store]:
        return lambda name: SQLiteStore(self.path, name=name, commit="sync")


class TestPostgresStore(DurableContract):
    @pytest.fixture(autouse=True)
    def _schema(self) -> Iterator[None]:
        for schema in pg_schema():
            self.schema = schema
            yield

    @pytest.fixture
    def opener(self) -> Callable[[str], Store]:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        return lambda name: PostgresStore(PG_URL, name=name, schema=self.schema)

    def url(self) -> str:
        return pg_url(self.schema)

    def db_error(self) -> type[Exception]:
        import psycopg

        return psycopg.Error

    def raw(self, sql: str, params: tuple[Any, ...] = (), replica: bool = False) -> None:
        import psycopg
        from storage_helpers import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            if replica:  # triggers do not fire in this session (a superuser's setting)
                conn.execute("SET session_replication_role = replica")
            query = sql.format(s=f'"{self.schema}".')
            conn.execute(query.replace("?", "%s") if params else query, params or None)

    def fetch(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg
        from storage_helpers import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            return conn.execute(sql.format(s=f'"{self.schema}".')).fetchall()

    def test_append_within_notices_a_chain_that_changed_under_it(
        self, opener: Callable[[str], Store], store: Store
    ) -> None:
        """As after a server crash that lost an asynchronous commit another writer read."""
        s = self.within(store)
        assert s.append_within(0, rec(0), None, Fraction(0), None).appended
        # The crash, simulated (in a session whose triggers do not fire, which leaves
        # the catalogs as they were): record 0 is gone, the ledger empty again.
        self.raw("DELETE FROM {s}records", replica=True)
        self.raw("UPDATE {s}ledgers SET head = 0, epsilon_sum = '0/1', "
                 "last_hash = repeat('0', 64)", replica=True)
        other = opener("main")
        other.append(0, rec(0, eps="1/3"))  # a different record 0 after "recovery"
        with pytest.raises(LedgerCorruptError, match="nothing was written"):
            s.append_within(1, rec(1), None, Fraction(0), None)
        other.append(1, rec(1, eps="1/5"))  # ... also when others appended after it
        with pytest.raises(LedgerCorruptError, match="nothing was written"):
            s.append_within(1, rec(1), None, Fraction(0), None)
        with pytest.raises(LedgerCorruptError, match="reopen"):
            s.read(1)  # catching up does not adopt the new chain either
        assert other.head() == 2
        fresh = opener("main")
        assert list(fresh.read()) == list(other.read())  # a reopened store is fine
        fresh.close()
        other.close()

    def test_a_schema_without_the_append_within_function_gets_it(self, store: Store) -> None:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        self.fill(store, 1)
        store.close()
        self.raw("DROP FUNCTION {s}dpaccount_append_within_v3")  # as an older dpaccount left it
        again = PostgresStore(PG_URL, name="main", schema=self.schema)
        again.initialize(META)
        assert again.append_within(1, rec(1), None, Fraction(0), None).appended
        assert again.verify().head == 2
        again.close()

    def test_a_schema_from_before_least_privilege_is_upgraded_on_open(self, store: Store
                                                                       ) -> None:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore
        from dpaccount.storage.postgres.functions import SIGNATURES
        from dpaccount.storage.postgres.schema import WITHIN_SIGNATURE

        self.fill(store, 2)
        store.close()
        # As dpaccount before issue 28 left a schema: no grants table, no row-level
        # security, no writer functions (the _v3 function is what its writers call).
        for table in ("ledgers", "records", "meta_history", "snapshots"):
            self.raw(f"DROP POLICY dpaccount_granted ON {{s}}{table}")
            self.raw(f"ALTER TABLE {{s}}{table} DISABLE ROW LEVEL SECURITY")
        self.raw("DROP TABLE {s}grants")
        for name, args in SIGNATURES.items():
            self.raw(f"DROP FUNCTION {{s}}{name}({args})")
        for _ in range(2):  # upgraded once; opening again changes nothing
            again = PostgresStore(PG_URL, name="main", schema=self.schema)
            assert again.initialize(META) == META
            assert again.append_within(again.head(), rec(again.head()), None, Fraction(0),
                                       None).appended
            again.close()
        assert self.fetch("SELECT count(*) FROM {s}grants") == [(0,)]
        assert self.fetch("SELECT count(*) FROM pg_policy WHERE polname = 'dpaccount_granted' "
                          "AND polrelid = '{s}records'::regclass") == [(1,)]
        assert self.fetch(  # the function older writers call is still there
            f"SELECT to_regprocedure('{{s}}{WITHIN_SIGNATURE}') IS NOT NULL") == [(True,)]
        assert store.verify().head == 4  # type: ignore[attr-defined]

    def test_a_schema_whose_sums_trigger_calls_an_older_function_is_upgraded(
        self, store: Store
    ) -> None:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore
        from dpaccount.storage.postgres.schema import SUMS_FUNCTION

        self.fill(store, 1)
        store.close()
        # As a schema made by an earlier dpaccount: its trigger calls the function's
        # previous version (here a stand-in that checks nothing), and the current one is
        # not there yet.
        self.raw("CREATE FUNCTION {s}dpaccount_sums_follow_records_v1() RETURNS trigger "
                 "LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
        self.raw("DROP TRIGGER ledgers_sums_follow_records ON {s}ledgers")
        self.raw(f"DROP FUNCTION {{s}}{SUMS_FUNCTION}")
        self.raw("CREATE CONSTRAINT TRIGGER ledgers_sums_follow_records AFTER UPDATE ON "
                 "{s}ledgers DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
                 "{s}dpaccount_sums_follow_records_v1()")
        again = PostgresStore(PG_URL, name="main", schema=self.schema)
        again.initialize(META)
        assert again.missing_protections() == []
        with pytest.raises(self.db_error(), match="forward"):  # the trigger checks again
            self.raw("UPDATE {s}ledgers SET head = head + 1, last_hash = repeat('a', 64)")
        again.append(1, rec(1))
        assert again.verify().head == 2
        again.close()

    def test_a_sums_trigger_pointed_at_another_function_is_reported(self, store: Store
                                                                     ) -> None:
        self.fill(store, 1)
        self.raw("CREATE FUNCTION {s}lenient() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN RETURN NULL; END $$")
        self.raw("DROP TRIGGER ledgers_sums_follow_records ON {s}ledgers")
        self.raw("CREATE CONSTRAINT TRIGGER ledgers_sums_follow_records AFTER UPDATE ON "
                 "{s}ledgers DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
                 "{s}lenient()")
        assert store.missing_protections() == [  # type: ignore[attr-defined]
            "ledgers_sums_follow_records"]

    def unprotect(self) -> None:
        self.raw("ALTER TABLE {s}records DISABLE TRIGGER USER")
        self.raw("ALTER TABLE {s}ledgers DISABLE TRIGGER USER")

    def reset_behind(self) -> None:  # the triggers do not fire in a replica session
        self.raw("UPDATE {s}ledgers SET epsilon_sum = '0/1'", replica=True)

    def test_truncate_is_refused(self, store: Store) -> None:
        import psycopg

        self.fill(store, 2)
        with pytest.raises(psycopg.Error, match="append-only"):
            self.raw("TRUNCATE {s}records")
        assert store.head() == 2

    @pytest.mark.parametrize("commit", ["group", "sync"])
    @pytest.mark.parametrize("locking", ["row", "serializable"])
    def test_other_locking_modes_pass_the_basics(self, locking: str, commit: str) -> None:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        s = PostgresStore(PG_URL, name="lk", schema=self.schema, locking=locking,  # type: ignore[arg-type]
                          commit=commit)  # type: ignore[arg-type]
        s.initialize(META.model_copy(update={"name": "lk"}))
        s.append(0, rec(0, query_id="a"))
        with pytest.raises(LedgerConflictError):
            s.append(0, rec(0))
        with pytest.raises(LedgerConflictError):
            s.append(1, rec(1, query_id="a"))
        s.append(1, rec(1))
        assert [r.seq for r in s.read()] == [0, 1]
        assert s.verify().head == 2
        s.close()


class TestPostgresStoreSyncCommit(TestPostgresStore):
    """The whole contract again with ``commit="sync"``."""

    @pytest.fixture
    def opener(self) -> Callable[[str], Store]:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        return lambda name: PostgresStore(PG_URL, name=name, schema=self.schema, commit="sync")


class TestPostgresGroupCommit:
    """What ``PostgresStore`` adds beyond the contract: commit modes, lost races."""

    @pytest.fixture(autouse=True)
    def _schema(self) -> Iterator[None]:
        for schema in pg_schema():
            self.schema = schema
            yield

    def test_unknown_commit_mode_is_a_config_error(self) -> None:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        with pytest.raises(ConfigError, match="commit mode"):
            PostgresStore(PG_URL, name="x", schema=self.schema, commit="later")  # type: ignore[arg-type]

    def test_a_lost_race_brings_back_the_winners_records(self) -> None:
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        a = PostgresStore(PG_URL, name="main", schema=self.schema)
        b = PostgresStore(PG_URL, name="main", schema=self.schema)
        a.initialize(META)
        b.initialize(META)
        b.append(0, rec(0))  # b now believes the head is 1
        a.read()
        a.append(1, rec(1, "1/5", query_id="a1"))
        with pytest.raises(LedgerConflictError):
            b.append(1, rec(1, "1/3"))  # stale: loses the compare-and-append
        assert b.head() == 2
        winners = b.read(1)
        assert [(r.seq, r.query_id, r.cost.epsilon) for r in winners] == [
            (1, "a1", Fraction(1, 5))
        ]
        b.append(2, rec(2, "1/3"))  # folded in: the retry goes through
        tip = a.verify()
        assert tip.head == 3
        assert tip.epsilon_sum == Fraction(1, 10) + Fraction(1, 5) + Fraction(1, 3)
        a.close()
        b.close()

    def test_group_commit_barrier_flushes_an_earlier_asynchronous_commit(self) -> None:
        """The facts the ``group`` commit mode rests on, checked on the live server.

        An asynchronous commit is visible to other sessions at once; the store's barrier
        (a synchronous transaction writing one WAL record) returns only once the WAL is
        flushed past a point taken right after that asynchronous commit.
        """
        import psycopg
        from storage_helpers import PG_URL

        from dpaccount.storage.postgres import PostgresStore

        store = PostgresStore(PG_URL, name="main", schema=self.schema)
        assert store.commit == "group"  # the default
        store.initialize(META)
        store.append(0, rec(0))
        last = store.read()[-1]
        s = f'"{self.schema}"'
        with psycopg.connect(PG_URL, autocommit=True) as conn, \
                psycopg.connect(PG_URL, autocommit=True) as other:
            conn.execute(f"CREATE TABLE {s}.scratch (n integer)")
            for n in range(20):
                conn.execute("BEGIN")
                conn.execute("SET LOCAL synchronous_commit = off")
                conn.execute(f"INSERT INTO {s}.scratch VALUES (%s)", (n,))
                conn.execute("COMMIT")
                after_commit = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
                assert after_commit is not None
                seen = other.execute(f"SELECT count(*) FROM {s}.scratch").fetchone()
                assert seen is not None and seen[0] == n + 1  # visible before any flush
                params = {"name": store.name, "seq": last.seq,
                          "hash": self._hash_of(conn, s, last.seq)}
                conn.execute("BEGIN")
                wrote = conn.execute(store._sql_barrier, params).fetchall()
                conn.execute("COMMIT")
                assert len(wrote) == 1  # the barrier wrote its WAL record
                flushed = conn.execute(
                    "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (after_commit[0],)
                ).fetchone()
                assert flushed is not None and flushed[0] is True
        store.close()

    @staticmethod
    def _hash_of(conn: Any, s: str, seq: int) -> str:
        row = conn.execute(
            f"SELECT hash FROM {s}.records WHERE ledger = 'main' AND seq = %s", (seq,)
        ).fetchone()
        assert row is not None
        return str(row[0])


