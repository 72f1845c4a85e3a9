"""Where a one-column aggregate reads its column: in memory, or inside Dask or Spark.

`count`, `sum` and `mean` take what a pandas column takes, with the same signature: a
numpy array, a pandas or polars Series, a list; and a **Dask Series** (or one-column
Dask DataFrame) or a **one-column Spark DataFrame** (``frame.select("x")``). On Dask and
Spark the exact totals are computed where the data lives, by the group-by's machinery
(`dpaccount.aggregates.engines`, the whole table as the one declared group), and only
the row count and the exact lattice sum come back to be noised: the same numbers as in
memory, whatever the partitioning, so the same mechanism, the same charge and (without a
privacy unit) the same answer for the same seed. A Spark ``Column`` is refused: it is an
expression that names no data (select it into a one-column DataFrame).

With a privacy unit, on Dask ``privacy_unit`` is a Dask Series of the same frame (aligned
by index); a person's rows are bounded by keyed hashes, as in a group-by. A Spark
DataFrame's rows cannot be matched with another frame's, so there ``privacy_unit`` is
refused and ``aggregates.groupby(frame, None, privacy_unit="user")`` does it.

Everything here before the charge reads the schema and the containers' types only.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from dpaccount.aggregates._checks import check_column, check_container, float_array
from dpaccount.aggregates._frames import check_keys_column, check_numeric
from dpaccount.aggregates.engines import (
    BoundingKey,
    GroupTotals,
    TotalsSpec,
    engine_of,
    totals,
)
from dpaccount.aggregates.lattice import FixedPoint, lattice_sum
from dpaccount.aggregates.units import ContributionBounds, bound_contributions, codes_of
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms._sampling import resolve_rng

__all__ = ["EngineColumn", "check_data", "kept_rows", "rows_per_unit", "subset", "true_totals"]

#: The value column's name inside a Dask frame built from a Series.
_VALUE = "value"
#: The privacy unit's column name inside that frame.
_UNIT = "unit"


@attrs.frozen
class EngineColumn:
    """A Dask or Spark column, as a frame the engines can total (decided before the
    charge).

    Attributes:
        frame: A Dask or Spark DataFrame.
        column: The value column's name (``None``: a count of rows of any frame).
        unit: The privacy unit's column, or ``None``.
    """

    frame: Any
    column: str | None
    unit: str | None


def _engine_column(data: Any, privacy_unit: Any) -> EngineColumn | None:
    """``data`` as an `EngineColumn` if it is a Dask or Spark container, else ``None``."""
    engine = engine_of(data)
    kind = type(data).__name__
    if engine == "spark":
        from pyspark.sql import DataFrame  # the data is a pyspark object: pyspark is here

        if not isinstance(data, DataFrame):  # a Column (its attributes are fields)
            raise InvalidCostError(
                "data", kind, "is a Spark expression, not data: pass the one-column "
                "DataFrame frame.select(...) instead",
            )
        if privacy_unit is not None:
            raise InvalidCostError(
                "privacy_unit", type(privacy_unit).__name__,
                "cannot be matched row by row with a Spark DataFrame: use "
                "aggregates.groupby(frame, None, privacy_unit='...', max_rows_per_unit=R)",
            )
        columns = list(data.columns)
        return EngineColumn(data, columns[0] if len(columns) == 1 else None, None)
    if engine != "dask":
        return None
    frame = data.to_frame(name=_VALUE) if hasattr(data, "to_frame") else data
    columns = list(frame.columns)
    column = None
    if len(columns) == 1:
        column = _VALUE
        frame = frame.rename(columns={columns[0]: _VALUE})
    if privacy_unit is None:
        return EngineColumn(frame, column, None)
    if engine_of(privacy_unit) != "dask" or not hasattr(privacy_unit, "to_frame"):
        raise InvalidCostError(
            "privacy_unit", type(privacy_unit).__name__,
            "must be a Dask Series of the same frame as the data",
        )
    try:
        joined = frame.assign(**{_UNIT: privacy_unit})
    except Exception:  # alignment errors name no value, but keep the type only
        joined = None
    if joined is None:
        raise InvalidCostError(
            "privacy_unit", type(privacy_unit).__name__,
            "must be a Dask Series of the same frame as the data (the same index)",
        )
    check_keys_column(joined, _UNIT, "the privacy_unit column")
    return EngineColumn(joined, column, _UNIT)


def rows_per_unit(
    data: Any, privacy_unit: Any, max_rows_per_unit: Any
) -> tuple[int, EngineColumn | None]:
    """R, checked before the charge (1 without a privacy unit: one row, one person), and
    the Dask or Spark column to total, if ``data`` is one."""
    r = ContributionBounds(1, max_rows_per_unit).max_rows_per_unit
    engine = _engine_column(data, privacy_unit)
    if privacy_unit is None:
        if r != 1:
            raise ConfigError(
                "max_rows_per_unit bounds what one person contributes: pass the column that "
                "identifies a person with privacy_unit=..."
            )
        return 1, engine
    if engine is not None:
        return r, engine
    check_container(privacy_unit)
    check_container(data)
    check_column(privacy_unit, "privacy_unit", keys=True)
    if len(privacy_unit) != len(data):
        raise InvalidCostError(
            "privacy_unit", type(privacy_unit).__name__,
            "must hold one entry per row of data (the same length)",
        )
    return r, None


def check_data(data: Any, engine: EngineColumn | None, *, numeric: bool) -> None:
    """Before the charge: the container (and, for ``numeric``, its dtype) can be read;
    a Dask or Spark frame must then be one numeric column."""
    if engine is None:
        check_container(data)
        if numeric:
            check_column(data, numeric=True)
        return
    if not numeric:
        return
    if engine.column is None:
        raise InvalidCostError(
            "data", f"{type(data).__name__} of {len(engine.frame.columns)} columns",
            "must be one column: select it first (frame.select('x') or frame['x'])",
        )
    check_numeric(engine.frame, engine.column)


def kept_rows(data: Any, privacy_unit: Any, r: int, rng: Any) -> npt.NDArray[np.int64] | None:
    """After the charge: the rows kept so that each person has at most R (None: all)."""
    if privacy_unit is None:
        return None
    units, _ = codes_of(privacy_unit, "privacy_unit")
    groups = np.zeros(units.size, dtype=np.int64)
    return bound_contributions(units, groups, ContributionBounds(1, r), resolve_rng(rng))


def subset(data: Any, kept: npt.NDArray[np.int64] | None) -> Any:
    """The numeric data restricted to the kept rows (the data itself when all are kept)."""
    return data if kept is None else float_array(data)[kept]


def true_totals(
    data: Any, engine: EngineColumn | None, privacy_unit: Any, r: int, rng: Any,
    fp: FixedPoint | None = None, centre: int = 0,
) -> tuple[int, int]:
    """After the charge: the number of rows kept and their exact lattice sum (0 without
    ``fp``), in memory or where the data lives."""
    if engine is None:
        kept = kept_rows(data, privacy_unit, r, rng)
        n = len(data) if kept is None else int(kept.size)
        return n, (0 if fp is None else lattice_sum(subset(data, kept), fp, centre))
    if engine.unit is None and fp is None:  # a count of rows
        frame = engine.frame
        return (int(frame.count()) if engine_of(frame) == "spark" else len(frame)), 0
    key = None if engine.unit is None else BoundingKey.draw(resolve_rng(rng))
    spec = TotalsSpec(
        None, ("all",), engine.unit, ContributionBounds(1, r), key,
        column=None if fp is None else engine.column, fp=fp, centre=centre,
    )
    found = totals(engine.frame, spec).get(0, GroupTotals())
    return found.rows, found.total
