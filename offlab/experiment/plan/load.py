"""Loading a plan: the top-level fields, in order, into a Plan with its cells."""

from __future__ import annotations

import re
from typing import Any

from offlab.experiment import yamlio
from offlab.experiment.plan import topology as static
from offlab.experiment.plan.axes import expand, fmt, matches, parse_axes, parse_filters
from offlab.experiment.plan.checks import check_target
from offlab.experiment.plan.errors import PlanErrors
from offlab.experiment.plan.models import CaptureSpec, Plan, RepeatSpec, TopologySpec, WorkloadSpec

TOP_KEYS = {"name", "description", "topology", "axes", "only", "exclude", "workload", "repeat", "baseline",
            "capture", "budget", "seed", "warmup", "quick"}


def load_plan(text: str, source: str = "<plan>", *, quick: bool = False) -> Plan:
    """Parse and validate a plan; BadInput names file:line and the field."""
    data, lines = yamlio.load(text, source)
    err = PlanErrors(source, lines)
    if not isinstance(data, dict):
        err.fail((), "a plan is a mapping with name, topology, axes, workload, repeat")
    unknown = sorted(set(map(str, data)) - TOP_KEYS)
    if unknown:
        err.unknown((unknown[0],), unknown[0], TOP_KEYS)
    for required in ("name", "topology", "workload"):
        if required not in data:
            err.fail((), f"missing required field '{required}'")
    name = data["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        err.fail(("name",), "name: use letters, digits, '.', '_' or '-' (up to 64)")
    topology = err.model(TopologySpec, data["topology"], ("topology",))
    wl = dict(data["workload"]) if isinstance(data["workload"], dict) else data["workload"]
    if isinstance(wl, dict) and "warmup" in data:
        wl.setdefault("warmup", data["warmup"])
    workload = err.model(WorkloadSpec, wl, ("workload",))
    repeat = err.model(RepeatSpec, data.get("repeat") or {}, ("repeat",))
    capture = _capture(err, data.get("capture"), topology.kind)
    axes, value_paths = parse_axes(err, data.get("axes") or {}, topology.kind)
    only = parse_filters(err, data.get("only") or [], "only", axes)
    exclude = parse_filters(err, data.get("exclude") or [], "exclude", axes)
    baseline = data.get("baseline")
    if baseline is not None:
        baseline = parse_filters(err, [baseline], "baseline", axes)[0]
    budget = _budget(err, data.get("budget"))
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        err.fail(("seed",), "seed must be an integer")
    plan = Plan(source=source, text=text, name=name, description=str(data.get("description") or ""),
                topology=topology, workload=workload, repeat=repeat, axes=axes, only=only, exclude=exclude,
                baseline=baseline, capture=capture, budget_s=budget, seed=seed)
    plan.cells = expand(plan, err, value_paths)
    if not plan.cells:
        err.fail(("only",) if only else ("axes",), "the filters leave no cell to run")
    if baseline and not any(matches(c.params, baseline) for c in plan.cells):
        err.fail(("baseline",), f"baseline {fmt(baseline)} matches no cell")
    # A plan's own `quick:` (only / repeat) says which cells decide its question in a few minutes;
    # it is checked on every load, so a full run cannot carry a quick section that would fail.
    quick_only, quick_repeat = _quick(err, data.get("quick"), axes, plan)
    if quick:
        if quick_only:
            plan.cells = [c for c in plan.cells if any(matches(c.params, f) for f in quick_only)]
        plan.repeat = quick_repeat or RepeatSpec(min=1, max=2, level=plan.repeat.level,
                                                 width=max(plan.repeat.width, 20), metric=plan.repeat.metric)
    return plan


def _quick(err: PlanErrors, raw: Any, axes: dict, plan: Plan) -> tuple[list[dict[str, str]], RepeatSpec | None]:
    if raw is None:
        return [], None
    if not isinstance(raw, dict) or set(map(str, raw)) - {"only", "repeat"}:
        err.fail(("quick",), "quick takes only (cells) and repeat, e.g. quick: {only: [{gro: on}], repeat: {min: 2}}")
    only = parse_filters(err, raw.get("only") or [], "quick", axes)
    cells = [c for c in plan.cells if any(matches(c.params, f) for f in only)] if only else plan.cells
    if not cells:
        err.fail(("quick", "only"), "quick.only leaves no cell to run")
    if plan.baseline and not any(matches(c.params, plan.baseline) for c in cells):
        err.fail(("quick", "only"), f"quick.only leaves out the baseline {fmt(plan.baseline)}")
    repeat = None
    if raw.get("repeat") is not None:
        if not isinstance(raw["repeat"], dict):
            err.fail(("quick", "repeat"), "quick.repeat is a mapping like repeat")
        repeat = err.model(RepeatSpec, {**plan.repeat.model_dump(), **raw["repeat"]}, ("quick", "repeat"))
    return only, repeat


def load_plan_file(path: str, *, quick: bool = False) -> Plan:
    """A plan from a file: at most yamlio.MAX_PLAN_BYTES of UTF-8, read no further."""
    return load_plan(yamlio.read_text(path), path, quick=quick)


def _capture(err: PlanErrors, raw: Any, kind: str) -> CaptureSpec | None:
    if raw is None:
        return None
    if isinstance(raw, dict) and "on" in raw:  # DESIGN.md's `capture: {on: server}`
        raw = {**{k: v for k, v in raw.items() if k != "on"}, "host": raw["on"]}
    capture = err.model(CaptureSpec, raw, ("capture",))
    target = capture.host + (f":{capture.iface}" if capture.iface else "")
    check_target(err, ("capture", "host"), target, kind, machine_ok=False)
    try:
        static.resolve(kind, capture.host, capture.iface)  # a capture needs one interface
    except ValueError as exc:
        err.fail(("capture", "host"), f"capture: {exc}")
    return capture


def _budget(err: PlanErrors, raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and 0 < raw < float("inf"):
        return float(raw)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)", str(raw))
    if not m or float(m.group(1)) <= 0:
        err.fail(("budget",), "budget is seconds (600) or a duration like 90s, 10m, 2h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
