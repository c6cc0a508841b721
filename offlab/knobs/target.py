"""Where a setting lives: a network namespace (or this machine) and an interface.

A `Target` is all a journal entry needs to reach the setting again from a fresh
process: the namespace name (None = the machine), the interface, and for OVS
ports the lab's run directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from offlab.errors import BadInput
from offlab.hosts import LOCAL, Host, LocalHost, NetnsHost
from offlab.names import check_ifname

NETNS_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
NETNS_DIR = "/run/netns"


def check_netns(name: object) -> str:
    if not isinstance(name, str) or not NETNS_RE.fullmatch(name):
        raise BadInput(f"invalid network namespace name {name!r}")
    return name


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, check_netns(name)))


@dataclass(frozen=True)
class Target:
    netns: str | None  # None: this machine (offlab's own network namespace)
    iface: str | None = None
    ovs_rundir: str | None = None  # the private OVS of an `ovs` lab, when iface may be an OVS port
    lab: str | None = None
    role: str | None = None  # the lab host's role, for messages only

    def __post_init__(self) -> None:
        if self.netns is not None:
            check_netns(self.netns)
        if self.iface is not None:
            check_ifname(self.iface)

    @property
    def host(self) -> Host:
        return LOCAL if self.netns is None else NetnsHost(self.netns)

    @property
    def where(self) -> str:
        host = self.role or self.netns or "machine"
        return f"{host}:{self.iface}" if self.iface else host

    def exists(self) -> bool:
        return self.netns is None or netns_exists(self.netns)

    def to_dict(self) -> dict:
        return {"netns": self.netns, "iface": self.iface, "ovs_rundir": self.ovs_rundir,
                "lab": self.lab, "role": self.role}

    @classmethod
    def from_dict(cls, d: dict) -> "Target":
        rundir = d.get("ovs_rundir")
        if rundir is not None and (not isinstance(rundir, str) or not os.path.isabs(rundir)):
            raise BadInput(f"invalid OVS run directory {rundir!r} in journal")
        return cls(d.get("netns"), d.get("iface"), rundir, d.get("lab"), d.get("role"))


def target_for(host: Host, iface: str | None, lab=None, *, needs_iface: bool = True) -> Target:
    """The Target of a Change: check the host exists; through the lab, resolve `to-<peer>`, or no
    interface at all to the host's only veth when the setting is one of an interface."""
    if iface is not None:
        check_ifname(iface)  # before any lookup, so a hostile name is refused as such
    if isinstance(host, NetnsHost):
        netns = check_netns(host.netns)
        if not netns_exists(netns):
            raise BadInput(f"no network namespace {netns!r}: is the lab up? (`offlab lab list`)")
    elif isinstance(host, LocalHost):
        netns = None
    else:
        raise BadInput(f"settings on {host!r} cannot be journalled: only this machine and its namespaces")
    role = None
    rundir = None
    if lab is not None:
        role = next((r for r, e in lab.hosts.items() if e.netns == netns), None)
        if role is None:
            raise BadInput(f"host {host.name!r} is not part of lab {lab.name!r}")
        if iface is None and needs_iface:
            iface = lab.resolve_iface(role, None)
        elif iface is not None and (iface.startswith("to-") or lab.entry(role).iface(iface)):
            iface = lab.resolve_iface(role, iface)
        if lab.topology == "ovs" and lab.rundir and role == "switch":
            rundir = lab.rundir
    if iface is not None:
        check_ifname(iface)
    return Target(netns, iface, rundir, lab.name if lab is not None else None, role)
