"""Network devices in a host: links, addresses, offload features, softnet rows, OVS ports.

The one parser of each: lab, knobs, probes and doctor all read `ip -j`, `ethtool -k` and
/proc/net/softnet_stat through here. ethtool is read as plain text (not --json) because a
sosreport stores text, so a live host and a captured one parse the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from offlab.errors import BadInput, CommandFailed, EnvironmentProblem
from offlab.hosts import Host, check_netns
from offlab.names import check_ifname


@dataclass(frozen=True)
class Feature:
    active: bool
    fixed: bool  # the driver does not let this change ([fixed] in `ethtool -k`)
    requested: bool | None  # None for a group header (tx-checksumming, ...), which has no bit of its own


_FEATURE_RE = re.compile(r"^(\s*)([\w.-]+): (on|off)(?: \[(fixed|requested (?:on|off))\])?\s*$")


def parse_features(text: str) -> dict[str, Feature]:
    """`ethtool -k IF` text → {kernel feature name: Feature}.

    ethtool prints `[requested on|off]` only where the wish differs from the state, so a leaf
    without it requested what it has; a line whose next line is indented is a group header."""
    lines = [m for m in map(_FEATURE_RE.match, text.splitlines()) if m]
    out: dict[str, Feature] = {}
    for i, m in enumerate(lines):
        indent, name, state, note = m.groups()
        active = state == "on"
        group = not indent and i + 1 < len(lines) and bool(lines[i + 1].group(1))
        if group:
            requested = None
        elif note and note.startswith("requested"):
            requested = note.endswith("on")
        else:
            requested = active
        out[name] = Feature(active, note == "fixed" and not group, requested)
    return out


# What the kernel's netdev_fix_features() keeps a feature off for: (feature pattern, the group it
# needs as people name it, the features of which one must be on). Seen on Linux 6.18 veths:
# `tx off` takes TSO and USO with it, `sg off` takes TSO and GSO but leaves USO on.
_CSUM = ("tx-checksum-ip-generic", "tx-checksum-ipv4", "tx-checksum-ipv6")
DEPENDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("tx-tcp-segmentation", "tx-checksumming", ("tx-checksum-ip-generic", "tx-checksum-ipv4")),
    ("tx-tcp-ecn-segmentation", "tx-checksumming", _CSUM),
    ("tx-tcp-mangleid-segmentation", "tx-checksumming", ("tx-checksum-ip-generic", "tx-checksum-ipv4")),
    ("tx-tcp6-segmentation", "tx-checksumming", ("tx-checksum-ip-generic", "tx-checksum-ipv6")),
    ("tx-udp-segmentation", "tx-checksumming", _CSUM),
    ("tx-tcp*-segmentation", "scatter-gather", ("tx-scatter-gather",)),
    ("tx-generic-segmentation", "scatter-gather", ("tx-scatter-gather",)),
    ("generic-segmentation-offload", "scatter-gather", ("tx-scatter-gather",)),
    ("tx-tcp-mangleid-segmentation", "tx-tcp-segmentation", ("tx-tcp-segmentation",)),
    ("tx-tcp-ecn-segmentation", "tcp-segmentation-offload", ("tx-tcp-segmentation", "tx-tcp6-segmentation")),
    ("rx-gro-hw", "rx-checksumming", ("rx-checksum", "rx-checksumming")),
)


def held_off(feats: dict[str, Feature]) -> dict[str, str]:
    """Each feature that is off although requested on → why, when a feature it needs is off
    ("needs tx-checksumming, which is off")."""
    from fnmatch import fnmatchcase

    out = {}
    for name, f in feats.items():
        if f.active or not f.requested or f.fixed:
            continue
        for pattern, group, members in DEPENDS:
            present = [m for m in members if m in feats]
            if fnmatchcase(name, pattern) and present and not any(feats[m].active for m in present):
                out[name] = f"needs {group}, which is off"
                break
    return out


def features(host: Host, iface: str) -> dict[str, Feature]:
    check_ifname(iface)
    try:
        res = host.run(["ethtool", "-k", iface], timeout=10)
    except CommandFailed as exc:
        raise _no_such(host, iface, exc) from exc
    return parse_features(res.stdout)


# ---- `ip -j`: every one offlab runs is built and read here ---------------------------------

def ip_argv(*args: str, details: bool = False, netns: str | None = None) -> list[str]:
    """`ip [-n NETNS] [-d] -j ARGS…`, the command line (doctor looks it up in a sosreport by this argv)."""
    return ["ip", *(["-n", check_netns(netns)] if netns else []), *(["-d"] if details else []), "-j", *args]


def ip_json(host: Host, *args: str, details: bool = False, netns: str | None = None,
            timeout: float = 10) -> list[dict]:
    """The rows `ip -j ARGS…` prints in `host` (none for empty output); CommandFailed if ip fails."""
    return json.loads(host.run(ip_argv(*args, details=details, netns=netns), timeout=timeout).stdout or "[]")


def ip_json_or_none(host: Host, *args: str, details: bool = False, netns: str | None = None,
                    timeout: float = 10) -> list[dict] | None:
    """As ip_json, but None when ip fails (the device, the route or the namespace is not there)."""
    res = host.run(ip_argv(*args, details=details, netns=netns), check=False, timeout=timeout)
    return json.loads(res.stdout or "[]") if res.ok else None


def links(host: Host) -> list[dict]:
    """`ip -d -j addr show`: every link with its details and addresses."""
    return ip_json(host, "addr", "show", details=True)


def link_rows(host: Host, *, details: bool = False, netns: str | None = None, timeout: float = 10) -> list[dict]:
    """`ip [-d] -j link show`: every link of `host` (or of namespace `netns`, run from `host`)."""
    return ip_json(host, "link", "show", details=details, netns=netns, timeout=timeout)


def find_link(host: Host, iface: str, *, details: bool = False, netns: str | None = None) -> dict | None:
    """`ip -j link show dev IFACE`: the link, or None when there is none by that name (or no such namespace)."""
    rows = ip_json_or_none(host, "link", "show", "dev", check_ifname(iface), details=details, netns=netns)
    return rows[0] if rows else None


def addr_rows(host: Host, iface: str | None = None, *, details: bool = False, netns: str | None = None,
              timeout: float = 10) -> list[dict]:
    """`ip [-d] -j addr show [dev IFACE]`: links with their addresses (addr_info)."""
    dev = ("dev", check_ifname(iface)) if iface is not None else ()
    return ip_json(host, "addr", "show", *dev, details=details, netns=netns, timeout=timeout)


def routes(host: Host, family: int, *selector: str) -> list[dict]:
    """`ip -j -4|-6 route show SELECTOR…` (e.g. default, or dev IFACE); none when ip fails."""
    return ip_json_or_none(host, f"-{family}", "route", "show", *selector) or []


def route_get(host: Host, dest: str) -> dict:
    """`ip -j route get DEST`: the route the kernel would take; EnvironmentProblem (with ip's word) if none."""
    res = host.run(ip_argv("route", "get", dest), check=False, timeout=10)
    if not res.ok or not res.stdout.strip():
        detail = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "no route"
        raise EnvironmentProblem(f"no route to {dest} from {host.name}: {detail}")
    return json.loads(res.stdout)[0]


def netns_names(host: Host, *, timeout: float = 10) -> list[str]:
    """`ip -j netns list`: the named network namespaces `host` has (none when ip fails)."""
    return [n["name"] for n in ip_json_or_none(host, "netns", "list", timeout=timeout) or []]


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


def _norm(label: str) -> str:
    return re.sub(r"\s+", "-", label.strip().lower())


def ethtool_sections(text: str) -> dict[str, dict[str, str]]:
    """`ethtool -l` / `-g` text → {"max": {...}, "current": {...}}, keys as `-L`/`-G` spell them (rx-mini)."""
    out: dict[str, dict[str, str]] = {"max": {}, "current": {}}
    section = None
    for line in text.splitlines():
        low = line.strip().lower()
        if low.startswith("pre-set maximums"):
            section = "max"
        elif low.startswith("current hardware settings"):
            section = "current"
        elif section and ":" in line:
            name, _, val = line.partition(":")
            out[section][_norm(name)] = val.strip()
    return out


def ethtool_coalesce(text: str) -> dict[str, str]:
    """`ethtool -c` text → {param as `ethtool -C` spells it (adaptive-rx, rx-usecs, ...): value}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(Adaptive|CQE mode)\s+RX:\s*(\S+)\s+TX:\s*(\S+)", line.strip())
        if m:
            prefix = _norm(m.group(1))
            out[f"{prefix}-rx"], out[f"{prefix}-tx"] = m.group(2), m.group(3)
        elif ":" in line and not line.startswith("Coalesce parameters"):
            name, _, val = line.partition(":")
            if name.strip():
                out[_norm(name)] = val.strip()
    return out


@dataclass(frozen=True)
class SoftnetRow:
    cpu: int
    processed: int
    dropped: int
    time_squeeze: int
    received_rps: int
    flow_limit: int


def parse_softnet(text: str) -> list[SoftnetRow]:
    """/proc/net/softnet_stat: one hex row per online CPU (column 13 is the CPU since 5.10)."""
    rows = []
    for i, line in enumerate(l for l in text.splitlines() if l.strip()):
        cols = [int(c, 16) for c in line.split()]
        cpu = cols[12] if len(cols) > 12 else i
        cols += [0] * (13 - len(cols))
        rows.append(SoftnetRow(cpu, cols[0], cols[1], cols[2], cols[9], cols[10]))
    return rows


def ovs_env(rundir: str | Path) -> dict[str, str]:
    """Point every OVS default path at a lab's run directory, so a system OVS is never touched."""
    d = str(rundir)
    return {"OVS_RUNDIR": d, "OVS_LOGDIR": d, "OVS_DBDIR": d, "OVS_SYSCONFDIR": d}


def vsctl(host: Host, rundir: str | Path, *args: str, wait: int = 10) -> str:
    """ovs-vsctl against the private OVS database in `rundir` (a lab's, or one found in the journal).
    `wait`: seconds ovs-vsctl waits for ovs-vswitchd to apply the change; adding a DPDK port (the
    PMD probes the device and starts its queues) takes longer than that on a loaded machine."""
    return host.run(["ovs-vsctl", f"--db=unix:{rundir}/db.sock", f"--timeout={wait}", *args],
                    env=ovs_env(rundir), timeout=wait + 10).stdout
