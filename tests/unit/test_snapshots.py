"""Opening in O(records since the latest snapshot) (issue: ledgers for a data platform,
item 1): exact rule-state snapshots, checked incrementally on open and fully by
``dpaccount ledger verify``."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import PG_URL

from dpaccount import Budget, GaussianCharge, LaplaceCharge, PrivacyCost, open_ledger
from dpaccount.accountant import SNAPSHOT_EVERY
from dpaccount.composition import make_rule
from dpaccount.composition.states import decode_state, encode_state
from dpaccount.errors import LedgerCorruptError
from dpaccount.keys import LedgerKey
from dpaccount.ledger_cli import ledger_main
from dpaccount.storage._chain import snapshot_link


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    for field in attrs.fields(type(a)):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            if x.tolist() != y.tolist():
                return False
        elif x != y:
            return False
    return True


COSTS = st.builds(PrivacyCost, st.fractions(0, 2, max_denominator=10**6),
                  st.sampled_from([0, "1e-9", "1e-8"]))
GAUSSIANS = st.builds(lambda s: GaussianCharge(sigma=s, sensitivity=1, epsilon=1),
                      st.integers(2, 50))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["basic", "filter", "rdp", "gdp", "advanced"]), st.data())
def test_every_rule_state_survives_encoding_exactly(rule_name: str, data: Any) -> None:
    budget = Budget(50, "1e-5")
    options: dict[str, Any] = {"budget": budget}
    charges = data.draw(st.lists(GAUSSIANS if rule_name in ("gdp", "rdp") else COSTS,
                                 max_size=12))
    if rule_name == "advanced":
        options["plan"] = (PrivacyCost(2, "1e-8"), 20)
    rule = make_rule(rule_name, **options)
    state = rule.start()
    for charge in charges:
        state = rule.extend(state, charge)
    text = encode_state(state)
    assert text is not None
    back = decode_state(text)
    assert _same(back, state)
    assert rule.total(back) == rule.total(state)
    assert encode_state(back) == text


def test_only_the_listed_state_classes_are_encoded_and_read_back() -> None:
    from dpaccount.composition.basic import BasicState

    @attrs.frozen
    class BasicState2(BasicState):  # same fields, not a listed class
        pass

    assert encode_state(BasicState2(Fraction(1), Fraction(0))) is None
    text = encode_state(BasicState(Fraction(1, 3), Fraction(0)))
    assert text is not None
    for kind in ("os", "BasicState", "", 7, None):
        with pytest.raises(LedgerCorruptError, match="cannot be read"):
            decode_state(text.replace('"basic"', json.dumps(kind)))


def test_snapshotting_a_basic_ledger_loads_no_other_engine(tmp_path: Path) -> None:
    # Encoding a state used to import every state's module, the PLD engine and
    # scipy.fft with it: about 90 ms inside the charge that wrote the snapshot.
    url = f"sqlite:///{tmp_path / 'l.db'}"
    code = (
        "import sys\n"
        "from dpaccount import Budget, PrivacyCost, open_ledger\n"
        f"acct = open_ledger({url!r}, name='L', budget=Budget(10))\n"
        "for _ in range(20):\n"
        "    acct.charge(PrivacyCost('0.001'))\n"
        "acct.close()\n"
        "print(sorted(m for m in ('dpaccount.accounting.pld', 'dpaccount.accounting.rdp',\n"
        "                         'scipy.fft') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]"
    with open_ledger(url, name="L", budget=Budget(10)) as again:
        assert again.spent == PrivacyCost("0.02")  # and the snapshot it wrote reads back
        assert again.store.snapshot is not None  # type: ignore[attr-defined]


STEP = GaussianCharge(sigma=40, sensitivity=1, epsilon=1)


def _fill(url: str, n: int, rule: str = "rdp", key: LedgerKey | None = None) -> PrivacyCost:
    with open_ledger(url, name="L", budget=Budget(100, "1e-5"), rule=rule, key=key) as acct:
        for _ in range(n):
            acct.charge(STEP if rule == "rdp" else PrivacyCost("0.01"))
        return acct.spent


def test_reopening_reads_only_the_records_since_the_latest_snapshot(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spent = _fill(url, SNAPSHOT_EVERY + 40)
    with open_ledger(url, name="L") as acct:
        snaps = acct.store.snapshots()  # type: ignore[attr-defined]
        assert [s.tip.head for s in snaps] == [SNAPSHOT_EVERY, SNAPSHOT_EVERY + 40]  # +close
        acct.charge(STEP)
        acct.charge(STEP)
    replayed = make_replay(url)
    starts: list[int] = []
    from dpaccount.storage import postgres, sqlite

    for cls in (sqlite.SQLiteStore, postgres.PostgresStore):
        original = cls.read

        def spy(self: Any, start: int = 0, original: Any = original) -> Any:
            starts.append(start)
            return original(self, start)

        monkeypatch.setattr(cls, "read", spy)
    with open_ledger(url, name="L") as again:
        assert again.spent == replayed  # the resumed state is the replayed one
        assert spent.epsilon < again.spent.epsilon
    assert starts and min(starts) == SNAPSHOT_EVERY + 40  # never from record 0


def make_replay(url: str) -> PrivacyCost:
    """The spend by replaying every record from the first (a second method)."""
    with open_ledger(url, name="L", read_only=True, verify="full") as acct:
        rule = make_rule("rdp", budget=Budget(100, "1e-5"))
        state = rule.start()
        for record in acct.store.read(0):
            state = rule.extend(state, record.charge)
        return rule.total(state)


def test_a_snapshot_under_other_settings_is_not_resumed(sqlite_url: str) -> None:
    _fill(sqlite_url, SNAPSHOT_EVERY, rule="basic")
    with open_ledger(sqlite_url, name="L", budget=Budget(100, "1e-5"), rule="filter",
                     migrate=True) as acct:
        assert acct.rule.name == "filter"
        state = acct._state  # type: ignore[attr-defined]
        rule = make_rule("filter", budget=Budget(100, "1e-5"))
        replay = rule.start()
        for _ in range(SNAPSHOT_EVERY):
            replay = rule.extend(replay, PrivacyCost("0.01"))
        assert _same(state, replay)


def _edit_snapshot(url: str, state: str, relink: bool) -> None:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER IF EXISTS snapshots_append_only_update")
        row = conn.execute("SELECT head, last_hash, epsilon_sum, delta_sum, settings FROM "
                           "snapshots ORDER BY head DESC LIMIT 1").fetchone()
        conn.execute("UPDATE snapshots SET state = ? WHERE head = ?", (state, row[0]))
        if relink:
            from dpaccount.storage._sql import LedgerTip, parse_frac

            tip = LedgerTip(row[0], row[1], parse_frac(row[2], "e"), parse_frac(row[3], "d"))
            conn.execute("UPDATE snapshots SET hash = ? WHERE head = ?",
                         (snapshot_link(tip, row[4], state, None), row[0]))
        from dpaccount.storage.sqlite.schema import SCHEMA

        conn.execute(next(s for s in SCHEMA if "snapshots_append_only_update" in s)
                     )  # covering the tracks: the trigger as dpaccount wrote it
    conn.close()


def test_a_forged_snapshot_state(sqlite_url: str, tmp_path: Path) -> None:
    _fill(sqlite_url, SNAPSHOT_EVERY, rule="basic")
    zero = encode_state(make_rule("basic").start())
    assert zero is not None
    _edit_snapshot(sqlite_url, zero, relink=False)
    with pytest.raises(LedgerCorruptError, match="snapshot at record 256 was altered"):
        open_ledger(sqlite_url, name="L")
    _edit_snapshot(sqlite_url, zero, relink=True)  # a consistent forgery, without a key
    with open_ledger(sqlite_url, name="L") as fooled:  # opening trusts it (documented) ...
        assert fooled.spent == PrivacyCost(0)
    out = io.StringIO()  # ... the full verification replays the rule and refuses it
    assert ledger_main(["ledger", "verify", sqlite_url, "--name", "L"], out=out) == 1
    assert "holds a rule state that its records do not give" in out.getvalue()
    with open_ledger(sqlite_url, name="L", verify="full") as careful:
        assert careful.spent == PrivacyCost(SNAPSHOT_EVERY * PrivacyCost("0.01").epsilon)


def test_a_keyed_snapshot_cannot_be_forged(sqlite_url: str) -> None:
    key = LedgerKey.from_hex("42" * 32)
    _fill(sqlite_url, SNAPSHOT_EVERY, rule="basic", key=key)
    zero = encode_state(make_rule("basic").start())
    assert zero is not None
    _edit_snapshot(sqlite_url, zero, relink=True)  # relinked with SHA-256: no key
    with pytest.raises(LedgerCorruptError, match="altered"):
        open_ledger(sqlite_url, name="L", key=key)


def test_a_truncation_below_the_snapshot_is_refused(url: str) -> None:
    _fill(url, SNAPSHOT_EVERY + 5, rule="basic")
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DROP TRIGGER records_append_only_delete")
            conn.execute("DELETE FROM records WHERE seq >= 100")
        conn.close()
    else:
        import psycopg

        schema = url.split("schema=")[1]
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{schema}".records DISABLE TRIGGER USER')
            conn.execute(f'DELETE FROM "{schema}".records WHERE seq >= 100')
    with pytest.raises(LedgerCorruptError):
        open_ledger(url, name="L")


def test_ledger_verify_checks_every_snapshot_state(url: str) -> None:
    _fill(url, SNAPSHOT_EVERY + 20)
    out = io.StringIO()
    assert ledger_main(["ledger", "verify", url, "--name", "L"], out=out) == 0
    with open_ledger(url, name="L", read_only=True) as acct:
        states = [s.state for s in acct.store.snapshots()]  # type: ignore[attr-defined]
    assert len(states) == 2 and all(json.loads(s)["kind"] == "rdp" for s in states)


@pytest.mark.parametrize("chunk", [7, 16])
def test_full_verification_streams_the_records_in_chunks(
    url: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stores read the records for ``verify`` in chunks of `VERIFY_CHUNK` (16 puts a
    snapshot head on a chunk boundary, 7 inside a chunk); an altered record in a later
    chunk is still named."""
    from dpaccount.storage.postgres import store as pg_store
    from dpaccount.storage.sqlite import store as sqlite_store

    for module in (sqlite_store, pg_store):
        monkeypatch.setattr(module, "VERIFY_CHUNK", chunk)
    _fill(url, SNAPSHOT_EVERY + 20, rule="basic")
    with open_ledger(url, name="L", read_only=True) as acct:
        assert acct.store.verify().head == SNAPSHOT_EVERY + 20  # type: ignore[attr-defined]
    _alter_record(url, SNAPSHOT_EVERY + 3)
    with open_ledger(url, name="L", read_only=True, verify="recent") as acct, \
            pytest.raises(LedgerCorruptError) as info:
        acct.store.verify()  # type: ignore[attr-defined]
    assert info.value.seq == SNAPSHOT_EVERY + 3


def _alter_record(url: str, seq: int) -> None:
    """Edit one record's payload in place, its stored links left as they were."""
    edit = "UPDATE {}records SET payload = replace(payload, '\"basic\"', '\"Basic\"') "
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DROP TRIGGER records_append_only_update")
            conn.execute(edit.format("") + "WHERE seq = ?", (seq,))
        conn.close()
    else:
        import psycopg

        schema = f'"{url.split("schema=")[1]}".'
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {schema}records DISABLE TRIGGER USER")
            conn.execute(edit.format(schema) + "WHERE seq = %s", (seq,))
            conn.execute(f"ALTER TABLE {schema}records ENABLE TRIGGER USER")


def test_a_laplace_ledger_under_pld_resumes_too(sqlite_url: str) -> None:
    plan = (LaplaceCharge(scale=200, sensitivity=1), 400)
    with open_ledger(sqlite_url, name="P", budget=Budget(5, "1e-6"), rule="pld",
                     plan=plan) as acct:
        for _ in range(SNAPSHOT_EVERY + 1):
            acct.charge(LaplaceCharge(scale=200, sensitivity=1))
        spent = acct.spent
    with open_ledger(sqlite_url, name="P", rule="pld", plan=plan) as again:
        assert again._head == SNAPSHOT_EVERY + 1  # type: ignore[attr-defined]
        assert again.spent == spent


def test_a_file_from_before_snapshots_opens_read_only_and_upgrades_for_writing(
    sqlite_url: str,
) -> None:
    _fill(sqlite_url, 20, rule="basic")
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:  # as dpaccount with tables version 2 left it
        for trigger in ("snapshots_append_only_update", "snapshots_append_only_delete"):
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute("DROP TABLE snapshots")
        conn.execute("PRAGMA user_version = 2")
    conn.close()
    with open_ledger(sqlite_url, name="L", read_only=True) as dashboard:
        assert len(dashboard.records) == 20
    with open_ledger(sqlite_url, name="L") as writer:  # upgrades: snapshots come back
        assert writer.store.snapshots() == []  # type: ignore[attr-defined]
        assert writer.spent == PrivacyCost("0.2")


def test_a_retried_full_verification_collects_each_record_once(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`verify(collect)` hands over the records only once the check passed: a read that
    SQLite reports busy half-way and retries does not add the first chunks twice."""
    from dpaccount.storage.sqlite import store as sqlite_store

    monkeypatch.setattr(sqlite_store, "VERIFY_CHUNK", 5)
    _fill(sqlite_url, 23, rule="basic")
    real, calls = sqlite_store.check_ledger, []

    def busy_once(chunks: Any, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:  # the first attempt reads two chunks, then the file is busy
            sink = args[3]  # (cached, snapshots, key, sink, progress)
            for _, chunk in zip(range(2), chunks, strict=False):
                sink([object()] * len(chunk))
            raise sqlite3.OperationalError("database is locked")
        real(chunks, *args)

    monkeypatch.setattr(sqlite_store, "check_ledger", busy_once)
    collected: list[Any] = []
    with open_ledger(sqlite_url, name="L", read_only=True) as acct:
        acct.store.verify(collected)  # type: ignore[attr-defined]
    assert len(calls) == 2
    assert [r.seq for r in collected] == list(range(23))
