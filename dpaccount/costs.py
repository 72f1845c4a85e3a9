"""Privacy costs and budgets: exact, immutable, validated values.

A `PrivacyCost` is what a mechanism guarantees, (epsilon, delta)-differential
privacy (Dwork and Roth 2014, Def. 2.4); a `Budget` is how much a ledger may
spend. Both hold exact `Fraction` values: a float is taken at its exact
binary value, a string or `Decimal` at its exact decimal value, so sums
never under-count.

Examples:
    >>> ten = sum([PrivacyCost(0.1)] * 10, PrivacyCost(0))
    >>> ten.epsilon > 1          # the float 0.1 is slightly above one tenth
    True
    >>> sum([PrivacyCost("0.1")] * 10, PrivacyCost(0)).epsilon
    Fraction(1, 1)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import ZERO, at_most, check_delta, check_epsilon, float_up
from dpaccount.errors import InvalidCostError

__all__ = ["Budget", "PrivacyCost", "RemainingBudget", "as_budget", "format_number",
           "trusted_cost"]


def format_number(value: Fraction | None) -> str:
    """Show an exact value readably, never below its true value.

    A finite decimal of at most 17 significant digits is shown exactly; anything else
    as the shortest float that is not below it.

    Examples:
        >>> format_number(Fraction(1, 10))
        '0.1'
        >>> format_number(Fraction(1, 10**6))
        '1e-06'
        >>> format_number(Fraction(1, 3))
        '0.33333333333333337'
        >>> format_number(None)
        'inf'
    """
    if value is None:
        return "inf"
    if value.denominator == 1:
        return str(value.numerator)
    exact = _short_decimal(value)
    return exact if exact is not None else repr(float_up(value))


#: Significant digits shown by ``str`` of costs and budgets (the exact value is a
#: property away: ``.epsilon``, ``.delta``).
DISPLAY_DIGITS = 6


def format_bound(value: Fraction | None, *, upward: bool = True,
                 digits: int = DISPLAY_DIGITS) -> tuple[str, bool]:
    """A short decimal for ``value`` and whether it is exact.

    A value with at most 12 significant digits is shown exactly. Any other is rounded to
    ``digits`` significant digits, **up** (``upward=True``: for what was spent, so the
    display never under-states it) or down (for what is left). Returns the text and
    whether it equals the value.

    Examples:
        >>> format_bound(Fraction(1, 10))
        ('0.1', True)
        >>> format_bound(Fraction(9999995707834774, 10**23))   # a float's noise
        ('1e-07', False)
        >>> format_bound(Fraction(7999999999999999, 10**16), upward=False)
        ('0.799999', False)
        >>> format_bound(Fraction(12345678))
        ('12345678', True)
    """
    if value is None:
        return "inf", True
    if value == 0:
        return "0", True
    exact = _rounded(value, 12, upward)
    if exact == value:
        return _decimal_text(exact), True
    return _decimal_text(_rounded(value, digits, upward)), False


def _rounded(value: Fraction, digits: int, upward: bool) -> Fraction:
    magnitude = abs(value)
    # floor(log10(magnitude)) from bit lengths (no int-to-str conversion of huge values)
    bits = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    exponent = math.floor(bits * 0.30102999566398120) - 1
    while Fraction(10) ** (exponent + 1) <= magnitude:
        exponent += 1
    while Fraction(10) ** exponent > magnitude:
        exponent -= 1
    scale = Fraction(10) ** (digits - 1 - exponent)
    scaled = value * scale
    whole = -((-scaled.numerator) // scaled.denominator) if upward else (
        scaled.numerator // scaled.denominator
    )
    return Fraction(whole) / scale


def _decimal_text(value: Fraction) -> str:
    """A short exact decimal in the style of ``repr(float)`` (``0.1``, ``1e-06``)."""
    if value.denominator == 1 and abs(value) < 10**16:
        return str(value.numerator)
    number = (Decimal(value.numerator) / Decimal(value.denominator)).normalize()
    adjusted = number.adjusted()
    if -4 <= adjusted < 16:
        return format(number, "f")
    _sign, digits, _exponent = number.as_tuple()
    mantissa = "".join(map(str, digits))
    mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return f"{'-' if number < 0 else ''}{mantissa}e{adjusted:+03d}"


def _short_decimal(value: Fraction) -> str | None:
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return None
    places = max(twos, fives)
    if places > 400:
        return None
    digits = value.numerator * 10**places // value.denominator
    if digits.bit_length() > 200:
        return None
    if len(str(abs(digits)).rstrip("0")) > 17:
        return None
    text = repr(float(digits) / 10**places) if places <= 22 else None
    if text is not None and Fraction(text) == value:
        return text
    return None


@attrs.frozen(repr=False)
class PrivacyCost:
    """An (epsilon, delta) guarantee, exact and validated.

    Attributes:
        epsilon: Non-negative and finite. Floats are taken at their exact binary value,
            strings and Decimals at their exact decimal value.
        delta: In [0, 1).

    Raises:
        InvalidCostError: For NaN, infinities, negative values, ``delta >= 1``, booleans
            and non-numeric strings; the message names the field and the value.

    Examples:
        >>> PrivacyCost("0.5", "1e-6")
        PrivacyCost(epsilon=0.5, delta=1e-06)
        >>> PrivacyCost(0.5) + PrivacyCost(0.25, 1e-6)
        PrivacyCost(epsilon=0.75, delta=1e-06)
    """

    epsilon: Fraction = attrs.field(converter=check_epsilon)
    delta: Fraction = attrs.field(default=ZERO, converter=check_delta)

    def __add__(self, other: PrivacyCost) -> PrivacyCost:
        if not isinstance(other, PrivacyCost):
            return NotImplemented
        total_delta = self.delta + other.delta
        if total_delta >= 1:
            raise InvalidCostError(
                "delta", total_delta, "the summed delta reaches 1: no guarantee is left"
            )
        return trusted_cost(self.epsilon + other.epsilon, total_delta)

    def __radd__(self, other: Any) -> PrivacyCost:
        if other == 0:  # sum() starts from int 0
            return self
        return NotImplemented

    def times(self, count: int) -> PrivacyCost:
        """The basic composition of ``count`` copies of this cost."""
        delta = self.delta * count
        if delta >= 1:
            raise InvalidCostError("delta", delta, f"{count} x delta reaches 1")
        return trusted_cost(self.epsilon * count, delta)

    def fits(self, budget: Budget) -> bool:
        """Whether this total is within ``budget`` (both coordinates, inclusive)."""
        if budget.epsilon is not None and not at_most(self.epsilon, budget.epsilon):
            return False
        return at_most(self.delta, budget.delta)

    def __repr__(self) -> str:
        return (
            f"PrivacyCost(epsilon={format_number(self.epsilon)}, "
            f"delta={format_number(self.delta)})"
        )

    def __str__(self) -> str:
        return f"({_shown('ε', self.epsilon, True)}, {_shown('δ', self.delta, True)})"


def _shown(symbol: str, value: Fraction | None, upward: bool) -> str:
    """``ε=0.5`` when exact; ``ε≤0.8`` (a cost, rounded up) or ``ε≥0.799999`` (a budget,
    rounded down) when the value needs more digits than are shown."""
    text, exact = format_bound(value, upward=upward)
    return f"{symbol}={text}" if exact else f"{symbol}{'≤' if upward else '≥'}{text}"


def trusted_cost(epsilon: Fraction, delta: Fraction) -> PrivacyCost:
    """A PrivacyCost built from exact values already known valid, without re-validating.

    The per-charge path (the rules' sums, a charge's cost) builds many costs from
    values that were validated when their operands were built; this skips the
    converters, which would check them again (about 2.7 µs a cost against 0.5 µs).

    The contract, which the caller proves and nothing here checks: ``epsilon`` and
    ``delta`` are `Fraction` instances (never a float, an int or a bool), ``epsilon``
    is finite and ``>= 0``, and ``0 <= delta < 1`` (what `PrivacyCost`'s converters
    would have made of them). A bound computed in floating point is rounded up to an
    exact Fraction before it comes here. Anything else builds a cost that breaks the
    invariants every rule relies on: use `PrivacyCost` for values from outside.

    Examples:
        >>> trusted_cost(Fraction(1, 2), Fraction(0)) == PrivacyCost("0.5")
        True
    """
    cost = object.__new__(PrivacyCost)
    object.__setattr__(cost, "epsilon", epsilon)
    object.__setattr__(cost, "delta", delta)
    return cost


ZERO_COST = trusted_cost(ZERO, ZERO)


def _budget_epsilon(value: Any) -> Any:
    if value is _UNLIMITED:
        return None
    if value is _ABSENT:
        return _ABSENT  # resolved in `Budget.__attrs_post_init__`, which sees ``rho``
    if value is None or (isinstance(value, float) and value == float("inf")):
        raise InvalidCostError(
            "epsilon",
            value,
            "an infinite budget must be explicit: use Budget.unlimited() (tracking only)",
        )
    return check_epsilon(value)


def _budget_rho(value: Any) -> Fraction | None:
    return None if value is None else check_epsilon(value, "rho")


_UNLIMITED = object()
#: ``Budget(rho=...)``: no epsilon given (only a zCDP budget).
_ABSENT: Any = object()


@attrs.frozen(repr=False)
class Budget:
    """The total (epsilon, delta) a ledger may spend, or a zCDP budget rho.

    Attributes:
        epsilon: Non-negative and finite, or None: for `unlimited()` (tracking only), or
            for a budget given in rho alone (``Budget(rho=0.5)``).
        delta: In [0, 1). With ``rho`` alone, the delta at which the ledger states what
            it spent as (epsilon, delta).
        rho: A zero-concentrated DP budget (Bun and Steinke 2016, Def. 1.1): the ledger
            is rho-zCDP. Only the ``zcdp`` rule takes it (every other rule refuses a
            budget with a rho); with an epsilon as well, both limits hold.

    Raises:
        InvalidCostError: A negative, infinite or non-numeric value, ``delta >= 1``, or
            neither an epsilon nor a rho.

    Examples:
        >>> Budget(1, "1e-5")
        Budget(epsilon=1, delta=1e-05)
        >>> Budget.unlimited().epsilon is None
        True
        >>> Budget(rho="0.5")
        Budget(rho=0.5)
    """

    epsilon: Fraction | None = attrs.field(default=_ABSENT, converter=_budget_epsilon)
    delta: Fraction = attrs.field(default=ZERO, converter=check_delta)
    rho: Fraction | None = attrs.field(default=None, kw_only=True, converter=_budget_rho)

    def __attrs_post_init__(self) -> None:
        if self.epsilon is _ABSENT:
            if self.rho is None:
                raise InvalidCostError(
                    "epsilon", None, "a budget needs an epsilon (or a zCDP rho=)")
            object.__setattr__(self, "epsilon", None)

    @classmethod
    def unlimited(cls, delta: Any = 0) -> Budget:
        """A budget with no epsilon limit: the ledger only tracks what is spent."""
        return cls(_UNLIMITED, delta)

    @property
    def is_unlimited(self) -> bool:
        """True for a tracking-only budget: no epsilon limit and no rho."""
        return self.epsilon is None and self.rho is None

    def __repr__(self) -> str:
        if self.rho is None:
            return (
                f"Budget(epsilon={format_number(self.epsilon)}, "
                f"delta={format_number(self.delta)})"
            )
        parts = [] if self.epsilon is None else [f"epsilon={format_number(self.epsilon)}"]
        if self.epsilon is not None or self.delta:
            parts.append(f"delta={format_number(self.delta)}")
        return f"Budget({', '.join([*parts, f'rho={format_number(self.rho)}'])})"

    def __str__(self) -> str:
        parts = [] if self.epsilon is None and self.rho is not None else [
            _shown("ε", self.epsilon, False)]
        if parts or self.delta:
            parts.append(_shown("δ", self.delta, False))
        if self.rho is not None:
            parts.append(_shown("ρ", self.rho, False))
        return f"({', '.join(parts)})"


def _budget_args(budget: Budget) -> tuple[Any, Fraction]:
    """``Budget(*result, rho=budget.rho)`` rebuilds ``budget`` (an unlimited or rho-only
    epsilon through its sentinel)."""
    if budget.epsilon is not None:
        return budget.epsilon, budget.delta
    return (_UNLIMITED if budget.rho is None else _ABSENT), budget.delta


@attrs.frozen(repr=False, eq=False)
class RemainingBudget(Budget):
    """What `dpaccount.Accountant.remaining` returns: a `Budget` (the largest cost one more
    query may have), equal to the plain `Budget` of the same values, that can still be
    called as the method ``remaining(k)`` was.

    Calling it is deprecated (a `DeprecationWarning`): ``acct.remaining()`` returns this
    same value, and ``acct.remaining(k)`` returns ``acct.remaining_for(k)``. Read
    ``acct.remaining`` (like ``acct.spent``) and call ``acct.remaining_for(k)`` instead.

    Examples:
        >>> left = RemainingBudget.of(Budget("0.25"))
        >>> left == Budget("0.25"), left
        (True, Budget(epsilon=0.25, delta=0))
    """

    per_query: Callable[[int], Budget] | None = attrs.field(default=None, kw_only=True)

    @classmethod
    def of(cls, budget: Budget,
           per_query: Callable[[int], Budget] | None = None) -> RemainingBudget:
        """``budget`` as a remaining budget; ``per_query(k)`` answers the deprecated call
        with ``k`` (the accountant's `remaining_for`)."""
        return cls(*_budget_args(budget), rho=budget.rho, per_query=per_query)

    def __call__(self, k: int = 1) -> Budget:
        """Deprecated: the old method ``remaining(k)`` (this value for ``k`` = 1)."""
        warnings.warn(
            "Accountant.remaining is a value now, like Accountant.spent: read "
            "acct.remaining without calling it, and call acct.remaining_for(k) for the "
            "largest cost of each of k more queries",
            DeprecationWarning, stacklevel=2)
        if self.per_query is None or (type(k) is int and k == 1):
            return self
        return self.per_query(k)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Budget):
            return NotImplemented
        return (self.epsilon, self.delta, self.rho) == (other.epsilon, other.delta,
                                                        other.rho)

    def __hash__(self) -> int:
        return hash(Budget(*_budget_args(self), rho=self.rho))


def as_budget(value: Any) -> Budget:
    """``value`` as a `Budget`: a Budget as is, a `PrivacyCost` as its (ε, δ), an
    ``(epsilon, delta)`` tuple, or a number (epsilon only).

    Examples:
        >>> as_budget((1, "1e-6"))
        Budget(epsilon=1, delta=1e-06)
        >>> as_budget(PrivacyCost("0.5"))
        Budget(epsilon=0.5, delta=0)

    Raises:
        InvalidCostError: Not a valid budget.
    """
    if isinstance(value, RemainingBudget):  # a plain value, without the accountant's link
        return Budget(*_budget_args(value), rho=value.rho)
    if isinstance(value, Budget):
        return value
    if isinstance(value, PrivacyCost):
        return Budget(value.epsilon, value.delta)
    if isinstance(value, tuple) and len(value) == 2:
        return Budget(*value)
    return Budget(value)
