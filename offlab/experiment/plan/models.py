"""The typed parts of a plan: topology, workload, repeat policy, capture, axis values, cells.

Types and choices are checked here; the ranges of workload values are Workload.check's
alone (offlab.traffic), applied to every cell once its topology is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from offlab.errors import BadInput
from offlab.catalog import NAMES as TOPOLOGY_NAMES
from offlab.metrics import METRICS
from offlab.traffic import Workload, default_protocol
from offlab.traffic.rate import parse_pps


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopologySpec(Strict):
    kind: Literal[TOPOLOGY_NAMES]  # type: ignore[valid-type]  # the records' names, catalog.py
    mtu: int = Field(1500, ge=68, le=65535)
    ipv6: bool = False
    underlay_mtu: int | None = Field(None, ge=68, le=65535)
    vni: int | None = Field(None, ge=1, le=2**24 - 1)
    port: int | None = Field(None, ge=1, le=65535)
    # vm: QEMU virtio-net device properties (boot-time: cells that differ here get their own guest)
    nic: dict[str, str | int | bool] = {}
    kernel_version: str | dict[str, str] | None = None  # every guest's, or per guest role (offlab.vm.kernels)
    qemu: str | dict[str, str] | None = None  # the QEMU every guest (or each role) runs on (offlab.vm.qemus)
    guest_cpus: int | None = Field(None, ge=1, le=8)  # vCPUs per guest (boot-time, like nic)
    pmd: Literal["tap", "af_packet"] | None = None  # dpdk: testpmd's ports (default tap)
    # dpdk, dpdk-vm: testpmd forwards (and busy-polls) all the time (poll, default) or only while offlab measures
    testpmd_idle: Literal["poll", "stop"] | None = None
    ports: list[str] | None = None  # phys: the two ports of this machine lent to the lab (client, server)

    @model_validator(mode="after")
    def _kernel_version(self) -> "TopologySpec":
        if self.kernel_version is not None:
            from offlab.lab.vm import check_kernel_version

            try:  # checked against the archive's index where offlab has it; fetched at lab up otherwise
                check_kernel_version(self.kernel_version, self.kind, resolve=False)
            except BadInput as e:
                raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _qemu(self) -> "TopologySpec":
        if self.qemu is not None:
            from offlab.lab.vm import check_qemu

            try:  # checked against the archive's lists where offlab has them; fetched at lab up
                check_qemu(self.qemu, self.kind, resolve=False)
            except BadInput as e:
                raise ValueError(str(e)) from None
        return self


# Plan fields of the request/response probe → RrWorkload's fields (offlab.traffic.rr).
RR_FIELDS = {"rr_protocol": "protocol", "request_size": "request_size", "response_size": "response_size",
             "rr_flows": "flows", "rr_rate": "rate", "rr_timeout": "timeout"}


class WorkloadSpec(Strict):
    # stream: the stream alone; rr: the request/response probe alone; rr-under-load: the probe alone,
    # then beside the stream (offlab.experiment.measure.measure_rr_under_load).
    kind: Literal["stream", "rr", "rr-under-load"] = "stream"
    tool: Literal["iperf3", "engine"] = "iperf3"
    protocol: Literal["tcp", "udp"] | None = None  # None: traffic.default_protocol(tool)
    size: int | None = None
    gso: bool = False
    gro: bool = False
    batch: int | None = None
    send: Literal["send", "sendmmsg", "zerocopy", "io_uring", "io_uring-zc"] | None = None  # engine tx's send path
    rate: str | None = None
    streams: int = 1
    duration: float = 2.0
    warmup: float = 0.5
    reverse: bool = False
    sndbuf: int | None = None
    rcvbuf: int | None = None
    client_cpu: int | None = 0
    server_cpu: int | None = 1
    # Count packets over 64 KiB per interface of the lab's namespaces (BIG TCP's proof; docs/results.md)
    big_packets: bool = False
    # Zero-loss search (seed 002): binary search on the offered pps until loss ≤ search_max_loss.
    search_max_loss: float | None = Field(None, ge=0, lt=1)
    search_low: str = "10kpps"
    search_high: str = "2Mpps"
    search_steps: int = Field(8, ge=2, le=20)
    # The request/response probe (kind rr / rr-under-load); ranges are RrWorkload.check's.
    rr_protocol: Literal["udp", "tcp", "tcp-crr"] = "udp"
    request_size: int = 64
    response_size: int = 64
    rr_flows: int = 1
    rr_rate: float | None = None  # transactions/s; None: closed loop
    rr_timeout: float = 1.0

    def traffic(self, ipv6: bool) -> Workload:
        """The traffic part, for one measurement."""
        fields = {k: v for k, v in self.model_dump().items()
                  if not k.startswith("search_") and k != "kind" and k not in RR_FIELDS}
        return Workload(**fields, ipv6=ipv6)

    def rr_workload(self, ipv6: bool):
        """The request/response probe, timed like the stream (warm-up, duration, CPUs)."""
        from offlab.traffic.rr import RrWorkload

        return RrWorkload(**{RR_FIELDS[k]: getattr(self, k) for k in RR_FIELDS}, duration=self.duration,
                          warmup=self.warmup, client_cpu=self.client_cpu, server_cpu=self.server_cpu, ipv6=ipv6)

    @field_validator("rate", mode="before")
    @classmethod
    def _rate_text(cls, v: Any) -> Any:
        # `rate: 1000000` is bit/s written as a number; the parser in offlab.traffic.rate judges it.
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("search_low", "search_high")
    @classmethod
    def _pps(cls, v: str) -> str:
        try:
            parse_pps(v, "a search bound")
        except BadInput as exc:
            raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _protocol(self) -> "WorkloadSpec":
        # Filled in without marking it set, so a cell whose axis picks the engine gets UDP
        # from a plan that named no protocol (expand carries over only the fields a plan set).
        if self.protocol is None:
            object.__setattr__(self, "protocol", default_protocol(self.tool))
        return self

    @model_validator(mode="after")
    def _search(self) -> "WorkloadSpec":
        if self.search_max_loss is not None and self.kind != "stream":
            raise ValueError(f"a zero-loss search measures a stream, not kind {self.kind}")
        if self.search_max_loss is not None and self.tool != "engine":
            raise ValueError("a zero-loss search needs tool: engine (it counts every datagram)")
        if parse_pps(self.search_low) >= parse_pps(self.search_high):
            raise ValueError(f"search_low ({self.search_low}) must be below search_high ({self.search_high})")
        return self


class RepeatSpec(Strict):
    min: int = Field(3, ge=1, le=1000)
    max: int = Field(10, ge=1, le=1000)
    level: float = Field(99.0, gt=50, lt=100)
    width: float = Field(5.0, gt=0, le=200)
    metric: str = "throughput_bps"
    # decided: repeat each comparison with the baseline until it is decided (offlab.stats'
    # sequential_decision); width: repeat each cell until its interval is `width` % (netperf -I).
    # None: decided when the plan has a baseline, else width.
    until: Literal["decided", "width"] | None = None
    equivalence: float = Field(5.0, gt=0, lt=100)  # ± % within which a comparison is "equivalent"

    def rule(self, has_baseline: bool) -> str:
        """The stopping rule in force: `until` as written, else decided when there is a baseline."""
        return self.until or ("decided" if has_baseline else "width")

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
    # Comparisons that decide the suite's headline: filters on the compared (non-baseline) cell.
    # Empty: every comparison is a headline one.
    headline: list[dict[str, str]] = field(default_factory=list)
    quick: list[dict[str, str]] = field(default_factory=list)  # --quick: cells run besides the headline's
    shape_rounds: int | None = None  # --quick: rounds of a cell outside the headline comparisons
    published: dict | None = None  # a source's reported ratios for some comparisons (plan.published)
    trace: bool = False  # every stream sample takes the kernel's account (offlab.probes.trace; run --trace)

    def to_dict(self) -> dict:
        return {
            "name": self.name, "description": self.description, "topology": self.topology.model_dump(),
            "workload": self.workload.model_dump(), "repeat": self.repeat.model_dump(),
            "axes": {a: {n: v.model_dump() for n, v in vals.items()} for a, vals in self.axes.items()},
            "only": self.only, "exclude": self.exclude, "baseline": self.baseline,
            "capture": self.capture.model_dump() if self.capture else None, "budget_s": self.budget_s,
            "seed": self.seed, "headline": self.headline, "quick": self.quick, "shape_rounds": self.shape_rounds,
            "published": self.published, "trace": self.trace,
        }
