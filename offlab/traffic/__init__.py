"""Workload drivers: iperf3 (TCP/UDP, JSON) and offlab-engine (UDP with GSO/GRO).

A driver starts its receiver in the server host, its sender in the client host,
each pinned to its own CPU, and returns a `TrafficResult` whose figures say what
they count and which side measured them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from offlab.errors import BadInput
from offlab.traffic.rate import parse_rate
from offlab.wire import UDP_HEADER, UDP_MAX_PAYLOAD

if TYPE_CHECKING:
    from offlab.sample import Traffic

# What each tool accepts (iperf3 3.12's own limits; the engine's in engine/src/args.rs).
SIZE_RANGE = {("iperf3", "udp"): (16, UDP_MAX_PAYLOAD[4]), ("iperf3", "tcp"): (1, 1 << 20),
              ("engine", "udp"): (24, None)}
MAX_BATCH = 1024
SEND_PATHS = ("send", "sendmmsg", "zerocopy", "io_uring", "io_uring-zc")  # offlab-engine tx --send
# The send paths that take a batch above 1: messages per sendmmsg() call, linked SQEs per io_uring_enter().
BATCHED_SEND_PATHS = ("sendmmsg", "io_uring", "io_uring-zc")
MAX_STREAMS = 128
MAX_BUFFER = 2**31 - 1
MAX_CPU = 4095
# The CLI option of each workload field, for messages; plans name the field itself.
OPTIONS = {"protocol": "--proto"}


class BadWorkload(BadInput):
    """A workload value that no tool would accept; names the field, so a plan can point at its line."""

    def __init__(self, field_name: str, value: object, why: str) -> None:
        self.field, self.value, self.why = field_name, value, why
        shown = "" if isinstance(value, bool) else f" {value}"
        super().__init__(f"{option_of(field_name)}{shown}: {why}")


def default_protocol(tool: str) -> str:
    """The protocol when none is named: the engine drives UDP only, iperf3 defaults to TCP."""
    return "udp" if tool == "engine" else "tcp"


def option_of(field_name: str) -> str:
    return OPTIONS.get(field_name, "--" + field_name.replace("_", "-"))


@dataclass
class Workload:
    tool: Literal["iperf3", "engine"] = "iperf3"
    protocol: Literal["tcp", "udp"] = "tcp"
    size: int | None = None  # UDP payload per datagram, or TCP write length
    gso: bool = False  # engine: UDP_SEGMENT on the sender
    gro: bool = False  # engine: UDP_GRO on the receiver
    batch: int | None = None  # engine: sendmmsg/recvmmsg batch
    # engine: how tx hands datagrams to the kernel: send, sendmmsg or zerocopy (send with MSG_ZEROCOPY);
    # None: send, or sendmmsg with batch > 1
    send: str | None = None
    rate: str | None = None  # engine: "100kpps", "1G"; iperf3: bit/s ("1G"); None = as fast as possible
    streams: int = 1
    duration: float = 2.0
    warmup: float = 0.5
    reverse: bool = False
    sndbuf: int | None = None  # socket send buffer (netperf -s)
    rcvbuf: int | None = None  # socket receive buffer (netperf -S)
    client_cpu: int | None = 0
    server_cpu: int | None = 1
    ipv6: bool = False
    # count packets over 64 KiB on every interface of the lab's namespaces (nftables; offlab.probes.edge.bigpackets)
    big_packets: bool = False

    def check(self) -> "Workload":
        """The one validation of a workload (CLI and plans alike); BadWorkload names the field."""
        validate(self)
        if self.tool == "iperf3":
            # iperf3 3.12 reads -t and -O as whole seconds (1.3 becomes 1); round up, and say so
            # by keeping the effective values in the workload that is recorded.
            self.duration, self.warmup = float(math.ceil(self.duration)), float(math.ceil(self.warmup))
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrafficResult:
    """What the traffic tool itself measured. Units are in the names."""

    tool: str
    protocol: str
    throughput_bps: float  # application bytes received / receive window, bit/s (receiver)
    sent_bps: float | None = None  # what the sender pushed, bit/s
    sent_pps: float | None = None  # datagrams the sender pushed per second (the offered rate it achieved)
    pps: float | None = None  # application datagrams received per second (UDP)
    datagrams_sent: int | None = None
    datagrams_received: int | None = None
    loss: float | None = None  # (sent - received) / sent
    duplicates: int | None = None
    reordered: int | None = None
    jitter_us: float | None = None
    latency_us: dict | None = None  # p50/p90/p99/max one-way (engine)
    retransmits: int | None = None  # TCP, sender side
    window_s: float | None = None  # receive window the throughput is over
    tool_cpu: dict | None = None  # the tool's own CPU figures, for comparison only
    errors: dict = field(default_factory=dict)  # errno name → count (engine tx)
    # engine --send zerocopy / io_uring-zc: the kernel's completions (sends, completed, copied, pending_at_end, all_copied)
    zerocopy: dict | None = None
    series: list = field(default_factory=list)  # per-interval rows (offlab.traffic.series), the receiver's first
    receiver_stop: str | None = None  # why the receiver stopped (engine: end | idle | duration | signal)
    # why the sender stopped (engine: duration | signal, the latter when offlab stopped it at the window's end)
    sender_stop: str | None = None
    client_pid: int | None = None
    server_pid: int | None = None
    raw: dict = field(default_factory=dict)

    def to_dict(self, with_raw: bool = False) -> dict:
        d = asdict(self)
        if not with_raw:
            d.pop("raw")
        return d

    def stored(self) -> Traffic:
        """These figures as a sample holds them (its `traffic`)."""
        from offlab.sample import Traffic  # here: offlab.traffic is read at every CLI start, its samples are not

        return Traffic.from_json(self.to_dict())


def validate(w: Workload) -> None:
    """Raise BadWorkload for the first value of `w` that a tool would refuse or misread."""
    if w.tool not in ("iperf3", "engine"):
        raise BadWorkload("tool", repr(w.tool), "choose iperf3 or engine")
    if w.protocol not in ("tcp", "udp"):
        raise BadWorkload("protocol", repr(w.protocol), "choose tcp or udp")
    if w.tool == "engine" and w.protocol != "udp":
        raise BadWorkload("protocol", w.protocol, "the engine drives UDP only: use udp, or tool iperf3 for TCP")
    if w.tool == "iperf3":
        for name in ("gso", "gro", "batch"):
            if getattr(w, name):
                raise BadWorkload(name, getattr(w, name), "needs tool engine (iperf3 3.12 has no UDP GSO/GRO/batching)")
    else:
        if w.streams != 1:
            raise BadWorkload("streams", w.streams, "parallel streams need tool iperf3 (the engine sends one flow)")
        if w.reverse:
            raise BadWorkload("reverse", w.reverse, "needs tool iperf3 (the engine always sends client → server)")
    if w.size is not None:
        lo, hi = SIZE_RANGE[(w.tool, w.protocol)]
        hi = hi or UDP_MAX_PAYLOAD[6 if w.ipv6 else 4]
        if not _is_int(w.size) or not lo <= w.size <= hi:
            raise BadWorkload("size", w.size, f"a {w.protocol.upper()} payload for {w.tool} is {lo}..{hi} bytes")
        if w.gso and w.size > UDP_MAX_PAYLOAD[4] - UDP_HEADER:
            raise BadWorkload("size", w.size, "with gso a segment must leave room for at least one more in 64 KiB")
    if w.send is not None:
        if w.tool != "engine":
            raise BadWorkload("send", w.send, "needs tool engine (iperf3 has one send path)")
        if w.send not in SEND_PATHS:
            raise BadWorkload("send", repr(w.send), f"choose {', '.join(SEND_PATHS)}")
        if w.send not in BATCHED_SEND_PATHS and (w.batch or 1) > 1:
            raise BadWorkload("send", w.send, f"sends one datagram a call: batch {w.batch} needs send "
                                              f"{', '.join(BATCHED_SEND_PATHS)}")
    if w.batch is not None and (not _is_int(w.batch) or not 1 <= w.batch <= MAX_BATCH):
        raise BadWorkload("batch", w.batch, f"datagrams per sendmmsg/recvmmsg call or linked SQEs per io_uring_enter, "
                                          f"1..{MAX_BATCH}")
    if w.rate is not None:
        try:
            rate = parse_rate(w.rate, option_of("rate"))
        except BadInput as exc:
            raise BadWorkload("rate", repr(w.rate), str(exc).split(": ", 1)[1]) from None
        if w.tool == "iperf3" and rate.pps is not None:
            raise BadWorkload("rate", w.rate, "iperf3 takes a bit rate (250M, 1G); packet rates need tool engine")
    if not _is_num(w.duration) or not 0 < w.duration <= 3600:
        raise BadWorkload("duration", w.duration, "seconds, more than 0 and at most 3600")
    if not _is_num(w.warmup) or not 0 <= w.warmup < 600:
        raise BadWorkload("warmup", w.warmup, "seconds, 0 or more and less than 600")
    if not _is_int(w.streams) or not 1 <= w.streams <= MAX_STREAMS:
        raise BadWorkload("streams", w.streams, f"1..{MAX_STREAMS}")
    for name in ("sndbuf", "rcvbuf"):
        v = getattr(w, name)
        if v is not None and (not _is_int(v) or not 1024 <= v <= MAX_BUFFER):
            raise BadWorkload(name, v, f"a socket buffer is 1024..{MAX_BUFFER} bytes")
    for name in ("client_cpu", "server_cpu"):
        v = getattr(w, name)
        if v is not None and (not _is_int(v) or not 0 <= v <= MAX_CPU):
            raise BadWorkload(name, v, f"a CPU number is 0..{MAX_CPU}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
