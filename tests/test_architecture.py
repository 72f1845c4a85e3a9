"""The one import direction: values <- rules <- mechanisms <- stateful <- edges."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dpaccount"

#: Layer of each module, by dotted-name prefix (longest prefix wins).
LAYERS = {
    "dpaccount.errors": 0,
    "dpaccount._numeric": 0,
    "dpaccount.costs": 0,
    "dpaccount.charges": 0,
    "dpaccount.composition": 1,
    "dpaccount.accounting": 1,
    "dpaccount.mechanisms": 2,
    "dpaccount.keys": 3,
    "dpaccount.records": 3,
    "dpaccount.config": 3,
    "dpaccount.storage": 3,
    "dpaccount.accountant": 3,
    "dpaccount.budgets": 3,
    "dpaccount.guard": 3,
    "dpaccount.aggregates": 3,
    "dpaccount.ledgers": 3,
    "dpaccount.cli": 4,
    "dpaccount.ledger_cli": 4,
    "dpaccount.audit": 4,
    "dpaccount.plot": 4,
    "dpaccount._demo": 4,
    "dpaccount.integrations": 4,
    "dpaccount": 4,  # the package __init__ re-exports everything
}
NAMES = ["values", "rules", "mechanisms", "stateful", "edges"]

#: Storage knows nothing of DP: it may not import these even though they are lower.
STORAGE_FORBIDDEN = (
    "dpaccount.composition", "dpaccount.accounting", "dpaccount.mechanisms",
    "dpaccount.accountant", "dpaccount.guard",
)


def layer_of(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len,
               default=None)
    if best is None:
        raise AssertionError(f"{module} has no layer: add it to LAYERS and ARCHITECTURE.md")
    return LAYERS[best]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] == "dpaccount"}


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_point_down(path: Path) -> None:
    me = module_name(path)
    mine = layer_of(me)
    for imported in imports_of(path):
        theirs = layer_of(imported)
        assert theirs <= mine, (
            f"{me} ({NAMES[mine]}) imports {imported} ({NAMES[theirs]}): "
            "imports must point down the layers"
        )
        if me.startswith("dpaccount.storage"):
            assert not imported.startswith(STORAGE_FORBIDDEN), f"{me} imports {imported}"


def test_every_module_is_classified() -> None:
    assert MODULES, "no modules found"
    for path in MODULES:
        layer_of(module_name(path))
