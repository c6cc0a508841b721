"""ethtool's plain-text outputs → typed records: `-k` features, `-l`/`-g` sections, `-c` parameters,
`-i` driver, `-S` per-queue packets, `-n rx-flow-hash` fields.

Text, not --json: a sosreport stores text, and ethtool 6.1 has no JSON for -g/-l/-c, so a live
host and a captured one parse the same way. Pure functions: nothing here runs a command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


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


def _number(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class Limit:
    """One field of `ethtool -g` (rings) or `-l` (channels); None where ethtool says n/a, prints no
    number (TX Push: off) or leaves the field out."""
    current: int | None = None
    maximum: int | None = None  # the "Pre-set maximums" section


@dataclass(frozen=True)
class Limits:
    """`ethtool -g IF` or `ethtool -l IF`: each field by its `-G`/`-L` name (rx, rx-mini, combined, ...)."""
    fields: dict[str, Limit] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Limit:
        """The field `name`; Limit() (both None) when ethtool did not print it."""
        return self.fields.get(name, Limit())


def parse_limits(text: str) -> Limits:
    """`ethtool -g` / `-l` text → Limits, in the order ethtool printed the fields."""
    found: dict[str, dict[str, int | None]] = {"maximum": {}, "current": {}}
    section = None
    for line in text.splitlines():
        low = line.strip().lower()
        if low.startswith("pre-set maximums"):
            section = "maximum"
        elif low.startswith("current hardware settings"):
            section = "current"
        elif section and ":" in line:
            name, _, val = line.partition(":")
            found[section][_norm(name)] = _number(val)
    names = dict.fromkeys([*found["maximum"], *found["current"]])
    return Limits({n: Limit(found["current"].get(n), found["maximum"].get(n)) for n in names})


@dataclass(frozen=True)
class Coalescing:
    """`ethtool -c IF`, each parameter by its `ethtool -C` name."""
    modes: dict[str, str] = field(default_factory=dict)  # adaptive-rx/-tx, cqe-mode-rx/-tx: on, off or n/a
    # rx-usecs, rx-frames, tx-usecs, ...: None where ethtool says n/a (or prints no number)
    values: dict[str, int | None] = field(default_factory=dict)

    def text(self, name: str) -> str | None:
        """`name` as ethtool prints it ("on", "50", "n/a"); None when ethtool did not print it."""
        if name in self.modes:
            return self.modes[name]
        if name in self.values:
            n = self.values[name]
            return "n/a" if n is None else str(n)
        return None


_MODES = re.compile(r"^(Adaptive|CQE mode)\s+RX:\s*(\S+)\s+TX:\s*(\S+)")


def parse_coalesce(text: str) -> Coalescing:
    """`ethtool -c` text → Coalescing."""
    modes: dict[str, str] = {}
    values: dict[str, int | None] = {}
    for line in text.splitlines():
        m = _MODES.match(line.strip())
        if m:
            prefix = _norm(m.group(1))
            modes[f"{prefix}-rx"], modes[f"{prefix}-tx"] = m.group(2), m.group(3)
        elif ":" in line and not line.startswith("Coalesce parameters"):
            name, _, val = line.partition(":")
            if name.strip():
                values[_norm(name)] = _number(val)
    return Coalescing(modes, values)


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


@dataclass(frozen=True)
class QueueStats:
    """`ethtool -S IF`: packets per queue each way ({queue number as ethtool prints it: packets})."""
    rx: dict[str, int] = field(default_factory=dict)
    tx: dict[str, int] = field(default_factory=dict)
    first: str = "rx"  # the way ethtool printed first (ixgbe and ice print their transmit queues first)

    def way(self, way: str) -> dict[str, int]:
        return self.rx if way == "rx" else self.tx

    def as_json(self) -> dict[str, dict[str, int]]:
        """{way: {queue: packets}} in the order ethtool printed them; a way with no queue left out."""
        ways = ("rx", "tx") if self.first == "rx" else ("tx", "rx")
        return {w: dict(self.way(w)) for w in ways if self.way(w)}


def parse_queue_stats(text: str) -> QueueStats:
    """`ethtool -S IF` → QueueStats; a queue counted twice (packets and xdp_packets) is summed."""
    found: dict[str, dict[str, int]] = {"rx": {}, "tx": {}}
    first = None
    for line in text.splitlines():
        m = QUEUE_STAT.match(line)
        if m:
            way, queue, _, n = m.groups()
            first = first or way
            found[way][queue] = found[way].get(queue, 0) + int(n)
    return QueueStats(found["rx"], found["tx"], first or "rx")


FLOW_HASH_FIELDS = {
    "L2DA": "m",
    "VLAN tag": "v",
    "L3 proto": "t",
    "IP SA": "s",
    "IP DA": "d",
    "L4 bytes 0 & 1 [TCP/UDP src port]": "f",
    "L4 bytes 2 & 3 [TCP/UDP dst port]": "n",
}


@dataclass(frozen=True)
class FlowHash:
    """`ethtool -n IF rx-flow-hash TYPE`: the fields the device hashes that flow type on."""
    letters: str  # as `ethtool -N IF rx-flow-hash TYPE` takes them ("sdfn"); "" for none

    @property
    def ports(self) -> bool:
        """Both UDP/TCP ports are hashed (letters f and n)."""
        return "f" in self.letters and "n" in self.letters


def parse_flow_hash(text: str) -> FlowHash | None:
    """`ethtool -n IF rx-flow-hash udp4` → FlowHash; None when the output holds no hash (the driver
    cannot say)."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if not lines or "Hash flow key" not in lines[0]:
        return None
    return FlowHash("".join(FLOW_HASH_FIELDS[line] for line in lines[1:] if line in FLOW_HASH_FIELDS))
