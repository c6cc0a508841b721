"""The MTU numbers engineers get wrong, as pure functions (seeds 000 and 004).

At an IP MTU M: UDP carries M − IP − 8 (1472 at 1500, 8972 at 9000); TCP's MSS
is M − IP − 20 and a segment with timestamps carries 12 bytes less; the frame is
M + 14 (+4 FCS, +4 per VLAN tag) — 9018 bytes for M = 9000 on the wire, 9014 as
tcpdump shows it. A tunnel takes its headers out of the underlay's MTU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from offlab.errors import BadInput
from offlab.names import check_mtu
from offlab.wire import (ETH_HEADER, FCS, GRE_HEADER, ICMP_HEADER, IP_MAX, IPV4_HEADER,  # noqa: F401
                         IPV6_FRAG_HEADER, IPV6_HEADER, TCP_HEADER, TCP_TIMESTAMPS, UDP_HEADER, VLAN_TAG,
                         VXLAN_HEADER, ip_header)

MIN_MTU = {4: 68, 6: 1280}

# Bytes a tunnel adds in front of the inner packet, by underlay family.
# The one source of "VXLAN takes 50 bytes (70 over IPv6)" for lab, knobs and doctor.
VXLAN_OVERHEAD = {4: ETH_HEADER + IPV4_HEADER + UDP_HEADER + VXLAN_HEADER,
                  6: ETH_HEADER + IPV6_HEADER + UDP_HEADER + VXLAN_HEADER}
ENCAP_OVERHEAD = {
    "vxlan": VXLAN_OVERHEAD,
    "gre": {4: IPV4_HEADER + GRE_HEADER, 6: IPV6_HEADER + GRE_HEADER},
}
ENCAPS = ("none", "vlan", "vxlan", "gre")


def udp_payload_max(mtu: int, ipv6: bool = False) -> int:
    """Largest UDP payload that leaves without IP fragmentation (1472 at 1500, 8972 at 9000)."""
    return mtu - ip_header(ipv6) - UDP_HEADER


def ping_payload_max(mtu: int, ipv6: bool = False) -> int:
    """`ping -M do -s N`: the largest N that fits (ICMP echo header is 8 bytes, as UDP's)."""
    return mtu - ip_header(ipv6) - ICMP_HEADER


def tcp_mss(mtu: int, ipv6: bool = False) -> int:
    """TCP MSS with no options: 1460 at 1500, 8960 at 9000 (seed 004's 8960)."""
    return mtu - ip_header(ipv6) - TCP_HEADER


def tcp_payload_with_timestamps(mtu: int, ipv6: bool = False) -> int:
    """What a full Linux segment really carries: MSS − 12 for the timestamp option (1448 at 1500)."""
    return tcp_mss(mtu, ipv6) - TCP_TIMESTAMPS


def frame_size(mtu: int, *, fcs: bool = True, vlan_tags: int = 0) -> int:
    """Ethernet frame for a full packet: 9018 with FCS at 9000, 9014 as a capture shows it."""
    return mtu + ETH_HEADER + VLAN_TAG * vlan_tags + (FCS if fcs else 0)


def inner_mtu(underlay_mtu: int, encap: str, underlay_ipv6: bool = False) -> int:
    """MTU to give the interface inside a tunnel (VXLAN −50/−70, GRE −24/−44, VLAN unchanged)."""
    if encap in ("none", "vlan"):
        return underlay_mtu
    if encap not in ENCAP_OVERHEAD:
        raise BadInput(f"--encap {encap!r}: choose one of {', '.join(ENCAPS)}")
    return underlay_mtu - ENCAP_OVERHEAD[encap][6 if underlay_ipv6 else 4]


def udp_datagram_max(ipv6: bool = False) -> int:
    """Largest UDP payload at all: 65507 over IPv4 (65535 − 20 − 8), 65527 over IPv6 (65535 − 8)."""
    return IP_MAX - UDP_HEADER - (0 if ipv6 else IPV4_HEADER)


@dataclass(frozen=True)
class Fragments:
    count: int
    data_per_fragment: int  # bytes of the original IP payload in each full fragment (a multiple of 8)
    last_data: int
    packet_sizes: tuple[int, ...]  # IP packet size of the first and last fragment

    def to_json(self) -> dict:
        return asdict(self)


def fragments(udp_payload: int, mtu: int, ipv6: bool = False) -> Fragments:
    """How many IP fragments a UDP datagram becomes at `mtu`.

    IPv4 fragments carry (mtu − 20) rounded down to 8 bytes of the UDP datagram
    (header included): 65507 + 8 = 65515 bytes at 1500 → 1480-byte pieces → 45.
    IPv6 fragments also carry an 8-byte fragment header: (mtu − 48) rounded down.
    """
    data = udp_payload + UDP_HEADER
    header = IPV6_HEADER + IPV6_FRAG_HEADER if ipv6 else IPV4_HEADER
    if data + ip_header(ipv6) <= mtu:
        return Fragments(1, data, data, (data + ip_header(ipv6),))
    per = (mtu - header) // 8 * 8
    if per <= 0:
        raise BadInput(f"MTU {mtu} leaves no room for a fragment")
    count = math.ceil(data / per)
    last = data - per * (count - 1)
    return Fragments(count, per, last, (per + header, last + header))


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    value: int | None
    how: str


def table(mtu: int, *, ipv6: bool = False, encap: str = "none") -> list[Row]:
    """Every number for one MTU, each with the arithmetic that gives it."""
    check_mtu(mtu)
    fam = 6 if ipv6 else 4
    if mtu < MIN_MTU[fam]:
        raise BadInput(f"--mtu {mtu} is below IPv{fam}'s minimum {MIN_MTU[fam]}")
    if encap not in ENCAPS:
        raise BadInput(f"--encap {encap!r}: choose one of {', '.join(ENCAPS)}")
    ip, ipn = ip_header(ipv6), f"IPv{fam}"
    big = udp_datagram_max(ipv6)
    frag = fragments(big, mtu, ipv6)
    rows = [
        Row("ip_mtu", "IP MTU (what `ip link set mtu` sets)", mtu, f"{mtu}"),
        Row("udp_payload_max", "largest UDP payload, no fragmentation", udp_payload_max(mtu, ipv6),
            f"{mtu} − {ip} {ipn} − {UDP_HEADER} UDP"),
        Row("ping_payload_max", "largest `ping -M do -s N`", ping_payload_max(mtu, ipv6),
            f"{mtu} − {ip} {ipn} − {ICMP_HEADER} ICMP"),
        Row("tcp_mss", "TCP MSS (no options)", tcp_mss(mtu, ipv6), f"{mtu} − {ip} {ipn} − {TCP_HEADER} TCP"),
        Row("tcp_payload_timestamps", "TCP payload per segment with timestamps",
            tcp_payload_with_timestamps(mtu, ipv6), f"MSS − {TCP_TIMESTAMPS} (timestamp option)"),
        Row("frame_wire", "Ethernet frame on the wire (with FCS)", frame_size(mtu),
            f"{mtu} + {ETH_HEADER} Ethernet + {FCS} FCS"),
        Row("frame_captured", "frame as tcpdump/Wireshark shows it (no FCS)", frame_size(mtu, fcs=False),
            f"{mtu} + {ETH_HEADER} Ethernet"),
        Row("frame_wire_vlan", "frame with one VLAN tag (with FCS)", frame_size(mtu, vlan_tags=1),
            f"{mtu} + {ETH_HEADER} + {VLAN_TAG} VLAN + {FCS} FCS"),
        Row("udp_datagram_max", "largest UDP datagram at all", big,
            f"{IP_MAX} − {UDP_HEADER} UDP" + ("" if ipv6 else f" − {IPV4_HEADER} IPv4")),
        Row("fragments_of_max", f"IP fragments of a {big}-byte datagram at this MTU", frag.count,
            f"{big} + {UDP_HEADER} = {big + UDP_HEADER} bytes in pieces of {frag.data_per_fragment}"
            f" ({mtu} − {IPV6_HEADER + IPV6_FRAG_HEADER if ipv6 else IPV4_HEADER}, rounded down to 8)"
            f"; last carries {frag.last_data}"),
    ]
    if encap == "vlan":
        rows.append(Row("inner_mtu", "IP MTU over a VLAN (the frame grows, not the MTU)", mtu,
                        f"{mtu}; frame {frame_size(mtu, vlan_tags=1)} with FCS"))
    elif encap != "none":
        for under6 in (False, True):
            over = ENCAP_OVERHEAD[encap][6 if under6 else 4]
            rows.append(Row(f"inner_mtu_ipv{6 if under6 else 4}_underlay",
                            f"inner MTU through {encap.upper()} over an IPv{6 if under6 else 4} underlay",
                            inner_mtu(mtu, encap, under6), f"{mtu} − {over}"))
    return rows
