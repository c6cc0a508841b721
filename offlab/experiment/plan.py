"""Plans: YAML → validated, typed objects. No code is executed from a plan.

A plan names a topology, axes of named values, a workload, a repeat policy and a
baseline. Each axis value may set workload parameters, topology parameters,
ethtool features or any other knob on named hosts. Errors name the file, the line
and the field, and say what is allowed.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from offlab.errors import BadInput
from offlab.experiment import yamlio
from offlab.lab.model import TOPOLOGIES
from offlab.metrics import METRICS
from offlab.traffic import Workload

TOPOLOGY_KEYS = ("mtu", "underlay_mtu", "vni", "port", "ipv6")
WORKLOAD_KEYS = (*(f for f in Workload.__dataclass_fields__ if f != "ipv6"),
                 "search_max_loss", "search_low", "search_high", "search_steps")
# Flat shorthands an axis value may use, as in DESIGN.md's `{udp_payload: 1472, mtu: 1500}`.
FLAT_ALIASES = {"udp_payload": ("workload", "size"), "message_size": ("workload", "size"),
                "socket_buffer": ("workload", "sndbuf+rcvbuf")}
TARGET_RE = re.compile(r"^(machine|[a-z][a-z0-9]{0,15})(:[A-Za-z0-9_.:@-]{1,15})?$")
AXIS_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
VALUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,47}$")


def _kernel_features() -> frozenset[str]:
    text = resources.files("offlab.experiment").joinpath("kernel_features.txt").read_text()
    return frozenset(text.split())


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopologySpec(Strict):
    kind: Literal["veth", "bridge", "vxlan", "router", "ovs"]
    mtu: int = Field(1500, ge=68, le=65535)
    ipv6: bool = False
    underlay_mtu: int | None = Field(None, ge=68, le=65535)
    vni: int | None = Field(None, ge=1, le=2**24 - 1)
    port: int | None = Field(None, ge=1, le=65535)


class WorkloadSpec(Strict):
    tool: Literal["iperf3", "engine"] = "iperf3"
    protocol: Literal["tcp", "udp"] = "tcp"
    size: int | None = Field(None, ge=1, le=65527)
    gso: bool = False
    gro: bool = False
    batch: int | None = Field(None, ge=1, le=1024)
    rate: str | None = None
    streams: int = Field(1, ge=1, le=128)
    duration: float = Field(2.0, gt=0, le=3600)
    warmup: float = Field(0.5, ge=0, lt=600)
    reverse: bool = False
    sndbuf: int | None = Field(None, ge=1024)
    rcvbuf: int | None = Field(None, ge=1024)
    client_cpu: int | None = 0
    server_cpu: int | None = 1
    # Zero-loss search (seed 002): binary search on the offered pps until loss ≤ search_max_loss.
    search_max_loss: float | None = Field(None, ge=0, lt=1)
    search_low: str = "10kpps"
    search_high: str = "2Mpps"
    search_steps: int = Field(8, ge=2, le=20)

    def traffic(self, ipv6: bool) -> Workload:
        """The traffic part, for one measurement."""
        fields = {k: v for k, v in self.model_dump().items() if not k.startswith("search_")}
        return Workload(**fields, ipv6=ipv6)

    @field_validator("search_low", "search_high")
    @classmethod
    def _pps(cls, v: str) -> str:
        if not re.fullmatch(r"\d+(\.\d+)?\s*[kM]?pps", str(v)):
            raise ValueError("a search bound is a packet rate like 10kpps or 2Mpps")
        return v

    @model_validator(mode="after")
    def _search(self) -> "WorkloadSpec":
        if self.search_max_loss is not None and self.tool != "engine":
            raise ValueError("a zero-loss search needs tool: engine (it counts every datagram)")
        return self

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+(\.\d+)?\s*([kMG]?(pps|bit)?|[kMG])?", str(v)):
            raise ValueError("a rate is like 100kpps, 1Mpps, 500M or 1G (bit/s)")
        return v


class RepeatSpec(Strict):
    min: int = Field(3, ge=1, le=1000)
    max: int = Field(10, ge=1, le=1000)
    level: float = Field(99.0, gt=50, lt=100)
    width: float = Field(5.0, gt=0, le=200)
    metric: str = "throughput_bps"

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if v not in METRICS:
            raise ValueError(f"unknown metric; choose one of {', '.join(METRICS)}")
        return v

    @model_validator(mode="after")
    def _order(self) -> "RepeatSpec":
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be ≥ min ({self.min})")
        return self


class CaptureSpec(Strict):
    host: str = "server"
    iface: str | None = None
    frames: int = Field(2000, ge=1, le=1_000_000)
    rounds: Literal["first", "all"] = "first"


class AxisValue(Strict):
    """What one named value of an axis sets."""

    workload: dict[str, Any] = {}
    topology: dict[str, Any] = {}
    features: dict[str, dict[str, Any]] = {}  # target → {feature: on/off}
    settings: dict[str, dict[str, Any]] = {}  # target → {knob key: value}


@dataclass(frozen=True)
class Cell:
    key: str  # "payload=1472@1500,offload=on"
    params: dict[str, str]  # axis → value name
    topology: TopologySpec
    workload: WorkloadSpec
    changes: tuple[tuple[str, str, Any], ...]  # (target, knob key, value)

    @property
    def lab_key(self) -> str:
        """Cells with the same lab_key share one lab."""
        return self.topology.model_dump_json()

    def settings(self) -> dict:
        return {"topology": self.topology.model_dump(), "workload": self.workload.model_dump(),
                "changes": [list(c) for c in self.changes]}


@dataclass
class Plan:
    source: str
    text: str
    name: str
    description: str
    topology: TopologySpec
    workload: WorkloadSpec
    repeat: RepeatSpec
    axes: dict[str, dict[str, AxisValue]]
    only: list[dict[str, str]]
    exclude: list[dict[str, str]]
    baseline: dict[str, str] | None
    capture: CaptureSpec | None
    budget_s: float | None
    seed: int | None
    cells: list[Cell] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "name": self.name, "description": self.description, "topology": self.topology.model_dump(),
            "workload": self.workload.model_dump(), "repeat": self.repeat.model_dump(),
            "axes": {a: {n: v.model_dump() for n, v in vals.items()} for a, vals in self.axes.items()},
            "only": self.only, "exclude": self.exclude, "baseline": self.baseline,
            "capture": self.capture.model_dump() if self.capture else None, "budget_s": self.budget_s,
            "seed": self.seed,
        }


TOP_KEYS = {"name", "description", "topology", "axes", "only", "exclude", "workload", "repeat", "baseline",
            "capture", "budget", "seed", "warmup"}


def load_plan(text: str, source: str = "<plan>", *, quick: bool = False) -> Plan:
    """Parse and validate a plan; BadInput names file:line and the field."""
    data, lines = yamlio.load(text, source)
    err = _Errors(source, lines)
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
    capture = None
    if data.get("capture") is not None:
        cap = data["capture"]
        if isinstance(cap, dict) and "on" in cap:  # DESIGN.md's `capture: {on: server}`
            cap = {**{k: v for k, v in cap.items() if k != "on"}, "host": cap["on"]}
        capture = err.model(CaptureSpec, cap, ("capture",))
        _check_target(err, ("capture", "host"), capture.host + (f":{capture.iface}" if capture.iface else ""))
    axes = _axes(err, data.get("axes") or {})
    only = _filters(err, data.get("only") or [], "only", axes)
    exclude = _filters(err, data.get("exclude") or [], "exclude", axes)
    baseline = data.get("baseline")
    if baseline is not None:
        baseline = _filters(err, [baseline], "baseline", axes)[0]
    budget = _budget(err, data.get("budget"))
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        err.fail(("seed",), "seed must be an integer")
    plan = Plan(source=source, text=text, name=name, description=str(data.get("description") or ""),
                topology=topology, workload=workload, repeat=repeat, axes=axes, only=only, exclude=exclude,
                baseline=baseline, capture=capture, budget_s=budget, seed=seed)
    plan.cells = expand(plan, err)
    if not plan.cells:
        err.fail(("only",) if only else ("axes",), "the filters leave no cell to run")
    if baseline and not any(_matches(c.params, baseline) for c in plan.cells):
        err.fail(("baseline",), f"baseline {_fmt(baseline)} matches no cell")
    if quick:
        plan.repeat = RepeatSpec(min=1, max=2, level=plan.repeat.level, width=max(plan.repeat.width, 20),
                                 metric=plan.repeat.metric)
    return plan


def _axes(err: "_Errors", raw: Any) -> dict[str, dict[str, AxisValue]]:
    if not isinstance(raw, dict):
        err.fail(("axes",), "axes is a mapping: axis name → list or mapping of values")
    axes = {}
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
            axes[axis][vname] = _axis_value(err, v, vpath)
    return axes


def _auto_name(v: Any) -> str:
    if isinstance(v, dict):
        # {udp_payload: 1472, mtu: 1500} → "1472@1500", as the built-in suites name them
        return "@".join(_scalar_name(x) for x in v.values() if not isinstance(x, (dict, list)))[:48] or "value"
    return _scalar_name(v)


def _scalar_name(x: Any) -> str:
    if isinstance(x, bool):
        return "on" if x else "off"
    return str(x)


def _axis_value(err: "_Errors", raw: Any, path: tuple) -> AxisValue:
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
                _check_target(err, kpath + (target,), target)
                if not isinstance(kv, dict):
                    err.fail(kpath + (target,), f"{key} of {target} must map names to values")
                for k, v in kv.items():
                    if key == "features":
                        _check_feature(err, kpath + (target, k), k, v)
                out[key].setdefault(str(target), {}).update(kv)
        elif key in FLAT_ALIASES:
            section, field_name = FLAT_ALIASES[key]
            for f in field_name.split("+"):
                out[section][f] = val
        elif key in TOPOLOGY_KEYS:
            out["topology"][key] = val
        elif key in WORKLOAD_KEYS:
            out["workload"][key] = val
        else:
            err.unknown(kpath, key, {"workload", "topology", "features", "settings", *FLAT_ALIASES,
                                     *TOPOLOGY_KEYS, *WORKLOAD_KEYS})
    for section, model in (("workload", WorkloadSpec), ("topology", TopologySpec)):
        probe = dict(out[section])
        if section == "topology":
            probe.setdefault("kind", "veth")  # only the keys the value sets are checked here
        err.model(model, probe, path, partial_keys=set(out[section]))
    return AxisValue(**out)


def _check_target(err: "_Errors", path: tuple, target: Any) -> None:
    if not isinstance(target, str) or not TARGET_RE.fullmatch(target):
        err.fail(path, f"{target!r} is not a host: use client, server, switch, router, hv1, hv2 "
                       "(optionally :IFACE or :to-HOST), or machine for host-wide sysctls")


def _check_feature(err: "_Errors", path: tuple, name: Any, value: Any) -> None:
    from offlab.knobs.features import ALIASES, LEGACY, LONG_TO_SHORT

    known = _kernel_features() | set(LEGACY) | set(ALIASES) | set(LONG_TO_SHORT)
    if name not in known:
        close = difflib.get_close_matches(str(name), sorted(known), n=3, cutoff=0.6)
        err.fail(path, f"unknown feature {name!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                      "; `ethtool -k` lists the features"))
    if not (isinstance(value, bool) or value in ("on", "off")):
        err.fail(path, f"feature {name} must be on or off, got {value!r}")


def _filters(err: "_Errors", raw: Any, what: str, axes: dict) -> list[dict[str, str]]:
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
            vname = _scalar_name(value)
            if vname not in axes[axis]:
                err.unknown(path + (axis,), vname, set(axes[axis]), what=f"value of axis '{axis}'")
            norm[str(axis)] = vname
        out.append(norm)
    return out


def _budget(err: "_Errors", raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw > 0:
        return float(raw)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)", str(raw))
    if not m:
        err.fail(("budget",), "budget is seconds (600) or a duration like 90s, 10m, 2h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def expand(plan: Plan, err: "_Errors") -> list[Cell]:
    """The cartesian product of the axes, after only/exclude; later axes may not fight earlier ones."""
    names = list(plan.axes)
    cells = []
    for combo in itertools.product(*(plan.axes[a].items() for a in names)) if names else [()]:
        params = {a: v for a, (v, _) in zip(names, combo)}
        if plan.only and not any(_matches(params, f) for f in plan.only):
            continue
        if any(_matches(params, f) for f in plan.exclude):
            continue
        topo = plan.topology.model_dump()
        wl = plan.workload.model_dump()
        changes: dict[tuple[str, str], Any] = {}
        owner: dict[tuple, str] = {}
        for axis, (vname, val) in zip(names, combo):
            for section, target in (("topology", topo), ("workload", wl)):  # noqa: B007
                for k, v in getattr(val, section).items():
                    _claim(err, owner, (section, k), axis, names)
                    target[k] = v
            for kind in ("features", "settings"):
                for tgt, kv in getattr(val, kind).items():
                    for k, v in kv.items():
                        _claim(err, owner, ("knob", tgt, k), axis, names)
                        changes[(tgt, k)] = v
        key = ",".join(f"{a}={v}" for a, v in params.items()) or "default"
        cells.append(Cell(key=key, params=params, topology=err.model(TopologySpec, topo, ("topology",)),
                          workload=err.model(WorkloadSpec, wl, ("workload",)),
                          changes=tuple((t, k, v) for (t, k), v in changes.items())))
    return cells


def _claim(err: "_Errors", owner: dict, what: tuple, axis: str, names: list[str]) -> None:
    if what in owner and owner[what] != axis:
        err.fail(("axes", axis), f"axes '{owner[what]}' and '{axis}' both set {'.'.join(map(str, what[1:]))}")
    owner[what] = axis


def _matches(params: dict[str, str], f: dict[str, str]) -> bool:
    return all(params.get(a) == v for a, v in f.items())


def _fmt(f: dict[str, str]) -> str:
    return "{" + ", ".join(f"{a}: {v}" for a, v in f.items()) + "}"


class _Errors:
    """Turns problems into one BadInput line: `file:line: field: what is wrong`."""

    def __init__(self, source: str, lines: dict[tuple, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: tuple, msg: str) -> None:
        line = yamlio.line_of(self.lines, path)
        where = f"{self.source}:{line}" if line else self.source
        field_name = ".".join(str(p) for p in path)
        raise BadInput(f"{where}: {field_name + ': ' if field_name and not msg.startswith(field_name) else ''}{msg}")

    def unknown(self, path: tuple, key: Any, allowed: set, what: str = "field") -> None:
        close = difflib.get_close_matches(str(key), sorted(map(str, allowed)), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        self.fail(path, f"unknown {what} {key!r}; {hint}allowed: {', '.join(sorted(map(str, allowed)))}")

    def model(self, model: type[BaseModel], data: Any, path: tuple, partial_keys: set | None = None):
        if not isinstance(data, dict):
            self.fail(path, f"must be a mapping of {', '.join(model.model_fields)}")
        try:
            return model(**data)
        except ValidationError as exc:
            for e in exc.errors():
                loc = tuple(e["loc"])
                if partial_keys is not None and (not loc or loc[0] not in partial_keys):
                    continue
                if e["type"] == "extra_forbidden":
                    self.unknown(path + loc, loc[-1], set(model.model_fields))
                got = e.get("input")
                self.fail(path + loc, f"{e['msg'].removeprefix('Value error, ')} (got {got!r})")
            return None


def load_plan_file(path: str, *, quick: bool = False) -> Plan:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise BadInput(f"cannot read plan {path}: {exc.strerror}") from None
    return load_plan(text, path, quick=quick)
