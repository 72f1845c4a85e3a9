"""Make docs/img/ledger-report.png: the HTML report of two demo ledgers, as headless
Chromium shows it. Run: ``python docs/img/report_screenshot.py`` (needs chromium)."""

from __future__ import annotations

import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dpaccount import Budget, GaussianCharge, PrivacyCost, open_ledger
from dpaccount.charges import cost_of
from dpaccount.ledger_cli import ledger_main
from dpaccount.records import LedgerRecord


def _charge_at(acct, charge, when, label, query_id):  # type: ignore[no-untyped-def]
    """Record a charge as if made at ``when`` (a demo's history spread over weeks)."""
    record = LedgerRecord(seq=len(acct.records), label=label, charge=charge,
                          cost=cost_of(charge), rule=acct.rule.name, timestamp=when,
                          query_id=query_id)
    acct.store.append(record.seq, record)


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder / 'platform.db'}"
    start = datetime(2026, 10, 1, 2, 0, tzinfo=UTC)
    with open_ledger(url, name="census-2026", budget=Budget(4, "1e-6")) as acct:
        for day in range(40):
            when = start + timedelta(days=day)
            _charge_at(acct, PrivacyCost("0.03"), when, "daily counts", f"nightly-{day}/c")
            if day % 7 == 0:
                _charge_at(acct, PrivacyCost("0.1", "1e-8"), when + timedelta(hours=1),
                           "weekly income quantiles", f"weekly-{day // 7}/q")
            if day % 10 == 3:
                _charge_at(acct, PrivacyCost("0.05"), when + timedelta(hours=3),
                           "analyst ad hoc", f"adhoc-{day}/x")
    with open_ledger(url, name="model-training", budget=Budget(3, "1e-5"),
                     rule="rdp") as acct:
        step = GaussianCharge(sigma=20, sensitivity=1, epsilon=1)
        for i in range(90):
            _charge_at(acct, step, start + timedelta(hours=8 * i),
                       "dp-sgd step" if i % 10 else "evaluation", f"run-{i // 30}/step-{i}")
    page = folder / "report.html"
    assert ledger_main(["ledger", "report", url, "--all", "--output", str(page)]) == 0
    target = Path(__file__).with_name("ledger-report.png")
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={target}", "--window-size=820,1900",
                    page.as_uri()], check=True, capture_output=True, timeout=120)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
