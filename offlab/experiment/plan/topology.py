"""What a topology's hosts and interfaces are, known before any lab exists.

The same pictures as offlab/lab/topologies.py, as data, so a plan's `HOST[:IFACE]` is
judged at load time the way LabState.resolve_iface judges it once the lab is up
(tests/test_plan_topology.py builds each lab and compares).
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.lab.model import UPLINK_KINDS


@dataclass(frozen=True)
class StaticIface:
    kind: str  # veth | bridge | vxlan | ovs-internal | ovs-dpdk (an OVS-DPDK port) | tap | virtio-net | nic
    name: str | None = None  # a fixed name (br0, u0, vxlan0, br-int); None: offlab names it per lab
    peer: str | None = None  # the host a veth faces: `to-<peer>` names it


def _veth(peer: str, name: str | None = None) -> StaticIface:
    return StaticIface("veth", name, peer)


_BRIDGE, _BR_INT, _VXLAN0 = StaticIface("bridge", "br0"), StaticIface("bridge", "br-int"), StaticIface("vxlan", "vxlan0")

HOSTS: dict[str, dict[str, tuple[StaticIface, ...]]] = {
    "veth": {"client": (_veth("server"),), "server": (_veth("client"),)},
    "bridge": {"client": (_veth("switch"),), "switch": (_veth("client"), _veth("server"), _BRIDGE),
               "server": (_veth("switch"),)},
    "router": {"client": (_veth("router"),), "router": (_veth("client"), _veth("server")),
               "server": (_veth("router"),)},
    "vxlan": {"client": (_veth("hv1"),),
              "hv1": (_veth("client"), _veth("switch", "u0"), _VXLAN0, _BR_INT),
              "switch": (_veth("hv1"), _veth("hv2"), _BRIDGE),
              "hv2": (_veth("switch", "u0"), _veth("server"), _VXLAN0, _BR_INT),
              "server": (_veth("hv2"),)},
    "ovs": {"client": (_veth("switch"),), "switch": (_veth("client"), _veth("server"), StaticIface("ovs-internal", "br0")),
            "server": (_veth("switch"),)},
    # the guest is the client; the server namespace holds the tap and the bridge (virbr0's role)
    "vm": {"client": (StaticIface("virtio-net", "eth0", "server"),),
           "server": (StaticIface("tap", None, "client"), _BRIDGE)},
    # the guest routes; each end namespace holds its tap on a bridge with its address
    "vm-router": {"client": (StaticIface("tap", None, "router"), _BRIDGE),
                  "router": (StaticIface("virtio-net", "eth0", "client"), StaticIface("virtio-net", "eth1", "server")),
                  "server": (StaticIface("tap", None, "router"), _BRIDGE)},
    # two guests, their taps on one bridge in the switch namespace
    "vm-pair": {"client": (StaticIface("virtio-net", "eth0", "switch"),),
                "switch": (StaticIface("tap", None, "client"), StaticIface("tap", None, "server"), _BRIDGE),
                "server": (StaticIface("virtio-net", "eth0", "switch"),)},
    # testpmd's tap ports live in the client and server; the switch namespace runs testpmd (its
    # settings are `testpmd.*` of host switch). With --pmd af_packet they are veths: to-switch either way.
    "dpdk": {"client": (StaticIface("tap", None, "switch"),), "switch": (),
             "server": (StaticIface("tap", None, "switch"),)},
    # testpmd between the client's tap (port 0) and a guest's vhost-user NIC (port 1); the guest is the server
    "dpdk-vm": {"client": (StaticIface("tap", None, "switch"),), "switch": (),
                "server": (StaticIface("virtio-net", "eth0", "switch"),)},
    # two ports of this machine, each moved into its namespace under its own name (lab/phys.py)
    "phys": {"client": (StaticIface("nic", None, "server"),), "server": (StaticIface("nic", None, "client"),)},
    # OVS-DPDK's dpdk ports are no kernel interfaces (their one setting is `mtu`, i.e. mtu_request);
    # their taps (or veths) live in client and server
    "ovs-dpdk": {"client": (StaticIface("tap", None, "switch"),),
                 "switch": (StaticIface("ovs-internal", "br0"), StaticIface("ovs-dpdk", "dpdk0"),
                            StaticIface("ovs-dpdk", "dpdk1")),
                 "server": (StaticIface("tap", None, "switch"),)},
    # two guests on OVS-DPDK vhost-user ports
    "ovs-dpdk-vm": {"client": (StaticIface("virtio-net", "eth0", "switch"),),
                    "switch": (StaticIface("ovs-internal", "br0"), StaticIface("ovs-dpdk", "vhu-client", "client"),
                               StaticIface("ovs-dpdk", "vhu-server", "server")),
                    "server": (StaticIface("virtio-net", "eth0", "switch"),)},
}


def _names(ifaces: tuple[StaticIface, ...]) -> list[str]:
    return [f"to-{i.peer}" if i.peer and not i.name else i.name or "" for i in ifaces]


def resolve(kind: str, role: str, ref: str | None) -> StaticIface:
    """The interface `role:ref` names in a `kind` lab (ref None: the host's only veth); ValueError says why not."""
    hosts = HOSTS[kind]
    if role not in hosts:
        raise ValueError(f"a {kind} lab has no host {role!r}; its hosts are {', '.join(hosts)}")
    ifaces = hosts[role]
    if ref is None:
        veths = [i for i in ifaces if i.kind in UPLINK_KINDS]
        if len(veths) == 1:
            return veths[0]
        raise ValueError(f"host {role!r} of a {kind} lab has several interfaces ({', '.join(_names(ifaces))}): "
                         f"name one, e.g. {role}:{_names(ifaces)[0]}")
    for i in ifaces:
        if ref == i.name or (ref.startswith("to-") and ref[3:] == i.peer):
            return i
    raise ValueError(f"host {role!r} of a {kind} lab has no interface {ref!r}; it has {', '.join(_names(ifaces))}")
