"""What the aggregates return: a noisy value (or a frame of them, one row per group) with
its record and an accuracy statement."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from dpaccount.charges import Relation
from dpaccount.costs import PrivacyCost

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd

    from dpaccount.accountant import ChargePreview
    from dpaccount.aggregates.partitions import SelectionPreview
    from dpaccount.aggregates.units import ContributionBounds
    from dpaccount.records import LedgerRecord

__all__ = ["OUTPUTS", "AggregatePreview", "AggregateResult", "GroupedResult"]

#: The engines a group-by's result can be handed back in (`GroupedResult.table`).
OUTPUTS = ("pandas", "polars", "spark", "dask")


@attrs.frozen
class AggregateResult:
    """A noisy aggregate with its ledger record and an accuracy statement.

    Attributes:
        value: The noisy answer (a float; a float array for a histogram; the selected
            candidate for a quantile).
        interval: ``(low, high)`` that contains the implemented true answer (clipped,
            rounded to the lattice) with probability at least ``level``; per bin for a
            histogram; ``None`` for a quantile (see ``error_bound``).
        level: The confidence level of ``interval`` / ``error_bound``.
        error_bound: The half-width of the noise at ``level`` in the answer's units
            (per bin for a histogram; in ranks for a quantile).
        accuracy: The accuracy statement in words.
        record: The ledger record of the charge.
        sensitivity: The sensitivity used, in the answer's units (for a mean: of the
            centred sum).
        relation: The neighbouring relation the sensitivity holds for.
        granularity: The lattice spacing g the values were rounded to (or ``None``).
    """

    value: Any
    interval: tuple[Any, Any] | None
    level: float
    error_bound: Any
    accuracy: str
    record: LedgerRecord
    sensitivity: Fraction
    relation: Relation
    granularity: Fraction | None = None

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) charged for this aggregate."""
        return self.record.cost

    def clamped(self, lower: float = 0.0, upper: float | None = None) -> AggregateResult:
        """The same result with its value and interval clipped to ``[lower, upper]``.

        Post-processing of a released value: free (no new charge, the same record) and
        still covered by the charge's guarantee. A noisy count below 0 becomes 0; the
        interval still contains the true answer whenever the true answer is in the
        range (a count is never negative).

        Examples:
            >>> from dpaccount import Accountant
            >>> from dpaccount.aggregates import count
            >>> res = count([], Accountant(1), 1).clamped()
            >>> res.value >= 0 and res.interval[0] >= 0
            True
        """
        def clip(x: Any) -> Any:
            arr = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
            return float(arr) if arr.ndim == 0 else arr

        interval = None if self.interval is None else (
            clip(self.interval[0]), clip(self.interval[1])
        )
        return attrs.evolve(self, value=clip(self.value), interval=interval)

    def rounded(self) -> AggregateResult:
        """The same result with its value rounded to whole numbers (free post-processing,
        e.g. for counts); the interval is widened outward to whole numbers."""
        def nearest(x: Any) -> Any:
            arr = np.rint(np.asarray(x, dtype=np.float64))
            return float(arr) if arr.ndim == 0 else arr

        def outward(x: Any, up: bool) -> Any:
            arr = np.ceil(x) if up else np.floor(x)
            arr = np.asarray(arr, dtype=np.float64)
            return float(arr) if arr.ndim == 0 else arr

        interval = None if self.interval is None else (
            outward(self.interval[0], False), outward(self.interval[1], True)
        )
        return attrs.evolve(self, value=nearest(self.value), interval=interval)


@attrs.frozen
class AggregatePreview:
    """What an aggregate would charge and how accurate it would be (`preview`).

    Nothing was charged and no data was read.

    Attributes:
        charge: What the ledger would do (`ChargePreview`: the cost, whether it would
            be admitted, the totals before and after).
        level: The confidence level of ``error_bound``.
        error_bound: The half-width of the noise at ``level``, in the answer's units:
            the same number the aggregate reports when it runs (for a histogram, per
            bin; per group for a group-by; ``None`` for a group-by mean, whose interval
            depends on its noisy count).
        keys: For a group-by whose keys are not declared, what its key selection would
            release (`SelectionPreview`: people per key for release at 1/2 and 0.95,
            and the expected number of released keys given declared ``key_counts``);
            ``None`` when the keys are declared.
    """

    charge: ChargePreview
    level: float
    error_bound: float | None
    keys: SelectionPreview | None = None

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) the aggregate would charge."""
        return self.charge.cost

    @property
    def admitted(self) -> bool:
        """Whether the ledger would take the charge now."""
        return self.charge.admitted


@attrs.frozen(repr=False, eq=False)
class GroupedResult:
    """Noisy per-group statistics, their intervals and the one ledger record.

    Attributes:
        frame: A pandas DataFrame indexed by the group key (named as the ``by``
            column; for a histogram, by key and bin) with columns ``value``, ``low`` and
            ``high`` (a quantile has ``value`` only: its accuracy is in ranks).
        level: The confidence level of each row's interval (per group, not
            simultaneously).
        error_bound: The noise's half-width at ``level`` in the answer's units, per
            group (for a mean, the largest half-width of the groups' intervals; for a
            quantile, in ranks).
        accuracy: The accuracy statement in words.
        record: The ledger record: one charge for all groups.
        sensitivity: One group's sensitivity to one privacy unit, in the answer's units.
        relation: The neighbouring relation of the ledger.
        bounds: The contribution bounds applied (G groups, R rows per group and unit).
        keys_selected: True when the keys were chosen privately (not declared).
        counts: For a mean, the noisy count of each group that the mean divides by (a
            frame with ``value``, ``low`` and ``high``, as `GroupBy.count` returns),
            released with the mean's ``count_share``; None for the other statistics.
        output: The engine `table` hands the frame back in (``groupby(output=...)``).
        session: The Spark session of the group-by's data, for ``output="spark"``.
    """

    frame: pd.DataFrame
    level: float
    error_bound: float
    accuracy: str
    record: LedgerRecord
    sensitivity: Fraction
    relation: Relation
    bounds: ContributionBounds
    keys_selected: bool
    counts: pd.DataFrame | None = None
    output: str = "pandas"
    session: Any = None

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) charged for all groups together."""
        return self.record.cost

    @property
    def table(self) -> Any:
        """The frame in the engine chosen by ``groupby(..., output=...)``: ``frame``
        itself for pandas, else `to_polars`, `to_spark` or `to_dask` (the key becomes a
        column). It holds only the noisy values and the declared or selected keys."""
        if self.output == "polars":
            return self.to_polars()
        if self.output == "spark":
            return self.to_spark()
        if self.output == "dask":
            return self.to_dask()
        return self.frame

    def to_spark(self, session: Any = None) -> Any:
        """The frame as a Spark DataFrame (the key becomes a column), made by ``session``
        (default: the group-by's data's session, else the active one).

        The values were computed on the driver (each group's few exact totals travel
        there to be noised), so this distributes the noisy table for the next step of a
        Spark job; it reads nothing of the data.
        """
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise ImportError('to_spark needs pyspark: pip install "dpaccount[spark]"') from exc
        spark = session or self.session or SparkSession.getActiveSession()
        if spark is None:
            from dpaccount.errors import ConfigError

            raise ConfigError("no active Spark session: pass one, to_spark(session)")
        return spark.createDataFrame(self._flat())

    def to_dask(self, npartitions: int = 1) -> Any:
        """The frame as a Dask DataFrame (the key becomes a column)."""
        try:
            import dask.dataframe as dd
        except ImportError as exc:
            raise ImportError('to_dask needs dask: pip install "dask[dataframe]"') from exc
        from_pandas: Any = dd.from_pandas
        return from_pandas(self._flat(), npartitions=npartitions)

    def _flat(self) -> pd.DataFrame:
        """The frame with its key (and bin) as columns (``"index"`` for the whole
        table's key, as pandas names it)."""
        flat = self.frame.reset_index()
        flat.columns = [str(c) for c in flat.columns]
        return flat

    def clamped(self, lower: float = 0.0, upper: float | None = None) -> GroupedResult:
        """The same result with values and intervals clipped to ``[lower, upper]``.

        Free post-processing (no new charge, the same record), e.g. counts at 0.
        """
        frame = self.frame.copy()
        for column in ("value", "low", "high"):
            if column in frame:
                frame[column] = frame[column].clip(lower, upper)
        return attrs.evolve(self, frame=frame)

    def to_polars(self) -> Any:
        """The frame as a polars DataFrame (the key becomes a column)."""
        try:
            import polars as pl
        except ImportError as exc:
            raise ImportError('to_polars needs polars: pip install "dpaccount[polars]"') from exc
        flat = self._flat()
        return pl.DataFrame({str(c): flat[c].tolist() for c in flat.columns})

    def __repr__(self) -> str:  # noisy values only; the frame's size, not its rows
        return (
            f"GroupedResult({len(self.frame)} rows, cost={self.cost}, level={self.level})"
        )
