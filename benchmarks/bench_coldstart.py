"""Cold start: ``import dpaccount`` against its baseline, and each engine's first call.

Run::

    python benchmarks/bench_coldstart.py [--repeats 5]

Every measurement runs in a fresh interpreter (``python -c``) and times CPU
(``time.process_time`` around the statement, in that interpreter), alternating the sides
of each comparison (which goes first swaps every repeat), and prints min and median of the
repeats and the median of the paired ratios:

1. ``import numpy, scipy.special`` (what dpaccount needs at import) against
   ``import dpaccount``. Goal (issue 27, item 4): within 1.3x, paired. A third line imports
   the one other runtime dependency an in-memory accountant uses, attrs, on top of the
   baseline: the floor no dpaccount code can go below. pydantic is not in it: it is
   imported only when records are (de)serialised (a durable ledger, an export), and the
   last line says whether an in-memory accountant's charge imported it (it must not).
2. For each engine, its first call in a fresh process after ``import dpaccount`` (the
   engine's deferred imports included, pydantic for the SQLite ledger) against a second,
   warm call of the same work in that process, both in CPU time. Goal: first within 2x
   of warm.

Both sides import compiled bytecode, as installed packages do (pip compiles a wheel's
modules when it installs them): dpaccount's modules are compiled first, also under
``PYTHONDONTWRITEBYTECODE=1`` and in an editable install, where every import would
otherwise compile dpaccount from source while numpy and scipy load their ``.pyc``
files (that alone made ``import dpaccount`` about 20% slower, and the first call into a
lazily imported engine up to 5x slower).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from _bytecode import compile_dpaccount

BASELINE, OURS = "numpy + scipy.special", "dpaccount"
IMPORTS = {
    BASELINE: "import numpy, scipy.special",
    OURS: "import dpaccount",
    # The floor: every runtime dependency an in-memory accountant uses (attrs, for value
    # objects), imported and doing nothing.
    "+ attrs (floor)": "import numpy, scipy.special, attrs",
    # Context: what pydantic (imported when records are serialised) would add.
    "+ attrs + pydantic (context)": (
        "import numpy, scipy.special, attrs\nfrom pydantic import BaseModel"
    ),
}

#: An in-memory accountant's charge must not import pydantic (nor sqlite3).
IN_MEMORY = """
import sys
import dpaccount
acct = dpaccount.Accountant(dpaccount.Budget(10, "1e-6"), rule="filter")
acct.charge(dpaccount.GaussianCharge(10, 1, "0.5"))
print(sorted(m for m in ("pydantic", "sqlite3", "psycopg") if m in sys.modules))
"""

# Each snippet imports dpaccount (measured in part 1), then runs its workload twice,
# timing both calls: the engine's own deferred imports fall in the first.
ENGINE = """
import json, time
import dpaccount
def work():
{body}
t0 = time.process_time(); work(); t1 = time.process_time(); work(); t2 = time.process_time()
print(json.dumps([t1 - t0, t2 - t1]))
"""

ENGINES = {
    "PLD (DP-SGD epsilon, 14063 steps)": """
    from dpaccount.accounting import dpsgd_epsilon
    dpsgd_epsilon(sampling_rate=256 / 60000, noise_multiplier=1.1, steps=14063,
                  target_delta=1e-5)""",
    "RDP plan (100 Gaussians)": """
    from dpaccount.accounting.rdp import RDPRule
    from dpaccount.accounting.rdp.charge_curves import _atom_floats
    from dpaccount.charges import GaussianCharge
    _atom_floats.cache_clear()
    c = GaussianCharge(1, 1, 1)
    rule = RDPRule(1e-5, adaptive=False, plan=[(c, 100)])""",
    "optimal (10^6 x 0.001)": """
    from dpaccount.composition.optimal import optimal
    from dpaccount import PrivacyCost
    optimal(PrivacyCost("0.001"), 10**6, "1e-6")""",
    "in-memory Accountant, one charge": """
    from dpaccount import Accountant, Budget, GaussianCharge
    Accountant(Budget(10, "1e-6"), rule="filter").charge(GaussianCharge(10, 1, "0.5"))""",
    "Accountant + SQLite ledger, one charge": """
    import tempfile, os
    from dpaccount import Budget, PrivacyCost, open_ledger
    path = os.path.join(tempfile.mkdtemp(), "l.db")
    acct = open_ledger("sqlite:///" + path, name="b", budget=Budget(1))
    acct.charge(PrivacyCost("0.01"))""",
}


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    return out.stdout.strip()


def import_time(statement: str) -> float:
    """CPU seconds of ``statement`` in a fresh interpreter (its start-up excluded)."""
    code = f"import time\nt = time.process_time()\n{statement}\nprint(time.process_time() - t)"
    return float(run(code))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    compile_dpaccount()
    times: dict[str, list[float]] = {name: [] for name in IMPORTS}
    names = list(IMPORTS)
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:  # alternate the order
            times[name].append(import_time(IMPORTS[name]))
    print("== import (fresh interpreter each, CPU ms of the import statement)")
    for name, values in times.items():
        print(f"  {name:30s} min {min(values) * 1e3:7.1f}  median "
              f"{statistics.median(values) * 1e3:7.1f}")
    base = times[BASELINE]
    for name, values in times.items():
        if name == BASELINE:
            continue
        paired = [v / b for v, b in zip(values, base, strict=True)]
        goal = "  (goal <= 1.3)" if name == OURS else ""
        print(f"  {name:30s} / baseline: paired median {statistics.median(paired):.2f} "
              f"[{min(paired):.2f}..{max(paired):.2f}], min/min "
              f"{min(values) / min(base):.2f}{goal}")
    print(f"  modules an in-memory charge imported of pydantic, sqlite3, psycopg: "
          f"{run(IN_MEMORY)} (goal: none)")
    print("\n== first call after import dpaccount (fresh process) against the warm second call")
    for name, body in ENGINES.items():
        firsts, warms = [], []
        for _ in range(args.repeats):
            first, warm = json.loads(run(ENGINE.format(body=body)))
            firsts.append(first)
            warms.append(warm)
        ratio = statistics.median(firsts) / statistics.median(warms)
        print(f"  {name:40s} first min/med {min(firsts) * 1e3:8.1f}/"
              f"{statistics.median(firsts) * 1e3:8.1f} ms  warm min/med "
              f"{min(warms) * 1e3:8.2f}/{statistics.median(warms) * 1e3:8.2f} ms  "
              f"first/warm (medians) {ratio:6.1f} (goal <= 2)")
    print("  (CPU time, time.process_time, in the fresh process)")


if __name__ == "__main__":
    main()
