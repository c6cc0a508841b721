"""TSO / GSO / USO on an interface: bytes per packet it transmitted in the data direction and on the next
hop's receive side. Above MTU + 14 a veth, tap or virtio NIC carried super-packets: the setting let them
through; at or below, segmentation happened before this interface."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, MIN_PACKETS, NOT_APPLICABLE, NOT_EXERCISED, OFF, Effect, on, parts
from offlab.experiment.effects._paths import next_hop, roles
from offlab.knobs.features import names_for
from offlab.sample import Held, StoredSample
from offlab.wire import ETH_HEADER, TCP_FRAME_OVERHEAD

# The kernel features that segment, by the traffic they act on; every name a plan may give each.
SEGMENTATION = {name: proto for feature, proto in (("tx-tcp-segmentation", "tcp"), ("tx-tcp6-segmentation", "tcp"),
                                                   ("tx-generic-segmentation", "any"), ("tx-udp-segmentation", "udp"))
                for name in names_for(feature)}


def covers(key: str) -> bool:
    return key in SEGMENTATION


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    probes, workload = sample.probes, sample.workload
    proto = workload.protocol or "tcp"
    kind = SEGMENTATION[key]
    e = Effect(setting=key, where=where, value=value, status=OFF if not on(value) else NOT_APPLICABLE)
    d = probes.iface(where)
    peer = next_hop(probes, where, sample.topology)
    p = probes.iface(peer)
    mtu = probes.mtus.get(where)
    pkts, avg = d.tx_packets, d.tx_avg_bytes
    e.counters = {"tx_packets": pkts, "tx_avg_bytes": avg, "mtu": mtu,
                  **({"next_hop": peer, "next_hop_rx_packets": p.rx_packets,
                      "next_hop_rx_avg_bytes": p.rx_avg_bytes} if peer else {})}
    e.detail = (f"{where} sent {pkts} packets of avg {avg:.0f} B (MTU {mtu})" if avg else f"{where} sent no data")
    if peer and p.rx_avg_bytes:
        e.detail += f"; {peer} received avg {p.rx_avg_bytes:.0f} B"
    if e.status == OFF:
        return e
    sender = roles(workload)[0]
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
    if proto == "udp" and not workload.gso:
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
    if workload.rate:
        e.cause = f"the sender was paced at {workload.rate}: a paced TCP sender writes segments one by one"
        return e
    if proto == "tcp" and workload.size and workload.size <= mtu - TCP_FRAME_OVERHEAD + ETH_HEADER:
        e.cause = f"the application wrote {workload.size} B at a time, within one segment"
        return e
    e.status = NOT_EXERCISED
    e.cause = ("every packet left at wire size: the stack segmented before this interface (a device that "
               "takes no super-packets, e.g. a tap without vnet_hdr, or a feature it needs is off)")
    return e
