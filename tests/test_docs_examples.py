"""Every ```python block in README.md and docs/ runs (blocks of a page share a namespace).

A block written as a doctest (``>>>`` prompts) is run as one, so its printed outputs are
checked too; any other block is executed as a script.
"""

from __future__ import annotations

import doctest
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
PAGES = [
    page
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if BLOCK.search(page.read_text())
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = BLOCK.findall(page.read_text())
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
