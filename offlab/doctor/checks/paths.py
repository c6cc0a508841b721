"""MTU along veth paths: follow veth pairs from here into the namespaces they reach (a lab's path).

Links joined at layer 2 (veth pairs, bridge ports and their bridge) form a
segment that must share one MTU; a VXLAN device needs its underlay 50 bytes
larger (70 over IPv6); segments joined by routing may differ, but then the path
depends on ICMP "frag needed" reaching the sender.
"""

from __future__ import annotations

from offlab import netdev
from offlab.doctor import parse
from offlab.doctor.model import FixChange, Outcome
from offlab.doctor.registry import Context, check, no_data
from offlab.mtu.calc import VXLAN_OVERHEAD

MAX_NAMESPACES = 16
L2_KINDS = ("veth", "bridge", "vxlan")


class _Sets:
    def __init__(self) -> None:
        self.parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(self, x: tuple[str, str]) -> tuple[str, str]:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: tuple[str, str], b: tuple[str, str]) -> None:
        self.parent[self.find(a)] = self.find(b)


def _walk(ctx: Context) -> tuple[dict[str, list[netdev.Link]], dict[str, dict[int, str]], list[str]]:
    """Links of this namespace and of every named namespace its veths reach."""
    here = ctx.netns or ""
    spaces: dict[str, list[netdev.Link]] = {here: ctx.links}
    ids: dict[str, dict[int, str]] = {}
    unreachable: list[str] = []
    queue = [here]
    while queue:
        ns = queue.pop(0)
        links = spaces[ns]
        if not any(l.link_netnsid is not None for l in links):
            continue
        out = ctx.run(["ip", "netns", "list"] if ns == here else ["ip", "-n", ns, "netns", "list"])
        ids[ns] = parse.netns_ids(out.stdout) if out is not None and out.ok else {}
        for link in links:
            peer_ns = ids[ns].get(link.link_netnsid if link.link_netnsid is not None else -1)
            if peer_ns is None or peer_ns in spaces or peer_ns in unreachable:
                continue
            if len(spaces) >= MAX_NAMESPACES:
                unreachable.append(peer_ns)
                continue
            res = ctx.run(netdev.ip_argv("link", "show", details=True, netns=peer_ns))
            if res is None or not res.ok or not res.stdout.strip():
                unreachable.append(peer_ns)
                continue
            spaces[peer_ns] = netdev.parse_links(res.stdout)
            queue.append(peer_ns)
    return spaces, ids, unreachable


def _label(ns: str, ifname: str) -> str:
    return f"{ns}:{ifname}" if ns else ifname


@check("mtu.path", area="mtu", title="MTU along veth paths (a lab's path, containers)", tier=None,
       why="a frame larger than the next link's MTU is dropped without an ICMP inside a segment; "
           "across a router only PMTU discovery saves it")
def path(ctx: Context) -> Outcome:
    if not ctx.links:
        raise no_data("no interface list (ip -d -j link, ip -d address, /sys/class/net)")
    if not any(l.kind == "veth" for l in ctx.links):
        return Outcome("ok", "no veth here: no namespace path to follow", {"namespaces": [ctx.netns or ""]})
    spaces, ids, unreachable = _walk(ctx)
    sets = _Sets()
    mtu: dict[tuple[str, str], int] = {}
    tunnels = []  # (overlay node, underlay node, overhead)
    for ns, links in spaces.items():
        by_index = {l.ifindex: l.ifname for l in links if l.ifname}
        for l in links:
            name, kind = l.ifname, l.kind
            if not name or name == "lo" or not (kind in L2_KINDS or l.master):
                continue
            node = (ns, name)
            sets.find(node)
            if l.mtu is not None:
                mtu[node] = int(l.mtu)
            if l.master:
                sets.union(node, (ns, l.master))
            if kind == "veth" and l.link_index is not None:
                if l.link_netnsid is None:
                    peer = by_index.get(l.link_index)
                    if peer:
                        sets.union(node, (ns, peer))
                else:
                    peer_ns = ids.get(ns, {}).get(l.link_netnsid)
                    if peer_ns in spaces:
                        peer = next((p.ifname for p in spaces[peer_ns] if p.ifindex == l.link_index), None)
                        if peer:
                            sets.union(node, (peer_ns, peer))
            if l.vxlan_dev:
                tunnels.append((node, (ns, l.vxlan_dev), VXLAN_OVERHEAD[l.vxlan_family]))
    segments: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for node in list(sets.parent):
        segments.setdefault(sets.find(node), []).append(node)
    underlay_roots = {sets.find(u) for _, u, _ in tunnels}
    # A bridge's own MTU follows its ports: only ports and veth ends are set by hand.
    kinds = {(ns, l.ifname): l.kind for ns, links in spaces.items() for l in links}
    problems, fixes, changes = [], [], []
    seg_mtu: dict[tuple[str, str], int] = {}
    seg_want: dict[tuple[str, str], int] = {}  # the MTU most of a segment has: what its odd links should get
    report = []
    for root, members in segments.items():
        values = [mtu[m] for m in members if m in mtu]
        if not values:
            continue
        want = max(set(values), key=lambda v: (values.count(v), v))
        seg_mtu[root], seg_want[root] = min(values), want
        report.append({"links": {_label(*m): mtu.get(m) for m in sorted(members)},
                       "underlay": root in underlay_roots})
        odd = [m for m in members if m in mtu and mtu[m] != want and kinds.get(m) != "bridge"]
        if odd:
            problems.append("MTUs differ inside one L2 segment: " +
                            ", ".join(f"{_label(*m)} {mtu[m]}" for m in odd) + f" vs {want}")
            for ns, name in odd:
                fixes.append(f"ip {'-n ' + ns + ' ' if ns else ''}link set {name} mtu {want}")
                changes.append(FixChange("mtu", want, name, netns=ns or None))
    for over, under, overhead in tunnels:
        o, u = mtu.get(over), seg_want.get(sets.find(under))
        if o is not None and u is not None and u < o + overhead:
            problems.append(f"{_label(*over)} MTU {o} needs an underlay of {o + overhead}, has {u}")
            fixes.append(f"ip {'-n ' + over[0] + ' ' if over[0] else ''}link set {over[1]} mtu {u - overhead}")
    path_mtus = sorted({v for r, v in seg_mtu.items() if r not in underlay_roots})
    evidence = {"namespaces": sorted(spaces), "unreachable": unreachable, "segments": report,
                "path_mtus": path_mtus, "path_mtu": path_mtus[0] if path_mtus else None}
    where = f"{len(spaces)} namespace(s), {len(report)} segment(s)"
    if problems:
        return Outcome("fail", "; ".join(problems) + f" ({where})", evidence, fix="; ".join(fixes), changes=changes)
    if len(path_mtus) > 1:
        return Outcome("warn", f"path mixes MTUs {', '.join(map(str, path_mtus))}: the smallest, {path_mtus[0]}, "
                               f"holds only while ICMP frag-needed reaches senders ({where})", evidence,
                       fix=f"offlab mtu probe DEST to confirm; or set every segment to {path_mtus[0]}")
    return Outcome("ok", f"MTU {path_mtus[0] if path_mtus else '?'} end to end over {where}", evidence)
