"""Cold start: ``import dpaccount`` against its baseline, and each engine's first call.

Run::

    python benchmarks/bench_coldstart.py [--repeats 5]

Every measurement runs in a fresh interpreter (``python -c``), alternating the two sides
of each comparison, and prints min and median of the repeats:

1. ``import numpy, scipy.special`` (what dpaccount needs at import) against
   ``import dpaccount``. Goal (issue 16): within 1.2x. A third line imports the runtime
   dependencies dpaccount must use, pydantic and attrs, on top of the baseline: the floor
   no dpaccount code can go below.
2. For each engine, its first call in a fresh process after ``import dpaccount`` (the
   engine's deferred imports included) against a second, warm call of the same work in
   that process. Goal: first within 2x of warm.

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

IMPORTS = {
    "numpy + scipy.special": "import numpy, scipy.special",
    "dpaccount": "import dpaccount",
    # The floor: every runtime dependency dpaccount is required to use (pydantic for the
    # stored records: its BaseModel, which any model needs; attrs for value objects),
    # imported and doing nothing.
    "+ pydantic + attrs (floor)": (
        "import numpy, scipy.special, attrs\nfrom pydantic import BaseModel"
    ),
}

# Each snippet imports dpaccount (measured in part 1), then runs its workload twice,
# timing both calls: the engine's own deferred imports fall in the first.
ENGINE = """
import json, time
import dpaccount
def work():
{body}
t0 = time.perf_counter(); work(); t1 = time.perf_counter(); work(); t2 = time.perf_counter()
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
    code = f"import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)"
    return float(run(code))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    compile_dpaccount()
    times: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(args.repeats):
        for name, statement in IMPORTS.items():
            times[name].append(import_time(statement))
    print("== import (fresh interpreter each, ms)")
    for name, values in times.items():
        print(f"  {name:28s} min {min(values) * 1e3:7.1f}  median "
              f"{statistics.median(values) * 1e3:7.1f}")
    base, ours = times["numpy + scipy.special"], times["dpaccount"]
    floor = times["+ pydantic + attrs (floor)"]
    print(f"  ratio dpaccount / baseline: min {min(ours) / min(base):.2f}, median "
          f"{statistics.median(ours) / statistics.median(base):.2f} (goal <= 1.2)")
    print(f"  ratio floor / baseline:     min {min(floor) / min(base):.2f}, median "
          f"{statistics.median(floor) / statistics.median(base):.2f} (the runtime "
          "dependencies alone, before any dpaccount code)")
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


if __name__ == "__main__":
    main()
