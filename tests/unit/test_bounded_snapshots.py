"""Snapshots across the change to bounded sums (issue 27, item 1): a full verification
accepts a snapshot written when the sums were exact (as `exact_sums` replays them), one
written since, and a history holding both; it still refuses a state its records do not
give."""

from __future__ import annotations

import io
import random
from fractions import Fraction
from pathlib import Path

import attrs
import pytest

from dpaccount import Budget, GaussianCharge, open_ledger
from dpaccount._numeric import SUM_BITS, exact_sums
from dpaccount.audit import check_snapshot_states
from dpaccount.composition.states import decode_state, encode_state
from dpaccount.errors import LedgerCorruptError
from dpaccount.ledger_cli import ledger_main
from dpaccount.ledgers import open_store
from dpaccount.records import LedgerRecord


def _charge(url: str, count: int, seed: int) -> None:
    acct = open_ledger(url, name="g", budget=Budget(10**6, "1e-3"), rule="gdp")
    rng = random.Random(seed)  # test workload only; not privacy noise
    for _ in range(count):
        acct.charge(GaussianCharge(1000 + rng.random(), 1, 1))  # a fresh float sigma
    acct.close()


def _records_and_snapshots(url: str) -> tuple[list[LedgerRecord], list]:  # type: ignore[type-arg]
    store = open_store(url, name="g", create=False, read_only=True)
    try:
        records: list[LedgerRecord] = []
        store.verify(records)
        return records, store.snapshots()
    finally:
        store.close()


def test_exact_then_bounded_snapshots_verify(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    with exact_sums():  # how the sums were kept before they were bounded
        _charge(url, 300, 1)
    _charge(url, 300, 2)  # resumed from the exact snapshot, bounded from there
    records, snapshots = _records_and_snapshots(url)
    states = {s.tip.head: decode_state(s.state) for s in snapshots if s.state is not None}
    bits = {head: state.mu_squared.denominator.bit_length() for head, state in states.items()}
    assert all(b > SUM_BITS + 1 for h, b in bits.items() if h <= 300)  # exact, large
    assert all(b <= SUM_BITS + 1 for h, b in bits.items() if h > 300)  # bounded
    assert min(bits) <= 300 < max(bits)  # both kinds are there
    assert check_snapshot_states(records, snapshots) == len(states)
    assert ledger_main(["ledger", "verify", url, "--name", "g"], out=io.StringIO()) == 0


def test_a_state_its_records_do_not_give_is_still_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    with exact_sums():
        _charge(url, 300, 1)
    _charge(url, 300, 2)
    records, snapshots = _records_and_snapshots(url)
    heads = sorted(s.tip.head for s in snapshots if s.state is not None)
    for head in (heads[0], heads[-1]):  # an exact one and a bounded one
        forged = []
        for snap in snapshots:
            if snap.tip.head == head:  # a little less spent than the records give
                state = decode_state(snap.state)
                less = attrs.evolve(state, mu_squared=state.mu_squared - Fraction(1, 10**6))
                snap = attrs.evolve(snap, state=encode_state(less))
            forged.append(snap)
        with pytest.raises(LedgerCorruptError, match=f"snapshot at record {head}"):
            check_snapshot_states(records, forged)
