"""testpmd's answers, read into numbers and settings (DPDK 22.11's wording, captured on this machine)."""

from __future__ import annotations

import re

PORT_STATS_HEAD = re.compile(r"NIC statistics for port (\d+)")
_PAIR = re.compile(r"([A-Za-z][A-Za-z-]*):\s+(\d+)")
# testpmd's names → ours (rx_missed: the PMD had no room; rx_nombuf: no mbuf to receive into)
STAT_NAMES = {"RX-packets": "rx_packets", "RX-bytes": "rx_bytes", "RX-errors": "rx_errors",
              "RX-missed": "rx_missed", "RX-nombuf": "rx_nombuf", "TX-packets": "tx_packets",
              "TX-bytes": "tx_bytes", "TX-errors": "tx_errors"}
FWD_HEAD = re.compile(r"Forward statistics for port (\d+)")
FWD_NAMES = {"RX-dropped": "fwd_rx_dropped", "TX-dropped": "fwd_tx_dropped"}


def _blocks(text: str, head: re.Pattern) -> dict[int, str]:
    """Text of each per-port block, keyed by port number."""
    out: dict[int, str] = {}
    marks = list(head.finditer(text))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[int(m.group(1))] = text[m.end():end]
    return out


def _counters(text: str, head: re.Pattern, names: dict[str, str], tail: str) -> dict[int, dict[str, int]]:
    """Per port, the counters `names` renames, read up to `tail` (what follows the port's counters)."""
    return {port: {names[k]: int(v) for k, v in _PAIR.findall(block.split(tail, 1)[0]) if k in names}
            for port, block in _blocks(text, head).items()}


def port_stats(text: str) -> dict[int, dict[str, int]]:
    """`show port stats all` → {port: {rx_packets, rx_bytes, rx_errors, rx_missed, rx_nombuf, tx_...}}."""
    return _counters(text, PORT_STATS_HEAD, STAT_NAMES, "Throughput")


def fwd_drops(text: str) -> dict[int, dict[str, int]]:
    """`show fwd stats all` → {port: {fwd_rx_dropped, fwd_tx_dropped}} (the totals block is skipped)."""
    return _counters(text, FWD_HEAD, FWD_NAMES, "Accumulated")


def gro(text: str) -> dict:
    """`show port N gro` → {"on": bool, "flush": cycles or None, "max_packets": n or None}."""
    if "doesn't enable GRO" in text or "GRO type" not in text:
        return {"on": False, "flush": None, "max_packets": None}
    flush = re.search(r"Flushing cycles:\s*(\d+)", text)
    most = re.search(r"Max number of packets to perform GRO:\s*(\d+)", text)
    return {"on": True, "flush": int(flush.group(1)) if flush else None,
            "max_packets": int(most.group(1)) if most else None}


def gso(text: str) -> dict:
    """`show port N gso` → {"on": bool, "segsz": bytes or None}."""
    m = re.search(r"Max GSO'd packet size:\s*(\d+)B", text)
    if "GSO is not enabled" in text or m is None:
        return {"on": False, "segsz": None}
    return {"on": True, "segsz": int(m.group(1))}


def rxtx(text: str) -> dict:
    """`show config rxtx` → {"fwd": mode, "burst": n, "ports": {port: {rxd, txd, tx_offloads}}}."""
    head = re.search(r"^\s*(\S+) packet forwarding packets/burst=(\d+)", text, re.M)
    ports: dict[int, dict[str, int]] = {}
    for m in re.finditer(r"port (\d+): RX queue number", text):
        block = text[m.end():].split("  port ", 1)[0]
        rxd = re.search(r"RX desc=(\d+)", block)
        txd = re.search(r"TX desc=(\d+)", block)
        txo = re.search(r"Tx offloads=(0x[0-9a-fA-F]+)", block)
        ports[int(m.group(1))] = {"rxd": int(rxd.group(1)) if rxd else 0, "txd": int(txd.group(1)) if txd else 0,
                                  "tx_offloads": int(txo.group(1), 16) if txo else 0}
    return {"fwd": head.group(1) if head else None, "burst": int(head.group(2)) if head else None, "ports": ports}


def offloads(text: str) -> set[str]:
    """`show port N tx_offload configuration|capabilities` → the offload names on the port line
    (configuration) or on the per-queue and per-port lines together (capabilities)."""
    names: set[str] = set()
    for line in text.splitlines():
        label, colon, rest = line.partition(":")
        if colon and label.strip() in ("Port", "Per Queue", "Per Port"):
            names |= set(rest.split())
    return names


def csum(text: str) -> dict[str, str]:
    """`csum show N` / `csum set ...` → {"ip": "hw"|"sw", "udp": ..., "tcp": ..., "sctp": ...}."""
    out = {}
    for proto, mode in re.findall(r"^(IP|UDP|TCP|SCTP) checksum offload is (hw|sw)", text, re.M):
        out[proto.lower()] = mode
    return out


def tso(text: str) -> int | None:
    """`tso show N` / `tso set ...` → the TSO segment size (0: off), None if not said."""
    m = re.search(r"TSO segment size for non-tunneled packets is (\d+)", text)
    if m:
        return int(m.group(1))
    return 0 if "TSO for non-tunneled packets is disabled" in text else None


def port_info(text: str) -> dict:
    """`show port info N` → driver, MAC, MTU, the largest frame the port takes, link status."""
    def field(name: str) -> str | None:
        m = re.search(rf"^{re.escape(name)}:\s*(.*)$", text, re.M)
        return m.group(1).strip() if m else None

    maxlen = field("Maximum configurable length of RX packet")
    mtu = field("MTU")
    return {"driver": field("Driver name"), "mac": (field("MAC address") or "").lower() or None,
            "mtu": int(mtu) if mtu and mtu.isdigit() else None,
            "max_rx_pktlen": int(maxlen) if maxlen and maxlen.isdigit() else None,
            "link": field("Link status"), "devargs": field("Devargs")}


# Answers that mean testpmd did not do what it was asked.
REFUSALS = ("Bad arguments", "Command not found", "not supported", "Please stop", "please stop",
            "please first stop", "Error", "error:", "Invalid", "invalid", "Fail to", "Not all ports")


def refusal(answer: str) -> str | None:
    """The line of `answer` that says testpmd refused the command, or None."""
    for line in answer.splitlines():
        if any(word in line for word in REFUSALS):
            return line.strip()
    return None
