"""Per-group statistics charged once for all groups (parallel composition).

``groupby(frame, "region", keys=[...])`` declares a grouping of a pandas (or polars)
DataFrame; its `GroupBy.count`, `GroupBy.sum`, `GroupBy.mean`, `GroupBy.histogram` and
`GroupBy.quantile` each charge **one** ledger record for all groups and return a labelled
frame with an interval per group (`GroupedResult`).

**Why one group's cost pays for all.** Each group's statistic reads only the rows of its
group, and a privacy unit's rows fall in at most G = ``max_groups_per_unit`` groups, so
the record is one ``Parallel`` charge of one group's part (repeated G times for G > 1),
calibrated so that its cost is the epsilon (and at most the delta) asked for: the
theorems and the calibration are in `dpaccount.aggregates.plans`, which decides what a
statistic charges before any data is read.

**Keys.** Declared keys (``keys=[...]``) are public: every declared key is reported,
empty or not, and rows whose key is not declared (or missing) are dropped, each by a rule
that looks at that row alone. Without declared keys, the observed keys are private and
are selected by ``key_selection`` (`OptimalSelection` by default; its per-key delta
joins each part; a share
``selection_share`` of epsilon, and of delta, goes to it). Then the record holds two
parts standing for the undeclared key domain: how many keys the data has is not
recorded, since that number is not noised.

**Privacy units.** ``privacy_unit="user_id"`` names the column that identifies a person;
each person's rows are reduced to ``max_groups_per_unit`` groups and
``max_rows_per_unit`` rows per group (`dpaccount.aggregates.units`) before any statistic
is computed, and every sensitivity is computed from these bounds. Without it, one row is
one person.

Examples:
    >>> import pandas as pd
    >>> from dpaccount import Accountant
    >>> from dpaccount.mechanisms._sampling import RandomSource
    >>> df = pd.DataFrame({"region": ["N", "S", "N", "E"] * 50, "income": [10.0] * 200})
    >>> acct = Accountant(1)
    >>> g = groupby(df, "region", keys=["N", "S", "E", "W"], rng=RandomSource.seeded(1))
    >>> res = g.count(acct, "0.5")
    >>> res.cost, list(res.frame.index), list(res.frame.columns)
    (PrivacyCost(epsilon=0.5, delta=0), ['N', 'S', 'E', 'W'], ['value', 'low', 'high'])
    >>> type(res.record.charge).__name__, len(res.record.charge.partitions)
    ('Parallel', 4)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from dpaccount._numeric import to_fraction
from dpaccount.aggregates._checks import (
    bin_labels,
    charge_or_preview,
    check_bounds,
    check_edges,
    noise_for,
    run_as_preview,
)
from dpaccount.aggregates._frames import (
    check_declared_keys,
    check_frame,
    check_frame_column,
    check_key_type,
    check_keys_column,
    check_numeric,
    pandas_module,
)
from dpaccount.aggregates.engines import (
    BoundingKey,
    GroupTotals,
    TotalsSpec,
    engine_of,
    totals,
)
from dpaccount.aggregates.lattice import (
    FixedPoint,
    mean_estimate,
    sum_sensitivity,
)
from dpaccount.aggregates.partitions import SELECTION_METHODS, KeySelection
from dpaccount.aggregates.plans import Plan, plan_statistic, record_charge
from dpaccount.aggregates.results import OUTPUTS, AggregatePreview, GroupedResult
from dpaccount.aggregates.units import ContributionBounds
from dpaccount.charges import Relation
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms._sampling import RandomSource, resolve_rng
from dpaccount.mechanisms.exponential import ExponentialMechanism

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd

    from dpaccount.accountant import Accountant

__all__ = ["WHOLE_TABLE", "GroupBy", "GroupedResult", "groupby"]

#: The key of the one group of ``groupby(data, None)``: the whole table.
WHOLE_TABLE = "all"


class GroupBy:
    """A declared grouping of a DataFrame; each statistic charges one record.

    Build it with `groupby`. It reads no data until a statistic has been charged.
    """

    def __init__(
        self,
        data: Any,
        by: str | None,
        keys: Sequence[Any] | None,
        privacy_unit: str | None,
        bounds: ContributionBounds,
        rng: RandomSource,
        key_selection: str = "optimal",
        output: str = "pandas",
    ) -> None:
        self._data = data
        self._by = by
        self._keys = None if keys is None else list(keys)
        self._unit = privacy_unit
        self._bounds = bounds
        self._rng = rng
        self._selection = key_selection
        self._output = output

    def __repr__(self) -> str:
        keys = "private" if self._keys is None else f"{len(self._keys)} declared"
        return (
            f"GroupBy({type(self._data).__name__}, by={self._by!r}, keys={keys}, "
            f"privacy_unit={self._unit!r}, {self._bounds})"
        )

    @property
    def bounds(self) -> ContributionBounds:
        """The contribution bounds every statistic of this grouping relies on."""
        return self._bounds

    def preview(
        self, statistic: str, accountant: Accountant, *args: Any, key_counts: Any = None,
        **options: Any,
    ) -> AggregatePreview:
        """What ``getattr(self, statistic)(..., accountant, ...)`` would do, without doing it.

        Runs every check the statistic makes, then returns its cost, whether the ledger
        would admit it and the totals before and after (`Accountant.preview`), and the
        noise's half-width per group at ``level`` in the answer's units (in ranks for a
        quantile; ``None`` for a mean, whose interval depends on its noisy count). Nothing
        is charged and no data is read. The arguments are the statistic's, with the
        accountant in its place. Without declared keys, ``keys`` states the key
        selection's threshold (people per key for release at 1/2 and 0.95) and, given
        ``key_counts`` (declared or public counts of people per key, a sequence or a
        mapping), the expected number of released keys (`SelectionPreview`).

        Examples:
            >>> import pandas as pd
            >>> from dpaccount import Accountant
            >>> g = groupby(pd.DataFrame({"k": ["a"], "x": [1.0]}), "k", keys=["a", "b"])
            >>> acct = Accountant(1)
            >>> p = g.preview("sum", acct, "x", "0.5", lower=0, upper=1, granularity=1)
            >>> p.cost, p.admitted, p.error_bound, len(acct.records)
            (PrivacyCost(epsilon=0.5, delta=0), True, 6.0, 0)
        """
        if statistic not in ("count", "sum", "mean", "histogram", "quantile"):
            raise ConfigError(
                f"unknown statistic {statistic!r}; use count, sum, mean, histogram or quantile"
            )
        if key_counts is not None and self._keys is not None:
            raise ConfigError("the keys are declared, so all are released: key_counts is "
                              "for a group-by whose keys are selected privately")
        level = options.get("level", 0.95)
        method = getattr(self, statistic)
        if statistic == "count":
            return run_as_preview(lambda proxy: method(proxy, *args, **options), accountant,
                                  level, key_counts)
        column, *rest = args
        return run_as_preview(lambda proxy: method(column, proxy, *rest, **options),
                              accountant, level, key_counts)

    def _plan(self, accountant: Any, epsilon: Any, delta: Any, mechanism: str | None,
              level: Any, selection_share: Any) -> Plan:
        return plan_statistic(self._bounds, self._keys, accountant, epsilon, delta,
                              mechanism, level, selection_share, self._selection)

    def _done(self, result: GroupedResult) -> GroupedResult:
        """The result, with the output engine `GroupedResult.table` converts to."""
        spark = engine_of(self._data) == "spark"
        session = self._data.sparkSession if spark else None
        return attrs.evolve(result, output=self._output, session=session)

    # -- reading the data (only after the charge) --------------------------------------

    def _spec(self, **what: Any) -> TotalsSpec:
        """What to total; a fresh bounding key for each statistic (nothing is reused)."""
        key = None if self._unit is None else BoundingKey.draw(self._rng)
        keys = None if self._keys is None else tuple(self._keys)
        return TotalsSpec(self._by, keys, self._unit, self._bounds, key, **what)

    def _gather(
        self, spec: TotalsSpec, selection: KeySelection | None
    ) -> tuple[list[Any], list[GroupTotals]]:
        """The keys to report and their exact totals, computed where the data lives."""
        found = totals(self._data, spec)
        if self._keys is not None:  # every declared key, empty or not
            return list(self._keys), [found.get(i, GroupTotals()) for i in range(len(self._keys))]
        labels = list(found)
        if selection is None:  # pragma: no cover - private keys always have one
            raise ConfigError("undeclared keys need a selection")
        keep = selection.select([found[k].units for k in labels], self._rng)
        chosen = [k for k, kept in zip(labels, keep, strict=True) if kept]
        try:  # sorted by key: the data's row order must not show in the output
            chosen.sort()
        except TypeError:
            chosen.sort(key=lambda k: (type(k).__name__, repr(k)))
        return chosen, [found[k] for k in chosen]

    def _frame(self, keys: list[Any], columns: dict[str, Any]) -> pd.DataFrame:
        pd = pandas_module()
        return pd.DataFrame(columns, index=pd.Index(keys, name=self._by))

    # -- the statistics -----------------------------------------------------------------

    def count(
        self,
        accountant: Accountant,
        epsilon: Any,
        *,
        delta: Any = 0,
        mechanism: str | None = None,
        level: Any = 0.95,
        selection_share: Any = "1/4",
        label: str | None = None,
        query_id: str | None = None,
    ) -> GroupedResult:
        """Noisy row counts per group.

        One unit changes a group's count by at most R = ``max_rows_per_unit`` (under
        both relations).

        Args:
            accountant: The ledger to charge (once, before the data is read).
            epsilon: > 0, for all groups together.
            delta: 0 for the discrete Laplace; > 0 for the discrete Gaussian, or for
                selecting undeclared keys.
            mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``, and
                Laplace when ``delta`` only pays for the key selection).
            level: Confidence level of each group's interval.
            selection_share: The share of epsilon (and of delta, for Gaussian noise) that
                selects undeclared keys.
            label: The ledger label (default ``"groupby count"``).
            query_id: An idempotency key, as for `Accountant.charge`.
        """
        relation, kind, lvl, eps, dlt, sel = self._plan(
            accountant, epsilon, delta, mechanism, level, selection_share)
        r = self._bounds.max_rows_per_unit
        mech = noise_for(kind, eps, dlt, r, 1, r, self._rng)
        record = charge_or_preview(
            accountant, record_charge(mech.charge, relation, sel, self._bounds, self._keys),
            label or "groupby count", query_id, lambda: float(mech.halfwidth(lvl)),
        )
        keys, found = self._gather(self._spec(), sel)
        noisy = np.asarray(mech.release([t.rows for t in found]), dtype=np.float64)
        w = mech.halfwidth(lvl)
        frame = self._frame(keys, {"value": noisy, "low": noisy - w, "high": noisy + w})
        return self._done(GroupedResult(
            frame, lvl, float(w),
            f"each group's true count is within ±{w} of its value with probability >= {lvl}",
            record, Fraction(r), relation, self._bounds, sel is not None,
        ))

    def sum(
        self,
        column: str,
        accountant: Accountant,
        epsilon: Any,
        *,
        lower: Any,
        upper: Any,
        delta: Any = 0,
        mechanism: str | None = None,
        granularity: Any = None,
        fill: Any = None,
        level: Any = 0.95,
        selection_share: Any = "1/4",
        label: str | None = None,
        query_id: str | None = None,
    ) -> GroupedResult:
        """Noisy sums per group of ``column`` clipped to ``[lower, upper]`` (exact lattice
        sums, as `dpaccount.aggregates.sum`); one unit moves a group's sum by at most R
        times one row's sensitivity (the substitution one under substitution)."""
        plan = self._plan(accountant, epsilon, delta, mechanism, level, selection_share)
        relation, kind, lvl, eps, dlt, sel = plan
        self._check_value_column(column)
        fp = FixedPoint.build(lower, upper, granularity, fill)
        s = self._bounds.max_rows_per_unit * sum_sensitivity(fp, relation)
        mech = noise_for(kind, eps, dlt, s, 1, s, self._rng)
        record = charge_or_preview(
            accountant, record_charge(mech.charge, relation, sel, self._bounds, self._keys),
            label or "groupby sum", query_id,
            lambda: float(mech.halfwidth(lvl) * fp.granularity),
        )
        keys, found = self._gather(self._spec(column=column, fp=fp), sel)
        noisy = mech.release([t.total for t in found])
        w = mech.halfwidth(lvl)
        g = fp.granularity
        value = np.asarray([float(v * g) for v in noisy], dtype=np.float64)
        half = float(w * g)
        frame = self._frame(
            keys,
            {
                "value": value,
                "low": [float((v - w) * g) for v in noisy],
                "high": [float((v + w) * g) for v in noisy],
            },
        )
        return self._done(GroupedResult(
            frame, lvl, half,
            f"each group's clipped sum is within ±{half!r} of its value with probability "
            f">= {lvl}",
            record, s * g, relation, self._bounds, sel is not None,
        ))

    def mean(
        self,
        column: str,
        accountant: Accountant,
        epsilon: Any,
        *,
        lower: Any,
        upper: Any,
        delta: Any = 0,
        mechanism: str | None = None,
        count_share: Any = "1/2",
        granularity: Any = None,
        fill: Any = None,
        level: Any = 0.95,
        selection_share: Any = "1/4",
        label: str | None = None,
        query_id: str | None = None,
    ) -> GroupedResult:
        """Noisy means per group: noisy centred sum / noisy count, as
        `dpaccount.aggregates.mean` in each group (``count_share`` of each part to the
        count); each group's part is the basic composition of its two releases (Dwork
        and Roth 2014, Thm 3.16).

        The result's ``counts`` holds the noisy row count each mean divides by (a frame
        like `count`'s: ``value``, ``low``, ``high`` at ``level``, the interval `count`
        would give at ``count_share`` of this epsilon and delta). It is already paid for,
        so a count and a mean of the same groups need one call: one charge and one pass
        over the data (contribution bounding once), not two.
        """
        plan = self._plan(accountant, epsilon, delta, mechanism, level, selection_share)
        relation, kind, lvl, eps, dlt, sel = plan
        share = to_fraction(count_share, "count_share")
        if not 0 < share < 1:
            raise InvalidCostError("count_share", count_share, "must be in (0, 1)")
        self._check_value_column(column)
        fp = FixedPoint.build(lower, upper, granularity, fill)
        centre = (fp.a + fp.b) // 2
        r = self._bounds.max_rows_per_unit
        s = r * sum_sensitivity(fp, relation, centre)
        sum_mech = noise_for(kind, eps * (1 - share), dlt * (1 - share), s, 1, s, self._rng)
        count_mech = noise_for(kind, eps * share, dlt * share, r, 1, r, self._rng)
        part = sum_mech.charge.cost + count_mech.charge.cost
        record = charge_or_preview(  # the mean's interval depends on the noisy count
            accountant, record_charge(part, relation, sel, self._bounds, self._keys),
            label or "groupby mean", query_id, lambda: None,
        )
        keys, found = self._gather(self._spec(column=column, fp=fp, centre=centre), sel)
        noisy_sums = sum_mech.release([t.total for t in found])
        noisy_counts = count_mech.release([t.rows for t in found])
        each = (1.0 + lvl) / 2.0
        ws, wn = sum_mech.halfwidth(each), count_mech.halfwidth(each)
        g = fp.granularity
        estimates = [
            mean_estimate(ns, nc, ws, wn, centre, fp)
            for ns, nc in zip(noisy_sums, noisy_counts, strict=True)
        ]
        frame = self._frame(
            keys,
            {
                "value": [float(v * g) for v, _, _ in estimates],
                "low": [float(lo * g) for _, lo, _ in estimates],
                "high": [float(hi * g) for _, _, hi in estimates],
            },
        )
        counts = np.asarray(noisy_counts, dtype=np.float64)
        wc = count_mech.halfwidth(lvl)
        paid = self._frame(keys, {"value": counts, "low": counts - wc, "high": counts + wc})
        widest = max((float((hi - lo) * g / 2) for _, lo, hi in estimates), default=0.0)
        return self._done(GroupedResult(
            frame, lvl, widest,
            f"each group's clipped mean lies in its interval with probability >= {lvl} "
            "(union bound over its sum and count)",
            record, s * g, relation, self._bounds, sel is not None, paid,
        ))

    def histogram(
        self,
        column: str,
        accountant: Accountant,
        epsilon: Any,
        *,
        bins: Any,
        delta: Any = 0,
        mechanism: str | None = None,
        level: Any = 0.95,
        selection_share: Any = "1/4",
        label: str | None = None,
        query_id: str | None = None,
    ) -> GroupedResult:
        """Noisy counts per group and bin (numeric edges, as
        `dpaccount.aggregates.histogram`). One unit's R rows in a group change its bins'
        counts by at most R in L1 (2R under substitution)."""
        plan = self._plan(accountant, epsilon, delta, mechanism, level, selection_share)
        relation, kind, lvl, eps, dlt, sel = plan
        self._check_value_column(column)
        edges = check_edges(bins)
        r = self._bounds.max_rows_per_unit
        moved = r if relation is Relation.ADD_REMOVE else 2 * r
        coordinates = min(moved, edges.size - 1)
        mech = noise_for(kind, eps, dlt, r, coordinates, moved, self._rng)
        record = charge_or_preview(
            accountant, record_charge(mech.charge, relation, sel, self._bounds, self._keys),
            label or "groupby histogram", query_id, lambda: float(mech.halfwidth(lvl)),
        )
        keys, found = self._gather(self._spec(column=column, edges=edges), sel)
        labels = bin_labels(edges)
        w = mech.halfwidth(lvl)
        out_keys: list[tuple[Any, str]] = []
        out_values: list[float] = []
        for key, t in zip(keys, found, strict=True):
            noisy = mech.release(t.bins or [0] * len(labels))
            out_keys.extend((key, b) for b in labels)
            out_values.extend(float(v) for v in noisy)
        pd = pandas_module()
        value = np.asarray(out_values, dtype=np.float64)
        frame = pd.DataFrame(
            {"value": value, "low": value - w, "high": value + w},
            index=pd.MultiIndex.from_tuples(out_keys, names=[self._by, "bin"])
            if out_keys else pd.MultiIndex.from_arrays([[], []], names=[self._by, "bin"]),
        )
        return self._done(GroupedResult(
            frame, lvl, float(w),
            f"each bin's true count is within ±{w} of its value with probability >= {lvl}",
            record, Fraction(moved), relation, self._bounds, sel is not None,
        ))

    def quantile(
        self,
        column: str,
        accountant: Accountant,
        epsilon: Any,
        q: Any,
        *,
        lower: Any,
        upper: Any,
        grid_size: int = 1001,
        level: Any = 0.95,
        delta: Any = 0,
        selection_share: Any = "1/4",
        label: str | None = None,
        query_id: str | None = None,
    ) -> GroupedResult:
        """A private q-quantile per group by the exponential mechanism over a grid of
        ``grid_size`` points from ``lower`` to ``upper`` (as `dpaccount.aggregates.quantile`);
        one unit's R rows move a group's utilities by at most R max(q, 1 - q) under
        add/remove and R under substitution."""
        # the exponential mechanism is pure: delta can only pay for the key selection
        plan = self._plan(accountant, epsilon, delta, "laplace", level, selection_share)
        relation, _kind, lvl, eps, _dlt, sel = plan
        qf = to_fraction(q, "q")
        if not 0 <= qf <= 1:
            raise InvalidCostError("q", q, "must be in [0, 1]")
        lo, hi = check_bounds(lower, upper)
        if isinstance(grid_size, bool) or not isinstance(grid_size, int) or grid_size < 2:
            raise InvalidCostError("grid_size", grid_size, "must be an integer >= 2")
        self._check_value_column(column)
        grid = np.unique(np.linspace(lo, hi, grid_size))
        r = self._bounds.max_rows_per_unit
        sens = r * (max(qf, 1 - qf) if relation is Relation.ADD_REMOVE else Fraction(1))
        mech = ExponentialMechanism(eps, sens, rng=self._rng)
        rank_err = float(2 * sens / eps) * (
            math.log(grid.size) + math.log(1.0 / (1.0 - lvl))
        ) * (1 + 1e-12)
        record = charge_or_preview(
            accountant, record_charge(mech.charge, relation, sel, self._bounds, self._keys),
            label or "groupby quantile", query_id, lambda: rank_err,
        )
        keys, found = self._gather(self._spec(column=column, grid=grid), sel)
        picked = [float(grid[mech.release(_utilities(t, grid.size, qf))]) for t in found]
        frame = self._frame(keys, {"value": picked})
        return self._done(GroupedResult(
            frame, lvl, rank_err,
            f"with probability >= {lvl} each group's value has a rank within the best grid "
            f"point's rank error + {rank_err:.4g} of q*n",
            record, sens, relation, self._bounds, sel is not None,
        ))

    def _check_value_column(self, column: Any) -> None:
        check_frame_column(self._data, column, "column")
        check_numeric(self._data, column)


def _utilities(found: GroupTotals, size: int, q: Fraction) -> list[Fraction]:
    """The quantile utilities -|#{x <= c_j} - q n| from a group's rank counts (as
    `quantile_utilities` computes them from the values)."""
    counts = found.bins or [0] * (size + 1)
    ranks = np.cumsum(np.asarray(counts[:size], dtype=np.int64)).tolist()
    target = q * found.rows
    return [-abs(r - target) for r in ranks]


def groupby(
    data: Any,
    by: str | None,
    *,
    keys: Sequence[Any] | None = None,
    privacy_unit: str | None = None,
    max_groups_per_unit: int = 1,
    max_rows_per_unit: int = 1,
    key_selection: str = "optimal",
    output: str = "pandas",
    rng: Any = None,
) -> GroupBy:
    """Declare a grouping of ``data`` by the column ``by``; nothing is read or charged.

    Args:
        data: A pandas, polars, Dask or PySpark DataFrame (a polars LazyFrame is
            refused: collect it). On Dask and Spark the totals are computed where the
            data lives (`dpaccount.aggregates.engines`).
        by: The column holding the group key; ``None`` for the whole table as one group
            (its key is ``"all"``): a whole-table statistic on any engine.
        keys: The public keys (declared, data-independent). ``None``: the observed keys
            are selected privately by ``key_selection``, which needs delta > 0.
        privacy_unit: The column identifying a person. ``None``: one row is one person
            (then both bounds must stay 1).
        max_groups_per_unit: G, how many groups one person may contribute to.
        max_rows_per_unit: R, how many rows one person may contribute to each group.
        key_selection: How undeclared keys are selected: ``"optimal"`` (default,
            `OptimalSelection`: Desfontaines et al. 2022) or ``"threshold"``
            (`ThresholdSelection`, the method of earlier releases).
        output: The engine of `GroupedResult.table`: ``"pandas"`` (default),
            ``"polars"``, ``"spark"`` or ``"dask"`` (``frame`` stays pandas).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG (for
            the noise and for contribution bounding).

    Raises:
        InvalidCostError: ``data`` is not a DataFrame, or a bound is not a positive
            integer, or the keys repeat.
        ConfigError: A column is missing, bounds are given without a privacy unit, or
            ``key_selection`` or ``output`` is unknown.
    """
    check_frame(data)
    if key_selection not in SELECTION_METHODS:
        raise ConfigError(f"unknown key_selection {key_selection!r}; use one of "
                          f"{', '.join(SELECTION_METHODS)}")
    if output not in OUTPUTS:
        raise ConfigError(f"unknown output {output!r}; use one of {', '.join(OUTPUTS)}")
    if by is None:  # the whole table: one group, declared
        if keys is not None:
            raise ConfigError("by=None is the whole table: leave keys unset")
        keys = [WHOLE_TABLE]
    else:
        check_frame_column(data, by, "by")
        check_keys_column(data, by, "the key column")
    bounds = ContributionBounds(max_groups_per_unit, max_rows_per_unit)
    if privacy_unit is None:
        if not bounds.is_one_row_per_unit:
            raise ConfigError(
                "max_groups_per_unit / max_rows_per_unit bound what one person contributes: "
                "name the column that identifies a person with privacy_unit=..."
            )
    else:
        check_frame_column(data, privacy_unit, "privacy_unit")
        check_keys_column(data, privacy_unit, "the privacy_unit column")
    if keys is None and by is not None and engine_of(data) in ("dask", "spark"):
        check_key_type(data, by)
    if keys is not None:
        check_declared_keys(keys)
    return GroupBy(data, by, keys, privacy_unit, bounds, resolve_rng(rng), key_selection,
                   output)
