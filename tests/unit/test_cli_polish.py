"""Command-line and API papercuts (issue 29, item 5): suggestions for a misspelt ledger
name (only among names the caller may read), errors that name the flag to fix, the
report's default file, and a duplicate query's honest message."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest
from storage_helpers import PG_URL, pg_schema

from dpaccount import Budget, DuplicateQueryError, PrivacyCost, open_ledger
from dpaccount.cli import main
from dpaccount.errors import ConfigError, StorageError
from dpaccount.ledger_cli import ledger_main
from dpaccount.ledgers import did_you_mean


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return ledger_main(["ledger", *argv], out=out), out.getvalue()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite database holding the ledgers 'census', 'census/team-a' and 'payroll'."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with open_ledger(url, name="census", budget=1) as acct:
        acct.charge(PrivacyCost("0.1"), label="count")
    open_ledger(url, name="census/team-a", budget="0.5", parent="census").close()
    open_ledger(url, name="payroll", budget=2).close()
    return url


# -- did you mean ------------------------------------------------------------------------------


class _Names:
    def __init__(self, *names: str) -> None:
        self._names = list(names)

    def names(self) -> list[str]:
        return self._names


def test_suggestions_are_close_names_only() -> None:
    store = _Names("census", "census-2025", "payroll", "marketing")
    assert did_you_mean("cenus", store) == "; did you mean 'census' or 'census-2025'?"
    assert did_you_mean("payrol", store) == "; did you mean 'payroll'?"
    assert did_you_mean("zzz", store) == ""  # nothing close: no guess
    assert did_you_mean("census", _Names("census")) == ""  # never the name itself
    assert did_you_mean("census", object()) == ""  # a store that cannot list names


def test_a_store_that_refuses_to_list_gives_no_suggestion() -> None:
    class Refusing:
        def names(self) -> list[str]:
            raise StorageError("permission denied for table ledgers")

    assert did_you_mean("census", Refusing()) == ""


@pytest.mark.parametrize("command", [
    ["show"], ["verify"], ["export"], ["checkpoint", "--output", "{tmp}/p.json"],
    ["report", "--output", "{tmp}/r.html"],
])
def test_every_ledger_command_suggests_a_misspelt_name(
        url: str, tmp_path: Path, command: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(tmp=tmp_path) for a in command]
    status, out = cli(args[0], url, "--name", "censsu", *args[1:])
    err = capsys.readouterr().err
    assert status == 2 and out == ""
    assert "no ledger named 'censsu'" in err and "did you mean 'census'?" in err, err
    assert "(check --name)" in err


def test_open_ledger_suggests_a_misspelt_name(url: str) -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'census'\?; or give budget="):
        open_ledger(url, name="cencus")
    with pytest.raises(ConfigError, match=r"did you mean 'census'\?"):
        open_ledger(url, name="cencus", read_only=True)
    with pytest.raises(StorageError, match=r"did you mean 'payroll'\? \(create=False"):
        open_ledger(url, name="payrol", budget=1, create=False)
    with pytest.raises(ConfigError, match=r"parent ledger 'censsu' .*did you mean 'census'"):
        open_ledger(url, name="census/team-b", budget="0.1", parent="censsu")
    with pytest.raises(ConfigError) as far:
        open_ledger(url, name="zzz")
    assert "did you mean" not in str(far.value)


def test_suggestions_come_only_from_ledgers_the_role_may_read(
        capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg

    for schema in pg_schema():
        owner = f"{PG_URL}?schema={schema}"
        for name in ("census", "census-2025"):
            open_ledger(owner, name=name, budget=1).close()
        role = f"dpacct_role_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            assert cli("grant", owner, "--name", "census-2025", "--role", role,
                       "--as", "auditor")[0] == 0
            status, _ = cli("grant", owner, "--name", "census-2026", "--role", role,
                            "--as", "auditor")
            assert status == 2  # grant: the owner's view, both names
            assert "did you mean 'census-2025' or 'census'? (check --name)" in (
                capsys.readouterr().err)
            as_role = owner.replace("//postgres@", f"//{role}@", 1)
            with pytest.raises(ConfigError) as caught:
                open_ledger(as_role, name="census", read_only=True)
            # 'census' exists, but this role may not read it: not suggested, not revealed
            assert "did you mean 'census-2025'?" in str(caught.value)
            with pytest.raises(ConfigError) as caught:
                open_ledger(as_role, name="census-2026", read_only=True)
            assert str(caught.value).count("'census") == 2  # 'census-2026', 'census-2025'
            assert "did you mean 'census-2025'?" in str(caught.value)
            with pytest.raises(ConfigError) as caught:
                open_ledger(owner, name="census-2026")  # the owner reads both
            assert "did you mean 'census-2025' or 'census'?" in str(caught.value)
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE usename = %s", (role,))
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE "{role}"')


# -- flags named in errors -----------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "says"), [
    (["compose", "--rule", "advanced", "--epsilon", "0.1", "--count", "3"],
     "give --delta-slack: the 'advanced' rule needs a slack delta (e.g. --delta-slack 1e-6)"),
    (["compose", "--rule", "advanced", "--epsilon", "0.1", "--count", "3",
      "--delta-slack", "1"], "--delta-slack '1': must be in [0, 1)"),
    (["compose", "--rule", "basic", "--epsilon", "-1", "--count", "3"], "--epsilon '-1'"),
    (["compose", "--rule", "basic", "--epsilon", "1", "--delta", "2", "--count", "3"],
     "--delta '2': must be in [0, 1)"),
])
def test_compose_errors_name_the_flag(argv: list[str], says: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "delta_slack" not in err, err


# -- the report's default file -------------------------------------------------------------------


def test_report_without_output_writes_name_report_html_here(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    status, out = cli("report", url, "--name", "census")
    assert status == 0 and out.startswith("wrote census-report.html (the default")
    assert (here / "census-report.html").read_text().startswith("<!DOCTYPE html>")
    status, out = cli("report", url, "--name", "census/team-a")  # a share: one file, here
    assert status == 0 and (here / "census_team-a-report.html").is_file()
    status, out = cli("report", url, "--all")
    assert status == 0 and (here / "ledgers-report.html").is_file()
    status, out = cli("report", url, "--name", "census", "--output", "mine.html")
    assert out == "wrote mine.html\n"


# -- a duplicate query's message ----------------------------------------------------------------


def test_a_duplicate_query_says_what_the_ledger_keeps_and_what_to_do() -> None:
    with open_ledger("memory://", name="jobs", budget=Budget(1)) as acct:
        acct.charge(PrivacyCost("0.1"), query_id="nightly/2026-11-26")
        with pytest.raises(DuplicateQueryError) as caught:
            acct.charge(PrivacyCost("0.1"), query_id="nightly/2026-11-26")
    text = str(caught.value)
    assert "first answer" not in text  # the ledger never had it
    for part in ("already charged (record 0, ", "UTC)", "nothing was charged again",
                 "keeps the charge", "not the answer", "reuse the answer your job stored",
                 "new query_id"):
        assert part in text, part
