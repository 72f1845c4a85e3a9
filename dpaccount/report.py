"""The HTML report of ``dpaccount ledger report``: one self-contained page a privacy
officer can read alone (inline CSS and SVG, no script, nothing fetched).

The page has, in order: a short glossary of the words it uses (the relations, the rules
of the ledgers shown, "spent under the rule", shares); the tree of the ledgers and their
shares, each with its spend against its budget; and one section per ledger with its
figures, the spend over time under its rule drawn as a **step chart** (the spend changes
only when a charge is recorded, so it is a step function of time), the delta chart only
when some delta was spent, time axes with ticks in UTC, its charges grouped by label, job
or share and, for a ledger with shares, its latest charges with the share behind each.

Every figure comes from `dpaccount.spend`: the spend under the ledger's rule, rounded up;
what remains, rounded down. Labels, names and the title are escaped (and the title goes
through the one redaction, `dpaccount._redact.redact`).
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Final

from dpaccount._redact import redact
from dpaccount.costs import format_bound
from dpaccount.records import LedgerMeta, LedgerRecord
from dpaccount.spend import ShareNode, Spend, spend_over_time, summarize

__all__ = ["GLOSSARY", "RULE_GLOSSARY", "html_report", "time_ticks"]

#: The words of the report, explained (shown at the top of every report).
GLOSSARY: Final = (
    ("ε (epsilon), δ (delta)",
     "How much the released answers can reveal about any one person (one privacy unit): "
     "adding, removing or changing that person's data (see relation) changes the "
     "probability of any outcome by at most a factor e^ε, plus at most δ, a small "
     "probability with which that bound may be exceeded. Smaller is more private."),
    ("budget", "The most ε and δ a ledger may ever spend; a query that would go over it "
     "is refused before it runs."),
    ("relation add_remove", "Two data sets are neighbours when one has one person's records "
     "more or fewer: the guarantee covers whether someone is in the data at all."),
    ("relation substitution", "Two data sets are neighbours when one person's records are "
     "replaced by another's (the size is the same): the guarantee covers what someone's "
     "records hold, not whether the data has them."),
    ("rule", "How the charges of a ledger add up to one total (named below). A tighter rule "
     "proves a smaller total for the same charges."),
    ("spent under the rule", "The total of all charges so far composed under the ledger's "
     "rule: a proven upper bound on the privacy loss, rounded up. It can be far below the "
     "plain sum of the charges (the \"own, summed\" columns)."),
    ("remaining", "The budget minus what is spent, rounded down."),
    ("share", "A team's part of a data set's budget: every charge to a share is also "
     "recorded in the data set's ledger (and its parents), so the data set's spend "
     "includes it; a share can never spend more than its own budget."),
    ("attributed", "Where a chart splits the spend by label, job or share, each part is in "
     "proportion to that group's own charges; the parts add up to the spend under the "
     "rule, but no group spent its part on its own."),
)

#: What each rule name means (shown for the rules of the ledgers in a report).
RULE_GLOSSARY: Final = {
    "basic": "ε and δ of the charges summed (Dwork and Roth 2014, Thm 3.16); holds for any "
             "choice of queries.",
    "advanced": "advanced composition of a plan declared in advance (Dwork, Rothblum and "
                "Vadhan 2010; Dwork and Roth 2014, Thm 3.20).",
    "heterogeneous": "composition of a declared plan of different charges (Kairouz, Oh and "
                     "Viswanath 2015, Thm 3.5).",
    "optimal": "the exact composition of a declared plan of equal charges (Kairouz, Oh and "
               "Viswanath 2015, Thm 3.3).",
    "filter": "a privacy filter: queries and their ε may be chosen as answers come in "
              "(Whitehouse, Ramdas, Rogers and Wu 2023, Thm 3.2).",
    "best": "the tightest rule proven for how the queries are chosen.",
    "pld": "privacy loss distributions of a declared plan, composed numerically and "
           "rounded towards more loss (Dong, Roth and Su 2019; Zhu, Dong and Wang 2022).",
    "rdp": "Rényi differential privacy: a Rényi filter (Feldman and Zrnic 2021, Thm 3.1), "
           "converted to (ε, δ) (Canonne, Kamath and Steinke 2020).",
    "gdp": "Gaussian differential privacy: a fully adaptive filter for Gaussian noise "
           "(Smith and Thakurta 2022, Thm 1.1).",
    "zcdp": "zero-concentrated differential privacy: a fully adaptive zCDP filter (Feldman "
            "and Zrnic 2021, Thm 3.1 at every order), converted to (ε, δ).",
}

#: Colours of the stacked groups (Okabe–Ito, readable by most colour-blind readers).
_PALETTE: Final = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                   "#F0E442", "#000000", "#999999")
#: The latest charges listed, with their share, in a ledger that has shares.
LATEST: Final = 20


def _up(value: Fraction | None) -> str:
    return "unlimited" if value is None else format_bound(value, upward=True)[0]


def _down(value: Fraction) -> str:
    return format_bound(max(value, Fraction(0)), upward=False)[0]


_STEPS: Final = (
    timedelta(minutes=1), timedelta(minutes=5), timedelta(minutes=15),
    timedelta(minutes=30), timedelta(hours=1), timedelta(hours=3), timedelta(hours=6),
    timedelta(hours=12), timedelta(days=1), timedelta(days=2), timedelta(days=7),
    timedelta(days=14),
)


def time_ticks(start: datetime, end: datetime, most: int = 6) -> list[tuple[datetime, str]]:
    """Ticks for a time axis from ``start`` to ``end`` (UTC): at most ``most`` round
    times (minutes, hours, days, weeks, or the first of a month), each with a label that
    names the date where it changes (``11-24 06:00``, ``2026-11-24``, ``2026-11``).

    Examples:
        >>> t0 = datetime(2026, 11, 24, 5, 10, tzinfo=UTC)
        >>> [label for _, label in time_ticks(t0, t0 + timedelta(hours=5))]
        ['11-24 06:00', '07:00', '08:00', '09:00', '10:00']
    """
    span = end - start
    if span < timedelta(minutes=2):  # seconds apart: the two ends, to the second
        return [(start, f"{start:%m-%d %H:%M:%S}")] + (
            [(end, f"{end:%H:%M:%S}")] if end > start else [])
    for step in _STEPS:
        if span / step <= most - 1:
            epoch = datetime(1970, 1, 5, tzinfo=UTC)  # a Monday: weeks start on Mondays
            first = epoch + step * math.ceil((start - epoch) / step)
            times = [first + step * i for i in range(int((end - first) / step) + 1)]
            if step < timedelta(days=1):
                labels, day = [], None
                for t in times:
                    labels.append(f"{t:%H:%M}" if t.date() == day else f"{t:%m-%d %H:%M}")
                    day = t.date()
                return list(zip(times, labels, strict=True))
            return [(t, f"{t:%Y-%m-%d}") for t in times]
    months = (end.year - start.year) * 12 + end.month - start.month
    every = next((m for m in (1, 2, 3, 6, 12, 24, 60) if months / m <= most - 1), 120)
    index = start.year * 12 + start.month - 1
    if datetime(start.year, start.month, 1, tzinfo=UTC) < start:
        index += 1
    index += -index % every
    ticks: list[tuple[datetime, str]] = []
    while True:
        t = datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)
        if t > end:
            return ticks
        ticks.append((t, f"{t:%Y-%m}"))
        index += every


def _nice(ceiling: float) -> list[float]:
    """Round values from 0 up to about ``ceiling`` for the y axis (1, 2 or 5 x 10^k)."""
    raw = ceiling / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [step * i for i in range(int(ceiling / step + 1e-9) + 1)]


def _steps(xs: Sequence[float], ys: Sequence[float], end: float
           ) -> list[tuple[float, float]]:
    """The corners of a step function that is 0 before ``xs[0]`` and ``ys[i]`` from
    ``xs[i]`` on, drawn up to ``end``."""
    corners: list[tuple[float, float]] = []
    before = 0.0
    for x, y in zip(xs, ys, strict=True):
        corners += [(x, before), (x, y)]
        before = y
    return [*corners, (end, before)] if corners else corners


def _chart(spend: Spend, coordinate: str, budget: Fraction | None) -> str:
    """An inline SVG: the spend in one coordinate over time as a step function, its
    attribution to groups stacked below it, the budget as a dashed line, and axes."""
    width, height, left, right, top, bottom = 720, 230, 70, 14, 12, 46
    points = spend.points
    values = [float(getattr(p.spent, coordinate)) for p in points]
    top_value = max([*values, float(budget) if budget is not None else 0.0, 0.0])
    ticks_y = _nice(top_value if top_value > 0 else 1.0)
    ceiling = max(top_value * 1.08, ticks_y[-1], 1e-300)
    start = points[0].timestamp if points else datetime.now(UTC)
    end = points[-1].timestamp if points else start
    pad = (end - start) * 0.04 if end > start else timedelta(hours=1)
    t0, t1 = start - pad, end + pad
    plot_w, plot_h = width - left - right, height - top - bottom

    def x_of(when: datetime) -> float:
        return left + (when - t0) / (t1 - t0) * plot_w

    def y_of(value: float) -> float:
        return top + (1 - value / ceiling) * plot_h

    def path(corners: Sequence[tuple[float, float]]) -> str:
        return " ".join(f"{x:.1f},{y_of(v):.1f}" for x, v in corners)

    # A record stamped before the one ahead of it (writers' clocks differ a little) is
    # drawn at the time of the one ahead: the time axis never runs backwards.
    xs = list(itertools.accumulate((x_of(p.timestamp) for p in points), max))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{coordinate} spent over time" class="chart-{coordinate}">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
             'stroke="#ccc"/>']
    for value in ticks_y:
        y = y_of(value)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#e4e4e4"/><text x="{left - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end" font-size="11">{value:.4g}</text>')
    for when, label in time_ticks(t0, t1):
        x = x_of(when)
        anchor = ("start" if x - left < 45 else "end" if left + plot_w - x < 45
                  else "middle")
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" '
                     f'stroke="#e4e4e4"/><text x="{x:.1f}" y="{top + plot_h + 15}" '
                     f'text-anchor="{anchor}" font-size="11">{label}</text>')
    lower = [0.0] * len(points)
    for g, group in enumerate(spend.groups):
        upper = [lower[i] + p.attributed(g, coordinate) for i, p in enumerate(points)]
        if any(u > lo for u, lo in zip(upper, lower, strict=True)):
            outline = (_steps(xs, upper, left + plot_w)
                       + list(reversed(_steps(xs, lower, left + plot_w))))
            parts.append(f'<polygon points="{path(outline)}" '
                         f'fill="{_PALETTE[g % len(_PALETTE)]}" fill-opacity="0.55">'
                         f"<title>{html.escape(group)}</title></polygon>")
        lower = upper
    if points:
        corners = _steps(xs, values, left + plot_w)
        parts.append(f'<polyline points="{path(corners)}" fill="none" stroke="#222" '
                     'stroke-width="2"/>')
    if budget is not None:
        y = y_of(float(budget))
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#c00" stroke-dasharray="6 4"/><text x="{width - right - 4}" '
                     f'y="{y - 4:.1f}" text-anchor="end" fill="#c00" font-size="12">budget '
                     f"{_up(budget)}</text>")
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle" '
                 f'font-size="11" fill="#555">time (UTC)</text><text x="12" y="{top + 14}" '
                 f'font-size="12" transform="rotate(-90 12 {top + 14})" text-anchor="end">'
                 f"{coordinate}</text></svg>")
    return "".join(parts)


def _bar(spent: Fraction, budget: Fraction | None) -> str:
    if budget is None or budget == 0:
        return ""
    part = min(float(spent / budget), 1.0)
    colour = "#c00" if spent > budget else "#0072B2"
    return (f'<span class="bar"><i style="width:{part * 100:.1f}%;background:{colour}">'
            f"</i></span> {math.ceil(float(spent / budget) * 1000) / 10:g}%")


def _tree(roots: Sequence[ShareNode]) -> str:
    """The ledgers and their shares, each with its spend against its budget."""
    esc = html.escape

    def item(node: ShareNode) -> str:
        budget, spent = node.meta.budget, node.spent
        delta = (f", δ {_up(spent.delta)} of {_up(budget.delta)}"
                 if spent.delta or budget.delta else "")
        below = "".join(item(child) for child in node.children)
        return (f'<li><b>{esc(node.name)}</b> — ε {_up(spent.epsilon)} of '
                f"{_up(budget.epsilon)}{delta} spent under {esc(node.rule.split(' ')[0])} "
                f"{_bar(spent.epsilon, budget.epsilon)}"
                f"{f'<ul>{below}</ul>' if below else ''}</li>")

    return f'<ul class="tree">{"".join(item(root) for root in roots)}</ul>'


def _glossary(metas: Sequence[LedgerMeta], rules: Sequence[str]) -> str:
    esc = html.escape
    shown = {meta.relation.value for meta in metas}
    terms = [(term, text) for term, text in GLOSSARY
             if not term.startswith("relation ") or term.split(" ", 1)[1] in shown]
    terms += [(f"rule {name}", RULE_GLOSSARY[name]) for name in sorted(set(rules))
              if name in RULE_GLOSSARY]
    rows = "".join(f"<dt>{esc(term)}</dt><dd>{esc(text)}</dd>" for term, text in terms)
    return f'<section class="glossary"><h2>Glossary</h2><dl>{rows}</dl></section>'


def _section(meta: LedgerMeta, records: Sequence[LedgerRecord], by: str, status: str,
             shares: Sequence[str | None] | None) -> tuple[str, str]:
    """A ledger's section, and the name of the rule its spend was composed under."""
    esc = html.escape
    by = by if by != "share" or shares is not None else "label"
    spend = spend_over_time(meta, records, by=by, shares=shares)
    budget, spent = meta.budget, spend.spent
    left_eps = "unlimited" if budget.epsilon is None else _down(budget.epsilon - spent.epsilon)
    figures = [
        ("records", str(len(records))),
        ("rule", spend.rule),
        ("relation", meta.relation.value),
        ("budget", f"ε {_up(budget.epsilon)}, δ {_up(budget.delta)}"),
        ("spent under the rule (rounded up)", f"ε {_up(spent.epsilon)}, δ {_up(spent.delta)}"),
        ("remaining (rounded down)", f"ε {left_eps}, δ {_down(budget.delta - spent.delta)}"),
        ("verification", status),
    ]
    if meta.parent is not None:
        figures.insert(0, ("share of", meta.parent))
    if records:
        figures.append(("first and last charge",
                        f"{records[0].timestamp:%Y-%m-%d %H:%M} – "
                        f"{records[-1].timestamp:%Y-%m-%d %H:%M} UTC"))
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in figures)
    legend = "".join(
        f'<span class="key"><i style="background:{_PALETTE[g % len(_PALETTE)]}"></i>'
        f"{esc(group)}</span>" for g, group in enumerate(spend.groups))
    sampled = (f" The spend is drawn at {len(spend.points)} of the {len(records)} records "
               "(each exact); between them it rises in smaller steps." if
               len(spend.points) < len(records) else "")
    if spent.delta > 0:
        delta = f"<h3>δ spent under the rule</h3>{_chart(spend, 'delta', budget.delta)}"
    else:
        delta = ('<p class="note nodelta">δ spent: 0 (no charge so far used δ), so no δ '
                 "chart is drawn.</p>")
    charts = (f"<h3>ε spent under the rule</h3>{_chart(spend, 'epsilon', budget.epsilon)}"
              f'{delta}<p class="legend">{legend}</p><p class="note">The black line is the '
              "spend under the ledger's rule: it steps up at each charge. The coloured areas "
              f"attribute it to each {esc(by)} in proportion to that {esc(by)}'s own "
              f"charges.{sampled}</p>")
    tables = [_groups(records, by, shares)]
    if shares is not None and any(share is not None for share in shares):
        if by != "share":
            tables.append(_groups(records, "share", shares))
        tables.append(_latest(records, shares))
    overspent = ' <span class="alarm">OVERSPENT</span>' if not spent.fits(budget) else ""
    return (f'<section class="ledger"><h2>ledger {esc(meta.name)}{overspent}</h2>'
            f'<table class="figures">{rows}</table>{charts}{"".join(tables)}</section>',
            spend.rule.split(" ")[0])


def _groups(records: Sequence[LedgerRecord], by: str,
            shares: Sequence[str | None] | None) -> str:
    esc = html.escape
    body = "".join(
        f"<tr><td>{esc(row.group)}</td><td>{row.count}</td><td>{_up(row.epsilon)}</td>"
        f"<td>{_up(row.delta)}</td><td>{row.last:%Y-%m-%d %H:%M}</td></tr>"
        for row in summarize(records, by, shares)[:50])
    return (f'<h3>charges by {esc(by)}</h3><table class="groups {esc(by)}"><tr>'
            f"<th>{esc(by)}</th><th>charges</th><th>ε (own, summed)</th>"
            f"<th>δ (own, summed)</th><th>last (UTC)</th></tr>{body}</table>")


def _latest(records: Sequence[LedgerRecord], shares: Sequence[str | None]) -> str:
    esc = html.escape
    body = "".join(
        f"<tr><td>{r.seq}</td><td>{r.timestamp:%Y-%m-%d %H:%M:%S}</td>"
        f"<td>{esc(share or '(direct)')}</td><td>{esc(r.label or '')}</td>"
        f"<td>{_up(r.cost.epsilon)}</td><td>{_up(r.cost.delta)}</td></tr>"
        for r, share in list(zip(records, shares, strict=True))[-LATEST:])
    return ('<h3>latest charges, with the share behind each</h3><table class="latest"><tr>'
            "<th>seq</th><th>when (UTC)</th><th>share</th><th>label</th><th>ε</th>"
            f"<th>δ</th></tr>{body}</table>")


_STYLE: Final = (
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:780px}"
    "table{border-collapse:collapse;margin:8px 0}th,td{text-align:left;padding:3px 10px;"
    "border-bottom:1px solid #ddd;font-size:14px}.key{margin-right:14px;font-size:13px}"
    ".key i{display:inline-block;width:12px;height:12px;margin-right:4px;opacity:.7}"
    ".alarm{color:#fff;background:#c00;padding:2px 6px;font-size:14px}"
    ".note{color:#555;font-size:13px}section{margin-bottom:40px}"
    "dl{font-size:13px}dt{font-weight:600;margin-top:6px}dd{margin:0 0 0 16px;color:#444}"
    ".tree{font-size:14px;line-height:1.7}.bar{display:inline-block;width:90px;height:9px;"
    "background:#eee;vertical-align:middle;margin-left:6px}.bar i{display:block;height:9px}"
)


def html_report(ledgers: Sequence[tuple[LedgerMeta, Sequence[LedgerRecord], str]], *,
                title: str, by: str = "label", tree: Sequence[ShareNode] | None = None,
                shares: Mapping[str, Sequence[str | None]] | None = None) -> str:
    """A self-contained HTML page (inline CSS and SVG, no script, nothing fetched): a
    glossary, the tree of ledgers and shares, and one section per ledger with its
    figures, step charts of its spend under its rule against its budget (delta only
    when spent) and its charges grouped by ``by``.

    Args:
        ledgers: (settings, records, verification status) of each ledger.
        title: The page's title (e.g. the database); it goes through the one
            redaction (`dpaccount._redact.redact`), so a password in a URL in it is
            shown as ``***``.
        by: Group charges by ``"label"``, ``"job"`` or ``"share"``.
        tree: The ledgers and their shares (`dpaccount.spend.share_tree`), drawn with
            each one's spend against its budget.
        shares: Per ledger name, the share behind each of its records
            (`dpaccount.spend.ShareAttribution.names`): a ledger with shares gets a
            table of charges by share and its latest charges with their share.
    """
    title = redact(title)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    shares = shares or {}
    built = [_section(meta, records, by, status, shares.get(meta.name))
             for meta, records, status in ledgers]
    glossary = _glossary([meta for meta, _records, _status in ledgers],
                         [rule for _section_text, rule in built])
    overview = ("" if not tree or all(not node.children for node in tree) else
                f'<section class="shares"><h2>Ledgers and their shares</h2>{_tree(tree)}'
                "</section>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Privacy budget report</h1><p>{html.escape(title)} · generated {generated} · "
        f"{len(ledgers)} ledger(s)</p>{glossary}{overview}"
        f"{''.join(text for text, _rule in built)}</body></html>"
    )
