"""A plan's history: per cell and metric, each run's estimate in the order the runs started, split into
groups of runs that measured alike, and at each group's start the environment difference that may explain it.

The groups are chosen by minimum description length, the principle behind FD.io CSIT's trend analysis
(docs/results.md, "Trends"): of every way to cut the series into consecutive groups, each group's values
coded as draws from one normal distribution, the cut that codes the whole series in the fewest bits wins.
A group costs bits for its place, its mean and its spread before any value is coded, so a cut pays off
only where the values on its two sides differ by more than they scatter within each side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from offlab.errors import BadInput
from offlab.metrics import HEADLINE, METRICS, TCG_MARK
from offlab.report import envdiff
from offlab.report.compare import emulated
from offlab.stats import CI, mean_ci
from offlab.store import Store

# The largest value of a series spans 2**PRECISION_BITS quanta: the resolution every value, mean and spread
# is coded at (CSIT chose 12 bits, about ±0.01 % of the largest value; measurements here scatter by percents).
PRECISION_BITS = 12

# A cell with this status has no figure to put on a trend (what a failed cell measured is not a result).
NO_POINT = ("failed", "skipped")


# ---- minimum description length over one series ------------------------------------------------------


def _sphere_log2(dim: int) -> float:
    """log2 of the surface of the unit sphere of dimension `dim` (in dim + 1 coordinates): 2·π^(k/2)/Γ(k/2)."""
    k = dim + 1
    return (math.log(2.0) + (k / 2) * math.log(math.pi) - math.lgamma(k / 2)) / math.log(2.0)


def group_bits(values: Sequence[float], quantum: float, n_series: int) -> float:
    """Bits that code one group of the series: where it ends, its mean and spread, then its values.

    With the mean and the spread (the radius of the values around their mean) known, the n values lie on
    a sphere of dimension n − 2; naming one point of it at the quantum's resolution takes log2 of its
    surface in quanta. One value needs its mean only, two values one more bit (which of the two is larger).
    """
    n = len(values)
    bits = math.log2(n_series) + PRECISION_BITS  # its end among the series' places, its mean
    if n == 1:
        return bits
    bits += PRECISION_BITS  # its spread
    if n == 2:
        return bits + 1.0
    mean = math.fsum(values) / n
    radius = math.sqrt(math.fsum((v - mean) ** 2 for v in values))
    quanta = max(radius, quantum) / quantum  # values closer than one quantum are coded as equal
    return bits + max(0.0, _sphere_log2(n - 2) + (n - 2) * math.log2(quanta))


def groups(values: Sequence[float]) -> list[tuple[int, int]]:
    """The partition of `values` into consecutive groups, as (start, end) slices, that codes them in the fewest
    bits (group_bits); every cut is weighed, by dynamic programming over where the last group starts."""
    n = len(values)
    if n == 0:
        return []
    top = max(abs(v) for v in values)
    if top == 0 or not all(math.isfinite(v) for v in values):
        return [(0, n)]
    quantum = top / 2 ** PRECISION_BITS
    best = [0.0] + [math.inf] * n  # best[j]: fewest bits for values[:j]
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            bits = best[i] + group_bits(values[i:j], quantum, n)
            if bits < best[j]:
                best[j], start[j] = bits, i
    out = []
    j = n
    while j > 0:
        out.append((start[j], j))
        j = start[j]
    return out[::-1]


# ---- a plan's history from the store ------------------------------------------------------------------


@dataclass
class Point:
    """One run's estimate of a cell's metric: the mean of its samples and their Student-t interval."""

    run: int
    started_at: str
    run_status: str
    ci: CI

    def to_dict(self) -> dict:
        return {"run": self.run, "started_at": self.started_at, "run_status": self.run_status,
                "mean": self.ci.mean, "low": self.ci.low, "high": self.ci.high, "n": self.ci.n,
                "level": self.ci.level}


@dataclass
class ChangePoint:
    """Where one group of runs ends and the next begins: the step between the two groups' means, and what
    differs between the last run before it and the first run after it."""

    run_before: int
    run_after: int
    before: float  # the mean of the earlier group's estimates
    after: float
    runs_before: int  # how many runs each group holds
    runs_after: int
    environment: envdiff.EnvDiff

    @property
    def relative(self) -> float | None:
        """after / before − 1; None when the earlier group's mean is 0."""
        return None if self.before == 0 else self.after / self.before - 1.0

    def to_dict(self) -> dict:
        return {"run_before": self.run_before, "run_after": self.run_after, "before": self.before,
                "after": self.after, "relative": self.relative, "runs_before": self.runs_before,
                "runs_after": self.runs_after, "environment": self.environment.to_dict()}


@dataclass
class Series:
    """One cell's metric over the plan's runs, its groups and the change points between them."""

    cell: str
    metric: str
    points: list[Point]
    groups: list[tuple[int, int]]  # slices of points
    changes: list[ChangePoint] = field(default_factory=list)

    def group_of(self, index: int) -> int:
        return next(g for g, (a, b) in enumerate(self.groups) if a <= index < b)

    def to_dict(self) -> dict:
        return {"cell": self.cell, "metric": self.metric, "unit": METRICS[self.metric].unit,
                "better": METRICS[self.metric].better, "points": [p.to_dict() for p in self.points],
                "groups": [{"first_run": self.points[a].run, "last_run": self.points[b - 1].run, "runs": b - a}
                           for a, b in self.groups],
                "change_points": [c.to_dict() for c in self.changes]}


@dataclass
class Trend:
    plan: str
    runs: list[dict]  # id, started_at, status of each run of the plan, oldest first
    series: list[Series]
    emulated: list[str] = field(default_factory=list)  # "run 3: lab:client (tcg, QEMU 10.0.2)"

    def to_dict(self) -> dict:
        return {"plan": self.plan, "method": METHOD, "precision_bits": PRECISION_BITS,
                "runs": self.runs, "emulated": self.emulated, "series": [s.to_dict() for s in self.series]}

    def tcg_line(self) -> str | None:
        """The TCG mark with the runs whose guests ran emulated, or None when none did."""
        return f"{TCG_MARK} (emulated: {'; '.join(self.emulated)})" if self.emulated else None


METHOD = ("minimum description length over each run's mean (FD.io CSIT's trend analysis): the cut of the "
          "series into groups that codes it in the fewest bits")


def plans(store: Store) -> dict[str, int]:
    """Each plan (a run's name) in the database and how many runs it has, in the order first run."""
    out: dict[str, int] = {}
    for r in store.list_runs():
        out[r["name"]] = out.get(r["name"], 0) + 1
    return out


def plan_runs(store: Store, plan: str) -> list[dict]:
    """The runs of `plan`, oldest first; BadInput listing the plans there are when it has none."""
    listed = store.list_runs()
    runs = sorted((r for r in listed if r["name"] == plan), key=lambda r: (r["started"], r["id"]))
    if not runs:
        have = plans(store)
        there = ", ".join(f"{name!r} ({n} run{'' if n == 1 else 's'})" for name, n in have.items()) or "none yet"
        raise BadInput(f"plan {plan!r}: no run of that name in DB {store.where}; plans it has: {there}")
    return [{"id": r["id"], "started_at": r["started"], "status": r["status"]} for r in runs]


def trend(store: Store, plan: str, cells: Sequence[str] = (), metrics: Sequence[str] = ()) -> Trend:
    """The plan's series per cell and metric (by default the headline metrics the runs measured), grouped,
    with each change point's step and environment difference."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise BadInput(f"--metric {unknown[0]}: unknown metric; one of {', '.join(METRICS)}")
    runs = plan_runs(store, plan)
    # cell key → metric → points, in run order
    found: dict[str, dict[str, list[Point]]] = {}
    tcg: list[str] = []
    for run in runs:
        stored = store.get_run(run["id"])
        tcg += [f"run {run['id']}: {who}" for who in emulated(stored)]
        level = (stored.get("repeat") or {}).get("level") or 99
        values = store.cell_metrics(run["id"])
        for cell in store.cells(run["id"]):
            per_cell = found.setdefault(cell["key"], {})
            if cell["status"] in NO_POINT:
                continue
            for name, vals in values.get(cell["id"], {}).items():
                if vals and name in METRICS:
                    per_cell.setdefault(name, []).append(
                        Point(run["id"], run["started_at"], run["status"], mean_ci(vals, level)))
    missing = [c for c in cells if c not in found]
    if missing:
        raise BadInput(f"--cell {missing[0]}: no cell of that key in plan {plan!r}; its cells: "
                       f"{', '.join(found) or 'none'}")
    wanted = list(metrics) or [m for m in HEADLINE if any(m in per for per in found.values())]
    if metrics and not any(m in found.get(c, {}) for c in (cells or found) for m in metrics):
        raise BadInput(f"--metric {metrics[0]}: no run of plan {plan!r} measured it"
                       + (f" in cell {cells[0]}" if cells else "") + "; measured: "
                       + ", ".join(m for m in METRICS if any(m in found[c] for c in (cells or found))))
    diffs: dict[tuple[int, int], envdiff.EnvDiff] = {}
    out = []
    for key in cells or found:
        for name in wanted:
            points = found[key].get(name)
            if not points:
                continue
            split = groups([p.ci.mean for p in points])
            series = Series(key, name, points, split)
            for (a, b), (c, d) in zip(split, split[1:], strict=False):
                pair = (points[b - 1].run, points[c].run)
                if pair not in diffs:
                    diffs[pair] = envdiff.env_diff(store, *pair)
                series.changes.append(ChangePoint(
                    pair[0], pair[1], _mean(points[a:b]), _mean(points[c:d]), b - a, d - c, diffs[pair]))
            out.append(series)
    return Trend(plan, runs, out, tcg)


def _mean(points: Sequence[Point]) -> float:
    return math.fsum(p.ci.mean for p in points) / len(points)
