"""Every kind of charge survives a durable ledger: charged, closed, reopened (from a
snapshot and by full replay), verified by ``dpaccount ledger verify`` and by an export.

Regression: a ledger holding a `Parallel` charge (what a group-by charges) could not be
reopened, because decoding a stored record hashed its serialised charge; no test charged
every kind to a durable ledger and read it back.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from charge_strategies import every_charge
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount import Budget, GaussianMechanism, LaplaceMechanism, PrivacyCost, open_ledger
from dpaccount.accountant import SNAPSHOT_EVERY
from dpaccount.audit import verify_export
from dpaccount.charges import GaussianCharge, Parallel, Repeated, Subsampled
from dpaccount.errors import BudgetExceededError, UnsupportedChargeError
from dpaccount.ledger_cli import ledger_main

BUDGET = Budget(10**9, "0.999999")


def _charge_all(url: str, charges: list[Any], rule: str = "basic") -> list[Any]:
    """Charge what the ledger admits; the records written."""
    records = []
    with open_ledger(url, name="L", budget=BUDGET, rule=rule, create=True) as acct:
        for charge in charges:
            try:
                records.append(acct.charge(charge, label="q"))
            except (UnsupportedChargeError, BudgetExceededError):
                continue  # a charge for the other relation, or past the delta budget
        return records


def _read_back(url: str, records: list[Any], tmp: Path) -> None:
    for verify in ("recent", "full"):
        with open_ledger(url, name="L", read_only=True, verify=verify) as acct:
            assert acct.records == records  # type: ignore[attr-defined]
            spent = acct.spent
        with open_ledger(url, name="L") as again:  # by name: the stored rule
            assert again.spent == spent
    out = io.StringIO()
    assert ledger_main(["ledger", "verify", url, "--name", "L"], out=out) == 0, out.getvalue()
    export = tmp / "export.json"
    assert ledger_main(["ledger", "export", url, "--name", "L", "--output", str(export)],
                       out=io.StringIO()) == 0
    check = verify_export(json.loads(export.read_text()))
    assert list(check.records) == records


@pytest.mark.parametrize("rule", ["basic", "filter", "rdp", "gdp"])
@settings(max_examples=25, deadline=None)
@given(charges=st.lists(every_charge, min_size=1, max_size=5))
def test_every_kind_of_charge_reads_back_from_sqlite(rule: str, charges: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ledger.db'}"
        records = _charge_all(url, charges, rule)
        _read_back(url, records, Path(folder))


def test_group_by_and_training_charges_read_back_across_a_snapshot(
    url: str, tmp_path: Path
) -> None:
    """On both backends, past a snapshot: what a group-by, a DP-SGD step and the
    mechanisms charge, nested, reopens by name and verifies."""
    step = Subsampled(GaussianCharge(sigma=4, sensitivity=1, epsilon=1), "0.01", "poisson")
    kinds = [
        Parallel([PrivacyCost("0.01"), PrivacyCost("0.02")]),
        Repeated(Parallel([LaplaceMechanism(100, 1).charge] * 3), 2),
        step,
        Repeated(step, 5),
        GaussianMechanism(1, "1e-9", 50).charge,
    ]
    charges = [kinds[i % len(kinds)] for i in range(SNAPSHOT_EVERY + 7)]
    records = _charge_all(url, charges)
    assert len(records) == len(charges)
    _read_back(url, records, tmp_path)


@pytest.mark.parametrize("verify", ["recent", "full"])
def test_a_reopened_group_by_ledger_keeps_charging(sqlite_url: str, verify: str) -> None:
    part = PrivacyCost("0.1")
    with open_ledger(sqlite_url, name="L", budget=Budget(1), create=True) as acct:
        acct.charge(Parallel([part] * 5))
    with open_ledger(sqlite_url, name="L", verify=verify) as acct:
        acct.charge(Parallel([part] * 5))
        assert acct.spent == PrivacyCost("0.2")
