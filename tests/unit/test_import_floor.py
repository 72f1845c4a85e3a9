"""Import at its floor (issue 27, item 4): pydantic (and sqlite3) are imported only when
records are (de)serialised, and the stored metadata keeps its bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpaccount.charges import Relation
from dpaccount.costs import Budget
from dpaccount.records import LedgerMeta

ROOT = Path(__file__).resolve().parents[2]

IN_MEMORY = """
import sys
import dpaccount
from dpaccount import Accountant, Budget, GaussianCharge, LaplaceCharge, PrivacyCost
from dpaccount import GaussianMechanism, LaplaceMechanism, RandomSource
for rule in ("basic", "filter", "gdp", "rdp", "zcdp", "best"):
    acct = Accountant(Budget(10, "1e-6"), rule=rule)
    acct.charge(GaussianCharge(10, 1, "0.5"), label="q")
    acct.charge(GaussianCharge(12, 1, "0.5"), query_id="id-1")
    assert len(acct.records) == 2 and acct.meta.name == "default"
acct = Accountant(Budget(10, "1e-6"))
mech = LaplaceMechanism(1, 1, rng=RandomSource.seeded(1))
acct.run(mech, lambda: 3.0)
acct.charge(LaplaceCharge(2, 1))
acct.charge(PrivacyCost("0.1"))
print(sorted(m for m in ("pydantic", "sqlite3", "dpaccount.records.models")
             if m in sys.modules))
"""

SQLITE = """
import sys
import dpaccount
from dpaccount import Budget, PrivacyCost, open_ledger
assert "pydantic" not in sys.modules
acct = open_ledger("sqlite:///" + sys.argv[1], name="b", budget=Budget(1))
acct.charge(PrivacyCost("0.25"))
acct.close()
again = open_ledger("sqlite:///" + sys.argv[1], name="b")
print(str(again.spent.epsilon), "pydantic" in sys.modules)
"""


def _run(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_an_in_memory_accountant_never_imports_pydantic_or_sqlite() -> None:
    assert _run(IN_MEMORY) == "[]"


def test_a_sqlite_ledger_imports_the_models_when_it_opens(tmp_path: Path) -> None:
    assert _run(SQLITE, str(tmp_path / "l.db")) == "1/4 True"


def test_the_stored_metadata_keeps_its_bytes() -> None:
    """The attrs `LedgerMeta` writes what the pydantic model wrote (the text is hashed into
    the meta history and compared on open): written out here by hand."""
    meta = LedgerMeta.build("a/ü", Budget("0.5", "1e-6", rho="1/3"),
                            {"name": "filter", "x": 1e-5, "v": [0.1, None]},
                            "substitution", dataset_size=10, parent="a")
    assert meta.model_dump_json() == (
        '{"schema_version":1,"name":"a/ü","budget_epsilon":"1/2",'
        '"budget_delta":"1/1000000","rule":{"name":"filter","x":0.00001,"v":[0.1,null]},'
        '"relation":"substitution","dataset_size":10,"parent":"a","budget_rho":"1/3"}'
    )
    plain = LedgerMeta.build("a", Budget.unlimited(0), {"name": "basic"}, Relation.ADD_REMOVE)
    assert plain.model_dump_json() == (
        '{"schema_version":1,"name":"a","budget_epsilon":null,"budget_delta":"0/1",'
        '"rule":{"name":"basic"},"relation":"add_remove","dataset_size":null}'
    )
    assert plain.model_dump(mode="json") == json.loads(plain.model_dump_json())
    for value in (meta, plain, meta.model_copy(update={"key_id": "0123456789abcdef"})):
        assert LedgerMeta.model_validate_json(value.model_dump_json()) == value
    assert meta.budget == Budget("0.5", "1e-6", rho="1/3")


@pytest.mark.parametrize("change", [
    {"name": ""}, {"dataset_size": 0}, {"key_id": "XYZ"}, {"relation": "both"},
    {"budget_delta": "0.1"}, {"schema_version": 2}, {"extra": 1},
])
def test_stored_metadata_is_validated_when_read(change: dict[str, object]) -> None:
    good = json.loads(LedgerMeta.build("a", Budget(1), {"name": "basic"},
                                       "add_remove").model_dump_json())
    with pytest.raises(ValueError):
        LedgerMeta.model_validate_json(json.dumps({**good, **change}))
