"""Header sizes on the wire, in bytes: the one place each is written (MTU arithmetic, witnesses that turn
bytes into datagrams, the capture's frame limit, the report's bins)."""

from __future__ import annotations

ETH_HEADER = 14  # a frame is MTU + 14 as /proc/net/dev and tcpdump count it (no FCS, no VLAN tag)
FCS = 4
VLAN_TAG = 4
IPV4_HEADER = 20
IPV6_HEADER = 40
IPV6_FRAG_HEADER = 8
UDP_HEADER = 8
ICMP_HEADER = 8
TCP_HEADER = 20
TCP_TIMESTAMPS = 12  # the option (10) padded to 12, present on nearly every Linux segment
VXLAN_HEADER = 8
GRE_HEADER = 4  # the base header, no key or sequence number
# whole headers before a payload, as the counters see a frame: Ethernet + IPv4 + TCP with timestamps
# (a 1514 B frame carries 1448 B), and Ethernet + IPv4 + UDP
TCP_FRAME_OVERHEAD = ETH_HEADER + IPV4_HEADER + TCP_HEADER + TCP_TIMESTAMPS
UDP_FRAME_OVERHEAD = ETH_HEADER + IPV4_HEADER + UDP_HEADER
IP_MAX = 65535  # 16-bit total length (IPv4) / payload length (IPv6, without jumbograms)
# the largest UDP payload: 65507 over IPv4 (the total length counts the IP header), 65527 over IPv6 (the
# payload length does not)
UDP_MAX_PAYLOAD = {4: IP_MAX - IPV4_HEADER - UDP_HEADER, 6: IP_MAX - UDP_HEADER}


def ip_header(ipv6: bool) -> int:
    return IPV6_HEADER if ipv6 else IPV4_HEADER
