"""An MTU above 1500: the largest frame seen (a capture's, or a wire-size hop's bytes per packet, a lower
bound) against the path's smallest MTU over the interfaces that carried the data."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, MIN_PACKETS, NOT_APPLICABLE, NOT_EXERCISED, OFF, Effect, parts
from offlab.sample import Held, StoredSample
from offlab.wire import ETH_HEADER, UDP_FRAME_OVERHEAD


def covers(key: str) -> bool:
    return key == "mtu"


def judge(setting: Held, sample: StoredSample) -> Effect:
    _, value, where = parts(setting)
    probes, workload = sample.probes, sample.workload
    e = Effect(setting="mtu", where=where, value=value, status=NOT_APPLICABLE)
    try:
        mtu = int(value)
    except ValueError:
        e.cause = f"mtu {value!r} is not a number"
        return e
    ifs = probes.interfaces
    carried = {n: m for n, m in probes.mtus.items()
               if max(probes.iface(n).rx_packets, probes.iface(n).tx_packets) >= MIN_PACKETS}
    smallest = min(carried.items(), key=lambda kv: kv[1]) if carried else None
    wire = [max(v.rx_avg_bytes or 0, v.tx_avg_bytes or 0) for n, v in ifs.items() if n in carried
            and max(v.rx_avg_bytes or 0, v.tx_avg_bytes or 0) <= carried[n] + ETH_HEADER]
    cap = sample.capture
    # a capture on a veth sees super-packets too: its largest frame is a wire frame only within its MTU + 14
    largest = (cap.largest_frame or None) if cap is not None else None
    if largest and cap is not None and largest > (cap.mtu or 0) + ETH_HEADER:
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
    size = workload.size
    if workload.protocol == "udp" and size and size + UDP_FRAME_OVERHEAD <= 1500 + ETH_HEADER and not workload.gso:
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
