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

**A guard releases only noised numbers; labels come back only when declared public.**
Labels computed from data are data: a pandas index, a Series' name, a DataFrame's
columns, a dict's keys, a structured array's fields or a categorical's categories are
never released with the noised values. The mechanisms return plain values, and the guard
checks what ``mechanism.release`` returned (`dpaccount.mechanisms.labels.plain_release`):
a labelled container (a pandas or polars object, a dict, a namedtuple, a structured
array) is refused with `UnreleasableResultError`, after the charge (no refunds). Labels
declared up front with ``public_index=`` (a Series' index, a DataFrame's rows) and
``public_columns=`` (a DataFrame's columns) come back: they are checked before anything
is charged, the answer is read at them (a declared label the answer lacks reads as 0,
labels not declared are dropped), and the noised numbers return as a pandas Series or
DataFrame carrying exactly the declared labels, in order
(`dpaccount.mechanisms.labels.PublicLabels`).

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

    Labels come back only when declared:

    >>> import pandas as pd
    >>> @acct.guard(LaplaceMechanism(epsilon=0.5, sensitivity=1, dimension=2),
    ...             public_index=["north", "south"])
    ... def per_region(rows):
    ...     return rows.groupby("region")["n"].sum()
    >>> rows = pd.DataFrame({"region": ["north", "east"], "n": [1, 1]})
    >>> list(per_region(rows).index)       # "south" read as 0, "east" dropped
    ['north', 'south']
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dpaccount.accountant.logs import log_query_failed
from dpaccount.mechanisms.base import Mechanism
from dpaccount.mechanisms.labels import PublicLabels, plain_release

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import Accountant

__all__ = ["guard", "run"]

F = TypeVar("F", bound=Callable[..., Any])
QueryId = str | Callable[..., str] | None
_log = logging.getLogger(__name__)


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


def _answer(accountant: Accountant, label: str, query_id: str | None,
            query: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the charged query; a failure is logged by its exception's type only (its text
    may quote the data) and raised as it is (the charge is kept: no refunds)."""
    try:
        return query(*args, **kwargs)
    except Exception as error:
        log_query_failed(_log, accountant.name, label, query_id, error)
        raise


async def _answer_async(accountant: Accountant, label: str, query_id: str | None,
                        answer: Awaitable[Any]) -> Any:
    """`_answer` for an ``async`` query's awaitable."""
    try:
        return await answer
    except Exception as error:
        log_query_failed(_log, accountant.name, label, query_id, error)
        raise


def _release(mechanism: Mechanism, labels: PublicLabels | None, answer: Any) -> Any:
    """Noise ``answer``: only plain noised values, or the declared labels, come out."""
    if labels is None:
        return plain_release(mechanism.release(answer))
    return labels.attach(mechanism.release(labels.read(answer)))


def guard(
    accountant: Accountant,
    mechanism: Mechanism,
    *,
    label: str | None = None,
    query_id: QueryId = None,
    public_index: Any = None,
    public_columns: Any = None,
) -> Callable[[F], F]:
    """A decorator that charges ``mechanism`` before each call of the decorated query.

    Works for plain and ``async`` functions; generator functions are refused. The
    decorated function's answer is passed to ``mechanism.release`` and the noisy value is
    returned: plain noised numbers only, unless labels are declared public.

    Args:
        accountant: The ledger to charge.
        mechanism: The mechanism whose charge is recorded and whose noise is added.
        label: The record's label; the function's qualified name by default.
        query_id: An idempotency key: a string, or a function of the call's arguments
            returning one (e.g. ``lambda rows, day: f"adults-{day}"``). A call whose id
            is already in the ledger raises
            `DuplicateQueryError` and does not run.
        public_index: Labels declared public (a list or tuple): the answer (a pandas
            Series, or a dict) is read at them, missing ones as 0, others dropped, and
            the noised values come back as a pandas Series with exactly this index.
        public_columns: With ``public_index``, a DataFrame's declared columns: the answer
            (a DataFrame, or a dict of columns) comes back as a DataFrame.

    Raises:
        TypeError: ``mechanism`` is not a mechanism, or the query is a generator function.
        ConfigError: The declared labels are not a sequence of distinct hashable labels,
            or do not match the mechanism's dimension (checked here, before any charge).
        UnreleasableResultError: At call time, after the charge: the answer cannot be
            released, or ``mechanism.release`` returned a labelled container.
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"guard() needs a mechanism, got {type(mechanism).__name__}")
    labels = PublicLabels.declare(public_index, public_columns, mechanism)

    def decorate(query: F) -> F:
        _refuse_generators(query)
        name = label or _label_of(query)
        if inspect.iscoroutinefunction(query):

            @functools.wraps(query)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                qid = _query_id_for(query_id, args, kwargs)
                await asyncio.to_thread(accountant.charge, mechanism, label=name, query_id=qid)
                answer = await _answer_async(accountant, name, qid, query(*args, **kwargs))
                return _release(mechanism, labels, answer)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(query)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            qid = _query_id_for(query_id, args, kwargs)
            accountant.charge(mechanism, label=name, query_id=qid)
            answer = _answer(accountant, name, qid, query, args, kwargs)
            return _release(mechanism, labels, answer)

        return wrapper  # type: ignore[return-value]

    return decorate


def run(accountant: Accountant, mechanism: Mechanism, query: Callable[..., Any], /,
        *args: Any, query_id: str | None = None, label: str | None = None,
        public_index: Any = None, public_columns: Any = None, **kwargs: Any) -> Any:
    """Charge ``mechanism``, run ``query(*args, **kwargs)``, release its noisy answer.

    For an ``async`` query this returns an awaitable; the charge is made (in a worker
    thread) when it is awaited, still before the query starts. ``query_id``, ``label``,
    ``public_index`` and ``public_columns`` are taken by ``run`` (not passed on to the
    query); the last two declare labels public, as for `guard`.

    Raises:
        TypeError: The query is a generator function (nothing is charged).
        ConfigError: The declared labels are invalid (nothing is charged).
        DuplicateQueryError: ``query_id`` is already in the ledger (nothing runs).
        UnreleasableResultError: After the charge: the answer cannot be released.

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
    labels = PublicLabels.declare(public_index, public_columns, mechanism)
    name = label or _label_of(query)
    if inspect.iscoroutinefunction(query):

        async def charged() -> Any:
            await asyncio.to_thread(accountant.charge, mechanism, label=name, query_id=query_id)
            answer = await _answer_async(accountant, name, query_id, query(*args, **kwargs))
            return _release(mechanism, labels, answer)

        return charged()
    accountant.charge(mechanism, label=name, query_id=query_id)
    return _release(mechanism, labels, _answer(accountant, name, query_id, query, args, kwargs))
