"""The secret key of a keyed ledger: its hash chain becomes an HMAC chain.

Without a key, a ledger's records and settings history are chained with SHA-256. Anyone
who can write the database can rewrite a record and re-hash everything after it, and
``verify`` cannot tell. With a key (at least 32 random bytes, kept outside the database),
every link is HMAC-SHA256 under the key: a rewritten record, a forged tail or a forged
settings migration no longer verifies unless the writer holds the key. Head checkpoints
of a keyed ledger are signed with the same key. docs/ledgers.md ("Threat model") says
what each mode detects and what it cannot.

The key comes from ``DPACCOUNT_LEDGER_KEY_FILE`` (a file holding the key as hex), from
``DPACCOUNT_LEDGER_KEY`` (the hex itself), or is passed as ``key=`` to
`dpaccount.open_ledger`. It is never written to the database: the ledger stores only
the key's id (an HMAC of a fixed string under the key), so that a ledger opened with the
wrong key, or without one, gets a clear error.

Examples:
    >>> key = LedgerKey.from_hex("00" * 32)
    >>> key
    LedgerKey(key_id='4fe7e75b843e2a7b')
    >>> len(key.chain("0" * 64, b"a record"))
    64
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Final

import attrs

from dpaccount.errors import ConfigError

__all__ = ["KEY_ENV", "KEY_FILE_ENV", "LedgerKey"]

#: The environment variable naming a file that holds the key (hex).
KEY_FILE_ENV: Final = "DPACCOUNT_LEDGER_KEY_FILE"
#: The environment variable holding the key itself (hex).
KEY_ENV: Final = "DPACCOUNT_LEDGER_KEY"
#: The fewest random bytes a key must have.
MIN_KEY_BYTES: Final = 32
#: A key file is read up to this many bytes (a key is 64 to a few hundred hex digits).
_MAX_KEY_FILE_BYTES: Final = 4096


def _hash_on(message: bytes) -> str:
    return hashlib.sha256(message).hexdigest()


@attrs.frozen(repr=False)
class LedgerKey:
    """A secret key for HMAC-chained ledgers (its repr shows only the key's id).

    Attributes:
        secret: The key's bytes (at least 32).
    """

    secret: bytes = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) < MIN_KEY_BYTES:
            raise ConfigError(
                f"a ledger key must be at least {MIN_KEY_BYTES} random bytes; make one "
                "with `dpaccount ledger keygen --output FILE`"
            )

    @property
    def key_id(self) -> str:
        """A public name of the key (16 hex digits), stored with a keyed ledger."""
        return self.sign(b"dpaccount ledger key id")[:16]

    def chain(self, prev_hash: str, data: bytes) -> str:
        """The HMAC-SHA256 link of ``data`` after ``prev_hash`` (hex)."""
        return self.sign(prev_hash.encode() + b"\n" + data)

    def sign(self, message: bytes) -> str:
        """HMAC-SHA256 of ``message`` under the key (hex)."""
        return hmac.digest(self.secret, message, "sha256").hex()

    def verify(self, message: bytes, mac: str) -> bool:
        """Whether ``mac`` is this key's HMAC of ``message`` (compared in constant time)."""
        return isinstance(mac, str) and hmac.compare_digest(self.sign(message), mac)

    @classmethod
    def generate(cls) -> LedgerKey:
        """A new random key of 32 bytes from the OS CSPRNG."""
        return cls(secrets.token_bytes(MIN_KEY_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> LedgerKey:
        """Read a key written as hex digits (surrounding whitespace is ignored).

        Raises:
            ConfigError: Not hex, or fewer than 32 bytes.
        """
        try:
            return cls(bytes.fromhex(str(text).strip()))
        except ValueError:
            raise ConfigError(
                "a ledger key must be written as hex digits (at least 64 of them); make "
                "one with `dpaccount ledger keygen --output FILE`"
            ) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> LedgerKey:
        """Read a key file (hex, as `dpaccount ledger keygen` writes it).

        Raises:
            ConfigError: The file cannot be read or does not hold a key.
        """
        try:
            with open(path, "rb") as stream:
                raw = stream.read(_MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read the ledger key file {os.fspath(path)!r}: "
                              f"{exc.strerror}; give the file that holds this ledger's "
                              "key (`dpaccount ledger keygen` wrote it)") from None
        if len(raw) > _MAX_KEY_FILE_BYTES:
            raise ConfigError(f"{os.fspath(path)!r} is too long to be a ledger key file")
        try:
            return cls.from_hex(raw.decode("ascii"))
        except (UnicodeDecodeError, ConfigError):
            raise ConfigError(
                f"{os.fspath(path)!r} does not hold a ledger key (hex digits, at least "
                "64); make one with `dpaccount ledger keygen --output FILE`"
            ) from None

    @classmethod
    def from_env(cls) -> LedgerKey | None:
        """The key named by the environment, or None if neither variable is set.

        ``DPACCOUNT_LEDGER_KEY_FILE`` wins over ``DPACCOUNT_LEDGER_KEY``.

        Raises:
            ConfigError: A variable is set but does not give a key.
        """
        path = os.environ.get(KEY_FILE_ENV)
        if path:
            return cls.from_file(path)
        text = os.environ.get(KEY_ENV)
        if text:
            try:
                return cls.from_hex(text)
            except ConfigError:
                raise ConfigError(
                    f"{KEY_ENV} does not hold a ledger key (hex digits, at least 64)"
                ) from None
        return None

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the key as hex to a new file readable by its owner only (0600).

        Raises:
            ConfigError: The file exists already or cannot be created.
        """
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            raise ConfigError(f"{os.fspath(path)!r} exists; a key file is never "
                              "overwritten") from None
        except OSError as exc:
            raise ConfigError(f"cannot create {os.fspath(path)!r}: {exc.strerror}") from None
        with os.fdopen(fd, "w", encoding="ascii") as stream:
            stream.write(self.secret.hex() + "\n")

    def __repr__(self) -> str:
        return f"LedgerKey(key_id={self.key_id!r})"


def link(prev_hash: str, data: bytes, key: LedgerKey | None) -> str:
    """One link of a ledger chain: SHA-256 without a key, HMAC-SHA256 with one."""
    if key is None:
        return _hash_on(prev_hash.encode() + b"\n" + data)
    return key.chain(prev_hash, data)
