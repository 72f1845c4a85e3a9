"""What a ledger is opened with, and what every charge's inputs must be.

`ledger_settings` builds a ledger's rule and the settings stored with it (the same call
when an accountant opens a ledger and when ``open_ledger(..., migrate=True)`` records a
migration); `check_text` and `revalidate` are the checks every charge's label, query id
and cost pass before anything is recorded, the same for every store.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dpaccount.charges import Relation
from dpaccount.composition import RELATION_RULES, Rule, make_rule
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.records import LedgerMeta

__all__ = ["MAX_TEXT_LENGTH", "check_text", "ledger_settings", "revalidate"]

#: The longest label or query_id a record takes (characters).
MAX_TEXT_LENGTH = 1000


def ledger_settings(
    name: str,
    budget: Budget,
    rule: str | Rule[Any],
    relation: Relation | str,
    plan: Any,
    rule_options: Mapping[str, Any] | None,
    dataset_size: int | None,
    parent: str | None = None,
) -> tuple[Rule[Any], LedgerMeta]:
    """Build a ledger's rule and the metadata stored with it (and compared on open).

    Named rules get the budget (for their defaults) and, where they use it, the
    relation; a declared plan is passed as ``plan``.

    Raises:
        ConfigError: Unknown rule or relation, options the rule does not take, or a zCDP
            budget (``Budget.rho``) under a rule that does not take one.
    """
    try:
        the_relation = Relation(relation)
    except ValueError:
        raise ConfigError(
            f"unknown relation {relation!r}; use 'add_remove' or 'substitution'"
        ) from None
    options = dict(rule_options or {})
    if plan is not None:
        options["plan"] = plan
    if isinstance(rule, str):
        options.setdefault("budget", budget)  # rules take defaults from it
        if rule in RELATION_RULES:
            options.setdefault("relation", the_relation)
    the_rule = make_rule(rule, **options)
    the_rule.check_budget(budget)  # a rho budget only under a rule that reads it
    meta = LedgerMeta.build(name, budget, the_rule.describe(), the_relation, dataset_size,
                            parent)
    return the_rule, meta


def check_text(value: Any, field: str) -> None:
    """Refuse a label or query_id that could break a ledger or forge its output.

    It must be None or a ``str`` of at most `MAX_TEXT_LENGTH` printable characters
    (`str.isprintable`): no lone surrogates, which every backend would store but no reader
    could decode, and no control, format or separator characters (newlines and terminal
    escapes would forge lines in ``dpaccount ledger show``); the ASCII space is allowed.
    Checked before anything is charged, the same for every store.

    Raises:
        InvalidCostError: Naming the field and what is wrong with it.
    """
    if value is None:
        return
    if type(value) is not str:
        raise InvalidCostError(field, type(value).__name__, "must be a string or None")
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidCostError(
            field, f"<{len(value)} characters>", f"is longer than {MAX_TEXT_LENGTH} characters"
        )
    if not value.isprintable():
        raise InvalidCostError(
            field, ascii(value)[:80],
            "holds characters that are not printable (newlines, tabs, terminal escapes, "
            "lone surrogates, format or separator characters other than the space)",
        )


def revalidate(cost: PrivacyCost) -> None:
    """Check a cost again as it enters the ledger (values can be forged past attrs).

    Raises:
        InvalidCostError: Epsilon or delta is not an exact value in its range.
    """
    eps, delta = cost.epsilon, cost.delta
    if type(eps) is not Fraction or type(delta) is not Fraction:
        raise InvalidCostError("charge", cost, "epsilon and delta must be exact values")
    # Fractions are normalised with a positive denominator: compare numerators directly.
    if eps.numerator < 0:
        raise InvalidCostError("epsilon", eps, "must be >= 0")
    if delta.numerator < 0 or delta.numerator >= delta.denominator:
        raise InvalidCostError("delta", delta, "must be in [0, 1)")
