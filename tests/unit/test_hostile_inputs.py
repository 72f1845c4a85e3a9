"""Typed errors everywhere (issue 28, item 5): ledger names, nesting depth, hostile frames.

Each finding of the hostile review, and what holds it:

* ledger names are checked like labels (`dpaccount.records.check_ledger_name`) on every
  backend and every way a name comes in, before anything is created; a stored name that
  breaks the rule is `LedgerCorruptError`;
* a charge tree nested deeper than `dpaccount.charges.MAX_NESTING` is refused with
  `InvalidCostError` when it is built, when it enters a ledger (one forged past its
  constructors) and when a stored one is read back (`LedgerCorruptError`), never with
  `RecursionError`;
* a frame whose schema cannot be read is refused with a typed error before anything is
  charged; what only the values can show (unhashable values in an ``object`` column) is a
  typed error after the charge, which is kept.
"""

from __future__ import annotations

import io
import itertools
import json
import sqlite3
import tempfile
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from charge_strategies import atoms as leaf_charges
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import PG_URL

from dpaccount import Accountant, Budget, PrivacyCost, aggregates, open_ledger
from dpaccount.budgets import BlockLedgers, sub_budget
from dpaccount.charges import (
    MAX_NESTING,
    MAX_PARTS,
    Parallel,
    Repeated,
    Subsampled,
    atoms,
    check_relations,
    cost_of,
    describe,
)
from dpaccount.composition.states import decode_state
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DPAccountError,
    InvalidCostError,
    LedgerCorruptError,
    UnsupportedChargeError,
)
from dpaccount.ledger_cli import ledger_main
from dpaccount.ledgers import open_store
from dpaccount.mechanisms._sampling import RandomSource
from dpaccount.records import (
    MAX_NAME_LENGTH,
    LedgerMeta,
    check_ledger_name,
    decode_record,
    encode_record,
)

CANARY = 31337.5  # a data value: it must never appear in an error
CANARY_TEXT = "CANARY-5e2a"


def _clean(exc: BaseException) -> None:
    """No data value in the error, its arguments or its chained errors."""
    current: BaseException | None = exc
    while current is not None:
        text = f"{current}{current.args!r}"
        assert "31337" not in text and CANARY_TEXT not in text, text[:200]
        current = current.__cause__ or current.__context__


# =======================================================================================
# Ledger names
# =======================================================================================


def expected_valid(name: str) -> bool:
    """The rule, restated from docs/ledgers.md with the Unicode categories themselves
    (`str.isprintable` is False exactly for "Other" and "Separator" characters but the
    ASCII space): 1 to 200 characters, printable, NFC, and each '/'-part non-empty,
    without edge spaces and not only dots."""
    if not 1 <= len(name) <= 200:
        return False
    if any(ch != " " and unicodedata.category(ch)[0] in "CZ" for ch in name):
        return False
    if unicodedata.normalize("NFC", name) != name:
        return False
    return all(
        part and part[0] != " " and part[-1] != " " and set(part) != {"."}
        for part in name.split("/")
    )


BAD_NAMES = [
    "\ud800",  # a lone surrogate (was an untyped pydantic error)
    "a\x00b",  # NUL (PostgreSQL cannot store it; SQLite did)
    "\x1b[31mred",  # a terminal escape (forged lines in `ledger list`)
    "x" * 5000,  # 5,000 characters (was accepted on SQLite)
    "x" * (MAX_NAME_LENGTH + 1),
    "",
    " census",
    "census ",
    "census/ team",
    ".",
    "..",
    "census/..",
    "/census",
    "census/",
    "census//team",
    "line\nbreak",
    "tab\there",
    "nbsp\u00a0x",
    "zero\u200bwidth",
    "e\u0301",  # é decomposed (NFD): the same text as "é" would name another ledger
    5,
    b"census",
    None,
]
GOOD_NAMES = ["census", "census/team-a", "events/2026-11-24", "a b", "é", "Ωmega", "v1.2",
              "x" * MAX_NAME_LENGTH, ".hidden", "a..b"]


def _ids(value: object) -> str:
    return ascii(value)[:24]


@pytest.mark.parametrize("name", BAD_NAMES, ids=_ids)
def test_the_rule_refuses_what_the_review_found(name: Any) -> None:
    assert not (isinstance(name, str) and expected_valid(name))
    with pytest.raises(ConfigError):
        check_ledger_name(name)


@pytest.mark.parametrize("name", GOOD_NAMES, ids=_ids)
def test_the_rule_takes_ordinary_names(name: str) -> None:
    assert expected_valid(name)
    assert check_ledger_name(name) == name


def _entries(url: str) -> dict[str, Callable[[Any], Any]]:
    """Every way a ledger name comes in, for one database URL."""
    return {
        "Accountant(name=)": lambda n: Accountant(1, name=n),
        "open_ledger(name=)": lambda n: open_ledger(url, name=n, budget=1),
        "open_ledger(parent=)": lambda n: open_ledger(url, name="child", budget=1, parent=n),
        "open_store(name=)": lambda n: open_store(url, name=n),
        "sub_budget(name)": lambda n: sub_budget(Accountant(1, name="root"), n, 1),
        "BlockLedgers(stream)": lambda n: BlockLedgers(url, n, budget_per_block=1),
        "BlockLedgers.ledger(block)": lambda n: BlockLedgers(
            url, "events", budget_per_block=1).ledger(n),
    }


@pytest.mark.parametrize(("entry", "name"), [
    (entry, name) for entry in _entries("memory://") for name in BAD_NAMES
    if not (name is None and "parent" in entry)  # parent=None: no parent
], ids=lambda v: v if isinstance(v, str) and "(" in v else _ids(v))
def test_bad_names_are_config_errors_and_no_sqlite_file_is_made(
    tmp_path: Path, entry: str, name: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'ledgers.db'}"
    with pytest.raises(ConfigError):
        _entries(url)[entry](name)
    assert list(tmp_path.iterdir()) == []  # no file, no WAL, no writers' gate


def _schema_exists(schema: str) -> bool:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM information_schema.schemata "
                           "WHERE schema_name = %s", (schema,)).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("name", ["\ud800", "a\x00b", "\x1b[2J", "x" * 5000, "..", " a"],
                         ids=_ids)
def test_bad_names_are_config_errors_and_nothing_is_made_on_postgres(pg_url: str,
                                                                     name: str) -> None:
    schema = pg_url.rsplit("schema=", 1)[1]
    for entry, call in _entries(pg_url).items():
        with pytest.raises(ConfigError):
            call(name)
        assert not _schema_exists(schema), entry  # no schema, table or row was created


def test_a_block_name_cannot_reach_another_stream(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'blocks.db'}"
    with BlockLedgers(url, "events", budget_per_block=1) as blocks:
        for block in ["2026/11/24", ["2026-11-24"], "..", " x"]:
            with pytest.raises(ConfigError):
                blocks.ledger(block)  # type: ignore[arg-type]
        blocks.charge(PrivacyCost("0.5"), ["2026-11-24"])
    with open_ledger(url, name="events/2026-11-24") as acct:
        assert acct.spent == PrivacyCost("0.5")


def test_a_sub_budget_needs_a_name_of_its_own() -> None:
    with pytest.raises(ConfigError, match="its parent"):
        sub_budget(Accountant(1, name="census"), "census", 1)


def test_the_command_line_refuses_a_bad_name_escaped(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'ledgers.db'}"
    open_ledger(url, name="census", budget=1).close()
    out = io.StringIO()
    status = ledger_main(["ledger", "show", url, "--name", "\x1b[2Jcensus"], out=out)
    err = capsys.readouterr().err
    assert status == 2
    assert "invalid ledger name" in err and "\\x1b[2J" in err and "\x1b" not in err
    assert out.getvalue() == ""


def _insert_raw_ledger_row(path: Path, name: str, meta: dict[str, Any]) -> None:
    """What someone with SQL access (no triggers dropped) can add: a ledgers row."""
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO ledgers VALUES (?, ?, 1, 0, '0/1', '0/1', ?)",
                     (name, json.dumps(meta), "0" * 64))


def test_a_corrupt_stored_name_is_ledger_corrupt(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledgers.db"
    url = f"sqlite:///{path}"
    open_ledger(url, name="census", budget=1).close()
    meta = json.loads(open_store(url, name="census").stored_meta().model_dump_json())
    _insert_raw_ledger_row(path, "\x1b[2Jforged", {**meta, "name": "\x1b[2Jforged"})
    store = open_store(url, name="census", create=False, read_only=True)
    try:
        with pytest.raises(LedgerCorruptError, match="stored ledger name"):
            store.names()
    finally:
        store.close()
    assert ledger_main(["ledger", "list", url], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "stored ledger name is invalid" in err and "\x1b" not in err


@pytest.mark.parametrize("field", ["name", "parent"])
def test_stored_metadata_with_a_bad_name_does_not_validate(field: str) -> None:
    good = LedgerMeta.build("census", Budget(1), {"name": "basic"}, "add_remove",
                            parent="root")
    text = json.loads(good.model_dump_json())
    text[field] = "census/\x1b[2J"
    with pytest.raises(ValueError, match=f"invalid ledger {field}"):
        LedgerMeta.model_validate_json(json.dumps(text))
    with pytest.raises(ConfigError):
        LedgerMeta.build(text["name"], Budget(1), {"name": "basic"}, "add_remove",
                         parent=text["parent"])


def test_a_stored_parent_that_breaks_the_rule_is_ledger_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "ledgers.db"
    url = f"sqlite:///{path}"
    open_ledger(url, name="census", budget=1).close()
    meta = json.loads(open_store(url, name="census").stored_meta().model_dump_json())
    with sqlite3.connect(path) as conn:  # a settings row edited around dpaccount
        conn.execute("UPDATE ledgers SET meta = ? WHERE name = 'census'",
                     (json.dumps({**meta, "parent": "\x1b[31mroot"}),))
    with pytest.raises(LedgerCorruptError, match="parent"):
        open_ledger(url, name="census")


_PIECES = st.sampled_from(["a", "Z", "0", "-", "_", " ", ".", "..", "/", "é", "e\u0301",
                           "\x00", "\x1b", "\n", "\ud800", "\u00a0", "\u2028", "\u200b",
                           "\ufeff", "Ω", "字"])
_NAMES = st.one_of(
    st.lists(_PIECES, max_size=12).map("".join),
    st.text(max_size=30),
    st.integers(0, 400).map(lambda n: "n" * n),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_NAMES)
def test_fuzzed_names_work_everywhere_or_are_config_errors(name: str) -> None:
    valid = expected_valid(name)
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ledgers.db'}"
        if not valid:
            for call in _entries(url).values():
                with pytest.raises(ConfigError):
                    call(name)
            assert list(Path(folder).iterdir()) == []
            return
        assert Accountant(1, name=name).charge(PrivacyCost("0.5")).seq == 0
        with open_ledger(url, name=name, budget=1) as acct:
            acct.charge(PrivacyCost("0.25"))
        with open_ledger(url, name=name) as again:  # read back by name: the same ledger
            assert again.spent == PrivacyCost("0.25")
            assert again.store.names() == [name]  # type: ignore[attr-defined]


# =======================================================================================
# Nesting depth
# =======================================================================================

LEAF = PrivacyCost("1/1000")
WRAPPERS: dict[str, Callable[[Any], Any]] = {
    "subsampled": lambda c: Subsampled(c, "1/2", "poisson"),
    "parallel": lambda c: Parallel([c, LEAF]),
    "repeated": lambda c: Repeated(c, 2),
    "wor": lambda c: Subsampled(c, "1/2", "without_replacement"),
    "shared": lambda c: Parallel([c, c]),  # the same part twice: the tree doubles
}
#: Levels and charges each wrapper adds (the tree's size s becomes 1 + s * copies + other).
_GROWTH = {"subsampled": (1, 0), "parallel": (1, 1), "repeated": (1, 0), "wor": (1, 0),
           "shared": (2, 0)}


def _nest(leaf: Any, kinds: list[str]) -> Any:
    charge = leaf
    for kind in kinds:
        charge = WRAPPERS[kind](charge)
    return charge


@pytest.mark.parametrize("pattern", [["subsampled", "repeated"], ["parallel"],
                                     ["repeated"], ["subsampled", "parallel", "repeated"]],
                         ids="-".join)
def test_a_tree_deeper_than_the_limit_is_refused_when_built(pattern: list[str]) -> None:
    kinds = (pattern * 500)[:500]
    built = PrivacyCost("1/1000")
    for level, kind in enumerate(kinds, start=2):  # the leaf is level 1
        if level > MAX_NESTING:
            with pytest.raises(InvalidCostError, match=f"at most {MAX_NESTING} levels"):
                WRAPPERS[kind](built)
            break
        built = WRAPPERS[kind](built)
    assert built._depth == MAX_NESTING  # the deepest tree allowed was built


@pytest.mark.parametrize("rule", ["basic", "rdp", "pld"])
def test_the_deepest_tree_allowed_works_in_every_walker(rule: str) -> None:
    kinds = (["subsampled", "parallel", "repeated"] * 30)[:MAX_NESTING - 1]
    charge = _nest(PrivacyCost("1/1000"), kinds)
    check_relations(charge, "add_remove")
    assert describe(charge).startswith("2 x ")
    assert cost_of(charge).epsilon > 0
    assert next(iter(atoms(charge)))[1] == 2
    plan = {"plan": [charge]} if rule == "pld" else {}  # (pld is proven for a declared plan)
    acct = Accountant(Budget(10**6, "1e-3"), rule=rule, **plan)
    record = acct.charge(charge)
    assert decode_record(encode_record(record)).charge == charge


def _forged_cycle() -> Repeated:
    looped = Repeated(PrivacyCost("1/1000"), 2)
    object.__setattr__(looped, "charge", looped)
    return looped


def _forged_parallel() -> Parallel:
    looped = Parallel([PrivacyCost("1/1000")])
    object.__setattr__(looped, "partitions", (looped,))
    return looped


def _forged_deep_chain() -> Subsampled:
    """A chain of 200 levels, each built shallow and then pointed at the next."""
    links = [Subsampled(PrivacyCost("1/1000"), "1/2", "poisson") for _ in range(200)]
    for outer, inner in itertools.pairwise(links):
        object.__setattr__(outer, "charge", inner)
    return links[0]


@pytest.mark.parametrize("forge", [_forged_cycle, _forged_parallel, _forged_deep_chain])
def test_a_tree_forged_past_its_constructors_is_refused_as_it_enters_the_ledger(
    forge: Callable[[], Any],
) -> None:
    acct = Accountant(Budget(10))
    for call in (acct.charge, acct.preview, acct.can_afford, acct.max_queries,
                 lambda c: check_relations(c, "add_remove")):
        with pytest.raises(InvalidCostError, match="nested at least"):
            call(forge())
    assert acct.records == ()
    assert acct.spent == PrivacyCost(0)


def test_atoms_stops_at_a_forged_loop() -> None:
    with pytest.raises(InvalidCostError):
        list(atoms(_forged_cycle()))


def _record_text(levels: int) -> str:
    """A stored record whose charge is ``levels`` Repeated around a cost (built as text:
    json.dumps itself cannot nest that deep)."""
    leaf = '{"kind":"cost","epsilon":"1/1","delta":"0/1"}'
    charge = '{"kind":"repeated","charge":' * levels + leaf + ',"count":1}' * levels
    return ('{"seq":0,"label":null,"charge":' + charge + ',"cost":{"kind":"cost",'
            '"epsilon":"1/1","delta":"0/1"},"rule":"basic",'
            '"timestamp":"2026-01-01T00:00:00Z"}')


def _record_dict(levels: int) -> dict[str, Any]:
    payload = json.loads(_record_text(0))
    charge: dict[str, Any] = payload["charge"]
    for _ in range(levels):
        charge = {"kind": "repeated", "charge": charge, "count": 1}
    return {**payload, "charge": charge}


@pytest.mark.parametrize("levels", [MAX_NESTING, 100, 199, 250, 10_000])
@pytest.mark.parametrize("form", [_record_text, _record_dict], ids=["text", "dict"])
def test_a_stored_record_nested_too_deep_is_ledger_corrupt(
    form: Callable[[int], Any], levels: int
) -> None:
    with pytest.raises(LedgerCorruptError):
        decode_record(form(levels))


def test_a_stored_record_at_the_limit_is_read_back() -> None:
    record = decode_record(_record_text(MAX_NESTING - 1))
    assert record.cost == PrivacyCost(1)
    depth, charge = 1, record.charge
    while isinstance(charge, Repeated):
        depth, charge = depth + 1, charge.charge
    assert depth == MAX_NESTING


def test_a_stored_rule_state_nested_too_deep_is_ledger_corrupt() -> None:
    text = '{"kind":"basic","x":' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(LedgerCorruptError):
        decode_state(text)


def test_a_checkpoint_file_nested_too_deep_is_a_config_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url, name="census", budget=1).close()
    point = tmp_path / "head.json"
    point.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="checkpoint"):
        open_ledger(url, name="census", checkpoint=point)


def test_a_tree_of_shared_parts_is_refused_when_it_outgrows_the_limit() -> None:
    """``Parallel([c, c])`` nested k deep is 2**(k + 1) - 1 charges as a tree (and as a
    stored record): walking it would take time exponential in k."""
    built: Any = LEAF
    for k in range(1, 40):
        if 2 ** (k + 1) - 1 > MAX_PARTS:
            with pytest.raises(InvalidCostError, match=f"at most {MAX_PARTS} charges"):
                WRAPPERS["shared"](built)
            break
        built = WRAPPERS["shared"](built)
    assert k == 20  # 2**21 - 1 > 2**20
    for rule in ("basic", "rdp"):  # each shared part is costed, checked and bounded once
        acct = Accountant(Budget(10**6, "1e-3"), rule=rule)
        acct.charge(built)
        assert len(acct.records) == 1
    refusing = Accountant(Budget(10**6, "1e-3"), rule="gdp")
    with pytest.raises(UnsupportedChargeError) as info:  # names the tree, not its repr
        refusing.charge(built)
    assert len(str(info.value)) < 400
    assert refusing.records == ()


@settings(max_examples=60, deadline=None)
@given(leaf=leaf_charges,
       kinds=st.lists(st.sampled_from(["subsampled", "parallel", "repeated", "wor",
                                       "shared"]),
                      max_size=MAX_NESTING + 16).filter(lambda k: k.count("shared") <= 12),
       rule=st.sampled_from(["basic", "rdp"]))
def test_random_deep_trees_work_or_raise_the_typed_error(leaf: Any, kinds: list[str],
                                                         rule: str) -> None:
    built, size = leaf, 1
    for level, kind in enumerate(kinds, start=2):
        copies, other = _GROWTH[kind]
        size = 1 + copies * size + other
        if level > MAX_NESTING or size > MAX_PARTS:  # counted here, they decide alone
            with pytest.raises(InvalidCostError, match="at most"):
                WRAPPERS[kind](built)
            return
        built = WRAPPERS[kind](built)
    acct = Accountant(Budget(10**9, "1/2"), rule=rule)
    try:
        record = acct.charge(built)
    except (UnsupportedChargeError, BudgetExceededError, InvalidCostError):
        assert acct.records == ()  # a refusal leaves the ledger as it was
        return
    assert decode_record(encode_record(record)).charge == built
    assert describe(built)


# =======================================================================================
# Hostile frames
# =======================================================================================

STATISTICS = ["count", "sum", "mean", "histogram", "quantile"]


def _statistic(g: Any, stat: str, acct: Accountant, column: Any = "x") -> Any:
    delta = {"delta": "1e-6"} if g._keys is None else {}
    if stat == "count":
        return g.count(acct, 1, **delta)
    if stat == "histogram":
        return g.histogram(column, acct, 1, bins=[0, 1, 2], **delta)
    if stat == "quantile":
        return g.quantile(column, acct, 1, "0.5", lower=0, upper=2, **delta)
    return getattr(g, stat)(column, acct, 1, lower=0, upper=2, **delta)


def _frame(columns: list[Any], rows: int = 4) -> pd.DataFrame:
    data = [["a" if i % 2 else "b", CANARY, i] for i in range(rows)]
    width = len(columns)
    return pd.DataFrame([(row * 2)[:width] for row in data], columns=columns)


def _refused_before(call: Callable[[Accountant], Any],
                    error: type[DPAccountError] = ConfigError) -> None:
    acct = Accountant(Budget(100, "1/2"))
    with pytest.raises(error) as info:
        call(acct)
    _clean(info.value)
    assert acct.records == ()  # nothing charged


def _works(call: Callable[[Accountant], Any]) -> Any:
    acct = Accountant(Budget(100, "1/2"))
    result = call(acct)
    assert len(acct.records) == 1
    return result


def _grouped(frame: Any, by: Any = "k", *, keys: Any = ("a", "b"), **options: Any) -> Any:
    return aggregates.groupby(frame, by, keys=None if keys is None else list(keys),
                              rng=RandomSource.seeded(5), **options)


@pytest.mark.parametrize("stat", STATISTICS)
@pytest.mark.parametrize("declared", [True, False], ids=["keys", "private-keys"])
def test_duplicate_column_names_are_refused_before_the_charge(stat: str,
                                                              declared: bool) -> None:
    keys = ("a", "b") if declared else None
    dup_key = _frame(["k", "k", "x"])
    _refused_before(lambda a: _statistic(_grouped(dup_key, keys=keys), stat, a))
    dup_unit = _frame(["k", "x", "u", "u"])
    _refused_before(lambda a: _statistic(
        _grouped(dup_unit, keys=keys, privacy_unit="u"), stat, a))
    dup_value = _frame(["k", "x", "x"])
    if stat == "count":  # the duplicated column is not read
        _works(lambda a: _statistic(_grouped(dup_value, keys=keys), stat, a))
    else:
        _refused_before(lambda a: _statistic(_grouped(dup_value, keys=keys), stat, a))


@pytest.mark.parametrize("stat", STATISTICS)
def test_missing_multiindex_and_non_string_columns_are_refused_before_the_charge(
    stat: str,
) -> None:
    frame = _frame(["k", "x", "u"])
    _refused_before(lambda a: _statistic(_grouped(frame, "nope"), stat, a))
    _refused_before(lambda a: _statistic(_grouped(frame, privacy_unit="nope"), stat, a))
    if stat != "count":
        _refused_before(lambda a: _statistic(_grouped(frame), stat, a, column="nope"))
        _refused_before(lambda a: _statistic(_grouped(frame), stat, a, column=1))
    multi = frame.copy()
    multi.columns = pd.MultiIndex.from_tuples([("k", ""), ("x", ""), ("u", "")])
    for by in ("k", ("k", "")):
        _refused_before(lambda a, by=by: _statistic(_grouped(multi, by), stat, a))
    numbered = _frame([0, 1, 2])
    for by in (0, "0", np.int64(0)):
        _refused_before(lambda a, by=by: _statistic(_grouped(numbered, by), stat, a))


def test_messages_name_the_callers_column_not_the_frames_other_columns() -> None:
    pivot = pd.DataFrame({"k": ["a"], f"diagnosis {CANARY_TEXT}": [1.0]})  # data as names
    with pytest.raises(ConfigError) as info:
        _grouped(pivot, "region")
    assert "'region'" in str(info.value) and "2 columns" in str(info.value)
    _clean(info.value)


@pytest.mark.parametrize("stat", ["sum", "mean", "histogram", "quantile"])
def test_value_columns_that_hold_no_numbers_are_refused_before_the_charge(stat: str) -> None:
    mixed = pd.DataFrame({"k": ["a", "b"], "x": pd.Series([CANARY, CANARY_TEXT], dtype=object)})
    text = pd.DataFrame({"k": ["a", "b"], "x": [CANARY_TEXT, "y"]})
    complex_ = pd.DataFrame({"k": ["a", "b"], "x": [1 + 2j, CANARY]})
    for frame in (mixed, text, complex_):
        _refused_before(lambda a, f=frame: _statistic(_grouped(f), stat, a), InvalidCostError)


@pytest.mark.parametrize("stat", STATISTICS)
def test_unhashable_values_are_typed_errors_after_the_charge(stat: str) -> None:
    """A pandas ``object`` column's values can only be read after the charge: refusing
    before it would tell, un-noised, whether the data holds such a value. The error is
    typed, names the column's type, and the charge is kept (no refunds)."""
    key_lists = pd.DataFrame({"k": [[CANARY_TEXT], ["b"]], "x": [1.0, 2.0], "u": [1, 2]})
    unit_dicts = pd.DataFrame({"k": ["a", "b"], "x": [1.0, 2.0],
                               "u": [{CANARY_TEXT: 1}, {"b": CANARY}]})
    for frame, unit in ((key_lists, None), (unit_dicts, "u")):
        for keys in (("a", "b"), None):
            acct = Accountant(Budget(100, "1/2"))
            g = _grouped(frame, keys=keys, privacy_unit=unit)
            with pytest.raises(InvalidCostError, match="hashable") as info:
                _statistic(g, stat, acct)
            _clean(info.value)
            assert len(acct.records) == 1


def test_unhashable_declared_keys_are_refused_before_the_charge() -> None:
    _refused_before(lambda a: _grouped(_frame(["k", "x"]), keys=[["a"], ["b"]]),
                    InvalidCostError)


@pytest.mark.parametrize("stat", STATISTICS)
@pytest.mark.parametrize("declared", [True, False], ids=["keys", "private-keys"])
def test_an_empty_frame_is_answered_with_noise_or_refused_by_its_schema(stat: str,
                                                                         declared: bool) -> None:
    """Whether a frame has rows is data: an empty one is charged and answered like any
    other (never refused because it is empty); one without the columns is refused by
    its schema, before the charge."""
    keys = ("a", "b") if declared else None
    _refused_before(lambda a: _statistic(_grouped(pd.DataFrame(), keys=keys), stat, a))
    empty = pd.DataFrame({"k": pd.Series([], dtype=str), "x": pd.Series([], dtype=float),
                          "u": pd.Series([], dtype="int64")})
    for unit in (None, "u"):
        result = _works(lambda a, u=unit: _statistic(
            _grouped(empty, keys=keys, privacy_unit=u), stat, a))
        if declared:  # every declared key is reported, empty or not
            assert set(result.frame.index.get_level_values(0)) == {"a", "b"}
    _works(lambda a: _statistic(_grouped(pd.DataFrame(), None, keys=None), "count", a))


# -- polars -------------------------------------------------------------------------------


@pytest.mark.parametrize("stat", STATISTICS)
def test_polars_frames_whose_schema_cannot_be_read_are_refused_before_the_charge(
    stat: str,
) -> None:
    pl = pytest.importorskip("polars")
    lists = pl.DataFrame({"k": [[CANARY_TEXT], ["b"]], "x": [1.0, 2.0], "u": [1, 2]})
    structs = pl.DataFrame({"k": [{"a": CANARY}, {"a": 2.0}], "x": [1.0, 2.0], "u": [1, 2]})
    list_units = pl.DataFrame({"k": ["a", "b"], "x": [1.0, 2.0], "u": [[1], [2]]})
    for keys in (("a", "b"), None):
        for frame in (lists, structs):
            _refused_before(lambda a, f=frame, k=keys: _statistic(_grouped(f, keys=k), stat, a))
        _refused_before(lambda a, k=keys: _statistic(
            _grouped(list_units, keys=k, privacy_unit="u"), stat, a))
        _refused_before(lambda a, k=keys: _statistic(_grouped(lists, "nope", keys=k), stat, a))
        _refused_before(lambda a, k=keys: _statistic(_grouped(pl.DataFrame(), keys=k), stat, a))
    if stat != "count":
        objects = pl.DataFrame({"k": ["a", "b"],
                                "x": pl.Series([object(), CANARY], dtype=pl.Object)})
        _refused_before(lambda a: _statistic(_grouped(objects), stat, a), InvalidCostError)
    empty = pl.DataFrame({"k": pl.Series([], dtype=pl.String),
                          "x": pl.Series([], dtype=pl.Float64),
                          "u": pl.Series([], dtype=pl.Int64)})
    _works(lambda a: _statistic(_grouped(empty, privacy_unit="u"), stat, a))


def test_dask_frames_with_a_duplicated_value_column_are_refused_before_the_charge() -> None:
    dd = pytest.importorskip("dask.dataframe")
    frame = dd.from_pandas(_frame(["k", "x", "x"]), npartitions=2)
    _refused_before(lambda a: _statistic(_grouped(frame), "sum", a))
    empty = dd.from_pandas(_frame(["k", "x", "u"]).iloc[:0], npartitions=1)
    _works(lambda a: _statistic(_grouped(empty), "sum", a))


# -- scalar aggregates and privacy units ----------------------------------------------------

SCALAR: dict[str, Callable[..., Any]] = {
    "count": lambda d, a, **o: aggregates.count(d, a, 1, **o),
    "sum": lambda d, a, **o: aggregates.sum(d, a, 1, lower=0, upper=2, **o),
    "mean": lambda d, a, **o: aggregates.mean(d, a, 1, lower=0, upper=2, **o),
    "histogram": lambda d, a, **o: aggregates.histogram(d, a, 1, bins=[0, 1, 2], **o),
    "quantile": lambda d, a, **o: aggregates.quantile(d, a, 1, "0.5", lower=0, upper=2, **o),
}


@pytest.mark.parametrize("stat", [s for s in SCALAR if s != "count"])
def test_scalar_aggregates_refuse_by_schema_before_the_charge(stat: str) -> None:
    pl = pytest.importorskip("polars")
    run = SCALAR[stat]
    frame = _frame(["k", "x", "x"])
    for data in (frame, frame["x"], frame.to_numpy(),  # two-dimensional
                 pd.Series([CANARY_TEXT, "y"]),  # text
                 np.array([CANARY_TEXT]), pl.Series([[CANARY], [1.0]])):
        _refused_before(lambda a, d=data: run(d, a, rng=RandomSource.seeded(1)),
                        InvalidCostError)


@pytest.mark.parametrize("stat", list(SCALAR))
def test_privacy_units_are_checked_by_schema_before_the_charge(stat: str) -> None:
    pl = pytest.importorskip("polars")
    run = SCALAR[stat]
    values = pd.Series([1.0, CANARY])
    for units in (pd.DataFrame({"u": [1, 2], "v": [3, 4]}),
                  pl.Series([[1], [2]]), pl.Series([{"a": 1}, {"a": 2}])):
        _refused_before(lambda a, u=units: run(values, a, privacy_unit=u, max_rows_per_unit=2),
                        InvalidCostError)
    # values of an object column are read after the charge: a typed error, charge kept
    acct = Accountant(Budget(100))
    with pytest.raises(InvalidCostError, match="hashable") as info:
        run(values, acct, privacy_unit=pd.Series([[CANARY_TEXT], [2]]), max_rows_per_unit=2)
    _clean(info.value)
    assert len(acct.records) == 1
    # an empty column is answered with noise
    _works(lambda a: run(pd.Series([], dtype=float), a, privacy_unit=pd.Series([], dtype=int),
                         max_rows_per_unit=2, rng=RandomSource.seeded(2)))


def test_a_scalar_sum_of_mixed_objects_fails_after_the_charge_without_values() -> None:
    acct = Accountant(Budget(100))
    with pytest.raises(InvalidCostError) as info:
        aggregates.sum(pd.Series([CANARY, CANARY_TEXT], dtype=object), acct, 1, lower=0,
                       upper=2)
    _clean(info.value)
    assert len(acct.records) == 1  # the values are read after the charge: no refunds


_LABELS = st.sampled_from(["k", "x", "u", 0, 1, "K"])


@settings(max_examples=60, deadline=None)
@given(columns=st.lists(_LABELS, min_size=1, max_size=5),
       by=_LABELS, column=_LABELS, stat=st.sampled_from(STATISTICS))
def test_fuzzed_schemas_work_or_are_typed_errors_before_the_charge(
    columns: list[Any], by: Any, column: Any, stat: str
) -> None:
    """Random column labels (duplicates, integers, missing names): the statistic works
    and charges once exactly when every column it reads is named by a str that occurs
    once; otherwise a typed error, before anything is charged."""
    frame = pd.DataFrame([[i % 2] * len(columns) for i in range(6)], columns=columns,
                         dtype=float)
    reads = [by] if stat == "count" else [by, column]
    readable = all(isinstance(n, str) and columns.count(n) == 1 for n in reads)
    acct = Accountant(Budget(100))
    try:
        _statistic(_grouped(frame, by, keys=(0.0, 1.0)), stat, acct, column=column)
    except (ConfigError, InvalidCostError) as exc:
        assert not readable, exc
        assert acct.records == ()
        return
    assert readable
    assert len(acct.records) == 1
