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
from dataclasses import dataclass

from offlab import netdev
from offlab.errors import CommandFailed, EnvironmentProblem
from offlab.hosts import which
from offlab.probes.base import Options, Probe
from offlab.probes.remote import Async
from offlab.sample import JsonView, _view
from offlab.wire import IP_MAX  # the largest IP packet without BIG TCP

TABLE = "offlab_big"


def ruleset(ifaces: list[str], family: str = "inet") -> str:
    """The table of this family (inet, or bridge for bridge ports) for these interfaces: one counting rule
    per interface and direction, named by its comment."""
    rx = "".join(f'    meta length > {IP_MAX} iifname "{i}" counter comment "rx {i}"\n' for i in ifaces)
    tx = "".join(f'    meta length > {IP_MAX} oifname "{i}" counter comment "tx {i}"\n' for i in ifaces)
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


def seen(counts: dict[str, BigCount] | None, where: str, direction: str) -> int | None:
    """Packets over 64 KiB that interface `where` ("role:iface") counted in `direction` ("rx"/"tx") over
    a sample's window; None when the sample did not count (no `big_packets` in its workload). For
    effect witnesses: a gso_*max_size above 65536 on `where` was exercised iff seen(..., "tx") > 0,
    a gro_*max_size iff seen(..., "rx") > 0."""
    if counts is None:
        return None
    counted = counts.get(where)
    return getattr(counted, direction) if counted is not None else 0


@dataclass
class BigCount(JsonView):
    """Packets over 64 KiB counted on one interface (`probes.of(BigPackets)["host:iface"]`)."""

    rx: int = 0
    tx: int = 0


class BigPackets(Probe):
    """The tables in every namespace host of the lab, where the workload asked; stored as
    {"role:iface": {"rx", "tx"}}, absent (None) where not asked."""

    key, slot = "big_packets", 30
    stored = _view(BigCount, map=True)

    def __init__(self, session, options: Options) -> None:
        super().__init__(session, options)
        self.counters: dict[str, BigPacketCounters] = {}  # role → its table

    @classmethod
    def wanted(cls, session, options: Options) -> bool:
        return options.big_packets

    def open(self) -> None:
        for role in self.lab.hosts:
            host = self.lab.host(role)
            if host.netns_name is not None:
                self.counters[role] = BigPacketCounters(host)
                self.counters[role].add()

    def close(self) -> None:
        for counting in self.counters.values():
            counting.remove()

    def start(self) -> dict[str, Async]:
        return {role: Async(counting.read) for role, counting in self.counters.items()}

    def read(self, started: dict[str, Async]) -> dict[str, dict[str, dict[str, int]]]:
        got = {role: a.result() for role, a in started.items()}
        if any(v is None for v in got.values()):
            raise EnvironmentProblem(f"lab {self.lab.name}: the counters of packets over 64 KiB could not be read "
                                     f"(hosts {', '.join(r for r, v in got.items() if v is None)})")
        return got

    def delta(self, a: dict, b: dict) -> dict | None:
        return delta(a, b) if self.counters else None
