"""The command line: compose, plot, demo."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from liveness import FINISHES

from dpaccount.cli import main


def test_compose_basic_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compose", "--rule", "basic", "--epsilon", "0.1", "--count", "10"]) == 0
    out = capsys.readouterr().out
    assert "ε=1," in out and "Thm 3.16" in out
    assert main(["compose", "--rule", "advanced", "--epsilon", "0.1", "--count", "1000",
                 "--delta-slack", "1e-5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # Dwork-Roth Thm 3.20 by hand: sqrt(2k ln(1/d')) eps + k eps (e^eps - 1)
    expected = math.sqrt(2 * 1000 * math.log(1e5)) * 0.1 + 1000 * 0.1 * math.expm1(0.1)
    assert float(data["epsilon"]) == pytest.approx(expected, rel=1e-12)
    assert float(data["epsilon"]) >= expected
    assert data["delta"] == "1e-05" and "3.20" in data["theorem"]


def test_compose_invalid_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compose", "--rule", "basic", "--epsilon", "nan", "--count", "3"]) == 2
    assert "--epsilon 'nan'" in capsys.readouterr().err
    assert main(["compose", "--rule", "advanced", "--epsilon", "0.1", "--count", "3"]) == 2
    assert "give --delta-slack" in capsys.readouterr().err


def test_plot_composition_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "c.png"
    assert main(["plot", "composition", "--epsilon", "0.1", "--count", "50",
                 "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_persists_and_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    assert main(["demo", "--ledger", url]) == 0
    first = capsys.readouterr().out
    assert "REFUSED before touching the data" in first
    assert main(["demo", "--ledger", url]) == 0
    second = capsys.readouterr().out
    assert "earlier charges" in second and "in 0 earlier charges" not in second
    assert main(["demo", "--ledger", url, "--fresh"]) == 0
    assert "in 0 earlier charges" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["compose", "--rule", "optimal", "--epsilon", "0.1", "--count", "100000000",
          "--delta-slack", "1e-6"], 2),
        (["compose", "--rule", "basic", "--epsilon", "0.1", "--count", "1e8"], 2),
        (["compose", "--rule", "basic", "--epsilon", "0.1", "--count", "0"], 2),
        (["compose", "--rule", "basic", "--epsilon", "0.1", "--count", "10000000000000"], 2),
        (["compose", "--rule", "basic", "--epsilon", "1e5000", "--count", "3"], 2),
    ],
)
@FINISHES  # a count that hangs the CLI fails the run (no bound on elapsed time: issue 28)
def test_cli_counts_and_values_are_bounded_with_typed_errors(argv: list[str], code: int,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    try:
        result = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        result = exit_.code
    assert result == code
    assert "Traceback" not in capsys.readouterr().err


def test_best_at_a_trillion_queries_uses_the_closed_forms(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    # It used to try the exact optimum and allocate 3.6 TiB.
    assert main(["compose", "--rule", "best", "--epsilon", "0.1", "--count",
                 "1000000000000", "--delta-slack", "1e-6"]) == 0
    assert "under 'best'" in capsys.readouterr().out


@pytest.mark.parametrize("enabled", [True, False])
def test_ledger_commands_leave_the_garbage_collector_as_they_found_it(
    tmp_path: Path, enabled: bool
) -> None:
    """`ledger verify` pauses the cyclic collector while it loads a ledger, and restores
    it afterwards, also when loading fails."""
    import gc
    import io
    import sqlite3

    from dpaccount import Budget, PrivacyCost, open_ledger
    from dpaccount.ledger_cli import ledger_main

    url = f"sqlite:///{tmp_path / 'l.db'}"
    with open_ledger(url, name="L", budget=Budget(1), create=True) as acct:
        acct.charge(PrivacyCost("0.1"))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert ledger_main(["ledger", "verify", url, "--name", "L"], out=io.StringIO()) == 0
        assert gc.isenabled() is enabled
        with sqlite3.connect(tmp_path / "l.db") as conn:  # verification now fails inside
            conn.execute("DROP TRIGGER records_append_only_update")
            conn.execute("UPDATE records SET payload = replace(payload, 'basic', 'Basic')")
        conn.close()
        assert ledger_main(["ledger", "verify", url, "--name", "L"], out=io.StringIO()) == 1
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


# -- file errors: one line and a non-zero exit, never a traceback (issue 28, item 4) --------


@pytest.fixture
def ledger_file(tmp_path: Path) -> str:
    """A SQLite ledger 'L' with one charge, and some files that are not what they seem."""
    from dpaccount import Budget, PrivacyCost, open_ledger

    url = f"sqlite:///{tmp_path / 'l.db'}"
    with open_ledger(url, name="L", budget=Budget(1), create=True) as acct:
        acct.charge(PrivacyCost("0.1"))
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "garbage").write_bytes(b"\xff\xfenot json")
    (tmp_path / "text").write_text("hello\n")
    (tmp_path / "list.json").write_text("[1, 2]\n")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "a-folder.html").mkdir()
    return url


FILE_ERRORS = [
    # (arguments after "ledger"; the path the line must name; what it must say to do)
    (["export", "{url}", "--name", "L", "--output", "{tmp}/missing/x.json"],
     "{tmp}/missing/x.json", "does not exist: create it first"),
    (["export", "{url}", "--name", "L", "--output", "{tmp}"], "{tmp}",
     "it is a folder: give --output a file name"),
    (["export", "{url}", "--name", "L", "--format", "csv", "--output", "{tmp}/a-file/x.csv"],
     "{tmp}/a-file/x.csv", "is a file, not a folder"),
    (["export", "{url}", "--name", "L", "--output", "/dev/full"], "/dev/full",
     "the disk is full"),
    (["checkpoint", "{url}", "--name", "L", "--output", "{tmp}/missing/p.json"],
     "{tmp}/missing/p.json", "create it first"),
    (["checkpoint", "{url}", "--name", "L", "--output", "/dev/full"], "/dev/full",
     "what was written is incomplete: delete it"),
    (["report", "{url}", "--name", "L", "--output", "{tmp}/missing/r.html"],
     "{tmp}/missing/r.html", "create it first"),
    (["report", "{url}", "--name", "L", "--output", "{tmp}/missing/r.png"],
     "{tmp}/missing/r.png", "create it first"),
    (["report", "{url}", "--name", "L", "--output", "{tmp}/a-folder.html"],
     "{tmp}/a-folder.html", "it is a folder"),
    (["report", "{url}", "--name", "L", "--output", "{tmp}/r.txt"], "{tmp}/r.txt",
     "a report is a page (.html) or an image"),
    (["verify", "{url}", "--name", "L", "--key-file", "{tmp}/missing.key"],
     "{tmp}/missing.key", "give the file that holds this ledger's key"),
    (["verify", "{url}", "--name", "L", "--key-file", "{tmp}"], "{tmp}",
     "give the file that holds this ledger's key"),
    (["show", "{url}", "--name", "L", "--key-file", "{tmp}/garbage"], "{tmp}/garbage",
     "make one with `dpaccount ledger keygen"),
    (["verify", "{url}", "--name", "L", "--checkpoint", "{tmp}/missing.json"],
     "{tmp}/missing.json", "give the file `dpaccount ledger checkpoint --output` wrote"),
    (["verify", "{url}", "--name", "L", "--checkpoint", "{tmp}/text"], "{tmp}/text",
     "is not JSON"),
    (["verify", "{url}", "--name", "L", "--checkpoint", "{tmp}/list.json"],
     "{tmp}/list.json", "is not a dpaccount head checkpoint"),
    (["verify", "--export", "{tmp}/missing.json"], "{tmp}/missing.json",
     "give the file `dpaccount ledger export --format json` wrote"),
    (["verify", "--export", "{tmp}/garbage"], "{tmp}/garbage", "is not UTF-8 text"),
    (["verify", "--export", "{tmp}/text"], "{tmp}/text", "is not JSON (Expecting value"),
    (["verify", "--export", "{tmp}/deep.json"], "{tmp}/deep.json",
     "is not JSON that can be read"),
    (["verify", "--export", "{tmp}"], "{tmp}", "Is a directory"),
    (["keygen", "--output", "{tmp}/l.db"], "{tmp}/l.db",
     "a key file is never overwritten: give a new file name"),
    (["keygen", "--output", "{tmp}/missing/k.hex"], "{tmp}/missing/k.hex", "create it first"),
]


@pytest.mark.parametrize(("argv", "path", "todo"), FILE_ERRORS,
                         ids=[" ".join(a[:1] + a[-2:]) for a, _, _ in FILE_ERRORS])
def test_a_file_error_is_one_line_naming_the_path_and_what_to_do(
    argv: list[str], path: str, todo: str, ledger_file: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "/dev/full" in argv and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    before = sorted(p.name for p in tmp_path.iterdir())
    status = main(["ledger", *(a.format(url=ledger_file, tmp=tmp_path) for a in argv)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err.count("\n") == 1 and captured.err.startswith("dpaccount: ")
    assert repr(path.format(tmp=tmp_path)) in captured.err
    assert todo in captured.err, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing was created


def test_an_output_path_is_checked_before_the_ledger_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The ledger does not exist either: the output is refused first (and nothing read).
    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["ledger", "export", url, "--output", str(tmp_path / "no" / "x.json")]) == 2
    assert "cannot write --output" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_a_plot_into_a_missing_folder_is_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "c.png"
    assert main(["plot", "composition", "--epsilon", "0.1", "--count", "5",
                 "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and repr(str(target)) in err and "Traceback" not in err
