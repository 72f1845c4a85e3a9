"""One redaction for every message: credentials out of connection strings, and out of any
text that embeds one.

Every error, command-line line, report, repr and log line that may quote a ledger URL, a
libpq connection string or a shell fragment goes through `redact` (a string known to be
one whole URL or connection string through `redact_url`; a database driver's error
through `redact_driver_error`). A log call does the same: ``log.info(redact(text))``.

What is replaced by ``***``:

* the password of a URL's userinfo, ``scheme://user:PASSWORD@host`` (any scheme; the
  password may hold ``@``, ``:``, ``/``, ``?``, ``#`` or percent-encoding: it runs to
  the *last* ``@`` of the URL);
* the value of every parameter whose name names a secret, whatever its case or
  percent-encoding: a name holding ``pass``, ``pwd``, ``secret``, ``token`` or
  ``credential``, or ending in ``key`` (``password``, ``sslpassword``, ``passfile``,
  ``PGPASSWORD``, ``DPACCOUNT_LEDGER_KEY``, ``api_key``, ...), written ``NAME=VALUE``
  (a URL's query string, a libpq keyword/value string with or without spaces around
  ``=``, a shell assignment) or ``NAME: VALUE`` (JSON, YAML, a dict's repr; an
  unquoted name ending in ``key`` counts only before ``=``). A query
  string's value ends at ``&``, ``#`` or whitespace; any other value is read as one
  shell word: quoted parts (``'...'`` or ``"..."``, a backslash escaping the next
  character, as libpq reads them) and unquoted parts up to unescaped whitespace;
* every secret the caller names (``secrets``), also percent-encoded.

It is conservative: what cannot be parsed is redacted more, never less. A quoted value
that is never closed is redacted to the end of the text; a URL that Python cannot split
is replaced whole by ``<an unparsable URL>`` (`redact_url`); a URL ``scheme://user:X``
whose ``X`` is no port and that has no ``@`` is redacted from the ``:`` on. In free
text a URL's password runs to the last ``@`` before the next URL on its line (it may
hold whitespace), so an ``@`` later on the line (an e-mail address) takes the host with
it. What it cannot know: a raw (not percent-encoded) password that holds whitespace
after a run of digits (``u:12 34@host``) reads as ``host:port``; dpaccount's own
messages redact a whole URL with `redact_url` before they quote it.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator
from typing import Final
from urllib.parse import quote, quote_plus, unquote, urlsplit

__all__ = [
    "MASK",
    "UNPARSABLE_URL",
    "redact",
    "redact_driver_error",
    "redact_libpq",
    "redact_url",
    "secrets_of",
]

#: What a secret is replaced by.
MASK: Final = "***"
#: What a URL that cannot be split is replaced by.
UNPARSABLE_URL: Final = "<an unparsable URL>"

#: The characters of a URL scheme after its first letter (RFC 3986).
_SCHEME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "+.-")
#: The separator of ``NAME=VALUE`` or ``NAME: VALUE`` (not the ``:`` of ``scheme://``).
_SEPARATOR = re.compile(r"=|:(?!//)")
_WHITESPACE = re.compile(r"\s")
_LINE_BREAK = re.compile(r"[\n\r]")
#: Names of secrets (matched against the lower-cased, percent-decoded name).
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|credential|key$")
#: The secret names that count before an unquoted ``:`` too (``password: x``); a bare
#: ``key:`` is English more often than YAML (``the key: a ledger ...``).
_SECRET_WORD = re.compile(r"pass|pwd|secret|token|credential")
#: libpq's messages about a connection string it cannot parse: they quote parts of it.
_LIBPQ_PARSE = re.compile(
    r"connection info string|URI|percent-encoded|connection option|port number", re.I
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every credential it embeds replaced by ``***`` (see the module).

    Args:
        text: Any text: a message, a command-line line, a log line.
        secrets: Values known to be secret (a connection's password, see `secrets_of`):
            every occurrence, also percent-encoded, is replaced too.

    Examples:
        >>> redact("cannot reach postgresql://app:hunter2@db/census?sslmode=require")
        'cannot reach postgresql://app:***@db/census?sslmode=require'
        >>> redact("host=db dbname=census user=app password='a b\\\\'c' sslmode=require")
        'host=db dbname=census user=app password=*** sslmode=require'
        >>> redact("PGPASSWORD=hunter2 psql -h db")
        'PGPASSWORD=*** psql -h db'
    """
    text = str(text)
    spans = [*_url_spans(text, whole=False), *_assignment_spans(text),
             *_known_spans(text, secrets)]
    return _masked(text, spans)


def redact_url(url: str) -> str:
    """The URL (or libpq connection string) with any password replaced by ``***`` (for
    messages, reprs and output); ``<an unparsable URL>`` if Python cannot split it.

    The whole string is taken as one URL: a password may hold any character, whitespace
    included (it runs to the last ``@``).

    Examples:
        >>> redact_url("postgresql://alice:s3cret@db.example/ledgers?sslmode=require")
        'postgresql://alice:***@db.example/ledgers?sslmode=require'
        >>> redact_url("sqlite:///ledger.db")
        'sqlite:///ledger.db'
        >>> redact_url("postgresql://db/census?user=app&PassWord=s3cret")
        'postgresql://db/census?user=app&PassWord=***'
        >>> redact_url("postgresql://app:pw@[::1/census")
        '<an unparsable URL>'
    """
    text = str(url)
    if _next_url(text, 0, len(text)) is not None:
        try:
            urlsplit(text).port  # noqa: B018  # raises ValueError for a bad host or port
        except ValueError:
            return UNPARSABLE_URL
    return _masked(text, [*_url_spans(text, whole=True), *_assignment_spans(text)])


def secrets_of(conninfo: str) -> tuple[str, ...]:
    """The secrets a URL or libpq connection string holds: each password (and other
    secret-named value) as written, percent-decoded and unquoted as libpq reads it.

    Examples:
        >>> secrets_of("postgresql://app:hun%40ter2@db/census")
        ('hun%40ter2', 'hun@ter2')
        >>> secrets_of("host=db password='a b'")
        ("'a b'", 'a b')
    """
    text = str(conninfo)
    found: list[str] = []
    for start, end in _merged([*_url_spans(text, whole=True), *_assignment_spans(text)]):
        raw = text[start:end]
        # and each piece between '@'s: libpq ends a URL's password at the first '@'
        for piece in (raw, *raw.split("@")):
            found += [piece, unquote(piece), _unquoted(piece)]
    return tuple(s for s in dict.fromkeys(found) if s)


def redact_libpq(message: str, conninfo: str, parse_error: bool = False) -> str:
    """A libpq (or psycopg) message about ``conninfo``, redacted: its secrets
    (`secrets_of`) and every URL or parameter in it; if it is about a connection string
    libpq cannot parse (``parse_error``, or one of libpq's English messages saying so),
    whatever it quotes (libpq quotes the offending part, which may be a piece of the
    password) becomes ``"..."``.

    Examples:
        >>> redact_libpq('missing "=" after "b" in connection info string',
        ...              "host=db password=a b")
        'missing "..." in connection info string'
    """
    if parse_error or _LIBPQ_PARSE.search(message):  # first: a short secret splits words
        message = re.sub(r'"[^\n\r]*"', '"..."', message)
    return redact(message, secrets_of(conninfo))


def redact_driver_error(exc: BaseException, conninfo: str) -> tuple[str, bool]:
    """A database driver's error, for a message: its text through `redact_libpq`, and
    whether the error may be kept as the ``__cause__`` of the error that wraps it: only
    if nothing along its chain (``__cause__`` and ``__context__``: each message, its
    ``args`` and the repr of its attributes, where psycopg keeps the failed connection
    with its password) holds a secret. Otherwise the caller raises outside the
    ``except`` block, so that nothing holding the secret is chained (a traceback prints
    the whole chain; an error reporter may record the attributes).

    psycopg raises its base ``ProgrammingError`` (SQL errors are subclasses of it) for a
    connection string libpq cannot parse: its message is treated as a parse error
    whatever its language (libpq's messages may be translated).
    """
    parse_error = type(exc).__name__ == "ProgrammingError"
    clean = all(redact_libpq(text, conninfo, parse_error) == text
                for error in _chain(exc) for text in _texts(error))
    return redact_libpq(str(exc), conninfo, parse_error), clean


# -- the spans to mask ---------------------------------------------------------------------


def _next_url(text: str, pos: int, end: int) -> tuple[int, int] | None:
    """(where the scheme starts, where ``://`` ends) of the first URL in text[pos:end]:
    a scheme of RFC 3986 (a letter, then letters, digits, ``+``, ``.``, ``-``) not
    inside a longer one, then ``://``."""
    while (mark := text.find("://", pos, end)) >= 0:
        start = mark
        while start > 0 and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        if start >= pos and start < mark and text[start].isalpha():
            return start, mark + 3
        pos = mark + 3
    return None


def _url_spans(text: str, *, whole: bool) -> Iterator[tuple[int, int]]:
    """The password of each URL's userinfo (``whole``: the text is one URL, whitespace
    and all; else a URL ends at whitespace, and a password with userinfo at the last
    ``@`` before the next URL on the line)."""
    pos = 0
    while (found := _next_url(text, pos, len(text))) is not None:
        start = pos = found[1]
        token_end = len(text) if whole else _end_of(_WHITESPACE, text, start)
        colon = start
        while colon < token_end and text[colon] not in ":@/?#":
            colon += 1
        if colon >= token_end or text[colon] != ":":
            continue  # no userinfo, or a user without a password
        at = text.rfind("@", colon, token_end)
        if at < 0:
            authority_end = colon + 1
            while authority_end < token_end and text[authority_end] not in "/?#":
                authority_end += 1
            port = text[colon + 1:authority_end]
            if text[start] == "[" or (port.isascii() and port.isdigit()) or not port:
                continue  # host:port (or an IPv6 host) and no userinfo
            at = authority_end if whole else _free_text_at(text, colon, authority_end)
        elif not whole:  # a password with whitespace: 'u:a b@host', even 'u:x@a b@host'
            at = max(at, _last_at(text, colon, token_end))
        if at > colon + 1:
            yield colon + 1, at
        pos = max(pos, at)


def _end_of(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where ``pattern`` next matches from ``start`` (the end of the text if nowhere)."""
    match = pattern.search(text, start)
    return len(text) if match is None else match.start()


def _last_at(text: str, colon: int, token_end: int) -> int:
    """The last ``@`` after ``colon`` and before the next URL on the line (-1: none)."""
    line_end = _end_of(_LINE_BREAK, text, colon)
    following = _next_url(text, token_end, line_end)
    return text.rfind("@", colon, following[0] if following is not None else line_end)


def _free_text_at(text: str, colon: int, authority_end: int) -> int:
    """Where the password of ``scheme://user:X`` (no ``@`` before whitespace, ``X`` no
    port) ends in free text: at the last ``@`` before the next URL on the line, else the
    last ``@`` of the line (its password held whitespace), else the end of the host."""
    at = _last_at(text, colon, authority_end)
    if at < 0:
        at = text.rfind("@", colon, _end_of(_LINE_BREAK, text, colon))
    return at if at >= 0 else authority_end


def _is_name_char(char: str) -> bool:
    return char.isalnum() or char in "_%.-"


def _assignment_spans(text: str) -> Iterator[tuple[int, int]]:
    """The value of each ``NAME=VALUE`` / ``NAME: VALUE`` whose name names a secret
    (the name may be quoted, and may have whitespace before the separator)."""
    pos = 0
    while (separator := _SEPARATOR.search(text, pos)) is not None:
        pos = separator.end()
        name_end = separator.start()
        while name_end > 0 and text[name_end - 1].isspace():
            name_end -= 1
        quote_char = text[name_end - 1] if name_end and text[name_end - 1] in "'\"" else ""
        name_end -= len(quote_char)
        name_start = name_end
        while name_start > 0 and _is_name_char(text[name_start - 1]):
            name_start -= 1
        if quote_char:
            if name_start == 0 or text[name_start - 1] != quote_char:
                continue
            name_start -= 1
        name = unquote(text[name_start + len(quote_char):name_end]).lower()
        loose = separator.group() == ":" and not quote_char
        if not name or not (_SECRET_WORD if loose else _SECRET_NAME).search(name):
            continue
        start = separator.end()
        while start < len(text) and text[start].isspace():
            start += 1
        before = text[name_start - 1] if name_start else ""
        in_query = before != "" and before in "?&"
        end = _query_value_end(text, start) if in_query else _word_end(text, start)
        if end > start:
            yield start, end
        pos = max(end, pos)


def _query_value_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and not text[end].isspace() and text[end] not in "&#":
        end += 1
    return end


def _word_end(text: str, start: int) -> int:
    """The end of one shell word (libpq's reading of a value, and more): quoted parts
    with backslash escapes (unterminated: the rest of the text), backslash escapes, up
    to unescaped whitespace."""
    i, n = start, len(text)
    while i < n:
        char = text[i]
        if char in "'\"":
            i += 1
            while i < n and text[i] != char:
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return n
            i += 1
        elif char == "\\":
            i += 2
        elif char.isspace():
            break
        else:
            i += 1
    return min(i, n)


def _unquoted(word: str) -> str:
    """A shell word as libpq reads a value: quotes removed, backslash escapes applied."""
    out: list[str] = []
    i, quote_char = 0, ""
    while i < len(word):
        char = word[i]
        if char == "\\" and i + 1 < len(word):
            out.append(word[i + 1])
            i += 2
            continue
        if quote_char and char == quote_char:
            quote_char = ""
        elif not quote_char and char in "'\"":
            quote_char = char
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _known_spans(text: str, secrets: Iterable[str]) -> Iterator[tuple[int, int]]:
    forms = {form for secret in secrets if secret
             for form in (secret, quote(secret, safe=""), quote(secret), quote_plus(secret))}
    for form in forms:
        start = text.find(form)
        while start >= 0:
            yield start, start + len(form)
            start = text.find(form, start + 1)


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _masked(text: str, spans: Iterable[tuple[int, int]]) -> str:
    merged = _merged(spans)
    if not merged:
        return text
    parts: list[str] = []
    pos = 0
    for start, end in merged:
        parts += [text[pos:start], MASK]
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


def _texts(error: BaseException) -> Iterator[str]:
    """What an error shows: its message, its arguments and its attributes' reprs."""
    yield str(error)
    for value in (*error.args, *vars(error).values()):
        try:
            yield repr(value)
        except Exception:  # a hostile or broken __repr__ can raise anything
            yield MASK  # taken as holding a secret: the error is not chained


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        error = stack.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        stack += [e for e in (error.__cause__, error.__context__) if e is not None]
