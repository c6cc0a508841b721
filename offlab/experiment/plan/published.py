"""`published`: the ratios a seed document reports for the comparisons a plan makes.

    published:
      ref: seed 001
      ratios:
        - {cell: {gro: dpdk-gro}, baseline: {gro: kernel-gro}, change_pct: 49}
        - {cell: {gro: dpdk-gro}, change_pct: 63}        # against the plan's own baseline

Each entry names a comparison by two filters on the axes (the compared cell, and the cell it is
compared with; the plan's baseline when omitted) and the change the source reports on `metric`
(throughput unless named), in %: one figure, or [low, high] where the source gives a range.
Reports print it beside offlab's own ratio; nothing is computed from it.
"""

from __future__ import annotations

import math
from typing import Any

from offlab.experiment.plan.axes import fmt, matches, scalar_name
from offlab.experiment.plan.errors import PlanErrors
from offlab.metrics import METRICS

KEYS = {"ref", "metric", "ratios"}
RATIO_KEYS = {"cell", "baseline", "change_pct"}
MAX_RATIOS = 32
DEFAULT_METRIC = "throughput_bps"


def parse_published(err: PlanErrors, raw: Any, axes: dict, baseline: dict | None, cells: list) -> dict | None:
    """The `published` field as {ref, metric, ratios: [{cell, baseline, change_pct}]}, each checked."""
    if raw is None:
        return None
    path = ("published",)
    if not isinstance(raw, dict):
        err.fail(path, "published is a mapping: {ref: \"seed 001\", ratios: [{cell: {AXIS: VALUE}, change_pct: 49}]}")
    for key in raw:
        if key not in KEYS:
            err.unknown(path + (key,), key, KEYS)
    ref = raw.get("ref")
    if not isinstance(ref, str) or not ref.strip() or len(ref) > 100 or "\n" in ref:
        err.fail(path + ("ref",), "published.ref: the source in one line of up to 100 characters, e.g. \"seed 001\"")
    metric = raw.get("metric", DEFAULT_METRIC)
    if metric not in METRICS:
        err.fail(path + ("metric",), f"published.metric {metric!r}: one of {', '.join(METRICS)}")
    ratios = raw.get("ratios")
    if not isinstance(ratios, list) or not ratios or len(ratios) > MAX_RATIOS:
        err.fail(path + ("ratios",), f"published.ratios: a list of 1..{MAX_RATIOS} entries "
                                     f"{{cell: {{AXIS: VALUE}}, baseline: {{AXIS: VALUE}}, change_pct: N}}")
    out = []
    for i, entry in enumerate(ratios):
        where = path + ("ratios", i)
        name = f"published.ratios.{i}"
        if not isinstance(entry, dict):
            err.fail(where, f"{name}: a mapping {{cell: {{AXIS: VALUE}}, baseline: {{AXIS: VALUE}}, change_pct: N}}")
        for key in entry:
            if key not in RATIO_KEYS:
                err.unknown(where + (key,), key, RATIO_KEYS)
        if "cell" not in entry:
            err.fail(where, f"{name}: missing 'cell' (the compared cell, e.g. {{gro: on}})")
        cell = _filter(err, entry["cell"], where + ("cell",), f"{name}.cell", axes)
        if "baseline" in entry:
            base = _filter(err, entry["baseline"], where + ("baseline",), f"{name}.baseline", axes)
        elif baseline:
            base = dict(baseline)
        else:
            err.fail(where, f"{name}: name its baseline ({{AXIS: VALUE}}): the plan has none")
        change = entry.get("change_pct")
        bounds = change if isinstance(change, list) else [change]
        if len(bounds) not in (1, 2) or not all(_percent(x) for x in bounds) or bounds != sorted(bounds):
            err.fail(where + ("change_pct",), f"{name}.change_pct: the published change in %, a number above "
                                              f"-100 (49 for +49 %) or a range [low, high] (e.g. [0, 124]), "
                                              f"not {change!r}")
        if matches(cell, base):
            err.fail(where, f"{name}: cell {fmt(cell)} is its own baseline {fmt(base)}: name the cell it is "
                            f"compared with")
        if not any(matches(c.params, cell) and any(o.params == {**c.params, **base} for o in cells)
                   for c in cells):
            continue  # not measured by this plan (its only/exclude, a composite suite's part)
        out.append({"cell": cell, "baseline": base, "change_pct": [float(x) for x in bounds]})
    return {"ref": ref.strip(), "metric": metric, "ratios": out} if out else None


def _percent(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and -100 < x <= 100_000


def _filter(err: PlanErrors, raw: Any, path: tuple, name: str, axes: dict) -> dict[str, str]:
    """{axis: value name}, every name one of the plan's axes and its values."""
    if not isinstance(raw, dict) or not raw:
        err.fail(path, f"{name}: a mapping {{AXIS: VALUE}} of this plan's axes ({', '.join(axes)})")
    out = {}
    for axis, value in raw.items():
        if axis not in axes:
            err.unknown(path + (axis,), axis, set(axes), what=f"axis in {name}")
        vname = scalar_name(value)
        if vname not in axes[axis]:
            err.unknown(path + (axis,), vname, set(axes[axis]), what=f"value of axis '{axis}' in {name}")
        out[str(axis)] = vname
    return out
