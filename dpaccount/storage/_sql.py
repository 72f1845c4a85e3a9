"""What the SQL stores share: exact numbers as text, the cached tip, the meta history.

(Checking a stored chain is in `dpaccount.storage._chain`.)

Both `SQLiteStore` and
`PostgresStore` keep the same three tables:

``ledgers``
    one row per named ledger: its metadata (JSON), the record schema version, and a
    cache of the tip: ``head`` (the number of records), the exact sums of the records'
    epsilon and delta (``"numerator/denominator"`` text, never REAL) and the last hash.
``records``
    the append-only records: ``(ledger, seq)`` primary key, the canonical JSON payload,
    ``prev_hash``, ``hash`` and the caller's ``query_id`` (unique per ledger).
``meta_history``
    every metadata a ledger ever had (version 0 at creation, one row per explicit
    migration), hash-chained like the records.

Nothing here knows about differential privacy; the checks are about integrity only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from datetime import datetime
from fractions import Fraction

import attrs

from dpaccount._numeric import SUM_BITS as NUMERIC_SUM_BITS
from dpaccount._numeric import bounded_up, int_text, text_int
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, LedgerConflictError, LedgerCorruptError, StorageError
from dpaccount.keys import KEY_FILE_ENV, LedgerKey, link
from dpaccount.records import (
    GENESIS_HASH,
    LedgerMeta,
    LedgerRecord,
    canonical_bytes,
)

__all__ = [
    "SUM_BITS",
    "LedgerTip",
    "RecordRow",
    "SnapshotRow",
    "bounded_sum",
    "check_key",
    "frac_text",
    "meta_hash",
    "renumberable",
    "snapshot_settings",
    "split_at_seq",
    "sums_add_up",
    "sums_follow",
    "within_limits",
]

#: Version of the table layout (not of the record format, which records.py owns).
TABLES_VERSION = 3

#: A row of the records table: (seq, payload, prev_hash, hash, query_id).
RecordRow = tuple[int, str, str, str, "str | None"]

#: A row of the meta_history table: (version, at, head, meta, prev_hash, hash).
MetaRow = tuple[int, str, int, str, str, str]


def frac_text(value: Fraction) -> str:
    """An exact value as ``"numerator/denominator"`` text.

    Examples:
        >>> frac_text(Fraction(1, 3))
        '1/3'
    """
    return f"{int_text(value.numerator)}/{int_text(value.denominator)}"


def parse_frac(text: str, what: str) -> Fraction:
    """Read ``"numerator/denominator"`` text back; a malformed value is corruption.

    Examples:
        >>> parse_frac("3/4", "epsilon_sum")
        Fraction(3, 4)
    """
    num, sep, den = str(text).partition("/")
    try:
        return Fraction(text_int(num), text_int(den) if sep else 1)
    except (ValueError, ZeroDivisionError):
        raise LedgerCorruptError(f"the cached {what} {text!r} is not an exact number") from None


@attrs.frozen
class LedgerTip:
    """The end of a ledger: what the ``ledgers`` row caches about its records.

    Attributes:
        head: The number of records (the seq of the next one).
        last_hash: The hash of the last record (the genesis hash when empty).
        epsilon_sum: The exact sum of the records' epsilon.
        delta_sum: The exact sum of the records' delta.
    """

    head: int
    last_hash: str
    epsilon_sum: Fraction
    delta_sum: Fraction

    def after(self, record: LedgerRecord, record_hash: str) -> LedgerTip:
        """The tip once ``record`` (hashing to ``record_hash``) is appended (its sums
        kept within `SUM_BITS` by `bounded_sum`)."""
        return self.plus(record.cost, record_hash)

    def plus(self, cost: PrivacyCost, record_hash: str) -> LedgerTip:
        """The tip once a record of ``cost`` hashing to ``record_hash`` is appended."""
        return LedgerTip(
            self.head + 1,
            record_hash,
            bounded_sum(self.epsilon_sum + cost.epsilon),
            bounded_sum(self.delta_sum + cost.delta),
        )


#: The grid of the cached running sums: `dpaccount._numeric.SUM_BITS`, shared with the
#: rules' bounded sums (PostgreSQL's append function rounds in ``numeric`` the same way).
SUM_BITS = NUMERIC_SUM_BITS


def bounded_sum(value: Fraction) -> Fraction:
    """``value`` if its denominator fits in `SUM_BITS` bits, else rounded **up** to the
    next multiple of ``2**-SUM_BITS`` (never below: a cached sum never under-counts):
    `dpaccount._numeric.bounded_up`, the one rounding every bounded sum shares.
    PostgreSQL's append function does the same in ``numeric``.

    Examples:
        >>> bounded_sum(Fraction(1, 3))
        Fraction(1, 3)
        >>> big = Fraction(1, 3**3000)
        >>> 0 < bounded_sum(big) - big < Fraction(1, 2**4096)
        True
    """
    return bounded_up(value)


EMPTY_TIP = LedgerTip(0, GENESIS_HASH, Fraction(0), Fraction(0))

#: A row of the snapshots table: (head, last_hash, epsilon_sum, delta_sum, settings,
#: state, hash).
SnapshotRow = tuple[int, str, str, str, str, "str | None", str]


def snapshot_settings(meta: LedgerMeta) -> str:
    """What a rule state depends on besides the records: the rule and the relation."""
    return json.dumps({"relation": meta.relation.value, "rule": meta.rule}, sort_keys=True,
                      separators=(",", ":"))


def within_limits(
    epsilon_sum: Fraction,
    delta_sum: Fraction,
    epsilon_limit: Fraction | None,
    delta_limit: Fraction,
    delta_below: Fraction | None,
) -> bool:
    """Whether exact sums stay within the limits of ``SumLimitedStore.append_within``.

    Plain arithmetic, no privacy reasoning: ``epsilon_sum <= epsilon_limit`` (no limit
    when None), ``delta_sum <= delta_limit`` and, if given, ``delta_sum < delta_below``.

    Examples:
        >>> within_limits(Fraction(1), Fraction(0), Fraction(1), Fraction(0), None)
        True
        >>> within_limits(Fraction(0), Fraction(1, 10), None, Fraction(1), Fraction(1, 10))
        False
    """
    return (
        (epsilon_limit is None or epsilon_sum <= epsilon_limit)
        and delta_sum <= delta_limit
        and (delta_below is None or delta_sum < delta_below)
    )


#: What precedes a record's seq in its canonical payload (sorted keys, no spaces).
SEQ_KEY = '"seq":'


def renumberable(record: LedgerRecord, known_head: int) -> tuple[str, str]:
    """The canonical payload of a record numbered ``known_head``, cut around its ``seq``
    (`split_at_seq`), for the appends that store it at whatever head they find.

    Raises:
        LedgerConflictError: The record is not numbered ``known_head``.
    """
    if record.seq != known_head:
        raise LedgerConflictError(
            f"record seq {record.seq} does not match the known head {known_head}"
        )
    return split_at_seq(canonical_bytes(record).decode(), known_head)


def split_at_seq(payload: str, seq: int) -> tuple[str, str]:
    """Cut a record's canonical payload around the digits of its ``seq``.

    ``prefix + str(n) + suffix`` is then the canonical payload of the same record
    numbered ``n``, so a store can re-number a record to the head it finds without
    re-encoding it. In the canonical encoding (sorted keys, no spaces) the top-level key
    ``seq`` is followed by ``timestamp``, so ``"seq":<n>,`` occurs there; it occurs
    nowhere else, because no nested model has a ``seq`` field and a quote inside a
    string value is always escaped (``\\"``). The uniqueness is checked anyway.

    Raises:
        StorageError: The payload does not contain ``"seq":<seq>,`` exactly once.

    Examples:
        >>> split_at_seq('{"rule":"basic","seq":7,"timestamp":"t"}', 7)
        ('{"rule":"basic","seq":', ',"timestamp":"t"}')
    """
    marker = f"{SEQ_KEY}{seq},"
    at = payload.find(marker)
    if at < 0 or payload.find(marker, at + 1) >= 0:
        raise StorageError(f"record {seq}: its canonical payload has no unique seq field")
    cut = at + len(SEQ_KEY)
    return payload[:cut], payload[cut + len(str(seq)):]


def meta_hash(prev_hash: str, version: int, at: str, head: int, meta_json: str,
              key: LedgerKey | None = None) -> str:
    """The link of one meta-history entry after the previous entry's (SHA-256, or
    HMAC-SHA256 under ``key`` for a keyed ledger)."""
    body = json.dumps(
        {"at": at, "head": head, "meta": json.loads(meta_json), "version": version},
        sort_keys=True,
        separators=(",", ":"),
    )
    return link(prev_hash, body.encode(), key)


def parse_meta(text: str) -> LedgerMeta:
    """Validate stored metadata; anything malformed is corruption."""
    try:
        return LedgerMeta.model_validate_json(text)
    except ValueError as exc:  # pydantic's ValidationError (imported with the models)
        raise LedgerCorruptError(f"the stored ledger metadata is invalid: {exc}") from exc


def check_meta_history(rows: Iterable[MetaRow], current_meta: str,
                       key: LedgerKey | None = None) -> None:
    """Check the meta history chain and that it ends at the ledger's current metadata.

    With ``key``, every link must be its HMAC: a migration added by anyone without the
    key (a budget raised to 100, say) does not verify.

    Raises:
        LedgerCorruptError: An entry is missing or altered, or the current metadata was
            changed without a recorded migration.
    """
    prev = GENESIS_HASH
    last_meta: str | None = None
    for expected, (version, at, head, meta_json, row_prev, row_hash) in enumerate(rows):
        if version != expected or row_prev != prev:
            raise LedgerCorruptError(f"meta history entry {expected} is missing or out of order")
        try:
            datetime.fromisoformat(at)
            ok = meta_hash(prev, version, at, head, meta_json, key) == row_hash
        except (ValueError, json.JSONDecodeError):
            ok = False
        if not ok:
            raise LedgerCorruptError(f"meta history entry {version} was altered")
        parse_meta(meta_json)
        prev, last_meta = row_hash, meta_json
    if last_meta is None:
        raise LedgerCorruptError("the ledger has no recorded metadata history")
    if parse_meta(last_meta) != parse_meta(current_meta):
        raise LedgerCorruptError(
            "the ledger's metadata was changed without a recorded migration"
        )


def check_key(meta_text: str | None, key: LedgerKey | None, name: str) -> None:
    """Refuse to read or write a ledger with a key that is not the one it was made with.

    Raises:
        ConfigError: The ledger is keyed and no key was given.
        LedgerCorruptError: A key was given but the ledger is not keyed (made without
            one, or rewritten without it), or it is keyed with another key.
    """
    if meta_text is None:
        return
    stored = parse_meta(meta_text).key_id
    if stored is None and key is None:
        return
    if key is None:
        raise ConfigError(
            f"ledger {name!r} is keyed (its chain is an HMAC chain, key id {stored}): give "
            f"its key (the {KEY_FILE_ENV} environment variable, or key=LedgerKey.from_file"
            "(path)); without it the ledger cannot be verified or written"
        )
    if stored is None:
        raise LedgerCorruptError(
            f"a ledger key (id {key.key_id}) was given, but ledger {name!r} is not keyed: "
            "either it was made without a key (open it without one) or someone rewrote "
            "its chain without the key. A keyed ledger's chain cannot be stripped of its "
            "key unseen."
        )
    if stored != key.key_id:
        raise LedgerCorruptError(
            f"ledger {name!r} is keyed with another key (id {stored}, not {key.key_id}); "
            "give the key it was made with"
        )


#: The top-level cost in a canonical payload (sorted keys: delta, then epsilon). A quote
#: inside a JSON string is always escaped, so only the structure matches.
_COST = re.compile(r'"cost":\{"delta":"(-?[0-9]+(?:/[0-9]+)?)","epsilon":"(-?[0-9]+(?:/[0-9]+)?)"')


def _int_pair(text: str) -> tuple[int, int]:
    num, sep, den = str(text).partition("/")
    return text_int(num), (text_int(den) if sep else 1)


def _adds_up(old: str, cost: str, new: str) -> bool:
    """Whether ``new == bounded_sum(old + cost)`` for three ``"num/den"`` texts."""
    on, od = _int_pair(old)
    cn, cd = _int_pair(cost)
    nn, nd = _int_pair(new)
    if nd == 0:
        return False
    den = od * cd
    if den.bit_length() <= SUM_BITS:  # the sum's reduced denominator fits: no rounding
        return nn * den == (on * cd + cn * od) * nd
    return bounded_sum(Fraction(on, od) + Fraction(cn, cd)) == Fraction(nn, nd)


def sums_add_up(seen: LedgerTip, payloads: Iterable[str], cached: LedgerTip) -> bool:
    """Whether ``cached``'s sums are what a cache holding ``seen``'s sums holds once it
    added the records whose canonical payloads are ``payloads`` (each cost read from
    its payload as the sums trigger reads it). The cache adds each cost exactly,
    rounding a sum up by less than ``2**-SUM_BITS`` where its denominator would pass
    `SUM_BITS` (`bounded_sum`), so the cached sums lie between the exact sums and the
    exact sums plus one such step per record: never below (an under-count).

    Examples:
        >>> seen = LedgerTip(1, "h", Fraction(1, 2), Fraction(0))
        >>> one = '{"cost":{"delta":"0/1","epsilon":"1/4","kind":"cost"}}'
        >>> sums_add_up(seen, [one], LedgerTip(2, "g", Fraction(3, 4), Fraction(0)))
        True
        >>> sums_add_up(seen, [one], LedgerTip(2, "g", Fraction(1, 2), Fraction(0)))
        False
    """
    eps, delta, count = seen.epsilon_sum, seen.delta_sum, 0
    for payload in payloads:
        cost = _cost_in(payload)
        if cost is None:
            return False
        eps, delta, count = eps + cost[0], delta + cost[1], count + 1
    step = Fraction(count, 1 << SUM_BITS)
    return (eps <= cached.epsilon_sum <= eps + step
            and delta <= cached.delta_sum <= delta + step)


#: Where a canonical payload's top-level cost starts (sorted keys: delta, then epsilon;
#: no charge has a key named cost, and a quote inside a string is escaped).
_COST_AT = '"cost":{"delta":"'


def _cost_in(payload: str) -> tuple[Fraction, Fraction] | None:
    """(epsilon, delta) of the top-level cost in a canonical payload, found by position
    as the PostgreSQL sums trigger finds it; None if it is not there."""
    at = payload.find(_COST_AT)
    if at < 0:
        return None
    start = at + len(_COST_AT)
    end = payload.find('"', start)
    if end < 0 or not payload.startswith('","epsilon":"', end):
        return None
    eps_end = payload.find('"', end + 13)
    return _cost_pair(payload[end + 13:eps_end], payload[start:end])


@functools.lru_cache(maxsize=256)
def _cost_pair(epsilon: str, delta: str) -> tuple[Fraction, Fraction] | None:
    """Two ``"num/den"`` texts as fractions (cached: writers charge the same costs over
    and over); None if either is not one."""
    if not (_NUMBER.fullmatch(epsilon) and _NUMBER.fullmatch(delta)):
        return None
    try:
        return Fraction(*_int_pair(epsilon)), Fraction(*_int_pair(delta))
    except (ValueError, ZeroDivisionError):
        return None


_NUMBER = re.compile(r"-?[0-9]+(?:/[0-9]+)?")


def sums_follow(old_epsilon: str, old_delta: str, new_epsilon: str, new_delta: str,
                payload: str | None) -> bool:
    """Whether a ledger row's new cached sums are its old ones plus the cost of the
    record stored at the old head (``payload``), kept within `SUM_BITS` as
    `LedgerTip.after` keeps them. The SQLite trigger that guards the ledger row calls
    it (registered on every dpaccount connection), so a tip advanced by one record with
    sums that leave that record's cost out is refused by the database.
    """
    match = None if payload is None else _COST.search(payload)
    if match is None:
        return False
    try:
        return (_adds_up(old_epsilon, match[2], new_epsilon)
                and _adds_up(old_delta, match[1], new_delta))
    except (ValueError, TypeError, ZeroDivisionError):
        return False
