"""A data label never leaves a guarded query (issue 28, item 1).

A canary key (``CANARY-KEY-XYZ``, or ``CANARY_KEY_XYZ`` where a label must be an
identifier) is planted as a label (an index, a name, columns, dict keys, structured
fields, dtype metadata, categories, a namedtuple's fields) of every kind of container a
query can return, next to a canary value, at length 1 and at length = the mechanism's
dimension. Through every entry point (``Accountant.guard``, ``Accountant.run``, the
module-level ``dpaccount.guard.guard`` / ``run``, their ``async`` forms, and a direct
``mechanism.release``), the answer is either released as plain noised values or refused
with `UnreleasableResultError`. Either way the key appears nowhere: not in the result's
repr, str, pickle bytes, index, name, columns or dtype, not in any error's message,
arguments, attributes or ``__cause__`` / ``__context__`` chain, not in any warning or log
record. The canary value appears only noised: never as itself (it is not on any
mechanism's lattice, so no draw can return it) and never as its 8 bytes.

Declared labels (``public_index=`` / ``public_columns=``) come back, in the declared
order; labels the answer has but that were not declared are dropped; declared labels the
answer lacks read as 0. The expected values come from a second computation: the same
seeded mechanism releasing the hand-aligned plain list.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib.util
import logging
import pickle
import struct
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpaccount.guard
from dpaccount import (
    Accountant,
    BLRMechanism,
    Budget,
    EllipticalGaussianMechanism,
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponseMechanism,
    aggregates,
)
from dpaccount.aggregates import IntegerGaussianMechanism, IntegerLaplaceMechanism
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, UnreleasableResultError
from dpaccount.mechanisms import Mechanism, RandomSource

CANARY_KEY = "CANARY-KEY-XYZ"
CANARY_IDENT = "CANARY_KEY_XYZ"  # where a label must be an identifier
CANARY_VALUE = 123456.789  # not a multiple of any power of two >= 2**-20: off every lattice
CANARY_INT = 123456789
KEY_MARKER = "CANARY"
VALUE_MARKER = "123456"
VALUE_BYTES = (struct.pack("<d", CANARY_VALUE), struct.pack(">d", CANARY_VALUE))
HAS_POLARS = importlib.util.find_spec("polars") is not None

SEEDED = RandomSource.seeded


# -- what a container may carry --------------------------------------------------------


def labelled_answers(d: int, integer: bool = False) -> list[tuple[str, Any]]:
    """Every kind of container, d numbers each, the first being the canary value, the
    canary key on every label the container has."""
    first: float | int = CANARY_INT if integer else CANARY_VALUE
    values: list[Any] = [first] + [(i if integer else float(i)) for i in range(1, d)]
    keys = [CANARY_KEY] + [f"k{i}" for i in range(1, d)]
    dtype = np.int64 if integer else np.float64
    fields = [(f"{CANARY_KEY}-{i}", dtype) for i in range(d)]
    structured = np.array([tuple(values)], dtype=fields)
    Row = collections.namedtuple("Row", [f"{CANARY_IDENT}_{i}" for i in range(d)])
    cat_index = pd.CategoricalIndex(keys, categories=[*keys, "CANARY-unused"])
    answers: list[tuple[str, Any]] = [
        ("series", pd.Series(values, index=keys, name=CANARY_KEY)),
        ("series-categorical-index", pd.Series(values, index=cat_index, name=CANARY_KEY)),
        ("series-multiindex", pd.Series(
            values, index=pd.MultiIndex.from_tuples([(k, CANARY_KEY) for k in keys],
                                                    names=[CANARY_KEY, "b"]))),
        ("frame-row", pd.DataFrame([values], columns=keys, index=[CANARY_KEY])),
        ("frame-column", pd.DataFrame({CANARY_KEY: values}, index=keys)),
        ("structured-array", structured),
        ("structured-row", structured[0]),
        ("record-array", structured.view(np.recarray)),
        ("array-with-metadata",
         np.array(values, dtype=np.dtype(dtype, metadata={CANARY_KEY: CANARY_KEY}))),
        ("dict", dict(zip(keys, values, strict=True))),
        ("tuple", tuple(values)),
        ("namedtuple", Row(*values)),
        ("list", list(values)),
        ("list-of-series", [pd.Series(values, index=keys, name=CANARY_KEY)]),
        ("tuple-of-namedtuple", (Row(*values),)),
        ("list-of-dict", [dict(zip(keys, values, strict=True))]),
        ("dict-of-series", {CANARY_KEY: pd.Series(values, index=keys)}),
    ]
    categorical = pd.Series(pd.Categorical(values, categories=[*values, -1]), index=keys,
                            name=CANARY_KEY)
    answers.append(("series-categorical-values", categorical))
    if HAS_POLARS:
        import polars as pl

        answers += [
            ("polars-series", pl.Series(CANARY_KEY, values)),
            ("polars-frame", pl.DataFrame({k: [v] for k, v in zip(keys, values, strict=True)})),
        ]
    return answers


ANSWER_IDS = [name for name, _ in labelled_answers(1)]


def _mechanisms(d: int) -> dict[str, Callable[[], Mechanism]]:
    domain = [0, 1, 2, 3]
    return {
        "laplace": lambda: LaplaceMechanism(1, 1, dimension=d, rng=SEEDED(1)),
        "gaussian": lambda: GaussianMechanism(1, "1e-6", 1, dimension=d, rng=SEEDED(2)),
        "integer-laplace": lambda: IntegerLaplaceMechanism(1, 1, rng=SEEDED(3)),
        "integer-gaussian": lambda: IntegerGaussianMechanism(1, "1e-6", 1, rng=SEEDED(4)),
        "elliptical": lambda: EllipticalGaussianMechanism(1, "1e-6", [1.0] * d, rng=SEEDED(5)),
        "exponential": lambda: ExponentialMechanism(1, 1, rng=SEEDED(6)),
        "randomized-response": lambda: RandomizedResponseMechanism(1, 3, rng=SEEDED(7)),
        "blr": lambda: BLRMechanism(1, domain, [lambda x: x < 2], size=2, dataset_size=10,
                                    rng=SEEDED(8)),
    }


MECHANISM_NAMES = list(_mechanisms(1))


@functools.cache
def mechanism_of(name: str, d: int) -> Mechanism:
    """One instance per kind and dimension (building a Gaussian takes milliseconds)."""
    return _mechanisms(d)[name]()
INTEGER_MECHANISMS = ("integer-laplace", "integer-gaussian")
ENTRIES = ("release", "guard", "run", "module-guard", "module-run", "async-guard",
           "async-run")


def _accountant(mechanism: Mechanism) -> Accountant:
    relation = ("substitution" if isinstance(mechanism, RandomizedResponseMechanism)
                else "add_remove")
    return Accountant(Budget(10**6, "0.5"), relation=relation)


def call(entry: str, mechanism: Mechanism, answer: Any, **declared: Any) -> Any:
    """The released answer through one entry point (each with a fresh ledger)."""
    acct = _accountant(mechanism)

    def query() -> Any:
        return answer

    async def aquery() -> Any:
        return answer

    if entry == "release":
        return mechanism.release(answer)
    if entry == "guard":
        return acct.guard(mechanism, **declared)(query)()
    if entry == "run":
        return acct.run(mechanism, query, **declared)
    if entry == "module-guard":
        return dpaccount.guard.guard(acct, mechanism, **declared)(query)()
    if entry == "module-run":
        return dpaccount.guard.run(acct, mechanism, query, **declared)
    if entry == "async-guard":
        return asyncio.run(acct.guard(mechanism, **declared)(aquery)())
    if entry == "async-run":
        return asyncio.run(acct.run(mechanism, aquery, **declared))
    raise AssertionError(entry)


# -- checks -------------------------------------------------------------------------------


def _texts_of_error(exc: BaseException) -> list[str]:
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


def assert_clean_error(exc: BaseException) -> None:
    for text in _texts_of_error(exc):
        for marker in (KEY_MARKER, VALUE_MARKER):
            assert marker not in text, f"{type(exc).__name__} leaks {marker!r}: {text[:200]}"


def _label_texts(result: Any) -> list[str]:
    """Everything a result says about itself besides its numbers."""
    texts = [repr(result), str(result), repr(type(result))]
    for attribute in ("index", "name", "names", "columns", "dtype", "schema", "_fields"):
        value = getattr(result, attribute, None)
        if value is not None:
            texts.append(repr(value))
    dtype = getattr(result, "dtype", None)
    if dtype is not None:
        texts += [repr(getattr(dtype, "names", None)), repr(getattr(dtype, "metadata", None))]
    return texts


def _numbers(result: Any) -> list[float]:
    if isinstance(result, int | float):
        return [float(result)]
    return [float(v) for v in np.asarray(result, dtype=np.float64).ravel().tolist()]


def assert_clean_result(result: Any, *, noised_value: bool) -> None:
    """No key anywhere; the canary value never as itself (only checked where the noise
    cannot be 0 exactly: off-lattice float answers)."""
    blob = pickle.dumps(result)
    assert KEY_MARKER.encode() not in blob
    for text in _label_texts(result):
        assert KEY_MARKER not in text, text[:200]
    if noised_value:
        assert all(v != CANARY_VALUE for v in _numbers(result))
        assert all(b not in blob for b in VALUE_BYTES)


def assert_plain(result: Any) -> None:
    """An independent statement of "plain": builtin numbers, exact lists and tuples of
    them, or a bare numpy array with a bare dtype."""
    if isinstance(result, np.ndarray):
        assert type(result) is np.ndarray
        assert result.dtype.names is None and result.dtype.metadata is None
        assert result.dtype.kind in "biuf"
        return
    if type(result) in (list, tuple):
        for item in result:
            assert_plain(item)
        return
    assert type(result) in (int, float, bool), type(result)


def observe(thunk: Callable[[], Any], caplog: pytest.LogCaptureFixture) -> tuple[Any, Any]:
    """(result, None) or (None, error); warnings and logs checked for both canaries."""
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, error = thunk(), None
        except UnreleasableResultError as exc:
            result, error = None, exc
    for w in caught:
        assert KEY_MARKER not in str(w.message) and VALUE_MARKER not in str(w.message)
    assert KEY_MARKER not in caplog.text and VALUE_MARKER not in caplog.text
    return result, error


# -- every container, every mechanism, every entry point ---------------------------------


#: What the lattice mechanisms must do with each container of d numbers: strip it to a
#: plain array (True) or refuse it (False); not listed: either (a structured array is
#: stripped when its fields convert to floats, refused when they do not). A dict's keys
#: are labels: refused.
STRIPPED_BY_LATTICE = {
    "series": True, "series-categorical-index": True, "series-multiindex": True,
    "frame-row": True, "frame-column": True,
    "array-with-metadata": True, "dict": False, "tuple": True, "namedtuple": True,
    "list": True, "list-of-series": True, "tuple-of-namedtuple": True,
    "list-of-dict": False, "dict-of-series": False, "series-categorical-values": True,
    "polars-series": True, "polars-frame": True,
}


@pytest.mark.parametrize("d", [1, 3], ids=["length-1", "length-dimension"])
@pytest.mark.parametrize("mechanism_name", MECHANISM_NAMES)
@pytest.mark.parametrize("answer_name", ANSWER_IDS)
def test_no_label_leaves_any_entry_point(answer_name: str, mechanism_name: str, d: int,
                                         caplog: pytest.LogCaptureFixture) -> None:
    integer = mechanism_name in INTEGER_MECHANISMS
    answer = dict(labelled_answers(d, integer=integer))[answer_name]
    mechanism = mechanism_of(mechanism_name, d)
    lattice = mechanism_name in ("laplace", "gaussian")
    for entry in ENTRIES:
        result, error = observe(lambda e=entry: call(e, mechanism, answer), caplog)
        if error is not None:
            assert_clean_error(error)
            expected = STRIPPED_BY_LATTICE.get(answer_name)
            assert not (lattice and expected), f"{entry} refused a {answer_name}"
            continue
        if lattice:
            expected = STRIPPED_BY_LATTICE.get(answer_name, True)
            assert expected, f"{entry} released a {answer_name}"
        assert_plain(result)
        assert_clean_result(result, noised_value=lattice or mechanism_name == "elliptical")


def test_the_finding_a_one_group_sum_comes_back_without_its_key() -> None:
    # The hostile review's query, verbatim.
    df = pd.DataFrame({"region": [CANARY_KEY, "NORTH", CANARY_KEY],
                       "income": [CANARY_VALUE, 5.0, 1.0]})
    acct = Accountant(Budget(10))

    @acct.guard(LaplaceMechanism(epsilon=1, sensitivity=1))
    def income_of_canary(frame: pd.DataFrame) -> Any:
        return frame[frame.region.str.startswith("CAN")].groupby("region")["income"].sum()

    noisy = income_of_canary(df)
    assert type(noisy) is np.ndarray and noisy.shape == (1,)
    assert_clean_result(noisy, noised_value=False)  # the sum is not the canary value
    assert len(acct.records) == 1


# -- defence in depth: what a user-written release returns --------------------------------


class LeakyMechanism(Mechanism):
    """A user's mechanism that noises the numbers but hands back whatever it is given
    around them (as `labelled_like` used to)."""

    def __init__(self, wrap: Callable[[Any], Any]) -> None:
        self._wrap = wrap

    @property
    def charge(self) -> PrivacyCost:
        return PrivacyCost(1)

    def release(self, value: Any) -> Any:
        return self._wrap(value)


class Opaque:
    """An object the guard cannot open (a type is code: its name may appear)."""

    label = CANARY_KEY


LEAKS: dict[str, Callable[[Any], Any]] = {
    "series": lambda v: pd.Series([1.0], index=[CANARY_KEY]),
    "series-named": lambda v: pd.Series([1.0], name=CANARY_KEY),
    "frame": lambda v: pd.DataFrame({CANARY_KEY: [1.0]}),
    "index": lambda v: pd.Index([CANARY_KEY]),
    "dict": lambda v: {CANARY_KEY: 1.0},
    "namedtuple": lambda v: collections.namedtuple("R", [CANARY_IDENT])(1.0),
    "structured": lambda v: np.zeros(1, dtype=[(CANARY_KEY, "f8")]),
    "metadata": lambda v: np.zeros(1, dtype=np.dtype("f8", metadata={"k": CANARY_KEY})),
    "nested": lambda v: [1.0, (2.0, {CANARY_KEY: 3.0})],
    "set": lambda v: {1.0, 2.0},
    "object": lambda v: Opaque(),
    "the-answer-itself": lambda v: v,
}


@pytest.mark.parametrize("leak", list(LEAKS))
@pytest.mark.parametrize("entry", [e for e in ENTRIES if e != "release"])
def test_the_guard_refuses_a_labelled_result_of_a_custom_mechanism(
        leak: str, entry: str, caplog: pytest.LogCaptureFixture) -> None:
    answer = pd.Series([CANARY_VALUE], index=[CANARY_KEY], name=CANARY_KEY)
    mechanism = LeakyMechanism(LEAKS[leak])
    result, error = observe(lambda: call(entry, mechanism, answer), caplog)
    assert result is None and error is not None
    assert_clean_error(error)


def test_a_refused_result_keeps_its_charge_and_a_plain_one_passes() -> None:
    acct = Accountant(Budget(10))
    leaky = acct.guard(LeakyMechanism(LEAKS["series"]))(lambda: 1.0)
    with pytest.raises(UnreleasableResultError, match=r"pandas\.Series of shape"):
        leaky()
    assert acct.spent == PrivacyCost(1)  # the query ran: no refund
    plain = [1.0, (2, "a"), np.zeros(2), None]
    assert acct.run(LeakyMechanism(lambda v: plain), lambda: 0) is plain
    assert acct.spent == PrivacyCost(2)


# -- declared labels come back ------------------------------------------------------------


def _reference(mechanism: Callable[[], Mechanism], aligned: list[Any]) -> Any:
    """The same seeded mechanism releasing the hand-aligned list."""
    return mechanism().release(aligned)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e != "release"])
def test_declared_index_comes_back_in_order_extra_dropped_missing_zero(entry: str) -> None:
    answer = pd.Series([7.0, CANARY_VALUE, 2.0], index=["north", CANARY_KEY, "east"],
                       name=CANARY_KEY)
    declared = ["south", "north", "east"]  # south missing; the canary not declared

    def make() -> Mechanism:
        return LaplaceMechanism(1, 1, dimension=3, rng=SEEDED(11))

    out = call(entry, make(), answer, public_index=declared)
    assert type(out) is pd.Series
    assert list(out.index) == declared and out.name is None and out.index.name is None
    expected = _reference(make, [0, 7.0, 2.0])
    assert out.to_numpy().tolist() == expected.tolist()
    assert_clean_result(out, noised_value=True)


@pytest.mark.parametrize("entry", ["guard", "run", "async-guard"])
def test_declared_rows_and_columns_come_back_as_a_frame(entry: str) -> None:
    answer = pd.DataFrame({"a": [1.0, 2.0, CANARY_VALUE], CANARY_KEY: [4.0, 5.0, 6.0]},
                          index=["r1", "r2", CANARY_KEY])
    rows, columns = ["r2", "r1", "r3"], ["b", "a"]

    def make() -> Mechanism:
        return GaussianMechanism(1, "1e-6", 1, dimension=6, rng=SEEDED(12))

    out = call(entry, make(), answer, public_index=rows, public_columns=columns)
    assert type(out) is pd.DataFrame
    assert list(out.index) == rows and list(out.columns) == columns
    # row-major at the declared cells: (r2, b) (r2, a) (r1, b) (r1, a) (r3, b) (r3, a)
    expected = _reference(make, [0, 2.0, 0, 1.0, 0, 0])
    assert out.to_numpy().ravel().tolist() == expected.tolist()
    assert_clean_result(out, noised_value=True)


def test_dicts_are_read_at_the_declared_keys() -> None:
    acct = Accountant(Budget(100))

    def make() -> Mechanism:
        return LaplaceMechanism(1, 1, dimension=2, rng=SEEDED(13))

    flat = {"a": 3.0, CANARY_KEY: CANARY_VALUE}
    out = acct.run(make(), lambda: flat, public_index=["b", "a"])
    assert list(out.index) == ["b", "a"]
    assert out.tolist() == _reference(make, [0, 3.0]).tolist()
    nested = {"x": {"a": 1.0, CANARY_KEY: CANARY_VALUE}, CANARY_KEY: {"a": CANARY_VALUE}}
    table = acct.run(make(), lambda: nested, public_index=["a"], public_columns=["x", "y"])
    assert list(table.index) == ["a"] and list(table.columns) == ["x", "y"]
    assert table.to_numpy().ravel().tolist() == _reference(make, [1.0, 0]).tolist()
    for out_ in (out, table):
        assert_clean_result(out_, noised_value=True)


def test_a_one_element_answer_at_an_undeclared_key_reads_as_zero() -> None:
    # The finding with a declaration: the data's only key is not declared, so it is
    # dropped and the declared one reads 0; nothing about the key is released.
    df = pd.DataFrame({"region": [CANARY_KEY], "income": [CANARY_VALUE]})

    def make() -> Mechanism:
        return LaplaceMechanism(1, 1, rng=SEEDED(14))

    acct = Accountant(Budget(10))
    out = acct.run(make(), lambda f: f.groupby("region")["income"].sum(), df,
                   public_index=["NORTH"])
    assert list(out.index) == ["NORTH"]
    assert out.tolist() == _reference(make, [0]).tolist()
    assert_clean_result(out, noised_value=True)


def test_a_repeated_answer_label_reads_its_last_value() -> None:
    def make() -> Mechanism:
        return LaplaceMechanism(1, 1, dimension=1, rng=SEEDED(15))

    answer = pd.Series([1.0, 2.0], index=["a", "a"])
    out = Accountant(Budget(10)).run(make(), lambda: answer, public_index=["a"])
    assert out.tolist() == _reference(make, [2.0]).tolist()


def test_integer_noise_with_declared_labels_gives_integers() -> None:
    def make() -> Mechanism:
        return IntegerLaplaceMechanism(1, 1, rng=SEEDED(16))

    answer = pd.Series([3, CANARY_INT], index=["a", CANARY_KEY])
    out = Accountant(Budget(10)).run(make(), lambda: answer, public_index=["a", "b"])
    assert list(out.index) == ["a", "b"] and out.dtype.kind == "i"
    assert out.tolist() == _reference(make, [3, 0])
    assert_clean_result(out, noised_value=False)


def test_declared_tuple_labels_become_a_multiindex() -> None:
    answer = pd.Series([1.0, CANARY_VALUE],
                       index=pd.MultiIndex.from_tuples([("n", 1), (CANARY_KEY, 2)]))
    out = Accountant(Budget(10)).run(LaplaceMechanism(1, 1, dimension=2), lambda: answer,
                                     public_index=[("n", 1), ("s", 2)])
    assert list(out.index) == [("n", 1), ("s", 2)]
    assert_clean_result(out, noised_value=True)


@pytest.mark.parametrize(
    "answer",
    [[1.0, 2.0], np.array([1.0, 2.0]), 3.0, (1.0, 2.0),
     pd.DataFrame({"a": [1.0, 2.0]}, index=["a", "b"])],
    ids=["list", "array", "float", "tuple", "frame-without-columns"],
)
def test_declared_labels_need_a_labelled_answer(answer: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    # A positional answer has no labels to read the declared ones at: refused by type.
    acct = Accountant(Budget(10))
    result, error = observe(
        lambda: acct.run(LaplaceMechanism(1, 1, dimension=2), lambda: answer,
                         public_index=["a", "b"]), caplog)
    assert result is None and error is not None
    assert len(acct.records) == 1  # the query ran: no refund


def test_polars_with_declared_labels_is_refused_by_name() -> None:
    pl = pytest.importorskip("polars")
    acct = Accountant(Budget(10))
    for answer in (pl.Series(CANARY_KEY, [CANARY_VALUE]), pl.DataFrame({CANARY_KEY: [1.0]})):
        with pytest.raises(UnreleasableResultError, match="polars") as info:
            acct.run(LaplaceMechanism(1, 1), lambda a=answer: a, public_index=["a"])
        assert_clean_error(info.value)


class HostileLabel:
    """A label whose hash and comparisons raise with the canary in their message."""

    def __hash__(self) -> int:
        raise RuntimeError(f"{CANARY_KEY} {CANARY_VALUE}")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError(f"{CANARY_KEY} {CANARY_VALUE}")


def test_a_hostile_answer_label_is_refused_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    answer = pd.Series([1.0], index=pd.Index([HostileLabel()], dtype=object))
    acct = Accountant(Budget(10))
    result, error = observe(lambda: acct.run(LaplaceMechanism(1, 1), lambda: answer,
                                             public_index=["a"]), caplog)
    assert result is None and error is not None
    assert_clean_error(error)


# -- declarations are checked before anything is charged ----------------------------------


@pytest.mark.parametrize(
    ("index", "columns", "match"),
    [
        ("ab", None, "sequence"),
        ({"a", "b"}, None, "sequence"),
        ({"a": 1}, None, "sequence"),
        (iter(["a"]), None, "sequence"),
        (3, None, "sequence"),
        ([], None, "empty"),
        (["a", "a"], None, "same label"),
        ([1, True], None, "same label"),
        ([1, 1.0], None, "same label"),
        ([["a"]], None, "hashable"),
        ([float("nan")], None, "NaN"),
        (np.array([["a"]]), None, "one-dimensional"),
        (["a", "b", "c"], None, "coordinates"),
        (None, ["a", "b"], "public_index"),
        (["a"], ["x", "y", "z"], "coordinates"),
        (["a"], "xy", "sequence"),
    ],
)
def test_invalid_declarations_are_refused_before_the_charge(index: Any, columns: Any,
                                                            match: str) -> None:
    acct = Accountant(Budget(10))
    mechanism = LaplaceMechanism(1, 1, dimension=2)
    ran: list[int] = []

    def query() -> float:
        ran.append(1)
        return 1.0

    with pytest.raises(ConfigError, match=match):
        acct.guard(mechanism, public_index=index, public_columns=columns)
    with pytest.raises(ConfigError, match=match):
        acct.run(mechanism, query, public_index=index, public_columns=columns)
    assert ran == [] and len(acct.records) == 0


@pytest.mark.parametrize("make", [
    lambda: ExponentialMechanism(1, 1),
    lambda: RandomizedResponseMechanism(1, 2),
    lambda: BLRMechanism(1, [0, 1], [lambda x: x < 1], size=1, dataset_size=2),
], ids=["exponential", "randomized-response", "blr"])
def test_a_selecting_mechanism_takes_no_declared_labels(make: Callable[[], Mechanism]) -> None:
    acct = Accountant(Budget(10), relation="substitution")
    with pytest.raises(ConfigError, match="selection"):
        acct.guard(make(), public_index=["a", "b"])
    assert len(acct.records) == 0


def test_declared_labels_accept_tuples_arrays_and_pandas_indexes() -> None:
    acct = Accountant(Budget(10))
    answer = pd.Series([1.0, 2.0], index=["a", "b"])
    for declared in (("a", "b"), np.array(["a", "b"]), pd.Index(["a", "b"]), range(2)):
        out = acct.run(LaplaceMechanism(1, 1, dimension=2), lambda: answer,
                       public_index=declared)
        assert list(out.index) == list(declared)


# -- properties ---------------------------------------------------------------------------

LABEL = st.one_of(st.text(max_size=4), st.integers(-3, 3))


@settings(max_examples=60, deadline=None)
@given(declared=st.lists(LABEL, min_size=1, max_size=5, unique=True),
       present=st.dictionaries(st.one_of(LABEL, st.just(CANARY_KEY)),
                               st.floats(-1e6, 1e6), max_size=6),
       as_series=st.booleans())
def test_released_labels_are_exactly_the_declared_ones(
        declared: list[Any], present: dict[Any, float], as_series: bool) -> None:
    answer: Any = pd.Series(list(present.values()), index=pd.Index(list(present), dtype=object),
                            dtype=np.float64) if as_series else present

    def make() -> Mechanism:
        return LaplaceMechanism(1, 1, dimension=len(declared), rng=SEEDED(17))

    out = Accountant(Budget(10)).run(make(), lambda: answer, public_index=declared)
    assert list(out.index) == declared  # a subset of the declared, in order: all of them
    assert set(out.index) <= set(declared) and out.name is None
    assert out.tolist() == _reference(make, [present.get(k, 0) for k in declared]).tolist()
    if CANARY_KEY not in declared:
        assert KEY_MARKER.encode() not in pickle.dumps(out)


@settings(max_examples=60, deadline=None)
@given(present=st.dictionaries(st.one_of(LABEL, st.just(CANARY_KEY)), st.floats(-1e6, 1e6),
                               min_size=1, max_size=6),
       name=st.one_of(st.none(), st.just(CANARY_KEY)))
def test_without_a_declaration_no_label_comes_back(present: dict[Any, float],
                                                   name: str | None) -> None:
    answer = pd.Series(list(present.values()), index=pd.Index(list(present), dtype=object),
                       name=name, dtype=np.float64)
    out = Accountant(Budget(10)).run(LaplaceMechanism(1, 1, dimension=len(present)),
                                     lambda: answer)
    assert type(out) is np.ndarray and out.dtype == np.float64 and out.shape == (len(present),)
    assert KEY_MARKER.encode() not in pickle.dumps(out)


# -- aggregates: their labels are declared or privately selected --------------------------


def test_histogram_labels_are_the_declared_categories_not_the_datas_name() -> None:
    data = pd.Series(["red", CANARY_KEY, "blue"], name=CANARY_KEY)
    res = aggregates.histogram(data, Accountant(Budget(10)), 1, categories=["red", "blue"])
    assert list(res.value.index) == ["red", "blue"] and res.value.name is None
    for side in (res.value, *res.interval):
        assert_clean_result(side, noised_value=False)
    assert KEY_MARKER not in repr(res)


def test_groupby_with_declared_keys_reports_only_them() -> None:
    df = pd.DataFrame({"region": ["N", CANARY_KEY, "S"], "income": [1.0, CANARY_VALUE, 2.0]})
    res = aggregates.groupby(df, "region", keys=["N", "S"]).sum(
        "income", Accountant(Budget(10)), 1, lower=0, upper=10)
    assert list(res.frame.index) == ["N", "S"]
    assert KEY_MARKER.encode() not in pickle.dumps(res.frame)
