"""Path MTU by a bounded binary search of don't-fragment pings, telling three answers apart.

    local     `ping: local error: message too long, mtu=1500` — this host refuses
              (the interface, or a path MTU it learnt earlier from an ICMP)
    frag      `Frag needed and DF set (mtu = 6000)` / `Packet too big: mtu=6000` — a router said so
    silent    no reply and no ICMP: the packet vanished. Larger probes silent while
              smaller ones pass is a black hole (a bridge port with a smaller MTU, ICMP filtered)

Probes go only to the addresses offlab's labs use (offlab/addresses.py) or loopback, so
nothing leaves the namespaces offlab made.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field

from offlab import netdev
from offlab.addresses import LAB_NET4, LAB_NET6, LOOPBACK, RANGES
from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts import Host
from offlab.mtu.calc import ICMP_HEADER, IP_MAX, IPV4_HEADER, IPV6_HEADER, MIN_MTU

ALLOWED = (LAB_NET4, LAB_NET6, *LOOPBACK)
MAX_PROBES = 20

_FRAG_RE = re.compile(r"(?:Frag needed and DF set \(mtu = (\d+)\)|Packet too big: mtu=(\d+))")
_FROM_RE = re.compile(r"From (\S+) icmp_seq")
_LOCAL_RE = re.compile(r"message too long, mtu[=:]\s*(\d+)")


def check_dest(dest: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """DEST as an address inside offlab's ranges; anything else is refused (exit 2)."""
    try:
        addr = ipaddress.ip_address(dest)
    except ValueError:
        raise BadInput(f"DEST {dest!r} is not an IP address: give one from {RANGES} "
                       "or loopback (names are refused: they could resolve outside the lab)") from None
    if not _allowed(addr):
        raise BadInput(f"DEST {dest} is outside {RANGES} and loopback: "
                       "offlab only probes inside the namespaces it made")
    return addr


@dataclass
class Probe:
    mtu: int  # IP packet size sent (payload + ICMP + IP headers)
    result: str  # ok | local | frag | silent | error
    reported_mtu: int | None = None
    reported_by: str | None = None
    detail: str = ""


@dataclass
class PathMtu:
    dest: str
    family: int
    iface: str | None
    iface_mtu: int | None
    path_mtu: int | None
    black_hole: bool
    frag_needed: int | None  # the MTU a router reported in an ICMP
    frag_from: str | None
    local_limit: int | None  # the MTU this host itself refused above (interface or learnt PMTU)
    verdict: str
    probes: list[Probe] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _overhead(v6: bool) -> int:
    return (IPV6_HEADER if v6 else IPV4_HEADER) + ICMP_HEADER


def ping_once(host: Host, dest: str, mtu: int, v6: bool, timeout: float) -> Probe:
    """One DF echo of an IP packet of exactly `mtu` bytes."""
    payload = mtu - _overhead(v6)
    argv = ["ping", "-6" if v6 else "-4", "-M", "do", "-s", str(payload), "-c", "1", "-W", f"{timeout:g}",
            "-n", dest]
    res = host.run(argv, check=False, timeout=timeout + 5)
    text = res.stdout + "\n" + res.stderr
    if res.rc == 0 and " bytes from " in text:
        return Probe(mtu, "ok")
    m = _FRAG_RE.search(text)
    if m:
        by = _FROM_RE.search(text)
        return Probe(mtu, "frag", int(m.group(1) or m.group(2)), by.group(1) if by else None)
    m = _LOCAL_RE.search(text)
    if m:
        return Probe(mtu, "local", int(m.group(1)))
    if res.rc == 1:
        return Probe(mtu, "silent")
    lines = [l for l in res.stderr.strip().splitlines() if l.strip()]
    return Probe(mtu, "error", detail=lines[-1] if lines else f"ping exit code {res.rc}")


def route_mtu(host: Host, dest: str) -> tuple[str | None, int | None]:
    """The interface the kernel would send to `dest` through, and its MTU.

    Refuses (exit 2) a route that could leave the machine: through a gateway
    outside offlab's ranges, or out of a device with hardware behind it.
    """
    route = netdev.route_get(host, dest)
    dev, gateway = route.dev, route.gateway
    if gateway and not _allowed(ipaddress.ip_address(gateway)):
        raise BadInput(f"{dest} is routed via {gateway} from {host.name}: outside offlab's ranges, refusing")
    if not dev:
        return None, None
    info = netdev.find_link(host, dev, details=True)
    if info is not None and (info.parentbus or info.parentdev):
        raise BadInput(f"{dest} is routed out of {dev} in {host.name}, a device with hardware behind it: refusing")
    return dev, info.mtu if info is not None else None


def _allowed(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(addr in net for net in ALLOWED if net.version == addr.version)


def probe(host: Host, dest: str, *, timeout: float = 1.0, max_probes: int = MAX_PROBES) -> PathMtu:
    """Find the largest DF packet that reaches `dest` and say how larger ones failed."""
    addr = check_dest(dest)
    if not 0 < timeout <= 1:
        raise BadInput(f"--timeout {timeout:g}: use 0 < seconds ≤ 1")
    if not addr.is_loopback and host.is_this_machine:
        raise BadInput(f"{dest} is probed from a lab namespace (--lab NAME [--host HOST] or --netns NS): "
                       "from this machine's own namespace only loopback is probed")
    v6 = addr.version == 6
    dest = str(addr)
    iface, iface_mtu = route_mtu(host, dest)
    probes: list[Probe] = []

    def send(mtu: int) -> Probe:
        p = ping_once(host, dest, mtu, v6, timeout)
        probes.append(p)
        if p.result == "error":
            raise EnvironmentProblem(f"ping {dest} from {host.name} failed: {p.detail}")
        return p

    floor = MIN_MTU[6 if v6 else 4]
    top = min(iface_mtu or IP_MAX, IP_MAX)
    lo, hi = None, top + 1  # lo: largest size known to pass; hi: smallest known to fail
    hint: int | None = None
    p = send(top)
    if p.result == "ok":
        lo = top
    else:
        hi = top
        if p.reported_mtu and p.reported_mtu < top:
            hint, hi = p.reported_mtu, p.reported_mtu + 1  # anything larger fails the same way
    while lo is None or hi - lo > 1:
        if len(probes) >= max_probes:
            break
        if hint is not None and (lo or 0) < hint < hi:
            size, hint = hint, None
        elif lo is None:
            size = floor
        else:
            size = (lo + hi) // 2
        p = send(size)
        if p.result == "ok":
            lo = size
        else:
            hi = size
            if size == floor:
                break
            if p.reported_mtu and (lo or 0) < p.reported_mtu < size:
                hint, hi = p.reported_mtu, p.reported_mtu + 1
    frag = next((x for x in probes if x.result == "frag"), None)
    local = next((x for x in probes if x.result == "local"), None)
    silent_above = [x.mtu for x in probes if x.result == "silent" and (lo is None or x.mtu > lo)]
    black_hole = bool(silent_above) and lo is not None
    result = PathMtu(dest, addr.version, iface, iface_mtu, lo, black_hole,
                     frag.reported_mtu if frag else None, frag.reported_by if frag else None,
                     local.reported_mtu if local else None, "", probes)
    result.verdict = _verdict(result, hi, len(probes) >= max_probes)
    return result


def _verdict(r: PathMtu, hi: int, exhausted: bool) -> str:
    if r.path_mtu is None:
        return f"no reply from {r.dest} even at {r.probes[-1].mtu} bytes: unreachable, not an MTU problem"
    parts = [f"path MTU {r.path_mtu}"]
    if r.path_mtu == r.iface_mtu:
        parts.append(f"the whole path carries the {r.iface} MTU")
    if r.frag_needed:
        parts.append(f"a router ({r.frag_from or '?'}) reported 'frag needed' with mtu {r.frag_needed}")
    if r.local_limit and r.local_limit != r.iface_mtu:
        parts.append(f"this host already knew a path MTU of {r.local_limit} (learnt from an earlier ICMP)")
    if r.black_hole:
        sizes = sorted({p.mtu for p in r.probes if p.result == "silent" and p.mtu > r.path_mtu})
        parts.append(f"BLACK HOLE: DF packets of {sizes[0]}+ bytes vanished with no ICMP "
                     f"(a bridge/switch port with a smaller MTU, or ICMP filtered)")
    if exhausted and hi - r.path_mtu > 1:
        parts.append(f"search stopped after {len(r.probes)} probes: true value in {r.path_mtu}..{hi - 1}")
    return "; ".join(parts)
