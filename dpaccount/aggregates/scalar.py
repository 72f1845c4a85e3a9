"""One statistic of one column: count, sum, mean, histogram and quantile, and their previews.

Each function validates every parameter and builds its mechanism (so its cost is known),
charges the accountant (a refusal raises `BudgetExceededError` and the data is never
read), then computes the implemented true answer (`dpaccount.aggregates.lattice`), adds
the noise of `dpaccount.mechanisms.integer` and returns an `AggregateResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from dpaccount._numeric import check_positive, float_up, to_fraction
from dpaccount.aggregates._checks import (
    bin_labels,
    charge_or_preview,
    check_accountant,
    check_bounds,
    check_column,
    check_container,
    check_edges,
    check_level,
    checked,
    float_array,
    noise_for,
    run_as_preview,
)
from dpaccount.aggregates.columns import check_data, kept_rows, rows_per_unit, subset, true_totals
from dpaccount.aggregates.lattice import (
    FixedPoint,
    histogram_counts,
    mean_estimate,
    quantile_utilities,
    sum_sensitivity,
    to_float,
)
from dpaccount.aggregates.results import AggregatePreview, AggregateResult
from dpaccount.charges import Relation
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms.exponential import ExponentialMechanism
from dpaccount.mechanisms.integer import IntegerNoise

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import Accountant

__all__ = ["count", "histogram", "mean", "preview", "quantile", "sum"]


def _in_memory(data: Any, privacy_unit: Any, max_rows_per_unit: Any) -> int:
    """R for a histogram or quantile, whose data must be in memory (Dask and Spark:
    ``groupby(frame, None)``)."""
    r, engine = rows_per_unit(data, privacy_unit, max_rows_per_unit)
    if engine is not None:
        check_container(data)  # refused: a lazy frame, with what to do instead
    return r


def _count_setup(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any, rng: Any,
    r: int = 1,
) -> tuple[Relation, IntegerNoise, float]:
    relation, eps, dlt, kind, lvl = checked(accountant, epsilon, delta, mechanism, level)
    return relation, noise_for(kind, eps, dlt, r, 1, r, rng), lvl


def _sum_setup(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any,
    lower: Any, upper: Any, granularity: Any, fill: Any, rng: Any, r: int = 1,
) -> tuple[Relation, IntegerNoise, float, FixedPoint, int]:
    relation, eps, dlt, kind, lvl = checked(accountant, epsilon, delta, mechanism, level)
    fp = FixedPoint.build(lower, upper, granularity, fill)
    s = r * sum_sensitivity(fp, relation)
    return relation, noise_for(kind, eps, dlt, s, 1, s, rng), lvl, fp, s


def _histogram_setup(
    accountant: Any, epsilon: Any, delta: Any, mechanism: str | None, level: Any,
    bins: Any, categories: Sequence[Any] | None, rng: Any, r: int = 1,
) -> tuple[Relation, IntegerNoise, float, Any, list[Any]]:
    relation, eps, dlt, kind, lvl = checked(accountant, epsilon, delta, mechanism, level)
    if (bins is None) == (categories is None):
        raise ConfigError("give exactly one of bins= (numeric edges) or categories=")
    edges = check_edges(bins) if bins is not None else None
    cats = list(categories) if categories is not None else []
    if categories is not None and not cats:
        raise InvalidCostError("categories", categories, "at least one category is needed")
    # R rows of a person change at most R bins by 1 each (2R under substitution)
    moved = r if relation is Relation.ADD_REMOVE else 2 * r
    nbins = edges.size - 1 if edges is not None else len(cats)
    mech = noise_for(kind, eps, dlt, r, min(moved, nbins), moved, rng)
    return relation, mech, lvl, edges, cats


def preview(
    aggregate: Callable[..., AggregateResult], data: Any, accountant: Accountant,
    epsilon: Any, **options: Any,
) -> AggregatePreview:
    """What ``aggregate(data, accountant, epsilon, **options)`` would do, without doing it.

    The cost, whether the ledger would admit it and its totals before and after
    (`Accountant.preview`), and the noise's half-width at the level asked for, in the
    answer's units (in ranks for `quantile`; ``None`` for `mean`, whose interval depends
    on its noisy count). The aggregate itself runs up to its charge, so every option is
    checked exactly as it checks them; nothing is charged and the data is not read
    (only its container type is checked, as before a real charge).

    Raises:
        ConfigError: An aggregate other than the five of this module.

    Examples:
        >>> from dpaccount import Accountant
        >>> acct = Accountant(1)
        >>> p = preview(count, [1, 2, 3], acct, "0.5")
        >>> p.cost, p.admitted, p.error_bound, len(acct.records)
        (PrivacyCost(epsilon=0.5, delta=0), True, 6.0, 0)
    """
    if aggregate not in (count, sum, mean, histogram, quantile):
        raise ConfigError("preview() covers count, sum, mean, histogram and quantile")
    return run_as_preview(
        lambda proxy: aggregate(data, proxy, epsilon, **options), accountant,
        options.get("level", 0.95),
    )


def count(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    *,
    delta: Any = 0,
    mechanism: str | None = None,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
    privacy_unit: Any = None,
    max_rows_per_unit: int = 1,
) -> AggregateResult:
    """A noisy count of the records (rows) of ``data``.

    Sensitivity 1 under both relations (a record appears/disappears, or moves in or out
    of the selection that produced ``data``).

    Args:
        data: Anything with ``len()``: an array, a Series, a DataFrame, a list; or a
            Dask Series or DataFrame, or a Spark DataFrame (counted where it lives,
            `dpaccount.aggregates.columns`).
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        delta: 0 for the discrete Laplace (default); > 0 selects the discrete Gaussian.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        level: Confidence level of the interval.
        label: The ledger label (default ``"count"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.
        privacy_unit: The person each row belongs to (an array or Series as long as
            ``data``; a Dask Series of the same frame for Dask data; refused for Spark
            data). ``None``: one row is one person.
        max_rows_per_unit: R, the most rows one person may contribute; each person's
            rows are reduced to R uniformly at random (`dpaccount.aggregates.units`) and
            the sensitivity is R times one row's.

    Examples:
        >>> from dpaccount import Accountant
        >>> acct = Accountant(1)
        >>> res = count([1, 2, 3], acct, "0.5")
        >>> res.cost, res.sensitivity
        (PrivacyCost(epsilon=0.5, delta=0), Fraction(1, 1))
    """
    r, engine = rows_per_unit(data, privacy_unit, max_rows_per_unit)
    relation, mech, lvl = _count_setup(accountant, epsilon, delta, mechanism, level, rng, r)
    check_data(data, engine, numeric=False)
    record = charge_or_preview(
        accountant, mech, label or "count", query_id, lambda: float(mech.halfwidth(lvl))
    )
    rows, _ = true_totals(data, engine, privacy_unit, r, rng)
    noisy = mech.release(rows)
    w = mech.halfwidth(lvl)
    return AggregateResult(
        value=float(noisy),
        interval=(float(noisy - w), float(noisy + w)),
        level=lvl,
        error_bound=float(w),
        accuracy=f"the true count is within ±{w} of the value with probability >= {lvl}",
        record=record,
        sensitivity=Fraction(r),
        relation=relation,
    )


def sum(
    data: Any,
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
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
    privacy_unit: Any = None,
    max_rows_per_unit: int = 1,
) -> AggregateResult:
    """A noisy sum of values clipped to ``[lower, upper]``, summed exactly on a lattice.

    Args:
        data: A 1-D numeric array or Series; or a Dask Series or a one-column Spark
            DataFrame (totalled where it lives, `dpaccount.aggregates.columns`).
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        lower: The lower clipping bound (declared, data-independent).
        upper: The upper clipping bound, > lower.
        delta: 0 for the discrete Laplace (default); > 0 selects the discrete Gaussian.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        granularity: The lattice spacing, a power of two (default: 2**-30 of the bound).
        fill: The value a NaN stands for (default 0 clipped into the bounds).
        level: Confidence level of the interval.
        label: The ledger label (default ``"sum"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.
        privacy_unit: The person each row belongs to (an array or Series as long as
            ``data``; a Dask Series of the same frame for Dask data; refused for Spark
            data). ``None``: one row is one person.
        max_rows_per_unit: R, the most rows one person may contribute; each person's
            rows are reduced to R uniformly at random (`dpaccount.aggregates.units`) and
            the sensitivity is R times one row's.

    Returns:
        The result; ``sensitivity`` is ``S * g`` (see the module table).
    """
    r, engine = rows_per_unit(data, privacy_unit, max_rows_per_unit)
    relation, mech, lvl, fp, s = _sum_setup(
        accountant, epsilon, delta, mechanism, level, lower, upper, granularity, fill, rng, r
    )
    check_data(data, engine, numeric=True)
    record = charge_or_preview(
        accountant, mech, label or "sum", query_id,
        lambda: to_float(mech.halfwidth(lvl), fp.granularity),
    )
    _, total = true_totals(data, engine, privacy_unit, r, rng, fp)
    noisy = mech.release(total)
    w = mech.halfwidth(lvl)
    g = fp.granularity
    return AggregateResult(
        value=to_float(noisy, g),
        interval=(to_float(noisy - w, g), to_float(noisy + w, g)),
        level=lvl,
        error_bound=to_float(w, g),
        accuracy=(
            f"the clipped sum (values rounded to multiples of {float(g)!r}) is within "
            f"±{to_float(w, g)!r} of the value with probability >= {lvl}"
        ),
        record=record,
        sensitivity=s * g,
        relation=relation,
        granularity=g,
    )


def mean(
    data: Any,
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
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
    privacy_unit: Any = None,
    max_rows_per_unit: int = 1,
) -> AggregateResult:
    """A noisy mean of values clipped to ``[lower, upper]``: noisy centred sum / noisy count.

    The values are centred at the lattice midpoint c of the bounds, so the sum's
    add/remove sensitivity is about (upper - lower) / 2 instead of max(|lower|, |upper|).
    epsilon (and delta) are split: ``count_share`` to the count, the rest to the sum;
    the two releases are charged as one record whose cost is their basic composition
    (Dwork and Roth 2014, Thm 3.16). The number of records is never assumed public
    (the data may be a selection of the dataset). The released mean is clipped to the
    bounds (post-processing).

    Args:
        data: A 1-D numeric array or Series; or a Dask Series or a one-column Spark
            DataFrame (totalled where it lives, `dpaccount.aggregates.columns`).
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0, the total for the mean.
        lower: The lower clipping bound.
        upper: The upper clipping bound, > lower.
        delta: 0 (discrete Laplace) or > 0 (discrete Gaussian), the total.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        count_share: The fraction of epsilon and delta spent on the count, in (0, 1).
        granularity: The lattice spacing, a power of two.
        fill: The value a NaN stands for (default 0 clipped into the bounds).
        level: Confidence level of the interval (each release at (1 + level) / 2).
        label: The ledger label (default ``"mean"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.
        privacy_unit: The person each row belongs to (an array or Series as long as
            ``data``; a Dask Series of the same frame for Dask data; refused for Spark
            data). ``None``: one row is one person.
        max_rows_per_unit: R, the most rows one person may contribute; each person's
            rows are reduced to R uniformly at random (`dpaccount.aggregates.units`) and
            the sensitivity is R times one row's.

    Examples:
        >>> from dpaccount import Accountant
        >>> acct = Accountant(1)
        >>> res = mean([1.0, 2.0, 3.0] * 100, acct, 1, lower=0, upper=4)
        >>> res.cost
        PrivacyCost(epsilon=1, delta=0)
        >>> 0 <= res.value <= 4
        True
    """
    r, engine = rows_per_unit(data, privacy_unit, max_rows_per_unit)
    relation, eps, dlt, kind, lvl = checked(accountant, epsilon, delta, mechanism, level)
    share = to_fraction(count_share, "count_share")
    if not 0 < share < 1:
        raise InvalidCostError("count_share", count_share, "must be in (0, 1)")
    fp = FixedPoint.build(lower, upper, granularity, fill)
    centre = (fp.a + fp.b) // 2
    s = r * sum_sensitivity(fp, relation, centre)
    sum_mech = noise_for(kind, eps * (1 - share), dlt * (1 - share), s, 1, s, rng)
    count_mech = noise_for(kind, eps * share, dlt * share, r, 1, r, rng)
    total_cost = sum_mech.charge.cost + count_mech.charge.cost  # two mechanisms, one record
    check_data(data, engine, numeric=True)
    # the mean's interval depends on its noisy count: a preview reports no error bound
    record = charge_or_preview(accountant, total_cost, label or "mean", query_id, lambda: None)
    rows, total = true_totals(data, engine, privacy_unit, r, rng, fp, centre)
    noisy_sum = sum_mech.release(total)
    noisy_n = count_mech.release(rows)
    g = fp.granularity
    each = (1.0 + lvl) / 2.0
    value_int, lo_int, hi_int = mean_estimate(
        noisy_sum, noisy_n, sum_mech.halfwidth(each), count_mech.halfwidth(each), centre, fp
    )
    return AggregateResult(
        value=float(value_int * g),
        interval=(float(lo_int * g), float(hi_int * g)),
        level=lvl,
        error_bound=float((hi_int - lo_int) * g / 2),
        accuracy=(
            f"the clipped mean (values rounded to multiples of {float(g)!r}) lies in the "
            f"interval with probability >= {lvl} (union bound over the sum and the count)"
        ),
        record=record,
        sensitivity=s * g,
        relation=relation,
        granularity=g,
    )


def histogram(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    *,
    bins: Any = None,
    categories: Sequence[Any] | None = None,
    delta: Any = 0,
    mechanism: str | None = None,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
    privacy_unit: Any = None,
    max_rows_per_unit: int = 1,
) -> AggregateResult:
    """Noisy counts over declared bins (numeric edges) or declared categories.

    Give ``bins`` (strictly increasing finite edges; bin i is [e_i, e_{i+1}), the last
    one closed, as `numpy.histogram()`) or ``categories`` (values compared with
    ``==``; others are dropped). Each record falls in at most one bin, so one record
    changes one count by 1 (add/remove) or two counts by 1 (substitution). Noise is
    independent per bin.

    Args:
        data: A 1-D array or Series.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        bins: The bin edges (declared, data-independent).
        categories: The declared categories (instead of ``bins``).
        delta: 0 for the discrete Laplace (default); > 0 selects the discrete Gaussian.
        mechanism: ``"laplace"`` or ``"gaussian"`` (default: by ``delta``).
        level: Confidence level of each bin's interval.
        label: The ledger label (default ``"histogram"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.
        privacy_unit: The person each row belongs to (an array or Series as long as
            ``data``). ``None``: one row is one person.
        max_rows_per_unit: R, the most rows one person may contribute; each person's
            rows are reduced to R uniformly at random (`dpaccount.aggregates.units`) and
            the sensitivity is R times one row's.

    Examples:
        >>> from dpaccount import Accountant
        >>> res = histogram([0.5, 1.5, 1.7], Accountant(1), 1, bins=[0, 1, 2])
        >>> res.value.shape
        (2,)
    """
    r = _in_memory(data, privacy_unit, max_rows_per_unit)
    relation, mech, lvl, edges, cats = _histogram_setup(
        accountant, epsilon, delta, mechanism, level, bins, categories, rng, r
    )
    check_container(data)
    check_column(data, numeric=edges is not None)
    record = charge_or_preview(
        accountant, mech, label or "histogram", query_id, lambda: float(mech.halfwidth(lvl))
    )
    kept = kept_rows(data, privacy_unit, r, rng)
    if edges is not None:
        counts = histogram_counts(subset(data, kept), edges)
    else:
        index = {c: i for i, c in enumerate(cats)}
        counts = [0] * len(cats)
        values = data.tolist() if hasattr(data, "tolist") else list(data)
        if kept is not None:
            values = [values[i] for i in kept.tolist()]
        for v in values:
            try:
                i = index.get(v)
            except TypeError:  # unhashable values are in no category
                i = None
            if i is not None:
                counts[i] += 1
    noisy = mech.release(counts)
    w = mech.halfwidth(lvl)
    out: Any = np.asarray(noisy, dtype=np.float64)
    if type(data).__module__.startswith("pandas"):  # pandas in, pandas out
        import pandas as pd

        # The labels are the declared categories or bins, public; the data's own name
        # (which can come from the data, e.g. a row picked with .loc) is not released.
        labels = cats if edges is None else bin_labels(edges)
        out = pd.Series(out, index=pd.Index(labels))
    return AggregateResult(
        value=out,
        interval=(out - w, out + w),
        level=lvl,
        error_bound=float(w),
        accuracy=(
            f"each bin's true count is within ±{w} of its value with probability >= {lvl} "
            "(per bin, not simultaneously)"
        ),
        record=record,
        sensitivity=Fraction(r if relation is Relation.ADD_REMOVE else 2 * r),
        relation=relation,
    )


def quantile(
    data: Any,
    accountant: Accountant,
    epsilon: Any,
    q: Any,
    *,
    candidates: Any = None,
    lower: Any = None,
    upper: Any = None,
    grid_size: int = 1001,
    level: Any = 0.95,
    label: str | None = None,
    rng: Any = None,
    query_id: str | None = None,
    privacy_unit: Any = None,
    max_rows_per_unit: int = 1,
) -> AggregateResult:
    """A private q-quantile chosen by the exponential mechanism over a declared grid.

    Utility of candidate c: -|#{x <= c} - q n| (exact rationals). One record changes it
    by at most max(q, 1 - q) under add/remove (#{x <= c} and q n move together) and by 1
    under substitution, so the exponential mechanism with that sensitivity is epsilon-DP
    (McSherry and Talwar 2007, Thm 6; Dwork and Roth 2014, Thm 3.10; the quantile
    utility of Smith 2011, "Privacy-preserving statistical estimation with optimal
    convergence rates"). Accuracy (Dwork and Roth 2014, Thm 3.11): with probability
    >= level, the selected candidate's rank misses q n by at most the best candidate's
    miss plus (2 Δ / epsilon)(ln |grid| + ln(1 / (1 - level))).

    Args:
        data: A 1-D numeric array or Series.
        accountant: The ledger to charge (before the data is read).
        epsilon: > 0.
        q: The quantile, in [0, 1].
        candidates: The declared candidate values (finite).
        lower: Instead of ``candidates``: a grid of ``grid_size`` evenly spaced points
            from ``lower`` to ``upper``.
        upper: See ``lower``.
        grid_size: Number of grid points (>= 2) with ``lower``/``upper``.
        level: Confidence level of the rank-error statement.
        label: The ledger label (default ``"quantile"``).
        rng: Test-only ``RandomSource.seeded(...)``; ``None`` uses the OS CSPRNG.
        query_id: An idempotency key, as for `Accountant.charge`: a retry is
            refused with `DuplicateQueryError` before the data is read.
        privacy_unit: The person each row belongs to (an array or Series as long as
            ``data``). ``None``: one row is one person.
        max_rows_per_unit: R, the most rows one person may contribute; each person's
            rows are reduced to R uniformly at random (`dpaccount.aggregates.units`) and
            the sensitivity is R times one row's.

    Examples:
        >>> from dpaccount import Accountant
        >>> res = quantile(list(range(100)), Accountant(1), 1, "0.5", lower=0, upper=99,
        ...                grid_size=100)
        >>> res.cost.epsilon, res.interval is None
        (Fraction(1, 1), True)
    """
    r = _in_memory(data, privacy_unit, max_rows_per_unit)
    relation = check_accountant(accountant)
    eps = check_positive(epsilon, "epsilon")
    qf = to_fraction(q, "q")
    if not 0 <= qf <= 1:
        raise InvalidCostError("q", q, "must be in [0, 1]")
    lvl = check_level(level)
    if candidates is not None:
        if lower is not None or upper is not None:
            raise ConfigError("give candidates= or lower=/upper=, not both")
        grid = np.unique(float_array(candidates))
        if grid.size == 0 or not np.all(np.isfinite(grid)):
            raise InvalidCostError("candidates", candidates, "must be finite, at least one")
    else:
        if lower is None or upper is None:
            raise ConfigError("give candidates= or both lower= and upper=")
        lo, hi = check_bounds(lower, upper)
        if isinstance(grid_size, bool) or not isinstance(grid_size, int) or grid_size < 2:
            raise InvalidCostError("grid_size", grid_size, "must be an integer >= 2")
        grid = np.unique(np.linspace(lo, hi, grid_size))
    sens = r * (max(qf, 1 - qf) if relation is Relation.ADD_REMOVE else Fraction(1))
    mech = ExponentialMechanism(eps, sens, rng=rng)
    check_container(data)
    check_column(data, numeric=True)
    rank_err = float_up(
        2 * sens / eps * Fraction(math.log(grid.size) + math.log(1.0 / (1.0 - lvl)))
        * (1 + 1e-12)
    )
    record = charge_or_preview(accountant, mech, label or "quantile", query_id, lambda: rank_err)
    utilities = quantile_utilities(subset(data, kept_rows(data, privacy_unit, r, rng)), grid, qf)
    chosen = float(grid[mech.release(utilities)])
    return AggregateResult(
        value=chosen,
        interval=None,
        level=lvl,
        error_bound=rank_err,
        accuracy=(
            f"with probability >= {lvl} the value's rank is within the best grid point's "
            f"rank error + {rank_err:.4g} of q*n"
        ),
        record=record,
        sensitivity=sens,
        relation=relation,
    )
