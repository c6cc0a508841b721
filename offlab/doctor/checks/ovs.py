"""The OVS userspace-datapath-over-veth checksum trap (seed 004's switch, offlab's `ovs` lab).

A veth that sends with tx checksum offload hands OVS a frame whose TCP/UDP
checksum is still only partial; the userspace datapath (datapath_type=netdev)
forwards it as is and the receiver drops it. Pings pass, TCP stalls. The veth
that feeds the bridge port — the port's peer — must have tx checksumming off.
"""

from __future__ import annotations

from offlab import netdev
from offlab.doctor import parse
from offlab.doctor.model import FixChange, Outcome
from offlab.doctor.registry import Context, Skip, check, no_data


def _ours(ctx: Context, pid: int) -> bool:
    """Whether ovs-vswitchd `pid` runs in the namespace being audited."""
    out = ctx.run(["ip", "netns", "identify", str(pid)])
    names = out.stdout.split() if out is not None else []
    return ctx.netns in names if ctx.netns else not names


def _ctl(ctx: Context, pid: int) -> str:
    argv = (ctx.read(f"/proc/{pid}/cmdline") or "").split("\0")
    for arg in argv:
        if arg.startswith("--unixctl="):
            return arg.split("=", 1)[1]
    return f"/var/run/openvswitch/ovs-vswitchd.{pid}.ctl"


def _peer_tx(ctx: Context, port: netdev.Link) -> dict:
    """Find the veth peer of an OVS port and read its tx-checksumming."""
    index, nsid = port.link_index, port.link_netnsid
    entry = {"port": port.ifname, "peer": None, "peer_netns": None, "tx_checksumming": None}
    if index is None:
        return entry
    if nsid is None:
        peer = next((l.ifname for l in ctx.links if l.ifindex == index), None)
        if peer:
            f = ctx.features(peer).get("tx-checksumming")
            entry.update(peer=peer, tx_checksumming=None if f is None else f.active)
        return entry
    out = ctx.run(["ip", "netns", "list"])
    peer_ns = parse.netns_ids(out.stdout).get(nsid) if out is not None and out.ok else None
    entry["peer_netns"] = peer_ns or f"nsid {nsid}"
    if peer_ns is None:
        return entry
    res = ctx.run(netdev.ip_argv("link", "show", netns=peer_ns))
    if res is None or not res.ok:
        return entry
    peer = next((l.ifname for l in netdev.parse_links(res.stdout) if l.ifindex == index), None)
    if peer is None:
        return entry
    k = ctx.run(["ip", "netns", "exec", peer_ns, "ethtool", "-k", peer])
    if k is not None and k.ok:
        f = netdev.parse_features(k.stdout).get("tx-checksumming")
        entry.update(peer=peer, tx_checksumming=None if f is None else f.active)
    else:
        entry["peer"] = peer
    return entry


def _vswitchd_from_ps(ctx: Context) -> Outcome:
    """A sosreport: ps says whether ovs-vswitchd ran; the ports' peers need live ethtool, so that part is no data."""
    for argv in (["ps", "auxwwwm"], ["ps", "auxwww"]):
        ps = ctx.run(argv)
        procs = parse.ps_processes(ps.stdout) if ps is not None and ps.ok else []
        if procs:
            pids = [pid for pid, cmd in procs if cmd.split()[0].rsplit("/", 1)[-1] == "ovs-vswitchd"]
            if not pids:
                return Outcome("ok", "no ovs-vswitchd running (ps)", {"vswitchd": []})
            raise no_data(f"ovs-vswitchd ran (pid {pids[0]}) but its ports' veth peers cannot be read here")
    raise no_data("no process list (pgrep, or ps auxwwwm / ps auxwww in a sosreport)")


@check("ovs.veth-csum", area="ovs", title="OVS userspace bridge over veth: tx checksum trap", tier=None,
       needs_root=True,
       why="the userspace datapath forwards veth frames with partial checksums untouched, so TCP is "
           "black-holed unless tx checksumming is off on the veth feeding each port")
def veth_csum(ctx: Context) -> Outcome:
    out = ctx.run(["pgrep", "-x", "ovs-vswitchd"])
    if out is None:
        return _vswitchd_from_ps(ctx)
    pids = [p for p, _ in parse.pgrep_list(out.stdout)]
    if not pids:
        return Outcome("ok", "no ovs-vswitchd running", {"vswitchd": []})
    ours = [p for p in pids if _ours(ctx, p)]
    if not ours:
        return Outcome("ok", f"no ovs-vswitchd in this namespace ({len(pids)} elsewhere)", {"vswitchd": []})
    bridges: dict[str, list[dict]] = {}
    unanswered = []
    for pid in ours:
        show = ctx.run(["ovs-appctl", "-t", _ctl(ctx, pid), "dpif/show"])
        if show is None or not show.ok:
            unanswered.append(pid)
            continue
        for dp, brs in parse.dpif_show(show.stdout).items():
            if not dp.startswith("netdev@"):
                continue
            for br, ports in brs.items():
                veths = [ctx.link(p) for p in ports]
                veths = [l for l in veths if l and l.kind == "veth"]
                bridges[br] = [_peer_tx(ctx, l) for l in veths]
    if unanswered and not bridges:
        raise Skip(f"ovs-vswitchd (pid {', '.join(map(str, unanswered))}) does not answer ovs-appctl dpif/show")
    evidence = {"vswitchd": ours, "netdev_bridges": bridges}
    if not bridges:
        return Outcome("ok", "ovs-vswitchd has no userspace (netdev) bridge", evidence)
    ports = [e for entries in bridges.values() for e in entries]
    if not ports:
        return Outcome("ok", f"userspace bridge(s) {', '.join(bridges)} have no veth ports", evidence)
    bad = [e for e in ports if e["tx_checksumming"]]
    unknown = [e for e in ports if e["tx_checksumming"] is None]
    if bad:
        fixes, changes = [], []
        for e in bad:
            ns = e["peer_netns"]
            fixes.append((f"ip netns exec {ns} " if ns else "") + f"ethtool -K {e['peer']} tx off")
            changes.append(FixChange("tx-checksumming", "off", e["peer"], netns=ns))
        names = ", ".join(f"{e['peer']} (peer of {e['port']}{', ' + e['peer_netns'] if e['peer_netns'] else ''})"
                          for e in bad)
        return Outcome("fail", f"tx checksumming on at {names}: TCP through the userspace bridge stalls",
                       evidence, fix="; ".join(fixes), changes=changes)
    if unknown:
        names = ", ".join(e["port"] for e in unknown)
        return Outcome("warn", f"cannot see the veth peer of {names}: check tx checksumming is off there",
                       evidence, fix="ethtool -K PEER tx off   # in the peer's namespace")
    return Outcome("ok", f"{len(ports)} veth ports on {', '.join(bridges)}: every peer has tx checksumming off",
                   evidence)
