"""Request/response driver: `offlab-engine rr-server` in the server host, `offlab-engine rr` in the client.

Figures are whole round trips (`rtt_*`), as netperf's RR tests count them (sockperf prints half).
Beside the engine's own count, the client interface's packet counters are read around the run:
UDP and TCP request/response put one packet on the wire each way per transaction.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from offlab.errors import BadInput
from offlab.hosts import Host
from offlab.hosts.process import pinned, stop
from offlab.interrupts import shielded
from offlab.traffic import BadWorkload
from offlab.traffic import series as intervals
from offlab.traffic.engine import _ready_dir, engine_on, report
from offlab.traffic.iperf3 import TrafficFailed
from offlab.wire import UDP_MAX_PAYLOAD

if TYPE_CHECKING:
    from offlab.sample import RrPhase

MIN_MESSAGE = 24  # the engine's rr message header: the smallest request or response
TCP_MAX_MESSAGE = 1 << 20
MAX_FLOWS = 256
MAX_TPS_PER_FLOW = 1_000_000
# The kernel check: packets on the client interface besides the engine's own requests and responses
# that still count as consistent: this fraction of those, or this many whatever the run's length. A fresh
# link's own chatter comes first: an ARP exchange, and IPv6's start-up even in a lab without IPv6
# addresses (9 packets on a new veth lab's client link within its first 3 s: MLD reports, DAD, router
# solicitations; tcpdump, 2026-11-30); TCP adds its handshake, close and a few pure ACKs. A message over
# the MTU doubles the count.
PACKET_TOLERANCE = 0.05
OTHER_PACKETS = {"udp": 16, "tcp": 24}

Proto = Literal["udp", "tcp", "tcp-crr"]


def parse_tps(text: str | float | None) -> float | None:
    """`1000`, `10k`, `1.5M`, `50ktps` → transactions/s; None or 0 → None (closed loop)."""
    if text is None:
        return None
    t = str(text).strip().lower().removesuffix("tps").removesuffix("/s")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1:], 1.0)
    num = t[:-1] if mult != 1.0 else t
    try:
        v = float(num) * mult
    except ValueError:
        raise BadInput(f"--rate {text!r}: transactions per second for --workload rr, e.g. 1000, 10k, 50ktps "
                       f"(0 = closed loop)") from None
    if not v >= 0 or v == float("inf"):
        raise BadInput(f"--rate {text!r}: must be 0 (closed loop) or more transactions per second")
    return v or None


@dataclass
class RrWorkload:
    protocol: Proto = "udp"
    request_size: int = 64
    response_size: int = 64
    flows: int = 1
    rate: float | None = None  # transactions/s over all flows; None = closed loop
    duration: float = 2.0
    warmup: float = 0.5
    timeout: float = 1.0  # a transaction unanswered this long is lost
    client_cpu: int | None = 0
    server_cpu: int | None = 1
    ipv6: bool = False

    def check(self) -> "RrWorkload":
        """Bad values become one-line errors naming the CLI option (BadWorkload: plans name the field)."""
        if self.protocol not in ("udp", "tcp", "tcp-crr"):
            raise BadWorkload("protocol", self.protocol, "for request/response choose udp, tcp or tcp-crr")
        limit = UDP_MAX_PAYLOAD[6 if self.ipv6 else 4] if self.protocol == "udp" else TCP_MAX_MESSAGE
        for name in ("request_size", "response_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not MIN_MESSAGE <= v <= limit:
                raise BadWorkload(name, v, f"a {self.protocol} request/response here is {MIN_MESSAGE}..{limit} bytes "
                                           f"(the engine's header takes {MIN_MESSAGE})")
        if not 1 <= self.flows <= MAX_FLOWS:
            raise BadWorkload("flows", self.flows, f"1..{MAX_FLOWS}")
        if self.rate is not None and self.rate / self.flows > MAX_TPS_PER_FLOW:
            raise BadWorkload("rate", f"{self.rate:.0f}", f"at most {MAX_TPS_PER_FLOW} transactions/s per flow; "
                                                          f"use --flows {int(-(-self.rate // MAX_TPS_PER_FLOW))} or more")
        if not 0 < self.duration <= 3600:
            raise BadWorkload("duration", self.duration, "0 < seconds ≤ 3600")
        if not 0 <= self.warmup < 600:
            raise BadWorkload("warmup", self.warmup, "0 ≤ seconds < 600")
        if not 0.001 <= self.timeout <= 60:
            raise BadWorkload("timeout", self.timeout, "0.001 ≤ seconds ≤ 60")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RrResult:
    """What `offlab-engine rr` measured (client side) plus the client interface's counters. Units in the names."""

    protocol: str
    request_size: int
    response_size: int
    flows: int
    target_tps: float | None
    rtt_from: str  # "send" (closed loop) or "scheduled_send" (--rate: no coordinated omission)
    window_s: float
    transactions: int
    lost: int
    unsent: int
    loss_ratio: float | None
    transactions_per_s: float
    rtt_mean_us: float | None
    rtt_min_us: float | None
    rtt_p50_us: float | None
    rtt_p90_us: float | None
    rtt_p99_us: float | None
    rtt_p99_9_us: float | None
    rtt_max_us: float | None
    rtt_histogram: dict
    service_rtt: dict
    timing_overhead: dict
    transactions_total: int
    requests_sent: int
    responses_received: int
    errors: dict = field(default_factory=dict)
    kernel_check: dict | None = None  # client interface packets vs transactions
    series: list = field(default_factory=list)  # per-interval rows (offlab.traffic.series)
    server: dict | None = None  # the rr-server's own counts
    client_pid: int | None = None
    server_pid: int | None = None
    raw: dict = field(default_factory=dict)

    def to_dict(self, with_raw: bool = False) -> dict:
        d = asdict(self)
        if not with_raw:
            d.pop("raw")
        return d

    def stored(self, **beside: Any) -> RrPhase:
        """These figures as a sample holds them (an `rr` phase), with `beside` (the window's CPU) after them."""
        from offlab.sample import RrPhase  # here: offlab.traffic is read at every CLI start, its samples are not

        return RrPhase.from_json({**self.to_dict(), **beside})

    def summary_lines(self) -> list[str]:
        """The figures a person reads first, one per line."""
        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"
        rate = f"at {self.target_tps:g}/s" if self.target_tps else "closed loop"
        lines = [
            f"rr {self.protocol} {self.request_size}/{self.response_size} B, {self.flows} flow(s), {rate}, "
            f"window {self.window_s:g} s; whole round trips from the {self.rtt_from.replace('_', ' ')}",
            f"  transactions {self.transactions} ({self.transactions_per_s:.0f}/s), lost {self.lost}"
            + (f", unsent {self.unsent}" if self.unsent else ""),
            f"  rtt µs       p50 {f(self.rtt_p50_us)}  p90 {f(self.rtt_p90_us)}  p99 {f(self.rtt_p99_us)}  "
            f"p99.9 {f(self.rtt_p99_9_us)}  max {f(self.rtt_max_us)}  mean {f(self.rtt_mean_us)}",
            f"  clock        a CLOCK_MONOTONIC read pair costs {self.timing_overhead.get('read_pair_p50_ns')} ns "
            f"(2 reads per transaction)",
        ]
        k = self.kernel_check
        if k:
            lines.append(f"  kernel       {k['iface']}: {k['packets']} packets / {self.transactions_total} transactions "
                         f"= {k['packets_per_transaction']:.3f}: {k['status']}")
        if self.errors:
            lines.append(f"  errors       {self.errors}")
        if self.transactions == 0 and self.lost:
            lines.append("  no transaction was answered: the peer is down or unreachable")
        return lines


def server_argv(bind: str, port: int, ready: str, seconds: float, exe: str) -> list[str]:
    return [exe, "rr-server", "--bind", bind, "--port", str(port), "--ready-file", ready,
            "--duration", f"{seconds:g}"]


def client_argv(w: RrWorkload, dest: str, port: int, exe: str) -> list[str]:
    argv = [exe, "rr", "--dest", dest, "--port", str(port), "--proto", w.protocol,
            "--request-size", str(w.request_size), "--response-size", str(w.response_size),
            "--flows", str(w.flows), "--duration", f"{w.duration:g}", "--warmup", f"{w.warmup:g}",
            "--timeout", f"{w.timeout:g}", "--interval", str(intervals.interval_ms(w.warmup + w.duration))]
    if w.rate:
        argv += ["--rate", f"{w.rate:g}"]
    return argv


def parse(doc: dict) -> RrResult:
    """The engine's rr JSON → RrResult."""
    return RrResult(
        protocol=doc["proto"], request_size=doc["options"]["request_size"],
        response_size=doc["options"]["response_size"], flows=doc["options"]["flows"],
        target_tps=doc["pacing"]["target_tps"], rtt_from=doc["rtt_from"], window_s=doc["window_s"],
        transactions=doc["transactions"], lost=doc["lost"], unsent=doc["unsent"], loss_ratio=doc["loss_ratio"],
        transactions_per_s=doc["transactions_per_s"],
        **{k: doc[k] for k in ("rtt_mean_us", "rtt_min_us", "rtt_p50_us", "rtt_p90_us", "rtt_p99_us",
                               "rtt_p99_9_us", "rtt_max_us")},
        rtt_histogram=doc["rtt_histogram"], service_rtt=doc["service_rtt"], timing_overhead=doc["timing_overhead"],
        transactions_total=doc["transactions_total"], requests_sent=doc["requests_sent"],
        responses_received=doc["responses_received"], errors=dict(doc.get("errors") or {}),
        series=[s for s in (intervals.from_engine(doc, "offlab-engine rr"),) if s], raw={"client": doc},
    )


def iface_packets(host: Host, iface: str) -> tuple[int, int]:
    """(rx_packets, tx_packets) of `iface` in `host`, from /proc/net/dev."""
    for line in host.read("/proc/net/dev").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == iface:
            cols = rest.split()
            return int(cols[1]), int(cols[9])
    raise BadInput(f"no interface {iface!r} in {host.name}")


def kernel_check(w: RrWorkload, doc: dict, iface: str, before: tuple[int, int], after: tuple[int, int]) -> dict:
    """The client interface's packets against the engine's own count: each request one packet out and
    each response one in, for UDP/TCP RR whose messages fit one packet, and little else (`OTHER_PACKETS`).
    Counted against what was sent and received rather than per transaction, a lost one (a request out, no
    response in) or a short run (few transactions beside an ARP exchange) stays consistent."""
    rx, tx = after[0] - before[0], after[1] - before[1]
    total = doc["transactions_total"]
    ppt = (rx + tx) / total if total else None
    own = doc["requests_sent"] + doc["responses_received"]
    other = rx + tx - own
    allowed = max(OTHER_PACKETS.get(w.protocol, 0), int(PACKET_TOLERANCE * own))
    if w.protocol == "tcp-crr":
        status = "not checked: tcp-crr adds the handshake and both closes (10 per transaction when quiet)"
    elif not total:
        status = "no transaction"
    elif 0 <= other <= allowed:
        status = f"consistent: {own} requests and responses, {other} other packets (at most {allowed})"
    else:
        status = (f"inconsistent: {rx + tx} packets for {own} requests and responses, "
                  f"{'more' if other > 0 else 'fewer'} than allowed (a message over the MTU, or other traffic?)")
    return {"iface": iface, "rx_packets": rx, "tx_packets": tx, "packets": rx + tx,
            "requests_sent": doc["requests_sent"], "responses_received": doc["responses_received"],
            "other_packets": other, "packets_per_transaction": ppt, "status": status}


def run_client(client: Host, dest: str, port: int, w: RrWorkload, *, iface: str | None = None,
               on_started=None) -> RrResult:
    """Runs `offlab-engine rr` in `client` against `dest`:`port` (a server already answering, or not)."""
    w.check()
    before = iface_packets(client, iface) if iface else None
    proc = None
    try:
        with shielded():  # a signal while it starts waits until it is ours to stop
            proc = client.spawn(pinned(client_argv(w, dest, port, engine_on(client)), w.client_cpu),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if on_started:
            on_started(proc.pid)
        out, err = proc.communicate(timeout=w.warmup + w.duration + 2 * w.timeout + 30)
    finally:
        if proc is not None:
            stop(proc)
    if proc.returncode == 2:
        raise BadInput(err.strip().removeprefix("offlab-engine: error: "))
    if proc.returncode != 0:
        raise TrafficFailed(f"offlab-engine rr: {err.strip() or 'exit ' + str(proc.returncode)}")
    doc = report(out, "rr", client)
    result = parse(doc)
    result.client_pid = proc.pid
    if iface and before is not None:
        result.kernel_check = kernel_check(w, doc, iface, before, iface_packets(client, iface))
    return result


def run(client: Host, server: Host, server_addr: str, w: RrWorkload, *, client_iface: str | None = None,
        on_started=None) -> RrResult:
    """rr-server in `server`, rr in `client`; the server's own counts go into the result."""
    w.check()
    port = random.randint(20000, 60000)
    with _ready_dir(server) as tmp:
        ready = f"{tmp}/ready"
        seconds = w.warmup + w.duration + 2 * w.timeout + 60
        srv = None
        try:
            with shielded():  # a signal while it starts waits until it is ours to stop
                srv = server.spawn(pinned(server_argv(server_addr, port, ready, seconds, engine_on(server)),
                                          w.server_cpu), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + (5 if server.shares_kernel else 30)
            while not (os.path.exists(ready) if server.shares_kernel else server.exists(ready)):
                if srv.poll() is not None or time.monotonic() > deadline:
                    err = srv.stderr.read().strip() if srv.poll() is not None else "not ready in time"
                    raise TrafficFailed(f"offlab-engine rr-server on {server.name} did not start: {err}")
                time.sleep(0.01)

            def started(client_pid: int) -> None:
                if on_started:
                    on_started(client_pid, srv.pid)
            result = run_client(client, server_addr, port, w, iface=client_iface, on_started=started)
            srv.send_signal(signal.SIGINT)
            out, _ = srv.communicate(timeout=15)
            if srv.returncode == 0 and out.strip():
                result.server = report(out, "rr-server", server)
            result.server_pid = srv.pid
            return result
        finally:
            if srv is not None:
                stop(srv)


def run_lab(lab, w: RrWorkload, *, count_packets: bool = True, on_started=None) -> RrResult:
    """rr from the lab's client to its server (a `LabState`), with the client uplink's counters
    (not with `count_packets=False`: under load a stream shares that interface)."""
    entry = lab.entry("server")
    addr = entry.address6 if w.ipv6 else entry.address
    if not addr:
        raise BadInput(f"lab {lab.name} has no {'IPv6 ' if w.ipv6 else ''}address for the server")
    iface = None
    if count_packets:
        try:
            iface = lab.resolve_iface("client")
        except BadInput:
            iface = None  # several uplinks: no single interface to count on
    return run(lab.client, lab.server, addr, w, client_iface=iface, on_started=on_started)
