"""The lab's addresses, written once: every lab, the MTU probe's allow-list and the help texts derive from here.

Labs live in separate namespaces and never meet, so every lab uses the same addresses: hosts on subnet 1
(10.200.1.0/24, fd00:200:0:1::/64), the far side of a router on subnet 2, the VXLAN underlay on subnet 254.
"""

from __future__ import annotations

import ipaddress

LAB_NET4 = ipaddress.IPv4Network("10.200.0.0/16")
LAB_NET6 = ipaddress.IPv6Network("fd00:200::/48")
LOOPBACK = (ipaddress.IPv4Network("127.0.0.0/8"), ipaddress.IPv6Network("::1/128"))
RANGES = f"{LAB_NET4}, {LAB_NET6}"  # how help texts and errors name them


def ip4(subnet: int, host: int) -> str:
    """Host `host` on the lab's IPv4 subnet `subnet` (a /24 of LAB_NET4), without its prefix."""
    return str(LAB_NET4.network_address + (subnet << 8) + host)


def ip6(subnet: int, host: int) -> str:
    """Host `host` on the lab's IPv6 subnet `subnet` (a /64 of LAB_NET6), without its prefix."""
    return str(LAB_NET6.network_address + (subnet << 64) + host)


def cidr4(subnet: int, host: int) -> str:
    return f"{ip4(subnet, host)}/24"


def cidr6(subnet: int, host: int) -> str:
    return f"{ip6(subnet, host)}/64"


# client ─ server on one subnet (veth, bridge, vxlan, ovs, dpdk, the guest labs, phys)
CLIENT4, CLIENT6 = cidr4(1, 1), cidr6(1, 1)
SERVER4, SERVER6 = cidr4(1, 2), cidr6(1, 2)
# client ─ router ─ server: the router is .254 / ::fe on each side, the server on subnet 2
ROUTER_C4, ROUTER_C6 = cidr4(1, 0xFE), cidr6(1, 0xFE)
ROUTER_S4, ROUTER_S6 = cidr4(2, 0xFE), cidr6(2, 0xFE)
BEHIND4, BEHIND6 = cidr4(2, 2), cidr6(2, 2)
# the VXLAN underlay between hv1 and hv2 (IPv4 only)
HV1_UNDERLAY, HV2_UNDERLAY = cidr4(254, 1), cidr4(254, 2)


def address(cidr: str) -> str:
    """'10.200.1.254/24' → '10.200.1.254'."""
    return cidr.split("/")[0]
