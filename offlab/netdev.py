"""Read-only queries about network devices in a host: links, addresses, features.

Shared by lab, knobs, probes and doctor so each parses `ip -j` and
`ethtool --json` the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from offlab.errors import BadInput, CommandFailed
from offlab.hosts import Host
from offlab.names import check_ifname


@dataclass(frozen=True)
class Feature:
    active: bool
    fixed: bool  # the driver does not let this change ([fixed] in `ethtool -k`)
    requested: bool | None


def parse_features(text: str) -> dict[str, Feature]:
    """`ethtool --json -k IFACE` output → {kernel feature name: Feature}."""
    data = json.loads(text)
    if not data:
        return {}
    out = {}
    for name, val in data[0].items():
        if name == "ifname" or not isinstance(val, dict):
            continue
        out[name] = Feature(bool(val.get("active")), bool(val.get("fixed")), val.get("requested"))
    return out


def features(host: Host, iface: str) -> dict[str, Feature]:
    check_ifname(iface)
    try:
        res = host.run(["ethtool", "--json", "-k", iface], timeout=10)
    except CommandFailed as exc:
        raise _no_such(host, iface, exc) from exc
    return parse_features(res.stdout)


def links(host: Host) -> list[dict]:
    """`ip -d -j addr show`: every link with its details and addresses."""
    return json.loads(host.run(["ip", "-d", "-j", "addr", "show"], timeout=10).stdout)


def link(host: Host, iface: str) -> dict:
    check_ifname(iface)
    try:
        res = host.run(["ip", "-d", "-j", "link", "show", "dev", iface], timeout=10)
    except CommandFailed as exc:
        raise _no_such(host, iface, exc) from exc
    return json.loads(res.stdout)[0]


def _no_such(host: Host, iface: str, exc: CommandFailed) -> Exception:
    if "not exist" in exc.stderr or "No such device" in exc.stderr or "no device" in exc.stderr:
        return BadInput(f"no interface {iface!r} in {host.name}")
    return exc
