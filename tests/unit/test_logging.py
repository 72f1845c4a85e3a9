"""Logging by the library convention (issue 29, item 1): a NullHandler on ``dpaccount``,
child loggers per module, one INFO record per admitted charge and one WARNING record per
refusal with the numbers in the message and as ``dp_*`` attributes, storage retries at
DEBUG, and nothing un-noised (nor any credential) in any record."""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpaccount
from dpaccount import (
    Accountant,
    Budget,
    BudgetExceededError,
    DuplicateQueryError,
    GaussianCharge,
    LaplaceMechanism,
    PrivacyCost,
    open_ledger,
)
from dpaccount.accountant.logs import FIELDS
from dpaccount.budgets import sub_budget
from dpaccount.costs import format_bound

#: The attributes every LogRecord has (ours must never clash with them).
_PLAIN = set(vars(logging.LogRecord("n", logging.INFO, "p", 1, "m", None, None)))


class _Collect(logging.Handler):
    """Keeps every record that reaches the ``dpaccount`` logger (and formats it, so that
    exc_text is filled in as a real handler would)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def collected() -> Iterator[_Collect]:
    logger = logging.getLogger("dpaccount")
    handler, level = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _charges(handler: _Collect, event: str | None = None) -> list[logging.LogRecord]:
    return [r for r in handler.records
            if getattr(r, "dp_event", None) is not None
            and (event is None or r.dp_event == event)]


# -- the convention ------------------------------------------------------------------------


def test_the_package_installs_a_null_handler_and_configures_nothing_else() -> None:
    logger = logging.getLogger("dpaccount")
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]
    assert logger.level == logging.NOTSET and logger.propagate
    for name in ("dpaccount.accountant.core", "dpaccount.accountant.joint",
                 "dpaccount.guard", "dpaccount.storage.sqlite.session"):
        child = logging.getLogger(name)
        assert child.handlers == [] and child.level == logging.NOTSET, name


def test_field_names_never_clash_with_logrecord_attributes() -> None:
    assert all(name.startswith("dp_") for name in FIELDS)
    assert not set(FIELDS) & _PLAIN


# -- one record per charge -------------------------------------------------------------------


def test_an_admitted_charge_is_one_info_record_with_its_numbers(collected: _Collect) -> None:
    acct = Accountant(Budget(1, "1e-6"), name="nightly")
    acct.charge(PrivacyCost("0.25"), label="count", query_id="q-1")
    acct.charge(PrivacyCost("0.5", "1e-7"), label="sum", query_id="q-2")
    records = _charges(collected)
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    last = records[-1]
    assert last.name == "dpaccount.accountant.core"
    assert (last.dp_event, last.dp_ledger, last.dp_label, last.dp_query_id, last.dp_seq,
            last.dp_rule) == ("charge_admitted", "nightly", "sum", "q-2", 1, "basic")
    # basic composition: exact sums (Dwork and Roth 2014, Thm 3.16); remaining = budget - spent
    assert (last.dp_epsilon, last.dp_delta) == (0.5, float_up("1e-7"))
    assert last.dp_spent_epsilon == 0.75 and last.dp_remaining_epsilon == 0.25
    assert Fraction(last.dp_spent_delta) >= Fraction(1, 10**7)
    assert Fraction(last.dp_remaining_delta) <= Fraction(9, 10**7)
    assert (last.dp_budget_epsilon, last.dp_ledgers) == (1.0, ["nightly"])
    message = last.getMessage()
    for part in ("'nightly'", "seq 1", "'sum'", "'q-2'", "cost (ε=0.5, δ=1e-07)",
                 "spent (ε=0.75, δ=1e-07)", "remaining (ε=0.25, δ=9e-07)"):
        assert part in message, (part, message)


def float_up(text: str) -> float:
    """The smallest float >= the decimal ``text`` (computed here, not by the library)."""
    exact = Fraction(text)
    value = float(exact)
    return value if Fraction(value) >= exact else math.nextafter(value, math.inf)


def test_a_refusal_is_one_warning_and_the_ledger_is_unchanged(collected: _Collect) -> None:
    acct = Accountant(1, name="nightly")
    acct.charge(PrivacyCost("0.75"), label="count")
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost("0.5"), label="sum", query_id="q-9")
    assert len(acct.records) == 1
    refused = _charges(collected, "charge_refused")
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING
    r = refused[0]
    assert (r.dp_ledger, r.dp_refused_by, r.dp_label, r.dp_query_id) == (
        "nightly", "nightly", "sum", "q-9")
    assert (r.dp_epsilon, r.dp_spent_epsilon, r.dp_remaining_epsilon) == (0.5, 0.75, 0.25)
    assert "would be (ε=1.25, δ=0)" in r.getMessage()
    assert "nothing was recorded" in r.getMessage()


def test_a_repeated_query_id_is_a_warning(collected: _Collect) -> None:
    acct = Accountant(1, name="nightly")
    acct.charge(PrivacyCost("0.25"), query_id="daily/2026-11-26")
    with pytest.raises(DuplicateQueryError):
        acct.charge(PrivacyCost("0.25"), query_id="daily/2026-11-26", label="again")
    (dup,) = _charges(collected, "duplicate_query")
    assert dup.levelno == logging.WARNING
    assert (dup.dp_query_id, dup.dp_seq, dup.dp_label) == ("daily/2026-11-26", 0, "again")


def test_a_share_charge_is_one_record_naming_every_ledger(collected: _Collect) -> None:
    parent = Accountant(1, name="census")
    share = sub_budget(parent, "team-a", "0.75")
    share.charge(PrivacyCost("0.5"), label="count")
    (admitted,) = _charges(collected, "charge_admitted")
    assert admitted.name == "dpaccount.accountant.joint"
    assert (admitted.dp_ledger, admitted.dp_ledgers) == ("team-a", ["team-a", "census"])
    assert admitted.dp_remaining_epsilon == 0.25  # the share's: 0.75 - 0.5
    other = sub_budget(parent, "team-b", 1)
    with pytest.raises(BudgetExceededError):
        other.charge(PrivacyCost("0.75"))  # the share fits, the parent (0.5 left) refuses
    (refused,) = _charges(collected, "charge_refused")
    assert (refused.dp_ledger, refused.dp_refused_by) == ("team-b", "census")
    assert refused.dp_remaining_epsilon == 0.5 and "'census' said no" in refused.getMessage()


def test_a_zcdp_ledger_states_rho(collected: _Collect) -> None:
    acct = Accountant(Budget(rho="0.5", delta="1e-6"), rule="zcdp", name="zc")
    acct.charge(GaussianCharge(sigma=2, sensitivity=1, epsilon=1))  # rho = 1/8 (B-S 2016, Prop 1.6)
    (r,) = _charges(collected, "charge_admitted")
    assert (r.dp_rho, r.dp_spent_rho, r.dp_budget_rho, r.dp_remaining_rho) == (
        0.125, 0.125, 0.5, 0.375)
    assert "ρ=0.125, spent ρ=0.125, remaining ρ=0.375" in r.getMessage()


def test_nothing_is_built_when_info_is_off(caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import dpaccount.accountant.core as core

    def boom(*_args: Any) -> None:
        raise AssertionError("log_admitted ran with INFO off")

    monkeypatch.setattr(core, "log_admitted", boom)
    caplog.set_level(logging.WARNING, logger="dpaccount")
    Accountant(1).charge(PrivacyCost("0.5"))  # no INFO listener: no record, no fields


@given(st.fractions(min_value=0, max_value=10**6), st.booleans())
def test_the_message_numbers_are_those_the_library_prints(value: Fraction,
                                                           upward: bool) -> None:
    from dpaccount.accountant.logs import _down, _shown, _up

    # the message's fast formatter against format_bound (PrivacyCost and Budget's str)
    text, exact = format_bound(value, upward=upward)
    assert _shown("ε", value, upward) == (
        f"ε={text}" if exact else f"ε{'≤' if upward else '≥'}{text}")
    # the fields' directed floats against Fraction comparisons
    assert Fraction(_up(value)) >= value and Fraction(_down(value)) <= value
    assert _up(value) in (_down(value), math.nextafter(_down(value), math.inf))


# -- storage retries at DEBUG -----------------------------------------------------------------


def test_a_lost_race_is_a_debug_record(tmp_path: Path, collected: _Collect) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with open_ledger(url, name="race", budget=(1, "1e-5"), rule="filter") as a, \
            open_ledger(url, name="race") as b:
        b.charge(PrivacyCost("0.01"))
        a.charge(PrivacyCost("0.01"))  # decided on a stale head: loses, then decides again
        assert len(a.records) == 2
    lost = [r for r in collected.records if r.levelno == logging.DEBUG
            and r.name == "dpaccount.accountant.ledger"]
    assert lost and "another writer appended first" in lost[0].getMessage()


def test_a_sqlite_lock_wait_is_a_debug_record(tmp_path: Path, collected: _Collect) -> None:
    path = tmp_path / "l.db"
    with open_ledger(f"sqlite:///{path}?lock_timeout=20", name="busy", budget=1) as acct:
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        done = threading.Event()

        def release() -> None:
            time.sleep(0.3)
            blocker.execute("ROLLBACK")
            done.set()

        threading.Thread(target=release).start()
        acct.charge(PrivacyCost("0.1"))
        done.wait(10)
        blocker.close()
    waits = [r.getMessage() for r in collected.records
             if r.levelno == logging.DEBUG and r.name.startswith("dpaccount.storage.sqlite")]
    assert any("locked by another connection" in m for m in waits), waits
    assert any("went through after" in m for m in waits), waits


# -- nothing secret in any record -------------------------------------------------------------

CANARY_KEY = "canary-key-6e1f0b"
CANARY_VALUE = 987654.123456
CANARY_TEXTS = (CANARY_KEY, "987654.123456", "987654")
PASSWORD = "hunter2-Zq9"


def _every_text(record: logging.LogRecord, line: str) -> list[str]:
    texts = [record.getMessage(), repr(record.args), str(record.msg), line,
             str(record.exc_text or "")]
    texts += [repr(v) for k, v in vars(record).items() if k not in _PLAIN]
    return texts


def test_no_unnoised_value_or_credential_in_any_record(tmp_path: Path,
                                                       collected: _Collect) -> None:
    pd = pytest.importorskip("pandas")
    from dpaccount import aggregates as agg

    frame = pd.DataFrame({"region": ["north", CANARY_KEY, "north"],
                          "income": [CANARY_VALUE, CANARY_VALUE, 1.0]})
    with open_ledger(f"sqlite:///{tmp_path / 'l.db'}", name="canary", budget=(3, "1e-6")) as acct:
        # a pandas group-by with declared keys, and with private key selection
        agg.groupby(frame, "region", keys=["north"]).sum("income", acct, "0.25", lower=0,
                                                         upper=10**6)
        agg.groupby(frame, "region").count(acct, "0.25", delta="1e-7")
        # a scalar aggregate and a guarded scalar query
        agg.sum(frame["income"], acct, "0.25", lower=0, upper=10**6, query_id="s-1")

        @acct.guard(LaplaceMechanism(epsilon="0.25", sensitivity=1), query_id="g-1")
        def total(rows: Any) -> float:
            return float(rows["income"].sum())

        total(frame)
        with pytest.raises(DuplicateQueryError):
            total(frame)
        # a refused query, and a query that fails after its charge
        with pytest.raises(BudgetExceededError):
            acct.run(LaplaceMechanism(epsilon=10, sensitivity=1), len, frame)

        def failing(rows: Any) -> float:
            raise ValueError(f"bad row {CANARY_KEY} with {CANARY_VALUE}")

        with pytest.raises(ValueError, match=CANARY_KEY):
            acct.run(LaplaceMechanism(epsilon="0.25", sensitivity=1), failing, frame)
    events = {getattr(r, "dp_event", None) for r in collected.records}
    assert {"charge_admitted", "charge_refused", "duplicate_query", "query_failed"} <= events
    (failed,) = _charges(collected, "query_failed")
    assert failed.dp_error == "ValueError" and failed.exc_info is None
    for record, line in zip(collected.records, collected.lines, strict=True):
        for text in _every_text(record, line):
            for secret in CANARY_TEXTS:
                assert secret not in text, (secret, record.name, text)


def test_text_the_caller_gave_goes_through_the_one_redaction(collected: _Collect) -> None:
    acct = Accountant(1, name="jobs")
    leaky = f"copy of postgresql://etl:{PASSWORD}@db.internal/warehouse"
    acct.charge(PrivacyCost("0.5"), label=leaky, query_id=f"password={PASSWORD}")
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost(1), label=leaky)
    records = _charges(collected)
    assert [r.dp_event for r in records] == ["charge_admitted", "charge_refused"]
    assert records[0].dp_label == "copy of postgresql://etl:***@db.internal/warehouse"
    for record, line in zip(collected.records, collected.lines, strict=True):
        assert all(PASSWORD not in text for text in _every_text(record, line))


def test_no_credential_in_any_record(collected: _Collect) -> None:
    from tests.storage_helpers import drop_schema, need_postgres, new_schema

    need_postgres()
    schema = new_schema()
    url = (f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?schema={schema}"
           f"&lock_timeout=5")
    try:
        with open_ledger(url, name="pg", budget=1) as acct:
            acct.charge(PrivacyCost("0.5"), query_id="p-1")
            with pytest.raises(BudgetExceededError):
                acct.charge(PrivacyCost(1))
            with pytest.raises(DuplicateQueryError):
                acct.charge(PrivacyCost("0.1"), query_id="p-1")
            acct.store.close()  # the next read reconnects (a DEBUG record)
            assert len(acct.records) == 1
    finally:
        drop_schema(schema)
    assert len(_charges(collected)) == 3
    for record, line in zip(collected.records, collected.lines, strict=True):
        assert all(PASSWORD not in text for text in _every_text(record, line)), record.name


def test_the_package_logger_reaches_the_root_when_the_application_configures_it(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    dpaccount.Accountant(1, name="root-test").charge(PrivacyCost("0.5"))
    assert any(getattr(r, "dp_ledger", None) == "root-test" for r in caplog.records)
