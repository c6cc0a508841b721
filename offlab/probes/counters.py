"""Counters read before and after the window: interfaces, /proc/net/snmp (softnet_stat: offlab.netdev)."""

from __future__ import annotations

# The SNMP counters that explain results (RcvbufErrors explains UDP loss, RetransSegs TCP stalls).
SNMP_KEEP = {
    "Udp": ("InDatagrams", "OutDatagrams", "NoPorts", "InErrors", "RcvbufErrors", "SndbufErrors", "InCsumErrors"),
    "Tcp": ("InSegs", "OutSegs", "RetransSegs", "InErrs", "InCsumErrors"),
    "Ip": ("InReceives", "InHdrErrors", "InAddrErrors", "ForwDatagrams", "InDiscards", "InDelivers", "OutRequests",
           "OutDiscards", "OutNoRoutes", "ReasmReqds", "ReasmOKs", "ReasmFails", "FragOKs", "FragCreates",
           "FragFails"),
    # /proc/net/netstat: a receiver that pruned or collapsed its receive queue measured its socket
    # memory, not the path (notes/dpdk.md §6: DPDK GRO's big non-GSO frames in a guest with default tcp_rmem)
    "TcpExt": ("PruneCalled", "RcvPruned", "TCPRcvCollapsed", "TCPRcvQDrop", "TCPWantZeroWindowAdv",
               "TCPToZeroWindowAdv"),
}
RCVQ_PRUNED = ("PruneCalled", "RcvPruned", "TCPRcvCollapsed")


def rcvq_pruned(snmp_delta: dict) -> dict[str, int]:
    """The receive-queue prune/collapse counters that moved over the window ({} if none did)."""
    ext = snmp_delta.get("TcpExt", {})
    return {k: ext[k] for k in RCVQ_PRUNED if ext.get(k)}


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
