"""Workload drivers: iperf3 (TCP/UDP, JSON) and offlab-engine (UDP with GSO/GRO).

A driver starts its receiver in the server host, its sender in the client host,
each pinned to its own CPU, and returns a `TrafficResult` whose figures say what
they count and which side measured them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from offlab.errors import BadInput

UDP_MAX_PAYLOAD = {4: 65507, 6: 65527}


@dataclass
class Workload:
    tool: Literal["iperf3", "engine"] = "iperf3"
    protocol: Literal["tcp", "udp"] = "tcp"
    size: int | None = None  # UDP payload per datagram, or TCP write length
    gso: bool = False  # engine: UDP_SEGMENT on the sender
    gro: bool = False  # engine: UDP_GRO on the receiver
    batch: int | None = None  # engine: sendmmsg/recvmmsg batch
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

    def check(self) -> "Workload":
        """Bad combinations become one-line errors naming the option."""
        if self.tool not in ("iperf3", "engine"):
            raise BadInput(f"--tool {self.tool!r}: choose iperf3 or engine")
        if self.protocol not in ("tcp", "udp"):
            raise BadInput(f"--proto {self.protocol!r}: choose tcp or udp")
        if self.tool == "engine" and self.protocol != "udp":
            raise BadInput("--tool engine drives UDP only: use --proto udp, or --tool iperf3 for TCP")
        if self.tool == "iperf3" and (self.gso or self.gro or self.batch):
            raise BadInput("--gso/--gro/--batch need --tool engine (iperf3 3.12 has no UDP GSO/GRO)")
        if self.size is not None:
            limit = UDP_MAX_PAYLOAD[6 if self.ipv6 else 4] if self.protocol == "udp" else 1 << 20
            if not 1 <= self.size <= limit:
                raise BadInput(f"--size {self.size}: a {self.protocol.upper()} payload here is 1..{limit} bytes")
        if self.gso and self.size and self.size > 65507 - 8:
            raise BadInput(f"--size {self.size} with --gso: a segment must leave room for at least one more in 64 KiB")
        if not 0 < self.duration <= 3600:
            raise BadInput(f"--duration {self.duration}: 0 < seconds ≤ 3600")
        if not 0 <= self.warmup < 600:
            raise BadInput(f"--warmup {self.warmup}: 0 ≤ seconds < 600")
        if not 1 <= self.streams <= 128:
            raise BadInput(f"--streams {self.streams}: 1..128")
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
    client_pid: int | None = None
    server_pid: int | None = None
    raw: dict = field(default_factory=dict)

    def to_dict(self, with_raw: bool = False) -> dict:
        d = asdict(self)
        if not with_raw:
            d.pop("raw")
        return d
