"""Wrapping existing query code: charge first, run only if admitted, then add noise.

The order is fixed: (1) the mechanism's charge is checked and recorded atomically,
(2) the query runs on the data, (3) the mechanism adds noise to its answer. A refused
charge raises :class:`~dpaccount.errors.BudgetExceededError` and the query never runs.

**No refunds.** A query that raises after its charge was recorded keeps the charge. The
failure itself can depend on the data (an exception on one record, a timeout on a large
group), so refunding would let an attacker learn from which queries were refunded; and a
crash between the query and a refund would lose the refund's bookkeeping anyway.

Examples:
    >>> from dpaccount import Accountant, Budget, LaplaceMechanism
    >>> acct = Accountant(Budget(1))
    >>> @acct.guard(LaplaceMechanism(epsilon=0.5, sensitivity=1))
    ... def count_adults(rows):
    ...     return sum(1 for age in rows if age >= 18)
    >>> noisy = count_adults([17, 30, 45])
    >>> acct.spent
    PrivacyCost(epsilon=0.5, delta=0)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dpaccount.mechanisms.base import Mechanism

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import Accountant

__all__ = ["guard", "run"]

F = TypeVar("F", bound=Callable[..., Any])


def _label_of(query: Callable[..., Any]) -> str:
    return getattr(query, "__qualname__", None) or repr(query)


def guard(accountant: Accountant, mechanism: Mechanism, *, label: str | None = None
          ) -> Callable[[F], F]:
    """A decorator that charges ``mechanism`` before each call of the decorated query.

    Works for plain and ``async`` functions. The decorated function's answer is passed
    to ``mechanism.release`` and the noisy value is returned.

    Args:
        accountant: The ledger to charge.
        mechanism: The mechanism whose charge is recorded and whose noise is added.
        label: The record's label; the function's qualified name by default.
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"guard() needs a mechanism, got {type(mechanism).__name__}")

    def decorate(query: F) -> F:
        name = label or _label_of(query)
        if inspect.iscoroutinefunction(query):

            @functools.wraps(query)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                accountant.charge(mechanism, label=name)
                return mechanism.release(await query(*args, **kwargs))

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(query)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            accountant.charge(mechanism, label=name)
            return mechanism.release(query(*args, **kwargs))

        return wrapper  # type: ignore[return-value]

    return decorate


def run(accountant: Accountant, mechanism: Mechanism, query: Callable[..., Any], /,
        *args: Any, **kwargs: Any) -> Any:
    """Charge ``mechanism``, run ``query(*args, **kwargs)``, release its noisy answer.

    For an ``async`` query this returns an awaitable; the charge is made when it is
    awaited, still before the query starts.

    Examples:
        >>> from dpaccount import Accountant, LaplaceMechanism
        >>> acct = Accountant(1)
        >>> _ = acct.run(LaplaceMechanism(epsilon=1, sensitivity=1), len, [1, 2, 3])
        >>> acct.run(LaplaceMechanism(epsilon=1, sensitivity=1), len, [1, 2, 3])
        Traceback (most recent call last):
        ...
        dpaccount.errors.BudgetExceededError: refused: this charge costs (ε=1, δ=0); ...
    """
    if inspect.iscoroutinefunction(query):

        async def charged() -> Any:
            accountant.charge(mechanism, label=_label_of(query))
            result: Awaitable[Any] = query(*args, **kwargs)
            return mechanism.release(await result)

        return charged()
    accountant.charge(mechanism, label=_label_of(query))
    return mechanism.release(query(*args, **kwargs))
