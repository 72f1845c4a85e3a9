"""Every ```python block in README.md and docs/ runs (blocks of a page share a namespace).

A block written as a doctest (``>>>`` prompts) is run as one, so its printed outputs are
checked too; any other block is executed as a script.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: A page that shows a framework says so in a comment: ``<!-- needs: opacus, jax -->``.
NEEDS = re.compile(r"<!-- needs: ([a-z_, ]+) -->")
PAGES = [
    page
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if BLOCK.search(page.read_text())
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = page.read_text()
    needs = NEEDS.search(text)
    frameworks = [] if needs is None else [m.strip() for m in needs.group(1).split(",")]
    missing = [m for m in frameworks if importlib.util.find_spec(m) is None]
    if missing and os.environ.get("DPACCOUNT_REQUIRE_ML") != "1":
        pytest.skip(f"{page.name} shows {', '.join(missing)}, which is not installed")
    if frameworks:  # the frameworks' own warnings (Opacus' RNG notice, torch hooks)
        for module in ("opacus", "torch", "jax"):
            warnings.filterwarnings("ignore", module=module)
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
    blocks = BLOCK.findall(text)
    monkeypatch.chdir(tmp_path)  # examples that write ledger files write them here
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for number, code in enumerate(blocks, 1):
        name = f"{page.name}[block {number}]"
        if code.lstrip().startswith(">>>"):
            test = doctest.DocTestParser().get_doctest(code, namespace, name, str(page), 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            result = runner.run(test, clear_globs=False)
            namespace.update(test.globs)  # DocTest works on a copy of the namespace
            assert result.failed == 0, f"{name}: {result.failed} doctest example(s) failed"
            continue
        try:
            exec(compile(code, name, "exec"), namespace)
        except Exception as exc:  # report which block of which page failed
            raise AssertionError(f"{page.name} block {number} failed: {exc!r}") from exc
    assert os.getcwd() == str(tmp_path)
