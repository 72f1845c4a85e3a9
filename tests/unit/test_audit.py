"""An auditor's view (issue: ledgers for a data platform, item 4): spend under the rule,
``ledger list``, ``show`` filters, exports that re-verify offline, and the HTML report,
opened in a real headless Chromium."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from liveness import LIVENESS_SECONDS

from dpaccount import Budget, GaussianCharge, PrivacyCost, open_ledger
from dpaccount.audit import html_report, spend_over_time, summarize, verify_export
from dpaccount.errors import ConfigError, LedgerCorruptError
from dpaccount.keys import LedgerKey
from dpaccount.ledger_cli import ledger_main

STEP = GaussianCharge(sigma=10, sensitivity=1, epsilon=1)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = ledger_main(["ledger", *argv], out=out)
    return status, out.getvalue()


def _rdp_ledger(url: str, name: str = "train", steps: int = 60) -> PrivacyCost:
    """A Rényi-DP ledger whose charges sum far above what the rule spends."""
    with open_ledger(url, name=name, budget=Budget(10, "1e-5"), rule="rdp") as acct:
        for i in range(steps):
            acct.charge(STEP, label="dp-sgd step" if i % 3 else "eval",
                        query_id=f"nightly-{i // 20}/step-{i}")
        return acct.spent


def test_the_spend_is_composed_under_the_rule_not_summed(url: str) -> None:
    # The report used to plot the plain sum (eps 60 here) against a budget of 2.
    spent = _rdp_ledger(url)
    with open_ledger(url, name="train", read_only=True) as acct:
        spend = spend_over_time(acct._meta, acct.records)  # type: ignore[attr-defined]
        plain = sum((r.cost.epsilon for r in acct.records), Fraction(0))
    assert spend.spent == spent  # the replay agrees with the accountant's own state
    assert spend.spent.epsilon < 10 < plain
    assert spend.rule == "rdp"
    last = spend.points[-1]
    for coordinate in ("epsilon", "delta"):  # the attributed parts add up to the spend
        parts = sum(last.attributed(g, coordinate) for g in range(len(spend.groups)))
        assert parts == pytest.approx(float(getattr(spend.spent, coordinate)), rel=1e-9)
    spends = [p.spent.epsilon for p in spend.points]
    assert spends == sorted(spends)


def test_ledger_list_shows_every_ledger_with_spend_and_remaining(url: str) -> None:
    _rdp_ledger(url, "train", 6)
    with open_ledger(url, name="census", budget=Budget(1)) as acct:
        acct.charge(PrivacyCost("0.25"))
    status, text = run("list", url)
    assert status == 0
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert set(lines) == {"census", "train"}
    assert "epsilon 0.75" in lines["census"] and "rdp" in lines["train"]


def test_show_filters_and_summarises(sqlite_url: str) -> None:
    _rdp_ledger(sqlite_url, steps=9)
    status, text = run("show", sqlite_url, "--name", "train", "--label", "eval*")
    assert status == 0 and "shown: 3 of 9 records" in text
    assert text.count("eval") >= 3 and "dp-sgd step" not in text.split("shown:")[0]
    _, text = run("show", sqlite_url, "--name", "train", "--tail", "2")
    assert "shown: 2 of 9 records" in text
    _, text = run("show", sqlite_url, "--name", "train", "--since", "2999-01-01")
    assert "shown: 0 of 9 records" in text
    _, text = run("show", sqlite_url, "--name", "train", "--summary", "--by", "job")
    assert "nightly-0" in text and "step-1" not in text
    assert run("show", sqlite_url, "--name", "train", "--since", "yesterday")[0] == 2


def test_an_export_reverifies_offline_and_detects_each_edit(url: str, tmp_path: Path) -> None:
    _rdp_ledger(url, steps=5)
    path = tmp_path / "export.json"
    assert run("export", url, "--name", "train", "--output", str(path))[0] == 0
    status, text = run("verify", "--export", str(path))
    assert status == 0 and "5 intact records" in text
    document = json.loads(path.read_text())
    check = verify_export(document)
    assert len(check.records) == 5 and not check.overspent

    def broken(edit: str) -> dict[str, object]:
        doc = json.loads(path.read_text())
        if edit == "payload":
            doc["records"][2]["payload"] = doc["records"][2]["payload"].replace(
                '"label":"dp-sgd step"', '"label":"other"')
        elif edit == "copy":
            doc["records"][2]["record"]["label"] = "other"
        elif edit == "drop":
            del doc["records"][1]
        elif edit == "settings":
            doc["ledger"]["budget_epsilon"] = "100/1"
        return doc

    for edit, seq in (("payload", 2), ("copy", 2), ("drop", 1), ("settings", None)):
        with pytest.raises(LedgerCorruptError) as info:
            verify_export(broken(edit))
        assert info.value.seq == seq, edit
    with pytest.raises(ConfigError, match="not a dpaccount ledger export"):
        verify_export({"records": []})


def test_an_overspent_export_and_a_keyed_export(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    key = LedgerKey.from_hex("11" * 32)
    with open_ledger(url, name="L", budget=Budget(1), key=key) as acct:
        acct.charge(PrivacyCost("0.75"))
    open_ledger(url, name="L", budget=Budget("0.5"), key=key, migrate=True).close()
    key_file = tmp_path / "k.key"
    key.write(key_file)
    path = tmp_path / "e.json"
    assert run("export", url, "--name", "L", "--key-file", str(key_file), "--output",
               str(path))[0] == 0
    status, text = run("verify", "--export", str(path), "--key-file", str(key_file))
    assert status == 1 and "OVERSPENT" in text
    assert run("verify", "--export", str(path))[0] == 2  # keyed: the key is needed


def test_csv_export_carries_the_links(sqlite_url: str, tmp_path: Path) -> None:
    _rdp_ledger(sqlite_url, steps=3)
    path = tmp_path / "e.csv"
    assert run("export", sqlite_url, "--name", "train", "--format", "csv", "--output",
               str(path))[0] == 0
    header, first, second = path.read_text().splitlines()[:3]
    assert header.endswith("prev_hash,hash")
    assert first.split(",")[-1] == second.split(",")[-2]  # each row links to the one before


def test_the_html_report_is_self_contained_and_escapes_labels(sqlite_url: str,
                                                             tmp_path: Path) -> None:
    with open_ledger(sqlite_url, name="web", budget=Budget(1)) as acct:
        acct.charge(PrivacyCost("0.1"), label='<script>alert("x")</script>')
        records, meta = acct.records, acct._meta  # type: ignore[attr-defined]
    page = html_report([(meta, records, "verified")], title="t")
    assert "<script" not in page and "&lt;script&gt;" in page
    assert not re.search(r"""(src|href)=|url\(|@import""", page)
    assert summarize(records)[0].group == '<script>alert("x")</script>'


def _chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        reason = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("DPACCOUNT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DPACCOUNT_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    return binary


def _browse(binary: str, *args: str) -> str:
    result = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         *args], capture_output=True, text=True, timeout=LIVENESS_SECONDS, check=True,
    )
    return result.stdout


def test_the_html_report_in_headless_chromium(sqlite_url: str, tmp_path: Path) -> None:
    binary = _chromium()
    spent = _rdp_ledger(sqlite_url)
    with open_ledger(sqlite_url, name="census", budget=Budget(1)) as acct:
        acct.charge(PrivacyCost("0.25"), label="count adults")
    with open_ledger(sqlite_url, name="census/team-a", budget=Budget("0.5"),
                     parent="census") as team:
        team.charge(PrivacyCost("0.125"), label="team count")
    page = tmp_path / "report.html"
    status, _ = run("report", sqlite_url, "--all", "--output", str(page))
    assert status == 0
    dom = _browse(binary, "--dump-dom", page.as_uri())
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    assert "ledger train" in text and "ledger census" in text
    train = text.split("ledger train", 1)[1]
    shown = re.search(r"spent under the rule \(rounded up\)\s*ε (\S+), δ (\S+)", train)
    assert shown is not None
    assert float(shown[1]) >= float(spent.epsilon) > float(shown[1]) * (1 - 1e-5)
    assert "OVERSPENT" not in text
    # The glossary explains the words the page uses: the relation and the rules shown.
    glossary = text.split("Glossary", 1)[1].split("Ledgers and their shares", 1)[0]
    for term in ("relation add_remove", "spent under the rule", "rule basic", "rule rdp",
                 "share"):
        assert term in glossary, term
    # The tree: the share under its parent, with its spend against its budget (25%).
    tree = text.split("Ledgers and their shares", 1)[1].split("ledger census", 1)[0]
    assert re.search(r"census — ε 0\.375 of 1 .*census/team-a — ε 0\.125 of 0\.5 .*25%",
                     tree)
    # The parent's section names the share behind its charges.
    census = dom.split("ledger census<", 1)[1].split('<section class="ledger">', 1)[0]
    assert "latest charges, with the share behind each" in census
    assert re.search(r"<td>census/team-a</td><td>team count</td>", census)
    # δ is drawn only where it was spent: train (rdp) spends δ; census and its share none.
    assert dom.count('class="chart-delta"') == 1 and dom.count('class="chart-epsilon"') == 3
    assert 'class="chart-delta"' not in census and "δ spent: 0" in census
    assert dom.count("<polyline") == 4
    shot = tmp_path / "report.png"  # kept with the test's tmp artifacts
    _browse(binary, f"--screenshot={shot}", "--window-size=820,2400", page.as_uri())
    from PIL import Image

    with Image.open(shot) as image:
        rgb = image.convert("RGB")
        colours = {rgb.getpixel((x, y)) for x in range(rgb.width) for y in range(rgb.height)}
    assert any(r > 150 and g < 90 and b < 90 for r, g, b in colours)  # the budget line
    assert len(colours) > 50  # text, areas and lines, not a blank page
