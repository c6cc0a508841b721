"""Where a setting lives: a host (this machine, a namespace, a guest, an SSH host) and an interface.

A `Target` is all a journal entry needs to reach the setting again from a fresh
process: the host's reference (`Host.ref()`), the namespace name when the host is
one (kept on its own so older journals and `lab down` can match on it), the
interface, and for OVS ports the lab's run directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from offlab.errors import BadInput
from offlab.hosts import LOCAL, Host, NetnsHost, check_netns, from_ref, netns_exists
from offlab.names import check_ifname

__all__ = ["Target", "target_for", "check_netns", "netns_exists"]


@dataclass(frozen=True)
class Target:
    netns: str | None  # None: this machine (offlab's own network namespace)
    iface: str | None = None
    ovs_rundir: str | None = None  # the private OVS of an ovs/ovs-dpdk lab, when iface may be an OVS port
    lab: str | None = None
    role: str | None = None  # the lab host's role, for messages only
    host_ref: dict | None = field(default=None, compare=False)  # a guest or SSH host; None: netns/machine

    def __post_init__(self) -> None:
        if self.netns is not None:
            check_netns(self.netns)
        if self.iface is not None:
            check_ifname(self.iface)

    @property
    def host(self) -> Host:
        if self.host_ref is not None:
            return from_ref(self.host_ref)
        return LOCAL if self.netns is None else NetnsHost(self.netns)

    @property
    def host_key(self) -> str:
        """One key per host, for caches (the host's own `key`)."""
        return self.host.key

    @property
    def is_machine(self) -> bool:
        """This machine itself (offlab's own network namespace), where host-wide settings live."""
        return self.host.is_this_machine

    @property
    def where(self) -> str:
        remote = self.host_ref.get("name") if self.host_ref and not self.is_machine and self.netns is None else None
        host = self.role or self.netns or remote or "machine"
        return f"{host}:{self.iface}" if self.iface else host

    def exists(self) -> bool:
        if self.netns is not None:
            return netns_exists(self.netns)
        return self.is_machine or self.host.alive()

    def to_dict(self) -> dict:
        d: dict[str, object] = {"netns": self.netns, "iface": self.iface, "ovs_rundir": self.ovs_rundir,
                                "lab": self.lab, "role": self.role}
        if self.host_ref is not None:
            d["host"] = self.host_ref
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Target":
        rundir = d.get("ovs_rundir")
        if rundir is not None and (not isinstance(rundir, str) or not os.path.isabs(rundir)):
            raise BadInput(f"invalid OVS run directory {rundir!r} in journal")
        host_ref = d.get("host")
        if host_ref is not None and not isinstance(host_ref, dict):
            raise BadInput(f"invalid host reference {host_ref!r} in journal")
        return cls(d.get("netns"), d.get("iface"), rundir, d.get("lab"), d.get("role"), host_ref)


def target_for(host: Host, iface: str | None, lab=None, *, needs_iface: bool = True) -> Target:
    """The Target of a Change: check the host exists; through the lab, resolve `to-<peer>`, or no
    interface at all to the host's only veth when the setting is one of an interface."""
    if iface is not None:
        check_ifname(iface)  # before any lookup, so a hostile name is refused as such
    host_ref = None
    if host.netns_name is not None:
        netns = check_netns(host.netns_name)
        if not netns_exists(netns):
            raise BadInput(f"no network namespace {netns!r}: is the lab up? (`offlab lab list`)")
    elif host.is_this_machine:
        netns = None
    else:
        netns, host_ref = None, host.ref()
        if not host.alive():
            raise BadInput(f"host {host.name!r} is not reachable: is the lab up? (`offlab lab list`)")
    role = None
    rundir = None
    if lab is not None:
        role = next((r for r, e in lab.hosts.items() if lab.host(r) == host), None)
        if role is None:
            raise BadInput(f"host {host.name!r} is not part of lab {lab.name!r}")
        if iface is None and needs_iface:
            iface = lab.resolve_iface(role, None)
        elif iface is not None and (iface.startswith("to-") or lab.entry(role).iface(iface)):
            iface = lab.resolve_iface(role, iface)
        if lab.has_ovs and lab.rundir and role == "switch":
            rundir = lab.rundir
    if iface is not None:
        check_ifname(iface)
    return Target(netns, iface, rundir, lab.name if lab is not None else None, role, host_ref)
