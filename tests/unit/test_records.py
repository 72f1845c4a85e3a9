"""Records: closed-world serialisation, canonical bytes and the hash chain."""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import pytest
from charge_strategies import deltas, every_charge, fractions, positive
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.charges import GaussianCharge, LaplaceCharge, Repeated, cost_of
from dpaccount.costs import PrivacyCost
from dpaccount.errors import LedgerCorruptError
from dpaccount.records import (
    GENESIS_HASH,
    LedgerRecord,
    canonical_bytes,
    chain_hash,
    decode_record,
    encode_record,
)
from dpaccount.storage._chain import check_ledger, check_records, snapshot_link, tip_of
from dpaccount.storage._sql import frac_text, parse_frac

charges = st.one_of(
    st.builds(PrivacyCost, fractions, deltas),
    st.builds(LaplaceCharge, positive, positive),
    st.builds(Repeated, st.builds(PrivacyCost, fractions, deltas), st.integers(1, 50)),
)


def make(seq: int, charge: object, label: str | None = "q", qid: str | None = None) -> LedgerRecord:
    return LedgerRecord(seq, label, charge, cost_of(charge), "basic",  # type: ignore[arg-type]
                        datetime(2026, 5, 1, tzinfo=UTC) + timedelta(seconds=seq), qid)


@settings(max_examples=100, deadline=None)
@given(charge=charges, seq=st.integers(0, 10**6), label=st.none() | st.text(max_size=20),
       qid=st.none() | st.text(max_size=20))
def test_round_trip(charge: object, seq: int, label: str | None, qid: str | None) -> None:
    record = make(seq, charge, label, qid)
    assert decode_record(canonical_bytes(record)) == record
    assert decode_record(encode_record(record).model_dump(mode="json")) == record


@settings(max_examples=200, deadline=None)
@given(charge=every_charge, other=every_charge)
def test_every_kind_of_charge_round_trips(charge: object, other: object) -> None:
    """Regression: a ledger holding a parallel charge could not be read back (the decode
    cache hashed the serialised charge, and one holding a list is not hashable)."""
    first, second = make(0, charge), make(1, other)
    for record in (first, second, first):  # the second decode of each comes from the cache
        assert decode_record(canonical_bytes(record)) == record


def test_gaussian_round_trip() -> None:
    record = make(0, GaussianCharge(3, 1, "1/2"))
    assert decode_record(canonical_bytes(record)) == record


def test_canonical_bytes_are_sorted_compact_json() -> None:
    data = canonical_bytes(make(3, PrivacyCost("1/3")))
    parsed = json.loads(data)
    assert data == json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()
    assert parsed["cost"] == {"kind": "cost", "epsilon": "1/3", "delta": "0/1"}


def test_chain_hash_is_sha256_of_prev_and_record() -> None:
    record = make(0, PrivacyCost(1))
    expected = hashlib.sha256(GENESIS_HASH.encode() + b"\n" + canonical_bytes(record))
    assert chain_hash(GENESIS_HASH, record) == expected.hexdigest()
    assert chain_hash("1" * 64, record) != chain_hash(GENESIS_HASH, record)


def test_timestamps_are_normalised_to_utc() -> None:
    local = make(0, PrivacyCost(1))
    shifted = local.timestamp.astimezone(timezone(timedelta(hours=5)))
    payload = json.loads(canonical_bytes(local))
    payload["timestamp"] = shifted.isoformat()
    assert decode_record(payload).timestamp == local.timestamp


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.update(kind_extra=1),
        lambda p: p["cost"].update(epsilon="2/1"),           # cost disagrees with charge
        lambda p: p["charge"].update(kind="module.Evil"),    # closed world
        lambda p: p["charge"].update(epsilon="-1/1"),
        lambda p: p["charge"].update(delta="1/1"),
        lambda p: p.update(schema_version=99),
        lambda p: p.update(seq=-1),
        lambda p: p.update(timestamp="0001-01-01T00:00:00+05:00"),  # year 0 in UTC
        lambda p: p.update(timestamp="2026-05-01T00:00:00"),  # naive: whose midnight?
    ],
)
def test_invalid_payloads_are_corrupt(edit: object) -> None:
    payload = json.loads(canonical_bytes(make(0, PrivacyCost(1))))
    edit(payload)  # type: ignore[operator]
    with pytest.raises(LedgerCorruptError):
        decode_record(payload)


def rows(n: int) -> list[tuple[int, str, str, str, str | None]]:
    out, prev = [], GENESIS_HASH
    for i in range(n):
        record = make(i, PrivacyCost(Fraction(i + 1, 7)), qid=f"id{i}")
        h = chain_hash(prev, record)
        out.append((i, canonical_bytes(record).decode(), prev, h, f"id{i}"))
        prev = h
    return out


def test_check_records_accepts_an_intact_chain() -> None:
    assert [r.seq for r in check_records(rows(4), 0, GENESIS_HASH)] == [0, 1, 2, 3]
    good = rows(4)
    assert [r.seq for r in check_records(good[2:], 2, good[1][3])] == [2, 3]


@pytest.mark.parametrize(
    ("mutate", "bad"),
    [
        (lambda r: r.pop(1), 1),                                                  # deleted
        (lambda r: r.__setitem__(2, (2, r[2][1].replace("3/7", "1/7"), *r[2][2:])), 2),
        (lambda r: r.__setitem__(2, (*r[2][:4], "other")), 2),                   # query_id col
        (lambda r: r.__setitem__(3, (3, r[3][1], "0" * 63 + "1", *r[3][3:])), 3),  # prev_hash
        (lambda r: r.__setitem__(0, (0, "{not json", *r[0][2:])), 0),
    ],
)
def test_check_records_names_the_first_bad_seq(mutate: object, bad: int) -> None:
    broken = rows(5)
    mutate(broken)  # type: ignore[operator]
    with pytest.raises(LedgerCorruptError) as info:
        check_records(broken, 0, GENESIS_HASH)
    assert info.value.seq == bad


@settings(max_examples=100, deadline=None)
@given(fractions)
def test_frac_text_round_trip(value: Fraction) -> None:
    assert parse_frac(frac_text(value), "x") == value


@pytest.mark.parametrize("text", ["", "1/0", "a/b", "0.5"])
def test_parse_frac_rejects_non_exact_text(text: str) -> None:
    with pytest.raises(LedgerCorruptError):
        parse_frac(text, "epsilon_sum")


def _chunked(rows: list[Any], cuts: list[int]) -> list[list[Any]]:
    bounds = [0, *sorted({c % (len(rows) + 1) for c in cuts}), len(rows)]
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]


def _snapshot_row(records: list[LedgerRecord], good: list[Any], head: int) -> tuple[Any, ...]:
    tip = tip_of(records[:head], good[head - 1][3] if head else GENESIS_HASH)
    link = snapshot_link(tip, "{}", None, None)
    return (head, tip.last_hash, frac_text(tip.epsilon_sum), frac_text(tip.delta_sum), "{}",
            None, link)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 12), cuts=st.lists(st.integers(0, 12), max_size=5),
       heads=st.lists(st.integers(1, 12), max_size=3), tamper=st.none() | st.integers(0, 11))
def test_full_verification_gives_one_verdict_however_the_rows_are_chunked(
        n: int, cuts: list[int], heads: list[int], tamper: int | None) -> None:
    """`check_ledger` streams the rows in chunks: the verdict and the first bad seq it
    names are those of checking them in one piece (chunks and snapshots at any head)."""
    good = rows(n)
    records = check_records(good, 0, GENESIS_HASH)
    cached = tip_of(records, good[-1][3] if good else GENESIS_HASH)
    snapshots = [_snapshot_row(records, good, h) for h in sorted(set(heads)) if h <= n]
    stored = list(good)
    if tamper is not None and tamper < n:
        seq, payload, *rest = stored[tamper]
        stored[tamper] = (seq, payload.replace('"label":"q"', '"label":"Q"'), *rest)

    def verdict(chunks: list[list[Any]]) -> int | None:
        try:
            check_ledger(chunks, cached, snapshots, None)
        except LedgerCorruptError as exc:
            return exc.seq
        return None

    whole = verdict([stored])
    assert whole == (tamper if tamper is not None and tamper < n else None)
    assert verdict(_chunked(stored, cuts)) == whole
