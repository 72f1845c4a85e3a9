"""docs/foundations.md stays true: every rule is listed and every cited test exists."""

from __future__ import annotations

import re
from pathlib import Path

from dpaccount.composition import RULES

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "foundations.md").read_text(encoding="utf-8")


def test_every_rule_is_on_the_page() -> None:
    for name in RULES:
        assert f"| `{name}`" in PAGE, f"rule {name!r} is missing from docs/foundations.md"


def test_every_cited_test_exists() -> None:
    cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?", PAGE)
    assert len(cited) > 20
    for path, name in cited:
        source = (ROOT / path).read_text(encoding="utf-8")
        if name:
            assert re.search(rf"def {name}\b", source), f"{path}::{name} does not exist"
