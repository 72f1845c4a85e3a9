"""``dpaccount demo``: a realistic guarded pipeline on a synthetic census table.

The table is generated here (100,000 rows, a fixed seed: it is public demo data, not
noise). A series of counts, sums and means runs through the guard against one ledger;
each answer is printed with its charge and what remains, and the last query is refused.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from dpaccount.accountant import Accountant
from dpaccount.costs import Budget, format_number
from dpaccount.errors import BudgetExceededError
from dpaccount.mechanisms import GaussianMechanism, LaplaceMechanism
from dpaccount.mechanisms.base import Mechanism

__all__ = ["add_demo_command", "make_census", "run_demo"]

ROWS = 100_000


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
    """The pipeline: each query declares its clipping bounds and hence its sensitivity."""
    income_cap = 250_000.0
    return [
        _Step("count of adults (age >= 18)", LaplaceMechanism(epsilon=0.1, sensitivity=1),
              lambda t: int(np.count_nonzero(t["age"] >= 18))),
        _Step("count of people over 65", LaplaceMechanism(epsilon=0.1, sensitivity=1),
              lambda t: int(np.count_nonzero(t["age"] > 65))),
        _Step("total weekly hours (clipped to [0, 80])",
              LaplaceMechanism(epsilon=0.2, sensitivity=80),
              lambda t: float(np.clip(t["hours"], 0, 80).sum())),
        _Step("total income (clipped to [0, 250k])",
              GaussianMechanism(epsilon=0.3, delta=1e-7, sensitivity=income_cap),
              lambda t: float(np.clip(t["income"], 0, income_cap).sum())),
        _Step("people per region (5 disjoint bins, L2 sensitivity 1)",
              GaussianMechanism(epsilon=0.2, delta=1e-7, sensitivity=1),
              lambda t: np.bincount(t["region"], minlength=5).astype(float)),
        _Step("count of people in region 0", LaplaceMechanism(epsilon=0.1, sensitivity=1),
              lambda t: int(np.count_nonzero(t["region"] == 0))),
        _Step("mean age (sum clipped to [0, 100]; needs a new count)",
              LaplaceMechanism(epsilon=0.2, sensitivity=100),
              lambda t: float(np.clip(t["age"], 0, 100).sum())),
    ]


def _fmt_answer(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return "[" + ", ".join(f"{v:,.0f}" for v in value) + "]"
    return f"{value:,.1f}"


def run_demo(acct: Accountant | None = None, out: TextIO | None = None) -> int:
    """Run the demo pipeline against ``acct`` (a fresh 1.0-epsilon ledger by default).

    Returns:
        The exit status: 0 when the pipeline ran and its last query was refused.
    """
    out = out or sys.stdout
    acct = acct if acct is not None else Accountant(Budget(1, "1e-6"))
    table = make_census()
    print(f"dpaccount demo: {ROWS:,} synthetic census rows; budget {acct.budget}, "
          f"rule {acct.rule.name!r}, already spent {acct.spent}", file=out)
    header = f"{'#':>3}  {'query':<52} {'noisy answer':>26}  {'charge':<24} remaining"
    print(header, file=out)
    print("-" * len(header), file=out)
    refused: tuple[_Step, BudgetExceededError] | None = None
    for step in _steps():
        try:
            answer = acct.run(step.mechanism, step.query, table)
        except BudgetExceededError as error:
            refused = (step, error)
            break
        record = acct.records[-1]
        left = acct.remaining()
        print(f"{record.seq:>3}  {step.label:<52} {_fmt_answer(answer):>26}  "
              f"{record.cost!s:<24} ε={format_number(left.epsilon)}, "
              f"δ={format_number(left.delta)}", file=out)
    if refused is None:
        print("every query fitted the budget; nothing was refused", file=out)
        return 0
    step, exc = refused
    print(f"\nREFUSED before touching the data: {step.label}", file=out)
    print(f"  requested {exc.requested}, spent {exc.spent}, budget {exc.budget}", file=out)
    print("  The ledger is unchanged and the query function never ran. Spend less per "
          "query, or plan the pipeline with a tighter rule (see `dpaccount compose`).",
          file=out)
    return 0


def add_demo_command(sub: Any) -> None:
    """Register ``dpaccount demo`` on an argparse subparsers object."""
    parser = sub.add_parser("demo", help="run a guarded pipeline on synthetic census data")
    parser.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    return run_demo()
