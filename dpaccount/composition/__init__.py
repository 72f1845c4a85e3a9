"""Composition rules: pure functions and accountant rules, each citing its theorem.

| rule | proven for | theorem |
|---|---|---|
| ``basic`` | fully adaptive | Dwork-Roth 2014 Thm 3.16; Rogers et al. 2016 Thm 3.6 |
"""

from __future__ import annotations

from typing import Any

from dpaccount.composition.base import Adaptivity, Rule
from dpaccount.composition.basic import BasicRule, basic
from dpaccount.errors import ConfigError

__all__ = ["RULES", "Adaptivity", "BasicRule", "Rule", "basic", "make_rule"]

#: Rule factories by name. Each takes the keyword arguments its rule needs (a declared
#: plan, a slack delta, ...).
RULES: dict[str, Any] = {"basic": BasicRule}


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
    try:
        return RULES[rule](**options)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ConfigError(f"rule {rule!r}: {exc}") from exc
