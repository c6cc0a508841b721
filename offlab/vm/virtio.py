"""The virtio-net negotiation chain of one guest NIC, built from what was read (pure functions).

    QEMU property (effective value; set or QEMU's default)
      → virtio feature bit offered by the device (QMP x-query-virtio-status host-features)
      → accepted by the guest's driver (/sys/class/net/IF/device/features, a bit string)
      → the guest's ethtool feature (guest → host direction: host_* bits)
      → the tap's offload flags, which QEMU sets with TUNSETOFFLOAD from the accepted guest_* bits
        (host → guest direction)

Each row says why the features at its end are what they are ("tx-udp-segmentation off [fixed]:
host_uso=off, VIRTIO_NET_F_HOST_USO (bit 56) not offered"). Bit numbers: Linux
include/uapi/linux/virtio_net.h (and virtio_config.h for the transport bits).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from offlab.feature_names import KERNEL_TO_LONG
from offlab.netdev import Feature

if TYPE_CHECKING:
    from offlab.sample import GuestNic

# Bit → name, for the device's own bits and the transport bits QEMU lists beside them.
BIT_NAMES: dict[int, str] = {
    0: "VIRTIO_NET_F_CSUM", 1: "VIRTIO_NET_F_GUEST_CSUM", 2: "VIRTIO_NET_F_CTRL_GUEST_OFFLOADS",
    3: "VIRTIO_NET_F_MTU", 5: "VIRTIO_NET_F_MAC", 6: "VIRTIO_NET_F_GSO", 7: "VIRTIO_NET_F_GUEST_TSO4",
    8: "VIRTIO_NET_F_GUEST_TSO6", 9: "VIRTIO_NET_F_GUEST_ECN", 10: "VIRTIO_NET_F_GUEST_UFO",
    11: "VIRTIO_NET_F_HOST_TSO4", 12: "VIRTIO_NET_F_HOST_TSO6", 13: "VIRTIO_NET_F_HOST_ECN",
    14: "VIRTIO_NET_F_HOST_UFO", 15: "VIRTIO_NET_F_MRG_RXBUF", 16: "VIRTIO_NET_F_STATUS",
    17: "VIRTIO_NET_F_CTRL_VQ", 18: "VIRTIO_NET_F_CTRL_RX", 19: "VIRTIO_NET_F_CTRL_VLAN",
    20: "VIRTIO_NET_F_CTRL_RX_EXTRA", 21: "VIRTIO_NET_F_GUEST_ANNOUNCE", 22: "VIRTIO_NET_F_MQ",
    23: "VIRTIO_NET_F_CTRL_MAC_ADDR", 24: "VIRTIO_F_NOTIFY_ON_EMPTY", 27: "VIRTIO_F_ANY_LAYOUT",
    28: "VIRTIO_RING_F_INDIRECT_DESC", 29: "VIRTIO_RING_F_EVENT_IDX", 30: "VHOST_USER_F_PROTOCOL_FEATURES",
    32: "VIRTIO_F_VERSION_1", 33: "VIRTIO_F_ACCESS_PLATFORM", 34: "VIRTIO_F_RING_PACKED",
    35: "VIRTIO_F_IN_ORDER", 36: "VIRTIO_F_ORDER_PLATFORM", 37: "VIRTIO_F_SR_IOV",
    38: "VIRTIO_F_NOTIFICATION_DATA", 40: "VIRTIO_F_RING_RESET", 50: "VIRTIO_NET_F_DEVICE_STATS",
    52: "VIRTIO_NET_F_VQ_NOTF_COAL", 53: "VIRTIO_NET_F_NOTF_COAL", 54: "VIRTIO_NET_F_GUEST_USO4",
    55: "VIRTIO_NET_F_GUEST_USO6", 56: "VIRTIO_NET_F_HOST_USO", 57: "VIRTIO_NET_F_HASH_REPORT",
    59: "VIRTIO_NET_F_GUEST_HDRLEN", 60: "VIRTIO_NET_F_RSS", 61: "VIRTIO_NET_F_RSC_EXT",
    62: "VIRTIO_NET_F_STANDBY", 63: "VIRTIO_NET_F_SPEED_DUPLEX",
}
BIT_OF = {name: bit for bit, name in BIT_NAMES.items()}


@dataclass(frozen=True)
class Link:
    """One QEMU property and what it reaches: its bit, the guest's features, the tap's."""

    prop: str
    bit: int
    guest: tuple[str, ...] = ()  # the guest's ethtool features this bit makes possible
    tap: tuple[str, ...] = ()  # the tap's features QEMU's TUNSETOFFLOAD turns on with this bit
    needs: tuple[int, ...] = ()  # bits it is useless without (the driver or QEMU drops it)
    note: str = ""


# virtio_net (Linux 6.12) and QEMU 10's tap backend; the tap's flags govern host → guest (what the
# host may hand QEMU unsegmented), the guest's tx features guest → host.
LINKS: tuple[Link, ...] = (
    Link("csum", 0, guest=("tx-checksum-ip-generic", "tx-scatter-gather"),
         note="the device takes partially checksummed packets: every guest tx offload needs it"),
    Link("guest_csum", 1, guest=("rx-checksum",), tap=("tx-checksum-ip-generic",),
         note="the guest takes partially checksummed packets: every tap (host → guest) offload needs it"),
    Link("host_tso4", 11, guest=("tx-tcp-segmentation",), needs=(0,)),
    Link("host_tso6", 12, guest=("tx-tcp6-segmentation",), needs=(0,)),
    Link("host_ecn", 13, guest=("tx-tcp-ecn-segmentation",), needs=(0,)),
    Link("host_ufo", 14, needs=(0,), note="Linux guests no longer send UFO (removed in 4.14): no guest feature"),
    Link("host_uso", 56, guest=("tx-udp-segmentation",), needs=(0,)),
    Link("guest_tso4", 7, guest=("rx-gro-hw",), tap=("tx-tcp-segmentation",), needs=(1,)),
    Link("guest_tso6", 8, guest=("rx-gro-hw",), tap=("tx-tcp6-segmentation",), needs=(1,)),
    Link("guest_ecn", 9, tap=("tx-tcp-ecn-segmentation",), needs=(7,)),
    Link("guest_ufo", 10, needs=(1,), note="the tap has no UFO flag any more (TUN_F_UFO is ignored)"),
    Link("guest_uso4", 54, tap=("tx-udp-segmentation",), needs=(1,),
         note="the tap turns USO on only with both guest_uso4 and guest_uso6"),
    Link("guest_uso6", 55, tap=("tx-udp-segmentation",), needs=(1,),
         note="the tap turns USO on only with both guest_uso4 and guest_uso6"),
    Link("mrg_rxbuf", 15, note="merged receive buffers: without it a guest that takes TSO posts 64 KiB buffers"),
    Link("ctrl_vq", 17, note="the control queue that mq and ctrl_guest_offloads need"),
    Link("mq", 22, needs=(17,), note="multiqueue: the guest's `ethtool -l` combined channels"),
    Link("ctrl_guest_offloads", 2, guest=("rx-gro-hw",), needs=(17,),
         note="lets the guest switch its receive offloads (rx-gro-hw) at run time; QEMU then redoes the "
              "tap's TUNSETOFFLOAD"),
)

# The tap's USO flag needs both bits: tun turns NETIF_F_GSO_UDP_L4 on only for TUN_F_USO4|TUN_F_USO6.
_TAP_NEEDS_ALL = {"tx-udp-segmentation": (54, 55), "tx-checksum-ip-generic": (1,)}
_TAP_NEEDS_CSUM = 1


def parse_sysfs_features(text: str) -> set[int]:
    """/sys/bus/virtio/devices/virtioN/features: '0'/'1' per bit, bit 0 first → the set bits."""
    bits = text.strip()
    if not re.fullmatch(r"[01]+", bits):
        raise ValueError(f"not a virtio feature bit string: {bits[:40]!r}")
    return {i for i, c in enumerate(bits) if c == "1"}


def parse_status_features(block: dict) -> set[int]:
    """A `dev-features` + `transports` block of x-query-virtio-status → the bits it names.

    QEMU 10.0 prints bit 55 as "VIRTIO_NET_F_GUEST_USO4: Driver can receive USOv6" (its name table
    repeats USO4); the description tells them apart."""
    bits: set[int] = set()
    for entry in [*block.get("dev-features", []), *block.get("transports", [])]:
        name, _, desc = entry.partition(":")
        name = name.strip()
        if name == "VIRTIO_NET_F_GUEST_USO4" and "USOv6" in desc:
            name = "VIRTIO_NET_F_GUEST_USO6"
        if name in BIT_OF:
            bits.add(BIT_OF[name])
    unknown = block.get("unknown-dev-features") or 0
    bits |= {i for i in range(64) if unknown >> i & 1}
    return bits


@dataclass
class Row:
    """One property's chain, with the reason for what shows at its ends."""

    prop: str
    value: str | None  # effective value from QEMU (None: unread)
    source: str  # "set" (on the command line or a plan) | "default" | "unread" | "absent" (QEMU has no such property)
    bit: int
    bit_name: str
    offered: bool | None
    accepted: bool | None
    guest: dict[str, str] = field(default_factory=dict)  # feature → "on" / "off [fixed]" ...
    tap: dict[str, str] = field(default_factory=dict)
    why: str = ""
    # Which side of the chain lacks the bit: "QEMU" (no such property in this version), "QEMU setting"
    # (the property is off), "backend" (on, yet not offered), "guest driver" (offered, not accepted), "".
    lacking: str = ""


@dataclass
class NicChain:
    """The chain of one guest NIC: where it is, and one Row per property."""

    role: str
    iface: str
    device_id: str
    tap: str | None
    tap_host: str | None
    rows: list[Row]
    problems: list[str] = field(default_factory=list)  # what could not be read, and why
    backend: str = ""  # "tap olv0 in server" | "vhost-user /run/.../vhost0.sock"

    def row(self, prop: str) -> Row:
        return next(r for r in self.rows if r.prop == prop)

    def to_json(self) -> dict:
        return asdict(self)

    def stored(self) -> GuestNic:
        """This chain as a sample holds it (`guests[role].nics`)."""
        from offlab.sample import GuestNic  # here: the sample's records only where a sample is made

        return GuestNic.from_json(self.to_json())

    def lines(self) -> list[str]:
        """Text for people: a table of the properties, then the reason of every row where something
        is off, fixed, not offered or not accepted (all reasons are in the JSON)."""
        head = f"{self.role}:{self.iface}  QEMU device {self.device_id}"
        head += f", {self.backend}" if self.backend else ""
        out = [head, f"  {'property':<20} {'value':<5} {'from':<7} {'bit':>3} {'offered':<7} {'accepted':<8} "
                     f"{'lacking':<12} guest ethtool / tap ethtool"]
        for r in self.rows:
            ends = "; ".join(filter(None, [", ".join(f"{k} {v}" for k, v in r.guest.items()),
                                           ", ".join(f"tap {k} {v}" for k, v in r.tap.items())]))
            out.append(f"  {r.prop:<20} {r.value or '-' if r.source == 'absent' else r.value or '?':<5} "
                       f"{r.source:<7} {r.bit:>3} {_yn(r.offered):<7} {_yn(r.accepted):<8} {r.lacking or '-':<12} "
                       f"{ends or '-'}")
        notable = [r for r in self.rows if r.offered is False and r.value != "off" or r.accepted is False
                   or r.value == "off" or any("off" in v for v in [*r.guest.values(), *r.tap.values()])]
        out += [f"  why: {r.why}" for r in notable]
        out += [f"  could not read: {p}" for p in self.problems]
        return out


def _yn(flag: bool | None) -> str:
    return "?" if flag is None else ("yes" if flag else "no")


def show_feature(f: Feature | None) -> str:
    if f is None:
        return "absent"
    return ("on" if f.active else "off") + (" [fixed]" if f.fixed else "") + \
        (f" [requested {'on' if f.requested else 'off'}]" if f.requested is not None and f.requested != f.active
         and not f.fixed else "")


def _qemu_value(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def build(*, role: str, iface: str, device_id: str, effective: dict[str, object], set_props: dict[str, str],
          offered: set[int] | None, accepted: set[int] | None, guest_feats: dict[str, Feature] | None,
          tap_feats: dict[str, Feature] | None, tap: str | None = None, tap_host: str | None = None,
          problems: list[str] = (), vhost_user: str | None = None, backend_bits: set[int] | None = None,
          absent: set[str] = frozenset(), qemu_version: str = "") -> NicChain:
    """The chain from what was read; any input may be None (unread), the reasons then say less.
    `backend_bits`: what a vhost-user backend offers QEMU (x-query-virtio-status backend-features);
    `absent`: the chain's properties this QEMU (`qemu_version`) does not have at all."""
    backend = f"tap {tap} in {tap_host}" if tap else (f"vhost-user {vhost_user}" if vhost_user else "")
    rows = []
    for link in LINKS:
        value = _qemu_value(effective.get(link.prop))
        source = "absent" if link.prop in absent else \
            "set" if link.prop in set_props else ("default" if value is not None else "unread")
        if value is None and link.prop in set_props:
            value = set_props[link.prop]
        row = Row(link.prop, value, source, link.bit, BIT_NAMES[link.bit],
                  None if offered is None else link.bit in offered,
                  None if accepted is None else link.bit in accepted)
        if guest_feats is not None:
            row.guest = {g: show_feature(_leaf(guest_feats, g)) for g in link.guest}
        if tap_feats is not None:
            row.tap = {t: show_feature(_leaf(tap_feats, t)) for t in link.tap}
        row.why = _why(link, row, offered, accepted, guest_feats, tap_feats, iface,
                       _lacks(link.bit, tap, vhost_user, backend_bits), qemu_version)
        row.lacking = _lacking(row)
        rows.append(row)
    return NicChain(role, iface, device_id, tap, tap_host, rows, list(problems), backend)


def _lacking(row: Row) -> str:
    """The side of the chain that lacks the bit, for people and for a skipped cell's reason."""
    if row.offered is False:
        return "QEMU" if row.source == "absent" else ("QEMU setting" if row.value == "off" else "backend")
    if row.accepted is False:
        return "guest driver"
    return ""


def _lacks(bit: int, tap: str | None, vhost_user: str | None, backend_bits: set[int] | None) -> str:
    """Why a device with the property on still did not offer the bit: what its backend lacks."""
    if vhost_user:
        if backend_bits and bit not in backend_bits:
            return "the vhost-user backend does not offer it (its backend-features lack the bit)"
        return "the vhost-user backend does not offer it"
    if tap:
        return "the tap backend lacks it (no vnet_hdr, or this host kernel's tun has no such offload)"
    return "the backend lacks it"


def _leaf(feats: dict[str, Feature], name: str) -> Feature | None:
    # ethtool shows rx-checksum under its legacy long name
    return feats.get(name) or feats.get(KERNEL_TO_LONG.get(name, ""))


def _why(link: Link, row: Row, offered: set[int] | None, accepted: set[int] | None,
         guest_feats: dict[str, Feature] | None, tap_feats: dict[str, Feature] | None, iface: str,
         lacks: str, qemu_version: str = "") -> str:
    setting = f"{link.prop}={row.value or '?'}" + (" (QEMU's default)" if row.source == "default" else "")
    bit = f"{BIT_NAMES[link.bit]} (bit {link.bit})"
    ends = ", ".join(f"{k} {v}" for k, v in [*row.guest.items(), *row.tap.items()])
    missing = [BIT_NAMES[b] for b in link.needs if accepted is not None and b not in accepted]
    lead = f"{ends}: " if ends else ""
    if row.source == "absent":
        return (lead + f"QEMU {qemu_version or '(this version)'} has no property {link.prop}: {bit} not offered "
                f"(QEMU does not offer it)" + (f"; {link.note}" if link.note else ""))
    if row.offered is False:
        cause = (f"{setting}, {bit} not offered" if row.value == "off" else
                 f"{setting} but {bit} not offered: {lacks}" if row.value == "on" else f"{bit} not offered")
        note = link.note if link.note and (row.tap or "tap" not in link.note) else ""
        return lead + cause + (f"; {note}" if note else "")
    if row.accepted is False:
        why = f"{setting}, {bit} offered by QEMU, not accepted by the guest's driver"
        why += (f" (it needs {', '.join(missing)}, not accepted)" if missing else
                " (its virtio_net does not know or want it)")
        return lead + why + (f"; {link.note}" if link.note else "")
    if row.accepted is None:
        return f"{setting}: {bit} offered {_yn(row.offered)}, accepted unknown" + (f"; {link.note}" if link.note else "")
    parts = [f"{setting}: {bit} offered and accepted"]
    for name, text in row.guest.items():
        parts.append(_guest_reason(name, text, link, accepted, missing, iface))
    for name, text in row.tap.items():
        parts.append(_tap_reason(name, text, accepted, guest_feats))
    if link.note:
        parts.append(link.note)
    return "; ".join(p for p in parts if p)


def _guest_reason(name: str, text: str, link: Link, accepted: set[int], missing: list[str], iface: str) -> str:
    if text == "absent":
        return f"the guest has no {name}"
    if text.startswith("on"):
        return f"guest {name} {text}"
    if "[fixed]" in text:
        if missing:
            return f"guest {name} {text}: it also needs {', '.join(missing)}"
        if name == "rx-gro-hw" and 2 not in accepted:
            return f"guest {name} {text}: without VIRTIO_NET_F_CTRL_GUEST_OFFLOADS the guest cannot switch it"
        return f"guest {name} {text}: the guest's driver keeps it"
    return (f"guest {name} {text}: negotiated, off inside the guest (switched off there, or its driver does "
            f"not turn it on by itself): `ethtool -K {iface} {name} on` in the guest turns it on")


def _tap_reason(name: str, text: str, accepted: set[int], guest_feats: dict[str, Feature] | None) -> str:
    needs = _TAP_NEEDS_ALL.get(name, ())
    lacking = [BIT_NAMES[b] for b in (*needs, _TAP_NEEDS_CSUM) if b not in accepted]
    if text.startswith("on"):
        return f"tap {name} {text} (QEMU's TUNSETOFFLOAD from the accepted bits)"
    if lacking:
        return f"tap {name} {text}: TUNSETOFFLOAD leaves it out without {', '.join(dict.fromkeys(lacking))}"
    gro_hw = (guest_feats or {}).get("rx-gro-hw")
    if gro_hw is not None and not gro_hw.active and 2 in accepted:
        return (f"tap {name} {text}: the guest switched its rx-gro-hw off, and over the control queue "
                f"(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS) QEMU took the tap's offloads back")
    return f"tap {name} {text}: negotiated, yet off: the tap was changed by hand (ethtool -K)"
