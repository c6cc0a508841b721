"""Every cell as a ratio to its baseline cell, with one interval and one verdict per comparison.

One rule per context, named once wherever the rows are shown (`rule_lines`): in a run that repeated its
comparisons until decided, every metric is judged by the sequential decision the runner stopped on
(offlab.stats.replay over the pairs measured in the same round), so the headline line, the
published-ratio line, `compare`, `results show` and the report cannot disagree; in a run repeated to a
width, and for two runs against each other (no rounds to pair), by Fieller's interval on unpaired samples.

A run's baseline is a partial assignment of axis values, e.g. {"offload": "off"} in a run with
axes payload × offload: each cell is compared with the cell that has offload=off and the same
values on every other axis, so each payload compares on against off.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from offlab import stats
from offlab.errors import BadInput
from offlab.metrics import HEADLINE, METRICS, NOT_EXERCISED, TCG_MARK, not_exercised_by_cell
from offlab.report.envdiff import cell_versions, version_changes
from offlab.sample import SampleRecord, StoredSample, records
from offlab.store import Store

# Verdicts of rows that could not be compared (beside the statistical ones in offlab.stats).
SKIPPED = "skipped"
FAILED = "failed"
BASELINE_FAILED = "baseline failed"
NOT_MEASURED = "not measured"
BASELINE_SKIPPED = "baseline skipped"
BASELINE_NOT_MEASURED = "baseline not measured"
NO_BASELINE_CELL = "no baseline cell"
MISSING = "missing in one run"

STAT_VERDICTS = (stats.FASTER, stats.SLOWER, stats.LOWER, stats.HIGHER, stats.NO_DIFFERENCE, stats.UNDETERMINED,
                 stats.EQUIVALENT)

# The rules a row's interval and verdict come from (Row.rule), each described once by rule_lines.
SEQUENTIAL = "sequential"
FIELLER = "fieller"

# fail_if_slower looks at these unless told otherwise: the rates, where "slower" means what it says.
RATE_METRICS = tuple(name for name, m in METRICS.items() if m.better == "higher")


@dataclass
class Row:
    """One metric of one cell against its baseline (another cell, or the same key in another run)."""

    cell: str
    baseline: str | None
    metric: str
    label: str
    unit: str
    better: str
    level: float
    n_baseline: int = 0
    mean_baseline: float | None = None
    n_cell: int = 0
    mean_cell: float | None = None
    ratio: float | None = None  # mean_cell / mean_baseline
    low: float | None = None  # Fieller interval on the ratio
    high: float | None = None
    change_pct: float | None = None  # 100 · (ratio − 1), e.g. +49.2
    change_low_pct: float | None = None
    change_high_pct: float | None = None
    diff: float | None = None  # mean_cell − mean_baseline, with Welch's interval
    diff_low: float | None = None
    diff_high: float | None = None
    verdict: str = stats.UNDETERMINED
    improved: bool | None = None  # True good news, False bad news, None neither
    flags: list[str] = field(default_factory=list)
    cell_status: str | None = None
    cell_reason: str | None = None
    baseline_status: str | None = None
    baseline_reason: str | None = None
    run: int | None = None
    baseline_run: int | None = None
    params: dict = field(default_factory=dict)
    baseline_params: dict = field(default_factory=dict)
    published: str | None = None  # what the plan's source reports for this comparison, e.g. "seed 001: +49 %"
    rule: str = FIELLER  # SEQUENTIAL: the run's own decision (pairs, looks below); FIELLER: unpaired interval
    pairs: int | None = None  # SEQUENTIAL: pairs measured in the same round, up to the deciding look
    looks: int | None = None
    equivalence_pct: float | None = None
    # the guest kernel and QEMU versions that differ between the cell and its baseline, "what: a → b"
    versions: list[str] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        """Whether both sides had values (the verdict is a statistical one)."""
        return self.verdict in STAT_VERDICTS

    def to_dict(self) -> dict:
        return asdict(self)


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """["offload=off", "payload=1472@1500"] → {"offload": "off", "payload": "1472@1500"}."""
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise BadInput(f"--baseline {item!r}: expected AXIS=VALUE, e.g. --baseline offload=off")
        out[k.strip()] = v.strip()
    return out


def _norm(params: dict) -> dict[str, str]:
    return {str(k): str(v) for k, v in params.items()}


def _key(params: dict[str, str]) -> tuple:
    return tuple(sorted(params.items()))


def axes_of(cells: Sequence[dict]) -> dict[str, list[str]]:
    """axis → its values as strings, both in the order the cells first show them."""
    axes: dict[str, list[str]] = {}
    for c in cells:
        for k, v in _norm(c["params"]).items():
            vals = axes.setdefault(k, [])
            if v not in vals:
                vals.append(v)
    return axes


def _check_metrics(metrics: Sequence[str]) -> None:
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise BadInput(f"unknown metric {unknown[0]!r}: one of {', '.join(METRICS)}")


def _cell_unusable(cell: dict, values: dict[str, list[float]], baseline: bool) -> str | None:
    if cell["status"] == "skipped":
        return BASELINE_SKIPPED if baseline else SKIPPED
    if cell["status"] == "failed":  # what it measured before failing is not a figure to compare
        return BASELINE_FAILED if baseline else FAILED
    if not values:
        return BASELINE_NOT_MEASURED if baseline else NOT_MEASURED
    return None


@dataclass
class Sequential:
    """The run's sequential rule (level, equivalence margin, first look) and, per metric, every cell's
    (round, value) history (Store.cell_rounds), read once."""

    store: Store
    run_id: int
    metric: str  # the metric the runner stopped on; every metric is judged by the same rule
    level: float
    equivalence: float | None
    n0: int
    _rounds: dict[str, dict[int, list[tuple[int, float]]]] = field(default_factory=dict)

    def rounds(self, metric: str) -> dict[int, list[tuple[int, float]]]:
        if metric not in self._rounds:
            self._rounds[metric] = self.store.cell_rounds(self.run_id, metric)
        return self._rounds[metric]


def sequential_rule(store: Store, run: dict) -> Sequential | None:
    """The run's sequential rule, when it repeated its comparisons until decided; else None."""
    rep = run.get("repeat") or {}
    until = rep.get("until") or ("decided" if run.get("baseline") else "width")
    if until != "decided" or rep.get("metric") not in METRICS:
        return None
    return Sequential(store, run["id"], rep["metric"], rep.get("level") or 99.0, rep.get("equivalence"),
                      rep.get("min") or 1)


def compare_cells(cell: dict, base: dict | None, cell_values: dict[str, list[float]],
                  base_values: dict[str, list[float]], metrics: Sequence[str], level: float,
                  run: int | None = None, baseline_run: int | None = None,
                  seq: Sequential | None = None) -> list[Row]:
    """Rows for `cell` against `base` (None: no baseline cell exists), one per metric: in a run that
    decided sequentially (`seq`) every metric by that rule, else by Fieller's interval."""
    rows = []
    flags = []
    for c, who in ((cell, "cell"), (base, "baseline")):
        if c is not None and c["status"] == "confidence_not_reached":
            flags.append(f"{who}: confidence not reached")
        if c is not None and c["status"] == "failed":
            flags.append(f"{who}: failed")
    unusable = _cell_unusable(cell, cell_values, False) or (
        NO_BASELINE_CELL if base is None else _cell_unusable(base, base_values, True))
    for name in metrics:
        m = METRICS[name]
        a, b = base_values.get(name, []), cell_values.get(name, [])
        row = Row(cell=cell["key"], baseline=base["key"] if base else None, metric=name, label=m.label,
                  unit=m.unit, better=m.better, level=level, n_baseline=len(a), n_cell=len(b),
                  flags=list(flags), cell_status=cell["status"], cell_reason=cell.get("reason"),
                  baseline_status=base["status"] if base else None,
                  baseline_reason=base.get("reason") if base else None, run=run, baseline_run=baseline_run,
                  params=cell["params"], baseline_params=base["params"] if base else {})
        if unusable:
            row.verdict = unusable
            rows.append(row)
            continue
        if not a and not b:
            continue  # the metric does not apply here (pps of a TCP cell)
        if not a or not b:
            row.flags.append(f"no {name} values in the {'baseline' if not a else 'cell'}")
            rows.append(row)
            continue
        if seq is not None and base is not None:
            rounds = seq.rounds(name)
            _fill_sequential(row, a, b, rounds.get(base["id"], []), rounds.get(cell["id"], []), seq)
        else:
            _fill(row, a, b, level)
        rows.append(row)
    return rows


def _fill_sequential(row: Row, a: list[float], b: list[float], base_hist: list, cell_hist: list,
                     seq: Sequential) -> None:
    """The row as the runner decided it: the running interval and verdict of the same replay."""
    row.rule, row.level, row.equivalence_pct = SEQUENTIAL, seq.level, seq.equivalence
    row.mean_baseline, row.mean_cell = sum(a) / len(a), sum(b) / len(b)
    d = stats.replay(base_hist, cell_hist, seq.n0, seq.level, seq.equivalence, row.better)
    row.pairs = d.n if d is not None and d.decided else len(stats.paired(base_hist, cell_hist)[0])
    row.looks = d.look if d is not None else 0
    if d is None:
        row.flags.append(f"{row.pairs} pair{'' if row.pairs == 1 else 's'} measured in the same round: "
                         f"no look yet (the first comes at {max(seq.n0, stats.MIN_PAIRS)})")
        pa, pb = stats.paired(base_hist, cell_hist)
        if pa:  # the pairs' ratio so far, with no interval: the rule has not looked, the verdict stays undetermined
            row.ratio = stats.paired_ratio_ci(pa, pb).ratio
            row.change_pct = None if row.ratio is None else 100.0 * (row.ratio - 1.0)
        return
    if d.ratio is None:
        row.flags.append("a value ≤ 0 on a side: no paired ratio (a difference is not what this rule decides)")
    row.ratio, row.low, row.high = d.ratio, d.low, d.high
    if d.ratio is not None:
        row.change_pct = 100.0 * (d.ratio - 1.0)
    if d.low is not None and d.high is not None:
        row.change_low_pct, row.change_high_pct = 100.0 * (d.low - 1.0), 100.0 * (d.high - 1.0)
    row.verdict = d.verdict if d.decided else stats.UNDETERMINED
    row.improved = stats.is_improvement(row.verdict)


def rule_lines(rows: Sequence[Row]) -> list[str]:
    """Each rule the rows' verdicts come from, named once, with the metrics it judged."""
    out = []
    seq = [r for r in rows if r.rule == SEQUENTIAL]
    if seq:
        r0 = seq[0]
        eq = f"; equivalent when it lies within ±{r0.equivalence_pct:g} %" if r0.equivalence_pct else ""
        labels = ", ".join(dict.fromkeys(r.label for r in seq))
        out.append(f"{labels}: the run's sequential decision — cell/baseline paired by round (geometric mean "
                   f"of the pairs' ratios), the running {r0.level:g} % interval that holds over every look "
                   f"(α/(k(k+1)) spent at look k); faster/slower when it excludes 0 %{eq}; undetermined "
                   f"until a look decides")
    fieller = [r for r in rows if r.rule == FIELLER and r.compared]
    if fieller:
        labels = ", ".join(dict.fromkeys(r.label for r in fieller))
        out.append(f"{labels}: mean(cell)/mean(baseline) − 1 with Fieller's {fieller[0].level:g} % interval on "
                   f"unpaired samples; a verdict only when the interval excludes 0 %")
    return out


def _fill(row: Row, a: list[float], b: list[float], level: float) -> None:
    row.mean_baseline = sum(a) / len(a)
    row.mean_cell = sum(b) / len(b)
    r = stats.ratio_ci(a, b, level)
    d = stats.diff_ci(a, b, level)
    # Every metric offlab compares is ≥ 0, so a ratio below 0 is impossible: Fieller's lower
    # bound is clamped there rather than printed as "−9288 %".
    low = max(r.low, 0.0) if r.low is not None else None
    row.ratio, row.low, row.high = r.ratio, low, r.high
    row.diff, row.diff_low, row.diff_high = d.diff, d.low, d.high
    if r.ratio is not None:
        row.change_pct = 100.0 * (r.ratio - 1.0)
    if low is not None:
        row.change_low_pct, row.change_high_pct = 100.0 * (low - 1.0), 100.0 * (r.high - 1.0)
    row.verdict = stats.verdict(r.ratio, low, r.high, row.better)
    if r.unbounded:
        row.verdict = stats.UNBOUNDED
        row.flags.append("the baseline is not significantly different from 0, so the ratio's interval is "
                         "unbounded")
    if r.ratio is None and d.low is not None:
        # Baseline mean 0 (no loss, no retransmits): no ratio, but the difference still tells.
        row.flags.append("baseline mean is 0: change in absolute terms (diff)")
        row.verdict = stats.verdict_diff(d.diff, d.low, d.high, row.better)
    if min(len(a), len(b)) < 2:
        row.flags.append("fewer than 2 samples: no interval")
    row.improved = stats.is_improvement(row.verdict)


def emulated(run: dict, samples: Sequence[SampleRecord] = ()) -> list[str]:
    """Guests of a run that ran emulated (TCG), as "lab:role (tcg, QEMU v)"; empty if none did.

    From the run's environment (every lab's hosts as `lab show` describes them) and from each
    sample's own record of its guests, so a run whose environment lacks them is still marked.
    """
    found: dict[str, str] = {}
    for lab in ((run.get("env") or {}).get("labs") or []):
        for role, host in (lab.get("hosts") or {}).items():
            g = host.get("guest") or {}
            if g.get("accel") == "tcg":
                found[f"{lab.get('name')}:{role}"] = f"tcg, QEMU {g.get('qemu_version') or '?'}"
    for s in samples:
        sample = s.sample or StoredSample()
        for role, g in (sample.guests or {}).items():
            if g.accel == "tcg":
                found.setdefault(f"{sample.lab}:{role}", f"tcg, QEMU {g.qemu_version or '?'}")
    return [f"{who} ({how})" for who, how in sorted(found.items())]


def _mark_not_exercised(store: Store, rows: list[Row]) -> list[Row]:
    """Flag every row whose cell or baseline cell had a setting set but not exercised (its samples'
    effect witnesses), naming the setting, the counters and the likely cause."""
    lines: dict[tuple[int, str], str] = {}
    for run in {r.run for r in rows} | {r.baseline_run for r in rows}:
        if run is None:
            continue
        keys = {c["id"]: c["key"] for c in store.cells(run)}
        found = not_exercised_by_cell(records(store.samples(run)))
        lines.update({(run, keys[cid]): line for cid, line in found.items()})
    for row in rows:
        for who, run, key in (("cell", row.run, row.cell), ("baseline", row.baseline_run, row.baseline)):
            if (run, key) in lines:
                row.flags.append(f"{NOT_EXERCISED} ({who} {key}): {lines[(run, key)]}")
    return rows


def _mark_versions(store: Store, rows: list[Row]) -> list[Row]:
    """Name on every row the guest kernel and QEMU versions its cell and its baseline cell ran on, where they
    differ (a kernel or QEMU axis, or two runs on other versions): the first thing to read a difference by."""
    runs = {r.run for r in rows} | {r.baseline_run for r in rows}
    seen: dict[tuple[int, str], dict[str, str]] = {}
    for run in runs - {None}:
        keys = {c["id"]: c["key"] for c in store.cells(run)}
        for cid, versions in cell_versions(records(store.samples(run))).items():
            seen[(run, keys[cid])] = versions
    for row in rows:
        a, b = seen.get((row.baseline_run, row.baseline or "")), seen.get((row.run, row.cell))
        if a and b:
            row.versions = [c.line() for c in version_changes(a, b)]
    return rows


def _mark_emulated(rows: list[Row], *runs: dict) -> list[Row]:
    if any(emulated(r) for r in runs):
        for row in rows:
            row.flags.append(TCG_MARK)
    return rows


def compare_run(store: Store, run_id: int, baseline: dict | None = None,
                metrics: Sequence[str] = HEADLINE, level: float | None = None) -> list[Row]:
    """Every cell of a run against its baseline cell; `baseline` overrides the run's own."""
    _check_metrics(metrics)
    run = store.get_run(run_id)
    level = level or (run.get("repeat") or {}).get("level") or 99
    base = baseline if baseline else run.get("baseline")
    cells = store.cells(run_id)
    axes = axes_of(cells)
    axes_text = ", ".join(f"{k} ({'/'.join(v)})" for k, v in axes.items()) or "none"
    if not base:
        raise BadInput(f"run {run_id} has no baseline: pass --baseline AXIS=VALUE (axes: {axes_text})")
    base = _norm(base)
    for k, v in base.items():
        if k not in axes:
            raise BadInput(f"baseline {k}={v}: run {run_id} has no axis {k!r} (axes: {axes_text})")
        if v not in axes[k]:
            raise BadInput(f"baseline {k}={v} matches no cell of run {run_id} ({k} is one of: {', '.join(axes[k])})")
    by_params = {_key(_norm(c["params"])): c for c in cells}
    seq = sequential_rule(store, run)
    if not any(all(_norm(c["params"]).get(k) == v for k, v in base.items()) for c in cells):
        raise BadInput(f"baseline {','.join(f'{k}={v}' for k, v in base.items())} matches no cell of run {run_id}")
    values = store.cell_metrics(run_id)
    rows: list[Row] = []
    for cell in cells:
        params = _norm(cell["params"])
        target = {**params, **base}
        if target == params:
            continue  # a baseline cell is not compared with itself
        bcell = by_params.get(_key(target))
        rows += compare_cells(cell, bcell, values.get(cell["id"], {}),
                              values.get(bcell["id"], {}) if bcell else {}, metrics, level, run_id, run_id, seq)
    for row in rows:
        row.published = published_text(run, row.params, row.baseline_params, row.metric)
    return _mark_emulated(_mark_versions(store, _mark_not_exercised(store, rows)), run)


def published_text(run: dict, params: dict, baseline_params: dict, metric: str) -> str | None:
    """What the run's plan says its source published for this comparison ("seed 001: +49 %"), or None."""
    pub = (run.get("plan") or {}).get("published")
    if not pub or pub.get("metric") != metric or not baseline_params:
        return None
    params, baseline_params = _norm(params), _norm(baseline_params)
    for e in pub.get("ratios") or []:
        if (_subset(e["cell"], params) and _subset(e["baseline"], baseline_params)
                and not _subset(e["baseline"], params)):
            bounds = e["change_pct"] if isinstance(e["change_pct"], list) else [e["change_pct"]]
            return f"{pub['ref']}: " + " … ".join(f"{x:+.0f}" for x in bounds) + " %"
    return None


def published_rows(store: Store, run_id: int) -> list[Row]:
    """For each ratio the run's plan says its source published: our rows for that comparison (each
    against the entry's own baseline, which may differ from the run's), with `published` set."""
    run = store.get_run(run_id)
    pub = (run.get("plan") or {}).get("published")
    if not pub:
        return []
    out: list[Row] = []
    for e in pub.get("ratios") or []:
        try:
            rows = compare_run(store, run_id, e["baseline"], [pub["metric"]])
        except BadInput:  # e.g. a --quick run that did not measure that baseline
            continue
        out += [r for r in rows if _subset(e["cell"], _norm(r.params)) and r.published and
                not any(r.cell == o.cell and r.baseline == o.baseline for o in out)]
    return out


def _subset(f: dict, params: dict[str, str]) -> bool:
    return all(params.get(str(k)) == str(v) for k, v in f.items())


def compare_runs(store: Store, run_a: int, run_b: int, metrics: Sequence[str] = HEADLINE,
                 level: float | None = None) -> list[Row]:
    """The same cell keys across two runs (two kernels, two hosts): B against A per cell."""
    _check_metrics(metrics)
    ra, rb = store.get_run(run_a), store.get_run(run_b)
    level = level or (ra.get("repeat") or {}).get("level") or 99
    cells_a = {c["key"]: c for c in store.cells(run_a)}
    cells_b = store.cells(run_b)
    if not set(cells_a) & {c["key"] for c in cells_b}:
        raise BadInput(f"runs {run_a} ({ra['name']}) and {run_b} ({rb['name']}) have no cell key in common: "
                       f"`offlab results show` lists each run's cells")
    va, vb = store.cell_metrics(run_a), store.cell_metrics(run_b)
    rows: list[Row] = []
    for cell in cells_b:
        base = cells_a.get(cell["key"])
        if base is None:
            rows += _missing_rows(cell, metrics, level, f"not in run {run_a}", run_b, run_a)
            continue
        rows += compare_cells(cell, base, vb.get(cell["id"], {}), va.get(base["id"], {}), metrics, level,
                              run_b, run_a)
    keys_b = {c["key"] for c in cells_b}
    for key, cell in cells_a.items():
        if key not in keys_b:
            rows += _missing_rows(cell, metrics, level, f"not in run {run_b}", run_b, run_a)
    return _mark_emulated(_mark_versions(store, _mark_not_exercised(store, rows)), ra, rb)


def compare_many(store: Store, runs: Sequence[int], metrics: Sequence[str] = HEADLINE,
                 level: float | None = None) -> list[Row]:
    """Several runs side by side (host pairs of one fan-out, a fleet of alike machines): each against the first."""
    return [row for other in runs[1:] for row in compare_runs(store, runs[0], other, metrics, level)]


def _missing_rows(cell: dict, metrics: Sequence[str], level: float, why: str, run: int, base_run: int) -> list[Row]:
    out = []
    for name in metrics:
        m = METRICS[name]
        out.append(Row(cell=cell["key"], baseline=None, metric=name, label=m.label, unit=m.unit, better=m.better,
                       level=level, verdict=MISSING, flags=[why], cell_status=cell["status"],
                       cell_reason=cell.get("reason"), run=run, baseline_run=base_run, params=cell["params"]))
    return out


def fail_if_slower(rows: Sequence[Row], pct: float, metrics: Sequence[str] = RATE_METRICS) -> list[Row]:
    """Rows significantly slower than their baseline by more than `pct` %.

    A failed cell fails the gate (it shows no figures, so it cannot be shown not to be slower).
    Rates (throughput_bps, pps): the interval lies below 1 and the change is below −pct %.
    A lower-is-better metric named in `metrics` counts by its inverse (work per unit of cost):
    significantly higher, with baseline/cell below 1 − pct/100 (service demand +25 % is 20 % slower).
    """
    out = []
    limit = 1.0 - pct / 100.0
    for r in rows:
        if r.metric in metrics and r.verdict == FAILED:
            out.append(r)  # a cell that failed has no figure, and no figure cannot pass a speed gate
            continue
        if r.metric not in metrics or r.ratio is None or r.low is None:
            continue
        if r.better == "higher":
            if r.high < 1.0 and r.ratio < limit:
                out.append(r)
        elif r.low > 1.0 and r.ratio > 0 and 1.0 / r.ratio < limit:
            out.append(r)
    return out


def difference(params: dict, other: dict) -> tuple[str, str, str]:
    """(what differs in params, the same axes in other, what both share) as "k=v,..." strings."""
    p, o = _norm(params), _norm(other)
    diff = [k for k in p if p.get(k) != o.get(k)]
    same = [k for k in p if k not in diff]
    fmt = lambda d, ks: ",".join(f"{k}={d[k]}" for k in ks if k in d)  # noqa: E731
    return fmt(p, diff), fmt(o, diff), fmt(p, same)


def sentence(rows: Sequence[Row]) -> str:
    """One cell's rows as a line: "payload=1472@1500: offload=on vs off: +49.2 % throughput, …"."""
    if not rows:
        return ""
    r0 = rows[0]
    if r0.run != r0.baseline_run:
        head = f"{r0.cell}: run {r0.run} vs run {r0.baseline_run}"
    else:
        mine, theirs, shared = difference(r0.params, r0.baseline_params)
        head = (f"{shared}: " if shared else "") + f"{mine} vs {theirs}"
    if not any_compared(rows):
        return f"{head}: {r0.verdict}" + (f" ({r0.cell_reason})" if r0.cell_reason else "")
    sig, nsd = [], []
    for r in rows:
        if r.verdict in (stats.NO_DIFFERENCE, stats.UNDETERMINED) or not r.compared:
            nsd.append(r.label)
        elif r.verdict == stats.EQUIVALENT:
            sig.append(f"{r.label} equivalent ({_signed(r.change_pct)} %)")
        elif r.change_pct is not None:
            sig.append(f"{_signed(r.change_pct)} % {r.label}")
        else:
            sig.append(f"{r.label} {r.verdict}")
    text = head + ": " + (", ".join(sig) if sig else "no significant change")
    text += f" ({r0.level:g} % CI)"
    if sig and nsd:
        text += "; no significant difference in " + ", ".join(nsd)
    both = trade_off(rows)
    if both:
        text += f" — {both}"
    if r0.versions:  # the versions first: what most likely made the difference
        text = f"{head} (on other versions: {'; '.join(r0.versions)})" + text[len(head):]
    return text


# Round-trip times: lower is better; a cell can be faster in throughput and worse here.
LATENCY_METRICS = tuple(name for name in METRICS if "rtt_" in name)


def trade_off(rows: Sequence[Row]) -> str | None:
    """"faster, but rtt p99 under load worse" when one cell's throughput and latency verdicts point
    opposite ways (both significant); None when they agree or either is not significant."""
    rate = next((r for r in rows if r.metric == "throughput_bps" and r.verdict in (stats.FASTER, stats.SLOWER)),
                None)
    if rate is None:
        return None
    against = [r.label for r in rows if r.metric in LATENCY_METRICS and r.improved is not None
               and r.improved != rate.improved]
    if not against:
        return None
    return f"{rate.verdict}, but {', '.join(against)} {'worse' if rate.improved else 'better'}"


def _signed(x: float) -> str:
    return f"+{x:.1f}" if x >= 0 else f"\u2212{-x:.1f}"


def any_compared(rows: Sequence[Row]) -> bool:
    """A cell's rows are worth a table when any metric has a statistical verdict (its throughput may
    have none while its round trips do)."""
    return any(r.compared for r in rows)


def by_cell(rows: Sequence[Row]) -> list[list[Row]]:
    """Rows grouped by (cell, baseline), in their order."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.cell, r.baseline, r.run), []).append(r)
    return list(groups.values())
