"""One function per topology; each reads like its picture.

Addresses are the same in every lab (labs live in separate namespaces, so they
never meet); offlab/addresses.py holds them.
"""

from __future__ import annotations

from offlab.addresses import (BEHIND4, BEHIND6, CLIENT4, CLIENT6, HV1_UNDERLAY, HV2_UNDERLAY, ROUTER_C4,
                              ROUTER_C6, ROUTER_S4, ROUTER_S6, SERVER4, SERVER6, address)
from offlab.errors import BadInput
from offlab.lab.build import Builder
from offlab.lab.model import Interface
from offlab.lab.ovs import Ovs
from offlab.mtu.calc import VXLAN_OVERHEAD
from offlab.names import MTU_MAX, check_mtu


DEFAULT_VNI = 4242
DEFAULT_VXLAN_PORT = 4789

OVS_CSUM_WHY = (
    "OVS userspace datapath over veth forwards partial-checksum frames untouched, "
    "so TCP is black-holed unless tx checksum offload is off on the sending veth"
)


def veth(b: Builder, mtu: int) -> None:
    """client ─ veth ─ server"""
    b.host("client"), b.host("server")
    c, s = b.wire("client", "server", mtu=mtu)
    b.address("client", c, CLIENT4, CLIENT6, reach=True)
    b.address("server", s, SERVER4, SERVER6, reach=True)


def bridge(b: Builder, mtu: int) -> None:
    """client ─ veth ─ [switch: br0] ─ veth ─ server   (seed 000's virbr0/tap, seed 002's bridge)"""
    b.host("client"), b.host("switch"), b.host("server")
    c, sw_c = b.wire("client", "switch", mtu=mtu)
    sw_s, s = b.wire("switch", "server", mtu=mtu)
    b.bridge("switch", "br0", [sw_c, sw_s], mtu=mtu)
    b.address("client", c, CLIENT4, CLIENT6, reach=True)
    b.address("server", s, SERVER4, SERVER6, reach=True)


def router(b: Builder, mtu: int) -> None:
    """client ─ veth ─ [router: ip_forward] ─ veth ─ server, on two subnets (seed 002's VM-as-router)"""
    b.host("client"), b.host("router"), b.host("server")
    c, r_c = b.wire("client", "router", mtu=mtu)
    r_s, s = b.wire("router", "server", mtu=mtu)
    b.address("client", c, CLIENT4, CLIENT6, reach=True)
    b.address("router", r_c, ROUTER_C4, ROUTER_C6, reach=False)
    b.address("router", r_s, ROUTER_S4, ROUTER_S6, reach=False)
    b.address("server", s, BEHIND4, BEHIND6, reach=True)
    b.sysctl("router", "net.ipv4.ip_forward", "1")
    if b.lab.ipv6:
        b.sysctl("router", "net.ipv6.conf.all.forwarding", "1")
    b.default_route("client", address(ROUTER_C4), address(ROUTER_C6))
    b.default_route("server", address(ROUTER_S4), address(ROUTER_S6))


def vxlan_mtu_problem(mtu: int, underlay_mtu: int | None, *, mtu_word: str = "mtu",
                      underlay_word: str = "underlay_mtu") -> tuple[str, str] | None:
    """(the option at fault, why) when the overlay `mtu` does not fit the underlay (the IPv4 VXLAN
    header's 50 bytes), else None; `lab up` and a plan's check spell the options their way."""
    over = VXLAN_OVERHEAD[4]
    if underlay_mtu is not None:
        if underlay_mtu > MTU_MAX:
            return "underlay_mtu", f"{underlay_word} {underlay_mtu} is more than the largest MTU, {MTU_MAX}"
        if mtu > underlay_mtu - over:
            return "underlay_mtu", (f"{mtu_word} {mtu} does not fit the VXLAN underlay: at most {underlay_word} "
                                    f"{underlay_mtu} - {over} = {underlay_mtu - over}")
    elif mtu + over > MTU_MAX:
        return "mtu", f"{mtu_word} {mtu} is too large for vxlan: the underlay needs {mtu} + {over} ≤ {MTU_MAX}"
    return None


def check_vxlan(name: str, mtu: int, options: dict) -> None:
    """`lab up vxlan`'s options: the underlay MTU, the VNI and the UDP port."""
    under = options.get("underlay_mtu")
    if under is not None:
        check_mtu(under, "--underlay-mtu")
    problem = vxlan_mtu_problem(mtu, under, mtu_word="--mtu", underlay_word="underlay MTU")
    if problem:
        raise BadInput(problem[1])
    for key, lo, hi in (("vni", 1, 2**24 - 1), ("port", 1, 65535)):
        val = options.get(key)
        if val is not None and not (isinstance(val, int) and lo <= val <= hi):
            raise BadInput(f"--{key} {val!r} is out of range {lo}..{hi}")


def vxlan(b: Builder, mtu: int) -> None:
    """client ─ veth ─ [hv1: br-int + vxlan0 / u0] ─ [switch: br0] ─ [hv2: u0 / vxlan0 + br-int] ─ veth ─ server

    Seed 003's "client host → linux bridge → br-int → eth1 → leaf switch → eth1 →
    br-int → linux bridge → server host". `mtu` is the overlay MTU the hosts see;
    the underlay is mtu + 50 unless the `underlay_mtu` option says otherwise.
    """
    opts = b.lab.options
    vni, port = opts.setdefault("vni", DEFAULT_VNI), opts.setdefault("port", DEFAULT_VXLAN_PORT)
    under = opts.setdefault("underlay_mtu", mtu + VXLAN_OVERHEAD[4])
    for role in ("client", "hv1", "switch", "hv2", "server"):
        b.host(role)
    c, hv1_c = b.wire("client", "hv1", mtu=mtu)
    hv1_u, sw_1 = b.wire("hv1", "switch", mtu=under, a_name="u0")
    sw_2, hv2_u = b.wire("switch", "hv2", mtu=under, b_name="u0")
    hv2_s, s = b.wire("hv2", "server", mtu=mtu)
    b.bridge("switch", "br0", [sw_1, sw_2], mtu=under)
    for hv, local, remote, port_to_host in (
        ("hv1", HV1_UNDERLAY, HV2_UNDERLAY, hv1_c),
        ("hv2", HV2_UNDERLAY, HV1_UNDERLAY, hv2_s),
    ):
        b.address(hv, "u0", local, None, reach=False)
        with b.step(f"vxlan0 (VNI {vni}, port {port}) in {hv}"):
            b.ip(hv, "link", "add", "vxlan0", "mtu", str(mtu), "type", "vxlan", "id", str(vni),
                 "local", address(local), "remote", address(remote), "dstport", str(port), "dev", "u0")
            b.lab.hosts[hv].interfaces.append(Interface("vxlan0", "vxlan", role="overlay"))
            b.ip(hv, "link", "set", "vxlan0", "up")
        b.bridge(hv, "br-int", [port_to_host, "vxlan0"], mtu=mtu)
    b.address("client", c, CLIENT4, CLIENT6, reach=True)
    b.address("server", s, SERVER4, SERVER6, reach=True)


def ovs(b: Builder, mtu: int) -> None:
    """client ─ veth ─ [switch: OVS br0, userspace datapath] ─ veth ─ server   (seed 004)"""
    b.host("client"), b.host("switch"), b.host("server")
    c, sw_c = b.wire("client", "switch", mtu=mtu)
    sw_s, s = b.wire("switch", "server", mtu=mtu)
    switch = Ovs.start(b)
    switch.add_bridge("br0")
    for port in (sw_c, sw_s):
        switch.add_port("br0", port, mtu=mtu)
    for role, iface in (("client", c), ("server", s)):
        b.ethtool_off(role, iface, "tx-checksumming", OVS_CSUM_WHY)
    b.address("client", c, CLIENT4, CLIENT6, reach=True)
    b.address("server", s, SERVER4, SERVER6, reach=True)
