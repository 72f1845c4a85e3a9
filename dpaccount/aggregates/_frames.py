"""What a group-by reads of a frame before its charge: the schema, never a value.

`groupby` checks that its argument is a DataFrame of a supported engine, that each
column it names exists exactly once and has a dtype that can hold keys, and that a
statistic's column is numeric. Only the schema is read (column names, dtypes, the
number of columns) and a message names the caller's column and the frame's type,
never another column's name (after a pivot they are data) nor a value: a refusal
before the charge that depended on the data would release something un-noised.
"""

from __future__ import annotations

from typing import Any

from dpaccount.aggregates._checks import unkeyable_dtype
from dpaccount.aggregates.engines import engine_of
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = [
    "check_declared_keys",
    "check_frame",
    "check_frame_column",
    "check_key_type",
    "check_keys_column",
    "check_numeric",
    "pandas_module",
]


def pandas_module() -> Any:
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - pandas is in the test extra
        raise ImportError('groupby needs pandas: pip install "dpaccount[pandas]"') from exc
    return pd


def check_frame(data: Any) -> None:
    kind = type(data).__name__
    engine = engine_of(data)
    if engine in ("dask", "spark"):
        return
    if hasattr(data, "collect") and not hasattr(data, "to_numpy"):
        raise InvalidCostError(
            "data", kind,
            "is a lazy frame (a plan of work, not data): call .collect() first",
        )
    if not hasattr(data, "columns") or not hasattr(data, "__len__"):
        raise InvalidCostError(
            "data", kind, "must be a pandas, polars, Dask or Spark DataFrame"
        )
    if getattr(data.columns, "nlevels", 1) != 1:
        raise ConfigError(
            f"the {kind}'s columns have {data.columns.nlevels} levels (a MultiIndex); "
            "groupby reads columns named by one string: flatten them first (for example "
            "frame.columns = ['_'.join(map(str, c)) for c in frame.columns])"
        )


def _shown(name: str) -> str:
    """A column name the caller gave, for a message (shortened; escaped)."""
    text = ascii(name)
    return text if len(text) <= 80 else f"{text[:60]}...' ({len(name)} characters)"


def check_frame_column(data: Any, name: Any, what: str) -> None:
    """The column ``name`` is named by a string and occurs exactly once.

    Only the schema is read; the message names the caller's ``name`` and the number of
    columns, never the frame's other column names (after a pivot they are data).
    """
    kind = type(data).__name__
    if not isinstance(name, str):
        raise ConfigError(
            f"{what} must name a column by a str, not {type(name).__name__}: groupby "
            "reads columns named by strings (rename the frame's columns to strings first)"
        )
    columns = list(data.columns)
    found = columns.count(name)
    if found == 0:
        raise ConfigError(
            f"{what} {_shown(name)} is not a column of the {kind} (it has {len(columns)} "
            "columns)"
        )
    if found > 1:
        raise ConfigError(
            f"{what} {_shown(name)} names {found} columns of the {kind}: a column read by "
            "groupby must have a unique name (rename the duplicates first)"
        )


def check_keys_column(data: Any, name: str, what: str) -> None:
    """A key or privacy-unit column's dtype can hold keys (by the schema alone; a pandas
    ``object`` column is read value by value, after the charge)."""
    text = _dtype_text(data, name)[1]
    dtype = data.schema[name] if engine_of(data) == "polars" else text
    if unkeyable_dtype(dtype):
        raise ConfigError(
            f"{what} {_shown(name)} has dtype {text}, whose values are not keys (lists, "
            "arrays, structs or objects are not hashable): group by a column of strings, "
            "numbers or booleans"
        )


#: Spark SQL types whose values read as real numbers.
_SPARK_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean")


def _dtype_text(data: Any, name: str) -> tuple[bool, str]:
    """Whether the column is numeric, and its dtype's name (the schema, never a value)."""
    engine = engine_of(data)
    if engine == "spark":
        text = dict(data.dtypes)[name]
        return text in _SPARK_NUMERIC or text.startswith("decimal"), text
    if engine == "polars":
        dtype = data.schema[name]
        return bool(dtype.is_numeric()) or str(dtype) == "Boolean", str(dtype)
    dtype = data[name].dtype
    api = pandas_module().api.types
    return bool(api.is_numeric_dtype(dtype)) and not api.is_complex_dtype(dtype), str(dtype)


#: Key types whose values travel back from the engine as JSON, for undeclared keys.
_SPARK_KEYS = ("string", "tinyint", "smallint", "int", "bigint", "boolean")


def check_key_type(data: Any, by: str) -> None:
    """Undeclared keys come back from Dask or Spark as text: strings, integers, booleans."""
    if engine_of(data) == "spark":
        text = dict(data.dtypes)[by]
        ok = text in _SPARK_KEYS
    else:
        dtype = data[by].dtype
        api = pandas_module().api.types
        text = str(dtype)
        ok = (api.is_string_dtype(dtype) or api.is_integer_dtype(dtype)
              or api.is_bool_dtype(dtype) or text == "object")
    if not ok:
        raise ConfigError(
            f"the key column {by!r} has type {text}: on Dask and Spark, undeclared keys must "
            "be strings, integers or booleans; declare the keys (keys=[...]) or cast the "
            "column"
        )


def check_numeric(data: Any, name: str) -> None:
    numeric, text = _dtype_text(data, name)
    if not numeric:
        raise InvalidCostError(name, text, "must be a numeric column (its dtype is not)")



def check_declared_keys(keys: Any) -> None:
    """Declared keys: a non-empty list of distinct hashable values (they are public, so a
    message may name their number and type)."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise InvalidCostError("keys", type(keys).__name__, "must be a list of keys")
    declared = list(keys)
    if not declared:
        raise InvalidCostError("keys", "[]", "declare at least one key")
    for key in declared:
        try:
            hash(key)
        except TypeError:  # (a list or a dict: a declared key, not data)
            raise InvalidCostError(
                "keys", type(key).__name__, "every declared key must be hashable"
            ) from None
    if not pandas_module().Index(declared).is_unique:
        raise InvalidCostError("keys", f"{len(declared)} keys", "must be distinct")
