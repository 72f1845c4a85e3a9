"""Checking a stored hash chain: records, the cached tip, snapshots, full verification.

The SQL stores and the offline export check share these: rows are decoded and checked
against their links (`check_records`), the tip their costs add up to is compared with
the cached one (`check_tip`), snapshots are checked by their links and against the
records before them (`snapshot_of`, `check_since_snapshot`), and a whole ledger is
verified as a stream of row chunks (`check_ledger`). Like `_sql`, nothing here knows
about differential privacy; the checks are about integrity only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import Any, Final

import attrs

from dpaccount.costs import PrivacyCost
from dpaccount.errors import LedgerCorruptError
from dpaccount.keys import LedgerKey, link
from dpaccount.records import GENESIS_HASH, LedgerRecord, chain_hash_payload, decode_record
from dpaccount.storage._sql import (
    EMPTY_TIP,
    SUM_BITS,
    LedgerTip,
    RecordRow,
    SnapshotRow,
    bounded_sum,
    frac_text,
    parse_frac,
)

__all__ = [
    "VERIFY_CHUNK",
    "Snapshot",
    "check_adds_up",
    "check_extends",
    "check_ledger",
    "check_not_behind",
    "check_records",
    "check_since_snapshot",
    "check_tip",
    "fold_tip",
    "missed_records",
    "running_tips",
    "seen_after_read",
    "seen_after_verify",
    "snapshot_link",
    "snapshot_of",
    "tip_of",
]


# -- snapshots -----------------------------------------------------------------------------

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



# -- records and the cached tip ---------------------------------------------------------

def check_not_behind(head: int, known_head: int) -> None:
    """A ledger never holds fewer records than a writer has already seen."""
    if head < known_head:
        raise LedgerCorruptError(
            f"the ledger holds {head} records, fewer than the {known_head} already seen",
            seq=head,
        )


def check_extends(tip: LedgerTip, seen: LedgerTip | None, anchor: str | None) -> None:
    """The ledger's tip, read under its lock, must extend the tip a writer saw last.

    Fewer records than seen, as many records with another last link or other sums (a
    reset), or more records that no longer pass through the last link seen (``anchor``:
    the stored link of record ``seen.head - 1``, asked for only when ``tip.head >
    seen.head``) or whose sums are smaller, is tampering: someone bypassed the
    protective triggers (docs/ledgers.md, "Fail closed inside the deciding transaction").

    Raises:
        LedgerCorruptError: The tip does not extend ``seen``; nothing may be written.
    """
    if seen is None:
        return
    check_not_behind(tip.head, seen.head)
    if tip.head == seen.head:
        if tip != seen:
            raise LedgerCorruptError(
                "the ledger's cached tip (its last link or sums) changed without new records "
                "since this writer read it: someone reset or edited it around the protective "
                "triggers; nothing was written", seq=max(tip.head - 1, 0))
        return
    if anchor != seen.last_hash:
        raise LedgerCorruptError(
            f"record {seen.head - 1} is not the one this writer read: the ledger's chain "
            "changed under it; nothing was written; reopen the ledger",
            seq=max(seen.head - 1, 0))
    if tip.epsilon_sum < seen.epsilon_sum or tip.delta_sum < seen.delta_sum:
        raise LedgerCorruptError(
            "the ledger's cached sums moved backwards since this writer read them: someone "
            "reset them around the protective triggers; nothing was written", seq=seen.head)


def fold_tip(tip: LedgerTip, records: Sequence[LedgerRecord], rows: Sequence[RecordRow]
             ) -> LedgerTip:
    """``tip`` after ``records`` (decoded from ``rows``, which carry their links), the
    sums added one by one as `LedgerTip.after` adds them."""
    if len(records) != len(rows):
        raise LedgerCorruptError("records and their rows differ in number")
    if not records:
        return tip
    eps, delta = tip.epsilon_sum, tip.delta_sum
    for record in records:
        eps = bounded_sum(eps + record.cost.epsilon)
        delta = bounded_sum(delta + record.cost.delta)
    return LedgerTip(tip.head + len(records), str(rows[-1][3]), eps, delta)


def seen_after_read(seen: LedgerTip | None, start: int, prev: str,
                    rows: Sequence[RecordRow], records: Sequence[LedgerRecord]
                    ) -> LedgerTip | None:
    """What a writer has seen once it read every record from ``start`` on (``prev``: the
    link of record ``start - 1``; ``records`` decoded from ``rows``): ``seen`` extended
    by the records after it. A read that starts after ``seen`` leaves it as it was.

    Raises:
        LedgerCorruptError: The records end before ``seen`` or no longer pass through
            its last link.
    """
    if seen is None or seen.head < start:
        return seen
    end = start + len(rows)
    check_not_behind(end, seen.head)
    anchor = prev if seen.head == start else rows[seen.head - start - 1][3]
    if anchor != seen.last_hash:
        raise LedgerCorruptError(
            f"record {seen.head - 1} is not the one this store read earlier: the ledger's "
            "chain changed (a server crash lost an asynchronous commit, or someone rewrote "
            "it); reopen the ledger", seq=max(seen.head - 1, 0))
    skip = seen.head - start
    return fold_tip(seen, records[skip:], rows[skip:])


def seen_after_verify(seen: LedgerTip | None, tip: LedgerTip) -> LedgerTip | None:
    """What a writer has seen once it verified the ledger up to ``tip``: ``tip`` where it
    saw nothing yet or the same; otherwise ``seen`` (a tip further ahead is kept for the
    next write to check under the lock), after checking that ``tip`` does not fall
    behind it.

    Raises:
        LedgerCorruptError: ``tip`` is at or before ``seen`` and does not extend it.
    """
    if seen is None or tip == seen:
        return tip
    if tip.head <= seen.head:
        check_extends(tip, seen, None)
    return seen


def check_adds_up(seen: LedgerTip | None, known_head: int, missed: Sequence[LedgerRecord],
                  rows: Sequence[RecordRow], tip: LedgerTip) -> None:
    """The records missed since ``seen`` (which the caller had folded up to
    ``known_head``) add up exactly to ``tip``: a tip moved forward past them with sums
    that leave some of their costs out was written around the triggers.

    Raises:
        LedgerCorruptError: They do not add up.
    """
    if seen is None or seen.head != known_head:
        return
    if fold_tip(seen, missed, rows) != tip:
        raise LedgerCorruptError(
            f"the ledger's cached tip (head {tip.head}) is not what the records this writer "
            "missed add to the tip it saw: someone wrote it around the protective triggers",
            seq=max(tip.head - 1, 0))


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
    if not cached <= rounded + Fraction(head, 1 << SUM_BITS):
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



# -- full verification -----------------------------------------------------------------

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
                 sink: Callable[[list[LedgerRecord]], object] | None = None,
                 progress: Callable[[int, int | None], object] | None = None) -> None:
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
        progress: Called as ``progress(checked, total)`` after each chunk, ``total``
            the cached tip's record count (what a progress bar shows).

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
        if progress is not None:
            progress(len(costs), cached.head)
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
