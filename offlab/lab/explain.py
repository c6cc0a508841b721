"""`lab explain`: why a lab's offload features are what they are.

For a guest NIC, the virtio-net chain (offlab.vm.virtio): QEMU property → feature bit offered →
accepted → guest ethtool feature, and the tap's flags; read from QEMU's monitor (QMP), the
guest's sysfs and ethtool, and the tap's ethtool. For every interface, the features the kernel
holds off although requested on, with the feature each needs (netdev.held_off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from offlab import netdev
from offlab.errors import OfflabError
from offlab.lab.model import LabState
from offlab.vm import virtio
from offlab.vm.qmp import Qmp, QmpError

if TYPE_CHECKING:
    from offlab.sample import GuestNic


@dataclass
class HeldOff:
    role: str
    iface: str
    features: dict[str, str]  # feature → why the kernel keeps it off although requested on


@dataclass
class Explanation:
    lab: str
    nics: list[virtio.NicChain] = field(default_factory=list)
    held_off: list[HeldOff] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"lab": self.lab, "nics": [n.to_json() for n in self.nics],
                "held_off": [h.__dict__ for h in self.held_off]}

    def lines(self) -> list[str]:
        out = []
        for nic in self.nics:
            out += nic.lines()
        for h in self.held_off:
            for name, why in h.features.items():
                out.append(f"{h.role}:{h.iface} {name} off [requested on]: {why}")
        if not out:
            out.append(f"lab {self.lab}: no guest NIC here, and no feature that the kernel holds off against its "
                       f"request (`offlab lab show {self.lab}` lists the features)")
        return out


def explain(lab: LabState, role: str | None = None, iface: str | None = None) -> Explanation:
    """The chains of the guest NICs (of `role`, `iface` if given) and the held-off features of every
    interface in scope; what could not be read is named in the chain, never left out silently."""
    roles = [role] if role is not None else list(lab.hosts)
    for r in roles:
        lab.entry(r)  # BadInput naming the hosts there are
    if iface is not None:
        iface = lab.resolve_iface(roles[0], iface)
    out = Explanation(lab.name)
    for r in roles:
        entry = lab.entry(r)
        for nic in guest_nics(lab, r):
            if iface is None or nic["iface"] == iface:
                out.nics.append(nic_chain(lab, r, nic))
        if role is not None:  # a hypervisor-side host: the chains of the guest NICs whose taps it holds
            for g in lab.hosts:
                for nic in guest_nics(lab, g):
                    tap = nic.get("tap")
                    if g != r and tap and tap_home(lab, tap) == r and (iface is None or iface == tap):
                        out.nics.append(nic_chain(lab, g, nic))
        for i in entry.interfaces:
            if iface is not None and i.name != iface:
                continue
            try:
                feats = netdev.features(lab.host(r), i.name)
            except (OfflabError, OSError):
                continue  # an interface gone or unreadable has nothing held off to show
            held = netdev.held_off(feats)
            if held:
                out.held_off.append(HeldOff(r, i.name, held))
    return out


def guest_nics(lab: LabState, role: str) -> list[dict]:
    """The NICs recorded for a guest host (none for a namespace or SSH host)."""
    guest = lab.entry(role).guest or {}
    return list(guest.get("nics") or [])


def tap_home(lab: LabState, tap: str) -> str | None:
    """The role whose namespace holds `tap` now (vm-router moves taps out of QEMU's namespace)."""
    return next((r for r, e in lab.hosts.items() for i in e.interfaces if i.name == tap and i.kind == "tap"), None)


def effective_properties(qmp_path: str, device_id: str) -> dict[str, object]:
    """Every chain property as the running device has it (defaults included), by QOM path."""
    with Qmp(qmp_path) as q:
        return _qom_props(q, device_id)


def _qom_props(q: Qmp, device_id: str) -> dict[str, object]:
    """The chain's properties the device has (an older QEMU lacks some: 7.2 has no host_uso)."""
    path = f"/machine/peripheral/{device_id}"
    has = {p["name"] for p in q.execute("qom-list", path=path)}  # type: ignore[union-attr]
    return {link.prop: q.execute("qom-get", path=path, property=link.prop)
            for link in virtio.LINKS if link.prop in has}


def _virtio_path(q: Qmp, device_id: str) -> str:
    """The virtio device under the NIC's QOM path (…/nicI/virtio-backend on PCI, …/nicI on MMIO)."""
    base = f"/machine/peripheral/{device_id}"
    for dev in q.execute("x-query-virtio"):  # type: ignore[union-attr]
        if dev["path"] == base or dev["path"].startswith(base + "/"):
            return dev["path"]
    raise QmpError(f"QEMU lists no virtio device under {base}")


def read_qemu(qmp_path: str | None, device_id: str) -> tuple[dict, dict | None, list[str]]:
    """(effective properties, x-query-virtio-status, problems) for one NIC."""
    if not qmp_path:
        return {}, None, ["QEMU has no monitor socket (a guest started before offlab had one): "
                          "`offlab lab down` and `lab up` again"]
    try:
        with Qmp(qmp_path) as q:
            props = _qom_props(q, device_id)
            status = q.execute("x-query-virtio-status", path=_virtio_path(q, device_id))
        return props, status, []  # type: ignore[return-value]
    except QmpError as exc:
        return {}, None, [str(exc)]


def nic_chain(lab: LabState, role: str, nic: dict) -> virtio.NicChain:
    """Read one guest NIC's chain: QEMU (QMP), the guest (MAC, sysfs features, ethtool), the tap."""
    guest = lab.entry(role).guest or {}
    device_id = nic.get("device_id") or ""
    problems: list[str] = []
    props, status, more = read_qemu(guest.get("qmp"), device_id) if device_id else (
        {}, None, ["the NIC has no QEMU id (a guest started before offlab gave NICs ids): lab down and up again"])
    problems += more
    offered = virtio.parse_status_features(status["host-features"]) if status else None
    host = lab.host(role)
    accepted, guest_feats = None, None
    name = nic["iface"]
    try:
        accepted = _accepted(host, guest.get("ref") or {}, name, nic["mac"])
        guest_feats = netdev.features(host, name)
    except (OfflabError, OSError, ValueError) as exc:
        problems.append(f"the guest's {name}: {exc}")
    if status and accepted is not None:
        qemu_view = virtio.parse_status_features(status["guest-features"])
        if qemu_view != accepted:
            problems.append(f"QEMU's accepted bits {sorted(qemu_view ^ accepted)} differ from the guest's sysfs")
    tap = nic.get("tap")
    tap_role = tap_home(lab, tap) if tap else None
    tap_feats = None
    if tap and tap_role:
        try:
            tap_feats = netdev.features(lab.host(tap_role), tap)
        except (OfflabError, OSError) as exc:
            problems.append(f"tap {tap}: {exc}")
    backend_bits = virtio.parse_status_features(status["backend-features"]) if status and \
        status.get("backend-features") else None
    absent = {link.prop for link in virtio.LINKS if link.prop not in props} if props else set()
    return virtio.build(role=role, iface=name, device_id=device_id, effective=props,
                        set_props=nic.get("properties") or {}, offered=offered, accepted=accepted,
                        guest_feats=guest_feats, tap_feats=tap_feats, tap=tap, tap_host=tap_role, problems=problems,
                        vhost_user=nic.get("vhost_user"), backend_bits=backend_bits, absent=absent,
                        qemu_version=guest.get("qemu_version") or "")


def lacking_reason(lab: LabState, role: str, iface: str, pattern: str) -> str:
    """Why a guest NIC's feature (an ethtool name, or a pattern such as tx-tcp*-segmentation) cannot
    be on, from the NIC's chain: the rows that reach such a feature and whose bit QEMU did not offer
    or the guest's driver did not accept ("" when the chain does not say, cannot be read, or `role`
    is no guest)."""

    if not (role in lab.hosts and lab.hosts[role].guest):
        return ""
    nic = next((n for n in guest_nics(lab, role) if n["iface"] == iface), None)
    if nic is None:
        return ""
    try:
        chain = nic_chain(lab, role, nic)
    except (OfflabError, OSError, ValueError):
        return ""
    links = {link.prop: link for link in virtio.LINKS}
    rows = [r for r in chain.rows if r.lacking and any(fnmatchcase(g, pattern) for g in links[r.prop].guest)]
    return "; ".join(r.why for r in rows)


def _accepted(host, ref: dict, iface: str, mac: str) -> set[int]:
    """The feature bits the guest's driver accepted for its NIC with this MAC (checked, not assumed)."""
    # Negotiated once, when the driver binds, so a sample reads them once per guest, not per sample
    # (each read is a round trip through the guest's agent, seconds on a loaded machine under TCG):
    # kept in the guest's memo, which ends with its lab (hosts/memo.py); a guest started again is
    # another host (its QEMU pid and start time), so its bits are read anew.
    key = ("accepted bits", iface, mac)
    known = ref.get("pid") is not None
    if known and (bits := host.memo.get(key)) is not None:
        return bits
    got = host.read(f"/sys/class/net/{iface}/address").strip()
    if got != mac:
        raise ValueError(f"it has MAC {got}, not the NIC's {mac}: the chain is not read")
    bits = virtio.parse_sysfs_features(host.read(f"/sys/class/net/{iface}/device/features"))
    if known:
        host.memo.put(key, bits)
    return bits


def guest_chains(lab: LabState) -> dict[str, list[GuestNic]]:
    """role → its NICs' chains as a sample holds them, for its record of how its guests ran."""
    out = {}
    for role in lab.hosts:
        nics = guest_nics(lab, role)
        if nics:
            out[role] = [nic_chain(lab, role, nic).stored() for nic in nics]
    return out


__all__ = ["Explanation", "explain", "guest_chains", "effective_properties", "lacking_reason", "nic_chain"]
