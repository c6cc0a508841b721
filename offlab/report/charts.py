"""The report's charts as inline SVG text (matplotlib, Agg, text kept as text)."""

from __future__ import annotations

import io
import itertools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offlab.metrics import METRICS
from offlab.stats import CI
from offlab.wire import ETH_HEADER

if TYPE_CHECKING:
    from offlab.sample import Series

# Colour-blind-safe (Okabe–Ito), in the order hues are handed out.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
CPU_PARTS = (("user", "#0072B2"), ("system", "#E69F00"), ("softirq", "#D55E00"), ("irq", "#CC79A7"))
_salt = itertools.count()


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def to_svg(fig) -> str:
    """The figure as an <svg> element to paste into HTML: no XML prolog, no metadata."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"offlab-{next(_salt)}"}):
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    return text.replace("<svg ", '<svg class="chart" role="img" ', 1)


def _style(ax) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=8)


def _scale(metric: str, values: list[float]) -> tuple[float, str]:
    """Divisor and axis unit so tick labels read "3.1 Gbit/s" rather than "3.1e9"."""
    unit = METRICS[metric].unit
    if unit == "fraction":
        return 0.01, "%"
    if unit in ("bit/s", "pps"):
        top = max((abs(v) for v in values), default=0)
        for div, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if top >= div:
                return div, p + unit
    return 1.0, unit


@dataclass
class Point:
    """One cell's figure for a chart: where it sits (group, hue, x) and its interval."""

    group: str
    hue: str
    ci: CI | None
    x: float | None = None
    note: str | None = None  # "skipped", "not measured": drawn instead of a bar


def bars(metric: str, points: list[Point], groups: list[str], hues: list[str], hue_axis: str | None,
         group_axis: str | None) -> str:
    """Grouped bars with the confidence interval as error bars; skipped cells marked in place."""
    m = METRICS[metric]
    div, unit = _scale(metric, [p.ci.mean for p in points if p.ci])
    width = 0.8 / max(1, len(hues))
    fig = _figure(min(11.0, 2.2 + 0.6 * len(groups) * max(1, len(hues))), 3.0)
    ax = fig.add_subplot()
    _style(ax)
    top = max((((p.ci.high if p.ci.high is not None else p.ci.mean)) for p in points if p.ci), default=0) / div
    for hi, hue in enumerate(hues):
        xs, ys, errs, colour = [], [], [], PALETTE[hi % len(PALETTE)]
        for gi, group in enumerate(groups):
            x = gi + (hi - (len(hues) - 1) / 2) * width
            p = next((p for p in points if p.group == group and p.hue == hue), None)
            if p is None:
                continue
            if p.ci is None:
                ax.text(x, top * 0.02, p.note or "–", rotation=90, ha="center", va="bottom", fontsize=7,
                        color="#888888")
                continue
            xs.append(x)
            ys.append(p.ci.mean / div)
            errs.append((p.ci.half_width or 0) / div)
        ax.bar(xs, ys, width * 0.92, yerr=errs, capsize=3, color=colour, label=hue,
               error_kw={"elinewidth": 1, "ecolor": "#333333"})
    ax.set_xticks(range(len(groups)), groups, fontsize=8, rotation=15 if len(groups) > 4 else 0)
    ax.set_ylabel(f"{m.label} ({unit})" if unit else m.label, fontsize=8)
    if group_axis:
        ax.set_xlabel(group_axis, fontsize=8)
    if len(hues) > 1:
        ax.legend(title=hue_axis, fontsize=8, title_fontsize=8, frameon=False,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if top:
        ax.set_ylim(0, top * 1.1)
    return to_svg(fig)


def lines(metric: str, points: list[Point], series: list[str], x_axis: str, series_axis: str | None) -> str:
    """A size sweep: one line per series, the interval as error bars; log x over a wide range."""
    m = METRICS[metric]
    div, unit = _scale(metric, [p.ci.mean for p in points if p.ci])
    fig = _figure(7.5, 3.2)
    ax = fig.add_subplot()
    _style(ax)
    xs_all = sorted({p.x for p in points if p.x is not None})
    for si, name in enumerate(series):
        pts = sorted((p for p in points if p.hue == name and p.ci is not None and p.x is not None),
                     key=lambda p: p.x)
        if not pts:
            continue
        ax.errorbar([p.x for p in pts], [p.ci.mean / div for p in pts],
                    yerr=[(p.ci.half_width or 0) / div for p in pts], marker="o", markersize=4, capsize=3,
                    linewidth=1.4, color=PALETTE[si % len(PALETTE)], label=name)
    if xs_all and xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 16:
        ax.set_xscale("log", base=2)
    if xs_all:
        ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all], fontsize=8)
        ax.minorticks_off()
    ax.set_xlabel(x_axis, fontsize=8)
    ax.set_ylabel(f"{m.label} ({unit})" if unit else m.label, fontsize=8)
    ax.set_ylim(bottom=0)
    if len(series) > 1:
        ax.legend(title=series_axis, fontsize=8, title_fontsize=8, frameon=False,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return to_svg(fig)


def cpu_stacked(rows: list[tuple[str, dict[str, dict[str, float]]]]) -> str:
    """Per cell, per side (client | server): mean CPU % split into user/system/softirq/irq."""
    sides = [s for s in ("client", "server") if any(s in split for _, split in rows)]
    fig = _figure(9.0, 0.9 + 0.26 * len(rows))
    axes = fig.subplots(1, len(sides), sharey=True, squeeze=False)[0]
    labels = [label for label, _ in rows]
    ys = list(range(len(rows)))
    for ax, side in zip(axes, sides, strict=True):
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        left = [0.0] * len(rows)
        for part, colour in CPU_PARTS:
            widths = [split.get(side, {}).get(part, 0.0) for _, split in rows]
            ax.barh(ys, widths, left=left, color=colour, height=0.7, label=part)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_xlim(0, 100)
        ax.set_title(f"{side} CPU (% of its pinned CPU)", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.set_xlabel("%", fontsize=8)
    axes[0].set_yticks(ys, labels, fontsize=8)
    axes[0].invert_yaxis()
    axes[-1].legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return to_svg(fig)


def _bin_low(label: str) -> int:
    try:
        return int(label.split("-")[0])
    except ValueError:
        return 0


def _tint(hex_colour: str, strength: float) -> tuple[float, float, float]:
    """hex_colour mixed with white: strength 0 → white, 1 → the colour."""
    r, g, b = (int(hex_colour[k:k + 2], 16) / 255 for k in (1, 3, 5))
    return (1 - strength * (1 - r), 1 - strength * (1 - g), 1 - strength * (1 - b))


def frame_histograms(captures: list[tuple[str, dict]]) -> str:
    """Frame-length histograms as one grid: a row per cell, a column per length bin, shade and figure
    = % of the captured frames. Bins beyond that cell's MTU + 14 are orange (super-packets)."""
    from matplotlib.patches import Rectangle

    bins = sorted({b for _, c in captures for b, _ in c.get("histogram") or []}, key=_bin_low)
    fig = _figure(min(11.0, 2.8 + 0.85 * len(bins)), 0.9 + 0.3 * len(captures))
    ax = fig.add_subplot()
    for row, (_, cap) in enumerate(captures):
        counts = dict((b, n) for b, n in cap.get("histogram") or [])
        total = sum(counts.values()) or 1
        limit = (cap.get("mtu") or 0) + ETH_HEADER
        for col, b in enumerate(bins):
            pct = 100.0 * counts.get(b, 0) / total
            over = bool(limit) and _bin_low(b) > limit
            strength = 0.06 + 0.94 * pct / 100 if pct > 0 else 0.03
            ax.add_patch(Rectangle((col, row), 1, 1, facecolor=_tint("#D55E00" if over else "#0072B2", strength),
                                   edgecolor="white", linewidth=1.5))
            if pct > 0:
                ax.text(col + 0.5, row + 0.5, f"{pct:.0f} %" if pct >= 1 else "<1 %", ha="center", va="center",
                        fontsize=7.5, color="white" if strength > 0.55 else "#1d1d1f")
    ax.set_xlim(0, len(bins))
    ax.set_ylim(len(captures), 0)
    ax.set_xticks([i + 0.5 for i in range(len(bins))], bins, fontsize=7.5)
    ax.set_yticks([i + 0.5 for i in range(len(captures))], [label for label, _ in captures], fontsize=8)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("frame length (bytes): % of the captured frames", fontsize=8)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return to_svg(fig)


# Panels of the over-time chart: (label, unit, columns drawn as (column, style)). A panel is drawn when
# a series of the cell has one of its columns.
SERIES_PANELS = (
    ("throughput", "bit/s", (("bps", "-"),)),
    ("datagrams per second", "pps", (("pps", "-"),)),
    ("transactions per second", "tps", (("tps", "-"),)),
    ("round trip", "µs", (("rtt_p50_us", "-"), ("rtt_p99_us", "--"), ("rtt_max_us", ":"))),
)
# Points per line at most: longer series are averaged over consecutive intervals (the caption says so).
SERIES_POINTS = 600


def _thin(xs: list[float], ys: list[float | None], n: int) -> tuple[list[float], list[float | None], int]:
    """At most `n` points: means over groups of consecutive intervals; the group size."""
    if len(xs) <= n:
        return xs, ys, 1
    k = -(-len(xs) // n)
    ox, oy = [], []
    for i in range(0, len(xs), k):
        got = [y for y in ys[i:i + k] if y is not None]
        ox.append(xs[i])
        oy.append(sum(got) / len(got) if got else None)
    return ox, oy, k


def over_time(rounds: list[tuple[str, Series]], sent: list[tuple[str, Series | None]] | None = None
              ) -> tuple[str, int]:
    """One cell's per-interval series, a line per round (overlaid), a panel per figure (throughput, pps,
    transactions/s, RTT p50/p99/max); the warm-up (t < 0) shaded. `sent`: the sender's series of the same
    rounds (same order), drawn dotted in the round's colour on the rate panels, so loss shows as a gap.
    The SVG and the intervals per point."""
    sent = sent or []
    panels = []
    for label, unit, cols in SERIES_PANELS:
        present = [(c, style) for c, style in cols if any(c in s.columns for _, s in rounds)]
        if present:
            panels.append((label, unit, present))
    fig = _figure(9.0, 0.6 + 1.7 * max(1, len(panels)))
    axes = fig.subplots(max(1, len(panels)), 1, sharex=True, squeeze=False)[:, 0]
    grouped = 1
    t_min = min((r[s.columns.index("t_s")] for _, s in rounds for r in s.rows), default=0.0)
    for ax, (label, unit, cols) in zip(axes, panels, strict=True):
        _style(ax)
        values = [r[s.columns.index(c)] for _, s in rounds + [x for x in sent if x[1]] for c, _ in cols
                  if c in s.columns for r in s.rows if r[s.columns.index(c)] is not None]
        div, prefix = 1.0, ""
        if unit in ("bit/s", "pps", "tps"):
            top = max(values, default=0)
            div, prefix = next(((d, p) for d, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if top >= d), (1.0, ""))
        lines = [(ri, name, s, None) for ri, (name, s) in enumerate(rounds)]
        if len(cols) == 1:
            lines += [(ri, f"{name} sent", s, ":") for ri, (name, s) in enumerate(sent) if s]
        for ri, name, s, dotted in lines:
            colour = PALETTE[ri % len(PALETTE)]
            ti = s.columns.index("t_s")
            for c, style in cols:
                style = dotted or style
                if c not in s.columns:
                    continue
                ci = s.columns.index(c)
                di = s.columns.index("dur_s") if "dur_s" in s.columns else None
                iv = s.interval_s or 0
                # A rate over a sliver (the clipped last interval) is noise, not a stall: not drawn.
                rows = [r for r in s.rows if not (unit in ("bit/s", "pps", "tps") and di is not None
                                                      and r[di] is not None and r[di] < iv / 2)]
                xs = [r[ti] for r in rows]
                ys = [None if r[ci] is None else r[ci] / div for r in rows]
                xs, ys, k = _thin(xs, ys, SERIES_POINTS)
                if rows and di is not None and rows[-1][di]:
                    xs, ys = xs + [rows[-1][ti] + rows[-1][di]], ys + [ys[-1]]  # the last step has a width
                grouped = max(grouped, k)
                tag = c.removeprefix("rtt_").removesuffix("_us")
                ax.plot(xs, [float("nan") if y is None else y for y in ys], linestyle=style, linewidth=1.1,
                        color=colour, drawstyle="steps-post",
                        label=f"{name} {tag}" if len(cols) > 1 else name)
        if t_min < 0:
            ax.axvspan(t_min, 0, color="#eeeeee", zorder=0)
        ax.set_ylabel(f"{label}\n({prefix}{unit})", fontsize=8)
        ax.set_ylim(bottom=0)
        if len(lines) > 1 or len(cols) > 1:
            ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1].set_xlabel("seconds from the start of the measured window (shaded: warm-up)", fontsize=8)
    return to_svg(fig), grouped


def sparkline(means: list[float], lows: list[float | None], highs: list[float | None],
              groups: list[tuple[int, int]], mark: int | None = None, width: int = 260, height: int = 56) -> str:
    """A plan's history in one small SVG, drawn by hand (no axes: the table beside it has the figures): each
    run's mean as a dot with its interval, each group's mean as a line over its runs, a dashed line where a
    group begins (a change point), and the run `mark` (this report's) ringed."""
    tops = [h if h is not None else m for m, h in zip(means, highs, strict=True)]
    bottoms = [lo if lo is not None else m for m, lo in zip(means, lows, strict=True)]
    top, bottom = max(tops + [0.0]), min(bottoms + [0.0])
    span = (top - bottom) or 1.0
    pad = 6.0
    step = (width - 2 * pad) / max(1, len(means) - 1)
    x = lambda i: pad + (i * step if len(means) > 1 else (width - 2 * pad) / 2)  # noqa: E731
    y = lambda v: pad + (top - v) / span * (height - 2 * pad)  # noqa: E731
    parts = [f'<svg class="spark" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="0" y1="{y(0):.1f}" x2="{width}" y2="{y(0):.1f}" stroke="#d9d9de" stroke-width="1"/>']
    for g, (a, b) in enumerate(groups):
        level = sum(means[a:b]) / (b - a)
        parts.append(f'<line x1="{x(a) - 3:.1f}" y1="{y(level):.1f}" x2="{x(b - 1) + 3:.1f}" y2="{y(level):.1f}" '
                     f'stroke="{PALETTE[0]}" stroke-width="2" opacity="0.45"/>')
        if g:
            cut = (x(a - 1) + x(a)) / 2
            parts.append(f'<line x1="{cut:.1f}" y1="0" x2="{cut:.1f}" y2="{height}" stroke="#b3261e" '
                         f'stroke-dasharray="3,2" stroke-width="1"/>')
    for i, m in enumerate(means):
        if lows[i] is not None and highs[i] is not None:
            parts.append(f'<line x1="{x(i):.1f}" y1="{y(highs[i]):.1f}" x2="{x(i):.1f}" y2="{y(lows[i]):.1f}" '
                         f'stroke="#6b6b70" stroke-width="1"/>')
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(m):.1f}" r="2.5" fill="#1d1d1f"/>')
        if i == mark:
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(m):.1f}" r="5" fill="none" stroke="{PALETTE[1]}" '
                         f'stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)
