"""One redaction for every message (issue 28, item 2): fuzzed connection strings, and
every entry point given a secret-bearing URL.

Passwords are any printable text (``@ : / ? # ' \\ =``, whitespace, quotes, non-ASCII),
with marker characters (``MARKERS``) spread through them that no other part of a text
ever holds: a marker in the output is a leaked piece of the password. Each form is
built the way its own parser reads it, and that parser (``urllib.parse``, libpq's
``PQconninfoParse``, ``shlex``, ``json``, ``ast``) checks that the text holds the
password, so the redaction is tested against an independent reading of the form.
"""

from __future__ import annotations

import ast
import io
import json
import shlex
import traceback
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlsplit

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dpaccount._redact import (
    MASK,
    redact,
    redact_driver_error,
    redact_libpq,
    redact_url,
    secrets_of,
)
from dpaccount.errors import ConfigError, DPAccountError, StorageError
from dpaccount.ledgers import open_ledger, open_store

MARKERS = "$~^|€ß漢😀"
_TRICKY = [*"@:/?#'\\ =&%\";,*[]{}", "\t", "\u3000", "\xa0"]
_PRINTABLE = st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"),
                           blacklist_characters=MARKERS)
_CHUNK = st.text(st.one_of(_PRINTABLE, st.sampled_from(_TRICKY)), max_size=6)


@st.composite
def passwords(draw: st.DrawFn) -> str:
    """Any printable text with at least one marker in it (and often several)."""
    parts = draw(st.lists(st.tuples(_CHUNK, st.sampled_from(MARKERS)), min_size=1,
                          max_size=4))
    return "".join(chunk + marker for chunk, marker in parts) + draw(_CHUNK)


def no_whitespace(text: str) -> str:
    return "".join("_" if char.isspace() else char for char in text)


_WORDS = ("pass", "pwd", "secret", "token", "credential", "key")
names = st.from_regex(r"[a-z][a-z0-9]{2,8}", fullmatch=True).filter(
    lambda name: not any(word in name for word in _WORDS)
)
#: Text around a connection string: no marker, nothing that reads as NAME= or NAME:.
surrounding = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789 .,;!()-"),
                      max_size=30)
schemes = st.sampled_from(["postgresql", "postgres", "sqlite", "mysql", "jdbc:postgresql",
                           "postgresql+psycopg", "x-odd.scheme"])
hosts = st.one_of(names, st.sampled_from(["[::1]", "[2001:db8::7]", "127.0.0.1"]))
ports = st.sampled_from(["", ":5432", ":1"])


def leaks(output: str, password: str) -> list[str]:
    """The pieces of ``password`` in ``output``: any marker (raw or percent-encoded),
    or the whole password (raw or percent-encoded)."""
    found = [m for m in MARKERS if m in output or quote(m, safe="") in output]
    found += [form for form in (password, quote(password, safe="")) if form in output]
    return found


def libpq_quoted(value: str) -> str:
    """A libpq keyword value in single quotes (backslash escapes ``\\`` and ``'``)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def libpq_escaped(value: str) -> str:
    """A libpq keyword value unquoted, each special character escaped by a backslash."""
    return "".join("\\" + c if c.isspace() or c in "\\'\"" else c for c in value)


def libpq_reading(conninfo: str) -> dict[str, str] | None:
    """What libpq reads from a connection string (None: it cannot parse it)."""
    psycopg = pytest.importorskip("psycopg")
    try:
        options = psycopg.pq.Conninfo.parse(conninfo.encode())
    except psycopg.Error:
        return None
    return {o.keyword.decode(): o.val.decode() for o in options if o.val is not None}


# -- the forms ------------------------------------------------------------------------------


@given(scheme=schemes, user=names, password=passwords(), host=hosts, port=ports, db=names,
       before=surrounding, after=surrounding)
def test_a_percent_encoded_url_password_never_shows_and_the_rest_is_kept(
    scheme: str, user: str, password: str, host: str, port: str, db: str, before: str,
    after: str,
) -> None:
    url = f"{scheme}://{user}:{quote(password, safe='')}@{host}{port}/{db}?sslmode=require"
    parts = urlsplit(url.removeprefix("jdbc:"))
    assert (parts.username, parts.password) == (user, quote(password, safe=""))
    for output in (redact_url(url), redact(f"{before} {url} {after}")):
        assert leaks(output, password) == []
        assert f"{user}:{MASK}@{host}{port}/{db}?sslmode=require" in output


@given(scheme=schemes, user=names, password=passwords(), host=hosts, db=names,
       before=surrounding, after=surrounding)
def test_a_raw_url_password_never_shows(
    scheme: str, user: str, password: str, host: str, db: str, before: str, after: str
) -> None:
    # Not percent-encoded: '@', ':', '/', '?', '#', quotes, '=' and (whole) whitespace.
    whole = f"{scheme}://{user}:{password}@{host}/{db}"
    assert leaks(redact_url(whole), password) == []
    assert leaks(redact(whole), password) == [] or any(c.isspace() for c in password)
    raw = no_whitespace(password)
    embedded = f"{before} {scheme}://{user}:{raw}@{host}/{db} {after}"
    output = redact(embedded)
    assert leaks(output, raw) == []
    if not any(c in raw for c in "'\"="):  # else a NAME=' inside it may redact more
        assert f"{user}:{MASK}@{host}/{db}" in output


@given(user=names, password=passwords(), host=names, db=names)
@example(user="app", password="@$ ", host="db", db="x")  # 'u:x@$ @db': '$' looked a host
@example(user="app", password="@a $", host="db", db="x")  # and 'a' looks like one
def test_a_url_password_with_whitespace_is_found_in_free_text(
    user: str, password: str, host: str, db: str
) -> None:
    # The URL ends at whitespace in free text; a password that holds whitespace (and does
    # not read as a port before it) runs to the last '@' of the line instead.
    text = f"failed: postgresql://{user}:x{password}@{host}/{db}\nnext line"
    output = redact(text)
    assert leaks(output, password) == []
    assert output.endswith(f"@{host}/{db}\nnext line")


@given(host=names, db=names, first=passwords(), second=passwords(),
       name=st.sampled_from(["password", "PassWord", "sslpassword", "PASSFILE",
                             "p%61ssword", "%70assword"]))
def test_secret_query_parameters_never_show_in_any_case_repeated_or_encoded(
    host: str, db: str, first: str, second: str, name: str
) -> None:
    url = (f"postgresql://{host}/{db}?sslmode=require&{name}={quote(first, safe='')}"
           f"&application_name=app&password={quote(second, safe='')}")
    read = parse_qsl(urlsplit(url).query)
    assert (read[1][1], read[3][1]) == (first, second)
    for output in (redact_url(url), redact(f"see {url} now")):
        assert leaks(output, first) == [] and leaks(output, second) == []
        assert f"//{host}/{db}?sslmode=require&" in output
        assert "&application_name=app&" in output


@given(host=names, db=names, user=names, password=passwords(),
       write=st.sampled_from([libpq_quoted, libpq_escaped]),
       equals=st.sampled_from(["=", " = ", "  =", "=  "]), at=st.integers(0, 3),
       before=surrounding)
# an escaped quote inside quotes, an escaped space outside them
@example(host="db", db="census", user="app", password="' $", write=libpq_quoted,
         equals="=", at=3, before="")
@example(host="db", db="census", user="app", password="a $", write=libpq_escaped,
         equals="=", at=0, before="")
def test_a_libpq_keyword_string_password_never_shows(
    host: str, db: str, user: str, password: str, write: Callable[[str], str], equals: str,
    at: int, before: str
) -> None:
    fields = [f"host={host}", f"dbname={db}", f"user={user}"]
    fields.insert(at, f"password{equals}{write(password)}")
    conninfo = " ".join(fields)
    reading = libpq_reading(conninfo)
    assert reading is not None and reading["password"] == password
    assert (reading["host"], reading["dbname"], reading["user"]) == (host, db, user)
    for output in (redact_url(conninfo), redact(f"{before} {conninfo}"),
                   redact_libpq(conninfo, conninfo)):
        assert leaks(output, password) == []
        assert all(part in output for part in fields if not part.startswith("password"))
    assert password in secrets_of(conninfo)


@given(host=names, db=names, password=passwords(),
       variable=st.sampled_from(["PGPASSWORD", "PGSSLPASSWORD", "export PGPASSWORD"]))
def test_an_environment_fragment_never_shows_its_password(
    host: str, db: str, password: str, variable: str
) -> None:
    text = f"{variable}={shlex.quote(password)} psql -h {host} -d {db}"
    assert shlex.split(text)[-6].split("=", 1)[1] == password
    output = redact(text)
    assert leaks(output, password) == []
    if "\\" not in password:  # a backslash in shell quotes escapes nothing; libpq's does
        assert output.endswith(f"psql -h {host} -d {db}")


@given(secret=st.binary(min_size=32, max_size=64), before=surrounding)
def test_the_ledger_key_never_shows(secret: bytes, before: str) -> None:
    text = f"{before} DPACCOUNT_LEDGER_KEY={secret.hex()} dpaccount ledger verify"
    output = redact(text)
    assert secret.hex() not in output
    assert output.endswith("DPACCOUNT_LEDGER_KEY=*** dpaccount ledger verify")


@given(host=names, password=passwords(), ascii_only=st.booleans())
def test_json_and_repr_forms_never_show_the_password(
    host: str, password: str, ascii_only: bool
) -> None:
    settings = {"host": host, "password": password, "port": 5432}
    as_json = json.dumps(settings, ensure_ascii=ascii_only)
    as_repr = repr(settings)
    assert json.loads(as_json) == settings and ast.literal_eval(as_repr) == settings
    for output in (redact(as_json), redact(as_repr)):
        assert leaks(output, password) == []
        assert host in output and "5432" in output


@given(first=passwords(), second=passwords(), hosts=st.tuples(names, names),
       between=surrounding)
def test_several_urls_in_one_text_each_lose_their_password(
    first: str, second: str, hosts: tuple[str, str], between: str
) -> None:
    text = (f"copy postgresql://a:{quote(first, safe='')}@{hosts[0]}/db {between} into "
            f"sqlite://b:{no_whitespace(second)}@{hosts[1]}/db")
    output = redact(text)
    assert leaks(output, first) == [] and leaks(output, no_whitespace(second)) == []
    assert f"a:***@{hosts[0]}/db" in output


@given(password=passwords(), host=names,
       form=st.sampled_from([
           "host={host} password={pw}",            # unquoted: libpq splits at whitespace
           "host={host} password='{pw}",           # an unterminated quote
           "postgresql://u:{pw}@{host}/db",         # raw, maybe unparsable
           "postgresql://u@{host}/db?password={pw}",
       ]))
@example(password="a $", host="db", form="host={host} password={pw}")  # 'after "$"'
@example(password="r $", host="db", form="host={host} password={pw}")  # 'afte***'
@example(password="a@$", host="db", form="postgresql://u:{pw}@{host}/db")
def test_libpq_messages_about_any_connection_string_never_quote_its_password(
    password: str, host: str, form: str
) -> None:
    # libpq's own parse errors quote the piece it cannot read ('missing "=" after "b"').
    psycopg = pytest.importorskip("psycopg")
    conninfo = form.format(pw=password, host=host)
    try:
        psycopg.pq.Conninfo.parse(conninfo.encode())
    except psycopg.Error as exc:
        message, chain = redact_driver_error(exc, conninfo)
        assert leaks(message, password) == []
        assert leaks(redact_libpq(str(exc), conninfo), password) == []
        if leaks(str(exc), password):
            assert not chain


def test_what_cannot_be_parsed_is_redacted_more() -> None:
    assert redact_url("postgresql://u:pw@[::1/db") == "<an unparsable URL>"
    assert redact_url("postgresql://u:p/w@h:5432/db") == "<an unparsable URL>"
    assert redact("password='never closed and more text") == "password=***"
    assert redact("at postgresql://h:notaport/db") == "at postgresql://h:***/db"
    # What holds nothing secret is kept exactly as written.
    for text in ("sqlite:///ledger.db", "postgresql://h:5432/db?sslmode=require",
                 "postgresql://[::1]:5432/db", "LedgerKey(key_id='4fe7e75b843e2a7b')",
                 "the key: a ledger", "password authentication failed for user \"u\""):
        assert redact(text) == text and redact_url(text) == text


def test_a_translated_libpq_parse_error_quotes_nothing() -> None:
    # libpq's messages may be translated: psycopg's ProgrammingError for a connection
    # string it cannot parse is scrubbed whatever its language.
    psycopg = pytest.importorskip("psycopg")
    german = psycopg.ProgrammingError(
        'fehlendes "=" nach "zweiteshälfte" in der Zeichenkette der Verbindungsinformationen'
    )
    message, chain = redact_driver_error(german, "host=h password=erste zweiteshälfte")
    assert "zweiteshälfte" not in message and "erste" not in message and not chain


def test_a_driver_error_whose_chain_quotes_the_password_is_not_chained() -> None:
    conninfo = "postgresql://u:hunter2@h/db"
    try:
        try:
            raise ValueError("postgresql://u:hunter2@h/db is wrong")
        except ValueError:
            raise OSError("connection refused") from None  # quotes nothing itself
    except OSError as exc:
        message, chain = redact_driver_error(exc, conninfo)
    assert message == "connection refused" and not chain  # its __context__ quotes it


# -- every entry point, end to end ------------------------------------------------------------

CANARY = "hunter2€"
ENCODED = quote(CANARY, safe="")

#: Secret-bearing ledger URLs that cannot be opened, each for its own reason.
BAD_URLS = [
    f"host=db dbname=census user=app password={CANARY}",
    f"host=db dbname=census user=app password='{CANARY} x\\'y'",
    f"sqlite://user:{ENCODED}@host/db",
    f"sqlite:///ledger.db?password={ENCODED}",
    f"postgresql://u:{ENCODED}@127.0.0.1:1/x?connect_timeout=1",
    f"postgresql://u@127.0.0.1:1/x?password={ENCODED}&connect_timeout=1",
    f"postgresql://u:{CANARY}%zz@127.0.0.1:1/x",
    f"postgresql://u:{ENCODED}@[::1/x",
    f"postgresql://u:{ENCODED}@h:12x/x",
    f"postgresql://u:{ENCODED}@127.0.0.1:1/x?bogus=1",
    f"mysql://u:{ENCODED}@h/x",
    f"postgresql://u:{CANARY}@{CANARY}@127.0.0.1:1/x?connect_timeout=1",
]


def exception_texts(exc: BaseException) -> Iterator[str]:
    """Everything an exception and its chain can show: str, repr, args, the traceback."""
    yield "".join(traceback.format_exception(exc))
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        error = stack.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield str(error)
        yield repr(error)
        yield from (repr(arg) for arg in error.args)
        yield from (str(value) for value in vars(error).values())
        stack += [e for e in (error.__cause__, error.__context__) if e is not None]


def assert_no_canary(*texts: str) -> None:
    for text in texts:
        for form in (CANARY, ENCODED, "hunter2"):
            assert form not in text, text


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("entry", ["open_store", "open_ledger", "open_ledger_budget"])
def test_opening_a_bad_url_raises_nothing_that_holds_the_password(url: str,
                                                                  entry: str) -> None:
    if "postgresql" in url:
        pytest.importorskip("psycopg")
    with pytest.raises(DPAccountError) as caught:
        if entry == "open_store":
            open_store(url, name="L")
        elif entry == "open_ledger":
            open_ledger(url, name="L")
        else:
            open_ledger(url, name="L", budget=1)
    assert isinstance(caught.value, ConfigError | StorageError)
    assert_no_canary(*exception_texts(caught.value))


LEDGER_COMMANDS = [
    ["list", "{url}"],
    ["show", "{url}", "--name", "L"],
    ["show", "{url}", "--name", "L", "--summary"],
    ["verify", "{url}", "--name", "L"],
    ["checkpoint", "{url}", "--name", "L", "--output", "{tmp}/point.json"],
    ["export", "{url}", "--name", "L", "--output", "{tmp}/export.json"],
    ["export", "{url}", "--name", "L", "--format", "csv"],
    ["report", "{url}", "--name", "L", "--output", "{tmp}/report.html"],
    ["report", "{url}", "--all", "--output", "{tmp}/all.html"],
]


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``dpaccount ...`` as the console script runs it: status, stdout and stderr."""
    from dpaccount.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            status = int(exit_.code or 0)
    return status, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("command", LEDGER_COMMANDS, ids=lambda c: " ".join(c[:1] + c[3:4]))
@pytest.mark.parametrize("url", BAD_URLS)
def test_every_ledger_command_given_a_bad_url_prints_no_password(
    command: list[str], url: str, tmp_path: Path
) -> None:
    if "postgresql" in url:
        pytest.importorskip("psycopg")
    argv = ["ledger", *(a.format(url=url, tmp=tmp_path) for a in command)]
    status, printed = run_cli(argv)
    assert status == 2
    assert printed.startswith("dpaccount: ") and printed.count("\n") == 1, printed
    assert "Traceback" not in printed
    assert_no_canary(printed)


def test_an_unquoted_keyword_string_on_the_command_line_is_not_echoed() -> None:
    # The shell splits it: argparse would list the extra words as unrecognized.
    status, printed = run_cli(["ledger", "list", "host=db", f"password={CANARY}", "x"])
    assert status == 2 and "unrecognized arguments" in printed
    assert_no_canary(printed)


@pytest.fixture
def secret_pg_url() -> Iterator[str]:
    """The test server's URL with a password in it, in a fresh schema (the server trusts
    local connections: the password is sent and ignored)."""
    from storage_helpers import PG_URL, pg_schema

    parts = urlsplit(PG_URL)
    for schema in pg_schema():
        netloc = f"{parts.username}:{ENCODED}@{parts.hostname}:{parts.port or 5432}"
        yield f"postgresql://{netloc}{parts.path}?schema={schema}&connect_timeout=5"


def test_a_working_url_with_a_password_shows_it_nowhere(secret_pg_url: str,
                                                        tmp_path: Path) -> None:
    from dpaccount import PrivacyCost

    with open_ledger(secret_pg_url, name="L", budget=1) as acct:
        acct.charge(PrivacyCost("0.25"), label="count")
        assert_no_canary(repr(acct), repr(acct.store))
    printed_all = []
    for command in LEDGER_COMMANDS:
        argv = ["ledger", *(a.format(url=secret_pg_url, tmp=tmp_path) for a in command)]
        status, printed = run_cli(argv)
        assert status == 0, printed
        printed_all.append(printed)
    files = [p.read_text(encoding="utf-8") for p in sorted(tmp_path.iterdir())]
    assert len(files) == 4  # checkpoint, export, two reports
    assert "postgresql://postgres:***@" in files[0]  # all.html names the database
    assert_no_canary(*printed_all, *files)
    # A wrong password in a URL that connects: nothing breaks, nothing shows.
    status, printed = run_cli(["ledger", "verify", secret_pg_url, "--name", "nope"])
    assert status == 2 and "no ledger named 'nope' at postgresql://postgres:***@" in printed
    assert_no_canary(printed)


def test_a_postgres_store_given_a_malformed_conninfo_chains_nothing_that_quotes_it() -> None:
    pytest.importorskip("psycopg")
    from dpaccount.storage.postgres import PostgresStore

    for conninfo in (f"host=127.0.0.1 port=1 password={CANARY} x", f"password='{CANARY}",
                     f"postgresql://u:{CANARY}%zz@127.0.0.1:1/x",
                     # a raw '@': libpq ends the password at the first one, and names
                     # the rest as the host it cannot find
                     f"postgresql://u:{CANARY}@{CANARY}@127.0.0.1:1/x?connect_timeout=1",
                     f"postgresql://u:{ENCODED}@127.0.0.1:1/x?connect_timeout=1"):
        with pytest.raises(StorageError) as caught:
            PostgresStore(conninfo, name="L")
        assert_no_canary(*exception_texts(caught.value))


def test_the_html_report_redacts_its_title() -> None:
    from dpaccount.audit import html_report

    page = html_report([], title=f"ledgers at postgresql://u:{ENCODED}@db/x")
    assert_no_canary(page)
    assert "postgresql://u:***@db/x" in page


@given(password=passwords())
def test_a_query_string_password_reaches_libpq_as_written(password: str) -> None:
    # urlencode wrote a space as '+', which libpq does not decode: 'a b' arrived as 'a+b'.
    import dpaccount.storage.postgres as postgres

    seen: list[str] = []

    class Recorder:
        def __init__(self, conninfo: str, **_: object) -> None:
            seen.append(conninfo)

    original = postgres.PostgresStore
    postgres.PostgresStore = Recorder  # type: ignore[misc, assignment]
    try:
        open_store(f"postgresql://u@db/x?sslmode=disable&password={quote(password, safe='')}")
    finally:
        postgres.PostgresStore = original  # type: ignore[misc]
    reading = libpq_reading(seen[0])
    assert reading is not None and reading["password"] == password
