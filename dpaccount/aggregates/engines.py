"""Where a group-by's exact totals are computed: in memory, or inside Dask or Spark.

A group-by statistic needs, per group, a few exact integers: the row count, the exact
lattice sum, the number of distinct persons, bin counts, or rank counts at the grid
points of a quantile (`GroupTotals`). `partial_totals` computes them for one pandas
partition; partial totals add up exactly (Python integers), so the totals do not depend
on how the rows are partitioned or ordered. Each engine runs `partial_totals` where the
data lives and brings only the totals back to the driver, where the noise is drawn:

* in memory (pandas, polars): one partition;
* Dask: ``map_partitions``, after ``shuffle(on=privacy_unit)`` when a person's rows must
  meet in one partition to be bounded;
* Spark: ``mapInPandas``, after ``repartition(privacy_unit)`` likewise.

**Contribution bounding by keyed hashes.** To give the same totals on every engine and
partitioning, the random priorities that choose a person's groups and rows
(`dpaccount.aggregates.units`) are SipHash-2-4 values of the rows' own contents under a
112-bit key drawn from the OS CSPRNG for each statistic (`BoundingKey`; pandas'
``hash_pandas_object``). A person's priorities depend only on the key and that person's
rows, so the coupling argument of `dpaccount.aggregates.units` applies unchanged; rows
with identical contents get identical priorities, and whichever of them is kept, the
totals are the same.

**No overflow.** Lattice values are int64 within ±2**52 and are summed in chunks that
cannot pass 2**62 (`exact_sum`), then as Python integers; partial sums travel as
decimal text.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from dpaccount.aggregates._checks import float_array
from dpaccount.aggregates.lattice import FixedPoint, exact_sum
from dpaccount.aggregates.units import ContributionBounds, bound_contributions, codes_of
from dpaccount.errors import InvalidCostError
from dpaccount.mechanisms._sampling import RandomSource

__all__ = [
    "BoundingKey",
    "GroupTotals",
    "TotalsSpec",
    "engine_of",
    "partial_totals",
    "totals",
]

_KEY_ALPHABET = "".join(chr(c) for c in range(128))


@attrs.frozen(repr=False)
class BoundingKey:
    """The secret keys of one statistic's contribution bounding (never shown)."""

    groups: str
    rows: str

    @classmethod
    def draw(cls, rng: RandomSource | None = None) -> BoundingKey:
        """Two fresh 16-character ASCII keys (112 bits each), from the OS CSPRNG unless a
        test passes a seeded `RandomSource`."""
        def text() -> str:
            if rng is None or rng.is_cryptographic:
                return "".join(secrets.choice(_KEY_ALPHABET) for _ in range(16))
            return "".join(_KEY_ALPHABET[rng.randbelow(128)] for _ in range(16))

        return cls(text(), text())

    def __repr__(self) -> str:
        return "BoundingKey(<secret>)"


@attrs.frozen
class TotalsSpec:
    """What to total, per group: everything decided before the charge (picklable).

    Attributes:
        by: The key column (``None``: the whole table is the one declared group).
        keys: The declared keys (a row's group is its key's position), or ``None``: the
            observed keys.
        unit: The privacy-unit column, or ``None`` (one row, one person).
        bounds: The contribution bounds.
        key: The bounding key (with a privacy unit).
        column: The value column, if the statistic reads one.
        fp: The lattice of a sum or mean.
        centre: Subtracted from each lattice value (a mean's centre).
        edges: Histogram bin edges.
        grid: Quantile candidates (sorted).
    """

    by: str | None
    keys: tuple[Any, ...] | None
    unit: str | None
    bounds: ContributionBounds
    key: BoundingKey | None = None
    column: str | None = None
    fp: FixedPoint | None = None
    centre: int = 0
    edges: Any = None
    grid: Any = None

    @property
    def columns(self) -> list[str]:
        """The columns the statistic reads."""
        names: list[str] = []
        for name in (self.by, self.unit, self.column):
            if name is not None and name not in names:
                names.append(name)
        return names


@attrs.define
class GroupTotals:
    """The exact totals of one group (after contribution bounding)."""

    rows: int = 0
    units: int = 0
    total: int = 0
    bins: list[int] = attrs.Factory(list)

    def add(self, other: GroupTotals) -> None:
        """Add another partition's totals of the same group."""
        self.rows += other.rows
        self.units += other.units
        self.total += other.total
        if other.bins:
            self.bins = [a + b for a, b in zip(self.bins or [0] * len(other.bins),
                                               other.bins, strict=True)]


def _positions(column: Any, keys: tuple[Any, ...], name: str) -> npt.NDArray[np.int64]:
    """Each row's position among the declared keys (-1: not declared or missing)."""
    import pandas as pd

    try:  # the distinct values first (fast on large columns), then their positions
        codes, uniques = pd.factorize(column, use_na_sentinel=True)
        at = np.asarray(pd.Index(list(keys)).get_indexer(uniques), dtype=np.int64)
        found = np.where(codes >= 0, np.append(at, -1)[codes], -1).astype(np.int64)
    except Exception:  # a hostile column may raise anything, values inside
        found = None
    if found is None:  # raised outside the handler: no context holding a value
        raise InvalidCostError(name, type(column).__name__, "must be a column of hashable keys")
    return found


def _hashes(frame: Any, names: list[str], key: str) -> npt.NDArray[np.uint64]:
    import pandas as pd

    try:
        found = np.asarray(
            pd.util.hash_pandas_object(frame[names], index=False, hash_key=key),
            dtype=np.uint64,
        )
    except Exception:  # a hostile column may raise anything, values inside
        found = None
    if found is None:  # raised outside the handler: no context holding a value
        raise InvalidCostError(
            "columns", ", ".join(names), "must hold values that can be hashed"
        )
    return found


def partial_totals(frame: Any, spec: TotalsSpec) -> dict[Any, GroupTotals]:
    """The totals of one pandas partition, by group (declared key position or key value).

    When a privacy unit is set, every row of a person must be in this partition.
    """
    import pandas as pd

    frame = frame.reset_index(drop=True)
    if spec.by is None:  # the whole table
        group = np.zeros(len(frame), dtype=np.int64)
        labels: list[Any] = [0]
    elif spec.keys is not None:
        group = _positions(frame[spec.by], spec.keys, spec.by)
        labels = list(range(len(spec.keys)))
    else:
        group, labels = codes_of(frame[spec.by], spec.by)
    if spec.unit is None:
        kept = np.flatnonzero(group >= 0).astype(np.int64)
        units = kept
    else:
        units, _ = codes_of(frame[spec.unit], spec.unit)
        if spec.key is None:
            raise InvalidCostError("key", None, "bounding needs a BoundingKey")
        pairs = _hashes(frame, [n for n in (spec.unit, spec.by) if n], spec.key.groups)
        rows = _hashes(frame, spec.columns, spec.key.rows)
        kept = bound_contributions(units, group, spec.bounds, pair_priority=pairs,
                                   row_priority=rows)
        units = units[kept]
    g = group[kept]
    n_groups = len(labels)
    rows_per = np.bincount(g, minlength=n_groups)
    if spec.unit is None:
        units_per = rows_per
    else:
        distinct = pd.unique(units * max(n_groups, 1) + g)
        units_per = np.bincount(distinct % max(n_groups, 1), minlength=n_groups)
    out = {
        labels[i]: GroupTotals(int(rows_per[i]), int(units_per[i]))
        for i in np.flatnonzero(rows_per).tolist()
    }
    if spec.column is None:
        return out
    values = float_array(frame[spec.column])[kept]
    order = np.argsort(g, kind="stable")
    g_sorted, v_sorted = g[order], values[order]
    starts = np.searchsorted(g_sorted, np.arange(n_groups), side="left")
    ends = np.searchsorted(g_sorted, np.arange(n_groups), side="right")
    for i, totals_i in ((i, out[labels[i]]) for i in np.flatnonzero(rows_per).tolist()):
        mine = v_sorted[starts[i]:ends[i]]
        if spec.fp is not None:
            ints = spec.fp.to_ints(mine)
            bound = max(abs(spec.fp.a), abs(spec.fp.b))
            totals_i.total = exact_sum(ints, bound) - int(ints.size) * spec.centre
        if spec.edges is not None:
            totals_i.bins = _bin_counts(mine, spec.edges)
        if spec.grid is not None:
            # rank counts: how many values fall at or below each candidate, as a count of
            # values by the first candidate at or above them (NaN: above all)
            first = np.searchsorted(spec.grid, mine, side="left")
            totals_i.bins = np.bincount(first, minlength=spec.grid.size + 1).tolist()
    return out


def _bin_counts(values: npt.NDArray[np.float64], edges: Any) -> list[int]:
    """np.histogram's counts over ``edges`` (non-finite values dropped), summable."""
    finite = values[np.isfinite(values)]
    return [int(c) for c in np.histogram(finite, bins=edges)[0].tolist()]


def _combine(parts: list[dict[Any, GroupTotals]]) -> dict[Any, GroupTotals]:
    out: dict[Any, GroupTotals] = {}
    for part in parts:
        for label, t in part.items():
            if label in out:
                out[label].add(t)
            else:
                out[label] = GroupTotals(t.rows, t.units, t.total, list(t.bins))
    return out


# -- transport: partial totals as text rows (Spark's mapInPandas needs a schema) --------


def _encode(part: dict[Any, GroupTotals]) -> str:
    rows = [[_plain(k), t.rows, t.units, str(t.total), t.bins] for k, t in part.items()]
    return json.dumps(rows)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(text: str) -> dict[Any, GroupTotals]:
    return {
        k: GroupTotals(rows, units, int(total), list(bins))
        for k, rows, units, total, bins in json.loads(text)
    }


def _encoded_partials(frames: Any, spec: TotalsSpec) -> Any:
    """For ``mapInPandas`` / ``map_partitions``: one text row per partition.

    Spark hands a partition to ``mapInPandas`` as many Arrow batches. They are joined
    first: a person's rows may be spread over the batches of their partition, and they
    must be bounded together (bounding each batch alone would let a person keep R rows
    in every batch).
    """
    import pandas as pd

    parts = list(frames)
    if parts:  # an empty partition sends nothing
        whole = pd.concat(parts, ignore_index=True)
        yield pd.DataFrame({"payload": [_encode(partial_totals(whole, spec))]})


# -- the engines ---------------------------------------------------------------------------


def engine_of(data: Any) -> str:
    """``"pandas"``, ``"polars"``, ``"dask"`` or ``"spark"``, by the frame's type alone."""
    module = type(data).__module__
    for name in ("dask", "pyspark", "polars", "pandas"):
        if module.startswith(name):
            return "spark" if name == "pyspark" else name
    return "unknown"


def totals(data: Any, spec: TotalsSpec) -> dict[Any, GroupTotals]:
    """The exact totals per group of ``data`` (a pandas, polars, Dask or Spark frame)."""
    engine = engine_of(data)
    if engine == "dask":
        return _dask_totals(data, spec)
    if engine == "spark":
        return _spark_totals(data, spec)
    if engine == "polars":
        import pandas as pd

        data = pd.DataFrame({c: data.get_column(c).to_numpy() for c in spec.columns})
    return partial_totals(data[spec.columns], spec)


def _dask_totals(data: Any, spec: TotalsSpec) -> dict[Any, GroupTotals]:
    import pandas as pd

    frame = data[spec.columns]
    if spec.unit is not None:  # a person's rows meet in one partition
        frame = frame.shuffle(on=spec.unit)
    meta = pd.DataFrame({"payload": pd.Series([], dtype=object)})
    payloads = frame.map_partitions(
        lambda part: next(_encoded_partials([part], spec)), meta=meta
    ).compute()
    return _combine([_decode(text) for text in payloads["payload"].tolist()])


def _spark_totals(data: Any, spec: TotalsSpec) -> dict[Any, GroupTotals]:
    frame = data.select(*spec.columns)
    if spec.unit is not None:  # a person's rows meet in one partition
        frame = frame.repartition(spec.unit)
    rows = frame.mapInPandas(
        lambda frames: _encoded_partials(frames, spec), "payload string"
    ).collect()
    return _combine([_decode(row["payload"]) for row in rows])
