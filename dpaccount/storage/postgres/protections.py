"""What a PostgreSQL writer checks before it trusts the database to decide: the pinned
server-side functions and protective triggers, and the guard every write runs.

`PostgresProtections.check_functions` and `missing_protections` report functions that
are not dpaccount's and triggers that do not stand. Before a store first writes, it
checks both in one snapshot and *pins* what it checked: the catalog rows (``oid`` and
``xmin``) of every function and of every trigger on the ledger tables. Every write
transaction then runs the guard (`dpaccount.storage.postgres.functions.guard_sql`) just
before its ``COMMIT``: if a pinned row changed, or the session's
``session_replication_role`` is not ``origin``, the transaction aborts and nothing is
written (docs/ledgers.md, "Fail closed inside the deciding transaction").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from dpaccount.errors import LedgerCorruptError
from dpaccount.storage.postgres.functions import (
    DEFINER_FUNCTIONS,
    SEARCH_PATH,
    guard_sql,
)
from dpaccount.storage.postgres.schema import TABLES, TRIGGERS, function_sources
from dpaccount.storage.postgres.session import PostgresSession

__all__ = ["Pins", "PostgresProtections"]


@attrs.frozen
class Pins:
    """What a store checked and pinned: the ledger tables' oids, and the catalog rows
    (oid, ``xmin``) of their non-internal triggers and of dpaccount's functions."""

    tables: tuple[int, ...]
    triggers: tuple[tuple[int, str], ...]
    functions: tuple[tuple[int, str], ...]

    def guard(self) -> str:
        """The guard statement with these pins spelled out (it is prepared once per
        connection and pins: a statement with parameters would be planned again at
        every run, some hundreds of microseconds)."""
        return guard_sql(_array(self.tables), _rows(self.triggers), _rows(self.functions))


@attrs.frozen
class _Found:
    """The catalog rows of a schema's ledger tables, functions and triggers, read in one
    snapshot, and what is wrong with them."""

    pins: Pins
    bad_functions: list[str]
    bad_triggers: list[str]
    replication_role: str


def _array(values: Iterable[object]) -> str:
    """An SQL array literal of numbers (oids, transaction ids)."""
    return "'{" + ",".join(str(int(str(v))) for v in values) + "}'"


def _rows(rows: tuple[tuple[int, str], ...]) -> tuple[str, str, int]:
    """(oids, xmins, count) of pinned catalog rows, as `guard_sql` takes them."""
    xmins = sorted({int(xmin) for _, xmin in rows})  # (rows made together share one)
    return _array(oid for oid, _ in rows), _array(xmins), len(rows)


class PostgresProtections(PostgresSession):
    """The checks of the server-side functions and triggers (a base of `PostgresStore`)."""

    _pins: Pins | None

    def check_functions(self) -> None:
        """Refuse server-side functions that are not the ones dpaccount wrote.

        The append functions decide charges and the trigger functions guard the tables;
        a replaced body (``CREATE OR REPLACE FUNCTION`` by anyone with the privilege)
        could admit charges past the budget. Each function's source is compared with
        the one this version of dpaccount installs, and each ``SECURITY DEFINER``
        function must run with ``search_path = pg_catalog, pg_temp`` and belong to the
        tables' owner.

        Raises:
            LedgerCorruptError: A function is missing, duplicated or not dpaccount's.
        """
        found = self._inspect()
        if found.bad_functions:
            raise self._functions_replaced(found.bad_functions)

    def missing_protections(self) -> list[str]:
        """The protective triggers that are missing, disabled (dropped or switched off), or
        that call another function than the one this version of dpaccount installs."""
        return self._inspect().bad_triggers

    def _functions_replaced(self, names: list[str]) -> LedgerCorruptError:
        return LedgerCorruptError(
            f"the server-side function(s) {', '.join(names)} of schema {self.schema!r} are "
            "missing or were replaced; charges decided by them cannot be trusted and "
            "nothing was written. Restore them (open the ledger with a fresh schema or "
            "drop and re-create the functions) and revoke CREATE on the schema from "
            "everyone but the ledger's owner"
        )

    def _pin(self, repin: bool = False) -> Pins:
        """Check every function and trigger and pin them for the guard.

        With ``repin`` (after the guard found a function's row changed) the triggers must
        still be exactly the pinned ones: only the functions are pinned anew.

        Raises:
            LedgerCorruptError: A function is not dpaccount's, a protective trigger is
                missing, disabled or changed, or ``session_replication_role`` is not
                ``origin``; nothing is written.
        """
        found = self._inspect()
        if found.replication_role != "origin":
            raise LedgerCorruptError(
                f"this session runs with session_replication_role = "
                f"{found.replication_role!r}, under which the protective triggers do not "
                "fire; nothing was written. Remove the setting (ALTER ROLE/DATABASE ... "
                "RESET session_replication_role) and reopen the ledger"
            )
        if found.bad_functions:
            raise self._functions_replaced(found.bad_functions)
        if found.bad_triggers:
            raise LedgerCorruptError(
                f"protective triggers are dropped or disabled: {', '.join(found.bad_triggers)} "
                f"(schema {self.schema!r}); the database no longer refuses edits, so nothing "
                "was written. Restore them and run `dpaccount ledger verify`"
            )
        pinned = self._pins
        if repin and pinned is not None and (found.pins.tables, found.pins.triggers) != (
                pinned.tables, pinned.triggers):
            raise self._triggers_changed()
        self._pins = found.pins
        return found.pins

    def _triggers_changed(self) -> LedgerCorruptError:
        return LedgerCorruptError(
            f"the protective triggers of schema {self.schema!r} were changed (disabled, "
            "dropped, re-created or enabled again) since this writer opened the ledger; "
            "nothing was written and the query must not run. Check the ledger with "
            "`dpaccount ledger verify`, then reopen it"
        )

    def _run_guard(self, cur: Any) -> None:
        """Run the guard in the caller's write transaction (before its commit)."""
        cur.execute(self._pinned().guard())

    def _pinned(self) -> Pins:
        """The pins (the store checks and pins first if it has not yet; call outside a
        transaction)."""
        return self._pins if self._pins is not None else self._pin()

    def _inspect(self) -> _Found:
        schema = self.schema

        def get(cur: Any) -> _Found:
            # (By name, through the catalogs' name indexes: a database with many
            # schemas has a large pg_class and pg_proc.)
            expected = function_sources(schema)
            tables = cur.execute(
                "SELECT c.relname, c.oid, c.relowner FROM pg_catalog.pg_class c "
                "WHERE c.relname = ANY (%s) AND c.relnamespace = %s::regnamespace "
                "AND c.relkind = 'r'", (list(TABLES), self._s),
            ).fetchall()
            table_oid = {str(name): int(oid) for name, oid, _owner in tables}
            owner = {str(name): int(o) for name, _oid, o in tables}.get("ledgers")
            functions = cur.execute(
                "SELECT p.proname, p.oid, p.prosrc, p.prosecdef, p.proconfig, p.proowner, "
                "p.xmin::text FROM pg_catalog.pg_proc p WHERE p.proname = ANY (%s) "
                "AND p.pronamespace = %s::regnamespace", (list(expected), self._s),
            ).fetchall()
            triggers = cur.execute(
                "SELECT t.tgname, t.tgrelid, t.tgenabled, p.proname, t.oid, t.xmin::text "
                "FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid "
                "WHERE t.tgrelid = ANY (%s::oid[]) AND NOT t.tgisinternal",
                (list(table_oid.values()),),
            ).fetchall()
            role = cur.execute(
                "SELECT pg_catalog.current_setting('session_replication_role')"
            ).fetchone()[0]
            return _Found(
                Pins(tuple(sorted(table_oid.values())),
                     tuple(sorted((int(r[4]), str(r[5])) for r in triggers)),
                     tuple(sorted((int(r[1]), str(r[6])) for r in functions))),
                _bad_functions(functions, expected, owner),
                _bad_triggers([r[:4] for r in triggers], table_oid),
                str(role),
            )

        found: _Found = self._read(get, repeatable=True)
        return found


def _bad_functions(rows: list[Any], expected: dict[str, str], owner: int | None
                   ) -> list[str]:
    """The expected functions that are missing, duplicated (an overload), have another
    source, or (the ``SECURITY DEFINER`` ones) other settings or another owner than
    the ledger tables'."""
    by_name: dict[str, list[Any]] = {}
    for row in rows:
        by_name.setdefault(str(row[0]), []).append(row)
    bad = []
    for name, source in expected.items():
        found = by_name.get(name, [])
        if len(found) != 1 or str(found[0][2]) != source:
            bad.append(name)
            continue
        _, _, _, definer, config, proowner, _xmin = found[0]
        if name in DEFINER_FUNCTIONS and (not definer or list(config or []) != [SEARCH_PATH]
                                          or int(proowner) != owner):
            bad.append(name)
    return sorted(bad)


def _bad_triggers(rows: list[Any], table_oid: dict[str, int]) -> list[str]:
    """The protective triggers that are missing, not enabled (``O``rigin or ``A``lways),
    or on another table or function than dpaccount's."""
    standing = {(str(name), int(relid), str(function)) for name, relid, state, function in rows
                if str(state) in ("O", "A")}
    return sorted(name for name, (table, function) in TRIGGERS.items()
                  if (name, table_oid.get(table, -1), function) not in standing)
