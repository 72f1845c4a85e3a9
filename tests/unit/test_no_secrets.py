"""No un-noised value in errors, their context chain, warnings or logs (issue: pipelines, item 1).

A canary value is planted in every kind of answer a guarded query might return by
mistake; every entry point (the guard, sync and async, ``Accountant.run``, each
mechanism's ``release``, the aggregates) must fail with an error that names the answer's
type or shape only. The canary must not appear in the error's ``str``, ``repr``, ``args``,
attributes, nor anywhere along its ``__cause__`` / ``__context__`` chain, nor in warnings
or log records captured at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpaccount import (
    Accountant,
    Budget,
    EllipticalGaussianMechanism,
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponseMechanism,
    aggregates,
)
from dpaccount.aggregates import IntegerGaussianMechanism, IntegerLaplaceMechanism
from dpaccount.errors import DPAccountError, UnreleasableResultError

CANARY_NUMBER = 31337.123456
CANARY_TEXT = "CANARY-8c1f"
MARKERS = ("31337", CANARY_TEXT)


class Hostile:
    """An answer whose conversions raise with the secret in their message."""

    def __float__(self) -> float:
        raise RuntimeError(f"secret {CANARY_NUMBER} {CANARY_TEXT}")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"secret {CANARY_NUMBER} {CANARY_TEXT}")

    def __iter__(self) -> Any:
        raise RuntimeError(f"secret {CANARY_NUMBER} {CANARY_TEXT}")

    def __repr__(self) -> str:
        return f"Hostile({CANARY_NUMBER}, {CANARY_TEXT})"


def bad_answers() -> list[Any]:
    return [
        pd.DataFrame({"income": [CANARY_NUMBER], "name": [CANARY_TEXT]}),
        pd.Series([CANARY_NUMBER, np.nan], name=CANARY_TEXT),
        [CANARY_NUMBER, CANARY_TEXT],
        {"x": CANARY_NUMBER, CANARY_TEXT: 1},
        np.array([CANARY_NUMBER, np.nan]),
        np.array([CANARY_TEXT]),
        float("nan"),
        None,
        CANARY_TEXT,
        Hostile(),
    ]


def _texts_of(exc: BaseException) -> list[str]:
    """Everything an error carries that could end up in a log or a ticket."""
    seen: list[str] = []
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None:
            continue
        seen += [str(current), repr(current)]
        seen += [repr(a) for a in current.args]
        seen += [repr(v) for v in vars(current).values()]
        stack += [current.__cause__, current.__context__]
    return seen


def assert_clean(exc: BaseException) -> None:
    for text in _texts_of(exc):
        for marker in MARKERS:
            assert marker not in text, f"{type(exc).__name__} leaks {marker!r}: {text[:200]}"


def _check(call: Callable[[], Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DPAccountError) as info:
            call()
    assert_clean(info.value)
    for w in caught:
        assert all(m not in str(w.message) for m in MARKERS)
    assert all(m not in caplog.text for m in MARKERS)


SCALAR_MECHANISMS: list[Callable[[], Any]] = [
    lambda: LaplaceMechanism(epsilon=1, sensitivity=1),
    lambda: GaussianMechanism(epsilon=1, delta="1e-6", sensitivity=1),
]


@pytest.mark.parametrize("answer", bad_answers(), ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("make", SCALAR_MECHANISMS, ids=["laplace", "gaussian"])
def test_guard_run_and_release_name_only_the_type(
    make: Callable[[], Any], answer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    mechanism = make()
    acct = Accountant(Budget(100, "1e-3"))

    @acct.guard(mechanism)
    def query() -> Any:
        return answer

    _check(query, caplog)
    _check(lambda: acct.run(mechanism, lambda: answer), caplog)
    _check(lambda: mechanism.release(answer), caplog)
    assert len(acct.records) == 2  # both ran, both keep their charge (no refunds)


@pytest.mark.parametrize("answer", bad_answers(), ids=lambda a: type(a).__name__)
def test_async_guard_names_only_the_type(answer: Any, caplog: pytest.LogCaptureFixture
                                          ) -> None:
    acct = Accountant(Budget(100))

    @acct.guard(LaplaceMechanism(epsilon=1, sensitivity=1))
    async def query() -> Any:
        return answer

    _check(lambda: asyncio.run(query()), caplog)


@pytest.mark.parametrize("answer", [*bad_answers(), [CANARY_NUMBER], [[CANARY_NUMBER] * 2]],
                         ids=lambda a: type(a).__name__)
def test_vector_and_selection_mechanisms(answer: Any, caplog: pytest.LogCaptureFixture) -> None:
    elliptical = EllipticalGaussianMechanism(1, "1e-6", [1.0, 2.0])
    _check(lambda: elliptical.release(answer), caplog)
    exponential = ExponentialMechanism(1, 1)
    if not isinstance(answer, list) or CANARY_TEXT in answer:
        _check(lambda: exponential.release(answer), caplog)
    rr = RandomizedResponseMechanism(1, 3)
    _check(lambda: rr.release(answer), caplog)


@pytest.mark.parametrize("answer", [*bad_answers(), "31337", [CANARY_TEXT], 31337.5],
                         ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("make", [
    lambda: IntegerLaplaceMechanism(1, 1),
    lambda: IntegerGaussianMechanism(1, "1e-6", 1),
], ids=["integer-laplace", "integer-gaussian"])
def test_integer_mechanisms_name_only_the_type(make: Callable[[], Any], answer: Any,
                                               caplog: pytest.LogCaptureFixture) -> None:
    # int("CANARY-8c1f") used to raise a ValueError quoting the text (issue 28, item 1)
    mechanism = make()
    acct = Accountant(Budget(100, "1e-3"))
    _check(lambda: mechanism.release(answer), caplog)
    _check(lambda: acct.run(mechanism, lambda: answer), caplog)


@pytest.mark.parametrize("category", [3, -1, 31337, True])
def test_randomized_response_out_of_domain(category: Any, caplog: pytest.LogCaptureFixture
                                           ) -> None:
    _check(lambda: RandomizedResponseMechanism(1, 3).release(category), caplog)


@pytest.mark.parametrize(
    "data",
    [
        pd.Series([CANARY_TEXT, "x"]),
        [CANARY_TEXT, CANARY_NUMBER],
        np.array([[CANARY_NUMBER, 1.0]]),
        Hostile(),
    ],
    ids=lambda a: type(a).__name__,
)
def test_aggregates_name_only_the_type(data: Any, caplog: pytest.LogCaptureFixture) -> None:
    acct = Accountant(Budget(100, "1e-3"))
    _check(lambda: aggregates.sum(data, acct, 1, lower=0, upper=1), caplog)
    _check(lambda: aggregates.mean(data, acct, 1, lower=0, upper=1), caplog)


def test_the_error_is_the_dedicated_one() -> None:
    with pytest.raises(UnreleasableResultError) as info:
        LaplaceMechanism(epsilon=1, sensitivity=1).release([CANARY_NUMBER, 1.0])
    assert info.value.found == "list of length 2"
    assert "finite real number" in info.value.expected
    assert isinstance(info.value, ValueError)  # except ValueError keeps working


# -- the guard's edges ------------------------------------------------------------------


def test_generator_functions_are_refused_at_decoration_and_nothing_is_charged() -> None:
    acct = Accountant(Budget(1))
    mech = LaplaceMechanism(epsilon="0.5", sensitivity=1)

    def rows() -> Any:
        yield 1

    async def arows() -> Any:
        yield 1

    for query in (rows, arows):
        with pytest.raises(TypeError, match="generator"):
            acct.guard(mech)(query)
        with pytest.raises(TypeError, match="generator"):
            acct.run(mech, query)
    assert len(acct.records) == 0


def test_guard_and_run_take_a_query_id_and_never_run_a_retry() -> None:
    from dpaccount.errors import DuplicateQueryError

    acct = Accountant(Budget(10))
    mech = LaplaceMechanism(epsilon=1, sensitivity=1)
    runs: list[str] = []

    @acct.guard(mech, query_id=lambda day: f"adults-{day}")
    def adults(day: str) -> int:
        runs.append(day)
        return 3

    adults("2026-11-24")
    with pytest.raises(DuplicateQueryError):
        adults("2026-11-24")
    adults("2026-11-25")
    assert runs == ["2026-11-24", "2026-11-25"]

    def count(rows: list[int]) -> int:
        runs.append("run")
        return len(rows)

    acct.run(mech, count, [1, 2], query_id="nightly")
    with pytest.raises(DuplicateQueryError):
        acct.run(mech, count, [1, 2], query_id="nightly")
    assert runs.count("run") == 1
    assert len(acct.records) == 3


def test_async_guard_does_not_block_the_event_loop_while_charging() -> None:
    # A store whose charge waits (as SQLite does for another writer's lock): while the
    # guarded coroutine waits for its charge, another task keeps running.
    import threading
    import time

    from dpaccount.storage.memory import MemoryStore

    gate = threading.Event()
    charged_at: list[float] = []

    class SlowStore(MemoryStore):
        def append(self, expected_head: int, record: Any) -> None:
            # Generous (issue 28): the ticker sets the gate after five 10 ms ticks; only a
            # guard that blocks the loop leaves it unset, and then fails the test below.
            gate.wait(timeout=60)
            charged_at.append(time.monotonic())
            super().append(expected_head, record)

    acct = Accountant(Budget(10), store=SlowStore())

    @acct.guard(LaplaceMechanism(epsilon=1, sensitivity=1))
    async def query() -> int:
        return 1

    ticks: list[float] = []

    async def ticker() -> None:
        for _ in range(5):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)
        gate.set()  # only after the loop ran five times is the charge allowed to finish

    async def main() -> None:
        await asyncio.gather(query(), ticker())

    asyncio.run(main())
    assert len(ticks) == 5
    assert len(acct.records) == 1
    # The loop ticked while the charge waited (a blocking charge would finish first).
    assert ticks[-1] <= charged_at[0]


# -- group-by ---------------------------------------------------------------------------


def _hostile_frames() -> list[pd.DataFrame]:
    return [
        # the value column holds text: refused by its dtype, before the charge
        pd.DataFrame({"k": ["a", "b"], "x": [CANARY_TEXT, "y"], "u": [1, 2]}),
        # unhashable keys and units: refused after the charge, naming the type
        pd.DataFrame({"k": [[CANARY_NUMBER], [1.0]], "x": [1.0, 2.0], "u": [1, 2]}),
        pd.DataFrame({"k": ["a", "b"], "x": [1.0, 2.0], "u": [[CANARY_TEXT], [2]]}),
    ]


@pytest.mark.parametrize("df", _hostile_frames(), ids=["text-values", "list-keys", "list-units"])
@pytest.mark.parametrize("declared", [True, False], ids=["keys", "private-keys"])
def test_groupby_names_only_the_type(df: pd.DataFrame, declared: bool,
                                     caplog: pytest.LogCaptureFixture) -> None:
    acct = Accountant(Budget(100, "1e-3"))
    keys = ["a", "b"] if declared else None
    g = aggregates.groupby(df, "k", keys=keys, privacy_unit="u", max_rows_per_unit=2)
    options = {"lower": 0, "upper": 1, "delta": "1e-6"}
    _check(lambda: g.sum("x", acct, 1, **options), caplog)
    _check(lambda: g.mean("x", acct, 1, **options), caplog)
    assert all(m not in repr(g) for m in MARKERS)
