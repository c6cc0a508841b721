"""Validation of every name and value before it reaches a command."""

from __future__ import annotations

import re

from offlab.errors import BadInput

IFNAME_PATTERN = r"[A-Za-z0-9_.:@-]{1,15}"
IFNAME_RE = re.compile(f"^{IFNAME_PATTERN}$")
# A host's role in a lab (client, server, switch, hv1, ...), as plans and --capture name it.
ROLE_PATTERN = r"[a-z][a-z0-9]{0,15}"
ROLE_RE = re.compile(f"^{ROLE_PATTERN}$")
LAB_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")

MTU_MIN = 68
MTU_MAX = 65535


def check_ifname(name: str, what: str = "interface") -> str:
    """An interface name the kernel accepts and no shell could misread."""
    if not isinstance(name, str) or not IFNAME_RE.fullmatch(name) or name in (".", ".."):
        raise BadInput(
            f"invalid {what} name {name!r}: use 1-15 characters from A-Z a-z 0-9 _ . : @ -"
        )
    return name


def check_lab_name(name: str) -> str:
    if not isinstance(name, str) or not LAB_NAME_RE.fullmatch(name):
        raise BadInput(
            f"invalid lab name {name!r}: use a lower-case letter then up to 9 letters or digits (e.g. demo, uso1)"
        )
    return name


def check_mtu(mtu: object, what: str = "--mtu") -> int:
    if isinstance(mtu, bool) or not isinstance(mtu, int):
        raise BadInput(f"{what} must be an integer, got {mtu!r}")
    if not MTU_MIN <= mtu <= MTU_MAX:
        raise BadInput(f"{what} {mtu} is out of range: an MTU is {MTU_MIN}..{MTU_MAX}")
    return mtu


def netns_name(lab: str, role: str) -> str:
    return f"ol-{lab}-{role}"


def link_name(lab: str, index: int) -> str:
    """Veth ends are `ol<lab><n>` so that any leftover names its lab."""
    name = f"ol{lab}{index}"
    return check_ifname(name)
