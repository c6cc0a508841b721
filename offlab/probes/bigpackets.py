"""Packets over 64 KiB per interface, counted by the kernel: proof that BIG TCP happened.

The kernel's own selftest (tools/testing/selftests/net/big_tcp.sh) proves BIG TCP with a length
match; so does this probe. In each namespace host of the lab it adds one nftables table,
`inet offlab_big`, with a counter per interface and direction: `meta length > 65535` on packets
received (prerouting, after GRO) and sent (postrouting, before the device or GSO splits them).
A bridged packet (a VXLAN device or a veth on a bridge) never passes the inet hooks under its
port's name, so where the namespace has bridge ports a second table, `bridge offlab_big`, counts
them by port the same way (bridge prerouting/postrouting, where the length is the IP packet's too);
an interface's count is the larger of the two tables' (a name is counted by one family only). A
postrouting count is a packet handed to the device: a device whose own gso size is smaller still
segments it (software GSO) before the wire, which the next hop's rx count shows.
The tables live only in the lab's namespaces: `remove()` deletes them, and they go with the namespace
if the process dies first. A base chain costs every packet a little, so the probe is on only where a
workload asks for it (`big_packets: true`), never for every sample.
"""

from __future__ import annotations

import json

from offlab import netdev
from offlab.errors import CommandFailed, EnvironmentProblem
from offlab.hosts import which

TABLE = "offlab_big"
LIMIT = 65535  # the largest IP packet without BIG TCP


def ruleset(ifaces: list[str], family: str = "inet") -> str:
    """The table of this family (inet, or bridge for bridge ports) for these interfaces: one counting rule
    per interface and direction, named by its comment."""
    rx = "".join(f'    meta length > {LIMIT} iifname "{i}" counter comment "rx {i}"\n' for i in ifaces)
    tx = "".join(f'    meta length > {LIMIT} oifname "{i}" counter comment "tx {i}"\n' for i in ifaces)
    return (f"table {family} {TABLE} {{\n"
            f"  chain rx {{\n    type filter hook prerouting priority -300; policy accept;\n{rx}  }}\n"
            f"  chain tx {{\n    type filter hook postrouting priority 300; policy accept;\n{tx}  }}\n}}\n")


def parse(text: str) -> dict[str, dict[str, int]]:
    """`nft -j list table inet offlab_big` → {iface: {"rx": packets, "tx": packets}}."""
    out: dict[str, dict[str, int]] = {}
    for item in json.loads(text or "{}").get("nftables", []):
        rule = item.get("rule")
        if not rule or not str(rule.get("comment", "")).startswith(("rx ", "tx ")):
            continue
        direction, _, iface = rule["comment"].partition(" ")
        packets = next((e["counter"]["packets"] for e in rule.get("expr", []) if "counter" in e), 0)
        out.setdefault(iface, {"rx": 0, "tx": 0})[direction] = int(packets)
    return out


def merged(*tables: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The inet and bridge tables' counts as one: per interface and direction the larger (a packet is
    counted under a port's name by the bridge table only, under any other name by the inet table only)."""
    out: dict[str, dict[str, int]] = {}
    for table in tables:
        for iface, d in table.items():
            now = out.setdefault(iface, {"rx": 0, "tx": 0})
            for way in ("rx", "tx"):
                now[way] = max(now[way], d.get(way, 0))
    return out


class BigPacketCounters:
    """The table in one namespace host: `add()`, `read()` at each edge of the window, `remove()`."""

    def __init__(self, host) -> None:
        self.host = host
        self.ports: list[str] = []  # bridge ports, counted by the bridge table

    def add(self) -> None:
        if which("nft") is None:
            raise EnvironmentProblem("counting packets over 64 KiB needs nft (Debian package nftables; "
                                     "`make install` installs it)")
        links = netdev.link_rows(self.host)
        ifaces = [l.ifname for l in links if l.ifname and l.ifname != "lo"]
        self.ports = [l.ifname for l in links if l.ifname and l.master]
        self.remove()  # a table left by a killed run in the same namespace: start from zero
        text = ruleset(ifaces) + (ruleset(self.ports, "bridge") if self.ports else "")
        try:
            self.host.run(["nft", "-f", "-"], input=text, timeout=15)
        except CommandFailed as exc:
            raise EnvironmentProblem(f"{self.host.name}: nft could not add the 64 KiB counters: "
                                     f"{exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else exc}") from None

    def read(self) -> dict[str, dict[str, int]]:
        families = ("inet", "bridge") if self.ports else ("inet",)
        return merged(*(parse(self.host.run(["nft", "-j", "list", "table", f, TABLE], timeout=15).stdout)
                        for f in families))

    def remove(self) -> None:
        for family in ("inet", "bridge"):
            self.host.run(["nft", "delete", "table", family, TABLE], check=False, timeout=15)


def delta(before: dict[str, dict[str, dict[str, int]]], after: dict[str, dict[str, dict[str, int]]]) -> dict:
    """{"role:iface": {"rx": n, "tx": n}} over the window, every counted interface (0 is a finding)."""
    out = {}
    for role, ifaces in after.items():
        for iface, now in ifaces.items():
            was = before.get(role, {}).get(iface, {})
            out[f"{role}:{iface}"] = {d: now[d] - was.get(d, 0) for d in ("rx", "tx")}
    return out


def seen(counts: dict | None, where: str, direction: str) -> int | None:
    """Packets over 64 KiB that interface `where` ("role:iface") counted in `direction` ("rx"/"tx") over
    a sample's window; None when the sample did not count (no `big_packets` in its workload). For
    effect witnesses: a gso_*max_size above 65536 on `where` was exercised iff seen(..., "tx") > 0,
    a gro_*max_size iff seen(..., "rx") > 0."""
    if counts is None:
        return None
    return (counts.get(where) or {}).get(direction, 0)
