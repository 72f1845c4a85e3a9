"""The one import direction: values <- rules <- mechanisms <- stateful <- edges; within the
rules, the engines (accounting) see only the rule interface of composition, and only
composition's registry modules import the engines, when first used."""

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


# -- where the rules live: two packages, one direction ------------------------------

#: What `dpaccount.accounting` (the numerical engines) may import from composition:
#: the rule interface and the stored states, nothing that names rules.
ENGINE_SEAMS = ("dpaccount.composition.base", "dpaccount.composition.states")
#: The composition modules that build rules by name, so may import the engines (only
#: inside functions: the PLD engine imports scipy.fft, about 90 ms at import).
REGISTRY_MODULES = ("dpaccount.composition.registry", "dpaccount.composition.best")


def _executed_at_import(node: ast.AST) -> set[str]:
    """The dpaccount modules imported by ``node`` when its module is imported: not in a
    function body, not under ``if TYPE_CHECKING:``."""
    found: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            found |= {n for c in child.orelse for n in _executed_at_import(c)}
            continue
        if isinstance(child, ast.Import):
            found.update(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            found.add(child.module)
        found |= _executed_at_import(child)
    return {name for name in found if name.split(".")[0] == "dpaccount"}


def _package(name: str) -> list[Path]:
    return [p for p in MODULES if module_name(p) == name or module_name(p).startswith(name + ".")]


def test_engines_import_only_the_rule_interface_from_composition() -> None:
    engines = _package("dpaccount.accounting")
    assert len(engines) > 10  # the engines' packages are found
    for path in engines:
        for imported in imports_of(path):
            if imported == "dpaccount.composition" or imported.startswith("dpaccount.composition."):
                assert imported in ENGINE_SEAMS, (
                    f"{module_name(path)} imports {imported}: the engines may import only "
                    f"{ENGINE_SEAMS} from composition (docs/architecture.md, where the rules "
                    "live)"
                )


def test_only_the_registry_imports_the_engines_and_only_when_used() -> None:
    importers = set()
    for path in _package("dpaccount.composition"):
        me = module_name(path)
        engines = {m for m in imports_of(path) if m.startswith("dpaccount.accounting")}
        if not engines:
            continue
        importers.add(me)
        assert me in REGISTRY_MODULES, (
            f"{me} imports {sorted(engines)}: only {REGISTRY_MODULES} may import the "
            "engines (docs/architecture.md, where the rules live)"
        )
        eager = {m for m in _executed_at_import(ast.parse(path.read_text()))
                 if m.startswith("dpaccount.accounting")}
        assert not eager, f"{me} imports {sorted(eager)} at import time, not when used"
    assert importers == set(REGISTRY_MODULES)  # both still build the engines' rules
