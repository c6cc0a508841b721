"""GRO / LRO / GRO-list / UDP GRO forwarding on a receiving interface: the packets it received on the wire
against the packets that went on after the merge point — the receiver's IP InReceives (one per merged
skb), or on a forwarding host its busiest other interface's transmitted packets."""

from __future__ import annotations

from offlab.experiment.effects import (EXERCISED, MERGED_BELOW, MIN_PACKETS, NOT_APPLICABLE, NOT_EXERCISED, OFF,
                                       Effect, on, parts)
from offlab.experiment.effects._paths import roles
from offlab.knobs.features import names_for
from offlab.sample import Held, StoredSample
from offlab.wire import ETH_HEADER

# The kernel features that merge, by the traffic they act on; every name a plan may give each.
MERGING = {name: proto for feature, proto in (("rx-gro", "any"), ("rx-lro", "tcp"), ("rx-gro-list", "any"),
                                              ("rx-gro-hw", "any"), ("rx-udp-gro-forwarding", "udp"))
           for name in names_for(feature)}


def covers(key: str) -> bool:
    return key in MERGING


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    probes, workload = sample.probes, sample.workload
    proto = workload.protocol or "tcp"
    kind = MERGING[key]
    e = Effect(setting=key, where=where, value=value, status=OFF if not on(value) else NOT_APPLICABLE)
    role = where.partition(":")[0]
    d = probes.iface(where)
    rx, avg = d.rx_packets, d.rx_avg_bytes
    mtu = probes.mtus.get(where)
    receiver = roles(workload)[1]
    after: int | None = None
    after_name: str | None = None
    if role == receiver:
        group = "Ip6" if workload.ipv6 else "Ip"
        after = probes.counter(role, group, "InReceives", None)
        after_name = f"{role} {group} InReceives"
    else:
        others = [(v.tx_packets, n) for n, v in probes.interfaces.items()
                  if n.startswith(f"{role}:") and n != where and v.tx_bytes > 0]
        if others:
            after, after_name = max(others)
    ratio = after / rx if after is not None and rx else None
    e.counters = {"rx_packets": rx, "rx_avg_bytes": avg, "mtu": mtu, "after_merge": after,
                  "after_merge_counter": after_name, "after_per_received": ratio}
    e.detail = (f"{where} received {rx} packets (avg {avg:.0f} B); {after_name} {after}: "
                f"{ratio:.3f} per packet received" if ratio is not None else f"{where} received {rx} packets")
    if e.status == OFF:
        return e
    if role == roles(workload)[0]:
        e.cause = f"merging acts where data is received; {where} is on the sender"
        return e
    if kind != "any" and kind != proto:
        e.cause = f"{key} merges {kind.upper()} only; the workload is {proto.upper()}"
        return e
    if proto == "udp" and role == receiver and not workload.gro and key not in names_for("rx-gro-list"):
        e.cause = "the kernel merges UDP for a socket only with UDP_GRO (the engine's --gro)"
        return e
    if rx < MIN_PACKETS or ratio is None or mtu is None or not avg:
        e.cause = f"fewer than {MIN_PACKETS} packets received on {where}, or no counter after the merge point"
        return e
    forwarded_udp = (proto == "udp" and role != receiver
                     and key not in names_for("rx-gro-list") | names_for("rx-udp-gro-forwarding"))
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
