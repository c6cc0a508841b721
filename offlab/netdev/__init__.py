"""Network devices in a host: links, addresses, routes, qdiscs, offload features, softnet rows, OVS ports.

The one home of each tool's output: `ip -j` is parsed in netdev/ip.py, `tc -j qdisc` in netdev/tc.py,
ethtool's text in netdev/ethtool.py, each into frozen dataclasses; the readers here run the command
through a `Host` and return those records. Lab, knobs, probes and doctor read fields, never the tools'
keys (tests/test_parsers_home.py fails on a parse or a raw key read elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from offlab.errors import BadInput, CommandFailed, EnvironmentProblem
from offlab.hosts import Host, check_netns
from offlab.names import check_ifname
from offlab.netdev.ethtool import (DEPENDS, Coalescing, Driver, Feature, FlowHash, Limit, Limits, QueueStats, held_off,
                                   parse_coalesce, parse_driver, parse_features, parse_flow_hash, parse_limits,
                                   parse_queue_stats)
from offlab.netdev.ip import Addr, Link, Route, parse_links, parse_netns_names, parse_routes
from offlab.netdev.tc import Qdisc, parse_qdiscs

__all__ = ["DEPENDS", "Addr", "Coalescing", "Driver", "Feature", "FlowHash", "Limit", "Limits", "Link", "Qdisc",
           "QueueStats", "Route", "SoftnetRow", "addr_rows", "driver", "find_addrs", "qdiscs", "features",
           "find_link", "held_off", "ip_argv", "link", "link_rows", "links", "netns_names", "ovs_env",
           "parse_coalesce", "parse_driver", "parse_features", "parse_flow_hash", "parse_limits", "parse_links",
           "parse_netns_names", "parse_qdiscs", "parse_queue_stats", "parse_routes", "parse_softnet", "route_get",
           "routes", "vsctl"]


def features(host: Host, iface: str) -> dict[str, Feature]:
    check_ifname(iface)
    try:
        res = host.run(["ethtool", "-k", iface], timeout=10)
    except CommandFailed as exc:
        raise _no_such(host, iface, exc) from exc
    return parse_features(res.stdout)


# ---- `ip -j`: every one offlab runs is built here and parsed in netdev/ip.py ----------------

def ip_argv(*args: str, details: bool = False, netns: str | None = None) -> list[str]:
    """`ip [-n NETNS] [-d] -j ARGS…`, the command line (doctor looks it up in a sosreport by this argv)."""
    return ["ip", *(["-n", check_netns(netns)] if netns else []), *(["-d"] if details else []), "-j", *args]


def _ip(host: Host, *args: str, details: bool = False, netns: str | None = None, timeout: float = 10,
        check: bool = True) -> str | None:
    """What `ip -j ARGS…` prints in `host`; with check=False None when ip fails (no such device,
    route or namespace), else CommandFailed."""
    res = host.run(ip_argv(*args, details=details, netns=netns), check=check, timeout=timeout)
    return res.stdout if res.ok else None


def links(host: Host) -> list[Link]:
    """`ip -d -j addr show`: every link with its details and addresses."""
    return parse_links(_ip(host, "addr", "show", details=True) or "")


def link_rows(host: Host, *, details: bool = False, netns: str | None = None, timeout: float = 10) -> list[Link]:
    """`ip [-d] -j link show`: every link of `host` (or of namespace `netns`, run from `host`)."""
    return parse_links(_ip(host, "link", "show", details=details, netns=netns, timeout=timeout) or "")


def find_link(host: Host, iface: str, *, details: bool = False, netns: str | None = None) -> Link | None:
    """`ip -j link show dev IFACE`: the link, or None when there is none by that name (or no such namespace)."""
    found = parse_links(_ip(host, "link", "show", "dev", check_ifname(iface), details=details, netns=netns,
                            check=False) or "")
    return found[0] if found else None


def find_addrs(host: Host, iface: str, *, netns: str | None = None) -> tuple[Addr, ...] | None:
    """`ip -j addr show dev IFACE`: its addresses, or None when there is no such link (or namespace)."""
    found = parse_links(_ip(host, "addr", "show", "dev", check_ifname(iface), netns=netns, check=False) or "")
    return found[0].addrs if found else None


def addr_rows(host: Host, iface: str | None = None, *, details: bool = False, netns: str | None = None,
              timeout: float = 10) -> list[Link]:
    """`ip [-d] -j addr show [dev IFACE]`: links with their addresses."""
    dev = ("dev", check_ifname(iface)) if iface is not None else ()
    return parse_links(_ip(host, "addr", "show", *dev, details=details, netns=netns, timeout=timeout) or "")


def routes(host: Host, family: int, *selector: str) -> list[Route]:
    """`ip -j -4|-6 route show SELECTOR…` (e.g. default, or dev IFACE); none when ip fails."""
    return parse_routes(_ip(host, f"-{family}", "route", "show", *selector, check=False) or "")


def route_get(host: Host, dest: str) -> Route:
    """`ip -j route get DEST`: the route the kernel would take; EnvironmentProblem (with ip's word) if none."""
    res = host.run(ip_argv("route", "get", dest), check=False, timeout=10)
    found = parse_routes(res.stdout) if res.ok and res.stdout.strip() else []
    if not found:
        detail = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "no route"
        raise EnvironmentProblem(f"no route to {dest} from {host.name}: {detail}")
    return found[0]


def netns_names(host: Host, *, timeout: float = 10) -> list[str]:
    """`ip -j netns list`: the named network namespaces `host` has (none when ip fails)."""
    return parse_netns_names(_ip(host, "netns", "list", timeout=timeout, check=False) or "")


def link(host: Host, iface: str) -> Link:
    """`ip -d -j link show dev IFACE`; BadInput when there is no such interface."""
    check_ifname(iface)
    try:
        text = _ip(host, "link", "show", "dev", iface, details=True)
    except CommandFailed as exc:
        raise _no_such(host, iface, exc) from exc
    return parse_links(text or "")[0]


def driver(host: Host, iface: str, *, timeout: float = 10) -> Driver:
    """`ethtool -i IFACE`: the driver behind it (empty fields where ethtool cannot say)."""
    res = host.run(["ethtool", "-i", check_ifname(iface)], check=False, timeout=timeout)
    return parse_driver(res.stdout) if res.ok else Driver()


def qdiscs(host: Host, iface: str) -> list[Qdisc]:
    """`tc -j qdisc show dev IFACE`: its qdiscs (the root's tree and any ingress)."""
    return parse_qdiscs(host.run(["tc", "-j", "qdisc", "show", "dev", check_ifname(iface)], timeout=10).stdout, iface)


def _no_such(host: Host, iface: str, exc: CommandFailed) -> Exception:
    if "not exist" in exc.stderr or "No such device" in exc.stderr or "no device" in exc.stderr:
        return BadInput(f"no interface {iface!r} in {host.name}")
    return exc


@dataclass(frozen=True)
class SoftnetRow:
    cpu: int
    processed: int
    dropped: int
    time_squeeze: int
    received_rps: int
    flow_limit: int
    backlog: int | None = None  # packets waiting in its input queues now (a gauge); None before 5.10


def parse_softnet(text: str) -> list[SoftnetRow]:
    """/proc/net/softnet_stat: one hex row per online CPU (columns 12 and 13, the backlog's length and the
    CPU, since 5.10)."""
    rows = []
    for i, line in enumerate(l for l in text.splitlines() if l.strip()):
        cols = [int(c, 16) for c in line.split()]
        known = len(cols) > 12
        cols += [0] * (13 - len(cols))
        rows.append(SoftnetRow(cols[12] if known else i, cols[0], cols[1], cols[2], cols[9], cols[10],
                               cols[11] if known else None))
    return rows


def ovs_env(rundir: str | Path) -> dict[str, str]:
    """Point every OVS default path at a lab's run directory, so a system OVS is never touched."""
    d = str(rundir)
    return {"OVS_RUNDIR": d, "OVS_LOGDIR": d, "OVS_DBDIR": d, "OVS_SYSCONFDIR": d}


def vsctl(host: Host, rundir: str | Path, *args: str, wait: int = 10) -> str:
    """ovs-vsctl against the private OVS database in `rundir` (a lab's, or one found in the journal).
    `wait`: seconds ovs-vsctl waits for ovs-vswitchd to apply the change; adding a DPDK port (the
    PMD probes the device and starts its queues) takes longer than that on a loaded machine."""
    return host.run(["ovs-vsctl", f"--db=unix:{rundir}/db.sock", f"--timeout={wait}", *args],
                    env=ovs_env(rundir), timeout=wait + 10).stdout
