"""Log records of the charge path, for operators: one INFO record per admitted charge and
one WARNING record per refusal (over the budget, or a query id already recorded).

dpaccount follows the library convention of Python's `logging`: the package installs a
`logging.NullHandler` on the ``dpaccount`` logger and configures nothing else; every
module logs to its own child logger (``logging.getLogger(__name__)``), so an application
or a scheduler job attaches handlers and levels where it wants them (see docs/pipelines.md,
"Logging").

**What a record holds.** The message states the ledger, the label, the query id, the
charge's cost, what the ledger has spent with it and what remains; the same facts are on
the record as attributes prefixed ``dp_`` (`FIELDS`), for structured (JSON) handlers. They
are the ledger's own bookkeeping: names, labels and query ids the caller gave, and
(epsilon, delta) values that are public by construction. Nothing un-noised is ever on a
record: no query's answer, argument or exception text (a failed query is named by its
exception's type only, `log_query_failed`), and no connection string; the names, labels
and query ids go through the one redaction (`dpaccount._redact.redact`) before they are
put in a message or a field, as every message's text does.

**Rounding.** The ``dp_*`` numbers are floats rounded toward more privacy loss: a cost and
a spent total up, what remains down; the message shows the exact values where they are
short (as `PrivacyCost.__str__` does) and bounds otherwise. ``remaining`` is the budget
minus the spent total in each coordinate (what ``dpaccount ledger show`` prints); the
largest next query a rule other than ``basic`` admits is `Accountant.remaining`.

**Cost when nobody listens.** Every function first asks ``logger.isEnabledFor(level)``
(cached by `logging`), so with no handler and the default level nothing is built on the
charge path.
"""

from __future__ import annotations

import decimal
import functools
import logging
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dpaccount._redact import redact
from dpaccount.accountant.ledger import Ledger
from dpaccount.composition.zcdp import ZCDPState, rho_of
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import BudgetExceededError, DPAccountError, DuplicateQueryError
from dpaccount.records import LedgerRecord

__all__ = ["FIELDS", "log_admitted", "log_duplicate", "log_query_failed", "log_refused"]

#: The attributes a charge's log record carries (absent ones are not set): their meaning.
FIELDS: dict[str, str] = {
    "dp_event": "'charge_admitted', 'charge_refused', 'duplicate_query' or 'query_failed'",
    "dp_ledger": "the ledger charged (a share's own name for a share's charge)",
    "dp_ledgers": "every ledger the charge went to, the charged one first (a share's "
                  "ancestors, a window's blocks)",
    "dp_refused_by": "the ledger whose budget refused (a refusal only)",
    "dp_label": "the record's label (None if none)",
    "dp_query_id": "the query id (None if none)",
    "dp_seq": "the record's position in the ledger (an admitted charge only)",
    "dp_rule": "the composition rule that decided",
    "dp_epsilon": "the charge's own epsilon (rounded up)",
    "dp_delta": "the charge's own delta (rounded up)",
    "dp_spent_epsilon": "the ledger's composed epsilon under the rule, this charge included "
                        "when admitted (rounded up)",
    "dp_spent_delta": "the composed delta, likewise (rounded up)",
    "dp_remaining_epsilon": "budget epsilon minus spent epsilon (rounded down; None for an "
                            "unlimited or rho-only budget)",
    "dp_remaining_delta": "budget delta minus spent delta (rounded down)",
    "dp_budget_epsilon": "the budget's epsilon (None: unlimited or rho only)",
    "dp_budget_delta": "the budget's delta",
    "dp_rho": "zcdp rule only: the charge's rho (rounded up)",
    "dp_spent_rho": "zcdp rule only: the exact sum of rho so far (rounded up)",
    "dp_remaining_rho": "zcdp rule only: the rho limit minus the spent rho (rounded down)",
    "dp_budget_rho": "zcdp rule only: the rho limit (the budget's rho, or the largest rho "
                     "whose conversion fits an (epsilon, delta) budget)",
    "dp_error": "a failed query's exception type (never its text)",
}


#: Decimal arithmetic for the message's numbers (the C implementation: a few
#: microseconds a charge where `format_bound` takes tens). Flags are never read, so the
#: shared contexts are safe across threads.
_EXACT_DIGITS, _SHOWN_DIGITS = 12, 6
_CONTEXTS = {
    (digits, upward): decimal.Context(prec=digits, traps=[],
                                      rounding=decimal.ROUND_CEILING if upward
                                      else decimal.ROUND_FLOOR)
    for digits in (_EXACT_DIGITS, _SHOWN_DIGITS) for upward in (True, False)
}


def _up(value: Fraction) -> float:
    """The smallest float >= ``value`` (`dpaccount._numeric.float_up`, in integers)."""
    result = value.numerator / value.denominator  # correctly rounded
    p, q = result.as_integer_ratio()
    return result if p * value.denominator >= value.numerator * q else math.nextafter(
        result, math.inf)


def _down(value: Fraction) -> float:
    """The largest float <= ``value``."""
    result = value.numerator / value.denominator
    p, q = result.as_integer_ratio()
    return result if p * value.denominator <= value.numerator * q else math.nextafter(
        result, -math.inf)


def _text(number: decimal.Decimal) -> str:
    """``0.75``, ``1e-07``: the style of ``repr(float)`` and `PrivacyCost.__str__`."""
    number = number.normalize()
    adjusted = number.adjusted()
    if -4 <= adjusted < 16:
        return format(number, "f")
    mantissa = "".join(map(str, number.as_tuple().digits))
    mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return f"{mantissa}e{adjusted:+03d}"


def _shown(symbol: str, value: Fraction | None, upward: bool) -> str:
    """``ε=0.5`` when exact in 12 digits; otherwise 6 digits rounded up (a cost: ``ε≤``)
    or down (what is left: ``ε≥``), as `PrivacyCost.__str__` shows them."""
    if value is None:
        return f"{symbol}=unlimited"
    num, den = decimal.Decimal(value.numerator), decimal.Decimal(value.denominator)
    exact = _CONTEXTS[_EXACT_DIGITS, upward].divide(num, den)
    p, q = exact.as_integer_ratio()
    if p * value.denominator == value.numerator * q:
        return f"{symbol}={_text(exact)}"
    shown = _CONTEXTS[_SHOWN_DIGITS, upward].divide(num, den)
    return f"{symbol}{'≤' if upward else '≥'}{_text(shown)}"


def _pair(epsilon: Fraction | None, delta: Fraction, upward: bool) -> str:
    return f"({_shown('ε', epsilon, upward)}, {_shown('δ', delta, upward)})"


def _left(budget: Budget, spent: PrivacyCost) -> tuple[Fraction | None, Fraction]:
    epsilon = None if budget.epsilon is None else max(budget.epsilon - spent.epsilon, Fraction(0))
    return epsilon, max(budget.delta - spent.delta, Fraction(0))


def _money(ledger: Ledger, state: Any, spent: PrivacyCost, cost: PrivacyCost,
           charge: Any) -> tuple[dict[str, Any], str]:
    """The numeric fields and the message's numbers of ``ledger`` at ``state``."""
    budget = ledger.budget
    left_epsilon, left_delta = _left(budget, spent)
    fields: dict[str, Any] = {
        "dp_rule": ledger.rule.name,
        "dp_epsilon": _up(cost.epsilon),
        "dp_delta": _up(cost.delta),
        "dp_spent_epsilon": _up(spent.epsilon),
        "dp_spent_delta": _up(spent.delta),
        "dp_remaining_epsilon": None if left_epsilon is None else _down(left_epsilon),
        "dp_remaining_delta": _down(left_delta),
        "dp_budget_epsilon": None if budget.epsilon is None else _down(budget.epsilon),
        "dp_budget_delta": _down(budget.delta),
    }
    text = (f"cost {_pair(cost.epsilon, cost.delta, True)}; spent "
            f"{_pair(spent.epsilon, spent.delta, True)}; remaining "
            f"{_pair(left_epsilon, left_delta, False)}")
    if isinstance(state, ZCDPState):
        limit = getattr(ledger.rule, "rho_limit", lambda _b: None)(budget)
        try:
            rho = rho_of(charge)
        except DPAccountError:  # pragma: no cover - a zcdp ledger decided it: it has a rho
            return fields, text
        fields["dp_rho"] = _up(rho)
        fields["dp_spent_rho"] = _up(state.rho)
        text += f"; {_shown('ρ', rho, True)}, spent {_shown('ρ', state.rho, True)}"
        if limit is not None:
            left = max(limit - state.rho, Fraction(0))
            fields["dp_budget_rho"] = _down(limit)
            fields["dp_remaining_rho"] = _down(left)
            text += f", remaining {_shown('ρ', left, False)}"
    return fields, text


@functools.lru_cache(maxsize=1024)
def _safe(text: str) -> str:
    """``text`` the caller gave (a ledger name, label or query id) through the one
    redaction of every message (`dpaccount._redact.redact`), so that one quoting a
    connection string never carries its password into a log; cached, as a job's labels
    repeat."""
    return redact(text)


def _safe_or_none(text: str | None) -> str | None:
    return None if text is None else _safe(text)


def _also(names: Sequence[str]) -> str:
    return "" if len(names) < 2 else f" (also charged to {', '.join(map(repr, names[1:]))})"


def log_admitted(logger: logging.Logger, ledgers: Sequence[Ledger],
                 records: Sequence[LedgerRecord]) -> None:
    """One INFO record for a charge that ``ledgers`` (the charged one first) admitted and
    recorded as ``records`` (one per ledger, in the same order), each ledger already
    settled with it."""
    if not logger.isEnabledFor(logging.INFO):
        return
    ledger, record = ledgers[0], records[0]
    names = [_safe(each.name) for each in ledgers]
    label, query_id = _safe_or_none(record.label), _safe_or_none(record.query_id)
    state = ledger.state
    fields, numbers = _money(ledger, state, ledger.rule.total(state), record.cost,
                             record.charge)
    fields.update(dp_event="charge_admitted", dp_ledger=names[0], dp_ledgers=names,
                  dp_label=label, dp_query_id=query_id, dp_seq=record.seq)
    logger.info("ledger %r admitted a charge (seq %d, label %r, query_id %r)%s: %s",
                names[0], record.seq, label, query_id, _also(names), numbers, extra=fields)


def log_refused(logger: logging.Logger, ledgers: Sequence[Ledger], error: BudgetExceededError,
                label: str | None, query_id: str | None, charge: Any) -> None:
    """One WARNING record for a charge refused with ``error`` (nothing was recorded);
    the numbers are those of the ledger that refused (``error.ledger``, or the first)."""
    if not logger.isEnabledFor(logging.WARNING):
        return
    names = [_safe(each.name) for each in ledgers]
    label, query_id = _safe_or_none(label), _safe_or_none(query_id)
    refusing = next((each for each in ledgers if each.name == error.ledger), ledgers[0])
    refused_by = _safe(refusing.name)
    fields, numbers = _money(refusing, refusing.state, error.spent, error.requested, charge)
    fields.update(dp_event="charge_refused", dp_ledger=names[0], dp_ledgers=names,
                  dp_refused_by=refused_by, dp_label=label, dp_query_id=query_id)
    by = "" if refusing is ledgers[0] else f" (ledger {refused_by!r} said no)"
    would_be = "a delta of 1 or more" if error.would_be is None else str(error.would_be)
    logger.warning("ledger %r refused a charge%s (label %r, query_id %r): %s; under the %r "
                   "rule the total would be %s, and the budget is %s; nothing was recorded "
                   "and the query did not run", names[0], by, label, query_id, numbers,
                   error.rule, would_be, refusing.budget, extra=fields)


def log_duplicate(logger: logging.Logger, ledgers: Sequence[Ledger],
                  error: DuplicateQueryError, label: str | None) -> None:
    """One WARNING record for a charge refused because its query id is already recorded
    (nothing was charged, the query must not run again)."""
    if not logger.isEnabledFor(logging.WARNING):
        return
    names = [_safe(each.name) for each in ledgers]
    label, query_id = _safe_or_none(label), _safe(error.query_id)
    seq = getattr(error.record, "seq", None)
    logger.warning("ledger %r refused a charge: query_id %r is already recorded (record %s); "
                   "nothing was charged and the query must not run again", names[0],
                   query_id, seq,
                   extra={"dp_event": "duplicate_query", "dp_ledger": names[0],
                          "dp_ledgers": names, "dp_label": label, "dp_query_id": query_id,
                          "dp_seq": seq})


def log_query_failed(logger: logging.Logger, ledger: str, label: str | None,
                     query_id: str | None, error: BaseException) -> None:
    """One WARNING record for a guarded query that raised after its charge was recorded
    (no refund). Only the exception's type is named: its text may quote the data."""
    if not logger.isEnabledFor(logging.WARNING):
        return
    kind = type(error).__qualname__
    ledger, label, query_id = _safe(ledger), _safe_or_none(label), _safe_or_none(query_id)
    logger.warning("the query (label %r, query_id %r) charged to ledger %r raised %s after "
                   "its charge was recorded; the charge is kept (no refunds)", label,
                   query_id, ledger, kind,
                   extra={"dp_event": "query_failed", "dp_ledger": ledger, "dp_label": label,
                          "dp_query_id": query_id, "dp_error": kind})
