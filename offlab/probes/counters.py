"""Counters read before and after the window: interfaces, /proc/net/snmp (softnet_stat: offlab.netdev)."""

from __future__ import annotations

# The SNMP counters that explain results (RcvbufErrors explains UDP loss, RetransSegs TCP stalls).
SNMP_KEEP = {
    "Udp": ("InDatagrams", "OutDatagrams", "NoPorts", "InErrors", "RcvbufErrors", "SndbufErrors", "InCsumErrors"),
    "Tcp": ("InSegs", "OutSegs", "RetransSegs", "InErrs", "InCsumErrors"),
    "Ip": ("InReceives", "InHdrErrors", "InAddrErrors", "ForwDatagrams", "InDiscards", "InDelivers", "OutRequests",
           "OutDiscards", "OutNoRoutes", "ReasmReqds", "ReasmOKs", "ReasmFails", "FragOKs", "FragCreates",
           "FragFails"),
}


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp (header line + value line per protocol) → {proto: {counter: value}}."""
    lines = text.splitlines()
    out: dict[str, dict[str, int]] = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        proto, names = head.split(":", 1)
        _, values = vals.split(":", 1)
        if proto in SNMP_KEEP:
            row = dict(zip(names.split(), values.split()))
            out[proto] = {k: int(row[k]) for k in SNMP_KEEP[proto] if k in row}
    return out


def delta(before: dict, after: dict) -> dict:
    """Recursive after − before over matching keys."""
    res = {}
    for k, v in after.items():
        if k not in before:
            continue
        if isinstance(v, dict):
            res[k] = delta(before[k], v)
        else:
            res[k] = v - before[k]
    return res


def average_sizes(d: dict[str, int]) -> dict[str, float | None]:
    """Bytes per counted packet, each direction. A veth counts a GSO/GRO super-packet once."""
    return {
        "rx_avg_bytes": d["rx_bytes"] / d["rx_packets"] if d.get("rx_packets") else None,
        "tx_avg_bytes": d["tx_bytes"] / d["tx_packets"] if d.get("tx_packets") else None,
    }
