"""The steps a topology is built from; each is recorded before it happens.

The state file is written before every namespace or daemon is created, so a lab
that failed half-way (or a process killed with -9) can always be torn down.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from offlab.errors import EnvironmentProblem, OfflabError
from offlab.hosts import LOCAL, NetnsHost
from offlab.lab import owner
from offlab.lab.model import Adjustment, HostEntry, Interface, LabState
from offlab.names import check_ifname, link_name, netns_name


class LabBuildFailed(EnvironmentProblem):
    pass


class Builder:
    """Builds one lab: namespaces, veth wires, bridges, addresses, sysctls."""

    def __init__(self, lab: LabState) -> None:
        self.lab = lab
        self._next_link = 0

    # ---- bookkeeping -------------------------------------------------
    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        self.lab.step = what
        try:
            yield
        except OfflabError as exc:
            raise LabBuildFailed(f"lab up {self.lab.name}: step '{what}' failed: {exc}") from exc

    def ip(self, role: str, *args: str) -> None:
        """`ip -n NS ...` for a host of this lab."""
        LOCAL.run(["ip", "-n", self.lab.hosts[role].netns, *args])

    def sysctl(self, role: str, key: str, value: str) -> None:
        with self.step(f"sysctl {key}={value} in {role}"):
            self.lab.host(role).run(["sysctl", "-q", "-w", f"{key}={value}"])

    # ---- parts -------------------------------------------------------
    def host(self, role: str) -> str:
        """A network namespace for `role`, with loopback up."""
        ns = netns_name(self.lab.name, role)
        with self.step(f"create namespace {ns}"):
            self.lab.namespaces.append(ns)
            self.lab.hosts[role] = HostEntry(netns=ns)
            self.lab.save()
            try:
                LOCAL.run(["ip", "netns", "add", ns])
            except OfflabError:
                # Not made by us (it may be someone else's of the same name): never ours to delete.
                self.lab.namespaces.remove(ns)
                self.lab.save()
                raise
            owner.mark(ns)
            self.lab.netns_inodes[ns] = owner.inode(ns) or 0
            self.lab.save()
            self.ip(role, "link", "set", "lo", "up")
            if self.lab.ipv6:
                # No duplicate address detection in a private namespace: a tentative
                # link-local address would delay neighbour discovery by a second.
                NetnsHost(ns).run(["sysctl", "-q", "-w", "net.ipv6.conf.all.accept_dad=0",
                                   "net.ipv6.conf.default.accept_dad=0"])
        return ns

    def wire(
        self, a: str, b: str, *, mtu: int, a_name: str | None = None, b_name: str | None = None
    ) -> tuple[str, str]:
        """A veth pair from host `a` to host `b`, both ends up at `mtu`."""
        a_if = check_ifname(a_name or self._new_link())
        b_if = check_ifname(b_name or self._new_link())
        with self.step(f"veth {a}:{a_if} ─ {b}:{b_if}"):
            self.ip(
                a, "link", "add", a_if, "mtu", str(mtu), "type", "veth",
                "peer", "name", b_if, "mtu", str(mtu), "netns", self.lab.hosts[b].netns,
            )
            self.lab.hosts[a].interfaces.append(Interface(a_if, "veth", peer_host=b))
            self.lab.hosts[b].interfaces.append(Interface(b_if, "veth", peer_host=a))
            self.ip(a, "link", "set", a_if, "up")
            self.ip(b, "link", "set", b_if, "up")
            self.lab.save()
        return a_if, b_if

    def bridge(self, role: str, name: str, ports: list[str], *, mtu: int) -> str:
        """A Linux bridge in `role` enslaving `ports`; its MTU follows the ports."""
        with self.step(f"bridge {name} in {role}"):
            self.ip(role, "link", "add", name, "mtu", str(mtu), "type", "bridge",
                    "stp_state", "0", "forward_delay", "0")
            self.lab.hosts[role].interfaces.append(Interface(name, "bridge", role="bridge"))
            for port in ports:
                self.ip(role, "link", "set", port, "master", name)
            self.ip(role, "link", "set", name, "up")
            self.lab.save()
        return name

    def address(self, role: str, iface: str, cidr4: str, cidr6: str | None, *, reach: bool) -> None:
        """Addresses on `iface`; `reach` marks them as the way others reach this host."""
        entry = self.lab.hosts[role]
        with self.step(f"address {cidr4} on {role}:{iface}"):
            self.ip(role, "addr", "add", cidr4, "dev", iface)
            if reach:
                entry.address = cidr4.split("/")[0]
            if self.lab.ipv6 and cidr6:
                self.ip(role, "addr", "add", cidr6, "dev", iface, "nodad")
                if reach:
                    entry.address6 = cidr6.split("/")[0]
            self.lab.save()

    def default_route(self, role: str, via4: str, via6: str | None) -> None:
        with self.step(f"default route of {role} via {via4}"):
            self.ip(role, "route", "add", "default", "via", via4)
            if self.lab.ipv6 and via6:
                self.ip(role, "-6", "route", "add", "default", "via", via6)

    def ethtool_off(self, role: str, iface: str, feature: str, why: str) -> None:
        """Switch off a feature on an interface the lab owns, and say why in the lab file."""
        with self.step(f"ethtool -K {iface} {feature} off in {role}"):
            self.lab.host(role).run(["ethtool", "-K", iface, feature, "off"])
            self.lab.adjustments.append(Adjustment(role, iface, feature, "off", why))
            self.lab.save()

    def verify(self) -> None:
        """The lab is only up when the client reaches the server (each address family)."""
        client, server = self.lab.host("client"), self.lab.hosts["server"]
        targets = [server.address] + ([server.address6] if self.lab.ipv6 else [])
        for target in targets:
            with self.step(f"client reaches server {target}"):
                for _ in range(3):
                    if client.run(["ping", "-c", "1", "-W", "1", "-q", target], check=False).ok:
                        break
                else:
                    raise LabBuildFailed(f"no ping reply from {target}")

    def _new_link(self) -> str:
        name = link_name(self.lab.name, self._next_link)
        self._next_link += 1
        return name


