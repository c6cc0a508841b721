"""Counters read before and after the window: interfaces (/proc/net/dev), /proc/net/snmp and
/proc/net/snmp6 (softnet_stat: offlab.netdev)."""

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
               "TCPToZeroWindowAdv",
               # packets a socket's busy poll took from a NAPI context (any protocol): busy polling's witness
               "BusyPollRxPackets"),
}
RCVQ_PRUNED = ("PruneCalled", "RcvPruned", "TCPRcvCollapsed")


def rcvq_pruned(snmp_delta: dict) -> dict[str, int]:
    """The receive-queue prune/collapse counters that moved over the window ({} if none did)."""
    ext = snmp_delta.get("TcpExt", {})
    return {k: ext[k] for k in RCVQ_PRUNED if ext.get(k)}


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/dev → {ifname: {rx_bytes, rx_packets, rx_errors, rx_dropped, tx_...}}."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        cols = [int(c) for c in rest.split()]
        if len(cols) < 16:
            continue
        out[name.strip()] = {
            "rx_bytes": cols[0], "rx_packets": cols[1], "rx_errors": cols[2], "rx_dropped": cols[3],
            "rx_fifo": cols[4], "rx_frame": cols[5],
            "tx_bytes": cols[8], "tx_packets": cols[9], "tx_errors": cols[10], "tx_dropped": cols[11],
            "tx_fifo": cols[12], "tx_carrier": cols[14],
        }
    return out


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp (header line + value line per protocol) → {proto: {counter: value}}."""
    lines = text.splitlines()
    out: dict[str, dict[str, int]] = {}
    for head, vals in zip(lines[::2], lines[1::2], strict=False):
        proto, names = head.split(":", 1)
        _, values = vals.split(":", 1)
        if proto in SNMP_KEEP:
            row = dict(zip(names.split(), values.split(), strict=False))
            out[proto] = {k: int(row[k]) for k in SNMP_KEEP[proto] if k in row}
    return out


# /proc/net/snmp6 ("Udp6InDatagrams 12"): kept under "Udp6" / "Ip6" with the IPv4 names, so the same
# code reads either family. TCP has no snmp6 group: /proc/net/snmp's Tcp counts IPv6 segments too.
SNMP6_KEEP = {
    "Udp6": SNMP_KEEP["Udp"] + ("MemErrors",),
    "Ip6": ("InReceives", "InHdrErrors", "InTooBigErrors", "InNoRoutes", "InAddrErrors", "InUnknownProtos",
            "InTruncatedPkts", "InDiscards", "InDelivers", "OutForwDatagrams", "OutRequests", "OutDiscards",
            "OutNoRoutes", "ReasmReqds", "ReasmOKs", "ReasmFails", "FragOKs", "FragFails", "FragCreates"),
}


def parse_snmp6(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp6 (one "Name value" per line) → {"Udp6": {"InDatagrams": n, ...}, "Ip6": {...}}."""
    out: dict[str, dict[str, int]] = {group: {} for group in SNMP6_KEEP}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        for group, keep in SNMP6_KEEP.items():
            name = parts[0][len(group):] if parts[0].startswith(group) else None
            if name in keep:
                out[group][name] = int(parts[1])
    return {group: values for group, values in out.items() if values}


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
