"""Make docs/img/ledger-report.png: the HTML report of demo ledgers (a dataset with two
team shares, and a training run), as headless Chromium shows it.
Run: ``python docs/img/report_screenshot.py`` (needs chromium)."""

from __future__ import annotations

import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dpaccount import Budget, GaussianCharge, PrivacyCost, open_ledger
from dpaccount.charges import cost_of
from dpaccount.ledger_cli import ledger_main
from dpaccount.records import LedgerRecord


def _charge_at(acct, charge, when, label, query_id, *above):  # type: ignore[no-untyped-def]
    """Record a charge as if made at ``when`` (a demo's history spread over weeks), in
    ``acct`` and in the ledgers ``above`` it (a share's parents), as the joint protocol
    records it."""
    for ledger in (acct, *above):
        record = LedgerRecord(seq=ledger.store.head(), label=label, charge=charge,
                              cost=cost_of(charge), rule=ledger.rule.name, timestamp=when,
                              query_id=query_id)
        ledger.store.append(record.seq, record)


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder / 'platform.db'}"
    start = datetime(2026, 10, 1, 2, 0, tzinfo=UTC)
    open_ledger(url, name="census-2026", budget=Budget(4, "1e-6")).close()
    with open_ledger(url, name="census-2026") as acct, \
            open_ledger(url, name="census-2026/team-a", budget=Budget(1),
                        parent="census-2026") as team_a, \
            open_ledger(url, name="census-2026/team-b", budget=Budget("0.5"),
                        parent="census-2026") as team_b:
        events = []  # (when, ledger, charge, label, query id, the ledgers above it)
        for day in range(40):
            when = start + timedelta(days=day)
            events.append((when, acct, PrivacyCost("0.03"), "daily counts",
                           f"nightly-{day}/c", ()))
            if day % 7 == 0:
                events.append((when + timedelta(hours=1), acct, PrivacyCost("0.1", "1e-8"),
                               "weekly income quantiles", f"weekly-{day // 7}/q", ()))
            if day % 10 == 3:
                events.append((when + timedelta(hours=3), acct, PrivacyCost("0.05"),
                               "analyst ad hoc", f"adhoc-{day}/x", ()))
            if day % 3 == 2 and day > 4:
                events.append((when + timedelta(hours=5), team_a, PrivacyCost("0.06"),
                               "team-a cohort study", f"team-a-{day}/s", (acct,)))
                if day % 2:
                    events.append((when + timedelta(hours=7), team_b, PrivacyCost("0.04"),
                                   "team-b dashboard", f"team-b-{day}/d", (acct,)))
        for when, ledger, charge, label, query_id, above in sorted(
                events, key=lambda event: event[0]):
            _charge_at(ledger, charge, when, label, query_id, *above)
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
                    "--hide-scrollbars", f"--screenshot={target}", "--window-size=820,2600",
                    page.as_uri()], check=True, capture_output=True, timeout=120)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
