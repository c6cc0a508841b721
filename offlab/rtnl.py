"""A link's GSO/GRO size limits over rtnetlink, in the namespace this process runs in.

    python -m offlab.rtnl get IFACE              → {"gso_max_size": 65536, ..., "tso_max_size": 524280}
    python -m offlab.rtnl set IFACE KEY BYTES    → exit 0, or the kernel's error on stderr and exit 1

BIG TCP's four sizes are link attributes (IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, and since Linux 6.3
IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE). Debian 12's `ip` (iproute2 6.1) neither shows nor
sets the IPv4 ones, and pyroute2 0.9.7 (the newest) has no name for them either (its ifinfmsg stops at
IFLA_ALLMULTI and decodes them as UNKNOWN without a value): so this module speaks rtnetlink itself,
with the standard library only — one RTM_GETLINK, one RTM_NEWLINK with a single u32 attribute. It is
run inside a lab namespace through `offlab.hosts` (`host.run([python, "-m", "offlab.rtnl", ...])`),
never by entering the namespace from here; it imports nothing of offlab so that start is quick.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import sys

# include/uapi/linux/if_link.h
ATTRS = {
    "gso_max_size": 41,  # IFLA_GSO_MAX_SIZE
    "gso_max_segs": 40,  # IFLA_GSO_MAX_SEGS
    "gro_max_size": 58,  # IFLA_GRO_MAX_SIZE (5.19)
    "tso_max_size": 59,  # IFLA_TSO_MAX_SIZE (5.19), read-only: the device's ceiling for gso_*
    "tso_max_segs": 60,  # IFLA_TSO_MAX_SEGS, read-only
    "gso_ipv4_max_size": 63,  # IFLA_GSO_IPV4_MAX_SIZE (6.3)
    "gro_ipv4_max_size": 64,  # IFLA_GRO_IPV4_MAX_SIZE (6.3)
}
SETTABLE = ("gso_max_size", "gro_max_size", "gso_ipv4_max_size", "gro_ipv4_max_size")

NETLINK_ROUTE = 0
RTM_NEWLINK, RTM_GETLINK = 16, 18
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
NLMSGERR_ATTR_MSG = 1
NETLINK_EXT_ACK = 11
SOL_NETLINK = 270

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, pad, type, index, flags, change
_RTATTR = struct.Struct("=HH")  # len, type


class RtnlError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{os.strerror(code)}" + (f" ({message})" if message else ""))
        self.code = code


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    size = _RTATTR.size + len(payload)
    return _RTATTR.pack(size, kind) + payload + b"\0" * (_align(size) - size)


def _attrs(data: bytes) -> dict[int, bytes]:
    out, pos = {}, 0
    while pos + _RTATTR.size <= len(data):
        size, kind = _RTATTR.unpack_from(data, pos)
        if size < _RTATTR.size:
            break
        out[kind & 0x3FFF] = data[pos + _RTATTR.size:pos + size]
        pos += _align(size)
    return out


def _request(msg_type: int, flags: int, index: int, attrs: bytes = b"") -> list[tuple[int, bytes]]:
    """Send one request, return its replies as (type, payload); RtnlError from the kernel's error."""
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + attrs
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.bind((0, 0))
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, NLM_F_REQUEST | flags, 1, 0) + body)
        data = sock.recv(65536)
    replies, pos = [], 0
    while pos + _NLMSGHDR.size <= len(data):
        size, kind, mflags, _, _ = _NLMSGHDR.unpack_from(data, pos)
        payload = data[pos + _NLMSGHDR.size:pos + size]
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", payload)[0]
            if code:
                message = ""
                if mflags & NLM_F_ACK_TLVS:  # the error, our request (capped: its header), the extended ack
                    echoed = _NLMSGHDR.size if mflags & NLM_F_CAPPED else _NLMSGHDR.unpack_from(payload, 4)[0]
                    tlv = _attrs(payload[4 + _align(echoed):])
                    message = tlv.get(NLMSGERR_ATTR_MSG, b"").rstrip(b"\0").decode(errors="replace")
                raise RtnlError(code, message)
        else:
            replies.append((kind, payload))
        pos += _align(size)
    return replies


def read(iface: str) -> dict[str, int]:
    """The size attributes this kernel reports for `iface` (an attribute it lacks is absent)."""
    index = socket.if_nametoindex(iface)
    for kind, payload in _request(RTM_GETLINK, 0, index):
        if kind == RTM_NEWLINK:
            found = _attrs(payload[_IFINFOMSG.size:])
            return {name: struct.unpack("=I", found[num][:4])[0] for name, num in ATTRS.items() if num in found}
    raise RtnlError(errno.ENODEV, f"no link message for {iface}")


def write(iface: str, key: str, value: int) -> None:
    if key not in SETTABLE:
        raise ValueError(f"{key} is not one of {', '.join(SETTABLE)}")
    index = socket.if_nametoindex(iface)
    _request(RTM_NEWLINK, NLM_F_ACK, index, _attr(ATTRS[key], struct.pack("=I", value)))


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "get":
            print(json.dumps(read(argv[1])))
            return 0
        if len(argv) == 4 and argv[0] == "set" and argv[3].isdigit():
            write(argv[1], argv[2], int(argv[3]))
            return 0
    except (OSError, RtnlError, ValueError) as exc:
        print(f"rtnetlink: {exc}", file=sys.stderr)
        return 1
    print("usage: python -m offlab.rtnl get IFACE | set IFACE KEY BYTES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
