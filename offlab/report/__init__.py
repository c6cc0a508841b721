"""One self-contained HTML file per run: summary with intervals and verdicts, charts as inline
SVG, CPU split, wire captures, skipped cells, environment and plan. Opens offline; no JS."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from offlab import __version__
from offlab.report.compare import (Row, any_compared, axes_of, by_cell, compare_run, difference, emulated, rule_lines,
                                  published_rows, sentence, trade_off)
from offlab.errors import BadInput, EnvironmentProblem
from offlab.metrics import HEADLINE, METRICS, NOT_EXERCISED, TCG_MARK, not_exercised_by_cell
from offlab.report import format as fmt
from offlab.report import kernel
from offlab.sample import (Cpu, CpuAccount, KernelAccount, LossAttribution, SampleRecord, Segment, Series,
                           StoredSample, ZeroLossSearch, records)
from offlab.stats import CI, is_improvement, mean_ci
from offlab.store import Store

# A cell with this status shows why, never figures: what it measured before failing is not a result.
NO_FIGURES = ("failed",)

# Offload features shown in the environment table even when every interface agrees.
OFFLOAD_FEATURES = ("tx-checksumming", "scatter-gather", "tcp-segmentation-offload", "generic-segmentation-offload",
                    "generic-receive-offload", "large-receive-offload", "tx-udp-segmentation", "rx-gro-list",
                    "rx-udp-gro-forwarding", "tx-udp_tnl-segmentation")


@dataclass
class Layout:
    """How cells are placed on charts: a numeric sweep axis (x), a hue axis, and group axes."""

    x: str | None
    hue: str | None
    groups: list[str] = field(default_factory=list)


def _number(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return None


def layout(plan: dict, axes: dict[str, list[str]], baseline: dict | None) -> Layout:
    """x: the axis the plan names (`report: {x: AXIS}`), else the first axis whose ≥ 3 values are all
    numbers (a size sweep). hue: the baseline's axis (on vs off side by side), else the last one left."""
    plan = plan or {}
    named = (plan.get("report") or {}).get("x") or plan.get("x")
    x = named if named in axes else None
    if x is None:
        x = next((a for a, vals in axes.items() if len(vals) >= 3 and all(_number(v) is not None for v in vals)),
                 None)
    rest = [a for a in axes if a != x]
    hue = next((a for a in (baseline or {}) if a in rest), None)
    if hue is None and rest and (x is not None or len(rest) > 1):
        hue = rest[-1]
    if hue is None and len(rest) == 1:
        hue = rest[0]
    return Layout(x, hue, [a for a in rest if a != hue])


def _label(params: dict, axes: list[str]) -> str:
    """"size=64, streams=2"; a lone axis is named on the chart's axis or legend, so just its value."""
    if len(axes) == 1:
        return str(params.get(axes[0]))
    return ", ".join(f"{a}={params.get(a)}" for a in axes) if axes else "all"


def _cell_cis(cells: list[dict], values: dict, metrics: list[str], level: float) -> dict[int, dict[str, CI]]:
    out = {}
    for c in cells:
        vals = values.get(c["id"], {}) if c["status"] not in NO_FIGURES else {}
        out[c["id"]] = {m: mean_ci(vals[m], level) for m in metrics if vals.get(m)}
    return out


def _metric_charts(cells, cis, metrics, lay: Layout) -> list[dict]:
    from offlab.report import charts

    out = []
    for metric in metrics:
        points = []
        for c in cells:
            p = {k: str(v) for k, v in c["params"].items()}
            ci = cis[c["id"]].get(metric)
            note = c["status"] if c["status"] in ("skipped", *NO_FIGURES) else (None if ci else "no data")
            if ci is None and note == "no data" and c["n_samples"]:
                continue  # the metric does not apply to this cell (pps of TCP)
            hue = p.get(lay.hue, "") if lay.hue else ""
            if lay.x:
                series = _label(p, ([lay.hue] if lay.hue else []) + lay.groups)
                points.append(charts.Point(group="", hue=series, ci=ci, x=_number(p.get(lay.x)), note=note))
            else:
                points.append(charts.Point(group=_label(p, lay.groups), hue=hue, ci=ci, note=note))
        if not any(pt.ci for pt in points):
            continue
        if lay.x:
            series = list(dict.fromkeys(pt.hue for pt in points))
            svg = charts.lines(metric, points, series, lay.x, ", ".join(([lay.hue] if lay.hue else []) + lay.groups))
            kind = f"{METRICS[metric].label} against {lay.x}"
        else:
            groups = list(dict.fromkeys(pt.group for pt in points))
            hues = list(dict.fromkeys(pt.hue for pt in points))
            svg = charts.bars(metric, points, groups, hues, lay.hue, ", ".join(lay.groups) or None)
            kind = METRICS[metric].label
        out.append({"metric": metric, "title": kind, "unit": METRICS[metric].unit, "svg": svg})
    return out


def _cpu_split(cells: list[dict], samples: list[SampleRecord]) -> list[tuple[str, dict]]:
    """(cell key, {side: {part: mean %}}) for cells with CPU figures."""
    per_cell: dict[int, list[CpuAccount]] = {}
    shown = {c["id"] for c in cells if c["status"] not in NO_FIGURES}
    for s in samples:
        if s.cell_id not in shown:
            continue
        cpu = (s.sample or StoredSample()).probes.cpu
        per_cell.setdefault(s.cell_id, []).append(cpu if isinstance(cpu, CpuAccount) else CpuAccount())
    out = []
    for c in cells:
        cpus = per_cell.get(c["id"])
        if not cpus:
            continue
        split = {}
        for side in ("client", "server"):
            got = [g for g in (cpu.side(side) for cpu in cpus) if isinstance(g, Cpu)]
            if got:
                split[side] = {part: sum(getattr(g, part) or 0.0 for g in got) / len(got)
                               for part in ("user", "system", "softirq", "irq", "busy")}
        if split:
            out.append((c["key"], split))
    return out


def _captures(cells: list[dict], samples: list[SampleRecord]) -> list[dict]:
    """The first capture of each cell (the wire does not change between rounds of one cell), as the
    report's template and frame histograms take it (the stored capture, with the round)."""
    first: dict[int, dict] = {}
    shown = {c["id"] for c in cells if c["status"] not in NO_FIGURES}
    for s in samples:
        cap = (s.sample or StoredSample()).capture if s.cell_id in shown else None
        if cap and s.cell_id not in first:
            first[s.cell_id] = {**cap.to_json(), "round": s.round}
    return [{"cell": c["key"], **first[c["id"]]} for c in cells if c["id"] in first]


# Cells drawn over time at most; the rest are listed as not drawn (the rows stay in the database).
MAX_SERIES_CHARTS = 40


def _series_of(sample: StoredSample | None) -> list[tuple[str, Series, Series | None]]:
    """(part, series, sender's series or None) for each part of a sample that has per-interval series: its
    first one (the receiver's for an engine stream, the client's for rr), and the engine sender's beside it.
    The series stay in their stored columnar shape: the charts draw that."""
    out = []
    for part, series in sample.series_parts() if sample else []:
        drawn = [s for s in series if isinstance(s, Series) and s.rows and "t_s" in (s.columns or [])]
        if drawn:
            sent = next((s for s in drawn[1:] if str(s.source).endswith(" tx")), None)
            out.append((part, drawn[0], sent))
    return out


def _series_charts(cells: list[dict], samples: list[SampleRecord]) -> dict:
    """Per cell (and part), every round's series overlaid: the charts, and the cells left undrawn."""
    from offlab.report import charts

    per_cell: dict[tuple[int, str], list[tuple[str, Series, Series | None]]] = {}
    for s in samples:
        for part, series, sent in _series_of(s.sample):
            per_cell.setdefault((s.cell_id, part), []).append((f"round {s.round}", series, sent))
    out, undrawn = [], []
    for c in cells:
        for (cid, part), rounds in per_cell.items():
            if cid != c["id"]:
                continue
            if len(out) >= MAX_SERIES_CHARTS:
                undrawn.append(c["key"])
                continue
            svg, grouped = charts.over_time([(n, s) for n, s, _ in rounds], [(n, t) for n, _, t in rounds])
            first = rounds[0][1]
            every = first.interval_s
            source = first.source if first.has("source") else "?"
            out.append({"cell": c["key"], "part": part, "svg": svg, "source": source,
                        "interval": f"{every * 1000:g} ms" if every else "its own interval",
                        "grouped": grouped, "rounds": len(rounds),
                        "sent": any(t for _, _, t in rounds),
                        "dropped": sum(s.intervals_dropped or 0 for _, s, _ in rounds)})
    return {"charts": out, "undrawn": list(dict.fromkeys(undrawn))}


def _walk_interfaces(obj, path: tuple = ()) -> list[tuple[str, dict]]:
    """(host:iface, interface dict) for every interface dict with a `features` map in env."""
    found = []
    if isinstance(obj, dict):
        if isinstance(obj.get("features"), dict) and "name" in obj:
            host = next((p for p in reversed(path) if p not in ("interfaces", "hosts") and not isinstance(p, int)),
                        "")
            found.append((f"{host}:{obj['name']}" if host else str(obj["name"]), obj))
        for k, v in obj.items():
            if k != "features":
                found += _walk_interfaces(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _walk_interfaces(v, path + (i,))
    return found


def offload_table(env: dict, plan_text: str) -> dict | None:
    """Feature × interface on/off table from the environment snapshot ("fixed" marked)."""
    ifaces = _walk_interfaces(env)
    if not ifaces:
        return None
    names = list(dict.fromkeys(f for _, i in ifaces for f in i["features"]))
    differs = {f for f in names if len({i["features"].get(f) for _, i in ifaces}) > 1}
    keep = [f for f in names if f in OFFLOAD_FEATURES or f in differs or f in (plan_text or "")] \
        if len(names) > 25 else names
    rows = []
    for f in keep:
        cells = []
        for _, i in ifaces:
            v = i["features"].get(f)
            fixed = f in (i.get("fixed") or [])
            text = "–" if v is None else ("on" if v else "off")
            cells.append({"text": text + (" [fixed]" if fixed else ""), "on": bool(v), "fixed": fixed})
        rows.append({"feature": f, "cells": cells})
    return {"interfaces": [n for n, _ in ifaces], "rows": rows,
            "mtus": [i.get("mtu") for _, i in ifaces]}


def env_text(v) -> str:
    """A fact as people read it: on/off for flags, "not recorded" for a missing value, never Python's words."""
    if v is None:
        return "not recorded"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


# Facts that have a section of their own (the plan) or a table of their own (interfaces, offloads).
ENV_ELSEWHERE = ("plan_text", "plan", "hosts", "interfaces", "features")


def env_items(env: dict) -> list[tuple[str, str]]:
    """Scalar facts of the environment as (dotted.key, value); interface lists stay in the offload table
    and the plan in its own section."""
    out = []

    def walk(obj, prefix: str, depth: int) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in ENV_ELSEWHERE and (depth == 0 or isinstance(v, (dict, list))):
                    continue
                walk(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
        elif isinstance(obj, list):
            if all(not isinstance(v, (dict, list)) for v in obj):
                if obj:
                    out.append((prefix, ", ".join(env_text(v) for v in obj)))
            elif depth < 3:
                for i, v in enumerate(obj):
                    walk(v, f"{prefix}[{i}]", depth + 1)
        else:
            out.append((prefix, env_text(obj)))

    walk(env or {}, "", 0)
    return out


def env_groups(env: dict) -> list[dict]:
    """The environment's facts grouped by their first key (machine, versions, sysctls, each lab)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for key, value in env_items(env):
        head, dot, rest = key.partition(".")
        if not dot:
            groups.setdefault("machine", []).append((key, value))
        else:
            groups.setdefault(head, []).append((rest, value))
    return [{"title": title, "items": items} for title, items in groups.items()]


@dataclass
class SearchRow:
    """One searched sample's zero-loss search, as the report and `results show` give it: its cell, its round
    and the loss criterion, beside the search as stored."""

    cell: str
    round: int
    criterion: str  # "≤ 0.1 % loss"
    search: ZeroLossSearch


def searches(cells: list[dict], samples: list[SampleRecord]) -> list[SearchRow]:
    """Zero-loss search results, one per searched sample: the headline sentence and its trials."""
    keys = {c["id"]: c["key"] for c in cells}
    status = {c["id"]: c["status"] for c in cells}
    order = {c["id"]: i for i, c in enumerate(cells)}
    out = []
    for s in sorted(samples, key=lambda s: (order.get(s.cell_id, 0), s.round, s.id)):
        z = (s.sample or StoredSample()).search
        if z is None or z.empty or status.get(s.cell_id) in NO_FIGURES:
            continue
        out.append(SearchRow(keys.get(s.cell_id, "?"), s.round, f"≤ {100 * z.max_loss:g} % loss", z))
    return out


def losses(cells: list[dict], samples: list[SampleRecord]) -> list[LossAttribution]:
    """Per cell with lost datagrams, where they died: its samples' attributions summed (`cell`: its key)."""
    per_cell: dict[int, list[LossAttribution]] = {}
    for s in samples:
        la = _attribution(s.sample or StoredSample())
        if la:
            per_cell.setdefault(s.cell_id, []).append(la)
    out = []
    for c in cells:
        merged = fmt.merge_attributions(per_cell.get(c["id"], [])) if c["status"] not in NO_FIGURES else None
        if merged:
            merged.cell = c["key"]
            out.append(merged)
    return out


def kernel_accounts(cells: list[dict], samples: list[SampleRecord]) -> dict[str, kernel.CellKernelAccount]:
    """Per cell key whose samples took the kernel's account (`--trace`): their accounts summed
    (offlab.report.kernel.merge); cells without one are absent."""
    per_cell: dict[int, list[KernelAccount]] = {}
    for s in samples:
        ka = (s.sample or StoredSample()).kernel_account
        if ka is not None and not ka.empty:
            per_cell.setdefault(s.cell_id, []).append(ka)
    out = {}
    for c in cells:
        merged = kernel.merge(per_cell.get(c["id"], [])) if c["status"] not in NO_FIGURES else None
        if merged is not None:
            out[c["key"]] = merged
    return out


def _attribution(sample: StoredSample) -> LossAttribution | None:
    """The sample's loss attribution as stored; one stored by an offlab that counted a GRO packet as a
    datagram and took the loss over the tool's whole run says so (offlab.report.format.OLDER_ATTRIBUTION)."""
    la = sample.loss_attribution
    if la and la.lost_over is None:
        la = dataclasses.replace(la, unread=[*la.unread, fmt.OLDER_ATTRIBUTION])
    return la


@dataclass
class CellSegments:
    """A cell's segmentation by counters: the hops of its first sample that has them."""

    cell: str
    hops: list[Segment]


def segmentations(cells: list[dict], samples: list[SampleRecord]) -> list[CellSegments]:
    """Per cell, the segmentation lines of its first sample that has them (packets vs bytes per hop), as stored."""
    first: dict[int, list[Segment]] = {}
    for s in samples:
        seg = (s.sample or StoredSample()).segmentation
        if seg and s.cell_id not in first:
            first[s.cell_id] = seg
    return [CellSegments(c["key"], first[c["id"]]) for c in cells
            if c["id"] in first and c["status"] not in NO_FIGURES]


def footnoted(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Long flags of the comparison rows become numbered footnotes, so no note widens a column."""
    notes: list[str] = []

    def ref(text: str) -> int:
        if text not in notes:
            notes.append(text)
        return notes.index(text) + 1

    for r in rows:
        r["notes"] = [ref(f) for f in r.pop("flags")]
        for c in r["cells"]:
            if c and c["flags"]:
                c["notes"] = [ref(f) for f in c["flags"].split("; ")]
            elif c:
                c["notes"] = []
    return rows, notes


def _comparison_matrix(rows: list[Row], metrics: list[str]) -> dict:
    """Compared cells × metrics: change with its interval, coloured by verdict; cell-wide flags once."""
    out = []
    for group in by_cell(rows):
        r0 = group[0]
        if not any_compared(group):
            continue
        if r0.run != r0.baseline_run:
            mine, theirs, shared = f"run {r0.run}", f"run {r0.baseline_run}", r0.cell
        else:
            mine, theirs, shared = difference(r0.params, r0.baseline_params)
        # The TCG mark is the report's banner, once, not a flag on every row.
        common = [f for f in r0.flags if all(f in r.flags for r in group) and f != TCG_MARK]
        by_metric = {r.metric: r for r in group}
        cells = []
        for m in metrics:
            r = by_metric.get(m)
            if r is None or not r.compared:
                cells.append(None)
                continue
            text = fmt.change(r)
            main, _, interval = text.partition(" [")
            cells.append({
                "main": main, "interval": f"[{interval}" if interval else "",
                "tone": {True: "good", False: "bad"}.get(is_improvement(r.verdict), "neutral"),
                "title": f"{fmt.value(m, r.mean_baseline)} (n={r.n_baseline}) → {fmt.value(m, r.mean_cell)} "
                         f"(n={r.n_cell}): {r.verdict}",
                "verdict": r.verdict,
                "flags": "; ".join(f for f in r.flags if f not in common and f != TCG_MARK),
            })
        both = trade_off(group)
        versions = [f"on other versions: {'; '.join(r0.versions)}"] if r0.versions else []
        out.append({"cell": r0.cell, "baseline": r0.baseline, "mine": mine, "theirs": theirs, "shared": shared,
                    "flags": versions + common + ([both] if both else []), "cells": cells})
    rows, notes = footnoted(out)
    return {"metrics": [fmt.short(m) for m in metrics], "rows": rows, "notes": notes}


# Series of a plan's history drawn at most; the rest are named (`offlab results trend` shows every one).
MAX_HISTORY_SERIES = 24


def _history(store: Store, run: dict, metrics: list[str]) -> dict | None:
    """The plan's history (every run of the same name), each cell's metric as a small chart with its change
    points and the environment difference across each; None when the plan has run once."""
    from offlab.report import charts, envdiff, trend

    if not metrics or sum(r["name"] == run["name"] for r in store.list_runs()) < 2:
        return None
    found = trend.trend(store, run["name"], metrics=metrics)
    rows = []
    for s in found.series[:MAX_HISTORY_SERIES]:
        runs = [p.run for p in s.points]
        rows.append({
            "cell": s.cell, "metric": fmt.short(s.metric), "runs": len(s.points),
            "svg": charts.sparkline([p.ci.mean for p in s.points], [p.ci.low for p in s.points],
                                    [p.ci.high for p in s.points], s.groups,
                                    runs.index(run["id"]) if run["id"] in runs else None),
            "first": fmt.value(s.metric, s.points[0].ci.mean), "last": fmt.value(s.metric, s.points[-1].ci.mean),
            "changes": [{"run_before": c.run_before, "run_after": c.run_after,
                         "step": f"{fmt.value(s.metric, c.before)} → {fmt.value(s.metric, c.after)}"
                                 + ("" if c.relative is None else f" ({fmt.signed(100 * c.relative)} %)"),
                         "groups": f"means of {c.runs_before} and {c.runs_after} runs",
                         "view": c.environment.view,
                         "lines": envdiff.lines(c.environment, limit=10)[1:] + c.environment.missing}
                        for c in s.changes]})
    return {"plan": found.plan, "runs": len(found.runs), "method": trend.METHOD, "rows": rows,
            # named, not flagged again: the run's own banner carries the TCG mark once per report
            "tcg": f"emulated guests in this history: {'; '.join(found.emulated)}" if found.emulated else None,
            "undrawn": [f"{s.cell} · {fmt.short(s.metric)}" for s in found.series[MAX_HISTORY_SERIES:]]}


def build_report(store: Store, run_id: int, *, baseline: dict | None = None,
                 metrics: tuple[str, ...] = HEADLINE) -> str:
    """The report of one run as HTML text."""
    run = store.get_run(run_id)
    level = (run.get("repeat") or {}).get("level") or 99
    width = (run.get("repeat") or {}).get("width")
    cells = store.cells(run_id)
    values = store.cell_metrics(run_id)
    samples = records(store.samples(run_id))
    present = [m for m in metrics if any(values.get(c["id"], {}).get(m) for c in cells)]
    cis = _cell_cis(cells, values, present, level)
    axes = axes_of(cells)
    base = baseline or run.get("baseline")
    rows, compare_error = [], None
    if base:
        try:
            rows = compare_run(store, run_id, baseline=base, metrics=present or metrics)
        except BadInput as exc:
            if baseline:
                raise
            compare_error = str(exc)
    lay = layout(run.get("plan") or {}, axes, base)

    cell_table = []
    for c in cells:
        ci_map = cis[c["id"]]
        thr = ci_map.get("throughput_bps")
        cell_table.append({
            "key": c["key"], "status": c["status"], "reason": c["reason"], "n": c["n_samples"],
            "values": None if c["status"] in NO_FIGURES else [fmt.ci(m, ci_map.get(m)) for m in present],
            "width_pct": None if thr is None or thr.width_pct is None else f"{thr.width_pct:.1f} %",
            "settings": c["settings"],
        })
    captures = _captures(cells, samples)
    cpu = _cpu_split(cells, samples)
    charts_ctx = {"metrics": [], "cpu": None, "frames": None, "series": _series_charts(cells, samples)}
    if present:
        charts_ctx["metrics"] = _metric_charts(cells, cis, present, lay)
    if cpu:
        from offlab.report import charts

        charts_ctx["cpu"] = charts.cpu_stacked(cpu)
    if captures:
        from offlab.report import charts

        charts_ctx["frames"] = charts.frame_histograms([(c["cell"], c) for c in captures])
    env = run.get("env") or {}
    published = published_rows(store, run_id)
    unexercised = not_exercised_by_cell(samples)
    context = {
        "run": run, "level": level, "width": width, "version": __version__,
        "emulated": emulated(run, samples), "tcg_mark": TCG_MARK,
        # cells whose effect witnesses found a setting set but not exercised, under the title like the TCG mark
        "not_exercised": [{"cell": c["key"], "line": unexercised[c["id"]]} for c in cells if c["id"] in unexercised],
        "not_exercised_mark": NOT_EXERCISED,
        "counts": {
            "cells": len(cells), "samples": len(samples),
            "done": sum(c["status"] == "done" for c in cells),
            "skipped": sum(c["status"] == "skipped" for c in cells),
            "unconfident": sum(c["status"] == "confidence_not_reached" for c in cells),
            "failed": sum(c["status"] == "failed" for c in cells),
        },
        "baseline": base, "baseline_text": ",".join(f"{k}={v}" for k, v in (base or {}).items()),
        "compare_error": compare_error,
        "sentences": [sentence(g) for g in by_cell(rows) if any_compared(g)],
        "comparison": _comparison_matrix(rows, present),
        "rules": rule_lines(rows + published),
        "metric_labels": [fmt.short(m) for m in present],
        "cell_table": cell_table,
        "axes": axes, "layout": lay,
        "charts": charts_ctx,
        "captures": captures,
        "skipped": [c for c in cells if c["status"] == "skipped"],
        "unconfident": [c for c in cells if c["status"] == "confidence_not_reached"],
        "failed": [c for c in cells if c["status"] == "failed"],
        "unmeasured": [c for c in cells if c["status"] in ("pending", "running") and not c["n_samples"]],
        "env_groups": env_groups(env),
        "searches": searches(cells, samples),
        "losses": losses(cells, samples),
        "kernel": kernel_accounts(cells, samples),
        "segmentations": segmentations(cells, samples),
        "offloads": offload_table(env, run.get("plan_text") or ""),
        "history": _history(store, run, present),
        "published": [{"cell": r.cell, "baseline": r.baseline, "metric": fmt.short(r.metric),
                       "ours": fmt.change(r) if r.compared else "–", "verdict": r.verdict, "theirs": r.published,
                       "rule": r.rule}
                      for r in published],
    }
    context["bisect"] = bisect_section(store.bisect_of_run(run_id), run_id)
    return _render(context)


def bisect_section(b: dict | None, run_id: int) -> dict | None:
    """A run that is a step of `offlab bisect`: the bisect's question, its steps (this run's marked) and where
    it ended, as the report's small section."""
    if b is None:
        return None
    spec, result = b["spec"], b["result"] or {}
    steps = [{"release": s["release"], "suite": s["suite"], "verdict": s["verdict"] or "not decided yet",
              "run_id": s["run_id"], "this": s["run_id"] == run_id} for s in b["steps"]]
    if result.get("kind") == "found":
        end = (f"first release where the verdict changes: {result['hi']['abi']} ({result['hi']['verdict']}); "
               f"before it {result['lo']['abi']} ({result['lo']['verdict']})")
    elif result:
        end = b["note"] or ""
    else:
        end = f"{b['status']}: {b['note'] or 'not finished'}"
    return {"id": b["id"], "question": f"{spec['cell']} vs {spec['baseline']} on {fmt.short(spec['metric'])}, "
                                       f"--good {spec['good']} --bad {spec['bad']}, {len(spec['releases'])} releases",
            "steps": steps, "end": end}


def _render(context: dict) -> str:
    import jinja2

    loader = jinja2.PackageLoader("offlab.report", "templates")
    env = jinja2.Environment(loader=loader, autoescape=jinja2.select_autoescape(["html", "j2"]),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["cls"] = lambda s: "".join(ch if ch.isalnum() else "-" for ch in str(s))
    env.globals["loss_percents"] = fmt.loss_percents
    env.globals["kernel_percents"] = kernel.loss_percents
    env.globals["kernel_place"] = kernel.place_name
    env.globals["kernel_loss_lines"] = kernel.loss_lines
    env.globals["kernel_segmentation_lines"] = kernel.segmentation_lines
    env.globals["kernel_unavailable_lines"] = kernel.unavailable_lines
    return env.get_template("report.html.j2").render(**context)


def write_report(store: Store, run_id: int, out: str | Path, *, baseline: dict | None = None) -> Path:
    """Build the report of `run_id` and write it to `out`; the path written."""
    text = build_report(store, run_id, baseline=baseline)
    out = Path(out).expanduser()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write report {out}: {exc.strerror} (choose another -o PATH)") from exc
    return out

