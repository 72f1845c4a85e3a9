"""What the SQL stores share: exact numbers as text, chain checking, the meta history.

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

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from fractions import Fraction
from typing import Any, Final

import attrs
import pydantic

from dpaccount._numeric import int_text, text_int
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, LedgerConflictError, LedgerCorruptError, StorageError
from dpaccount.keys import KEY_FILE_ENV, LedgerKey, link
from dpaccount.records import (
    GENESIS_HASH,
    LedgerMeta,
    LedgerRecord,
    canonical_bytes,
    chain_hash_payload,
    decode_record,
)

__all__ = [
    "SUM_BITS",
    "VERIFY_CHUNK",
    "LedgerTip",
    "RecordRow",
    "Snapshot",
    "SnapshotRow",
    "bounded_sum",
    "check_key",
    "check_ledger",
    "check_not_behind",
    "check_records",
    "check_since_snapshot",
    "check_tip",
    "frac_text",
    "meta_hash",
    "missed_records",
    "renumberable",
    "snapshot_link",
    "snapshot_of",
    "snapshot_settings",
    "split_at_seq",
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


#: A cached running sum whose reduced denominator needs more bits than this is rounded
#: up to a multiple of 2**-SUM_BITS. Sums of floats (denominators up to 2**1074) and of
#: decimals within the cost bounds (down to 10**-1233) never reach it, so they stay
#: exact; pairwise coprime denominators (1/(10**100 + k), ...) would otherwise grow
#: without bound and make every charge slower.
SUM_BITS = 4096
_SUM_SCALE = 1 << SUM_BITS


def bounded_sum(value: Fraction) -> Fraction:
    """``value`` if its denominator fits in `SUM_BITS` bits, else rounded **up** to the
    next multiple of ``2**-SUM_BITS`` (never below: a cached sum never under-counts).
    PostgreSQL's append function does the same in ``numeric``.

    Examples:
        >>> bounded_sum(Fraction(1, 3))
        Fraction(1, 3)
        >>> big = Fraction(1, 3**3000)
        >>> 0 < bounded_sum(big) - big < Fraction(1, 2**4096)
        True
        >>> bounded_sum(big).denominator == 2**4096
        True
    """
    if value.denominator.bit_length() <= SUM_BITS:
        return value
    return Fraction(-((-value.numerator * _SUM_SCALE) // value.denominator), _SUM_SCALE)


EMPTY_TIP = LedgerTip(0, GENESIS_HASH, Fraction(0), Fraction(0))

#: A row of the snapshots table: (head, last_hash, epsilon_sum, delta_sum, settings,
#: state, hash).
SnapshotRow = tuple[int, str, str, str, str, "str | None", str]


@attrs.frozen
class Snapshot:
    """A verified point of a ledger: its tip after ``head`` records and, when the rule's
    state has an exact encoding, that state (what the accountant reopens from).

    Attributes:
        tip: The ledger's tip after ``tip.head`` records (count, last link, sums).
        settings: Canonical JSON of the rule's description and the relation the state
            was folded under (a snapshot under other settings is not used).
        state: The rule's encoded state after those records, or None.
        hash: Its link: over the tip, settings and state, chained to the last record's
            link (HMAC under a keyed ledger's key).
    """

    tip: LedgerTip
    settings: str
    state: str | None
    hash: str


def snapshot_link(tip: LedgerTip, settings: str, state: str | None,
                  key: LedgerKey | None) -> str:
    """The link of a snapshot (see `Snapshot.hash`)."""
    body = json.dumps({"head": tip.head, "epsilon_sum": frac_text(tip.epsilon_sum),
                       "delta_sum": frac_text(tip.delta_sum), "settings": settings,
                       "state": state}, sort_keys=True, separators=(",", ":"))
    return link(tip.last_hash, b"snapshot\n" + body.encode(), key)


def snapshot_of(row: SnapshotRow, key: LedgerKey | None) -> Snapshot:
    """A snapshot row, its link checked.

    Raises:
        LedgerCorruptError: The row was altered (or written without the ledger's key).
    """
    head, last_hash, eps, delta, settings, state, link_ = row
    tip = LedgerTip(int(head), str(last_hash), parse_frac(eps, "epsilon_sum"),
                    parse_frac(delta, "delta_sum"))
    if snapshot_link(tip, str(settings), state, key) != link_:
        raise LedgerCorruptError(f"the snapshot at record {head} was altered", seq=int(head) - 1)
    return Snapshot(tip, str(settings), state, str(link_))


def snapshot_settings(meta: LedgerMeta) -> str:
    """What a rule state depends on besides the records: the rule and the relation."""
    return json.dumps({"relation": meta.relation.value, "rule": meta.rule}, sort_keys=True,
                      separators=(",", ":"))


def check_since_snapshot(snapshot: Snapshot, anchor: str | None, rows: list[RecordRow],
                         cached: LedgerTip, key: LedgerKey | None) -> list[LedgerRecord]:
    """Verify a ledger from a snapshot on: the record before it still has the link it
    recorded (``anchor``), the records since continue the chain, and the cached tip is
    the snapshot's tip plus those records.

    Raises:
        LedgerCorruptError: Any of these fails (the seq of the first bad record).
    """
    head = snapshot.tip.head
    if anchor != snapshot.tip.last_hash:
        raise LedgerCorruptError(
            f"record {head - 1} is not the one the snapshot at record {head} verified",
            seq=head - 1,
        )
    records = check_records(rows, head, snapshot.tip.last_hash, key)
    tip = snapshot.tip
    for record, row in zip(records, rows, strict=True):
        tip = tip.after(record, row[3])
    if tip.head < cached.head:
        raise LedgerCorruptError(
            f"record {tip.head} is missing: the ledger says it holds {cached.head} "
            f"records but only {tip.head} are stored (truncated)", seq=tip.head)
    if tip != cached:
        raise LedgerCorruptError(
            "the ledger's cached totals or last hash do not equal what its snapshot and "
            f"the {len(records)} records since give", seq=max(tip.head - 1, 0))
    return records


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


def check_not_behind(head: int, known_head: int) -> None:
    """A ledger never holds fewer records than a writer has already seen."""
    if head < known_head:
        raise LedgerCorruptError(
            f"the ledger holds {head} records, fewer than the {known_head} already seen",
            seq=head,
        )


def missed_records(rows: list[RecordRow], known_head: int, prev: str, head: int,
                   last_hash: str, key: LedgerKey | None = None) -> list[LedgerRecord]:
    """The records from ``known_head`` on, checked against the chain (``prev``: the hash
    of record ``known_head - 1``) and against the cached tip (``head``, ``last_hash``)."""
    missed = check_records(rows, known_head, prev, key)
    if known_head + len(missed) != head or (rows[-1][3] if rows else prev) != last_hash:
        raise LedgerCorruptError(
            f"the ledger's cached tip (head {head}) disagrees with its records", seq=head
        )
    return missed


def check_records(
    rows: Iterable[RecordRow], start: int, prev_hash: str, key: LedgerKey | None = None
) -> list[LedgerRecord]:
    """Decode record rows and check that they continue the chain at ``prev_hash``.

    Args:
        rows: Rows ordered by seq, the first expected to have seq ``start``.
        start: The seq of the first row.
        prev_hash: The hash of record ``start - 1`` (the genesis hash for 0).
        key: The ledger's key if it is keyed (the links are HMACs under it).

    Returns:
        The decoded records.

    Raises:
        LedgerCorruptError: With the seq of the first row that is missing, fails to
            decode, disagrees with its columns, or breaks the chain.
    """
    records: list[LedgerRecord] = []
    expected = start
    for seq, payload, row_prev, row_hash, query_id in rows:
        if seq != expected:
            raise LedgerCorruptError(
                f"record {expected} is missing (the next stored record is {seq})", seq=expected
            )
        if row_prev != prev_hash:
            raise LedgerCorruptError(
                f"record {seq} does not follow record {seq - 1}: the hash chain is broken",
                seq=seq,
            )
        try:
            record = decode_record(payload)
        except LedgerCorruptError as exc:
            raise LedgerCorruptError(f"record {seq}: {exc}", seq=seq) from exc
        if record.seq != seq or record.query_id != query_id:
            raise LedgerCorruptError(
                f"record {seq}: its payload disagrees with its seq or query_id columns",
                seq=seq,
            )
        if chain_hash_payload(prev_hash, payload, key) != row_hash:
            raise LedgerCorruptError(
                f"record {seq} was altered: its hash does not match its content", seq=seq
            )
        records.append(record)
        prev_hash = row_hash
        expected += 1
    return records


def tip_of(records: Iterable[LedgerRecord], last_hash: str) -> LedgerTip:
    """The tip a full list of records gives (sums added in order, as the cache adds
    them: exact, or rounded up by `bounded_sum` where they would explode)."""
    tip = EMPTY_TIP
    for record in records:
        tip = tip.after(record, last_hash)
    return LedgerTip(tip.head, last_hash, tip.epsilon_sum, tip.delta_sum)


def _sum_agrees(cached: Fraction, rounded: Fraction, exact: Callable[[], Fraction],
                head: int) -> bool:
    """Whether a cached sum is what the records give: equal to their running sum, or
    (a cache written before sums were bounded, then extended) at least their exact sum
    and within the rounding of ``head`` additions above the running sum."""
    if cached == rounded:
        return True
    if not cached <= rounded + Fraction(head, _SUM_SCALE):
        return False
    return cached >= exact()


def check_tip(actual: LedgerTip, cached: LedgerTip, costs: Sequence[PrivacyCost]) -> None:
    """Compare the tip the records give with the cached one.

    Args:
        actual: `tip_of` the records.
        cached: The ledger row's tip.
        costs: The records' costs, to compare a cached sum that is not their running sum
            with their exact sum (ledgers cached before sums were bounded).

    Raises:
        LedgerCorruptError: The records were truncated, or the cache was edited; the
            seq is the first record the two disagree about.
    """
    if actual.head < cached.head:
        raise LedgerCorruptError(
            f"record {actual.head} is missing: the ledger says it holds {cached.head} "
            f"records but only {actual.head} are stored (truncated)",
            seq=actual.head,
        )
    if actual.head > cached.head:
        raise LedgerCorruptError(
            f"record {cached.head} is not counted: the ledger says it holds {cached.head} "
            f"records but {actual.head} are stored",
            seq=cached.head,
        )
    agrees = actual.last_hash == cached.last_hash and _sum_agrees(
        cached.epsilon_sum, actual.epsilon_sum,
        lambda: sum((c.epsilon for c in costs), Fraction(0)), actual.head,
    ) and _sum_agrees(
        cached.delta_sum, actual.delta_sum,
        lambda: sum((c.delta for c in costs), Fraction(0)), actual.head,
    )
    if not agrees:
        raise LedgerCorruptError(
            "the ledger's cached totals or last hash do not equal what its "
            f"{actual.head} records give (cached {cached}, records give {actual})",
            seq=max(actual.head - 1, 0),
        )


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
    except pydantic.ValidationError as exc:
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


def running_tips(costs: Sequence[PrivacyCost], hash_at: Callable[[int], str],
                 heads: Iterable[int] = ()) -> tuple[LedgerTip, dict[int, LedgerTip]]:
    """The tip after all records (of ``costs``, in order) and after each of ``heads``,
    exactly as adding the records one by one with `LedgerTip.after` gives them;
    ``hash_at(n)`` is the hash of record ``n - 1``, asked for the heads and the end only.

    While the least common multiple of the costs' denominators fits in `SUM_BITS`, no
    running sum is ever rounded, so each sum is a sum of counts times distinct costs
    (counted, not added, per record); otherwise the records are added one by one.
    """
    wanted = set(heads)
    counts: dict[int, list[Any]] = {}  # id(cost) -> [cost, count] (costs are shared)
    lcm_e = lcm_d = 1
    at: dict[int, LedgerTip] = {}

    def tip(n: int) -> LedgerTip:
        eps = sum((c.epsilon * k for c, k in counts.values()), Fraction(0))
        delta = sum((c.delta * k for c, k in counts.values()), Fraction(0))
        return LedgerTip(n, hash_at(n) if n else GENESIS_HASH, eps, delta)

    for n, cost in enumerate(costs, 1):
        entry = counts.get(id(cost))
        if entry is None:
            lcm_e = math.lcm(lcm_e, cost.epsilon.denominator)
            lcm_d = math.lcm(lcm_d, cost.delta.denominator)
            if lcm_e.bit_length() > SUM_BITS or lcm_d.bit_length() > SUM_BITS:
                return _running_tips_one_by_one(costs, hash_at, wanted)
            counts[id(cost)] = [cost, 1]
        else:
            entry[1] += 1
        if n in wanted:
            at[n] = tip(n)
    return tip(len(costs)), at


def _running_tips_one_by_one(costs: Sequence[PrivacyCost], hash_at: Callable[[int], str],
                             wanted: set[int]) -> tuple[LedgerTip, dict[int, LedgerTip]]:
    running, at = EMPTY_TIP, {}
    for n, cost in enumerate(costs, 1):
        running = running.plus(cost, "")  # the hash is filled in where it is asked for
        if n in wanted:
            at[n] = attrs.evolve(running, last_hash=hash_at(n))
    if costs:
        running = attrs.evolve(running, last_hash=hash_at(len(costs)))
    return running, at


#: Full verification reads and checks this many records at a time, so its memory does not
#: grow with the ledger (a cost reference per record is all it keeps).
VERIFY_CHUNK: Final = 50_000


def check_ledger(chunks: Iterable[Sequence[RecordRow]], cached: LedgerTip,
                 snapshot_rows: Sequence[SnapshotRow], key: LedgerKey | None,
                 sink: Callable[[list[LedgerRecord]], object] | None = None) -> None:
    """Verify a whole ledger's records: decoded, chained from the genesis hash, the cached
    tip what they add up to, and every snapshot's link and tip those of the records up
    to its head.

    Args:
        chunks: The ledger's record rows in seq order, in consecutive chunks (each
            checked and then dropped).
        cached: The ledger row's tip.
        snapshot_rows: The ledger's stored snapshots.
        key: The ledger's key if it is keyed.
        sink: Given each chunk's decoded records once they are checked (a caller that
            needs the records too, such as ``dpaccount ledger verify``, decodes once).

    Raises:
        LedgerCorruptError: With the seq of the first bad record.
    """
    snapshots = [snapshot_of(row, key) for row in snapshot_rows]
    heads = {snap.tip.head for snap in snapshots}
    costs: list[PrivacyCost] = []
    hashes: dict[int, str] = {}  # head -> the hash of the record before it, where asked
    prev = GENESIS_HASH
    for chunk in chunks:
        start = len(costs)
        records = check_records(chunk, start, prev, key)
        costs.extend(record.cost for record in records)
        if sink is not None:
            sink(records)
        for head in heads:
            if start < head <= len(costs):
                hashes[head] = chunk[head - start - 1][3]
        prev = chunk[-1][3] if chunk else prev
    hashes[len(costs)] = prev
    final, at = running_tips(costs, hashes.__getitem__, heads)
    check_tip(final, cached, costs)
    for snap in snapshots:
        if snap.tip.head > len(costs):
            raise LedgerCorruptError(
                f"a snapshot at record {snap.tip.head} is beyond the records",
                seq=len(costs))
        if at[snap.tip.head] != snap.tip:
            raise LedgerCorruptError(
                f"the snapshot at record {snap.tip.head} does not match the records before "
                "it", seq=snap.tip.head - 1)
