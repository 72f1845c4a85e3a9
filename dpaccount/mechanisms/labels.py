"""What a guard releases: noised numbers, and labels only when they are declared public.

**Labels computed from data are data.** A pandas index, a Series' name, a DataFrame's
columns, a dict's keys, a structured array's field names or a categorical's categories
can come straight out of the data: ``df[df.region.str.startswith("CAN")]
.groupby("region")["income"].sum()`` is a one-element Series whose only label is a key
that only the data holds. Adding noise to the value does nothing for its label, so a
guard releases only noised numbers:

* every mechanism's ``release`` returns plain values (a float, a numpy float64 array, an
  int, a list of ints, an index, the declared domain elements), never the labels of its
  input;
* the guard checks, as a second line of defence, what a (possibly user-written)
  `Mechanism.release` returned: `plain_release` lets through numbers, text, ``None`` and
  plain lists, tuples and numpy arrays of them, and refuses anything else (a pandas or
  polars object, a dict, a namedtuple, a structured array or one whose dtype carries
  metadata) with `UnreleasableResultError`, which names the type and shape only;
* labels declared public up front (`PublicLabels`: ``public_index=`` and
  ``public_columns=`` on ``guard`` and ``run``) come back: the answer is read at the
  declared labels, by a rule that never depends on the data (a declared label that the
  answer lacks reads as 0; labels that were not declared are dropped; a label the answer
  repeats reads as its last value), the numbers are noised, and the result is a pandas
  Series or DataFrame carrying exactly the declared labels, in the declared order.

pandas is imported only when labels are declared (the ``pandas`` extra); polars answers
with declared labels are refused by name (a polars Series or DataFrame has no row labels
to read the declared ones at).

Examples:
    >>> plain_release([1.5, 2.0]), plain_release(3)
    ([1.5, 2.0], 3)
    >>> plain_release({"a": 1.0})
    Traceback (most recent call last):
    ...
    dpaccount.errors.UnreleasableResultError: the query returned dict of length 1; ...
    >>> labels = PublicLabels.declare(["north", "south"], None)
    >>> labels.read({"south": 3.0, "east": 9.0})      # "north" is missing: 0
    [0, 3.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from dpaccount.errors import ConfigError, missing_extra, unreleasable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.mechanisms.base import Mechanism

__all__ = ["RELEASABLE", "PublicLabels", "is_plain", "plain_release"]

#: What a guard lets out of a mechanism, for error messages.
RELEASABLE = "noised numbers: a number, or a list, tuple or numpy array of numbers"

#: Values that carry no label (exact types: a subclass may add attributes).
_PLAIN_TYPES = frozenset(
    {bool, int, float, complex, str, bytes, Fraction, Decimal, type(None)}
)

_LABELLED_HINT = (
    "Labels computed from data (an index, a name, columns, keys, fields, categories) are "
    "data: return plain numbers, or declare the labels public with public_index= (and "
    "public_columns= for a DataFrame)."
)


def _plain_dtype(dtype: np.dtype[Any]) -> bool:
    return dtype.fields is None and dtype.metadata is None and dtype.kind != "V"


def is_plain(value: Any) -> bool:
    """Whether ``value`` is made of plain values only, carrying no label.

    Plain: ``None``, numbers, text and bytes of the builtin types, numpy scalars, and
    ``list``, ``tuple`` and ``numpy.ndarray`` objects (exactly those types: no
    namedtuple, no subclass) holding plain values; a numpy dtype with fields or metadata
    is not plain. No user code runs (only exact builtin and numpy types are opened), so
    it never raises.

    Examples:
        >>> import collections
        >>> is_plain((1, [2.0, "a"], np.zeros(3)))
        True
        >>> is_plain(collections.namedtuple("Row", "x")(1.0))
        False
    """
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_TYPES:
            continue
        if kind is list or kind is tuple:
            if id(item) not in seen:  # a list may hold itself
                seen.add(id(item))
                stack.extend(item)
            continue
        if kind is np.ndarray:
            if not _plain_dtype(item.dtype):
                return False
            if item.dtype.kind == "O":
                stack.extend(item.ravel().tolist())
            continue
        if isinstance(item, np.generic) and kind.__module__ == "numpy":
            if not _plain_dtype(item.dtype) or item.dtype.kind == "O":
                return False
            continue
        return False
    return True


def plain_release(result: Any) -> Any:
    """``result`` itself when it is plain (`is_plain`); otherwise refuse it.

    The guard's second line of defence: whatever a mechanism's ``release`` returned, a
    label that came from the data must not leave with it.

    Raises:
        UnreleasableResultError: ``result`` carries labels (or is of a type the guard
            cannot open); the error names its type and shape only.
    """
    if is_plain(result):
        return result
    raise unreleasable(result, RELEASABLE, _LABELLED_HINT)


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is in the test extra
        raise missing_extra("pandas", "pandas") from None
    return pd


def _labels(value: Any, field: str) -> tuple[Any, ...]:
    """A declaration checked: an ordered, non-empty sequence of distinct hashable labels."""
    if isinstance(value, str | bytes | Mapping):
        raise ConfigError(
            f"{field} must be a sequence of labels (a list or tuple), not a "
            f"{type(value).__name__}"
        )
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("pandas"):
        if getattr(value, "ndim", None) != 1:
            raise ConfigError(f"{field} must be one-dimensional (a list of labels)")
        items = tuple(value.tolist())
    elif isinstance(value, Sequence):
        items = tuple(value)
    else:
        raise ConfigError(
            f"{field} must be a sequence of labels (a list or tuple), not a "
            f"{type(value).__name__}: its order is the order of the result"
        )
    if not items:
        raise ConfigError(f"{field} is empty: declare at least one label")
    first: dict[Any, int] = {}
    for i, label in enumerate(items):
        try:
            hash(label)
        except TypeError:
            raise ConfigError(
                f"{field}[{i}] is a {type(label).__name__}, which is not hashable: a label "
                "must be hashable (a string, a number, a tuple, ...)"
            ) from None
        if label != label:  # NaN: never equal to itself, so never found
            raise ConfigError(f"{field}[{i}] is NaN, which is not a label")
        if label in first:
            raise ConfigError(
                f"{field}[{first[label]}] and {field}[{i}] are the same label: labels "
                "must be distinct"
            )
        first[label] = i
    return items


def _mechanism_coordinates(mechanism: Mechanism) -> int | None:
    """How many numbers ``mechanism`` releases, when it says (``dimension``)."""
    dimension = getattr(mechanism, "dimension", None)
    if isinstance(dimension, int) and not isinstance(dimension, bool):
        return dimension
    return None


def _selects(mechanism: Mechanism) -> bool:
    """The library's mechanisms that release a choice, not one number per coordinate."""
    from dpaccount.mechanisms.blr import BLRMechanism
    from dpaccount.mechanisms.exponential import ExponentialMechanism
    from dpaccount.mechanisms.randomized_response import RandomizedResponseMechanism

    return isinstance(mechanism, ExponentialMechanism | RandomizedResponseMechanism
                      | BLRMechanism)


class PublicLabels:
    """Labels declared public before a query runs: a Series' index, a DataFrame's rows
    and columns.

    Built by `declare`, which checks the declaration before anything is charged. The
    query's answer is then read at the declared labels (`read`), by a rule that looks at
    the labels only: a declared label the answer lacks reads as 0, a label the answer
    has but that was not declared is dropped, and a label the answer repeats reads as
    its last value. Nothing about the answer's own labels reaches the result, so no
    refusal depends on them either. The noised numbers come back carrying exactly the
    declared labels (`attach`).

    Attributes:
        index: The declared labels of a Series' index or a DataFrame's rows, in order.
        columns: The declared columns of a DataFrame, or None for a Series.
    """

    __slots__ = ("columns", "index")

    def __init__(self, index: tuple[Any, ...], columns: tuple[Any, ...] | None) -> None:
        self.index = index
        self.columns = columns

    @classmethod
    def declare(cls, public_index: Any, public_columns: Any,
                mechanism: Mechanism | None = None) -> PublicLabels | None:
        """Check a declaration; None when nothing is declared.

        Args:
            public_index: A sequence of distinct hashable labels (a list, a tuple, a 1-D
                array or a pandas Index) or None.
            public_columns: The same for a DataFrame's columns, or None; it needs
                ``public_index`` (a DataFrame's rows are labels too).
            mechanism: The mechanism that will noise the values: a mechanism that
                selects (exponential, randomized response, BLR) releases no number per
                label and is refused; one with a ``dimension`` must have one coordinate
                per declared label (rows times columns).

        Raises:
            ConfigError: The declaration is not a sequence, is empty, holds an unhashable,
                NaN or repeated label, or does not match the mechanism.
            ImportError: pandas is not installed (labels come back on pandas objects).
        """
        if public_index is None:
            if public_columns is not None:
                raise ConfigError(
                    "public_columns= needs public_index= too: a DataFrame's row labels "
                    "come from the data unless they are declared"
                )
            return None
        index = _labels(public_index, "public_index")
        columns = None if public_columns is None else _labels(public_columns, "public_columns")
        labels = cls(index, columns)
        if mechanism is not None:
            if _selects(mechanism):
                raise ConfigError(
                    f"{type(mechanism).__name__} releases a selection, not one number per "
                    "label: declared labels need an additive mechanism (Laplace, Gaussian, "
                    "integer or elliptical noise)"
                )
            wanted = _mechanism_coordinates(mechanism)
            if wanted is not None and wanted != labels.size:
                raise ConfigError(
                    f"{labels.size} declared labels ({labels.shape_text}) but the "
                    f"mechanism releases {wanted} coordinates: declare one label per "
                    "coordinate, or build the mechanism with "
                    f"dimension={labels.size}"
                )
        _pandas()
        return labels

    @property
    def size(self) -> int:
        """How many numbers are released: rows, or rows times columns."""
        return len(self.index) * (1 if self.columns is None else len(self.columns))

    @property
    def shape_text(self) -> str:
        """The declared shape in words."""
        if self.columns is None:
            return f"{len(self.index)} index labels"
        return f"{len(self.index)} rows x {len(self.columns)} columns"

    @property
    def expected(self) -> str:
        """What a labelled answer must be, for error messages."""
        if self.columns is None:
            return (f"a pandas Series or a dict, read at the {len(self.index)} declared "
                    "index labels")
        return ("a pandas DataFrame or a dict of columns, read at the declared "
                f"{len(self.index)} rows and {len(self.columns)} columns")

    def read(self, answer: Any) -> list[Any]:
        """The answer's values at the declared labels, row-major (0 where it has none).

        Raises:
            UnreleasableResultError: The answer is not a labelled container of the
                declared kind (decided by its type alone); the error names its type only.
        """
        found, hint = self._read(answer)
        if found is None:
            raise unreleasable(answer, self.expected, hint)
        return found

    def _read(self, answer: Any) -> tuple[list[Any] | None, str]:
        # Never raises: a hostile __hash__, __eq__ or accessor may raise anything, with
        # the data in its message; the refusal is raised by the caller, outside this
        # frame, so no such exception becomes its context.
        if type(answer).__module__.startswith("polars"):
            return None, (
                "A polars Series or DataFrame has no row labels to read the declared ones "
                "at: convert it (e.g. frame.to_pandas().set_index(key)[column]), return a "
                "dict, or use dpaccount.aggregates.groupby, which reads polars itself."
            )
        try:
            if self.columns is None:
                column = _column(answer)
                if column is None:
                    return None, _kind_hint(answer, "Series")
                return [column.get(label, 0) for label in self.index], ""
            cells = _table(answer, self.columns)
            if cells is None:
                return None, _kind_hint(answer, "DataFrame")
            return [cell.get(r, 0) for r in self.index for cell in cells], ""
        except Exception:  # a hostile label or accessor: anything may come out, data inside
            return None, "Its labels could not be compared with the declared ones."

    def attach(self, released: Any) -> Any:
        """The released numbers as a pandas Series (or DataFrame) with the declared labels.

        Raises:
            UnreleasableResultError: The mechanism returned something that is not
                `plain_release`-able, or not one number per declared label.
        """
        values = np.asarray(plain_release(released))
        if values.size != self.size:
            raise unreleasable(
                released, f"{self.size} numbers, one per declared label ({self.shape_text})"
            )
        pd = _pandas()
        flat = values.reshape(-1)
        if self.columns is None:
            return pd.Series(flat, index=pd.Index(list(self.index)))
        return pd.DataFrame(
            flat.reshape(len(self.index), len(self.columns)),
            index=pd.Index(list(self.index)),
            columns=pd.Index(list(self.columns)),
        )

    def __repr__(self) -> str:
        return f"PublicLabels({self.shape_text})"


def _is_pandas(value: Any, name: str) -> bool:
    kind = type(value)
    return kind.__module__.startswith("pandas") and kind.__name__ == name


def _column(value: Any) -> Mapping[Any, Any] | None:
    """A 1-D labelled answer as a mapping from label to value (last value wins)."""
    if _is_pandas(value, "Series"):
        return dict(zip(value.index.tolist(), value.tolist(), strict=True))
    if isinstance(value, Mapping):
        return value
    return None


def _table(value: Any, columns: tuple[Any, ...]) -> list[Mapping[Any, Any]] | None:
    """The declared columns of a 2-D labelled answer, each as {row: value} (a column the
    answer lacks is empty; the last of repeated columns or rows wins). Undeclared
    columns are never looked at."""
    if _is_pandas(value, "DataFrame"):
        position = {name: j for j, name in enumerate(value.columns.tolist())}
        rows = value.index.tolist()
        return [
            dict(zip(rows, value.iloc[:, position[c]].tolist(), strict=True))
            if c in position else {}
            for c in columns
        ]
    if isinstance(value, Mapping):
        out: list[Mapping[Any, Any]] = []
        for c in columns:
            column = _column(value[c]) if c in value else {}
            if column is None:
                return None
            out.append(column)
        return out
    return None


def _kind_hint(answer: Any, wanted: str) -> str:
    if _is_pandas(answer, "DataFrame") and wanted == "Series":
        return "A DataFrame needs its columns declared too: public_columns=[...]."
    return (
        f"With declared labels the answer must carry labels (a pandas {wanted} or a dict); "
        "a list or an array is read by position, so leave public_index= out for it."
    )
