"""Second witnesses for the headline figures of a sample, and where lost datagrams died.

A traffic tool's own count can be wrong: iperf3 3.12's receiver counters stop adding up
when most datagrams die in the receive buffer (negative "received", loss above 100 %).
The kernel saw the same datagrams: the client's `Udp OutDatagrams` and the server's
`Udp InDatagrams` over the same window. Every figure is bounded to its possible range,
the witnesses are compared, and a disagreement beyond a stated tolerance marks the
sample "inconsistent" with both values, never silently one of them.

Pure functions over a sample (offlab.sample's record), so they are tested on numbers. What
`cross_check`, `attribute_loss` and `segmentation` find is the sample's, as its fields' views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from offlab.metrics import METRICS, impossible
from offlab.probes.edge.bigpackets import BigPackets
from offlab.probes.edge.qdisc import QdiscProbe
from offlab.probes.edge.in_flight import InFlightProbe, in_flight
from offlab.probes.edge.softnet import SoftnetStat
from offlab.sample import (Consistency, LossAttribution, Probes, Read, SampleWorkload, Segment, StoredSample, Traffic,
                           counter)
from offlab.stats import partition
from offlab.traffic.rate import parse_rate
from offlab.wire import ETH_HEADER, IP_MAX, IPV4_HEADER, UDP_HEADER, ip_header

# Beyond five percentage points (plus what the reads' skew and the series' alignment let flow, below)
# the tool's and the kernel's loss over the window disagree. A tool compared over its whole run (no
# series to cut to the window) can differ by more with bursty loss (seen here: 2.9 % vs 0.8 % at
# 4096 B, 5 Gbit/s offered; 14.8 % vs 8.4 % on the SSH pair): that comparison says so.
LOSS_TOLERANCE = 0.05
# Throughput against pps × datagram size: the two come from the same receiver count.
RATE_TOLERANCE = 0.10
# Each host's counters are read at some instant between a command's sending and its answer (see
# offlab.probes): a namespace within microseconds, a guest over its channel or an SSH host a round
# trip later (0.3–5 s for a guest under TCG on a loaded machine), narrowed by the host's own clock
# where its offset is known. At each edge of the window, two hosts' reads may be up to the span of
# their read intervals apart, and traffic flowing in that time is counted by one host only: every
# witness that compares two hosts (or a host and the window) widens its tolerance by rate × skew,
# the sum of the two edges' spans, and says so.


def skew(reads: dict[str, Read], *roles: str) -> float:
    """Seconds by which the reads of `roles`' counters (role "window": this machine's reference instants)
    may be apart, summed over the window's two edges."""
    reads = reads or {}
    total = 0.0
    for edge in ("start", "end"):
        spans = [[0.0, 0.0] if role == "window" else getattr(reads[role], edge)
                 for role in roles if role == "window" or role in reads]
        if len(spans) >= 2:
            total += max(s[1] for s in spans) - min(s[0] for s in spans)
    return total


# offlab-engine's sender ends with three END markers (0, 10, 30 ms), each to the receiver's END port and
# its data port; the later two of each may reach a receiver that has already stopped on the first: up to
# this many UdpNoPorts on the server are the harness's own.
END_MARKER_NOPORTS = 4


def bound(traffic: Traffic) -> list[str]:
    """Clamp impossible figures in place (received < 0, loss outside 0..1); say what was clamped."""
    notes = []
    sent, received = traffic.datagrams_sent, traffic.datagrams_received
    if received is not None and received < 0:
        notes.append(f"the tool reported {received} datagrams received: impossible, taken as unknown")
        traffic.datagrams_received = None
        traffic.pps = None
    loss = traffic.loss
    if loss is not None and not 0.0 <= loss <= 1.0:
        notes.append(f"the tool reported loss {100 * loss:.1f} %: impossible, taken as unknown")
        traffic.loss = None
    if sent is not None and received is not None and received > sent > 0 and traffic.tool == "iperf3":
        notes.append(f"the tool reported {received} received of {sent} sent")
    return notes


def out_of_range(sample: StoredSample) -> list[str]:
    """A note per metric whose value is impossible (it is then stored as no figure, see metrics_of)."""
    return [f"{METRICS[name].label} {value:.6g} {METRICS[name].unit} is outside its possible range: not a figure"
            for name, value in impossible(sample).items()]


def udp_group(workload: SampleWorkload | None) -> str:
    """The kernel's UDP counters for the workload's family: /proc/net/snmp's Udp, or snmp6's Udp6."""
    return "Udp6" if workload and workload.ipv6 else "Udp"


def ip_group(workload: SampleWorkload | None) -> str:
    return "Ip6" if workload and workload.ipv6 else "Ip"


def kernel_loss(probes: Probes, workload: SampleWorkload | None = None) -> tuple[float | None, int | None, int | None]:
    """(loss, sent, received) from the client's Udp OutDatagrams and the server's Udp InDatagrams.

    With UDP GRO on the receiver the kernel counts one InDatagram per merged buffer, and with
    UDP_SEGMENT one OutDatagram per super-packet, so these counters cannot witness loss then.
    """
    if workload and (workload.gro or workload.gso):
        return None, None, None
    snmp, udp = probes.loss_view()[0], udp_group(workload)
    out = counter(snmp, "client", udp, "OutDatagrams", None)
    got = counter(snmp, "server", udp, "InDatagrams", None)
    if not out or got is None:
        return None, out, got
    return max(0.0, min(1.0, (out - got) / out)), out, got


# The receiver's series and the host whose clock it counts on: engine rx rows carry `lost` (the change of
# the missing sequence numbers) and their start on that host's CLOCK_MONOTONIC (offlab.traffic.series).
RECEIVER_SERIES = {"offlab-engine rx": "server"}


@dataclass
class WindowLoss:
    """The tool's loss cut to the counters' window (window_loss), or `why` it cannot be had."""

    loss: float | None = None
    lost: int | None = None
    received: int | None = None
    rows: int = 0
    source: str | None = None
    alignment_s: float | None = None  # None: not cut to the window (see why)
    why: str | None = None
    # the lost count's bounds: the rows wholly inside the window, and every row that reaches into it (a
    # row at an edge counts in part in `lost`, but its loss may all lie inside the window or all outside).
    # A row counts a gap when the receiver reads past it, up to the run's largest one-way latency after
    # the datagrams went missing (`detection_lag_s`): the bounds reach that much further at each edge.
    lost_low: int | None = None
    lost_high: int | None = None
    detection_lag_s: float = 0.0


def window_loss(traffic: Traffic, probes: Probes) -> WindowLoss:
    """The tool's loss over the kernel counters' window, from its receiver's per-interval rows, or
    only `why` when it cannot be had.

    The rows are placed on this machine's clock (the series' `t0_mono_s`, less the receiving host's clock
    offset where it has a clock of its own), each counted for the part of it between the server's two
    counter reads. `alignment_s` is how far those edges may be from the reads, summed over both edges:
    the reads' own spans and, on a channel host, its clock offset's bounds.
    """
    found = [s for s in traffic.series or [] if s.source in RECEIVER_SERIES]
    if not found or "lost" not in (found[0].columns or []):
        why = ("iperf3's client reports the sender's intervals, which count no loss" if traffic.tool == "iperf3"
               else "no receiver series (run with --interval 0, or measured before series)")
        return WindowLoss(why=why)
    series = found[0]
    source = series.source or ""  # one of RECEIVER_SERIES: found above
    role = RECEIVER_SERIES[source]
    t0, w0, window = series.t0_mono_s, probes.t0_mono_s, probes.window_s or 0
    if t0 is None or w0 is None or window <= 0:
        return WindowLoss(why="the series or the window has no start on CLOCK_MONOTONIC (a sample measured before "
                              "the window's loss was compared)")
    read = probes.loss_view()[1].get(role) or Read()
    offset, clock_err = 0.0, 0.0
    if read.has_own_clock:  # a host with a clock of its own
        if not read.clock_offset_s:
            return WindowLoss(why=f"the {role}'s clock offset from this machine's is unknown")
        lo, hi = read.clock_offset_s
        offset, clock_err = (lo + hi) / 2, (hi - lo) / 2
    (s0, s1), (e0, e1) = read.start, read.end
    k0, k1 = w0 + (s0 + s1) / 2, w0 + window + (e0 + e1) / 2
    # Each row counts for the part of it inside the window: a 100 ms row half inside counts half (its
    # datagrams taken as spread evenly over it). Whole rows by their middle were up to half a row off at
    # each edge: 10 % of a 1 s window, which left that much of a loss unexplained by counters that were right.
    # How late a row may count a gap: the receiver reads on after a datagram goes missing until the next
    # one arrives, up to the run's largest one-way latency later (the receiver's socket queue under load).
    # Known only where the receiver's clock is this machine's (the latency is then one clock's).
    lag = 0.0 if read.has_own_clock else ((traffic.latency_us or {}).get("max") or 0) / 1e6
    kept, low, high = [], 0, 0
    for t_s, dur, row_lost, row_received in series.cols("t_s", "dur_s", "lost", "datagrams"):
        start = t0 + t_s - offset
        inside = min(start + dur, k1) - max(start, k0)
        if dur > 0 and inside > 0:
            whole = start >= k0 and start + dur <= k1  # (inside / dur of a whole row may round below 1)
            kept.append((1.0 if whole else inside / dur, row_lost or 0, row_received or 0))
        if dur > 0 and start >= k0 + lag and start + dur <= k1:
            low += row_lost or 0  # its gaps all went missing inside the window
        if dur > 0 and min(start + dur, k1 + lag) > max(start, k0):
            high += row_lost or 0  # some of its gaps may have gone missing inside the window
    if not kept:
        return WindowLoss(why="no interval of the tool's series lies in the window")
    # what remains uncertain: where within the reads' spans each edge lies, and the clock offset's bounds
    alignment = (s1 - s0) / 2 + (e1 - e0) / 2 + 2 * clock_err
    lost = round(sum(f * n for f, n, _ in kept))
    received = round(sum(f * n for f, _, n in kept))
    loss = max(0.0, min(1.0, lost / (received + lost))) if received + lost > 0 else None
    return WindowLoss(loss=loss, lost=lost, received=received, rows=len(kept), source=source,
                      alignment_s=round(alignment, 6), lost_low=min(low, lost), lost_high=max(high, lost),
                      detection_lag_s=round(lag, 6))


def cross_check(sample: StoredSample) -> Consistency:
    """Every check run on the sample: name, ok, and the values each witness gave. Where the tool's loss
    was impossible (bound), the kernel's takes its place in `sample.traffic`."""
    traffic, probes, w = sample.traffic, sample.probes, sample.workload
    checks: list[dict] = []  # each check as stored (JSON)
    oks: list[bool] = []  # and whether it held
    if w.protocol == "udp":
        k_loss, k_sent, k_got = kernel_loss(probes, w)
        t_loss = traffic.loss
        if k_loss is not None and k_sent:
            udp = udp_group(w)
            apart = skew(probes.loss_view()[1], "client", "server")
            window = probes.window_s or 0
            rate = k_sent / window if window > 0 else 0.0
            in_skew = rate * apart  # datagrams that may be counted by one host's reads and not the other's
            # Like with like: the tool's loss over the same window, from its series; its whole run only without one.
            wl = window_loss(traffic, probes)
            cut = wl.alignment_s is not None
            align = wl.alignment_s or 0.0
            in_align = rate * align  # datagrams that may be in the tool's rows and not the kernel's window, or back
            tolerance = LOSS_TOLERANCE + (in_skew + in_align) / k_sent
            t_cmp = wl.loss if cut else t_loss
            ok = t_cmp is not None and abs(t_cmp - k_loss) <= tolerance
            oks.append(ok)
            if cut:
                tool_said = (f"loss over the window {_pct(t_cmp)} by {traffic.tool} (its receiver's "
                             f"{wl.rows} intervals there: {wl.lost} lost, {wl.received} received; whole run "
                             f"{_pct(t_loss)})")
                aligned = (f" + {in_align:.0f} datagrams in the {1000 * align:.1f} ms its intervals and the "
                           f"kernel's reads may be apart at the window's edges ({rate:.4g} pps × {1000 * align:.1f} ms)")
            else:
                tool_said = (f"loss {_pct(t_loss)} by {traffic.tool} over its whole run, warm-up included "
                             f"(not cut to the window: {wl.why})")
                aligned = ""
            checks.append({
                "check": "loss", "ok": ok,
                "tool": t_cmp, "tool_over": "window" if cut else "whole run",
                "tool_whole_run": t_loss, "kernel": k_loss, "kernel_sent": k_sent, "kernel_received": k_got,
                "skew_s": round(apart, 6), "alignment_s": align, "tolerance": tolerance,
                "detail": (f"{tool_said}, {_pct(k_loss)} by the kernel over the window "
                           f"(client {udp} OutDatagrams {k_sent}, server {udp} InDatagrams {k_got}); "
                           f"tolerance {_pct(tolerance)} = {_pct(LOSS_TOLERANCE)} + {in_skew:.0f} datagrams "
                           f"that may have flowed in the {1000 * apart:.1f} ms the two hosts' reads may be apart "
                           f"at the window's edges ({rate:.4g} pps × {1000 * apart:.1f} ms){aligned}"),
            })
            if t_loss is None:
                # The tool's count was impossible: the kernel's sender/receiver counts are the best source.
                traffic.loss = k_loss
                traffic.loss_source = "kernel"
        size, pps, bps = w.size, traffic.pps, traffic.throughput_bps
        if size and pps and bps:
            implied = pps * size * 8
            ok = abs(bps - implied) <= RATE_TOLERANCE * max(bps, implied)
            oks.append(ok)
            checks.append({"check": "throughput = pps × size", "ok": ok, "throughput_bps": bps,
                           "pps_times_size_bps": implied,
                           "detail": f"throughput {bps:.4g} bit/s vs {pps:.4g} pps × {size} B = {implied:.4g} bit/s"})
    # Like with like: the datagrams the tool's receiver rows got between the server's two counter reads
    # (as the loss check above), else its whole run's throughput times this machine's window.
    wl = window_loss(traffic, probes) if w.protocol == "udp" and w.size else WindowLoss(why="")
    rx_bytes = _server_rx_bytes(probes)
    if wl.received is not None and wl.alignment_s is not None:
        app_bytes = float(wl.received * (w.size or 0))
        apart, over = wl.alignment_s, f"its receiver's {wl.rows} intervals in the server's window"
    else:
        app_bytes = (traffic.throughput_bps or 0) * (probes.window_s or 0) / 8
        # read (on a channel host) up to `apart` away from this machine's window edges
        apart, over = skew(probes.reads, "window", "server"), "its throughput × this machine's window"
    if app_bytes > 0 and rx_bytes is not None:
        in_skew = (traffic.throughput_bps or 0) / 8 * apart
        ok = app_bytes <= rx_bytes * 1.02 + in_skew
        oks.append(ok)
        checks.append({"check": "application bytes ≤ interface bytes", "ok": ok, "application_bytes": app_bytes,
                       "interface_bytes": rx_bytes, "skew_s": round(apart, 6),
                       "detail": f"{app_bytes:.4g} B received by the application ({over}), {rx_bytes:.4g} B by "
                                 f"the server's interfaces; tolerance 2 % + {in_skew:.4g} B that may have flowed "
                                 f"in the {1000 * apart:.1f} ms the server's reads may be away from the window's "
                                 f"edges"})
    status = "consistent" if all(oks) else "inconsistent"
    return Consistency.from_json({"status": status, "checks": checks})


def _server_rx_bytes(probes: Probes) -> int | None:
    found = [d.rx_bytes for name, d in (probes.interfaces or {}).items() if name.startswith("server:")]
    return sum(found) if found else None


# Where a datagram can die, per host, as counted by its kernel: (group, counter, what it means).
IP_DROPS = (("InHdrErrors", "bad IP header"), ("InAddrErrors", "not for this host and not forwarded"),
            ("InDiscards", "IP input discards"), ("OutDiscards", "IP output discards"),
            ("OutNoRoutes", "no route"), ("ReasmFails", "fragment reassembly failed"))
IP6_DROPS = (("InHdrErrors", "bad IPv6 header"), ("InAddrErrors", "not for this host and not forwarded"),
             ("InNoRoutes", "no route on input"), ("InTooBigErrors", "larger than the next hop's MTU"),
             ("InTruncatedPkts", "truncated packet"), ("InDiscards", "IPv6 input discards"),
             ("OutDiscards", "IPv6 output discards"), ("OutNoRoutes", "no route"),
             ("ReasmFails", "fragment reassembly failed"))
UDP_DROPS = (("RcvbufErrors", "socket receive buffer full"), ("NoPorts", "no socket on the port"),
             ("InCsumErrors", "bad UDP checksum"), ("InErrors", "other UDP input errors"))
DEVICE_DROPS = (("rx_dropped", "dropped on receive"), ("tx_dropped", "dropped on transmit"),
                ("rx_errors", "receive errors"), ("tx_errors", "transmit errors"),
                ("rx_fifo", "receive overruns"), ("tx_fifo", "transmit overruns"))


# A UDP GSO/GRO super-packet is at most 64 KiB of IP packet (no BIG TCP for UDP) and at most
# UDP_MAX_SEGMENTS (128) segments: the most datagrams one counted packet can stand for.
UDP_MAX_SEGMENTS = 128
# A per-packet counter is converted when the packets it counts carried more than this many datagrams
# on average; below it they are single datagrams (the odd ARP or END marker moves the average a little).
SUPER_PACKET_MIN = 1.05


def max_datagrams_per_packet(w: SampleWorkload) -> int | None:
    """The most datagrams of the workload's payload one GSO/GRO packet can carry: 44 at 1472 B over IPv4."""
    if not w.size:
        return None
    room = IP_MAX - (0 if w.ipv6 else IPV4_HEADER) - UDP_HEADER  # IPv6's payload length excludes its header
    return max(1, min(UDP_MAX_SEGMENTS, room // w.size))


@dataclass
class PerPacket:
    """Datagrams one counted packet carried on average, and what that average was read from."""

    per: float
    interface: str
    avg_bytes: float | None


def datagrams_per_packet(probes: Probes, host: str, w: SampleWorkload) -> PerPacket | None:
    """How many datagrams one packet counted on `host` carried on average over the window, from its busiest
    lab interface: (bytes − packets × headers) / (packets × payload). A veth or tap counts a GSO/GRO
    super-packet once, so every per-packet counter of that host counts in these units.
    None when the host's interfaces carried too few packets."""
    size = w.size
    if not size:
        return None
    best = None
    for name, d in (probes.interfaces or {}).items():
        if name.split(":", 1)[0] != host:
            continue
        for way in ("rx", "tx"):
            packets, octets = d.packets(way), d.octets(way)
            if packets >= SEGMENTATION_MIN_PACKETS and (best is None or octets > best[2]):
                best = (f"{name} {way}", packets, octets)
    if best is None:
        return None
    name, packets, octets = best
    headers = ETH_HEADER + ip_header(w.ipv6) + UDP_HEADER
    per = max(1.0, (octets - packets * headers) / (packets * size))
    return PerPacket(per=per, interface=name, avg_bytes=octets / packets)


def _delivered_per_packet(sample: StoredSample, window: WindowLoss | None) -> PerPacket | None:
    """With UDP GRO on the receiver: datagrams the tool received in the window per server Udp InDatagrams
    (one per buffer the socket took): what the server's UDP and IP counters count in, when its interface
    saw single datagrams that GRO merged above it."""
    w = sample.workload
    got = sample.probes.counter("server", udp_group(w), "InDatagrams", None)
    if not w.gro or not got or window is None or not window.received:
        return None
    return PerPacket(per=max(1.0, window.received / got), interface=f"{window.received} datagrams received by "
                     f"the tool in the window / server {udp_group(w)} InDatagrams {got}", avg_bytes=None)


@dataclass
class Lost:
    """The loss the counters explain, over their own window, in datagrams (None: no count could be had)."""

    lost: int | None
    source: str | None = None
    sent: int | None = None
    over: str | None = None  # "window" | "whole run"
    window: WindowLoss | None = None  # the tool's series cut to the window, when that was the source
    why: str | None = None  # why only the tool's whole run could be had


def _lost(sample: StoredSample) -> Lost:
    """The kernel's sender and receiver counts where they count datagrams (no GSO, no GRO); else the tool's
    receiver series cut to the window (window_loss); else, named as such, the tool's whole run."""
    traffic, probes, w = sample.traffic, sample.probes, sample.workload
    _, k_sent, k_got = kernel_loss(probes, w)
    if k_sent is not None and k_got is not None:
        udp = udp_group(w)
        source = f"client {udp} OutDatagrams − server {udp} InDatagrams"
        if traffic.tool != "engine":
            # Without IP_RECVERR a send its qdisc dropped "succeeds" but counts in SndbufErrors, not OutDatagrams.
            refused = probes.counter("client", udp, "SndbufErrors")
            if refused:
                k_sent += refused
                source = f"client {udp} OutDatagrams + SndbufErrors − server {udp} InDatagrams"
        return Lost(k_sent - k_got, source, k_sent, "window")
    wl = window_loss(traffic, probes)
    if wl.lost is not None and wl.received is not None and wl.alignment_s is not None:
        return Lost(wl.lost, sent=wl.lost + wl.received, over="window", window=wl,
                    source=(f"{traffic.tool} receiver's {wl.rows} intervals in the window: sequence "
                            f"numbers missing; ± {1000 * wl.alignment_s:.0f} ms at the window's edges"))
    sent, got = traffic.datagrams_sent, traffic.datagrams_received
    if sent is not None and got is not None and 0 <= got <= sent:
        return Lost(sent - got, f"{traffic.tool} sent − received, whole run", sent, "whole run", why=wl.why)
    return Lost(None)


@dataclass
class Place:
    """One place where datagrams died (attribute_loss's `places`): a counter, in datagrams with bounds."""

    host: str
    where: str
    what: str
    count: int
    layer: str  # queue | device | softnet | ip | udp
    datagrams: float
    low: float
    high: float
    unit: str = "datagrams"  # or "packets": counted per super-packet, converted at `per_packet`
    per_packet: float | None = None
    basis: str | None = None
    share: float = 0.0

    def to_json(self) -> dict:
        d = {"host": self.host, "where": self.where, "what": self.what, "count": self.count, "layer": self.layer,
             "unit": self.unit, "datagrams": self.datagrams, "low": self.low, "high": self.high}
        if self.unit == "packets":
            d.update(per_packet=self.per_packet, basis=self.basis)
        return {**d, "share": self.share}


class _Bounds(NamedTuple):
    """A count of datagrams and its low and high bounds (reads apart in time)."""

    datagrams: float
    low: float
    high: float


def attribute_loss(sample: StoredSample) -> LossAttribution | None:
    """Where the lost datagrams died, hop by hop, from counter deltas, in datagrams, with the share each explains.

    Sender queue (qdisc) drops; every lab interface's drops and errors; softnet backlog drops; a
    router's IP discards, no-route and address errors; the receiver's IP discards and UDP errors
    (receive buffer, no socket on the port, checksum). Every counter here counts packets as its host
    saw them: where those were GSO/GRO super-packets (the host's interface bytes per packet say so, or,
    with UDP GRO on the receiver, its datagrams per InDatagram) a count is converted to datagrams at
    that average, an estimate with bounds (one datagram per dropped packet .. the most one can carry).
    The loss is taken over the counters' window (the kernel's counts, else the tool's series there).
    Places can overlap (a backlog drop counts in softnet and in the device's rx_dropped), so shares are
    each estimate / lost and `unexplained` is what no place covers.
    """
    traffic, probes, w = sample.traffic, sample.probes, sample.workload
    if w.protocol != "udp":
        return None
    found = _lost(sample)
    lost = found.lost
    if not lost or lost <= 0:
        return None
    unread: list[str] = []
    if found.over == "whole run":
        unread.append(f"the tool's loss over the counters' window ({found.why or 'no series'}): the lost "
                      f"count is its whole run, warm-up included, while every counter covers only the window")
    top = max_datagrams_per_packet(w)
    units: dict[str, PerPacket | None] = {}

    def unit(host: str, layer: str) -> PerPacket | None:
        key = f"{host}/{'l4' if host == 'server' and layer in ('udp', 'ip') else 'dev'}"
        if key not in units:
            u = datagrams_per_packet(probes, "server" if host == "machine" else host, w)
            if key == "server/l4" and (u is None or u.per <= SUPER_PACKET_MIN):
                # The interface saw single datagrams: GRO may still have merged them above it.
                u = _delivered_per_packet(sample, found.window) or u
            if u and top:
                u.per = min(u.per, top)  # an average beyond the most one packet can carry is skew
            units[key] = u if u and u.per > SUPER_PACKET_MIN else None
            if u is None and (w.gso or w.gro) and w.size:
                unread.append(f"{host}'s datagrams per packet: no lab interface of {host} carried "
                              f"{SEGMENTATION_MIN_PACKETS} packets in the window; its counts are taken as datagrams")
        return units[key]

    places: list[Place] = []
    not_lost: list[dict] = []

    def place(host: str, where: str, what: str, n: int | None, layer: str) -> None:
        if not n or n <= 0:
            return
        p = Place(host=host, where=where, what=what, count=n, layer=layer, datagrams=n, low=n, high=n)
        u = unit(host, layer)
        if u is not None:
            p.unit, p.per_packet, p.datagrams, p.high = "packets", round(u.per, 2), round(n * u.per), n * (top or 1)
            p.basis = f"{u.interface}: {u.avg_bytes:.0f} B per packet" if u.avg_bytes else u.interface
        places.append(p)

    # A sender with IP_RECVERR (the engine) sees a send its qdisc refused as ENOBUFS and sends again: not
    # loss. A queue that segments a GSO send and drops part of it says nothing to the sender: loss.
    # (ENOBUFS counts refused sends over the whole run; with GSO one send carries several datagrams.)
    retried = traffic.error("ENOBUFS") if traffic.tool == "engine" else 0
    for name, q in (probes.of(QdiscProbe) or {}).items():
        host, drops = name.split(":", 1)[0], q.drops or 0
        if host == "client" and retried and drops:
            not_lost.append({"where": f"{name} qdisc ({q.kind})", "count": min(drops, retried),
                             "what": "sends the queue refused (ENOBUFS), sent again by the engine"})
            drops -= min(drops, retried)
        place(host, f"{name} qdisc ({q.kind}) drops", "queue full or over its rate", drops, "queue")
    for name, d in (probes.interfaces or {}).items():
        host = name.split(":", 1)[0]
        for key, what in DEVICE_DROPS:
            place(host, f"{name} {key}", what, d.counter(key), "device")
    backlog = sum(v.dropped or 0 for v in (probes.of(SoftnetStat) or {}).values())
    place("machine", "softnet backlog dropped", "per-CPU input backlog full (netdev_max_backlog)", backlog, "softnet")
    # IPv6 traffic dies in /proc/net/snmp6's counters (Ip6…, Udp6…), IPv4 in /proc/net/snmp's.
    ig, ug = ip_group(w), udp_group(w)
    for role in probes.snmp or {}:
        def n(group: str, name: str, role: str = role) -> int:
            return probes.counter(role, group, name) or 0

        for key, what in (IP6_DROPS if ig == "Ip6" else IP_DROPS):
            # The sender's own IP OutDiscards are its qdisc drops again (or a send the app saw fail).
            if role == "client" and key == "OutDiscards":
                continue
            place(role, f"{role} {ig} {key}", what, n(ig, key), "ip")
        if role == "server":
            # InErrors already counts RcvbufErrors and InCsumErrors: only the rest is its own place.
            other = n(ug, "InErrors") - n(ug, "RcvbufErrors") - n(ug, "InCsumErrors")
            for key, what in UDP_DROPS:
                place(role, f"{role} {ug} {key}", what, other if key == "InErrors" else n(ug, key), "udp")
        if role == "client" and traffic.tool != "engine":
            queue = sum(q.drops or 0 for name, q in (probes.of(QdiscProbe) or {}).items() if name.startswith("client:"))
            # Without IP_RECVERR a send the qdisc dropped returns success and counts in SndbufErrors.
            place(role, f"{role} {ug} SndbufErrors", "send dropped before the wire (send buffer or queue full)",
                  max(0, n(ug, "SndbufErrors") - queue), "udp")
    # A backlog drop also counts as the receiving device's rx_dropped: count it once.
    dev_rx = [p for p in places if p.layer == "device" and p.where.endswith(" rx_dropped")]
    soft = next((p for p in places if p.layer == "softnet"), None)
    overlap = _Bounds(*(min(getattr(soft, k), sum(getattr(p, k) for p in dev_rx)) if soft else 0
                        for k in _Bounds._fields))
    explained = _Bounds(*(sum(getattr(p, k) for p in places) - getattr(overlap, k) for k in _Bounds._fields))
    # Each lost datagram is given to one place: a backlog drop to softnet, not also to the device's
    # rx_dropped; places whose estimates add up to more than the lost (bounds, reads ms apart) share it
    # in proportion. Shares and `unexplained` then add up to exactly 1 (stats.partition).
    left = overlap.datagrams
    parts = []
    for p in places:
        own = p.datagrams
        if left and any(p is q for q in dev_rx):
            own, left = own - min(own, left), left - min(own, left)
        parts.append(own)
    shares, rest = partition(parts, lost)
    for p, share in zip(places, shares, strict=True):
        p.share = share
    order = {"client": 0, "switch": 1, "router": 2, "machine": 3, "server": 4}
    places.sort(key=lambda p: (order.get(p.host, 2), -p.datagrams))
    return LossAttribution.from_json({
        "lost": lost, "lost_source": found.source, "sent": found.sent, "lost_over": found.over,
        **({"lost_low": found.window.lost_low, "lost_high": found.window.lost_high,
            **({"detection_lag_s": found.window.detection_lag_s} if found.window.detection_lag_s else {})}
           if found.window is not None and found.window.lost_low != found.window.lost_high else {}),
        # client and server reads up to skew_s apart: lost is known to ± this many datagrams
        **_lost_uncertainty(probes, found.source, found.sent, w.size or _frame_bytes(probes, "server")),
        "places": [p.to_json() for p in places],
        "explained": min(lost, explained.datagrams),
        "explained_low": min(lost, explained.low), "explained_high": min(lost, explained.high),
        "unexplained": max(0, lost - explained.datagrams),
        "unexplained_share": rest,
        # the places' estimates over the lost count: shares are then of their sum (docs/results.md)
        **({"overshoot": round(sum(parts) - lost)} if sum(parts) > lost else {}),
        "unread": unread,
        "not_lost": not_lost,
        "receiver_absent": receiver_absent(sample),
    })


def _frame_bytes(probes: Probes, role: str) -> int | None:
    """The role's received bytes per packet on its lab interfaces (no more than one datagram's truesize)."""
    ifs = [d for name, d in (probes.interfaces or {}).items() if name.split(":", 1)[0] == role]
    packets = sum(d.packets("rx") for d in ifs)
    return round(sum(d.octets("rx") for d in ifs) / packets) if packets else None


def _lost_uncertainty(probes: Probes, source: str | None, sent: int | None, payload: int | None) -> dict:
    """How far the counters' lost count may be off: the client's and the server's reads were skew_s apart
    (that long a stretch of the sending rate), and, where both run in this machine's kernel, what was on
    its way at an edge — in its input backlogs, or queued on the server's sockets, which count a datagram
    received only when it is read — was sent and not yet received when the counters were read
    (`lost_in_flight`: the fuller edge's, an upper bound; offlab.probes.edge.in_flight)."""
    window = probes.window_s or 0
    if not source or not source.startswith("client") or not sent or window <= 0:
        return {}
    apart = skew(probes.loss_view()[1], "client", "server")
    flight = None if {"client", "server"} & probes.own_kernel() else in_flight(probes.of(InFlightProbe) or {},
                                                                                 "server", payload or 0)
    return {"skew_s": round(apart, 6), "lost_uncertainty": round(sent / window * apart) + (flight or 0),
            **({"lost_in_flight": flight} if flight else {})}


def receiver_absent(sample: StoredSample) -> str | None:
    """Why datagrams found no receiver, when the counters say they did not: the harness's fault, not the path's.

    A receiver that listens on its port gets no UdpNoPorts but the END marker's; more means the
    datagrams arrived while nothing listened (the receiver had stopped — idle timeout after a
    stalled sender, its deadline passed before a slow sender began — or a wrong port). The sender
    then sees ECONNREFUSED from the ICMP port-unreachable replies. With UDP_SEGMENT the receiving
    kernel counts a super-packet that finds no socket once, so NoPorts × segments ≈ datagrams.
    """
    traffic, w = sample.traffic, sample.workload
    noports = sample.probes.counter("server", udp_group(w), "NoPorts") or 0
    refused = traffic.error("ECONNREFUSED")
    if noports <= END_MARKER_NOPORTS and not refused:
        return None
    stop = traffic.receiver_stop
    seen = [f"server {udp_group(w)} NoPorts +{noports}" + (" (one per UDP_SEGMENT super-packet)" if w.gso else "")]
    if refused:
        seen.append(f"sender ECONNREFUSED ×{refused}")
    if stop and stop != "end":
        seen.append(f"receiver stopped on {stop}, not on the sender's END marker")
    return (f"{', '.join(seen)}: datagrams reached the server while no socket listened on the port — "
            f"the receiver was not running (stopped early or not yet started, a harness race) or the port was "
            f"wrong; this is not loss on the path")


# Fewer packets than this on an interface in one direction say nothing about segmentation (ARP, ACKs).
SEGMENTATION_MIN_PACKETS = 20


def segmentation(probes: Probes, mtus: dict[str, int]) -> list[Segment]:
    """Per lab interface and direction: packets, bytes, average packet size against the MTU, and what
    that proves. A veth (or a tap into a guest) counts a GSO/GRO super-packet as one packet, so an
    average above MTU + 14 on a hop is the proof that super-packets crossed it unsegmented, even where
    a capture on the sender is ambiguous (tcpdump there sees super-packets before segmentation)."""
    out = []
    for name, d in (probes.interfaces or {}).items():
        mtu = mtus.get(name)
        for way in ("tx", "rx"):
            packets, size = d.packets(way), d.octets(way)
            if packets < SEGMENTATION_MIN_PACKETS:
                continue
            avg = size / packets
            if mtu is None:
                verdict = "MTU unknown: no verdict"
            elif avg > mtu + ETH_HEADER:
                verdict = "super-packets: not segmented on this hop"
            else:
                verdict = f"wire-size packets (≤ MTU {mtu} + {ETH_HEADER})"
            out.append(Segment.from_json({"interface": name, "direction": way, "packets": packets, "bytes": size,
                                          "avg_bytes": round(avg, 1), "mtu": mtu, "verdict": verdict,
                                          "line": f"{name} {way}: {packets} pkts of avg {avg:.0f} B ({verdict})"}))
    return out


def big_packets(probes: Probes) -> str | None:
    """What the 64 KiB counters (offlab.probes.edge.bigpackets, where the workload asked) prove, in one line:
    which hops carried packets over 64 KiB, and how many crossed a router unsegmented; None if not counted."""
    counts = probes.of(BigPackets)
    if counts is None:
        return None
    hops = {name: d for name, d in counts.items() if d.rx or d.tx}
    if not hops:
        return f"{BIG_MARK}: no packet over 64 KiB on any counted hop ({len(counts)} interfaces): BIG TCP did not take effect"
    routed = sum(d.tx for name, d in hops.items() if name.startswith("router:"))
    reached = sum(d.rx for name, d in hops.items() if name.startswith("router:"))
    head = f"{routed} packets > 64 KiB crossed the router unsegmented; " if routed else \
        f"the router received {reached} packets > 64 KiB and sent none on; " if reached else ""
    return f"{BIG_MARK}: {head}over 64 KiB per hop: " + ", ".join(
        f"{name} rx {d.rx} tx {d.tx}" for name, d in sorted(hops.items()))


BIG_MARK = "packets over 64 KiB"
ZC_MARK = "zerocopy"


def zerocopy(traffic: Traffic) -> str | None:
    """What the kernel's MSG_ZEROCOPY completions say (engine --send zerocopy): every send copied after
    all (SO_EE_CODE_ZEROCOPY_COPIED; a veth or loopback always copies), some, or none; None otherwise."""
    z = traffic.zerocopy
    if not z:
        return None
    done, copied, pending = z.completed, z.copied, z.pending_at_end
    via, flag = z.via, z.copied_flag
    tail = f"; {pending} still held by the kernel at the end" if pending else ""
    if done and copied == done:
        return (f"{ZC_MARK}: the kernel copied all {done} {via} sends ({flag}): "
                f"not a zero-copy figure{tail}")
    return f"{ZC_MARK}: {done - copied} of {done} {via} sends completed without a copy{tail}"


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.2f} %"


OFFERED_SHORT = 0.02  # the zero-loss search's generator-limited threshold, for a single measure too


def offered_short(workload: SampleWorkload, traffic: Traffic) -> str | None:
    """A note when the sender offered clearly less than the rate asked (its CPU, not the path, set the
    rate), so a paced figure is never read as the rate that was asked for."""
    if not workload.rate:
        return None
    rate = parse_rate(workload.rate)
    if rate.pps is not None and traffic.sent_pps is not None:
        asked, got, unit = rate.pps, traffic.sent_pps, "pps"
    elif rate.bps is not None and traffic.sent_bps is not None:
        asked, got, unit = rate.bps, traffic.sent_bps, "bit/s"
    else:
        return None
    if got >= asked * (1 - OFFERED_SHORT):
        return None
    return (f"the sender offered {got:,.0f} {unit} of the {asked:,.0f} {unit} asked "
            f"({(1 - got / asked) * 100:.1f} % short): generator-limited, not a property of the path")
