"""The organization's view (issue 29, items 2-4): which share spent a dataset's budget
(``show``, ``export``, ``list``, the report), progress on long work (a terminal line, quiet
when piped; callbacks for the library), and the report a privacy officer reads alone."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import pty
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from liveness import LIVENESS_SECONDS

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount._progress import ProgressLine, is_terminal
from dpaccount.audit import (
    attribute_shares,
    export_document,
    html_report,
    share_tree,
    verify_export,
    write_export,
)
from dpaccount.charges import Relation
from dpaccount.ledger_cli import ledger_main
from dpaccount.records import LedgerMeta, LedgerRecord
from dpaccount.report import time_ticks

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = ledger_main(["ledger", *argv], out=out)
    return status, out.getvalue()


#: Who charged what, in order: (through which ledger, label, epsilon).
PLAN = [
    ("census", "direct count", "0.05"),
    ("census/team-a", "count", "0.05"),
    ("census/team-b", "count", "0.1"),
    ("census/team-a/nlp", "embedding", "0.025"),
    ("census", "direct count", "0.05"),
    ("census/team-a", "count", "0.05"),  # the same label and cost as a direct one below
    ("census", "count", "0.05"),
]
#: The share behind each of census's records, as the parent must name it.
EXPECTED = [None, "census/team-a", "census/team-b", "census/team-a > census/team-a/nlp",
            None, "census/team-a", None]


def _census(url: str) -> None:
    open_ledger(url, name="census", budget=Budget(1)).close()
    open_ledger(url, name="census/team-a", budget=Budget("0.4"), parent="census").close()
    open_ledger(url, name="census/team-b", budget=Budget("0.4"), parent="census").close()
    open_ledger(url, name="census/team-a/nlp", budget=Budget("0.1"),
                parent="census/team-a").close()
    for i, (name, label, epsilon) in enumerate(PLAN):
        with open_ledger(url, name=name) as acct:
            acct.charge(PrivacyCost(epsilon), label=label, query_id=f"job-{i}/q")


def _ledgers(url: str) -> dict[str, tuple[LedgerMeta, list[LedgerRecord]]]:
    out = {}
    for name in ("census", "census/team-a", "census/team-b", "census/team-a/nlp"):
        with open_ledger(url, name=name, read_only=True) as acct:
            out[name] = (acct._meta, list(acct.records))  # type: ignore[attr-defined]
    return out


def test_the_parent_names_the_share_behind_each_charge(url: str) -> None:
    _census(url)
    ledgers = _ledgers(url)
    from dpaccount.ledgers import open_store

    store = open_store(url, name="census", create=False, read_only=True)
    try:  # every ledger's settings in one read: how the view finds the shares
        assert {n: m.parent for n, m in store.metas().items()} == {  # type: ignore[attr-defined]
            "census": None, "census/team-a": "census", "census/team-b": "census",
            "census/team-a/nlp": "census/team-a"}
    finally:
        store.close()
    found = attribute_shares("census", ledgers)
    assert found.names == EXPECTED
    assert dict(found.unmatched) == {"census/team-a": 0, "census/team-b": 0}
    # a share's own view names its share within it
    assert attribute_shares("census/team-a", ledgers).names == [
        None, "census/team-a/nlp", None]
    status, text = run("show", url, "--name", "census")
    assert status == 0
    _title, header, _dashes, *rows = text.splitlines()
    assert header.split()[:4] == ["seq", "when", "(UTC)", "share"]
    named = [row.split()[3] for row in rows[:len(PLAN)]]
    assert named == [n.split(" > ")[0] if n else "(direct)" for n in EXPECTED]
    _, summary = run("show", url, "--name", "census", "--summary", "--by", "share")
    counts = {" ".join(line.split()[:-7]): int(line.split()[-7])
              for line in summary.splitlines()[3:7]}
    assert counts == {"(direct)": 3, "census/team-a": 2, "census/team-b": 1,
                      "census/team-a > census/team-a/nlp": 1}
    # the shares under show, with their spend against their budget
    assert re.search(r"├─ census/team-a\s+3\s+basic\s+\(ε=0\.4, δ=0\)\s+\(ε=0\.125, δ=0\)"
                     r"\s+31\.3%", text)


def test_ledger_list_draws_the_tree_with_each_shares_spend(url: str) -> None:
    _census(url)
    status, text = run("list", url)
    assert status == 0
    names = [re.split(r"\s{2,}", line.replace("│  ", "│__"))[0].replace("│__", "│  ")
             for line in text.splitlines()[2:]]
    assert names == ["census", "├─ census/team-a", "│  └─ census/team-a/nlp",
                     "└─ census/team-b"]
    lines = dict(zip(names, text.splitlines()[2:], strict=True))
    # team-a: its two charges and nlp's, 0.125 of 0.4 = 31.25%, shown rounded up
    assert "31.3%" in lines["├─ census/team-a"]
    assert "25%" in lines["│  └─ census/team-a/nlp"] and "25%" in lines["└─ census/team-b"]
    # census: everything, 0.375 of 1
    assert "37.5%" in lines["census"] and "epsilon 0.625" in lines["census"]


def test_csv_export_has_decimals_first_the_exact_beside_and_the_share(
        sqlite_url: str, tmp_path: Path) -> None:
    _census(sqlite_url)
    open_ledger(sqlite_url, name="third", budget=Budget(1, "1e-6")).close()
    with open_ledger(sqlite_url, name="third") as acct:
        acct.charge(PrivacyCost(Fraction(1, 3), "1e-7"), label="=cmd()")
    path = tmp_path / "census.csv"
    assert run("export", sqlite_url, "--name", "census", "--format", "csv", "--output",
               str(path))[0] == 0
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    header = path.read_text().splitlines()[0].split(",")
    assert header[header.index("epsilon") + 1] == "epsilon_exact"
    assert header[header.index("delta") + 1] == "delta_exact"
    assert header.index("epsilon") < header.index("charge") < header.index("hash")
    assert [r["share"] or None for r in rows] == EXPECTED
    assert rows[3]["epsilon"] == "0.025" and rows[3]["epsilon_exact"] == "1/40"
    other = tmp_path / "third.csv"
    assert run("export", sqlite_url, "--name", "third", "--format", "csv", "--output",
               str(other))[0] == 0
    (row,) = csv.DictReader(io.StringIO(other.read_text()))
    # a third is no finite decimal: the decimal is rounded up, the exact value beside
    assert Fraction(row["epsilon"]) > Fraction(1, 3) == Fraction(row["epsilon_exact"])
    assert row["delta"] == "1e-07" and Fraction(row["delta_exact"]) == Fraction(1, 10**7)
    assert row["label"] == "'=cmd()" and row["share"] == ""


def test_json_export_names_the_shares_and_still_reverifies(url: str, tmp_path: Path) -> None:
    _census(url)
    path = tmp_path / "census.json"
    assert run("export", url, "--name", "census", "--output", str(path))[0] == 0
    document = json.loads(path.read_text())
    assert [r["share"] for r in document["records"]] == EXPECTED
    shares = {entry["name"]: entry for entry in document["shares"]}
    assert set(shares) == {"census/team-a", "census/team-b", "census/team-a/nlp"}
    assert shares["census/team-a"]["spent"]["epsilon"] == "1/8"
    assert shares["census/team-a"]["budget"]["epsilon"] == "2/5"
    assert shares["census/team-a/nlp"]["parent"] == "census/team-a"
    assert shares["census/team-a/nlp"]["depth"] == 2
    check = verify_export(document)
    assert len(check.records) == len(PLAN) and check.spent.epsilon == Fraction(3, 8)
    assert run("verify", "--export", str(path))[0] == 0


def test_the_streamed_export_is_json_dump_of_the_document(sqlite_url: str) -> None:
    _census(sqlite_url)
    ledgers = _ledgers(sqlite_url)
    from dpaccount.ledgers import open_store

    store = open_store(sqlite_url, name="census", create=False, read_only=True)
    try:
        rows, history = store.chain_rows()
    finally:
        store.close()
    meta = ledgers["census"][0]
    names = attribute_shares("census", ledgers).names
    tree = share_tree(ledgers)
    seen: list[tuple[int, int | None]] = []
    for given_rows in (rows, []):
        shares = names if given_rows else []
        stream = io.StringIO()
        write_export(stream, meta, given_rows, history, shares=shares, tree=tree,
                     progress=lambda done, total: seen.append((done, total)))
        expected = io.StringIO()
        json.dump(export_document(meta, given_rows, history, shares=shares, tree=tree),
                  expected, indent=1, sort_keys=True)
        expected.write("\n")

        def same(text: str) -> str:
            return re.sub(r'"exported_at": "[^"]*"', "", text)

        assert same(stream.getvalue()) == same(expected.getvalue())
    assert seen == [(len(PLAN), len(PLAN))]


def _spawn(argv: list[str], stderr: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    return subprocess.Popen([sys.executable, "-m", "dpaccount.cli", *argv],
                            stdout=subprocess.PIPE, stderr=stderr, env=env)


def test_progress_is_drawn_on_a_terminal_and_quiet_in_a_pipe(sqlite_url: str,
                                                             tmp_path: Path) -> None:
    _census(sqlite_url)
    argv = ["ledger", "verify", sqlite_url, "--name", "census"]
    piped = _spawn(argv, subprocess.PIPE)
    out, err = piped.communicate(timeout=LIVENESS_SECONDS)
    assert piped.returncode == 0 and b"ok: ledger" in out
    assert err == b""  # piped: not a byte of progress
    main, child = pty.openpty()
    try:
        proc = _spawn(argv, child)
        os.close(child)
        out, _ = proc.communicate(timeout=LIVENESS_SECONDS)
        drawn = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the child closed the terminal (EIO on Linux)
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(main)
    assert proc.returncode == 0 and b"ok: ledger" in out
    # the line names the step and counts records, then is erased
    assert re.search(rb"\rverifying census: \[#+\] 7 of 7 \(100%\)", drawn)
    assert drawn.endswith(b"\r\x1b[K")
    assert b"count" not in drawn  # labels are not progress


def test_the_progress_line_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, enabled=True)
    step = line.stage("writing")
    step(0, 4)
    step(4, 4)  # the final state is always drawn
    step(3, None)
    text = stream.getvalue()
    assert text.startswith("\rwriting: [") and "4 of 4 (100%)" in text
    line.close()
    assert stream.getvalue().endswith("\r\x1b[K")
    assert not ProgressLine(io.StringIO()).enabled

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "dumb")
    assert not is_terminal(Terminal())
    monkeypatch.setenv("TERM", "xterm")
    assert is_terminal(Terminal())


def test_verify_export_reports_progress(sqlite_url: str, tmp_path: Path) -> None:
    _census(sqlite_url)
    path = tmp_path / "e.json"
    assert run("export", sqlite_url, "--name", "census", "--output", str(path))[0] == 0
    seen: list[tuple[int, int | None]] = []
    verify_export(json.loads(path.read_text()), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(len(PLAN), len(PLAN))]


def test_a_long_calibration_reports_each_evaluation() -> None:
    from dpaccount.accounting.dpsgd import calibrate_dpsgd_noise

    options = {"sampling_rate": 0.01, "steps": 100, "target_epsilon": 1.0,
               "target_delta": 1e-5, "tolerance": 1e-2,
               "value_discretization_interval": 1e-3}
    seen: list[tuple[int, int | None]] = []
    told = calibrate_dpsgd_noise(**options, progress=lambda n, t: seen.append((n, t)))
    assert told == calibrate_dpsgd_noise(**options)  # the callback changes nothing
    assert len(seen) >= 3 and seen == [(n, None) for n in range(1, len(seen) + 1)]


def test_the_report_names_shares_and_draws_steps(sqlite_url: str) -> None:
    _census(sqlite_url)
    ledgers = _ledgers(sqlite_url)
    tree = share_tree(ledgers)
    order = [node.name for root in tree for _depth, node in root.walk()]
    assert order == ["census", "census/team-a", "census/team-a/nlp", "census/team-b"]
    page = html_report([(*ledgers[name], "verified") for name in order], title="t",
                       tree=tree, shares={"census": attribute_shares("census", ledgers).names})
    assert "<dt>relation add_remove</dt>" in page and "<dt>rule basic</dt>" in page
    assert "substitution" not in page  # only the relations the report shows
    assert 'class="chart-delta"' not in page and page.count('class="chart-epsilon"') == 4
    assert page.count("δ spent: 0") == 4
    latest = page.split("latest charges, with the share behind each")[1]
    assert latest.count("census/team-a &gt; census/team-a/nlp") == 1
    # the spend line is a step function: every segment is horizontal or vertical
    for points in re.findall(r'<polyline points="([^"]+)"', page):
        corners = [tuple(map(float, p.split(","))) for p in points.split()]
        for (x1, y1), (x2, y2) in itertools.pairwise(corners):
            assert x1 == x2 or y1 == y2
        ys = [y for _x, y in corners]
        assert ys == sorted(ys, reverse=True)  # it only rises (SVG y grows downwards)


def test_the_delta_chart_appears_once_delta_is_spent(sqlite_url: str) -> None:
    with open_ledger(sqlite_url, name="g", budget=Budget(1, "1e-6")) as acct:
        acct.charge(PrivacyCost("0.1"))
        acct.charge(PrivacyCost("0.1", "1e-7"))
        meta, records = acct._meta, list(acct.records)  # type: ignore[attr-defined]
    page = html_report([(meta, records, "verified")], title="t")
    assert page.count('class="chart-delta"') == 1 and "δ spent: 0" not in page


@given(start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
       seconds=st.integers(min_value=0, max_value=20 * 365 * 86400))
def test_time_ticks_are_few_round_and_inside(start: datetime, seconds: int) -> None:
    start = start.replace(tzinfo=UTC)
    end = start + timedelta(seconds=seconds)
    ticks = time_ticks(start, end)
    times = [t for t, _label in ticks]
    assert times == sorted(times) and all(start <= t <= end for t in times)
    assert len(ticks) <= 6
    if seconds >= 120:  # a round tick at least every fifth of the span
        assert ticks, (start, end)
        assert all(t.second == 0 and t.microsecond == 0 for t in times)
    # Each label names its time, with the date read from the last label that gave one.
    day = None
    for when, label in ticks:
        if re.fullmatch(r"\d{4}-\d{2}", label):
            assert (when.year, when.month, when.day, when.hour) == (
                int(label[:4]), int(label[5:]), 1, 0)
            continue
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", label):
            assert when == datetime.fromisoformat(label).replace(tzinfo=UTC)
            continue
        *date, clock = label.split(" ")
        day = date[0] if date else day
        assert day is not None
        assert f"{when:%m-%d}" == day and clock == f"{when:%H:%M:%S}"[:len(clock)]


_T0 = datetime(2026, 11, 24, tzinfo=UTC)


@given(plan=st.lists(st.tuples(st.sampled_from(["P", "A", "B", "A/x"]),
                               st.integers(0, 2), st.sampled_from(["a", "b"])),
                     max_size=30))
def test_attribution_matches_each_share_in_order(plan: list[tuple[str, int, str]]) -> None:
    # Records as the joint protocol writes them, with deliberate collisions: the same
    # second, label and cost through different shares and directly.
    paths = {"P": ["P"], "A": ["A", "P"], "B": ["B", "P"], "A/x": ["A/x", "A", "P"]}
    records: dict[str, list[LedgerRecord]] = {n: [] for n in paths}
    for target, second, label in plan:
        for ledger in paths[target]:
            records[ledger].append(LedgerRecord(
                seq=len(records[ledger]), label=label, charge=PrivacyCost("0.01"),
                cost=PrivacyCost("0.01"), rule="basic",
                timestamp=_T0 + timedelta(seconds=second)))
    metas = {n: LedgerMeta.build(n, Budget(10), {"name": "basic"}, Relation.ADD_REMOVE,
                                 parent={"P": None, "A": "P", "B": "P", "A/x": "A"}[n])
             for n in paths}
    found = attribute_shares("P", {n: (metas[n], records[n]) for n in paths})
    assert all(count == 0 for count in found.unmatched.values())
    for share in ("A", "B"):
        mine = [i for i, path in enumerate(found.paths) if path[:1] == (share,)]
        assert len(mine) == len(records[share])  # each of its records found once

        def key(r: LedgerRecord) -> tuple[object, ...]:
            return (r.timestamp, r.label)

        assert [key(records["P"][i]) for i in mine] == [key(r) for r in records[share]]
    nested = sum(1 for path in found.paths if path == ("A", "A/x"))
    assert nested == len(records["A/x"])


def test_a_share_record_missing_from_its_parent_is_counted_not_hidden() -> None:
    # A damaged database: the share holds a record its parent lacks. The exact match
    # fails; the greedy one names what it can and counts what it cannot.
    metas = {n: LedgerMeta.build(n, Budget(10), {"name": "basic"}, Relation.ADD_REMOVE,
                                 parent=None if n == "P" else "P") for n in ("P", "A")}

    def record(seq: int, second: int, label: str) -> LedgerRecord:
        return LedgerRecord(seq=seq, label=label, charge=PrivacyCost("0.01"),
                            cost=PrivacyCost("0.01"), rule="basic",
                            timestamp=_T0 + timedelta(seconds=second))

    parent = [record(0, 0, "a"), record(1, 2, "c")]
    share = [record(0, 0, "a"), record(1, 1, "lost"), record(2, 2, "c")]
    found = attribute_shares("P", {"P": (metas["P"], parent), "A": (metas["A"], share)})
    assert found.names == ["A", "A"] and dict(found.unmatched) == {"A": 1}


def test_the_image_report_by_share(sqlite_url: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _census(sqlite_url)
    path = tmp_path / "report.png"
    assert run("report", sqlite_url, "--all", "--by", "share", "--output", str(path))[0] == 0
    from PIL import Image

    with Image.open(path) as image:  # four ledgers, one row each
        assert image.height > 3 * image.width // 4


def test_an_impossible_match_of_equal_records_ends_in_bounded_work() -> None:
    # 1000 equal records in the parent, 501 and 500 in two shares: each share fits alone,
    # both cannot. The exact search gives up within its work bound (linear in the
    # ledger) and the greedy match names what it can and counts the rest.
    metas = {n: LedgerMeta.build(n, Budget(10), {"name": "basic"}, Relation.ADD_REMOVE,
                                 parent=None if n == "P" else "P") for n in ("P", "A", "B")}

    def records(count: int) -> list[LedgerRecord]:
        return [LedgerRecord(seq=i, label="same", charge=PrivacyCost("0.01"),
                             cost=PrivacyCost("0.01"), rule="basic", timestamp=_T0)
                for i in range(count)]

    found = attribute_shares("P", {"P": (metas["P"], records(1000)),
                                   "A": (metas["A"], records(501)),
                                   "B": (metas["B"], records(500))})
    assert found.names.count("A") == 501 and found.names.count("B") == 499
    assert dict(found.unmatched) == {"A": 0, "B": 1}
