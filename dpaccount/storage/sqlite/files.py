"""Who besides its owner can write a SQLite ledger's files (the runbook is in
docs/ledgers.md, "SQLite: file permissions"; stdlib only, knows nothing of ledgers).

SQLite has no roles: anyone who can write the database file, its ``-wal`` or ``-shm``
file, or the directory that holds them (and so replace them) can do anything to every
ledger in it. `loose_permissions` names each of those that the group or others may write.
"""

from __future__ import annotations

import os
import stat

__all__ = ["loose_permissions"]


def loose_permissions(path: str | os.PathLike[str]) -> list[str]:
    """One line for each of the ledger file, its ``-wal`` and ``-shm`` files (those that
    exist) and its directory that the group or others may write.

    Examples:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> (folder / "l.db").touch(mode=0o600)
        >>> loose_permissions(folder / "l.db")
        []
        >>> (folder / "l.db").chmod(0o664)
        >>> print(*loose_permissions(folder / "l.db"))  # doctest: +ELLIPSIS
        /.../l.db is writable by its group (mode 0664): they can change or replace ...
    """
    path = os.path.abspath(os.fspath(path))
    found = []
    for target in (path, f"{path}-wal", f"{path}-shm", os.path.dirname(path)):
        try:
            mode = os.stat(target).st_mode
        except OSError:
            continue
        who = [name for bit, name in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others"))
               if mode & bit]
        if not who:
            continue
        line = (f"{target} is writable by {' and '.join(who)} (mode "
                f"{stat.S_IMODE(mode):04o}): they can change or replace the ledger")
        if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
            line += (" (sticky: they cannot replace its files, but can create a -wal or "
                     "-shm file while none exists)")
        found.append(line + "; see docs/ledgers.md, 'SQLite: file permissions'")
    return found
