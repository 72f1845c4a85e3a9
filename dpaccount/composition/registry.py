"""The registry of rule names: the one table from a name to the rule it builds.

`RULES` maps every name an accountant or a stored ledger may give (``basic``,
``filter``, ``advanced``, ``heterogeneous``, ``optimal``, ``best``, ``pld``, ``rdp``,
``gdp``, ``zcdp``) to a factory; `make_rule()` builds one, `rule_from_description()` rebuilds
the rule a ledger stored. The closed-form rules and ``best`` come from
`dpaccount.composition.best.REGISTRY` (what `best.build_rule()` builds by name); the
tight engines' rules (``pld``, ``rdp``, ``gdp``) live in `dpaccount.accounting` and are
imported when first built: the PLD engine imports scipy.fft, about 90 ms, which a ledger
on another rule never pays.

The registry sits above both rule packages: the engines import from composition only
the rule interface (`dpaccount.composition.base`, and `.states`), and only this module
and `dpaccount.composition.best` import the engines, inside functions.

Examples:
    >>> make_rule("filter", delta_slack="1e-6").name
    'filter'
    >>> rule_from_description({"name": "basic"}).name
    'basic'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpaccount.composition.base import Rule
from dpaccount.composition.basic import BasicRule
from dpaccount.composition.best import REGISTRY
from dpaccount.composition.plans import Plan
from dpaccount.composition.zcdp import ZCDPRule
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, DPAccountError

__all__ = [
    "RELATION_RULES",
    "RULES",
    "make_rule",
    "register_rule",
    "rule_from_description",
]


def _pld_rule(**options: Any) -> Rule[Any]:
    from dpaccount.accounting.pld import PLDRule

    return PLDRule(**options)


def _rdp_rule(**options: Any) -> Rule[Any]:
    from dpaccount.accounting.rdp import RDPRule

    return RDPRule(**options)


def _gdp_rule(**options: Any) -> Rule[Any]:
    from dpaccount.accounting.gdp import GDPFilterRule

    return GDPFilterRule(**options)


#: Rule factories by name. Each takes the keyword arguments its rule needs (a declared
#: plan, a slack delta, the budget for defaults, the relation, ...). The tight engines
#: of `dpaccount.accounting` are imported when first used.
RULES: dict[str, Any] = {
    "basic": BasicRule,
    **REGISTRY,
    "pld": _pld_rule,
    "rdp": _rdp_rule,
    "gdp": _gdp_rule,
    "zcdp": ZCDPRule,
}

#: Rules that take the ledger's neighbouring relation.
RELATION_RULES = frozenset({"best", "pld", "rdp"})


def register_rule(name: str, factory: Any) -> None:
    """Add a rule factory under ``name`` (for a rule defined outside dpaccount)."""
    RULES[name] = factory


def make_rule(rule: str | Rule[Any], **options: Any) -> Rule[Any]:
    """Build the rule named ``rule`` (or return a Rule instance unchanged).

    Raises:
        ConfigError: For an unknown name or options the rule does not take.
    """
    if isinstance(rule, Rule):
        if options:
            raise ConfigError("options are given with the rule name, not a Rule instance")
        return rule
    if not isinstance(rule, str) or rule not in RULES:
        raise ConfigError(
            f"unknown composition rule {rule!r}; choose one of {sorted(RULES)}"
        )
    if rule == "basic":
        options.pop("budget", None)
    try:
        return RULES[rule](**options)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ConfigError(f"rule {rule!r}: {exc}") from exc


def rule_from_description(description: Mapping[str, Any]) -> Rule[Any]:
    """Rebuild a rule from the ``describe()`` dictionary a ledger stored with it.

    A fixed plan stored as ``[[epsilon, delta, count], ...]`` is read back as a `Plan`.
    The rebuilt rule must describe itself exactly as stored.

    Raises:
        ConfigError: The description does not rebuild to the same rule (a plan of
            mechanism charges, stored by name only, cannot be read back: restate the
            rule and its plan).
    """
    name = str(description.get("name"))
    options = {key: value for key, value in description.items() if key != "name"}
    plan = options.get("plan")
    try:
        if isinstance(plan, list) and all(isinstance(r, list) and len(r) == 3 for r in plan):
            options["plan"] = Plan(tuple((PrivacyCost(e, d), int(n)) for e, d, n in plan))
        rule = make_rule(name, **options)
    except DPAccountError as exc:
        raise ConfigError(
            f"the stored rule {name!r} cannot be rebuilt from its description ({exc}); "
            "give rule= (and plan=) as the ledger was created"
        ) from None
    if rule.describe() != dict(description):
        raise ConfigError(
            f"the stored rule {name!r} does not rebuild to the same rule; give rule= "
            "(and plan=) as the ledger was created"
        )
    return rule
