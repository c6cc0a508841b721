"""ethtool's plain-text outputs → typed records: `-k` features, `-l`/`-g` sections, `-c` parameters,
`-i` driver, `-S` per-queue packets, `-n rx-flow-hash` fields.

Text, not --json: a sosreport stores text, and ethtool 6.1 has no JSON for -g/-l/-c, so a live
host and a captured one parse the same way. Pure functions: nothing here runs a command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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




def _number(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def section_numbers(text: str) -> dict[str, dict[str, int | None]]:
    """`ethtool -g IF` / `ethtool -l IF` → the sections with numbers (None for n/a)."""
    return {sec: {k: _number(v) for k, v in vals.items()} for sec, vals in ethtool_sections(text).items()}


def coalesce_values(text: str) -> dict[str, str | int | None]:
    """`ethtool -c IF` → the parameters with numbers (None for n/a); the on/off modes stay text."""
    return {k: v if k.startswith(("adaptive-", "cqe-mode-")) else (int(v) if v.isdigit() else None if v == "n/a" else v)
            for k, v in ethtool_coalesce(text).items()}


@dataclass(frozen=True)
class Driver:
    """`ethtool -i IF`: the driver behind an interface ("" where ethtool says nothing)."""
    driver: str = ""
    version: str = ""
    firmware: str = ""
    bus_info: str = ""  # a PCI address (0000:03:00.0) for a PCI device, "" for veth/tap/bridge


def _key_values(text: str) -> dict[str, str]:
    """'key: value' lines (ethtool -i, /proc/PID/status) → {key: value}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_driver(text: str) -> Driver:
    kv = _key_values(text)
    return Driver(kv.get("driver", ""), kv.get("version", ""), kv.get("firmware-version", ""), kv.get("bus-info", ""))


# rx_queue_3_packets (virtio-net, ixgbe, ice), rx_queue_3_xdp_packets (veth), rx-3.packets, rx3_packets (mlx5)
QUEUE_STAT = re.compile(r"^\s*(rx|tx)(?:_queue_|-|)(\d+)[._](xdp_)?packets:\s*(\d+)\s*$")


def parse_queue_stats(text: str) -> dict[str, dict[str, int]]:
    """`ethtool -S IF` → {"rx": {"0": packets, ...}, "tx": {...}}; empty directions left out."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        m = QUEUE_STAT.match(line)
        if m:
            way, queue, _, n = m.groups()
            out.setdefault(way, {})[queue] = out.get(way, {}).get(queue, 0) + int(n)
    return out


FLOW_HASH_FIELDS = {
    "L2DA": "m",
    "VLAN tag": "v",
    "L3 proto": "t",
    "IP SA": "s",
    "IP DA": "d",
    "L4 bytes 0 & 1 [TCP/UDP src port]": "f",
    "L4 bytes 2 & 3 [TCP/UDP dst port]": "n",
}


def parse_flow_hash(text: str) -> str | None:
    """`ethtool -n IF rx-flow-hash udp4` → the `ethtool -N` letters ("sdfn"), "" for None, None when
    the output holds no hash (the driver cannot say)."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if not lines or "Hash flow key" not in lines[0]:
        return None
    return "".join(FLOW_HASH_FIELDS[line] for line in lines[1:] if line in FLOW_HASH_FIELDS)
