"""A sample as one typed record: what offlab.experiment.measure makes, the runner completes, witnesses,
metrics, reports and `results` read.

It is JSON only at its edges (`offlab measure --json`, the store's `samples.sample` column): readers of
stored JSON take `StoredSample.from_json(d)` there and use fields from then on; every key they do not
name is kept as it came (`extra`), so `from_json(d).to_json() == d`, key order included. A field's
default is what a reader takes for an absent key (0 for a counter, None for a figure); the key stays
absent in `to_json` unless the field was set since (or the record says it always stores it:
`StoredSample.measured`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

V = TypeVar("V", bound="JsonView")


def _view(cls: type, *, map: bool = False, list: bool = False, default_factory: Any = None) -> Any:
    """A field holding a nested view (or a dict or list of them); None by default unless a factory is given."""
    meta = {"view": cls, "map": map, "list": list}
    if default_factory is None:
        return field(default=None, metadata=meta)
    return field(default_factory=default_factory, metadata=meta)


@dataclass
class JsonView:
    """One JSON object as a dataclass: its named keys as fields, the rest in `extra`."""

    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _keys: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def _named(cls) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(cls) if f.name not in ("extra", "_keys")}

    @classmethod
    def from_json(cls: type[V], d: dict | None) -> V:
        d = d or {}
        named = cls._named()
        kw = {k: _load(named[k], v) for k, v in d.items() if k in named}
        return cls(**kw, extra={k: v for k, v in d.items() if k not in named}, _keys=tuple(d))

    @classmethod
    def keyed(cls: type[V], **values: Any) -> V:
        """A view made fresh that stores exactly these keys, in this order, whatever their values (as
        `StoredSample.measured` pins its own); a key it does not name goes to `extra`."""
        named = cls._named()
        return cls(**{k: v for k, v in values.items() if k in named},
                   extra={k: v for k, v in values.items() if k not in named}, _keys=tuple(values))

    def plus(self: V, **values: Any) -> V:
        """A copy that also stores these keys with these values: one it stored keeps its place, a new
        one goes after the rest (as `{**d, key: value}` does to a dict)."""
        named = self._named()
        keys = tuple(self.to_json())
        return dataclasses.replace(self, **{k: v for k, v in values.items() if k in named},
                                   extra={**self.extra, **{k: v for k, v in values.items() if k not in named}},
                                   _keys=(*keys, *(k for k in values if k not in keys)))

    def has(self, name: str) -> bool:
        """Whether its JSON holds key `name`: read, or set since to other than the field's default (a
        field's default is also what an absent key reads as: this tells the two apart)."""
        named = self._named()
        if name in self._keys or name in self.extra:
            return True
        return name in named and getattr(self, name) != _default(named[name])

    @property
    def empty(self) -> bool:
        """Whether its JSON holds no key at all (`{}`): read from one, or made and never set."""
        return not self.to_json()

    def to_json(self) -> dict:
        named = self._named()
        out: dict[str, Any] = {}
        for k in self._keys:
            out[k] = _dump(getattr(self, k)) if k in named else self.extra[k]
        for k, f in named.items():  # set since it was read
            if k not in out and getattr(self, k) != _default(f):
                out[k] = _dump(getattr(self, k))
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]


def _load(f: dataclasses.Field, v: Any) -> Any:
    """A nested object read as its view; anything else (None, a shape an older offlab stored) as it came."""
    cls = f.metadata.get("view")
    if cls is None:
        return v
    if f.metadata.get("map") and isinstance(v, dict):
        return {k: cls.from_json(x) if isinstance(x, dict) else x for k, x in v.items()}
    if f.metadata.get("list") and isinstance(v, list):
        return [cls.from_json(x) if isinstance(x, dict) else x for x in v]
    return cls.from_json(v) if isinstance(v, dict) and not (f.metadata.get("map") or f.metadata.get("list")) else v


def _dump(v: Any) -> Any:
    if isinstance(v, JsonView):
        return v.to_json()
    if isinstance(v, dict) and any(isinstance(x, JsonView) for x in v.values()):
        return {k: _dump(x) for k, x in v.items()}
    if isinstance(v, list) and any(isinstance(x, JsonView) for x in v):
        return [_dump(x) for x in v]
    return v


@dataclass
class SampleWorkload(JsonView):
    """What was asked (offlab.traffic Workload.to_dict, or an rr workload with its `kind`)."""

    tool: str | None = None
    protocol: str | None = None
    size: int | None = None
    gso: bool = False
    gro: bool = False
    ipv6: bool = False
    rate: str | None = None
    send: str | None = None  # the engine's send path (send, sendmmsg, zerocopy, io_uring, io_uring-zc)
    batch: int | None = None
    warmup: float = 0.0
    kind: str | None = None  # rr | rr-under-load; absent for a stream
    reverse: bool = False  # the server sent the data
    streams: int | None = None  # parallel flows
    client_cpu: int | None = None  # the CPU each side was pinned to
    server_cpu: int | None = None


@dataclass
class Series(JsonView):
    """One per-interval series of the tool (offlab.traffic.series: columns and rows, as stored)."""

    source: str | None = None
    interval_s: float | None = None  # asked for; None: the tool's own
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    intervals_dropped: int = 0  # rows the engine did not keep for its bound
    t0_mono_s: float | None = None  # its first row's start on its host's CLOCK_MONOTONIC

    def cols(self, *names: str) -> list[tuple[Any, ...]]:
        """Each row's values of the named columns, in that order; None where the series has no such column."""
        at = [self.columns.index(n) if n in self.columns else None for n in names]
        return [tuple(r[i] if i is not None and i < len(r) else None for i in at) for r in self.rows]


@dataclass
class Zerocopy(JsonView):
    """Zero-copy completions the engine saw (--send zerocopy: MSG_ZEROCOPY; io_uring-zc: SEND_ZC notifications)."""

    sends: int = 0
    completed: int = 0
    copied: int = 0
    pending_at_end: int = 0
    all_copied: bool | None = None
    notifications: int | None = None  # io_uring-zc: SEND_ZC notifications received
    via: str = "MSG_ZEROCOPY"  # the mechanism (samples before io_uring have no `via`)
    copied_flag: str = "SO_EE_CODE_ZEROCOPY_COPIED"  # the kernel's flag that says a send was copied


@dataclass
class Traffic(JsonView):
    """What the traffic tool reported (offlab.traffic TrafficResult.to_dict)."""

    tool: str | None = None
    throughput_bps: float | None = None
    sent_bps: float | None = None
    pps: float | None = None
    sent_pps: float | None = None
    datagrams_sent: int | None = None
    datagrams_received: int | None = None
    duplicates: int | None = None  # the engine's count of datagrams received twice
    loss: float | None = None
    loss_source: str | None = None  # "kernel" when the tool's own loss was impossible
    jitter_us: float | None = None
    latency_us: dict | None = None  # the engine's one-way latency: p50, p90, p99, max, ...
    retransmits: int | None = None
    errors: dict[str, int] = field(default_factory=dict)  # errno name → count
    receiver_stop: str | None = None
    sender_stop: str | None = None
    zerocopy: Zerocopy | None = _view(Zerocopy)
    series: list[Series] = _view(Series, list=True, default_factory=list)

    def error(self, name: str) -> int:
        return (self.errors or {}).get(name, 0)


@dataclass
class Iface(JsonView):
    """One lab interface's counter deltas over the window (`probes.interfaces["host:iface"]`)."""

    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_dropped: int = 0
    tx_dropped: int = 0
    rx_errors: int = 0
    tx_errors: int = 0
    rx_fifo: int = 0
    tx_fifo: int = 0
    rx_avg_bytes: float | None = None
    tx_avg_bytes: float | None = None

    def packets(self, way: str) -> int:
        return (self.rx_packets if way == "rx" else self.tx_packets) or 0

    def octets(self, way: str) -> int:
        return (self.rx_bytes if way == "rx" else self.tx_bytes) or 0

    def counter(self, name: str) -> int:
        """A drop or error counter by its name (rx_dropped, tx_fifo...), 0 when not read."""
        return (getattr(self, name) if name in self._named() else self.extra.get(name)) or 0


@dataclass
class Read(JsonView):
    """When a host's counters were read at the window's edges, in seconds from this machine's reference
    instants ([earliest, latest]); a host with a clock of its own also gives its offset's bounds."""

    start: list[float] = field(default_factory=lambda: [0.0, 0.0])
    end: list[float] = field(default_factory=lambda: [0.0, 0.0])
    own_window_s: float | None = None
    clock_offset_s: list[float] | None = None
    answered_s: list[float] | None = None  # a channel host: how long after each edge its read's answer came

    @property
    def has_own_clock(self) -> bool:
        return "own_window_s" in self._keys or self.own_window_s is not None


Counters = dict[str, dict[str, int]]  # /proc/net/snmp group → counter → delta


def counter(snmp: dict[str, Counters], role: str, group: str, name: str, default: int | None = 0) -> int | None:
    """One host's /proc/net/snmp(6) counter delta from `snmp` (role → group → counter), `default` when
    that host, group or counter was not read."""
    return ((snmp or {}).get(role) or {}).get(group, {}).get(name, default)


@dataclass
class Cpu(JsonView):
    """CPU over the window: one CPU's split in % (`per_cpu`), a side's (`probes.cpu.side(name)`: the split of
    the CPU it was pinned to), or the whole machine's (`system`: CPU seconds, and shares of all its CPUs' time)."""

    cpu: str | None = None  # the CPU the side was pinned to
    busy: float | None = None  # % of the window
    user: float = 0.0
    system: float = 0.0
    softirq: float = 0.0
    irq: float = 0.0
    idle: float | None = None
    steal: float | None = None  # % of the window the hypervisor ran other work on it
    busy_s: float | None = None  # system: CPU seconds busy
    cpus: int | None = None  # system: how many CPUs it counts
    steal_s: float | None = None  # system: CPU seconds stolen
    busy_pct: float | None = None  # system: % of all its CPUs' time
    steal_pct: float | None = None  # system: % of the window the hypervisor ran other work

    def on(self, cpu: str) -> Cpu:
        """This split as a side's: the CPU (or CPUs) it was taken on stored first."""
        return dataclasses.replace(self, cpu=cpu, _keys=("cpu", *self._keys))


CPU_SIDES = ("client", "server", "system")


@dataclass
class OwnKernelCpu(JsonView):
    """The CPUs of a host with a kernel of its own (a guest, an SSH host), all of them: offlab pins none."""

    per_cpu: dict[str, Cpu] = _view(Cpu, map=True, default_factory=dict)
    system: Cpu | None = _view(Cpu)


@dataclass
class CpuAccount(JsonView):
    """The window's CPU (`probes.cpu`): each CPU of this machine, the client's and server's, the whole
    machine's, and each host with a kernel of its own read apart (`own_kernel`)."""

    per_cpu: dict[str, Cpu] = _view(Cpu, map=True, default_factory=dict)
    client: Cpu | None = _view(Cpu)
    server: Cpu | None = _view(Cpu)
    system: Cpu | None = _view(Cpu)
    own_kernel: dict[str, OwnKernelCpu] = _view(OwnKernelCpu, map=True, default_factory=dict)

    def side(self, name: str) -> Cpu | None:
        """client, server or system; None for any other name, or a side not read."""
        return getattr(self, name) if name in CPU_SIDES else None

    def without_per_cpu(self) -> CpuAccount:
        """The account without each CPU's: what an rr phase stores beside its figures."""
        return dataclasses.replace(self, per_cpu={}, _keys=tuple(k for k in self._keys if k != "per_cpu"))


@dataclass
class Process(JsonView):
    """A busy process over the window (`probes.processes`)."""

    pid: int | None = None
    comm: str = ""
    role: str | None = None
    cpu_pct: float = 0.0


@dataclass
class Toggle(JsonView):
    """A testpmd feature's read (`show port N gro`)."""

    on: bool = False


@dataclass
class GsoSetting(JsonView):
    """testpmd's GSO on a port (`show port N gso`): on, and the size it cuts to (whole frame)."""

    on: bool = False
    segsz: int | None = None


@dataclass
class TestpmdPortSettings(JsonView):
    """What testpmd says is in force on one port."""

    __test__ = False  # not a pytest class, whatever its name

    gro: Toggle = _view(Toggle, default_factory=Toggle)
    gso: GsoSetting = _view(GsoSetting, default_factory=GsoSetting)
    tso_segsz: int = 0  # 0: TSO off on the port


@dataclass
class TestpmdSettings(JsonView):
    """testpmd's own read of what was in force (`probes.testpmd_settings`; Testpmd.settings)."""

    __test__ = False  # not a pytest class, whatever its name

    fwd: str | None = None
    ports: dict[str, TestpmdPortSettings] = _view(TestpmdPortSettings, map=True, default_factory=dict)

    def port(self, n: str) -> TestpmdPortSettings:
        """Port `n`'s settings (read in process its keys are numbers, from JSON strings); none read: all off."""
        return next((v for k, v in self.ports.items() if str(k) == n), TestpmdPortSettings())


@dataclass
class Aligned(JsonView):
    """The local hosts' counters sampled when a channel host read its own (offlab.probes `aligned`)."""

    snmp: dict[str, Counters] = field(default_factory=dict)
    reads: dict[str, Read] = _view(Read, map=True, default_factory=dict)


@dataclass
class LocalSampling(JsonView):
    """What sampling this machine's counters for `aligned` took (`probes.local_sampling`)."""

    samples: int = 0
    every_s: float | None = None  # the interval asked between two samples
    cpu_s: float | None = None  # the sampler thread's own CPU time


@dataclass
class TraceDrop(JsonView):
    """Datagrams the kernel dropped at one place (skb:kfree_skb, `probes.trace.drops`); in the kernel's
    account of loss (`kernel_account.loss`) a place also has its share of the lost, or says why its drops
    were not loss (`not_lost`: `what`)."""

    host: str = ""
    device: str | None = None  # None: dropped with no device (at a socket), or in a guest's own kernel
    reason: str = ""
    location: str | None = None  # the kernel function that dropped it
    datagrams: int = 0  # a dropped super-packet by its segments; in `unit` where one is given
    unit: str | None = None  # "skbs": a guest's own kernel counts a super-packet as one
    share: float | None = None
    what: str | None = None


@dataclass
class TraceFrames(JsonView):
    """The frames one device's NAPI handed to GRO (`probes.trace.gro_in`)."""

    host: str = ""
    device: str = ""
    frames: int = 0


@dataclass
class TraceSkbs(JsonView):
    """skbs of one gso_type handed to a device's queue or driver, or passed up from it, and their segments
    (`probes.trace.queue`, `xmit`, `rx`)."""

    host: str = ""
    device: str = ""
    gso_type: str = "-"  # names joined by '|'; "?": a guest's super-packets, of a type its tracepoint lacks
    skbs: int = 0
    segments: int = 0
    segments_inferred: bool = False  # a guest's: its tracepoint does not carry them


@dataclass
class HistHow(JsonView):
    """How a guest's or SSH host's own kernel was traced (`probes.trace.hist[role]`)."""

    tool: str | None = None
    drops_counted_in: str | None = None
    reasons: str | None = None  # why its drop reasons are numbers


@dataclass
class TraceAccount(JsonView):
    """The kernel's account of the window from its tracepoints (`probes.trace`, offlab.probes.trace):
    drops by place, and per device the skbs handed to its queue and driver and passed up, with the frames
    its NAPI handed to GRO; or why it was not taken (`unavailable`)."""

    unavailable: str | None = None
    tool: str | None = None  # bpftrace, or hist triggers where only guests were traced
    window_s: float | None = None
    printed_s: list[float] | None = None  # how late each edge's maps were printed
    drops: list[TraceDrop] = _view(TraceDrop, list=True, default_factory=list)
    gro_in: list[TraceFrames] = _view(TraceFrames, list=True, default_factory=list)
    queue: list[TraceSkbs] = _view(TraceSkbs, list=True, default_factory=list)
    xmit: list[TraceSkbs] = _view(TraceSkbs, list=True, default_factory=list)
    rx: list[TraceSkbs] = _view(TraceSkbs, list=True, default_factory=list)
    # how long after each edge's last counters' read the kernel's edge came
    edge_lag_s: list[float | None] | None = None
    hist: dict[str, HistHow] = _view(HistHow, map=True, default_factory=dict)  # role → how its kernel was traced
    not_traced: list[str] = field(default_factory=list)  # the hosts whose kernel was not, and why


@dataclass
class Agreement(JsonView):
    """The kernel's count against another (offlab.stats.agreement); beside a counter's loss place also that
    counter and the drop reasons that count the same datagrams (`by_reason`)."""

    counter: str | None = None
    reasons: list[str] = field(default_factory=list)
    kernel: int = 0
    other: int = 0
    difference: int = 0
    difference_share: float | None = None
    known_to: float = 0
    agree: bool = False


@dataclass
class KernelLoss(JsonView):
    """Lost datagrams by the kernel's drop reason (`kernel_account.loss`), or a cell's samples' summed
    (then `samples`): the places with their shares and the unseen share add up to 1."""

    dropped: int = 0
    lost: int | None = None
    places: list[TraceDrop] = _view(TraceDrop, list=True, default_factory=list)
    unseen: int = 0  # lost that no tracepoint saw
    unseen_share: float = 0.0
    not_lost: list[TraceDrop] = _view(TraceDrop, list=True, default_factory=list)
    lost_bounds: list[int] | None = None  # the tool's rows put the window's lost between these
    unseen_at_edges: bool = False  # the unseen is the edge rows' part, within lost_bounds
    vs_lost: Agreement | None = _view(Agreement)
    vs_counters: Agreement | None = _view(Agreement)
    by_reason: list[Agreement] = _view(Agreement, list=True, default_factory=list)
    samples: int | None = None  # a cell's: how many samples


@dataclass
class GsoTally(JsonView):
    """The super-packets of one gso_type and their segments."""

    super_packets: int = 0
    segments: int = 0


@dataclass
class Tally(JsonView):
    """skbs and segments at one part of a hop, and the super-packets among them by gso_type."""

    skbs: int = 0
    segments: int = 0
    super_packets: int = 0
    super_segments: int = 0
    by_type: dict[str, GsoTally] = _view(GsoTally, map=True, default_factory=dict)


@dataclass
class Hop(JsonView):
    """One device by the kernel's account (`kernel_account.hops`): what its queue and driver were handed,
    what it passed up, the frames it gave GRO, and what was cut in software or merged there."""

    host: str = ""
    device: str = ""
    queued: Tally = _view(Tally, default_factory=Tally)
    sent: Tally = _view(Tally, default_factory=Tally)
    received: Tally = _view(Tally, default_factory=Tally)
    gro_in: int = 0
    software_segmented: int = 0  # super-packets its queue was handed and its driver was not
    gro_built: int = 0  # super-packets GRO built here


@dataclass
class UsoVerdict(JsonView):
    """Was USO exercised by the kernel's account (`kernel_account.uso`), beside the counters' witness."""

    exercised: bool = False
    super_packets: int = 0
    segments: int = 0
    devices: list[str] = field(default_factory=list)
    skbs: int = 0
    segmented_in_software_at: list[str] = field(default_factory=list)
    counters: str | None = None  # the counters' witness's status
    agree: bool | None = None


@dataclass
class EffectVerdict(JsonView):
    """The kernel's verdict on one setting the counters' witnesses judged (`kernel_account.effects`)."""

    setting: str = ""
    where: str = ""
    kernel: str = ""  # exercised | not exercised
    detail: str = ""
    counters: str | None = None  # the counters' witness's status
    agree: bool | None = None


@dataclass
class KernelAccount(JsonView):
    """The kernel's account of a sample beside the counters' (offlab.experiment.kernel_account): loss by
    drop reason, each hop's segmentation and merging, USO's verdict and the second source for the
    counters' effect witnesses; or why it was not taken (`unavailable`)."""

    unavailable: str | None = None
    loss: KernelLoss | None = _view(KernelLoss)
    hops: list[Hop] = _view(Hop, list=True, default_factory=list)
    uso: UsoVerdict | None = _view(UsoVerdict)
    effects: list[EffectVerdict] = _view(EffectVerdict, list=True, default_factory=list)
    not_traced: list[str] = field(default_factory=list)


@dataclass
class Probes(JsonView):
    """Every probe's deltas over the window (offlab.probes ProbeSession.result): the session's core
    counters as fields; a probe of its own (a module of offlab/probes/edge/) through `of`, by the view
    its module defines, so a new probe adds nothing here."""

    window_s: float = 0.0
    t0_mono_s: float | None = None
    reads: dict[str, Read] = _view(Read, map=True, default_factory=dict)
    aligned: Aligned | None = _view(Aligned)
    local_sampling: LocalSampling | None = _view(LocalSampling)
    cpu: CpuAccount = _view(CpuAccount, default_factory=CpuAccount)
    processes: list[Process] = _view(Process, list=True, default_factory=list)
    interfaces: dict[str, Iface] = _view(Iface, map=True, default_factory=dict)
    snmp: dict[str, Counters] = field(default_factory=dict)  # role → group → counter
    testpmd_settings: TestpmdSettings | None = _view(TestpmdSettings)
    mtus: dict[str, int] = field(default_factory=dict)
    trace: TraceAccount | None = _view(TraceAccount)  # the kernel's account from its tracepoints, when asked

    def of(self, probe: Any) -> Any:
        """A probe's stored record as that probe's view: `probe` (an offlab.probes.base.Probe class) names
        its key and its field (`stored`, as `_view` makes one); an absent key reads as the field's default."""
        return _load(probe.stored, self.extra[probe.key]) if probe.key in self.extra else _default(probe.stored)

    def iface(self, name: str | None) -> Iface:
        """Interface `name`'s counters; one that moved nothing (or no name) reads as all zero."""
        return (self.interfaces.get(name) if name else None) or Iface()

    def own_kernel(self) -> set[str]:
        """The roles with a kernel of their own (a guest, an SSH host), whose CPUs are read apart."""
        return set(self.cpu.own_kernel)

    def counter(self, role: str, group: str, name: str, default: int | None = 0) -> int | None:
        """One host's /proc/net/snmp(6) counter delta over the window, `default` when not read."""
        return counter(self.snmp, role, group, name, default)

    def loss_view(self) -> tuple[dict[str, Counters], dict[str, Read]]:
        """(snmp, reads) for witnesses across hosts: where a channel host took part, the local hosts'
        counters sampled when it read its own (`aligned`), else the window's."""
        if self.aligned:
            return self.aligned.snmp or {}, self.aligned.reads or {}
        return self.snmp or {}, self.reads or {}


@dataclass
class Capture(JsonView):
    """What the wire showed (offlab.probes.capture CaptureSummary.to_dict)."""

    host: str = ""
    iface: str = ""
    frames: int = 0
    verdict: str = ""
    largest_frame: int | None = None
    mtu: int | None = None  # of the interface it ran on
    ip_fragments: int = 0
    fragmented_datagrams: int = 0
    fragments_per_datagram: int | None = None  # the most common count
    udp_payload_sizes: dict = field(default_factory=dict)  # payload bytes → datagrams seen (JSON: bytes as text)


@dataclass
class Check(JsonView):
    """One second witness of a headline figure: what it compared, whether it held, and the values each side gave."""

    check: str = ""
    ok: bool = False
    detail: str = ""
    tool: float | None = None  # loss: the tool's, over `tool_over` (the window, else its whole run)
    tool_over: str | None = None
    tool_whole_run: float | None = None
    kernel: float | None = None  # loss: the kernel's over the window, from these counts
    kernel_sent: int | None = None
    kernel_received: int | None = None
    skew_s: float | None = None  # how far apart the hosts' reads may be
    alignment_s: float | None = None  # how far the tool's intervals and the window's edges may be apart
    tolerance: float | None = None
    application_bytes: float | None = None  # bytes: what the application received, and the server's interfaces
    interface_bytes: int | None = None


@dataclass
class Consistency(JsonView):
    """The second witnesses of the headline figures (offlab.experiment.witnesses.cross_check)."""

    status: str = ""
    checks: list[Check] = _view(Check, list=True, default_factory=list)


@dataclass
class Segment(JsonView):
    """Packets vs bytes on one interface and direction (offlab.experiment.witnesses.segmentation)."""

    interface: str = ""
    direction: str = ""
    packets: int = 0
    bytes: int = 0
    avg_bytes: float | None = None
    mtu: int | None = None  # None: unknown
    verdict: str = ""
    line: str = ""


@dataclass
class LossPlace(JsonView):
    """One place where datagrams died (offlab.experiment.witnesses Place, as stored). Older samples
    counted every place as datagrams and stored no `unit`, `datagrams`, `low` or `high`."""

    host: str | None = None
    where: str = ""
    what: str | None = None
    count: int = 0
    layer: str | None = None
    unit: str = "datagrams"  # or "packets": converted at per_packet
    datagrams: float | None = None
    low: float | None = None
    high: float | None = None
    per_packet: float | None = None
    basis: str | None = None
    share: float = 0.0

    def bound(self, name: str) -> float:
        """datagrams, low or high; an older place's count where it stored none."""
        v = getattr(self, name)
        return self.count if v is None else v


@dataclass
class NotLost(JsonView):
    """Sends counted as drops that were not lost (the engine sent them again)."""

    where: str = ""
    count: int = 0
    what: str | None = None


@dataclass
class LossAttribution(JsonView):
    """Where a sample's lost datagrams died (offlab.experiment.witnesses.attribute_loss), or a cell's samples'
    summed (offlab.report.format.merge_attributions: then `samples`, and `cell` in the report)."""

    lost: int = 0
    sent: int | None = None
    lost_source: str | None = None
    lost_over: str | None = None  # absent: stored by an older offlab (format.OLDER_ATTRIBUTION)
    skew_s: float | None = None
    lost_uncertainty: int | None = None  # the skew's share plus lost_in_flight
    lost_in_flight: int | None = None  # packets in this machine's input backlogs at an edge (absent: none, or not read)
    # from the tool's rows: the lost in the window lies between these (its edge rows count in part in `lost`)
    lost_low: int | None = None
    lost_high: int | None = None
    detection_lag_s: float | None = None  # how much further the bounds reach: the receiver's largest lag
    places: list[LossPlace] = _view(LossPlace, list=True, default_factory=list)
    explained: float | None = None
    explained_low: float | None = None  # absent in older samples
    explained_high: float | None = None
    unexplained: float = 0
    # the share no place covers; with the places' shares it adds up to exactly 1 (absent in older samples)
    unexplained_share: float | None = None
    overshoot: int | None = None  # the places' estimates over the lost count: shares are of their sum
    unread: list[str] = field(default_factory=list)
    not_lost: list[NotLost] = _view(NotLost, list=True, default_factory=list)
    receiver_absent: str | None = None
    samples: int | None = None  # merged: how many samples
    cell: str | None = None  # merged, in a report: the cell's key


@dataclass
class Effect(JsonView):
    """One setting's effect witness: what offlab.experiment.effects finds, stored with the sample
    (every field: `stored`) and read back."""

    setting: str = ""  # the key as set: testpmd.gro, tso, uso, gro, mtu, workload gso ...
    where: str = ""  # client:to-switch, switch (testpmd port 0), client (socket)
    value: str = ""
    status: str = ""  # exercised | set but not exercised | not applicable | off
    detail: str = ""  # what the counters say, with their numbers
    counters: dict = field(default_factory=dict)
    cause: str | None = None  # not exercised / not applicable: the likely reason

    def stored(self) -> Effect:
        """This effect as a sample stores it: every field, at its default too (its readers find every key)."""
        return dataclasses.replace(self, _keys=tuple(self._named()))


@dataclass
class NicRow(JsonView):
    """One virtio-net property's chain on a guest NIC (offlab.vm.virtio Row): QEMU's value, its feature bit
    offered and accepted, the features at the guest's and the tap's ends, and why they are what they are."""

    prop: str = ""
    value: str | None = None  # QEMU's effective value (None: unread)
    source: str = ""  # set | default | unread | absent
    bit: int = 0
    bit_name: str = ""
    offered: bool | None = None
    accepted: bool | None = None
    guest: dict[str, str] = field(default_factory=dict)  # guest ethtool feature → "on", "off [fixed]" ...
    tap: dict[str, str] = field(default_factory=dict)
    why: str = ""
    lacking: str = ""  # which side lacks the bit: QEMU, QEMU setting, backend, guest driver, or ""

    @property
    def fixed_off(self) -> bool:
        """Whether the guest's kernel holds one of this row's features off for good (`off [fixed]`)."""
        return any(v.startswith("off [fixed]") for v in self.guest.values())


@dataclass
class GuestNic(JsonView):
    """One guest NIC's negotiation chain (offlab.vm.virtio NicChain, read by offlab.lab.explain): where
    it is and one row per property, with what could not be read."""

    role: str = ""
    iface: str = ""
    device_id: str = ""
    tap: str | None = None
    tap_host: str | None = None
    rows: list[NicRow] = _view(NicRow, list=True, default_factory=list)
    problems: list[str] = field(default_factory=list)
    backend: str = ""


@dataclass
class Guest(JsonView):
    """How a QEMU guest of the lab ran (`guests[role]`): TCG marks the sample emulated."""

    accel: str | None = None
    vhost: bool | None = None
    qemu_version: str | None = None  # as the QEMU that ran the guest prints it (7.2.22, 10.0.2)
    qemu_package_version: str | None = None  # its Debian package version
    qemu_suite: str | None = None  # "installed" (the machine's own) or the archive suite offlab fetched it from
    kernel_release: str | None = None  # uname -r in the guest
    kernel_package: str | None = None  # the Debian package it came from, its version and archive suite
    kernel_package_version: str | None = None
    kernel_suite: str | None = None  # None: the machine's own apt (the default kernel)
    nics: list[GuestNic] = _view(GuestNic, list=True, default_factory=list)  # each NIC's chain at sample time


@dataclass
class Held(JsonView):
    """A setting in force during the sample, read back at the end of its window (`in_force`)."""

    where: str | None = None
    key: str | None = None
    value: Any = None


@dataclass
class KnobOutcome(JsonView):
    """What setting one knob for the sample's cell did (`knobs`, and the store's `requested_vs_actual`;
    offlab.knobs' Outcome.to_dict): the value found first, the value asked for and the value read back."""

    where: str | None = None
    key: str | None = None
    original: Any = None
    requested: Any = None
    actual: Any = None
    ok: bool = False
    reason: str | None = None  # not ok: why
    also_changed: dict[str, list[Any]] = field(default_factory=dict)  # feature → [before, after]
    also_changed_why: dict[str, str] = field(default_factory=dict)


@dataclass
class RrPhase(JsonView):
    """One request/response measurement of the sample (offlab.traffic.rr RrResult.to_dict, with the CPU
    over its window): `rr["idle"]`, and under load `rr["loaded"]`."""

    protocol: str | None = None
    request_size: int = 0
    response_size: int = 0
    flows: int = 0
    transactions_per_s: float = 0.0
    lost: int = 0
    rtt_p50_us: float | None = None
    rtt_p90_us: float | None = None
    rtt_p99_us: float | None = None
    rtt_p99_9_us: float | None = None
    rtt_max_us: float | None = None
    rtt_mean_us: float | None = None
    transactions: int | None = None  # answered in the window
    window_s: float | None = None
    cpu: CpuAccount | None = _view(CpuAccount)  # idle only: its probe window's, without each CPU's
    cpu_us_per_transaction: float | None = None
    series: list[Series] = _view(Series, list=True, default_factory=list)
    kernel_account: KernelAccount | None = _view(KernelAccount)  # rr-under-load's idle phase, traced: its own window's


@dataclass
class Rr(JsonView):
    """A request/response sample's round trips: alone (idle) and beside the stream (loaded), with the factor."""

    idle: RrPhase | None = _view(RrPhase)
    loaded: RrPhase | None = _view(RrPhase)
    loaded_over_idle: dict[str, float | None] = field(default_factory=dict)  # rtt_* key → loaded / idle
    # a request/response measurement stored whole in place of its phases (the shape rr samples first had,
    # and a bare RrResult stored by hand): its series
    series: list[Series] = _view(Series, list=True, default_factory=list)


@dataclass
class TrialKernelLoss(JsonView):
    """A zero-loss search trial's window by the kernel's account, in brief: its datagrams lost (`lost`), by
    place and reason (`places`: "host[:device] REASON" → datagrams) and what no tracepoint saw (`unseen`);
    or why there is no account (`unavailable`, alone)."""

    lost: int | None = None
    places: dict[str, int] = field(default_factory=dict)
    unseen: int | None = None
    unavailable: str | None = None


@dataclass
class SearchTrial(JsonView):
    """One trial of a zero-loss search: the rate asked, what the generator offered and the receiver got."""

    phase: str | None = None  # "search" | "confirm"
    target_pps: int = 0
    achieved_pps: float | None = None  # what the generator really offered
    received_pps: float | None = None
    sent: int | None = None
    received: int | None = None
    loss: float | None = None
    passed: bool = False
    generator_limited: bool = False  # it offered under 98 % of its target
    kernel_loss: TrialKernelLoss | None = _view(TrialKernelLoss)  # with --trace


@dataclass
class ZeroLossSearch(JsonView):
    """A zero-loss search (offlab.experiment.search): its bounds, its trials and what it found."""

    max_loss: float = 0.0
    low_pps: float | None = None
    high_pps: float | None = None
    confirm: int = 1
    trials: list[SearchTrial] = _view(SearchTrial, list=True, default_factory=list)
    found_pps: int | None = None  # the highest confirmed rate offered within max_loss
    received_pps: float | None = None
    generator_limited: bool = False  # no loss above the threshold up to the generator's ceiling
    generator_ceiling_pps: int | None = None
    lowest_failing_pps: int | None = None
    verdict: str | None = None


@dataclass
class GuestBoot(JsonView):
    """Which boot of a guest took the sample (a run that boots guests), and the run's boots so far."""

    boot: int = 0  # 1 = the run's first boot
    lab: str | None = None
    nic: dict[str, Any] = field(default_factory=dict)  # the NIC properties that boot had
    guest_cpus: int | None = None
    boots_so_far: int = 0


# The keys a measured sample always stores, null or empty too, in this order (what `offlab measure --json`
# and the store's samples have always held); a key after these is stored only once it has a value.
MEASURED_KEYS = ("lab", "topology", "workload", "started_at", "traffic", "probes", "service_demand_us_per_kib",
                 "capture", "notes", "search", "consistency", "loss_attribution", "segmentation", "rr", "effects",
                 "guests")


@dataclass
class StoredSample(JsonView):
    """One sample: as offlab.experiment.measure makes it, the runner completes it and the store keeps it.
    The fields after `guests` are stored in their order, each only once it has a value."""

    lab: str | None = None
    topology: str | None = None
    workload: SampleWorkload = _view(SampleWorkload, default_factory=SampleWorkload)
    started_at: float | None = None
    traffic: Traffic = _view(Traffic, default_factory=Traffic)
    probes: Probes = _view(Probes, default_factory=Probes)
    service_demand_us_per_kib: dict[str, float | None] = field(default_factory=dict)
    capture: Capture | None = _view(Capture)
    notes: list[str] = field(default_factory=list)
    search: ZeroLossSearch | None = _view(ZeroLossSearch)  # a zero-loss search's trials and verdict
    consistency: Consistency | None = _view(Consistency)
    loss_attribution: LossAttribution | None = _view(LossAttribution)
    segmentation: list[Segment] | None = _view(Segment, list=True)
    rr: Rr | None = _view(Rr)
    effects: list[Effect] | None = _view(Effect, list=True)
    guests: dict[str, Guest] | None = _view(Guest, map=True)  # role → how that guest ran
    kernel_account: KernelAccount | None = _view(KernelAccount)  # the kernel's account beside the counters'
    # a plan's sample: what the runner adds
    in_force: list[Held] | None = _view(Held, list=True)  # the settings it ran with, read back at its end
    knob_writes: dict[str, int] | None = None  # its cell's settings journalled and set, restored, kept
    knobs: list[KnobOutcome] | None = _view(KnobOutcome, list=True)  # its cell's settings made
    guest_boot: GuestBoot | None = _view(GuestBoot)  # which boot of the guest took it
    round_position: int | None = None  # where in its round it ran (the interleaving)

    @classmethod
    def measured(cls, **fields: Any) -> StoredSample:
        """A sample just measured: it stores MEASURED_KEYS whatever their values."""
        return cls(**fields, _keys=MEASURED_KEYS)

    def series_parts(self) -> list[tuple[str, list[Series]]]:
        """(dotted part, its series) for each part that holds per-interval series, in the order the sample
        stores them: the stream's ("traffic"), then a request/response measurement's stored whole ("rr"), then
        each request/response phase's ("rr.idle", "rr.loaded")."""
        parts = [("traffic", self.traffic.series if self.traffic else []),
                 ("rr", self.rr.series if self.rr is not None else [])]
        for phase in ("idle", "loaded"):
            held = getattr(self.rr, phase) if self.rr is not None else None
            parts.append((f"rr.{phase}", held.series if held is not None else []))
        return [(part, series) for part, series in parts if series]


@dataclass
class SampleRecord(JsonView):
    """A sample as the store gives it back (offlab.store Store.samples): its row, metrics and the sample."""

    id: int = 0
    cell_id: int = 0
    round: int = 0
    created_at: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    sample: StoredSample = _view(StoredSample, default_factory=StoredSample)
    requested_vs_actual: list[KnobOutcome] | None = _view(KnobOutcome, list=True)  # its cell's knobs, as set


def records(rows: list[dict]) -> list[SampleRecord]:
    """Store.samples' rows, read."""
    return [SampleRecord.from_json(r) for r in rows]
