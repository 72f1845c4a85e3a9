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
    "dpaccount._redact": 0,
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
    "dpaccount._cli_files": 4,
    "dpaccount.ledger_cli": 4,
    "dpaccount.audit": 4,
    "dpaccount.spend": 4,
    "dpaccount.report": 4,
    "dpaccount._progress": 4,
    "dpaccount._ledger_views": 4,
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


# -- no circles, no private reaches, modules a newcomer can hold in mind ---------------

#: The longest module (lines). Split a module along the concepts it holds before this.
MAX_MODULE_LINES = 600
#: Names an object of the accountant's family is commonly bound to: a private attribute
#: reached through one of them outside the accountant package is a reach into another
#: object's internals (make a public seam instead).
ACCOUNTANT_NAMES = ("acct", "accountant", "parent", "child", "ledger")


def _outside_type_checking(tree: ast.AST) -> list[ast.stmt]:
    """Every import statement of ``tree``, lazy ones (in functions) included, except
    those under ``if TYPE_CHECKING:``."""
    found: list[ast.stmt] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the dpaccount modules it imports. A package's ``__init__`` depends on
    the submodules it re-exports: importing the package runs them, so a submodule that
    imports its own package (or a module that imports it back) is a circle too."""
    known = {module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        me = module_name(path)
        edges: set[str] = set()
        for node in _outside_type_checking(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    edges.add(full if full in known else node.module)
        graph[me] = {e for e in edges if e in known and e != me}
    return graph


def test_no_import_circles_lazy_imports_included() -> None:
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                circle = [*path[path.index(imported):], imported]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if imported not in state:
                visit(imported)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def _parent_package(module: str, is_package: bool) -> str:
    return module if is_package else module.rsplit(".", 1)[0]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_reach_into_another_packages_private_names(path: Path) -> None:
    me = module_name(path)
    mine = _parent_package(me, path.name == "__init__.py")
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "dpaccount":
            theirs = node.module.rsplit(".", 1)[0]
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                assert not (private and theirs != mine and node.module != mine), (
                    f"{me} imports {node.module}.{alias.name}: a private name of another "
                    "package; make it public API of its owner (or move it)"
                )
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__") and isinstance(node.value, ast.Name) and \
                node.value.id in ACCOUNTANT_NAMES and not me.startswith("dpaccount.accountant"):
            raise AssertionError(
                f"{me} reaches {node.value.id}.{node.attr}: another object's private "
                "attribute; use (or add) a public method of the accountant"
            )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_modules_stay_small_enough_to_hold_in_mind(path: Path) -> None:
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, (
        f"{module_name(path)} has {lines} lines: split it along the concepts it holds "
        f"(at most {MAX_MODULE_LINES})"
    )
