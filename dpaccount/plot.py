"""Plots of composition bounds (matplotlib is an optional extra: ``dpaccount[plot]``).

`composition_curves()` computes the numbers (no matplotlib needed);
`plot_composition()` draws total epsilon against the number of queries k for basic,
advanced (Dwork-Roth Thm 3.20), the Whitehouse et al. 2023 filter, and the exact optimum
(Kairouz-Oh-Viswanath 2015 Thm 3.3), with the Agg backend.

Examples:
    >>> curves = composition_curves("0.1", 0, 200, "1e-5", points=5)
    >>> curves["k"]
    [1, 50, 100, 150, 200]
    >>> curves["basic"][-1]
    20.0
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dpaccount._numeric import check_count
from dpaccount.composition.best import compose_by_name
from dpaccount.costs import PrivacyCost, format_bound
from dpaccount.errors import InvalidCostError, UnsupportedChargeError, missing_extra
from dpaccount.records import LedgerMeta, LedgerRecord
from dpaccount.spend import spend_over_time

__all__ = ["CURVES", "composition_curves", "plot_composition", "plot_ledgers"]

#: The rules drawn, with their legend labels.
CURVES = {
    "basic": "basic (Dwork-Roth Thm 3.16)",
    "advanced": "advanced (Dwork-Roth Thm 3.20)",
    "filter": "filter, fully adaptive (Whitehouse et al. 2023)",
    "optimal": "optimal (Kairouz-Oh-Viswanath 2015 Thm 3.3)",
}


def _k_grid(k_max: int, points: int) -> list[int]:
    if k_max <= points:
        return list(range(1, k_max + 1))
    step = k_max / (points - 1)
    grid = sorted({max(1, round(i * step)) for i in range(points)} | {k_max})
    return grid


def composition_curves(
    epsilon: Any, delta: Any, k_max: int, delta_slack: Any, *, points: int = 100
) -> dict[str, list[Any]]:
    """Total epsilon against k for each rule in `CURVES`.

    Args:
        epsilon: Per-query epsilon.
        delta: Per-query delta.
        k_max: Largest k.
        delta_slack: delta' for advanced and the filter; optimal is evaluated at the
            same total delta (delta_slack + k delta).
        points: How many values of k (evenly spaced, always including 1 and k_max).

    Returns:
        ``{"k": [...], "basic": [...], ...}`` with floats (None where a rule gives no
        bound).
    """
    cost = PrivacyCost(epsilon, delta)
    k_max = check_count(k_max, "k_max")
    points = check_count(points, "points", minimum=2)
    grid = _k_grid(k_max, points)
    curves: dict[str, list[Any]] = {"k": grid}
    for name in CURVES:
        values: list[float | None] = []
        for k in grid:
            try:
                values.append(float(compose_by_name(name, cost, k, delta_slack)[0].epsilon))
            except (InvalidCostError, UnsupportedChargeError):
                values.append(None)
        curves[name] = values
    return curves


def plot_composition(
    epsilon: Any,
    delta: Any,
    k_max: int,
    delta_slack: Any,
    path: str | Path,
    *,
    points: int = 100,
) -> Path:
    """Draw total epsilon vs k for basic, advanced, filter and optimal into ``path``.

    Args:
        epsilon: Per-query epsilon.
        delta: Per-query delta.
        k_max: Largest k drawn.
        delta_slack: delta' (see `composition_curves()`).
        path: Output file; the format follows its suffix (``.png``, ``.svg``, ...).
        points: How many values of k.

    Returns:
        The path written.

    Raises:
        ImportError: matplotlib is not installed (``pip install "dpaccount[plot]"``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise missing_extra("matplotlib", "plot") from None
    curves = composition_curves(epsilon, delta, k_max, delta_slack, points=points)
    figure, axes = pyplot.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        for name, label in CURVES.items():
            ks_all, vs_all = curves["k"], curves[name]
            pairs = [(k, v) for k, v in zip(ks_all, vs_all, strict=True) if v is not None]
            if pairs:
                ks, vs = zip(*pairs, strict=True)
                axes.plot(ks, vs, label=label)
        axes.set_xlabel("number of queries k")
        axes.set_ylabel("total epsilon")
        axes.set_title(f"k queries of ({epsilon}, {delta})-DP, delta' = {delta_slack}", fontsize=10)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        out = Path(path)
        figure.savefig(out)
    finally:
        pyplot.close(figure)
    return out


def plot_ledgers(ledgers: Sequence[tuple[LedgerMeta, Sequence[LedgerRecord], str]], by: str,
          output: str, shares: dict[str, list[str | None]]) -> None:
    """``dpaccount ledger report``'s image (``.png``, ``.svg``, ``.pdf``): per ledger,
    epsilon and delta spent under its rule over time as step charts (delta only where
    some was spent), attributed to groups as `dpaccount.report.html_report` does.

    Args:
        ledgers: (settings, records, verification status) of each ledger.
        by: Group charges by ``"label"``, ``"job"`` or ``"share"``.
        output: The file to write; its suffix gives the format.
        shares: Per ledger name, the share behind each of its records.

    Raises:
        ImportError: matplotlib is not installed (``pip install "dpaccount[plot]"``).
    """
    try:
        import matplotlib
    except ImportError:
        raise missing_extra("matplotlib", "plot") from None
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(ledgers), 2, figsize=(11, 3.4 * len(ledgers)), squeeze=False)
    for row, (meta, records, _status) in zip(axes, ledgers, strict=True):
        mine = shares.get(meta.name)
        spend = spend_over_time(meta, records, by=by if by != "share" or mine else "label",
                                shares=mine)
        # as the HTML report: 0 before the first charge, the last step drawn on to the
        # end of the axis, and a record stamped before the one ahead of it drawn there
        times = list(itertools.accumulate((p.timestamp for p in spend.points), max))
        start = times[0] if times else datetime.now(UTC)
        end = times[-1] if times else start
        pad = (end - start) * 0.04 if end > start else timedelta(hours=1)
        xs = [start, *times, end + pad] if times else []
        for ax, coordinate, limit in ((row[0], "epsilon", meta.budget.epsilon),
                                      (row[1], "delta", meta.budget.delta)):
            if coordinate == "delta" and spend.spent.delta == 0:
                ax.axis("off")
                ax.text(0.5, 0.5, f"{meta.name}: delta spent 0 (no chart)", ha="center")
                continue

            def padded(values: list[float]) -> list[float]:
                return [0.0, *values, values[-1]] if values else []

            base = [0.0] * len(times)
            for g, group in enumerate(spend.groups):
                top = [b + p.attributed(g, coordinate)
                       for b, p in zip(base, spend.points, strict=True)]
                ax.fill_between(xs, padded(base), padded(top), step="post", alpha=0.55,
                                label=group)
                base = top
            if times:
                ax.plot(xs, padded([float(getattr(p.spent, coordinate))
                                    for p in spend.points]),
                        color="black", drawstyle="steps-post",
                        label=f"spent under {spend.rule.split(' ')[0]}")
            if limit is not None:
                ax.axhline(float(limit), color="red", linestyle="--", label="budget")
            spent = getattr(spend.spent, coordinate)
            left = ("unlimited" if limit is None
                    else format_bound(max(limit - spent, 0), upward=False)[0])
            ax.set_title(f"{meta.name}: {coordinate} {format_bound(spent)[0]} spent, "
                         f"{left} left", fontsize=10)
            ax.set_ylabel(coordinate)
            ax.set_xlabel("time (UTC)", fontsize=8)
            ax.set_xlim(start - pad, end + pad)
            locator = mdates.AutoDateLocator(  # type: ignore[no-untyped-call]
                minticks=3, maxticks=6, tz=UTC)
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(
                mdates.ConciseDateFormatter(locator, tz=UTC))  # type: ignore[no-untyped-call]
        row[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
