"""testpmd's port counters over the traffic window, and packets out per packet in (the GRO/GSO proof).

GRO merges: fewer packets leave than arrive (ratio < 1, or below the re-segmentation's own factor);
GSO and TSO split: more leave (ratio > 1). The ratio is taken per forwarding direction, port A's RX
into port B's TX; the data direction is the one that received more bytes (the other carries ACKs,
which outnumber the data packets when the data arrives as TSO super-packets from a guest).
"""

from __future__ import annotations

from offlab.dpdk import Testpmd
from offlab.probes.counters import delta


def read(testpmd: Testpmd) -> dict[int, dict[str, int]]:
    return testpmd.port_stats()


def result(before: dict[int, dict[str, int]], after: dict[int, dict[str, int]]) -> dict:
    """{"ports": {"0": deltas}, "directions": {"0>1": {rx, tx, out_per_in}}, "out_per_in": data direction's}."""
    ports = {p: delta(before[p], after[p]) for p in sorted(after) if p in before}
    directions = {}
    if len(ports) == 2:
        a, b = sorted(ports)
        for src, dst in ((a, b), (b, a)):
            rx, tx = ports[src].get("rx_packets", 0), ports[dst].get("tx_packets", 0)
            directions[f"{src}>{dst}"] = {"rx_packets": rx, "tx_packets": tx, "rx_bytes": ports[src].get("rx_bytes", 0),
                                          "out_per_in": tx / rx if rx else None}
    data = max(directions.values(), key=lambda d: (d["rx_bytes"], d["rx_packets"]), default=None)
    return {"ports": {str(p): d for p, d in ports.items()}, "directions": directions,
            "data_direction": next((k for k, v in directions.items() if v is data), None),
            "out_per_in": data["out_per_in"] if data else None}
