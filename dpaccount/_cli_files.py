"""What the command line shares about files and failures: output files checked before
anything is read and written with one-line errors, JSON input files read with one-line
errors, the one line a failed command prints (redacted), and an argument parser whose
usage errors name no secret.

Every failure of a command is one line on standard error naming the file or option and
what to do (exit status 2), never a traceback; every such line goes through the one
redaction (`dpaccount._redact.redact`), so a password in a URL, a libpq keyword/value
string or a shell fragment is printed as ``***``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any, NoReturn, TextIO

from dpaccount._redact import redact
from dpaccount.errors import ConfigError

__all__ = [
    "RedactingArgumentParser",
    "cannot_write",
    "check_output",
    "default_output",
    "describe_os_error",
    "error_line",
    "read_json",
    "writing",
]


class RedactingArgumentParser(argparse.ArgumentParser):
    """An argument parser whose usage errors name no secret: arguments it does not
    recognise are not echoed (an unquoted ``password=a b`` arrives as two of them), and
    the rest of its messages go through `dpaccount._redact.redact`."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and the redacted message; exit with status 2."""
        if message.startswith("unrecognized arguments"):
            message = ("unrecognized arguments (not shown: they may hold a password); give "
                       "a URL or connection string as one quoted argument")
        super().error(redact(message))


def error_line(exc: BaseException) -> str:
    """The one line a command prints for a failure: ``dpaccount: <message>``, redacted
    (`dpaccount._redact.redact`: a password in it is shown as ``***``) and on one line
    (a driver's message can span several)."""
    text = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
    return "dpaccount: " + " ".join(redact(text).split())


def describe_os_error(exc: OSError) -> str:
    """One line for an operating system error: what failed, on which file."""
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text}: {os.fspath(exc.filename)!r}" if exc.filename is not None else text


def cannot_write(path: str, option: str, code: int | None, reason: str | None = None,
                 started: bool = False) -> ConfigError:
    """The one-line error for an output file that cannot be written, with what to do."""
    folder = os.path.dirname(os.path.abspath(path))
    hints = {
        errno.ENOENT: f"the folder {folder!r} does not exist: create it first, or give "
                      f"another {option}",
        errno.EISDIR: f"it is a folder: give {option} a file name",
        errno.ENOTDIR: f"a part of its folder is a file, not a folder: give another {option}",
        errno.EACCES: f"you may not write there: give another {option}",
        errno.EPERM: f"you may not write there: give another {option}",
        errno.EROFS: f"the file system is read-only: give another {option}",
        errno.ENOSPC: f"the disk is full: free some space, or give another {option}",
    }
    hint = hints.get(code or 0, f"give another {option}")
    if started:
        hint += "; what was written is incomplete: delete it"
    reason = reason or (os.strerror(code) if code else "it cannot be written")
    return ConfigError(f"cannot write {option} {path!r}: {reason}; {hint}")


def check_output(path: str, option: str) -> None:
    """Refuse an output file that cannot be written, before anything is read (a
    command checks its output before it loads a ledger): a folder, or a file in a folder
    that does not exist."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise cannot_write(path, option, errno.EISDIR)
    try:
        folder = os.stat(os.path.dirname(target))
    except OSError as exc:  # ENOENT: a missing folder; ENOTDIR: a file on the way
        code = exc.errno
    else:
        code = None if stat.S_ISDIR(folder.st_mode) else errno.ENOTDIR
    if code is not None:
        raise cannot_write(path, option, code)


def default_output(name: str, ending: str) -> str:
    """The file a command writes when no ``--output`` is given: ``<name><ending>`` in the
    current folder, every character of ``name`` other than ASCII letters, digits, ``.``,
    ``_`` and ``-`` replaced by ``_`` (a share's ``census/team-a`` gives
    ``census_team-a``), so the name can never leave the folder.

    Examples:
        >>> default_output("census/team-a", "-report.html")
        'census_team-a-report.html'
        >>> default_output("..", "-report.html")
        '_..-report.html'
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return ("_" + safe if safe.startswith(".") else safe) + ending


@contextlib.contextmanager
def writing(path: str, option: str, newline: str | None = None) -> Iterator[TextIO]:
    """The output file, open for writing; an OSError opening, writing or closing it
    becomes the one-line `cannot_write` error."""
    try:
        stream = open(path, "w", encoding="utf-8", newline=newline)  # noqa: SIM115
    except OSError as exc:
        raise cannot_write(path, option, exc.errno, exc.strerror) from None
    try:
        with stream:
            yield stream
    except OSError as exc:
        raise cannot_write(path, option, exc.errno, exc.strerror, started=True) from None


def read_json(path: str, what: str, hint: str) -> Any:
    """The JSON document in the file ``path`` (an export, a checkpoint), or a one-line
    ConfigError naming the file and what to do."""
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path!r}: {exc.strerror}; {hint}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} {path!r} is not UTF-8 text; {hint}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the {what} {path!r} is not JSON ({exc.msg} at line {exc.lineno}); "
                          f"{hint}") from None
    except (ValueError, RecursionError):  # a number too long, nesting too deep
        raise ConfigError(f"the {what} {path!r} is not JSON that can be read; {hint}") from None
