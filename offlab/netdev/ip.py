"""`ip -j` output (links, addresses, routes) → typed records; also the text of `ip -d address` /
`ip -d link` a sosreport stores, read into the same records.

Pure functions: nothing here runs a command (netdev's readers do). The field names are iproute2's
JSON names where one exists, so a reader who knows `ip -j` knows these.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Addr:
    family: str  # inet | inet6
    local: str
    prefixlen: int
    scope: str = "global"
    dynamic: bool = False
    peer: str | None = None  # the far end of a point-to-point address (ip's `address` beside `local`)
    broadcast: str | None = None
    label: str | None = None
    noprefixroute: bool = False

    @property
    def cidr(self) -> str:
        return f"{self.local}/{self.prefixlen}"

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Addr:
        """One `addr_info` entry of `ip -j addr` (also what `to_json` wrote)."""
        return cls(str(row.get("family", "")), str(row.get("local", "")), int(row.get("prefixlen", 0)),
                   str(row.get("scope", "global")), bool(row.get("dynamic")), row.get("address"),
                   row.get("broadcast"), row.get("label"), bool(row.get("noprefixroute")))

    def to_json(self) -> dict[str, Any]:
        """The `ip -j` shape, for a lab's state file (read back by `from_json`)."""
        out: dict[str, Any] = {"family": self.family, "local": self.local, "prefixlen": self.prefixlen,
                               "scope": self.scope}
        for key, value in (("dynamic", self.dynamic), ("address", self.peer), ("broadcast", self.broadcast),
                           ("label", self.label), ("noprefixroute", self.noprefixroute)):
            if value:
                out[key] = value
        return out


_SIZE = re.compile(r"^(gso|gro|tso)(_ipv4)?_max_(size|segs)$")


@dataclass(frozen=True)
class Link:
    ifname: str
    ifindex: int | None = None
    mtu: int | None = None
    flags: tuple[str, ...] = ()  # UP, LOWER_UP, LOOPBACK, ...
    operstate: str | None = None
    address: str | None = None  # the MAC address now
    permaddr: str | None = None  # the MAC address the device came with, where it was changed
    master: str | None = None  # the bridge / bond / OVS datapath it is a port of
    kind: str | None = None  # veth, bridge, vxlan, tun, ... (linkinfo.info_kind); None for a plain NIC
    slave_kind: str | None = None  # bridge, openvswitch, ... as a port (linkinfo.info_slave_kind)
    info_data: dict[str, Any] = field(default_factory=dict, hash=False)  # kind-specific (a vxlan's `link`, ...)
    parent: str | None = None  # the device it was made on (`link`, e.g. a VLAN's), when named
    link_index: int | None = None  # a veth's peer's ifindex
    link_netnsid: int | None = None  # the namespace id its peer lives in, seen from here
    link_netns: str | None = None  # that namespace's name, where `ip` knows it
    min_mtu: int | None = None
    max_mtu: int | None = None
    altnames: tuple[str, ...] = ()
    parentbus: str | None = None  # the bus and device behind it (kernel >= 5.14), e.g. pci 0000:03:00.0
    parentdev: str | None = None
    txqlen: int | None = None
    ifalias: str = ""
    sizes: dict[str, int] = field(default_factory=dict, hash=False)  # gso_max_size, gro_ipv4_max_size, ... (-d)
    addrs: tuple[Addr, ...] = ()

    @property
    def vxlan_dev(self) -> str | None:
        """A VXLAN device's underlay (the device its packets leave by), where it names one."""
        return self.info_data.get("link") if self.kind == "vxlan" else None

    @property
    def vxlan_family(self) -> int:
        """4 or 6: the IP version a VXLAN device's underlay packets use."""
        data = self.info_data
        v6 = any(k in data for k in ("local6", "remote6", "group6")) or ":" in str(data.get("remote", ""))
        return 6 if v6 else 4

    @property
    def up(self) -> bool:
        return "UP" in self.flags

    @property
    def mac(self) -> str | None:
        """The device's own MAC address (permaddr where it was changed)."""
        return self.permaddr or self.address

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Link:
        info = row.get("linkinfo") or {}
        return cls(
            ifname=str(row.get("ifname", "")), ifindex=row.get("ifindex"), mtu=row.get("mtu"),
            flags=tuple(row.get("flags") or ()), operstate=row.get("operstate"), address=row.get("address"),
            permaddr=row.get("permaddr"), master=row.get("master"), kind=info.get("info_kind"),
            slave_kind=info.get("info_slave_kind"), info_data=dict(info.get("info_data") or {}),
            parent=row.get("link"), link_index=row.get("link_index"), link_netnsid=row.get("link_netnsid"),
            link_netns=row.get("link_netns"), min_mtu=row.get("min_mtu"), max_mtu=row.get("max_mtu"),
            altnames=tuple(row.get("altnames") or ()), parentbus=row.get("parentbus"),
            parentdev=row.get("parentdev"), txqlen=row.get("txqlen"), ifalias=str(row.get("ifalias") or ""),
            sizes={k: v for k, v in row.items() if _SIZE.match(k) and isinstance(v, int)},
            addrs=tuple(Addr.from_json(a) for a in row.get("addr_info") or () if a.get("local")))


@dataclass(frozen=True)
class Route:
    dst: str  # default, 10.200.1.0/24, ...
    dev: str | None = None
    gateway: str | None = None
    prefsrc: str | None = None
    metric: int | None = None
    scope: str | None = None
    protocol: str | None = None  # kernel, boot, static, ra, ...
    type: str | None = None  # unicast (absent in ip's output), local, multicast, ...
    nexthop_devs: tuple[str, ...] = ()  # the devices of a multipath route's nexthops

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Route:
        return cls(str(row.get("dst", "")), row.get("dev"), row.get("gateway"), row.get("prefsrc"),
                   row.get("metric"), row.get("scope"), row.get("protocol"), row.get("type"),
                   tuple(h["dev"] for h in row.get("nexthops") or () if h.get("dev")))


def _rows(text: str) -> list[dict[str, Any]]:
    rows = json.loads(text or "[]")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def parse_links(text: str) -> list[Link]:
    """`ip [-d] -j link|addr show` JSON, or the `ip -d address` / `ip -d link` text a sosreport holds."""
    s = text.strip()
    if not s or s.startswith("["):
        return [Link.from_json(r) for r in _rows(s)]
    return _links_from_text(text)


def parse_routes(text: str) -> list[Route]:
    """`ip -j route show|get …` JSON."""
    return [Route.from_json(r) for r in _rows(text)]


def parse_netns_names(text: str) -> list[str]:
    """`ip -j netns list` JSON → the names."""
    return [str(r["name"]) for r in _rows(text) if r.get("name")]


_TEXT_KINDS = ("veth", "bridge", "vxlan", "vlan", "bond", "tun", "macvlan", "ipvlan", "openvswitch", "gre",
               "gretap", "geneve", "dummy", "ifb")


# What the text says of a link, by where it says it: (pattern, Link field, conversion).
_HEADER_FIELDS = ((re.compile(r"\bmtu (\d+)"), "mtu", int), (re.compile(r"\bmaster (\S+)"), "master", str))
# iproute2 names the device behind a link on any detail line (kernel >= 5.14)
_DETAIL_FIELDS = ((re.compile(r"\bparentbus (\S+)"), "parentbus", str),
                  (re.compile(r"\bparentdev (\S+)"), "parentdev", str))
_LINK_LINE_FIELDS = ((re.compile(r"link-netnsid (\d+)"), "link_netnsid", int),
                     (re.compile(r"link-netns (\S+)"), "link_netns", str))
_HEADER = re.compile(r"^(\d+): ([^:@\s]+)(?:@(\S+?))?: <([^>]*)> (.*)$")


def _fields(line: str, table: tuple, into: dict[str, Any]) -> None:
    for pattern, key, convert in table:
        m = pattern.search(line)
        if m:
            into[key] = convert(m.group(1))


def _links_from_text(text: str) -> list[Link]:
    """`ip -d address` / `ip -d link` text: what a sosreport stores (no JSON there)."""
    rows: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            idx, name, parent, flags, rest = m.groups()
            cur = {"ifindex": int(idx), "ifname": name, "flags": tuple(flags.split(","))}
            _fields(rest, _HEADER_FIELDS, cur)
            if parent and parent.startswith("if") and parent[2:].isdigit():
                cur["link_index"] = int(parent[2:])  # a veth's peer in another namespace: its index there
            elif parent:
                cur["parent"] = parent
            rows.append(cur)
            continue
        if cur is None:
            continue
        words = line.split()
        _fields(line, _DETAIL_FIELDS, cur)
        if not words or words[0].startswith(("inet", "valid_lft", "altname")):
            continue
        if words[0].startswith("link/"):
            _fields(line, _LINK_LINE_FIELDS, cur)
            continue
        kind = words[0]
        if kind.endswith("_slave"):
            cur["slave_kind"] = kind[: -len("_slave")]
        elif kind in _TEXT_KINDS:
            cur.setdefault("kind", kind)
    return [Link(**r) for r in rows]
