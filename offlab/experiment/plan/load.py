"""Loading a plan: the top-level fields, in order, into a Plan with its cells."""

from __future__ import annotations

import re
from typing import Any

from offlab.errors import BadInput
from offlab.experiment import yamlio
from offlab.experiment.plan import topology as static
from offlab.experiment.plan.axes import expand, fmt, matches, parse_axes, parse_filters
from offlab.experiment.plan.checks import check_target
from offlab.experiment.plan.errors import PlanErrors
from offlab.experiment.plan.models import CaptureSpec, Plan, RepeatSpec, TopologySpec, WorkloadSpec
from offlab.experiment.plan.published import parse_published
from offlab.catalog import TOPOLOGIES

TOP_KEYS = {"name", "description", "topology", "axes", "only", "exclude", "workload", "repeat", "baseline",
            "capture", "budget", "seed", "warmup", "headline", "quick", "quick_workload", "published", "trace"}
QUICK_BUDGET_S = 120.0  # --quick with no budget of its own: about two minutes of measuring
QUICK_MAX_ROUNDS = 30  # --quick: the budget bounds a headline comparison's rounds, not the plan's max


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
    quick_wl = data.get("quick_workload")
    if quick_wl is not None:  # --quick's samples, e.g. shorter: merged over `workload`, checked with it always
        if not isinstance(quick_wl, dict) or not isinstance(wl, dict):
            err.fail(("quick_workload",), "quick_workload is a mapping of workload fields, e.g. {duration: 1}")
        quicker = err.model(WorkloadSpec, {**wl, **quick_wl}, ("quick_workload",))
        if quick:
            workload = quicker
    repeat = err.model(RepeatSpec, data.get("repeat") or {}, ("repeat",))
    capture = _capture(err, data.get("capture"), topology.kind)
    axes, value_paths = parse_axes(err, data.get("axes") or {}, topology.kind)
    only = parse_filters(err, data.get("only") or [], "only", axes)
    exclude = parse_filters(err, data.get("exclude") or [], "exclude", axes)
    baseline = data.get("baseline")
    if baseline is not None:
        baseline = parse_filters(err, [baseline], "baseline", axes)[0]
    headline = parse_filters(err, data.get("headline") or [], "headline", axes)
    quick_cells = parse_filters(err, data.get("quick") or [], "quick", axes)
    if headline and baseline is None:
        err.fail(("headline",), "headline names comparisons with the baseline: give the plan a baseline")
    budget = _budget(err, data.get("budget"))
    seed = data.get("seed")
    trace = data.get("trace", False)
    if not isinstance(trace, bool):
        err.fail(("trace",), "trace is true or false: the kernel's own account of every sample (docs/results.md)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        err.fail(("seed",), "seed must be an integer")
    plan = Plan(source=source, text=text, name=name, description=str(data.get("description") or ""),
                topology=topology, workload=workload, repeat=repeat, axes=axes, only=only, exclude=exclude,
                baseline=baseline, capture=capture, budget_s=budget, seed=seed, headline=headline,
                quick=quick_cells, trace=trace)
    plan.cells = expand(plan, err, value_paths)
    if not plan.cells:
        err.fail(("only",) if only else ("axes",), "the filters leave no cell to run")
    if TOPOLOGIES[topology.kind].borrows_ports and len({c.lab_key for c in plan.cells}) > 1:
        err.fail(("axes",), f"a {topology.kind} plan has one pair of ports, so one lab: vary its MTU or offloads with "
                            "settings (e.g. settings: {client: {mtu: 9000}, server: {mtu: 9000}}), not with topology")
    if baseline and not any(matches(c.params, baseline) for c in plan.cells):
        err.fail(("baseline",), f"baseline {fmt(baseline)} matches no cell")
    if headline and not any(matches(c.params, h) and c.params != {**c.params, **baseline}
                            for c in plan.cells for h in headline):
        err.fail(("headline",), f"headline {', '.join(map(fmt, headline))} names no compared cell")
    # checked on every cell, before --quick drops some: a quick run shows the entries it measured
    plan.published = parse_published(err, data.get("published"), axes, baseline, plan.cells)
    if quick:
        _quicken(plan)
    return plan


def _quicken(plan: Plan) -> None:
    """--quick. Deciding plans: the headline comparisons first, decided as usual but within
    QUICK_BUDGET_S unless the plan has a budget, which rather than `repeat.max` bounds their rounds;
    other cells (those `quick` names, else all) get two rounds, enough to show the shape. Width plans: 1–2 rounds, a 20 % wide interval."""
    rep = plan.repeat
    if rep.rule(plan.baseline is not None) == "width":
        plan.repeat = rep.model_copy(update={"min": 1, "max": 2, "width": max(rep.width, 20)})
        return
    plan.repeat = rep.model_copy(update={"min": 2, "max": max(rep.max, QUICK_MAX_ROUNDS)})
    plan.shape_rounds = 2
    plan.budget_s = plan.budget_s or QUICK_BUDGET_S
    if plan.quick:
        wanted = [c for c in plan.cells if any(matches(c.params, f) for f in plan.headline + plan.quick)]
        keys = {c.key for c in wanted} | {baseline_key(c.params, plan.baseline) for c in wanted}
        plan.cells = [c for c in plan.cells if c.key in keys]


def baseline_key(params: dict[str, str], baseline: dict[str, str]) -> str:
    """The key of the cell a cell is compared with: its params with the baseline's values."""
    return ",".join(f"{a}={v}" for a, v in {**params, **baseline}.items())


def load_plan_file(path: str, *, quick: bool = False) -> Plan:
    """A plan from a file: at most yamlio.MAX_PLAN_BYTES of UTF-8, read no further."""
    return load_plan(yamlio.read_text(path), path, quick=quick)


def _capture(err: PlanErrors, raw: Any, kind: str) -> CaptureSpec | None:
    if raw is None:
        return None
    if isinstance(raw, dict) and "on" in raw:  # docs/plans.md's `capture: {on: server}`
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
    try:
        return parse_budget(raw)
    except BadInput as exc:
        err.fail(("budget",), str(exc))


def parse_budget(raw: Any, what: str = "budget") -> float:
    """Seconds from 600, "600", "90s", "10m" or "2h"; BadInput names `what`."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and 0 < raw < float("inf"):
        return float(raw)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)?", str(raw).strip())
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)] if m else 0
    if not 0 < seconds <= 366 * 86400:
        raise BadInput(f"{what} is seconds (600) or a duration like 90s, 10m, 2h, not {str(raw)[:40]!r}")
    return seconds
