"""Open a durable, shared ledger by URL: the same call for every backend.

| URL | store |
|---|---|
| ``memory://`` | `MemoryStore` |
| ``sqlite:///relative/path.db`` | `SQLiteStore` |
| ``sqlite:////absolute/path.db`` | (four slashes: an absolute path) |
| ``postgresql://user@host:port/db`` | `PostgresStore` |
| ``postgres://...`` | (the same) |

Options go in the query string: ``?lock_timeout=10`` (seconds, every SQL backend),
``?schema=name`` (PostgreSQL: the schema holding the tables, ``dpaccount`` by default)
and ``?commit=group|sync`` (every SQL backend: see `SQLiteStore` and `PostgresStore`).

A keyed ledger (an HMAC chain, see `dpaccount.keys`) takes its key from ``key=`` or,
when that is None, from the ``DPACCOUNT_LEDGER_KEY_FILE`` or ``DPACCOUNT_LEDGER_KEY``
environment variable; a URL never carries a key.

Examples:
    >>> import os, tempfile
    >>> url = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "census.db")
    >>> from dpaccount import PrivacyCost
    >>> acct = open_ledger(url, name="census", budget=1)
    >>> acct.charge(PrivacyCost("0.25"), label="count").seq
    0
    >>> acct.store.close()
    >>> again = open_ledger(url, name="census", budget=1)   # the spend persisted
    >>> again.spent
    PrivacyCost(epsilon=0.25, delta=0)
    >>> again.store.close()
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from dpaccount._redact import redact_libpq, redact_url
from dpaccount.accountant import Accountant, ledger_settings
from dpaccount.charges import Relation
from dpaccount.composition import Rule, rule_from_description
from dpaccount.costs import as_budget
from dpaccount.errors import ConfigError, DPAccountError, LedgerCorruptError, StorageError
from dpaccount.keys import LedgerKey
from dpaccount.records import (
    GENESIS_HASH,
    LedgerMeta,
    LedgerRecord,
    chain_hash,
    check_ledger_name,
)
from dpaccount.storage.base import Store
from dpaccount.storage.memory import MemoryStore

__all__ = [
    "check_checkpoint",
    "check_checkpoint_file",
    "did_you_mean",
    "make_checkpoint",
    "missing_ledger",
    "open_ledger",
    "open_store",
    "redact_url",
]

_SCHEMES = ("memory", "sqlite", "postgresql", "postgres")


def _libpq_check(conninfo: str, options: Mapping[str, str]) -> None:
    """Refuse options libpq does not know, and a connection string libpq cannot parse
    (ConfigError, before any connection). libpq's message quotes the part it cannot
    parse, which may be a piece of the password: it is redacted (`redact_libpq`), and
    raised outside the ``except`` block so that no exception quoting it is chained."""
    try:
        import psycopg
        from psycopg import pq
    except ImportError:
        return  # open_store's PostgresStore raises the install hint
    problem = None
    try:
        if options:
            pq.Conninfo.parse(" ".join(f"{key}=''" for key in options).encode())
    except (psycopg.Error, ValueError) as exc:  # libpq names the unknown keyword
        problem = (f"unknown ledger URL option(s) in {sorted(options)}: "
                   f"{redact_libpq(str(exc), conninfo, True).strip()}. Allowed: schema, "
                   "commit, lock_timeout and libpq's connection parameters (sslmode, ...)")
    else:
        try:
            pq.Conninfo.parse(conninfo.encode())
        except (psycopg.Error, ValueError) as exc:
            problem = (f"libpq cannot parse the ledger URL {redact_url(conninfo)}: "
                       f"{redact_libpq(str(exc), conninfo, True).strip()}; percent-encode the "
                       "user name and password (urllib.parse.quote(password, safe=''))")
    if problem is not None:
        raise ConfigError(problem)


def _split(url: str) -> SplitResult:
    """The parts of a ledger URL, or a ConfigError that names no secret."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is no number
    except ValueError:
        parts = None  # raised below, outside the except block: ValueError is not chained
    if parts is None:
        raise ConfigError(
            f"the ledger URL {redact_url(url)} cannot be parsed (an IPv6 host in [brackets], "
            "a port that is a number, and a percent-encoded user name and password: "
            "urllib.parse.quote(password, safe=''))"
        )
    if parts.netloc.count("@") > 1:  # Python splits at the last '@', libpq at the first
        raise ConfigError(
            f"the ledger URL {redact_url(url)} holds '@' in its user name or password: "
            "percent-encode it (%40; urllib.parse.quote(password, safe=''))"
        )
    if not parts.scheme and "=" in url:
        raise ConfigError(
            f"a libpq keyword/value string is not a ledger URL: {redact_url(url)}; write it "
            "as postgresql://USER@HOST:PORT/DBNAME (the password is best kept out of it, in "
            "~/.pgpass or PGPASSFILE)"
        )
    return parts


def _options(query: str, allowed: set[str]) -> dict[str, str]:
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(options) - allowed
    if unknown:
        raise ConfigError(
            f"unknown ledger URL option(s) {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    return options


def _timeout(options: Mapping[str, str]) -> float:
    text = options.get("lock_timeout", "30")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"lock_timeout must be a positive number of seconds, not {text!r}")
    return value


def open_store(url: str, *, name: str = "default", create: bool = True,
               key: LedgerKey | None = None, read_only: bool = False,
               verify: str = "recent") -> Store:
    """Open the store named by ``url`` for the ledger ``name`` (without an accountant).

    With ``create=False`` a SQLite file that does not exist is an error naming the path,
    and nothing is created (for readers and auditors). ``key`` (default: from the
    environment, see `LedgerKey.from_env`) is the key of a keyed ledger. ``read_only``
    opens a connection that refuses writes (and creates nothing). ``verify`` is
    ``"recent"`` (opening checks the ledger from its latest snapshot on) or ``"full"``.

    Raises:
        ConfigError: An unknown scheme or option; ``name`` is not a valid ledger name
            (`dpaccount.records.check_ledger_name`: nothing is opened or created).
        StorageError: The database cannot be opened.
        ImportError: ``postgresql://`` without psycopg (``pip install "dpaccount[postgres]"``).
    """
    check_ledger_name(name)
    if not isinstance(url, str):
        raise ConfigError(f"a ledger URL must be a string, not {type(url).__name__}")
    parts = _split(url)
    scheme = parts.scheme.lower()
    if verify not in ("recent", "full"):
        raise ConfigError(f"verify must be 'recent' or 'full', not {verify!r}")
    if scheme == "memory":
        return MemoryStore()
    if key is None:
        key = LedgerKey.from_env()
    elif not isinstance(key, LedgerKey):
        raise ConfigError(f"key must be a LedgerKey, not {type(key).__name__}")
    if scheme == "sqlite":
        options = _options(parts.query, {"lock_timeout", "commit"})
        if parts.netloc:
            raise ConfigError(
                f"sqlite URLs have no host: use sqlite:///relative.db or "
                f"sqlite:////absolute.db, not {redact_url(url)}"
            )
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ConfigError(f"the sqlite URL {redact_url(url)} names no file")
        if "\x00" in path:
            raise ConfigError("a sqlite URL's path cannot contain a NUL character (%00)")
        from dpaccount.storage.sqlite import SQLiteStore

        return SQLiteStore(
            path, name=name, lock_timeout=_timeout(options), create=create, key=key,
            read_only=read_only, full_verify=verify == "full",
            commit=options.get("commit", "group"),  # type: ignore[arg-type]  # checked there
        )
    if scheme in ("postgresql", "postgres"):
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        schema = options.pop("schema", "dpaccount")
        commit = options.pop("commit", "group")
        timeout = _timeout(options)
        options.pop("lock_timeout", None)
        # quote_via=quote: libpq decodes %20, not the "+" that urlencode writes for a space
        conninfo = urlunsplit(("postgresql", parts.netloc, parts.path,
                               urlencode(options, quote_via=quote), parts.fragment))
        _libpq_check(conninfo, options)
        from dpaccount.storage.postgres import PostgresStore

        return PostgresStore(
            conninfo, name=name, schema=schema, lock_timeout=timeout,
            commit=commit,  # type: ignore[arg-type]  # checked there: ConfigError
            key=key,
            read_only=read_only,
            full_verify=verify == "full",
        )
    raise ConfigError(
        f"unknown ledger URL scheme {parts.scheme!r} in {redact_url(url)}; use one of "
        "memory://, sqlite:///path.db, postgresql://user@host/db"
    )


def did_you_mean(name: str, store: Any) -> str:
    """``"; did you mean 'census'?"`` for a ledger ``name`` that ``store``'s database
    does not hold: up to three close names (`difflib.get_close_matches`) among those the
    caller may read there (``store.names()``, which on PostgreSQL lists only the ledgers
    the connecting role is granted); ``""`` when none is close or names cannot be listed.
    Only ledger names are read, never a record.

    Examples:
        >>> class Store:
        ...     def names(self): return ["census", "census-2025", "payroll"]
        >>> did_you_mean("cencus", Store())
        "; did you mean 'census'?"
        >>> did_you_mean("census-2026", Store())
        "; did you mean 'census-2025' or 'census'?"
        >>> did_you_mean("marketing", Store())
        ''
    """
    names_of = getattr(store, "names", None)
    if names_of is None:
        return ""
    try:
        names = [other for other in names_of() if other != name]
    except DPAccountError:  # a role that may not list the ledgers: no suggestion
        return ""
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def missing_ledger(name: str, url: str, store: Any, option: str | None = None
                   ) -> StorageError:
    """The error for a ledger ``name`` that the database at ``url`` (open as ``store``)
    does not hold: the URL redacted, close names the caller may read (`did_you_mean`),
    and the command-line ``option`` to fix, if given."""
    fix = "" if option is None else f" (check {option})"
    return StorageError(f"there is no ledger named {name!r} at {redact_url(url)}"
                        f"{did_you_mean(name, store)}{fix}")


def open_ledger(
    url: str,
    *,
    name: str = "default",
    budget: Any = None,
    rule: str | Rule[Any] | None = None,
    relation: Relation | str | None = None,
    plan: Any = None,
    migrate: bool = False,
    rule_options: Mapping[str, Any] | None = None,
    dataset_size: int | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    key: LedgerKey | None = None,
    create: bool | None = None,
    read_only: bool = False,
    verify: str = "recent",
    parent: str | None = None,
) -> Accountant:
    """Open (or create) the ledger ``name`` at ``url`` and return its Accountant.

    Without ``budget`` the ledger must exist and its stored budget, rule, relation and
    dataset size are adopted (every job can open it by name alone). With settings, a new
    ledger is created with them; reopening with other settings is refused with
    `ConfigError` unless ``migrate=True``, which records the change in the ledger's
    metadata history (who spent what is kept, and the new rule composes every record
    again). The whole ledger is verified on open. The Accountant is a context manager
    that closes the connection (``with open_ledger(url, name="census") as acct:``).

    Args:
        url: ``memory://``, ``sqlite:///path.db`` or ``postgresql://user@host/db``.
        name: The ledger's name (one per dataset; many can share a database).
        budget: A `Budget`, a number (epsilon) or a tuple; None adopts the stored one.
        rule: A rule name or `Rule`; None adopts the stored rule (``"basic"`` for a new
            ledger). A stored rule whose plan holds mechanism charges cannot be rebuilt
            from its description: give it (and ``plan``) again.
        relation: The neighbouring relation of every charge; None adopts the stored one
            (add/remove for a new ledger).
        plan: A declared plan, for fixed-plan rules.
        migrate: Record an explicit migration if the stored settings differ.
        rule_options: Further keyword arguments for the rule.
        dataset_size: The number of records n, if declared (total delta stays < 1/n).
        checkpoint: A head checkpoint file (`make_checkpoint`, ``dpaccount ledger
            checkpoint``): the ledger must still hold the chain it recorded, or
            `LedgerCorruptError` is raised (truncation, a rollback to a backup, a
            recreated file).
        key: The key of a keyed ledger (`LedgerKey`); None takes it from the
            environment (``DPACCOUNT_LEDGER_KEY_FILE`` or ``DPACCOUNT_LEDGER_KEY``) if
            set. A ledger created with a key is an HMAC chain for good; see
            docs/ledgers.md ("Threat model").
        create: Whether a missing ledger (or SQLite file) may be created: by default
            only when ``budget`` is given. Without it a missing ledger is an error that
            names where it was looked for, and nothing is created.
        read_only: Open for dashboards and auditors: nothing is created, the connection
            refuses writes, and a charge raises `ReadOnlyLedgerError`.
        parent: Make (or open) this ledger as a sub-budget of the ledger ``parent`` in the
            same database: stored with it, so that every charge to it also goes to the
            parent and its parents, all or nothing (see `dpaccount.budgets`). A parent
            that does not exist is a `ConfigError` and nothing is created.
        verify: ``"recent"`` (default): opening checks the ledger from its latest
            snapshot on (the record before it, the records since, the cached tip and the
            settings history) and the rule resumes from the snapshot's state, so opening
            takes the same time at any length. ``"full"``: every record is checked, as
            ``dpaccount ledger verify`` does.

    Returns:
        An `Accountant` whose store is the opened ledger.

    Raises:
        ConfigError: Unknown scheme; ``name`` or ``parent`` is not a valid ledger name
            (`dpaccount.records.check_ledger_name`; nothing is created); stored settings
            differ and ``migrate`` is False;
            no ``budget`` for a ledger that does not exist; a stored rule that cannot
            be rebuilt.
        LedgerCorruptError: The stored ledger fails verification.
        StorageError: The database cannot be used (or, without ``create``, the ledger
            or its file does not exist).
    """
    check_ledger_name(name)
    if parent is not None:
        check_ledger_name(parent, "parent")
    adopt = budget is None
    if create is None:
        create = not adopt and not read_only
    if read_only and (migrate or create):
        raise ConfigError("a ledger opened read_only=True cannot be created or migrated")
    store = open_store(url, name=name, key=key, create=bool(create), read_only=read_only,
                       verify=verify)
    try:
        if adopt:
            if migrate:
                raise ConfigError("migrate=True needs the new settings: give budget= (and "
                                  "rule=, relation=) to migrate to")
            stored = _stored_meta(store)
            if stored is None:
                raise ConfigError(
                    f"there is no ledger named {name!r} at {redact_url(url)}"
                    f"{did_you_mean(name, store)}; or give budget= (and rule=, relation=) "
                    "to create it"
                )
            budget = stored.budget
            if rule is None:
                rule = rule_from_description(stored.rule)
            relation = stored.relation if relation is None else relation
            dataset_size = stored.dataset_size if dataset_size is None else dataset_size
        elif not create and _stored_meta(store) is None:
            raise StorageError(
                f"there is no ledger named {name!r} at {redact_url(url)}"
                f"{did_you_mean(name, store)} (create=False: nothing was created)"
            )
        rule = "basic" if rule is None else rule
        relation = Relation.ADD_REMOVE if relation is None else relation
        if parent is not None and _stored_meta(store) is None:
            _require_ledger(url, parent, key)
        if migrate and not isinstance(store, MemoryStore):
            _, meta = ledger_settings(
                name, as_budget(budget), rule, relation, plan, rule_options, dataset_size
            )
            migrate_to = getattr(store, "migrate", None)
            if migrate_to is None:
                raise ConfigError(f"the store behind {redact_url(url)} does not support "
                                  "migrations")
            if getattr(store, "stored_meta", lambda: None)() is not None:
                migrate_to(meta)
        acct = Accountant(
            budget,
            rule=rule,
            store=store,
            relation=relation,
            name=name,
            plan=plan,
            rule_options=rule_options,
            dataset_size=dataset_size,
            parent=parent,
        )
        if acct.meta.parent is not None:
            _link_parents(acct, url, key)
        if checkpoint is not None:
            check_checkpoint_file(store, acct.records, checkpoint, name)
        return acct
    except BaseException:
        store.close()
        raise


#: How many ancestors a sub-budget may have (a cycle in stored parents is corruption).
MAX_DEPTH = 32


def _link_parents(acct: Accountant, url: str, key: LedgerKey | None) -> None:
    """Open a sub-budget's ancestors (by name, from the same database) and link them to
    ``acct``, so that its charges go to all of them or to none.

    Raises:
        LedgerCorruptError: The stored parents form a cycle or a chain longer than
            `MAX_DEPTH`.
        ConfigError: A parent does not exist.
    """
    seen = {acct.name}
    parent = acct.meta.parent
    ancestors: list[Accountant] = []
    try:
        while parent is not None:
            if parent in seen or len(seen) > MAX_DEPTH:
                raise LedgerCorruptError(
                    f"ledger {acct.name!r}'s parents form a cycle or a chain longer "
                    f"than {MAX_DEPTH} ({sorted(seen)})")
            seen.add(parent)
            ancestor = open_ledger(url, name=parent, key=key, read_only=acct.read_only)
            ancestors.append(ancestor)
            parent = ancestor.meta.parent
    except BaseException:
        for ancestor in ancestors:
            ancestor.close()
        raise
    acct.link_parents(ancestors)


def _require_ledger(url: str, name: str, key: LedgerKey | None) -> None:
    """Refuse a parent ledger that does not exist (before its child is created)."""
    try:
        store = open_store(url, name=name, create=False, key=key, read_only=True)
    except StorageError:
        store = None
    try:
        if store is None or _stored_meta(store) is None:
            raise ConfigError(
                f"the parent ledger {name!r} does not exist at {redact_url(url)}"
                f"{did_you_mean(name, store)}; or create it first (a sub-budget is a share "
                "of an existing ledger's budget)"
            )
    finally:
        if store is not None:
            store.close()


def _stored_meta(store: Store) -> LedgerMeta | None:
    stored_meta = getattr(store, "stored_meta", None)
    return None if stored_meta is None else stored_meta()


def _history(store: Any) -> list[tuple[int, datetime, int, LedgerMeta]] | None:
    history = getattr(store, "meta_history", None)
    return None if history is None else list(history())


def _settings_digest(meta: LedgerMeta) -> str:
    return hashlib.sha256(meta.model_dump_json().encode()).hexdigest()


def _signed_text(point: Mapping[str, Any]) -> bytes:
    fields = {k: v for k, v in point.items() if k != "mac"}
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def make_checkpoint(
    records: Sequence[LedgerRecord],
    name: str,
    *,
    key: LedgerKey | None = None,
    history: Sequence[tuple[int, datetime, int, LedgerMeta]] | None = None,
) -> dict[str, Any]:
    """A head checkpoint of a verified ledger: its name, length and last chain link,
    and (given its settings history) the number and digest of its latest settings.

    Written somewhere the database's writers cannot change (another machine, a
    write-once bucket, a signed commit), it lets `check_checkpoint` detect a ledger that
    was truncated, rolled back to a backup, recreated, or had a migration undone since.
    With the ledger's ``key`` the links are HMACs and the checkpoint carries a ``mac``
    over its fields: nobody without the key can write one.
    """
    last = GENESIS_HASH
    for record in records:
        last = chain_hash(last, record, key)
    point: dict[str, Any] = {"ledger": name, "head": len(records), "last_hash": last,
                             "written_at": datetime.now(UTC).isoformat()}
    if history:
        version, _, _, meta = history[-1]
        point["meta_version"] = version
        point["meta_digest"] = _settings_digest(meta)
    if key is not None:
        point["key_id"] = key.key_id
        point["mac"] = key.sign(_signed_text(point))
    return point


def check_checkpoint(
    records: Sequence[LedgerRecord],
    checkpoint: Mapping[str, Any],
    name: str,
    *,
    key: LedgerKey | None = None,
    history: Sequence[tuple[int, datetime, int, LedgerMeta]] | None = None,
) -> None:
    """Refuse a ledger that no longer extends the chain a checkpoint recorded.

    Args:
        records: The ledger's records (verified).
        checkpoint: The checkpoint (`make_checkpoint`).
        name: The ledger's name.
        key: The ledger's key, if keyed: the checkpoint must then carry its ``mac``.
        history: The ledger's settings history: it must still hold the settings the
            checkpoint recorded (an undone migration is refused).

    Raises:
        LedgerCorruptError: Another ledger's checkpoint, fewer records than it holds, a
            different chain up to its head, a settings history that lost or changed the
            recorded settings, or (keyed) a missing or wrong signature.
        ConfigError: The checkpoint is not one (missing or malformed fields).
    """
    try:
        head, last_hash, ledger = (int(checkpoint["head"]), str(checkpoint["last_hash"]),
                                   str(checkpoint["ledger"]))
        meta_version = checkpoint.get("meta_version")
        meta_version = None if meta_version is None else int(meta_version)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ConfigError("the checkpoint file is not a dpaccount head checkpoint") from None
    if key is not None and not key.verify(_signed_text(checkpoint), str(checkpoint.get("mac"))):
        raise LedgerCorruptError(
            f"the checkpoint of ledger {ledger!r} is not signed by the ledger's key (key id "
            f"{key.key_id}): it was written without the key, or edited"
        )
    if ledger != name:
        raise LedgerCorruptError(f"the checkpoint is of ledger {ledger!r}, not {name!r}")
    if len(records) < head:
        raise LedgerCorruptError(
            f"ledger {name!r} holds {len(records)} records, fewer than the {head} of its "
            "checkpoint: it was truncated, rolled back to a backup or recreated",
            seq=len(records),
        )
    last = GENESIS_HASH
    for record in records[:head]:
        last = chain_hash(last, record, key)
    if last != last_hash:
        raise LedgerCorruptError(
            f"ledger {name!r} is not the chain its checkpoint recorded (its first {head} "
            "records differ): it was rewritten, or restored from another copy",
            seq=head - 1 if head else None,
        )
    if meta_version is not None and history is not None:
        at = [meta for version, _, _, meta in history if version == meta_version]
        if not at or _settings_digest(at[0]) != checkpoint.get("meta_digest"):
            raise LedgerCorruptError(
                f"ledger {name!r} no longer holds settings version {meta_version} as its "
                "checkpoint recorded it: a migration was undone or its history rewritten"
            )


def check_checkpoint_file(store: Store, records: Sequence[LedgerRecord],
                          path: str | os.PathLike[str], name: str) -> None:
    """`check_checkpoint` of the checkpoint file at ``path`` for an open store.

    Raises:
        ConfigError: The file cannot be read or is not a checkpoint.
        LedgerCorruptError: As `check_checkpoint`.
    """
    hint = "give the file `dpaccount ledger checkpoint --output` wrote"
    try:
        with open(path, encoding="utf-8") as stream:
            point = json.load(stream)
    except OSError as exc:
        raise ConfigError(f"cannot read the checkpoint file {os.fspath(path)!r}: "
                          f"{exc.strerror}; {hint}") from None
    except (ValueError, RecursionError):  # (RecursionError: a file nested too deep)
        raise ConfigError(f"the checkpoint file {os.fspath(path)!r} is not JSON; "
                          f"{hint}") from None
    if not isinstance(point, dict):
        raise ConfigError(f"the checkpoint file {os.fspath(path)!r} is not a dpaccount "
                          f"head checkpoint; {hint}")
    check_checkpoint(records, point, name, key=getattr(store, "key", None),
                     history=_history(store))
