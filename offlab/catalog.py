"""One record per topology, from which every list of topologies is derived.

A record holds its builder and its options' check by name ("MODULE:FUNCTION", imported only when a lab
is built or its options judged, so a help text or a plan check that lists the topologies loads no
builder; the builder's docstring is the picture), the hosts and their interfaces as known before any
lab exists (so a plan's `HOST[:IFACE]` is judged at load time the way
LabState.resolve_iface judges it once the lab is up; tests/test_plan.py builds each lab and compares),
the tools `lab up` checks first, whether the lab runs guests, an Open vSwitch or a DPDK process of
its own, its own `lab up` options and the function that judges them, and the interfaces that carry
an underlay. The plan schema's choices, `lab up`'s checks, a plan's checks and the tools it needs,
the guest, DPDK and OVS lists all read TOPOLOGIES; tests/test_layering.py checks that no other
module of offlab (but the builders) names a topology again, in a list or in a branch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable




@dataclass(frozen=True)
class StaticIface:
    kind: str  # veth | bridge | vxlan | ovs-internal | ovs-dpdk (an OVS-DPDK port) | tap | virtio-net | nic
    name: str | None = None  # a fixed name (br0, u0, vxlan0, br-int); None: offlab names it per lab
    peer: str | None = None  # the host a veth faces: `to-<peer>` names it


def _veth(peer: str, name: str | None = None) -> StaticIface:
    return StaticIface("veth", name, peer)


_BRIDGE, _BR_INT, _VXLAN0 = StaticIface("bridge", "br0"), StaticIface("bridge", "br-int"), StaticIface("vxlan", "vxlan0")

_HOSTS: dict[str, dict[str, tuple[StaticIface, ...]]] = {
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



_OVS_TOOLS = ("ovsdb-server", "ovs-vsctl", "ovsdb-tool")
_QEMU = ("qemu-system-x86_64",)
_TESTPMD = ("dpdk-testpmd", "stdbuf")


def _load(ref: str) -> Callable:
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Topology:
    name: str
    builder: str  # "MODULE:FUNCTION" of offlab.lab, called with (offlab.lab.build.Builder, mtu)
    tools: tuple[str, ...] = ()  # besides ip and ethtool, checked before anything is built
    guests: bool = False  # runs QEMU guests (the --nic / --guest-cpus options apply)
    ovs: bool = False  # runs an Open vSwitch of its own in the switch namespace
    dpdk: bool = False  # runs a DPDK process (testpmd, OVS-DPDK) on a CPU of this machine (--testpmd-cpu)
    options: tuple[str, ...] = ()  # its own `lab up` options (a plan's topology keys), besides guests' and cpu
    checker: str | None = None  # "MODULE:FUNCTION" (name, mtu, options) → BadInput before anything is built
    underlay_roles: tuple[str, ...] = ()  # hosts whose every interface carries the underlay (its own MTU)
    underlay_ifaces: tuple[str, ...] = ()  # interfaces, on any host, that carry the underlay
    pair_shaped: bool = False  # client ─ server, one port each: what an inventory's pair of machines is

    @property
    def borrows_ports(self) -> bool:
        """Its interfaces are this machine's own ports, lent to the lab and given back as they were."""
        return "ports" in self.options

    @property
    def hosts(self) -> dict[str, tuple[StaticIface, ...]]:
        return _HOSTS[self.name]

    @property
    def testpmd(self) -> bool:
        """Its DPDK process is dpdk-testpmd (the switch's settings are `testpmd.*`)."""
        return self.dpdk and not self.ovs

    @property
    def ovs_dpdk(self) -> bool:
        """Its switch is a private OVS-DPDK (ovs-vswitchd with DPDK, lab/ovs_dpdk.py)."""
        return self.dpdk and self.ovs

    @property
    def build(self) -> Callable[..., None]:
        """The builder, called with (offlab.lab.build.Builder, mtu); imported here, when a lab is built."""
        return _load(self.builder)

    @property
    def check(self) -> Callable[[str, int, dict], None] | None:
        """What judges its own `lab up` options (name, mtu, options), raising BadInput; imported when asked."""
        return _load(self.checker) if self.checker else None

    @property
    def picture(self) -> str:
        return (self.build.__doc__ or "").strip().splitlines()[0]


TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (
    Topology("veth", "offlab.lab.topologies:veth", pair_shaped=True),
    Topology("bridge", "offlab.lab.topologies:bridge"),
    Topology("vxlan", "offlab.lab.topologies:vxlan", options=("vni", "port", "underlay_mtu"),
             checker="offlab.lab.topologies:check_vxlan",
             underlay_roles=("switch",), underlay_ifaces=("u0",)),
    Topology("router", "offlab.lab.topologies:router"),
    Topology("ovs", "offlab.lab.topologies:ovs", ("ovs-vswitchd", *_OVS_TOOLS), ovs=True),
    Topology("vm", "offlab.lab.vm:vm", _QEMU, guests=True),
    Topology("vm-router", "offlab.lab.vm:vm_router", _QEMU, guests=True),
    Topology("vm-pair", "offlab.lab.vm:vm_pair", _QEMU, guests=True),
    Topology("dpdk", "offlab.lab.dpdk:dpdk", _TESTPMD, dpdk=True, options=("pmd", "testpmd_idle"),
             checker="offlab.lab.dpdk:check_options"),
    Topology("dpdk-vm", "offlab.lab.dpdk:dpdk_vm", (*_TESTPMD, *_QEMU), guests=True, dpdk=True,
             options=("testpmd_idle",), checker="offlab.lab.dpdk:check_vm_options"),
    Topology("ovs-dpdk", "offlab.lab.ovs_dpdk:ovs_dpdk", _OVS_TOOLS, ovs=True, dpdk=True,
             options=("pmd", "pmd_sleep"),
             checker="offlab.lab.ovs_dpdk:check_options"),
    Topology("ovs-dpdk-vm", "offlab.lab.ovs_dpdk:ovs_dpdk_vm", (*_OVS_TOOLS, *_QEMU), guests=True, ovs=True,
             dpdk=True, options=("pmd_sleep",), checker="offlab.lab.ovs_dpdk:check_vm_options"),
    Topology("phys", "offlab.lab.phys:phys", ("ss",), options=("ports",), checker="offlab.lab.phys:check_request"),
)}
NAMES = tuple(TOPOLOGIES)
GUEST_TOPOLOGIES = tuple(n for n, t in TOPOLOGIES.items() if t.guests)
DPDK_TOPOLOGIES = tuple(n for n, t in TOPOLOGIES.items() if t.dpdk)
TESTPMD_TOPOLOGIES = tuple(n for n, t in TOPOLOGIES.items() if t.testpmd)
PAIR_TOPOLOGIES = tuple(n for n, t in TOPOLOGIES.items() if t.pair_shaped)  # what a plan run on hosts may name
HOSTS = "hosts"  # not a topology: a lab over machines of an inventory (lab/hosts.py), built from no record
BASE_TOOLS = ("ip", "ethtool")  # what every topology runs, checked before its own tools


def taking_option(option: str) -> tuple[str, ...]:
    """The topologies that take `option` (vni, pmd, ports, ...)."""
    return tuple(n for n, t in TOPOLOGIES.items() if option in t.options)


def borrows_ports(name: str) -> bool:
    """Whether a lab of topology `name` runs on this machine's own ports (False for `hosts` and unknown names)."""
    topo = TOPOLOGIES.get(name)
    return topo is not None and topo.borrows_ports
