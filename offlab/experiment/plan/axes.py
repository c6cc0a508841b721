"""Axes of named values, only/exclude/baseline filters, and their cartesian product: the cells."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from offlab.experiment.plan.checks import check_cell, check_knob, check_target
from offlab.experiment.plan.errors import PlanErrors
from offlab.experiment.plan.models import RR_FIELDS, AxisValue, Cell, Plan, TopologySpec, WorkloadSpec
from offlab.traffic import Workload

TOPOLOGY_KEYS = ("mtu", "underlay_mtu", "vni", "port", "ipv6", "pmd")
WORKLOAD_KEYS = (*(f for f in Workload.__dataclass_fields__ if f != "ipv6"),
                 "search_max_loss", "search_low", "search_high", "search_steps", "kind", *RR_FIELDS)
# Flat shorthands an axis value may use, e.g. `{udp_payload: 1472, mtu: 1500}`.
FLAT_ALIASES = {"udp_payload": ("workload", "size"), "message_size": ("workload", "size"),
                "socket_buffer": ("workload", "sndbuf+rcvbuf")}
AXIS_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
VALUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,47}$")
MAX_CELLS = 4096  # each cell is at least one measured sample of seconds; more is a typo, not a plan


def parse_axes(err: PlanErrors, raw: Any, kind: str) -> tuple[dict[str, dict[str, AxisValue]], dict[tuple, tuple]]:
    """({axis: {value name: AxisValue}}, {(axis, value name): path in the plan}) for a `kind` lab."""
    if not isinstance(raw, dict):
        err.fail(("axes",), "axes is a mapping: axis name → list or mapping of values")
    axes: dict[str, dict[str, AxisValue]] = {}
    paths: dict[tuple, tuple] = {}
    for axis, values in raw.items():
        path = ("axes", axis)
        if not isinstance(axis, str) or not AXIS_NAME_RE.fullmatch(axis):
            err.fail(path, f"axis name {axis!r}: a letter, then letters, digits, '_' or '-'")
        if isinstance(values, list):
            named = {}
            for i, v in enumerate(values):
                vname = _auto_name(v)
                if vname in named:
                    err.fail(path + (i,), f"two values of axis '{axis}' would both be named {vname!r}")
                named[vname] = (v, path + (i,))
        elif isinstance(values, dict):
            named = {str(k): (v, path + (k,)) for k, v in values.items()}
        else:
            err.fail(path, f"axis '{axis}' must be a list or a mapping of named values")
        if not named:
            err.fail(path, f"axis '{axis}' has no values")
        axes[axis] = {}
        for vname, (v, vpath) in named.items():
            if not VALUE_NAME_RE.fullmatch(vname):
                err.fail(vpath, f"value name {vname!r}: letters, digits and _ . @ + - (up to 48)")
            axes[axis][vname] = _axis_value(err, v, vpath, kind)
            paths[(axis, vname)] = vpath
    cells = math.prod(len(v) for v in axes.values())
    if cells > MAX_CELLS:
        err.fail(("axes",), f"the axes make {cells} cells ({' × '.join(str(len(v)) for v in axes.values())}); "
                            f"at most {MAX_CELLS}: use only/exclude or fewer values")
    return axes, paths


def _auto_name(v: Any) -> str:
    if isinstance(v, dict):
        # {udp_payload: 1472, mtu: 1500} → "1472@1500", as the built-in suites name them
        return "@".join(scalar_name(x) for x in v.values() if not isinstance(x, (dict, list)))[:48] or "value"
    return scalar_name(v)


def scalar_name(x: Any) -> str:
    if isinstance(x, bool):
        return "on" if x else "off"
    return str(x)


def _axis_value(err: PlanErrors, raw: Any, path: tuple, kind: str) -> AxisValue:
    if not isinstance(raw, dict):
        err.fail(path, "an axis value is a mapping, e.g. {udp_payload: 1472, mtu: 1500} or "
                       "{features: {client: {tso: off}}}")
    out: dict[str, Any] = {"workload": {}, "topology": {}, "features": {}, "settings": {}}
    for key, val in raw.items():
        kpath = path + (key,)
        if key in ("workload", "topology"):
            if not isinstance(val, dict):
                err.fail(kpath, f"{key} must be a mapping")
            out[key].update(val)
        elif key in ("features", "settings"):
            if not isinstance(val, dict):
                err.fail(kpath, f"{key} maps a host (client, server, router:to-server, ...) to its settings")
            for target, kv in val.items():
                check_target(err, kpath + (target,), target, kind)
                if not isinstance(kv, dict):
                    err.fail(kpath + (target,), f"{key} of {target} must map names to values")
                for k, v in kv.items():
                    check_knob(err, kpath + (target, k), kind, target, k, v, key)
                out[key].setdefault(str(target), {}).update(kv)
        elif key == "testpmd":
            # `testpmd: {gro: on, csum: {tcp: hw}}` is shorthand for settings of host switch:
            # testpmd.gro, testpmd.csum.tcp (a dpdk lab's testpmd)
            if not isinstance(val, dict):
                err.fail(kpath, "testpmd maps its settings to values, e.g. {gro: on, gso_segsz: 1448, csum: {tcp: hw}}")
            flat = {}
            for k, v in val.items():
                if isinstance(v, dict):
                    flat.update({f"testpmd.{k}.{sub}": subv for sub, subv in v.items()})
                else:
                    flat[f"testpmd.{k}"] = v
            for k, v in flat.items():
                check_knob(err, kpath + (k[len("testpmd."):],), kind, "switch", k, v, "settings")
            out["settings"].setdefault("switch", {}).update(flat)
        elif key in FLAT_ALIASES:
            section, field_name = FLAT_ALIASES[key]
            for f in field_name.split("+"):
                out[section][f] = val
        elif key in TOPOLOGY_KEYS:
            out["topology"][key] = val
        elif key in WORKLOAD_KEYS:
            out["workload"][key] = val
        else:
            err.unknown(kpath, key, {"workload", "topology", "features", "settings", "testpmd", *FLAT_ALIASES,
                                     *TOPOLOGY_KEYS, *WORKLOAD_KEYS})
    if "kind" in out["topology"]:
        err.fail(path + ("topology", "kind"), "the topology kind is the plan's, not an axis value's: "
                                              "write one plan per kind")
    for section, model in (("workload", WorkloadSpec), ("topology", TopologySpec)):
        probe = dict(out[section])
        if section == "topology":
            probe.setdefault("kind", kind)  # only the keys the value sets are checked here
        err.model(model, probe, path, partial_keys=set(out[section]))
    return AxisValue(**out)


def parse_filters(err: PlanErrors, raw: Any, what: str, axes: dict) -> list[dict[str, str]]:
    """`only`, `exclude` or `baseline` as [{axis: value name}], every name checked against the axes."""
    if not isinstance(raw, list):
        err.fail((what,), f"{what} is a list of {{axis: value}} mappings")
    out = []
    for i, f in enumerate(raw):
        path = (what,) if what == "baseline" else (what, i)
        if not isinstance(f, dict) or not f:
            err.fail(path, f"{what}: each entry maps axis names to value names, e.g. {{offload: off}}")
        norm = {}
        for axis, value in f.items():
            if axis not in axes:
                err.unknown(path + (axis,), axis, set(axes), what=f"axis in {what}")
            vname = scalar_name(value)
            if vname not in axes[axis]:
                err.unknown(path + (axis,), vname, set(axes[axis]), what=f"value of axis '{axis}'")
            norm[str(axis)] = vname
        out.append(norm)
    return out


def expand(plan: Plan, err: PlanErrors, paths: dict[tuple, tuple] | None = None) -> list[Cell]:
    """The cartesian product of the axes after only/exclude, each cell checked whole (check_cell);
    an error names the axis value that set the offending key, or the plan's own field."""
    paths = paths or {}
    names = list(plan.axes)
    cells = []
    for combo in itertools.product(*(plan.axes[a].items() for a in names)) if names else [()]:
        params = {a: v for a, (v, _) in zip(names, combo, strict=True)}
        if plan.only and not any(matches(params, f) for f in plan.only):
            continue
        if any(matches(params, f) for f in plan.exclude):
            continue
        topo = plan.topology.model_dump()
        wl = plan.workload.model_dump(include=plan.workload.model_fields_set)  # defaults follow the cell's tool
        changes: dict[tuple[str, str], Any] = {}
        owner: dict[tuple, str] = {}
        for axis, (_vname, val) in zip(names, combo, strict=True):
            for section, target in (("topology", topo), ("workload", wl)):
                for k, v in getattr(val, section).items():
                    _claim(err, owner, (section, k), axis)
                    target[k] = v
            for kind in ("features", "settings"):
                for tgt, kv in getattr(val, kind).items():
                    for k, v in kv.items():
                        _claim(err, owner, ("knob", tgt, k), axis)
                        changes[(tgt, k)] = v

        def blame(section: str, key: str, params: dict = params, owner: dict = owner) -> tuple:
            axis = owner.get((section, key))
            if axis is None:
                return (section, key)
            return paths.get((axis, params[axis]), ("axes", axis, params[axis])) + (key,)

        key = ",".join(f"{a}={v}" for a, v in params.items()) or "default"
        cell = Cell(key=key, params=params, topology=err.model(TopologySpec, topo, ("topology",)),
                    workload=err.model(WorkloadSpec, wl, ("workload",)),
                    changes=tuple((t, k, v) for (t, k), v in changes.items()))
        check_cell(err, cell, blame)
        cells.append(cell)
    return cells


def _claim(err: PlanErrors, owner: dict, what: tuple, axis: str) -> None:
    if what in owner and owner[what] != axis:
        err.fail(("axes", axis), f"axes '{owner[what]}' and '{axis}' both set {'.'.join(map(str, what[1:]))}")
    owner[what] = axis


def matches(params: dict[str, str], f: dict[str, str]) -> bool:
    return all(params.get(a) == v for a, v in f.items())


def fmt(f: dict[str, str]) -> str:
    return "{" + ", ".join(f"{a}: {v}" for a, v in f.items()) + "}"
