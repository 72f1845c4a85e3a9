"""``dpaccount demo``: a realistic guarded pipeline on a synthetic census table.

The table is generated here (100,000 rows, a fixed seed: it is public demo data, not
noise). A series of counts, sums and a mean runs through the guard against a SQLite
ledger file (``./dpaccount-demo.db`` by default); each answer is printed with its charge
and what remains, and the query that would exceed the budget is refused. The ledger
persists: a second run starts where the first stopped (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from dpaccount.accountant import Accountant
from dpaccount.costs import Budget
from dpaccount.errors import BudgetExceededError, ConfigError
from dpaccount.ledgers import open_ledger, redact_url
from dpaccount.mechanisms import GaussianMechanism, LaplaceMechanism
from dpaccount.mechanisms.base import Mechanism

__all__ = ["add_demo_command", "make_census", "run_demo"]

ROWS = 100_000
DEFAULT_LEDGER = "sqlite:///dpaccount-demo.db"
DEMO_BUDGET = Budget(1, "1e-6")


def make_census(rows: int = ROWS, seed: int = 2026) -> dict[str, np.ndarray]:
    """A synthetic census table: age, hours worked per week, income, region."""
    gen = np.random.default_rng(seed)
    age = gen.integers(0, 95, size=rows)
    hours = np.where(age >= 16, gen.normal(38, 9, size=rows).clip(0, 80), 0.0)
    income = np.where(age >= 16, gen.lognormal(10.4, 0.7, size=rows), 0.0)
    region = gen.integers(0, 5, size=rows)
    return {"age": age, "hours": hours, "income": income, "region": region}


@dataclass(frozen=True)
class _Step:
    label: str
    mechanism: Mechanism
    query: Callable[[dict[str, np.ndarray]], Any]


def _steps() -> list[_Step]:
    """The pipeline: each query declares its clipping bounds and hence its sensitivity.

    Sensitivities are for add/remove neighbours (one person's row added or removed).
    """
    income_cap = 250_000.0
    return [
        _Step("count of all people", LaplaceMechanism(epsilon="0.1", sensitivity=1),
              lambda t: int(t["age"].size)),
        _Step("count of adults (age >= 18)", LaplaceMechanism(epsilon="0.1", sensitivity=1),
              lambda t: int(np.count_nonzero(t["age"] >= 18))),
        _Step("sum of ages (clipped to [0, 100])",
              LaplaceMechanism(epsilon="0.1", sensitivity=100),
              lambda t: float(np.clip(t["age"], 0, 100).sum())),
        _Step("total weekly hours (clipped to [0, 80])",
              LaplaceMechanism(epsilon="0.2", sensitivity=80),
              lambda t: float(np.clip(t["hours"], 0, 80).sum())),
        _Step("total income (clipped to [0, 250k])",
              GaussianMechanism(epsilon="0.2", delta="1e-7", sensitivity=income_cap),
              lambda t: float(np.clip(t["income"], 0, income_cap).sum())),
        _Step("people per region (5 bins, L2 sensitivity 1)",
              GaussianMechanism(epsilon="0.2", delta="1e-7", sensitivity=1, dimension=5),
              lambda t: np.bincount(t["region"], minlength=5).astype(float)),
        _Step("count of people over 65", LaplaceMechanism(epsilon="0.1", sensitivity=1),
              lambda t: int(np.count_nonzero(t["age"] > 65))),
        _Step("count of people in region 0", LaplaceMechanism(epsilon="0.2", sensitivity=1),
              lambda t: int(np.count_nonzero(t["region"] == 0))),
    ]


def _fmt_answer(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return "[" + ", ".join(f"{v:,.0f}" for v in value) + "]"
    return f"{value:,.1f}"


def run_demo(acct: Accountant, out: TextIO | None = None) -> int:
    """Run the demo pipeline against ``acct``, printing a table; returns 0.

    Each query is charged before it touches the table; the loop stops at the first
    refusal, which is explained.
    """
    out = out or sys.stdout
    table = make_census()
    print(f"dpaccount demo: {ROWS:,} synthetic census rows; budget {acct.budget}, "
          f"rule {acct.rule.name!r}, already spent {acct.spent} in "
          f"{len(acct.records)} earlier charges", file=out)
    header = f"{'#':>3}  {'query':<48} {'noisy answer':>40}  {'charge':<30} remaining"
    print(header, file=out)
    print("-" * len(header), file=out)
    answers: dict[str, Any] = {}
    refused: tuple[_Step, BudgetExceededError] | None = None
    for step in _steps():
        try:
            answer = acct.guard(step.mechanism, label=step.label)(step.query)(table)
        except BudgetExceededError as error:
            refused = (step, error)
            break
        answers[step.label] = answer
        record = acct.records[-1]
        left = acct.remaining
        print(f"{record.seq:>3}  {step.label:<48} {_fmt_answer(answer):>40}  "
              f"{record.cost!s:<30} {left}", file=out)
        if step.label.startswith("sum of ages") and "count of all people" in answers:
            mean = answer / max(answers["count of all people"], 1.0)
            print(f"{'':>3}  {'  -> mean age = noisy sum / noisy count':<48} "
                  f"{mean:>40.2f}  {'free (post-processing)':<30}", file=out)
    if refused is None:
        print("\nevery query fitted the budget; run the demo again to see the ledger "
              "refuse (the budget persists)", file=out)
        return 0
    step, exc = refused
    print(f"\nREFUSED before touching the data: {step.label}", file=out)
    print(f"  requested {exc.requested}, already spent {exc.spent}, budget {exc.budget}",
          file=out)
    print("  Nothing was recorded and the query never ran. The ledger persists across "
          "runs;\n  start over with `dpaccount demo --fresh`, or plan queries with a "
          "tighter rule (`dpaccount compose`).", file=out)
    return 0


def add_demo_command(sub: Any) -> None:
    """Register ``dpaccount demo`` on an argparse subparsers object."""
    parser = sub.add_parser(
        "demo",
        help="run a guarded pipeline on synthetic census data",
        description="Run a guarded pipeline on a synthetic census table against a "
        "persistent SQLite ledger: run it twice to see the budget persist.",
    )
    parser.add_argument("--ledger", default=DEFAULT_LEDGER,
                        help=f"ledger URL (default {DEFAULT_LEDGER})")
    parser.add_argument("--fresh", action="store_true",
                        help="delete the demo's SQLite ledger file first and start over")
    parser.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    url: str = args.ledger
    if args.fresh:
        if not url.startswith("sqlite:///"):
            raise ConfigError("--fresh only deletes a demo SQLite ledger file")
        path = Path(url.removeprefix("sqlite:///"))
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    acct = open_ledger(url, name="demo", budget=DEMO_BUDGET)
    print(f"ledger: {redact_url(url)} (name 'demo')")
    return run_demo(acct)
