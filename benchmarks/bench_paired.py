"""Before/after in one run: the charge path of two source trees, paired and alternating.

Runs ``bench_charge.py`` (the flat-in-N rows and each kind of charge) and
``bench_rules.py --quick`` (per-charge time of every rule, alone and through the
Accountant) once against a checkout of ``--before`` (a git revision, checked out into a
temporary worktree) and once against this tree, alternating which goes first, for
``--rounds`` rounds. Each script is the tree's own (a rule the older tree lacks is simply
absent from its rows). Every row that both trees print is matched by its label; the
figure kept per side is the minimum over the rounds (the least disturbed by other work on
the machine), and the table prints before, after and after/before, with the spread of
the per-round ratios. Goal (issue 30, item 6): no slower charge path, i.e. ratios about 1
within the spread.

Run: python benchmarks/bench_paired.py [--before 8827cb5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: (script, arguments): the benchmarks whose rows are compared.
SCRIPTS = (("bench_charge.py", ("--quick",)), ("bench_rules.py", ("--quick",)))
#: The timing rows of the two scripts' outputs: (pattern, how to name the row, unit).
_PATTERNS = (
    # bench_charge part 1: "   10,000   6.18   n/a   n/a"
    (re.compile(r"^\s*(?P<n>\d[\d,]*)\s+(?P<us>\d+\.\d+)\s"), "in-memory charge after {n} records",
     1.0),
    # bench_charge part 2: "GaussianCharge   8.53   8.78   1.16   1.16"
    (re.compile(r"^(?P<label>[A-Za-z].*?)\s{2,}(?P<us>\d+\.\d+)\s+\d+\.\d+\s+\d+\.\d+"
                r"\s+\d+\.\d+\s*$"), "charge kind: {label}", 1.0),
    # bench_rules: "  Accountant basic    6.4 us/charge   ratio/..."
    (re.compile(r"^\s*(?P<label>(?:rule|Accountant) .+?)\s{2,}(?P<us>\d+\.\d+) us/charge"),
     "per charge: {label}", 1.0),
    # bench_rules: "  first charge, Accountant basic: 0.04 ms"
    (re.compile(r"^\s*first charge, (?P<label>.+): (?P<us>\d+\.\d+) ms"),
     "first charge: {label}", 1000.0),
)


def rows(text: str) -> dict[str, float]:
    """row name -> microseconds, for the timing rows of a benchmark's output."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        for pattern, name, scale in _PATTERNS:
            match = pattern.match(line)
            if match is not None:
                label = " ".join(match.groupdict().get("label", "").split())
                found[name.format(n=match.groupdict().get("n"), label=label)] = (
                    float(match["us"]) * scale)
                break
    return found


def run(tree: Path) -> dict[str, float]:
    """One run of every script against ``tree`` (its own scripts, its own package)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    found: dict[str, float] = {}
    for script, args in SCRIPTS:
        done = subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args],
                              cwd=tree, env=env, capture_output=True, text=True, check=True)
        found.update(rows(done.stdout))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="8827cb5", help="the git revision to compare")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(before), args.before], check=True)
        try:
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for r in range(args.rounds):
                order = [("before", before), ("after", ROOT)]
                for side, tree in (order if r % 2 == 0 else order[::-1]):
                    runs[side].append(run(tree))
                    print(f"round {r + 1}: {side} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)
    labels = [k for k in runs["after"][0] if all(k in x for x in runs["before"] + runs["after"])]
    print(f"before = {args.before}, after = this tree; {args.rounds} rounds, alternating; "
          "microseconds, min over rounds")
    print(f"{'row':62s} {'before':>9s} {'after':>9s} {'after/before':>12s} "
          f"{'per-round ratios':>20s}")
    ratios = []
    for label in labels:
        b = min(x[label] for x in runs["before"])
        a = min(x[label] for x in runs["after"])
        per = [y[label] / x[label] for x, y in zip(runs["before"], runs["after"], strict=True)
               if x[label] > 0]
        ratio = a / b if b > 0 else float("nan")
        ratios.append(ratio)
        spread = f"{min(per):.2f}-{max(per):.2f}" if per else "n/a"
        print(f"{label[:62]:62s} {b:9.2f} {a:9.2f} {ratio:12.2f} {spread:>20s}")
    print(f"median after/before over {len(ratios)} rows: {statistics.median(ratios):.3f} "
          "(goal: about 1; no slower charge path)")


if __name__ == "__main__":
    main()
