"""Proof on the wire: capture N frames with tcpdump, then say what crossed the interface.

The summary answers the questions of seeds 000 and 004: how large were the frames
(histogram, largest vs MTU + 14), were datagrams IP-fragmented (and into how many
pieces), and what UDP/TCP payload sizes travelled.
"""

from __future__ import annotations

import collections
import struct
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from offlab.errors import EnvironmentProblem
from offlab.hosts import Host, require_tool
from offlab.names import check_ifname
from offlab.wire import ETH_HEADER, FCS, IPV6_FRAG_HEADER, IPV6_HEADER, UDP_HEADER, VLAN_TAG

if TYPE_CHECKING:
    from offlab.sample import Capture as StoredCapture

# a frame at MTU 1500 and 9000, as a capture counts it and with its FCS, each has its own edge
HIST_EDGES = (64, 128, 256, 512, 1024, 1500 + ETH_HEADER, 1500 + ETH_HEADER + FCS, 2048, 4096, 8192,
              9000 + ETH_HEADER, 9000 + ETH_HEADER + FCS, 16384, 32768, 65536, 1 << 20)


def read_pcap(path: str | Path) -> tuple[int, list[tuple[int, bytes]]]:
    """(linktype, [(original length, captured bytes)]) from a classic pcap file.

    dpkt's reader yields only the captured bytes; the original length is what a
    frame-size proof needs when the snap length cuts the payload.
    """
    data = Path(path).read_bytes()
    if len(data) < 24:
        return 1, []
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise ValueError(f"{path}: not a pcap file")
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    frames, off = [], 24
    while off + 16 <= len(data):
        _, _, incl, orig = struct.unpack(endian + "IIII", data[off : off + 16])
        off += 16
        frames.append((orig, data[off : off + incl]))
        off += incl
    return linktype, frames


@dataclass
class CaptureSummary:
    host: str
    iface: str
    mtu: int
    frames: int = 0
    largest_frame: int = 0
    over_mtu_frames: int = 0  # frames longer than MTU + 14: GSO/GRO super-packets on a veth
    ip_fragments: int = 0
    fragmented_datagrams: int = 0
    fragments_per_datagram: int | None = None  # the most common count
    histogram: list[tuple[str, int]] = field(default_factory=list)
    udp_payload_sizes: dict[int, int] = field(default_factory=dict)
    tcp_payload_sizes: dict[int, int] = field(default_factory=dict)
    kernel_dropped: int | None = None
    verdict: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def stored(self) -> StoredCapture:
        """This summary as a sample holds it (its `capture`)."""
        from offlab.sample import Capture as StoredCapture  # here: not read at every CLI start

        return StoredCapture.from_json(self.to_dict())


def summarize(frames: list[tuple[int, bytes]], *, host: str, iface: str, mtu: int,
              linktype: int = 1) -> CaptureSummary:
    import dpkt  # here: only a capture's summary parses packets (22 ms of every `measure`'s imports, -X importtime)

    s = CaptureSummary(host=host, iface=iface, mtu=mtu, frames=len(frames))
    sizes: collections.Counter[int] = collections.Counter()
    frag_groups: dict[tuple, int] = collections.Counter()
    udp: collections.Counter[int] = collections.Counter()
    tcp: collections.Counter[int] = collections.Counter()
    for orig, buf in frames:
        sizes[orig] += 1
        ip = _ip_layer(buf, linktype)
        if ip is None:
            continue
        if isinstance(ip, dpkt.ip.IP):
            mf, offset = bool(ip.mf), ip.offset
            if mf or offset:
                s.ip_fragments += 1
                frag_groups[(ip.src, ip.dst, ip.id, ip.p)] += 1
                if offset:
                    continue  # later fragments carry no transport header
            payload_len = ip.len - ip.hl * 4
        else:
            payload_len = ip.plen
            frag = _ipv6_fragment(buf, linktype)
            if frag is not None:
                ident, offset, _more = frag
                s.ip_fragments += 1
                frag_groups[(ip.src, ip.dst, ident, 6)] += 1
                if offset:
                    continue
        l4 = ip.data
        if isinstance(l4, dpkt.udp.UDP):
            udp[l4.ulen - UDP_HEADER] += 1
        elif isinstance(l4, dpkt.tcp.TCP):
            n = payload_len - l4.off * 4
            if n > 0:
                tcp[n] += 1
    s.largest_frame = max(sizes) if sizes else 0
    s.over_mtu_frames = sum(n for size, n in sizes.items() if size > mtu + ETH_HEADER)
    s.histogram = _histogram(sizes)
    s.fragmented_datagrams = len(frag_groups)
    if frag_groups:
        s.fragments_per_datagram = collections.Counter(frag_groups.values()).most_common(1)[0][0]
    s.udp_payload_sizes = dict(udp.most_common(8))
    s.tcp_payload_sizes = dict(tcp.most_common(8))
    s.verdict = verdict(s)
    return s


IPV6_EXT_HEADERS = (0, 43, 60)  # hop-by-hop, routing, destination options: skipped to find a fragment header
IPV6_FRAGMENT = 44


def _ipv6_fragment(buf: bytes, linktype: int) -> tuple[int, int, bool] | None:
    """(identification, offset, more) of an IPv6 fragment header, walked from the raw bytes.

    dpkt does not expose the fragment header uniformly across versions, so the chain of
    extension headers is read directly: next-header 44 anywhere before the payload.
    """
    off = ETH_HEADER if linktype == 1 else 0
    if linktype == 1 and len(buf) >= ETH_HEADER and buf[12:14] == b"\x81\x00":
        off += VLAN_TAG  # one VLAN tag
    if len(buf) < off + IPV6_HEADER:
        return None
    nxt, off = buf[off + 6], off + IPV6_HEADER
    for _ in range(8):
        if nxt == IPV6_FRAGMENT:
            if len(buf) < off + IPV6_FRAG_HEADER:
                return None
            field, ident = struct.unpack("!HI", buf[off + 2 : off + IPV6_FRAG_HEADER])
            return ident, field >> 3, bool(field & 1)
        if nxt not in IPV6_EXT_HEADERS or len(buf) < off + 2:
            return None
        nxt, off = buf[off], off + (buf[off + 1] + 1) * 8  # its length in 8-octet units, less the first
    return None


def _ip_layer(buf: bytes, linktype: int):
    import dpkt

    try:
        if linktype == 1:  # Ethernet
            eth = dpkt.ethernet.Ethernet(buf)
            ip = eth.data
        elif linktype in (101, 12):  # raw IP
            ip = dpkt.ip.IP(buf) if buf and buf[0] >> 4 == 4 else dpkt.ip6.IP6(buf)
        else:
            return None
    except (dpkt.UnpackError, IndexError, ValueError):
        return None
    return ip if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) else None


def _histogram(sizes: collections.Counter) -> list[tuple[str, int]]:
    bins, lo = [], 0
    for edge in HIST_EDGES:
        n = sum(c for size, c in sizes.items() if lo < size <= edge)
        if n:
            bins.append((f"{lo + 1}-{edge}", n))
        lo = edge
    return bins


def verdict(s: CaptureSummary) -> str:
    """One sentence a person can paste into a bug report."""
    if not s.frames:
        return f"no frames captured on {s.host}:{s.iface}"
    limit = s.mtu + ETH_HEADER
    parts = []
    if s.fragmented_datagrams:
        top_udp = max(s.udp_payload_sizes, default=None)
        what = f"{top_udp}-byte datagrams" if top_udp else "datagrams"
        parts.append(f"{what} left as {s.fragments_per_datagram} IP fragments each "
                     f"({s.ip_fragments} fragments of {s.fragmented_datagrams} datagrams)")
    else:
        parts.append("no IP fragments")
    if s.over_mtu_frames:
        parts.append(f"{s.over_mtu_frames} of {s.frames} frames larger than MTU + 14 = {limit} bytes "
                     f"(largest {s.largest_frame}): GSO/GRO super-packets crossed {s.iface} unsegmented")
    else:
        parts.append(f"every frame ≤ {limit} bytes (largest {s.largest_frame})")
    return ", ".join(parts)


class Capture:
    """tcpdump on one lab interface for at most `frames` frames, stopped by us."""

    def __init__(self, host: Host, iface: str, pcap: Path, *, frames: int = 2000, snaplen: int = 256) -> None:
        require_tool("tcpdump")
        self.host, self.iface, self.pcap = host, check_ifname(iface), pcap
        # -Z root: tcpdump would otherwise drop to its own user and fail to write our file.
        # --immediate-mode: without it libpcap hands frames over a ring block at a time, and the block
        # still open when we stop tcpdump is lost — at a slow guest's rate, that was every frame.
        argv = ["tcpdump", "-i", iface, "-nn", "-s", str(snaplen), "-c", str(frames), "-U", "--immediate-mode",
                "-Z", "root", "-w", str(pcap)]
        self.proc = host.spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """tcpdump says 'listening on' once the socket is open; frames before that are missed. The timeout
        is a hang guard: at a load of 30 on two CPUs its start took seconds."""
        import select

        line = ""
        if select.select([self.proc.stderr], [], [], timeout)[0]:
            line = self.proc.stderr.readline()
        if "listening on" not in line:
            self.stop()
            raise EnvironmentProblem(f"tcpdump on {self.host.name}:{self.iface} did not start: {line.strip()}")

    def stop(self) -> int | None:
        """Stop tcpdump; return the kernel's dropped-frame count it reports."""
        from offlab.hosts.process import stop as stop_proc

        if self.proc.poll() is None:
            self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        err = self.proc.stderr.read() if self.proc.stderr else ""
        stop_proc(self.proc)
        for line in err.splitlines():
            if "dropped by kernel" in line:
                return int(line.split()[0])
        return None
