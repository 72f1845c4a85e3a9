"""The Accountant: a budget ledger that refuses a charge before the query runs.

The package holds one concern a module:

* `settings`: a ledger's rule and stored settings; the checks of a charge's label,
  query id and cost.
* `ledger`: `Ledger`, one ledger's rule, state, store and lock; the decision and the
  atomic append of a charge.
* `joint`: one charge to several ledgers (a share and its ancestors, a window of
  blocks), all or nothing.
* `core`: `Accountant`, the reading API, the guard and the links of a sub-budget.
* `logs`: the log records of the charge path (an INFO record per admitted charge, a
  WARNING record per refusal), for operators.

Examples:
    >>> acct = Accountant(Budget(1))
    >>> acct.charge(PrivacyCost("0.75"), label="count").seq
    0
    >>> acct.spent
    PrivacyCost(epsilon=0.75, delta=0)
    >>> acct.charge(PrivacyCost("0.5"))
    Traceback (most recent call last):
    ...
    dpaccount.errors.BudgetExceededError: refused: this charge costs (ε=0.5, δ=0); ...
    >>> acct.remaining
    Budget(epsilon=0.25, delta=0)
"""

from __future__ import annotations

from dpaccount.accountant.core import Accountant, ChargePreview
from dpaccount.accountant.joint import charge_jointly
from dpaccount.accountant.ledger import SNAPSHOT_EVERY, SNAPSHOT_ON_CLOSE, Decision, Ledger
from dpaccount.accountant.settings import (
    MAX_TEXT_LENGTH,
    check_text,
    ledger_settings,
    revalidate,
)
from dpaccount.costs import Budget, PrivacyCost  # noqa: F401 - the doctests above use them

__all__ = [
    "MAX_TEXT_LENGTH",
    "SNAPSHOT_EVERY",
    "SNAPSHOT_ON_CLOSE",
    "Accountant",
    "ChargePreview",
    "Decision",
    "Ledger",
    "charge_jointly",
    "check_text",
    "ledger_settings",
    "revalidate",
]
