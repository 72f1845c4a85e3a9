"""Least privilege on PostgreSQL: grant a role one ledger, as a writer or an auditor.

The schema's owner (the role that created it) runs `PostgresRoles.grant` (``dpaccount
ledger grant``); dpaccount creates no role. What a grant gives:

writer
    ``USAGE`` on the schema, ``SELECT`` on its tables and ``EXECUTE`` on the five
    ``SECURITY DEFINER`` writer functions (`dpaccount.storage.postgres.functions`), and
    a row in the schema's ``grants`` table that those functions consult: the role may
    write the ledger (a share only together with its ancestors, which it may read).
auditor
    ``USAGE`` and ``SELECT``, and a row that lets it read the ledger.

Row-level security shows a granted role only the ledgers its rows name. `revoke` removes
a ledger's rows, and the role's privileges on the schema once it has no row left. The
functions and policies that use these rows are created with the schema
(`dpaccount.storage.postgres.schema`); this module only writes grants.
"""

from __future__ import annotations

from typing import Any, Literal

from dpaccount.errors import ConfigError, LedgerCorruptError, StorageError
from dpaccount.storage._sql import parse_meta
from dpaccount.storage.postgres.functions import SIGNATURES
from dpaccount.storage.postgres.schema import TABLES
from dpaccount.storage.postgres.session import PostgresSession

__all__ = ["PostgresRoles"]

#: How many ancestors a share may have (a cycle in stored parents is corruption).
MAX_ANCESTORS = 32


class PostgresRoles(PostgresSession):
    """Granting and revoking roles on a ledger (a base of `PostgresStore`)."""

    def grant(self, role: str, access: Literal["writer", "auditor"]) -> list[str]:
        """Let ``role`` write (``"writer"``) or read (``"auditor"``) this ledger.

        A writer of a share is granted its ancestors together: it can charge the share
        only in the same transaction as them (as the accountant always does), and may
        read them. Granting again replaces the role's earlier grant of this ledger.

        Returns:
            The ledgers the grant lets the role read (this one first, then ancestors).

        Raises:
            ConfigError: Not run by the schema's owner, no such role, or an unknown
                ``access``.
            StorageError: There is no such ledger.
            LedgerCorruptError: The stored parents form a cycle.
        """
        if access not in ("writer", "auditor"):
            raise ConfigError(f"grant a role as 'writer' or 'auditor', not {access!r}")
        ancestors = self.ancestors() if access == "writer" else []
        rows = ([(self.name, "write", ancestors)] + [(a, "read", []) for a in ancestors]
                if access == "writer" else [(self.name, "audit", [])])

        def run(cur: Any, oid: int) -> None:
            ident = self._pg.sql.Identifier(role)
            for statement in self._privileges("GRANT", "TO", access == "writer"):
                cur.execute(self._pg.sql.SQL(statement).format(role=ident))
            cur.execute(f"DELETE FROM {self._s}.grants WHERE role = %s AND via = %s",
                        (oid, self.name))
            for ledger, kind, needs in rows:
                cur.execute(f"INSERT INTO {self._s}.grants VALUES (%s, %s, %s, %s, %s)",
                            (oid, ledger, kind, self.name, needs))
            if access == "auditor":
                self._drop_unused(cur, oid, ident)

        self._as_owner(role, run)
        return [ledger for ledger, _kind, _needs in rows]

    def revoke(self, role: str) -> int:
        """Remove ``role``'s grant of this ledger (and of its ancestors, if they came with
        it); once the role has no grant left in the schema, its privileges on the schema
        go too.

        Returns:
            How many grant rows were removed (0: the role had no grant of this ledger).

        Raises:
            ConfigError: Not run by the schema's owner, or no such role.
        """
        removed: list[int] = []

        def run(cur: Any, oid: int) -> None:
            cur.execute(f"DELETE FROM {self._s}.grants WHERE role = %s AND via = %s",
                        (oid, self.name))
            removed.append(int(cur.rowcount))
            self._drop_unused(cur, oid, self._pg.sql.Identifier(role))

        self._as_owner(role, run)
        return removed[0]

    def ancestors(self) -> list[str]:
        """This ledger's parents, nearest first (empty unless it is a share).

        Raises:
            StorageError: The ledger (or a parent) does not exist.
            LedgerCorruptError: The stored parents form a cycle or a chain longer than
                `MAX_ANCESTORS`.
        """
        chain: list[str] = []
        name: str | None = self.name
        while name is not None:
            row = self._fetchone(f"SELECT meta FROM {self._s}.ledgers WHERE name = %s",
                                 (name,))
            if row is None:
                raise StorageError(f"there is no ledger named {name!r} in schema "
                                   f"{self.schema!r}")
            name = parse_meta(str(row[0])).parent
            if name is not None:
                if name in chain or name == self.name or len(chain) >= MAX_ANCESTORS:
                    raise LedgerCorruptError(
                        f"ledger {self.name!r}'s parents form a cycle or a chain longer "
                        f"than {MAX_ANCESTORS}")
                chain.append(name)
        return chain

    def _privileges(self, verb: str, to: str, writer: bool) -> list[str]:
        """``GRANT ... TO {role}`` (or ``REVOKE ... FROM``) of what a role is given on the
        schema: usage and reading, and for a writer the writer functions."""
        tables = ", ".join(f"{self._s}.{table}" for table in (*TABLES, "grants"))
        statements = [f"{verb} USAGE ON SCHEMA {self._s} {to} {{role}}",
                      f"{verb} SELECT ON {tables} {to} {{role}}"]
        if writer:
            functions = ", ".join(f"{self._s}.{name}({args})"
                                  for name, args in SIGNATURES.items())
            statements.append(f"{verb} EXECUTE ON FUNCTION {functions} {to} {{role}}")
        return statements

    def _drop_unused(self, cur: Any, oid: int, ident: Any) -> None:
        """Revoke what ``oid``'s remaining grant rows in the schema no longer need."""
        kinds = {str(row[0]) for row in cur.execute(
            f"SELECT DISTINCT access FROM {self._s}.grants WHERE role = %s", (oid,))}
        if "write" not in kinds:
            cur.execute(self._pg.sql.SQL(self._privileges("REVOKE", "FROM", True)[2]).format(
                role=ident))
        if not kinds:
            for statement in self._privileges("REVOKE", "FROM", False):
                cur.execute(self._pg.sql.SQL(statement).format(role=ident))

    def _as_owner(self, role: str, body: Any) -> None:
        """Run ``body(cursor, role oid)`` in one transaction, as the schema's owner.

        Raises:
            ConfigError: This connection's role does not own the ledger tables, or
                ``role`` does not exist.
            StorageError: There is no such ledger.
        """
        s = self._s

        def run(conn: Any) -> None:
            with conn.transaction():
                cur = conn.cursor()
                owner = cur.execute(
                    "SELECT pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER') "
                    "FROM pg_catalog.pg_class c WHERE c.oid = %s::regclass",
                    (f"{s}.ledgers",)).fetchone()
                if not owner or not owner[0]:
                    raise ConfigError(
                        f"only the owner of schema {self.schema!r}'s ledger tables can grant "
                        "or revoke roles; connect as that role")
                found = cur.execute("SELECT oid FROM pg_catalog.pg_roles WHERE rolname = %s",
                                    (role,)).fetchone()
                if found is None:
                    raise ConfigError(f"there is no role named {role!r} (create it first: "
                                      "dpaccount creates no role)")
                if cur.execute(f"SELECT 1 FROM {s}.ledgers WHERE name = %s",
                               (self.name,)).fetchone() is None:
                    raise StorageError(f"there is no ledger named {self.name!r} in schema "
                                       f"{self.schema!r}")
                body(cur, int(found[0]))

        self._writable()
        self._call(run)
