"""Did each setting a sample ran with do anything? One effect witness per setting, from the window's counters.

A setting can read back "on" and change nothing: testpmd's GRO outside its csum forwarding engine,
TSO on a tap the kernel never hands a super-packet, jumbo MTU on one hop of a 1500 path. Each
witness here compares the counters over the sample's window with what the setting should produce
for that workload, and says one of:

- `exercised`: the counters show the setting's effect (e.g. 0.073 packets out per packet in);
- `set but not exercised`: it should have shown and did not; `cause` names the likely reason;
- `not applicable`: this workload or path cannot show it either way (UDP datagrams sent one by one
  cannot be segmented; GRO → GSO back to the input's size leaves the packet count unchanged);
- `off`: a setting turned off, recorded with its counters and not judged.

Pure functions over `Sample.to_dict()`-shaped dicts (probes, workload) and the settings in force,
so each is tested on numbers from real captured samples.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from offlab.experiment.plan import topology as static
from offlab.knobs.features import names_for
from offlab.metrics import NOT_EXERCISED
from offlab.wire import ETH_HEADER, TCP_FRAME_OVERHEAD, UDP_FRAME_OVERHEAD

EXERCISED = "exercised"
NOT_APPLICABLE = "not applicable"
OFF = "off"
UNREADABLE = "witness could not read its counters"  # the cause of a witness whose sample lacks a counter

# Fewer packets than this in the data direction say nothing (ARP, a handshake): not applicable.
MIN_PACKETS = 100
# A merge shows when at most this fraction of the packets that would leave without it leaves;
# a split when at least this factor more leave (testpmd GRO into a vhost guest: 0.073; re-segmenting
# 1448 B payloads at 1348 B: 2.00 without GRO, 1.15 with it).
MERGED_BELOW = 0.75
SPLIT_ABOVE = 1.05


@dataclass
class Effect:
    setting: str  # the key as set: testpmd.gro, tso, uso, gro, mtu, workload gso ...
    where: str  # client:to-switch, switch (testpmd port 0), client (socket)
    value: str
    status: str  # EXERCISED | NOT_EXERCISED | NOT_APPLICABLE | OFF
    detail: str  # what the counters say, with their numbers
    counters: dict = field(default_factory=dict)
    cause: str | None = None  # NOT_EXERCISED / NOT_APPLICABLE: the likely reason

    def to_dict(self) -> dict:
        return asdict(self)


def _on(value: object) -> bool:
    return str(value).strip().lower() in ("on", "true", "1", "yes")


# ---- testpmd: packets out per packet in on the data direction ------------------------------------

def testpmd_effects(tp: dict | None, settings: dict | None) -> list[Effect]:
    """testpmd's GRO on the data's input port and GSO on its output port, judged from that direction's
    packets out per packet in. `tp` is the sample's `probes.testpmd`, `settings` testpmd's own read of
    what was in force (`Testpmd.settings()`, stored as `probes.testpmd_settings`)."""
    if not tp or not settings or not tp.get("data_direction"):
        return []
    src, dst = tp["data_direction"].split(">")
    d = tp["directions"][tp["data_direction"]]
    ports = {str(k): v for k, v in (settings.get("ports") or {}).items()}
    pin, pout = ports.get(src) or {}, ports.get(dst) or {}
    fwd = settings.get("fwd")
    # what the engine handed the output port, sent or dropped: a port that drops (a vhost-user guest that
    # cannot keep up: 40353 sent + 3495 dropped of 43848) must not pass for a merge
    out_port = (tp.get("ports") or {}).get(dst) or {}
    dropped, errors = out_port.get("fwd_tx_dropped", 0), out_port.get("tx_errors", 0)
    rx, tx = d["rx_packets"], d["tx_packets"]
    ratio = (tx + dropped) / rx if rx else None
    avg_in = d["rx_bytes"] / rx if rx else 0.0
    counters = {"fwd": fwd, "rx_packets": rx, "tx_packets": tx, "tx_dropped": dropped, "tx_errors": errors,
                "out_per_in": ratio, "sent_per_in": tx / rx if rx else None,
                "rx_avg_bytes": round(avg_in, 1), "direction": f"port {src} → port {dst}"}
    seen = (f"port {src} received {rx} packets (avg {avg_in:.0f} B), port {dst} sent {tx}"
            + (f" and dropped {dropped}" if dropped else "") + (f" ({errors} tx errors)" if errors else "")
            + f": {ratio:.3f} out per in" if ratio is not None else f"port {src} received {rx} packets")
    gro_on = bool((pin.get("gro") or {}).get("on"))
    gso = pout.get("gso") or {}
    gso_on, segsz = bool(gso.get("on")), gso.get("segsz") or 0
    tso = pout.get("tso_segsz") or 0
    out = []
    gro_where, gso_where = f"switch (testpmd port {src}, rx)", f"switch (testpmd port {dst}, tx)"
    if gro_on:
        out.append(_testpmd_gro(gro_where, fwd, rx, ratio, avg_in, gso_on, segsz, tso, dst, seen, counters))
    if gso_on:
        out.append(_testpmd_gso(gso_where, fwd, rx, ratio, avg_in, segsz, gro_on, src, seen, counters))
    return out


def resegment_factor(avg_in: float, gso_segsz: int, tso_segsz: int) -> int:
    """Packets out per packet in that GSO (segsz: whole frame) or TSO (segsz: payload) on the output
    port make of unmerged input frames of `avg_in` bytes: 1 when they fit."""
    payload = avg_in - TCP_FRAME_OVERHEAD
    if payload <= 0:
        return 1
    per = [gso_segsz - TCP_FRAME_OVERHEAD] if gso_segsz else []
    per += [tso_segsz] if tso_segsz else []
    return max([math.ceil(payload / p) for p in per if p > 0] or [1])


def _testpmd_gro(where, fwd, rx, ratio, avg_in, gso_on, segsz, tso, dst, seen, counters) -> Effect:
    e = Effect("testpmd.gro", where, "on", NOT_APPLICABLE, seen, counters)
    if rx < MIN_PACKETS or ratio is None:
        e.cause = f"fewer than {MIN_PACKETS} packets in the data direction: nothing to judge"
        return e
    factor = resegment_factor(avg_in, segsz if gso_on else 0, tso)
    e.counters = {**counters, "unmerged_out_per_in": factor}
    # A port that refuses merged frames (the tap PMD: any non-TSO frame over MTU + 22 B is a tx error)
    # also shows the merge: fewer sent per packet in, with errors.
    refused = counters["tx_errors"] > 0 and counters["sent_per_in"] < MERGED_BELOW * factor
    if ratio < MERGED_BELOW * factor or refused:
        e.status = EXERCISED
        e.detail = seen + (f" (without a merge {factor} would leave per packet in)" if factor > 1 else "") + (
            f"; port {dst} refused merged frames ({counters['tx_errors']} tx errors)" if refused else "")
        return e
    if fwd != "csum":
        e.status, e.cause = NOT_EXERCISED, f"testpmd GRO runs only in its csum forwarding engine; fwd is {fwd}"
        return e
    if factor == 1 and (gso_on or tso):
        e.cause = (f"{'GSO (segsz ' + str(segsz) if gso_on else 'TSO (segsz ' + str(tso)} B) on port {dst} cuts "
                   f"merged packets back to the input's size (avg {avg_in:.0f} B): packets out per packet in "
                   f"cannot show a merge")
        return e
    e.status = NOT_EXERCISED
    e.cause = ("GRO merged nothing: the PMD sets no packet type, or the flow's packets do not arrive within "
               "one burst (gro_flush)")
    return e


def _testpmd_gso(where, fwd, rx, ratio, avg_in, segsz, gro_on, src, seen, counters) -> Effect:
    e = Effect("testpmd.gso", where, "on", NOT_APPLICABLE, seen, {**counters, "gso_segsz": segsz})
    if rx < MIN_PACKETS or ratio is None:
        e.cause = f"fewer than {MIN_PACKETS} packets in the data direction: nothing to judge"
        return e
    if ratio > SPLIT_ABOVE:
        e.status = EXERCISED
        return e
    if fwd != "csum":
        e.status, e.cause = NOT_EXERCISED, f"testpmd GSO runs only in its csum forwarding engine; fwd is {fwd}"
        return e
    if avg_in <= segsz and not gro_on:
        e.status = NOT_EXERCISED
        e.cause = (f"nothing to segment: the input frames averaged {avg_in:.0f} B, at most gso_segsz {segsz} B, "
                   f"and GRO is off on port {src} (a kernel tap hands testpmd wire-size frames)")
        return e
    if gro_on and avg_in <= segsz:
        e.cause = (f"GRO on port {src} merges and GSO cuts back to {segsz} B, the input's own size: "
                   f"packets out per packet in cannot show the split")
        return e
    e.status, e.cause = NOT_EXERCISED, f"frames above gso_segsz {segsz} B arrived and left whole"
    return e


# ---- kernel features: segmentation at the sender, merging at a receiver -------------------------

# Kernel features by the traffic they act on; every name a plan may give each (features.names_for).
SEGMENTATION = {name: proto for feature, proto in (("tx-tcp-segmentation", "tcp"), ("tx-tcp6-segmentation", "tcp"),
                                                   ("tx-generic-segmentation", "any"), ("tx-udp-segmentation", "udp"))
                for name in names_for(feature)}
MERGING = {name: proto for feature, proto in (("rx-gro", "any"), ("rx-lro", "tcp"), ("rx-gro-list", "any"),
                                              ("rx-gro-hw", "any"), ("rx-udp-gro-forwarding", "udp"))
           for name in names_for(feature)}


def _roles(workload: dict) -> tuple[str, str]:
    """(sender, receiver) of the data."""
    return ("server", "client") if workload.get("reverse") else ("client", "server")


def _next_hop(interfaces: dict, where: str, topology: str | None) -> str | None:
    """The interface of the next host on the path (the topology's neighbour of `where`'s host) that
    received most nearly the bytes `where` sent: within 10 %, else none."""
    role, sent = where.partition(":")[0], (interfaces.get(where) or {}).get("tx_bytes") or 0
    peers = {i.peer for i in static.HOSTS.get(topology or "", {}).get(role, ()) if i.peer}
    near = [(abs((v.get("rx_bytes") or 0) - sent), n) for n, v in interfaces.items()
            if n.partition(":")[0] != role and (not peers or n.partition(":")[0] in peers)
            and sent and abs((v.get("rx_bytes") or 0) - sent) <= 0.1 * sent]
    return min(near)[1] if near else None


def segmentation_effect(key: str, value: str, where: str, probes: dict, workload: dict,
                        topology: str | None = None) -> Effect:
    """TSO / GSO / USO on an interface: bytes per packet it transmitted in the data direction and on the
    next hop's receive side. Above MTU + 14 a veth, tap or virtio NIC carried super-packets: the setting
    let them through; at or below, segmentation happened before this interface."""
    proto = workload.get("protocol") or "tcp"
    kind = SEGMENTATION[key]
    e = Effect(key, where, str(value), OFF if not _on(value) else NOT_APPLICABLE, "", {})
    ifs = probes.get("interfaces") or {}
    mtus = probes.get("mtus") or {}
    d = ifs.get(where) or {}
    peer = _next_hop(ifs, where, topology)
    p = ifs.get(peer) or {} if peer else {}
    mtu = mtus.get(where)
    pkts, avg = d.get("tx_packets") or 0, d.get("tx_avg_bytes")
    e.counters = {"tx_packets": pkts, "tx_avg_bytes": avg, "mtu": mtu,
                  **({"next_hop": peer, "next_hop_rx_packets": p.get("rx_packets"),
                      "next_hop_rx_avg_bytes": p.get("rx_avg_bytes")} if peer else {})}
    e.detail = (f"{where} sent {pkts} packets of avg {avg:.0f} B (MTU {mtu})" if avg else f"{where} sent no data")
    if peer and p.get("rx_avg_bytes"):
        e.detail += f"; {peer} received avg {p['rx_avg_bytes']:.0f} B"
    if e.status == OFF:
        return e
    sender = _roles(workload)[0]
    if not where.startswith(f"{sender}:"):
        if avg and mtu and pkts >= MIN_PACKETS and avg > mtu + ETH_HEADER:
            e.status = EXERCISED  # a forwarding hop passed super-packets on (a GRO hop's, or the sender's)
        else:
            e.cause = (f"{where} forwards what arrives: it segments only super-packets the sender or a GRO "
                       f"hop made, and none left it")
        return e
    if kind != "any" and kind != proto:
        e.cause = f"{key} segments {kind.upper()} only; the workload is {proto.upper()}"
        return e
    if proto == "udp" and not workload.get("gso"):
        e.cause = ("UDP datagrams are sent one by one: only UDP_SEGMENT (the engine's --gso) makes UDP "
                   "super-packets to segment")
        return e
    if pkts < MIN_PACKETS or not avg or mtu is None:
        e.cause = f"fewer than {MIN_PACKETS} packets sent on {where}, or its MTU unknown"
        return e
    if avg > mtu + ETH_HEADER:
        e.status = EXERCISED
        return e
    if kind == "any" and proto == "tcp":
        e.cause = ("TCP builds GSO super-packets whatever this feature says (Linux ≥ 4.13); without TSO they are "
                   "cut just before the device either way, so no counter tells gso on from off here")
        return e
    if workload.get("rate"):
        e.cause = f"the sender was paced at {workload['rate']}: a paced TCP sender writes segments one by one"
        return e
    if proto == "tcp" and workload.get("size") and workload["size"] <= mtu - TCP_FRAME_OVERHEAD + ETH_HEADER:
        e.cause = f"the application wrote {workload['size']} B at a time, within one segment"
        return e
    e.status = NOT_EXERCISED
    e.cause = ("every packet left at wire size: the stack segmented before this interface (a device that "
               "takes no super-packets, e.g. a tap without vnet_hdr, or a feature it needs is off)")
    return e


def merging_effect(key: str, value: str, where: str, probes: dict, workload: dict) -> Effect:
    """GRO / LRO / GRO-list / UDP GRO forwarding on a receiving interface: the packets it received on
    the wire against the packets that went on after the merge point — the receiver's IP InReceives
    (one per merged skb), or on a forwarding host its busiest other interface's transmitted packets."""
    proto = workload.get("protocol") or "tcp"
    kind = MERGING[key]
    e = Effect(key, where, str(value), OFF if not _on(value) else NOT_APPLICABLE, "", {})
    ifs = probes.get("interfaces") or {}
    role = where.partition(":")[0]
    d = ifs.get(where) or {}
    rx, avg = d.get("rx_packets") or 0, d.get("rx_avg_bytes")
    mtu = (probes.get("mtus") or {}).get(where)
    receiver = _roles(workload)[1]
    after, after_name = None, None
    if role == receiver:
        group = "Ip6" if workload.get("ipv6") else "Ip"
        after = (((probes.get("snmp") or {}).get(role) or {}).get(group) or {}).get("InReceives")
        after_name = f"{role} {group} InReceives"
    else:
        others = [(v.get("tx_packets") or 0, n) for n, v in ifs.items()
                  if n.startswith(f"{role}:") and n != where and (v.get("tx_bytes") or 0) > 0]
        if others:
            after, after_name = max(others)
    ratio = after / rx if after is not None and rx else None
    e.counters = {"rx_packets": rx, "rx_avg_bytes": avg, "mtu": mtu, "after_merge": after,
                  "after_merge_counter": after_name, "after_per_received": ratio}
    e.detail = (f"{where} received {rx} packets (avg {avg:.0f} B); {after_name} {after}: "
                f"{ratio:.3f} per packet received" if ratio is not None else f"{where} received {rx} packets")
    if e.status == OFF:
        return e
    if role == _roles(workload)[0]:
        e.cause = f"merging acts where data is received; {where} is on the sender"
        return e
    if kind != "any" and kind != proto:
        e.cause = f"{key} merges {kind.upper()} only; the workload is {proto.upper()}"
        return e
    if proto == "udp" and role == receiver and not workload.get("gro") and key not in ("gro-list", "rx-gro-list"):
        e.cause = "the kernel merges UDP for a socket only with UDP_GRO (the engine's --gro)"
        return e
    if rx < MIN_PACKETS or ratio is None or mtu is None or not avg:
        e.cause = f"fewer than {MIN_PACKETS} packets received on {where}, or no counter after the merge point"
        return e
    forwarded_udp = proto == "udp" and role != receiver and key not in ("gro-list", "rx-gro-list", "udp-gro-fwd",
                                                                         "rx-udp-gro-forwarding")
    if forwarded_udp and ratio >= MERGED_BELOW:
        e.cause = ("plain GRO merges forwarded UDP only with rx-udp-gro-forwarding or rx-gro-list on: their own "
                   "witnesses judge that")
        return e
    if avg > mtu + ETH_HEADER:
        e.cause = (f"the packets arrived already merged (avg {avg:.0f} B > MTU {mtu} + {ETH_HEADER}: super-packets "
                   f"from the sender's TSO/GSO): nothing left to merge")
        return e
    if ratio < MERGED_BELOW:
        e.status = EXERCISED
        return e
    e.status = NOT_EXERCISED
    e.cause = ("as many packets went on as arrived: nothing was merged — a veth merges only what its peer "
               "could not have sent as super-packets (the peer's TSO off), a tap delivers without NAPI")
    return e


def mtu_effect(value: str, where: str, probes: dict, capture: dict | None, workload: dict) -> Effect:
    """An MTU above 1500: the largest frame seen (a capture's, or a wire-size hop's bytes per packet,
    a lower bound) against the path's smallest MTU over the interfaces that carried the data."""
    e = Effect("mtu", where, str(value), NOT_APPLICABLE, "", {})
    try:
        mtu = int(value)
    except ValueError:
        e.cause = f"mtu {value!r} is not a number"
        return e
    ifs, mtus = probes.get("interfaces") or {}, probes.get("mtus") or {}
    carried = {n: m for n, m in mtus.items()
               if max((ifs.get(n) or {}).get("rx_packets") or 0, (ifs.get(n) or {}).get("tx_packets") or 0) >= MIN_PACKETS}
    smallest = min(carried.items(), key=lambda kv: kv[1]) if carried else None
    wire = [max(v.get("rx_avg_bytes") or 0, v.get("tx_avg_bytes") or 0) for n, v in ifs.items() if n in carried
            and max(v.get("rx_avg_bytes") or 0, v.get("tx_avg_bytes") or 0) <= carried[n] + ETH_HEADER]
    cap = capture or {}
    # a capture on a veth sees super-packets too: its largest frame is a wire frame only within its MTU + 14
    largest = cap.get("largest_frame") or None
    if largest and largest > (cap.get("mtu") or 0) + ETH_HEADER:
        largest = None
    bound = max(wire) if wire else None
    e.counters = {"path_smallest_mtu": smallest[1] if smallest else None,
                  "smallest_at": smallest[0] if smallest else None,
                  "largest_frame_captured": largest, "largest_frame_at_least": round(bound, 1) if bound else None}
    seen = (f"largest frame {largest} B (capture)" if largest else
            f"largest frame at least {bound:.0f} B (bytes per packet on a wire-size hop)" if bound else
            "no frame size seen (super-packets on every hop, no capture)")
    e.detail = f"{seen}; the path's smallest MTU {smallest[1]} at {smallest[0]}" if smallest else seen
    if mtu <= 1500 or not smallest:
        e.status = OFF if mtu <= 1500 else NOT_APPLICABLE
        if smallest is None and mtu > 1500:
            e.cause = "no interface carried data"
        return e
    if smallest[1] < mtu:
        e.status = NOT_EXERCISED
        e.cause = f"{smallest[0]} has MTU {smallest[1]}: no frame above it crosses the path"
        return e
    size = workload.get("size")
    if workload.get("protocol") == "udp" and size and size + UDP_FRAME_OVERHEAD <= 1514 and not workload.get("gso"):
        e.cause = f"{size} B datagrams fit a 1500 MTU: the larger MTU cannot show"
        return e
    frame = largest or bound
    if frame is None:
        e.cause = "super-packets hide the frame size on every hop and no capture was taken (--capture)"
        return e
    if frame > 1500 + ETH_HEADER:
        e.status = EXERCISED
        return e
    e.status = NOT_EXERCISED
    e.cause = f"no frame above {1500 + ETH_HEADER} B seen although the path allows {smallest[1]}"
    return e


# ---- which CPUs did the work: RPS; busy polling -------------------------------------------------

def _cpus(mask: str) -> set[int]:
    bits = int(str(mask).replace(",", ""), 16)
    return {i for i in range(bits.bit_length()) if bits >> i & 1}


def _masked(key: str, value: str, where: str) -> tuple[Effect, set[int] | None]:
    """A CPU-mask setting's witness to fill in, and its CPUs (None, said in the witness, if not a mask)."""
    e = Effect(key, where, str(value), NOT_APPLICABLE, "", {})
    try:
        return e, _cpus(value)
    except ValueError:
        e.cause = f"{value!r} is not a CPU mask"
        return e, None


def rps_effect(key: str, value: str, where: str, probes: dict, workload: dict) -> Effect:
    """RPS on a receive queue: the packets the mask's CPUs were sent to process by inter-processor
    interrupt (softnet `received_rps`) and what each CPU's backlog processed. A mask of only the CPU
    where the packets arrive steers without an interrupt: not applicable."""
    e, cpus = _masked(key, value, where)
    if cpus is None:
        return e
    soft = {int(c): d for c, d in (probes.get("softnet") or {}).items()}
    steered = sum((soft.get(c) or {}).get("received_rps", 0) for c in cpus)
    e.counters = {"cpus": sorted(cpus), "received_rps": {str(c): d.get("received_rps") for c, d in soft.items()},
                  "processed": {str(c): d.get("processed") for c, d in soft.items()}}
    e.detail = (f"softnet received_rps on CPU {', '.join(map(str, sorted(cpus)))}: {steered}; processed per CPU "
                + ", ".join(f"{c}: {d.get('processed')}" for c, d in sorted(soft.items())))
    if not cpus:
        e.status = OFF
        return e
    if not any("received_rps" in d for d in soft.values()):
        e.cause = "this sample has no softnet received_rps counts (measured before they were kept)"
        return e
    arrive = workload.get("server_cpu" if workload.get("reverse") else "client_cpu")
    if steered > 0:
        e.status = EXERCISED
    elif arrive is not None and cpus == {arrive}:
        e.cause = (f"the mask is CPU {arrive}, where a veth's packets arrive (the sender's CPU): steering "
                   f"there needs no interrupt, so no counter shows it")
    else:
        e.status = NOT_EXERCISED
        e.cause = ("no packet was steered to the mask's CPUs: the traffic did not arrive on this receive "
                   "queue, or RFS/another mask decided first")
    return e


BUSY_POLL = ("net.core.busy_poll", "net.core.busy_read")


def busy_poll_effect(key: str, value: str, where: str, probes: dict, workload: dict) -> Effect:
    """net.core.busy_poll / busy_read: the packets the receiver's sockets took by busy polling a NAPI
    context (TcpExt BusyPollRxPackets, counted for every protocol)."""
    receiver = _roles(workload)[1]
    polled = (((probes.get("snmp") or {}).get(receiver) or {}).get("TcpExt") or {}).get("BusyPollRxPackets")
    e = Effect(key, where, str(value), NOT_APPLICABLE, f"{receiver} TcpExt BusyPollRxPackets {polled}",
               {f"{receiver}_BusyPollRxPackets": polled})
    if str(value).strip() in ("0", ""):
        e.status = OFF
    elif polled is None:
        e.cause = f"no BusyPollRxPackets count for {receiver} (a sample measured before it was kept)"
    elif polled > 0:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = ("no packet was busy-polled: a socket polls only a device with NAPI (a veth only with GRO "
                   "or XDP on; a tap has none) and only while it waits in poll/select/read")
    return e


# ---- which queues did the work: channels, XPS; NAPI threads and deferral ---------------------------

QUEUE_KEYS = ("channels.rx", "channels.tx", "channels.combined")
# a queue "did work" when it carried at least this share of the interface's packets in that direction
BUSY_QUEUE_SHARE = 0.01
VETH_QUEUES = ("no per-queue count moved here or on the next hop: a veth counts per queue only what it receives "
               "through NAPI (GRO on at the receiving end with the sender's TSO off, or XDP), virtio-net's receive "
               "queues count only XDP, and a tap or bridge counts none; a multiqueue device's transmit queues are "
               "counted by its mq qdisc's children")


def is_queue_setting(key: str) -> bool:
    """A setting whose witness needs the per-queue packets (the probes read them only then)."""
    return key in QUEUE_KEYS or key == "xps" or key.startswith("xps.")


def _queue_counts(where: str, way: str, probes: dict, topology: str | None) -> tuple[str | None, dict[str, int]]:
    """The per-queue packets that show `where`'s queues in direction `way` (tx: queues it sent on): its own
    counters, else, for tx, the receive queues of the next hop (a veth hands a packet sent on its queue N
    to its peer's receive queue N)."""
    queues = probes.get("queues") or {}
    own = (queues.get(where) or {}).get(way) or {}
    if sum(own.values()):
        return where, own
    if way != "tx":
        return None, own
    sent = ((probes.get("qdisc") or {}).get(where) or {}).get("queues") or {}
    if sum(sent.values()):  # a multiqueue device's mq children: what each queue sent
        return f"{where} qdisc", sent
    hop = _next_hop(probes.get("interfaces") or {}, where, topology)
    theirs = ((queues.get(hop) or {}).get("rx") or {}) if hop else {}
    return (f"{hop} rx", theirs) if sum(theirs.values()) else (None, own)


def _data_way(where: str, probes: dict) -> str:
    d = (probes.get("interfaces") or {}).get(where) or {}
    return "tx" if (d.get("tx_bytes") or 0) >= (d.get("rx_bytes") or 0) else "rx"


def _spread(counts: dict[str, int]) -> str:
    return ", ".join(f"queue {q}: {n}" for q, n in sorted(counts.items(), key=lambda x: int(x[0])))


def channels_effect(key: str, value: str, where: str, probes: dict, workload: dict,
                    topology: str | None = None) -> Effect:
    """channels.rx/tx/combined N > 1: the data went through more than one queue of the interface (its
    own per-queue counters, or for a veth's transmit queues its peer's receive queues)."""
    e = Effect(key, where, str(value), NOT_APPLICABLE, "", {})
    try:
        n = int(str(value))
    except ValueError:
        e.cause = f"{value!r} is not a queue count"
        return e
    if "queues" not in probes:
        e.cause = "this sample did not read per-queue counters (measured before they were kept)"
        return e
    data = _data_way(where, probes)
    way = key.split(".")[1] if key in ("channels.rx", "channels.tx") else data
    seen, counts = _queue_counts(where, way, probes, topology)
    total = sum(counts.values())
    e.counters = {"queues": counts, "counted_at": seen}
    if n <= 1:
        e.status, e.detail = OFF, f"{n} queue(s)"
        return e
    if way != data:
        e.detail = (f"{where}: the data {'left' if data == 'tx' else 'arrived'} through it; its {way} queues "
                    f"carried only the other direction's packets (acknowledgements)")
        e.cause = f"the data did not go through {where}'s {way} queues"
        return e
    if seen is None or total < MIN_PACKETS:
        e.detail = f"{where} {way}: no per-queue packet counts"
        e.cause = VETH_QUEUES if seen is None else f"fewer than {MIN_PACKETS} packets counted per queue"
        return e
    busy = [q for q, c in counts.items() if c >= BUSY_QUEUE_SHARE * total]
    e.detail = f"{seen}: {_spread(counts)} ({len(busy)} of {len(counts)} queues carried the data)"
    streams = int(workload.get("streams") or 1)
    if len(busy) > 1:
        e.status = EXERCISED
    elif len(counts) < n:
        e.status = NOT_EXERCISED
        e.cause = (f"{seen.split()[0]} has {len(counts)} {'receive ' if seen != where else ''}queue(s), fewer than "
                   f"the {n} set: a veth hands what its transmit queue N sends to its peer's receive queue N only "
                   f"where the peer has one")
    elif streams <= 1:
        e.cause = "one flow goes through one queue: more queues show only with parallel streams"
    else:
        e.status = NOT_EXERCISED
        e.cause = (f"all {streams} streams went through queue {busy[0] if busy else '?'}: the flow hash put them "
                   f"on one queue, or an XPS mask maps the sending CPU to it")
    return e


def xps_effect(key: str, value: str, where: str, probes: dict, workload: dict,
               topology: str | None = None) -> Effect:
    """xps.N (a CPU mask on transmit queue N): the sender's packets went out on queue N, seen by that
    queue's counters (or the next hop's receive queue N). `xps` sets one mask on every queue, which
    leaves the choice among them to the flow hash, as without XPS: not applicable."""
    e, cpus = _masked(key, value, where)
    if cpus is None:
        return e
    if not cpus:
        e.status, e.detail = OFF, "mask 0"
        return e
    if key == "xps":
        e.cause = "one mask on every queue leaves the choice among them to the flow hash, as without XPS"
        return e
    if "queues" not in probes:
        e.cause = "this sample did not read per-queue counters (measured before they were kept)"
        return e
    queue = key.split(".", 1)[1]
    seen, counts = _queue_counts(where, "tx", probes, topology)
    total = sum(counts.values())
    e.counters = {"queues": counts, "counted_at": seen, "cpus": sorted(cpus)}
    if seen is None or total < MIN_PACKETS:
        e.detail = f"{where} tx: no per-queue packet counts"
        e.cause = VETH_QUEUES if seen is None else f"fewer than {MIN_PACKETS} packets counted per queue"
        return e
    mine = counts.get(queue, 0)
    e.detail = f"{seen}: {_spread(counts)}; queue {queue} carried {mine} of {total}"
    sender = _roles(workload)[0]
    # offlab pins the sender only on a host that shares this machine's kernel (a guest's is not pinned)
    own = sender in ((probes.get("cpu") or {}).get("own_kernel") or {})
    cpu = None if own else workload.get("server_cpu" if sender == "server" else "client_cpu")
    if mine >= BUSY_QUEUE_SHARE * total:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = (f"the {sender} sent from CPU {cpu}, which the mask does not name: XPS picks the queue by the "
                   f"sending CPU" if cpu is not None and where.startswith(f"{sender}:") and cpu not in cpus else
                   f"no packet left on queue {queue}: the sending CPU is in another queue's mask, or the "
                   f"packets were sent from softirq on another CPU")
    return e


def threaded_effect(value: str, where: str, probes: dict) -> Effect:
    """threaded NAPI: the interface's NAPI kernel thread (napi/IF-ID) used CPU in the window."""
    role, _, iface = where.partition(":")
    prefix = f"napi/{iface}-"[:15]  # a thread's comm is cut at 15 characters
    threads = [p for p in probes.get("processes") or [] if str(p.get("comm", "")).startswith(prefix)]
    busy = round(sum(p.get("cpu_pct") or 0 for p in threads), 2)
    e = Effect("threaded", where, str(value), NOT_APPLICABLE,
               f"{len(threads)} napi/{iface} thread(s) used {busy} % of a CPU", {"napi_threads_cpu_pct": busy})
    if not _on(value):
        e.status = OFF
    elif role in ((probes.get("cpu") or {}).get("own_kernel") or {}):
        e.cause = f"{role} has a kernel of its own, whose threads the probes do not read"
    elif busy > 0:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = (f"no NAPI thread of {iface} ran: its packets were not received through NAPI (a veth has NAPI "
                   f"only with GRO on and the sending peer's TSO off, or XDP)")
    return e


NAPI_DEFERRAL = ("gro_flush_timeout", "napi_defer_hard_irqs")


def napi_deferral_effect(key: str, value: str, where: str, probes: dict) -> Effect:
    """gro_flush_timeout / napi_defer_hard_irqs: not judged. They lower a device's interrupts per packet;
    a veth or tap raises none (its NAPI is scheduled by the sender) and a guest's or NIC's interrupt
    counts are not read, so the sample records the setting and says why it cannot show it."""
    role = where.partition(":")[0]
    e = Effect(key, where, str(value), NOT_APPLICABLE, "", {})
    if str(value).strip() in ("0", ""):
        e.status = OFF
    elif role in ((probes.get("cpu") or {}).get("own_kernel") or {}):
        e.cause = "the device's interrupt counts in a host with its own kernel are not read: not witnessed"
    else:
        e.cause = ("a veth's or tap's NAPI is scheduled by its sender, not by an interrupt: there is no "
                   "interrupt count for deferral to lower, and its timer's interrupts are not told apart "
                   "from the others'")
    return e


# ---- BIG TCP: GSO/GRO sizes above 64 KiB ------------------------------------------------------------

BIG_SIZES = {"gso_max_size": "tx", "gso_ipv4_max_size": "tx", "gro_max_size": "rx", "gro_ipv4_max_size": "rx"}
LEGACY_MAX = 65536


def big_size_effect(key: str, value: str, where: str, probes: dict) -> Effect:
    """A gso/gro max size above 64 KiB (BIG TCP): the packets over 64 KiB the interface sent (gso) or
    received after GRO (gro), counted by the sample's nftables length match (workload big_packets)."""
    from offlab.probes.bigpackets import seen

    way = BIG_SIZES[key]
    n = seen(probes.get("big_packets"), where, way)
    e = Effect(key, where, str(value), NOT_APPLICABLE, f"{where} {way} packets > 64 KiB: {n}",
               {f"{way}_over_64k": n})
    if int(value) <= LEGACY_MAX:
        e.status = OFF
    elif n is None:
        e.cause = "the sample did not count packets over 64 KiB (workload big_packets: true counts them)"
    elif n > 0:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = ("no packet over 64 KiB: the sender's own size, a hop's tso_max_size (a tap's is 65536) or "
                   "an IPv6 router answering Packet Too Big keeps them at 64 KiB")
    return e


def zerocopy_effect(traffic: dict) -> list[Effect]:
    """engine --send zerocopy or io_uring-zc: the kernel's completions (the error queue's, or io_uring's
    notification CQEs) say whether any send went without a copy."""
    z = traffic.get("zerocopy")
    if not z:
        return []
    done, copied = z.get("completed", 0), z.get("copied", 0)
    via, flag = z.get("via", "MSG_ZEROCOPY"), z.get("copied_flag", "SO_EE_CODE_ZEROCOPY_COPIED")
    e = Effect("workload send (zerocopy)", "client (socket)", "zerocopy", NOT_APPLICABLE,
               f"{done} {via} completions, {copied} of them copied ({flag})",
               {"completed": done, "copied": copied})
    if not done:
        e.cause = "no completion was read"
    elif copied < done:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = "the kernel copied every send (a veth or loopback always does): not a zero-copy figure"
    return [e]


# ---- the sender's and receiver's socket options: UDP_SEGMENT and UDP_GRO ------------------------

def workload_effects(probes: dict, workload: dict, traffic: dict) -> list[Effect]:
    """The engine's --gso (UDP_SEGMENT) and --gro (UDP_GRO): datagrams per send and per receive, from
    the kernel's Udp OutDatagrams / InDatagrams (one per super-packet, one per merged buffer) against
    the bytes the sender's interfaces carried / the datagrams the receiving application got."""
    if workload.get("protocol") != "udp" or not workload.get("size"):
        return []
    out = []
    sender, receiver = _roles(workload)
    ifs, snmp = probes.get("interfaces") or {}, probes.get("snmp") or {}
    group = "Udp6" if workload.get("ipv6") else "Udp"
    datagram = workload["size"] + UDP_FRAME_OVERHEAD
    for flag, role, counter in (("gso", sender, "OutDatagrams"), ("gro", receiver, "InDatagrams")):
        if not workload.get(flag):
            continue
        calls = ((snmp.get(role) or {}).get(group) or {}).get(counter)
        if flag == "gso":  # what left the sender's interfaces, in datagrams
            size = sum(v.get("tx_bytes") or 0 for n, v in ifs.items() if n.startswith(f"{role}:"))
            datagrams, source = size / datagram, f"{size} B on its interfaces"
        else:  # what its application received over the window (a receive-buffer drop counts in neither)
            datagrams = (traffic.get("pps") or 0) * (probes.get("window_s") or 0)
            source = f"{datagrams:.0f} datagrams its application received"
        per = datagrams / calls if calls else None
        what = "UDP_SEGMENT" if flag == "gso" else "UDP_GRO"
        e = Effect(f"workload {flag} ({what})", f"{role} (socket)", "on", NOT_APPLICABLE, "",
                   {f"{role}_{group}_{counter}": calls, "datagrams": round(datagrams), "datagrams_per_call": per})
        e.detail = (f"{role} {group} {counter} {calls} for {source}: {per:.1f} datagrams of "
                    f"{workload['size']} B per {'send' if flag == 'gso' else 'receive'}" if per is not None
                    else f"{role} {group} {counter} unknown")
        if calls is None or per is None or calls < MIN_PACKETS:
            e.cause = f"fewer than {MIN_PACKETS} {counter}: nothing to judge"
        elif per > 1.5:
            e.status = EXERCISED
        else:
            e.status = NOT_EXERCISED
            e.cause = ("each send carried one datagram" if flag == "gso" else
                       "each receive got one datagram: the receiving device merged nothing (a veth merges "
                       "only with its gro feature on)")
        out.append(e)
    return out


# ---- all of a sample ---------------------------------------------------------------------------

def witness(sample: dict, settings: list[dict]) -> list[dict]:
    """Every effect witness of a stream sample: testpmd's (from its own read of what was in force), the
    workload's socket options, and each setting in `settings` ({"where", "key", "value"}: the cell's
    settings in force, or the lab's journalled ones) that has a witness. A witness that cannot read
    the counters it needs (a sample stored before they were kept) says so as `not applicable`, with why,
    and never costs the sample; any other error in a witness is a bug and is raised."""
    probes, w = sample.get("probes") or {}, sample.get("workload") or {}
    if w.get("kind") == "rr":
        return []
    out: list[Effect] = []
    steps = [("testpmd", lambda: testpmd_effects(probes.get("testpmd"), probes.get("testpmd_settings"))),
             ("workload", lambda: workload_effects(probes, w, sample.get("traffic") or {})),
             ("zerocopy", lambda: zerocopy_effect(sample.get("traffic") or {}))]
    for s in settings:
        judge = _judge(str(s.get("key") or ""), str(s.get("value")), s.get("where") or "", sample)
        if judge is not None:
            steps.append((str(s.get("key")), judge))
    for name, step in steps:
        try:
            out += step()
        except KeyError as exc:
            out.append(Effect(name, "?", "?", NOT_APPLICABLE, "the counters this witness reads are not all there",
                              cause=f"{UNREADABLE}: KeyError: {exc}"))
    return [e.to_dict() for e in out]


def _judge(key: str, value: str, where: str, sample: dict):
    """The witness of one setting, to be called; None for a setting without one."""
    probes, w = sample.get("probes") or {}, sample.get("workload") or {}
    if key in SEGMENTATION:
        return lambda: [segmentation_effect(key, value, where, probes, w, sample.get("topology"))]
    if key in MERGING:
        return lambda: [merging_effect(key, value, where, probes, w)]
    if key == "mtu":
        return lambda: [mtu_effect(value, where, probes, sample.get("capture"), w)]
    if key == "rps" or key.startswith("rps."):
        return lambda: [rps_effect(key, value, where, probes, w)]
    if key in BUSY_POLL:
        return lambda: [busy_poll_effect(key, value, where, probes, w)]
    if key in BIG_SIZES:
        return lambda: [big_size_effect(key, value, where, probes)]
    if key in QUEUE_KEYS:
        return lambda: [channels_effect(key, value, where, probes, w, sample.get("topology"))]
    if key == "xps" or key.startswith("xps."):
        return lambda: [xps_effect(key, value, where, probes, w, sample.get("topology"))]
    if key == "threaded":
        return lambda: [threaded_effect(value, where, probes)]
    if key in NAPI_DEFERRAL:
        return lambda: [napi_deferral_effect(key, value, where, probes)]
    return None
