"""ethtool's feature names: its legacy short and long names and offlab's short aliases, each pair
written once here; knobs resolve plan keys with them, `lab show` picks its columns by them, the effect
witnesses know every name a plan may give a feature."""

from __future__ import annotations

from fnmatch import fnmatchcase

# ethtool's legacy names: short name → (long name shown by `ethtool -k`, kernel feature pattern).
LEGACY: dict[str, tuple[str, str]] = {
    "rx": ("rx-checksumming", "rx-checksum"),
    "tx": ("tx-checksumming", "tx-checksum-*"),
    "sg": ("scatter-gather", "tx-scatter-gather*"),
    "tso": ("tcp-segmentation-offload", "tx-tcp*-segmentation"),
    "ufo": ("udp-fragmentation-offload", "tx-udp-fragmentation"),
    "gso": ("generic-segmentation-offload", "tx-generic-segmentation"),
    "gro": ("generic-receive-offload", "rx-gro"),
    "lro": ("large-receive-offload", "rx-lro"),
    "rxvlan": ("rx-vlan-offload", "rx-vlan-hw-parse"),
    "txvlan": ("tx-vlan-offload", "tx-vlan-hw-insert"),
    "ntuple": ("ntuple-filters", "rx-ntuple-filter"),
    "rxhash": ("receive-hashing", "rx-hashing"),
}
LONG_TO_SHORT = {long: short for short, (long, _) in LEGACY.items()}
# A long name stands for exactly one kernel feature when its pattern has no wildcard.
LONG_TO_KERNEL = {long: pat for long, pat in LEGACY.values() if "*" not in pat}
KERNEL_TO_LONG = {pat: long for long, pat in LONG_TO_KERNEL.items()}  # rx-checksum → rx-checksumming

# Short names for single kernel features that come up in offload work.
ALIASES: dict[str, str] = {
    "uso": "tx-udp-segmentation",
    "udp-gro-fwd": "rx-udp-gro-forwarding",
    "gro-list": "rx-gro-list",
    "gso-list": "tx-gso-list",
    "tnl-seg": "tx-udp_tnl-segmentation",
    "tnl-csum-seg": "tx-udp_tnl-csum-segmentation",
    "gro-hw": "rx-gro-hw",
    "tx-csum": "tx",
    "rx-csum": "rx",
}


def names_for(feature: str) -> set[str]:
    """Every name a plan may give one kernel feature: itself, offlab's short alias, and ethtool's legacy
    short and long names whose pattern covers it (tso and tcp-segmentation-offload for tx-tcp6-segmentation)."""
    names = {feature} | {alias for alias, f in ALIASES.items() if f == feature}
    for short, (long, pattern) in LEGACY.items():
        if fnmatchcase(feature, pattern):
            names |= {short, long}
    return names


def shown_name(key: str) -> str:
    """The name `ethtool -k` shows for a short name or alias: the long name of a legacy feature
    (tso → tcp-segmentation-offload, tx-csum → tx-checksumming), else the kernel's (uso → tx-udp-segmentation)."""
    name = ALIASES.get(key, key)
    return LEGACY[name][0] if name in LEGACY else name
