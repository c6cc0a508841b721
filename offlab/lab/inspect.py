"""What a lab looks like right now: hosts, interfaces, addresses, MTUs, offloads."""

from __future__ import annotations

from offlab import netdev
from offlab.dpdk import Testpmd
from offlab.catalog import TOPOLOGIES
from offlab.feature_names import shown_name
from offlab.lab.model import LabState

# The features worth a glance in the text view, by the short names people type → the name ethtool shows.
SUMMARY_FEATURES = {short: shown_name(short)
                    for short in ("tx-csum", "sg", "tso", "gso", "gro", "uso", "gro-list", "udp-gro-fwd", "tnl-seg")}


def _with_effective(qmp: str | None, nic: dict) -> dict:
    """A guest NIC with every chain property as QEMU has it (defaults included), read over QMP."""
    from offlab.lab.explain import effective_properties
    from offlab.vm.qmp import QmpError

    nic = dict(nic)
    if not qmp or not nic.get("device_id"):
        nic["effective_properties"] = None
        nic["effective_properties_error"] = "no QMP socket or device id (a guest from before they existed)"
        return nic
    try:
        props = effective_properties(qmp, nic["device_id"])
    except QmpError as exc:
        nic["effective_properties"], nic["effective_properties_error"] = None, str(exc)
        return nic
    nic["effective_properties"] = {k: ("on" if v else "off") if isinstance(v, bool) else v for k, v in props.items()}
    return nic


def describe(lab: LabState, *, with_features: bool = True) -> dict:
    """The `lab show --json` contract but for "changes", which the caller adds from knobs."""
    hosts = {}
    for role, entry in lab.hosts.items():
        host = lab.host(role)
        by_name = {l.ifname: l for l in netdev.links(host)}
        ifaces = []
        for iface in entry.interfaces:
            info = by_name.get(iface.name)
            item = {
                "name": iface.name,
                "kind": iface.kind,
                "mtu": info.mtu if info else None,
                "state": info.operstate if info else None,
                "addresses": [a.cidr for a in info.addrs if a.scope == "global"] if info else [],
            }
            if iface.peer_host:
                item["peer_host"] = iface.peer_host
            if info and info.master:
                item["master"] = info.master
            if with_features and info:
                feats = netdev.features(host, iface.name)
                item["features"] = {k: f.active for k, f in feats.items()}
                item["fixed"] = sorted(k for k, f in feats.items() if f.fixed)
            ifaces.append(item)
        h = {"netns": entry.netns, "interfaces": ifaces}
        if entry.ref is not None:
            h["kind"] = entry.ref.get("kind")
        if entry.guest:
            h["guest"] = {k: v for k, v in entry.guest.items() if k != "ref"}
            h["guest"]["nics"] = [_with_effective(entry.guest.get("qmp"), nic) for nic in entry.guest.get("nics", [])]
        if entry.address:
            h["address"] = entry.address
        if entry.address6:
            h["address6"] = entry.address6
        hosts[role] = h
    out = {
        "name": lab.name,
        "topology": lab.topology,
        "mtu": lab.mtu,
        "ipv6": lab.ipv6,
        "status": lab.status,
        "options": lab.options,
        "hosts": hosts,
        "daemons": [{"name": d.name, "pid": d.pid} for d in lab.daemons],
        "adjustments": [a.__dict__ for a in lab.adjustments],
    }
    testpmd = Testpmd.for_lab(lab.name) if lab.has_testpmd else None
    if testpmd is not None:
        out["testpmd"] = testpmd.describe()
    record = TOPOLOGIES.get(lab.topology)  # a `hosts` lab has none
    if record is not None and record.ovs_dpdk:
        from offlab.lab import ovs_dpdk

        out["ovs"] = ovs_dpdk.describe(lab)
    return out
