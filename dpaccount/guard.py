"""Wrapping existing query code: charge first, run only if admitted, then add noise.

The order is fixed: (1) the mechanism's charge is checked and recorded atomically,
(2) the query runs on the data, (3) the mechanism adds noise to its answer. A refused
charge raises `BudgetExceededError` and the query never runs.

**No refunds.** A query that raises after its charge was recorded keeps the charge. The
failure itself can depend on the data (an exception on one record, a timeout on a large
group), so refunding would let an attacker learn from which queries were refunded; and a
crash between the query and a refund would lose the refund's bookkeeping anyway.

**Nothing secret in errors.** An answer the mechanism cannot release raises
`UnreleasableResultError`, which names the answer's type and
shape only; the answer is never on the error, its arguments or its context.

**Retries.** With ``query_id`` a retried query is refused with
`DuplicateQueryError` before it runs: it is never charged twice
and never re-run for fresh noise.

**Generators** are refused when decorated (a generator function returns before its body
runs, so its charge would buy nothing it could release). An ``async`` query's charge runs
in a worker thread, so waiting for a shared ledger's lock never blocks the event loop.

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

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dpaccount.mechanisms.base import Mechanism

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import Accountant

__all__ = ["guard", "run"]

F = TypeVar("F", bound=Callable[..., Any])
QueryId = str | Callable[..., str] | None


def _label_of(query: Callable[..., Any]) -> str:
    return getattr(query, "__qualname__", None) or type(query).__name__


def _refuse_generators(query: Callable[..., Any]) -> None:
    if inspect.isgeneratorfunction(query) or inspect.isasyncgenfunction(query):
        raise TypeError(
            f"{_label_of(query)} is a generator function: it returns before its body runs, "
            "so a guard would charge for nothing it can release. Return the answer "
            "(e.g. a number or an array) instead of yielding it."
        )


def _query_id_for(query_id: QueryId, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> str | None:
    if query_id is None or isinstance(query_id, str):
        return query_id
    return query_id(*args, **kwargs)


def guard(
    accountant: Accountant,
    mechanism: Mechanism,
    *,
    label: str | None = None,
    query_id: QueryId = None,
) -> Callable[[F], F]:
    """A decorator that charges ``mechanism`` before each call of the decorated query.

    Works for plain and ``async`` functions; generator functions are refused. The
    decorated function's answer is passed to ``mechanism.release`` and the noisy value is
    returned.

    Args:
        accountant: The ledger to charge.
        mechanism: The mechanism whose charge is recorded and whose noise is added.
        label: The record's label; the function's qualified name by default.
        query_id: An idempotency key: a string, or a function of the call's arguments
            returning one (e.g. ``lambda rows, day: f"adults-{day}"``). A call whose id
            is already in the ledger raises
            `DuplicateQueryError` and does not run.

    Raises:
        TypeError: ``mechanism`` is not a mechanism, or the query is a generator function.
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"guard() needs a mechanism, got {type(mechanism).__name__}")

    def decorate(query: F) -> F:
        _refuse_generators(query)
        name = label or _label_of(query)
        if inspect.iscoroutinefunction(query):

            @functools.wraps(query)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                qid = _query_id_for(query_id, args, kwargs)
                await asyncio.to_thread(accountant.charge, mechanism, label=name, query_id=qid)
                return mechanism.release(await query(*args, **kwargs))

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(query)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            accountant.charge(
                mechanism, label=name, query_id=_query_id_for(query_id, args, kwargs)
            )
            return mechanism.release(query(*args, **kwargs))

        return wrapper  # type: ignore[return-value]

    return decorate


def run(accountant: Accountant, mechanism: Mechanism, query: Callable[..., Any], /,
        *args: Any, query_id: str | None = None, label: str | None = None,
        **kwargs: Any) -> Any:
    """Charge ``mechanism``, run ``query(*args, **kwargs)``, release its noisy answer.

    For an ``async`` query this returns an awaitable; the charge is made (in a worker
    thread) when it is awaited, still before the query starts. ``query_id`` and ``label``
    are taken by ``run`` (not passed on to the query).

    Raises:
        TypeError: The query is a generator function (nothing is charged).
        DuplicateQueryError: ``query_id`` is already in the ledger (nothing runs).

    Examples:
        >>> from dpaccount import Accountant, LaplaceMechanism
        >>> acct = Accountant(1)
        >>> _ = acct.run(LaplaceMechanism(epsilon=1, sensitivity=1), len, [1, 2, 3])
        >>> acct.run(LaplaceMechanism(epsilon=1, sensitivity=1), len, [1, 2, 3])
        Traceback (most recent call last):
        ...
        dpaccount.errors.BudgetExceededError: refused: this charge costs (ε=1, δ=0); ...
    """
    _refuse_generators(query)
    name = label or _label_of(query)
    if inspect.iscoroutinefunction(query):

        async def charged() -> Any:
            await asyncio.to_thread(accountant.charge, mechanism, label=name, query_id=query_id)
            return mechanism.release(await query(*args, **kwargs))

        return charged()
    accountant.charge(mechanism, label=name, query_id=query_id)
    return mechanism.release(query(*args, **kwargs))
