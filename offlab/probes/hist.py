"""The kernel's own account inside a host with a kernel of its own (a guest): tracefs hist triggers.

A guest's image carries no bpftrace and no compiler, but Debian's guest kernels (6.1 to 7.x cloud)
aggregate in the kernel themselves: CONFIG_HIST_TRIGGERS. For a sample offlab writes one named hist
trigger per count into the guest's tracefs (mounting it if it is not, and recording both in the
settings journal first: knobs/trace_hist.py puts them back, also after the controller was killed),
reads the `hist` files with the guest's counters at each edge of the window (the same agent request,
no fork) and takes the window's account as end − start, key by key:

- `skb:kfree_skb` by (reason, location.sym): skbs dropped, by the kernel's reason and function. A
  hist cannot read `skb_shinfo(skb)`: a dropped super-packet counts 1 here (bpftrace on this machine
  counts its segments);
- `net:net_dev_start_xmit` by (device, gso_type, gso_segs): skbs handed to each driver, and their
  segments exactly (Σ hits × max(gso_segs, 1));
- `net:net_dev_queue` by device, and again only for skbs longer than the largest MTU + 14 (a frame
  that size is a super-packet): what the stack handed the queue, before any software segmentation;
- `net:napi_gro_receive_entry` by device: frames NAPI handed GRO;
- `net:netif_receive_skb` by device, and again for skbs longer than a frame: what was passed up.

The tracepoints' own `gso_type` is a u16: a super-packet whose type bits are all above bit 15
(UDP_L4, UDP, FRAGLIST) reads 0 there; one of 0 with more than one segment is named `UDP_L4`, the
only one of those a sender's socket makes (docs/results.md). The reasons' numbers come from the
guest's BTF (`enum skb_drop_reason`): its kfree_skb format names them by enum symbols only, and
their numbering differs between kernels (NO_SOCKET is 2 on 6.1, 3 on 6.12).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from offlab.sample import TraceAccount
from offlab.tracefs import NAME_PREFIX, prefix

BTF = "/sys/kernel/btf/vmlinux"


# ---- the hist files -------------------------------------------------------------------------------

_INFO = re.compile(r"^# trigger info: hist:name=(\w+):")
_ENTRY = re.compile(r"^\{(.*)\}\s+(.*)$")
_SYM = re.compile(r"^\[[0-9a-f]+\]\s+(\S+)")


def _value(text: str) -> int | str:
    text = text.strip()
    m = _SYM.match(text)
    if m:  # location.sym: "[ffffffff81b2bcf5] __udp4_lib_rcv" (with .sym-offset: "fn+0x45/0x6b0")
        return m.group(1).split("+", 1)[0]
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def parse_hist(text: str, tag: str | None = None) -> dict[str, dict[tuple, dict[str, int]]]:
    """A `hist` file's text (one or more histograms) → {hist name: {key tuple: {"hitcount": n, val: n}}},
    for offlab's named histograms only; keys in the order the trigger names them. With `tag`, only those
    set for that host (tracefs.prefix), named without the tag (`offlab_drop`): another host's on the
    same kernel are left out."""
    out: dict[str, dict[tuple, dict[str, int]]] = {}
    current: dict[tuple, dict[str, int]] | None = None
    ours = prefix(tag) if tag is not None else NAME_PREFIX
    for line in text.splitlines():
        m = _INFO.match(line)
        if m:
            name = m.group(1)
            current = out.setdefault(NAME_PREFIX + name.removeprefix(ours), {}) if name.startswith(ours) else None
            continue
        m = _ENTRY.match(line.strip())
        if m is None or current is None:
            continue
        key = tuple(_value(part.split(":", 1)[1]) for part in _split_key(m.group(1)))
        vals = dict(zip(*[iter(m.group(2).replace(":", " ").split())] * 2, strict=False))
        current[key] = {k: int(v) for k, v in vals.items() if re.fullmatch(r"-?\d+", v)}
    return out


def _split_key(text: str) -> list[str]:
    """'name: eth0   , gso_type: 0, gso_segs: 44' → the 'field: value' parts (a key value holds no ', ')."""
    return [p for p in re.split(r"\s*,\s+(?=[a-z_][a-z0-9_.]*:)", text.strip()) if ":" in p]


def delta(a: dict, b: dict) -> dict[str, dict[tuple, dict[str, int]]]:
    """What was counted between two reads of the same histograms, key by key (a key first counted in
    the window is absent from `a`); entries that did not move are left out."""
    out: dict[str, dict[tuple, dict[str, int]]] = {}
    for name, entries in b.items():
        before = a.get(name, {})
        moved = {}
        for key, vals in entries.items():
            d = {k: v - before.get(key, {}).get(k, 0) for k, v in vals.items()}
            if d.get("hitcount", 0) > 0:
                moved[key] = d
        if moved:
            out[name] = moved
    return out


# ---- the reasons' names, from the guest's BTF -----------------------------------------------------

_BTF_MAGIC = 0xEB9F
_KIND_ENUM, _KIND_ENUM64 = 6, 19
# bytes each kind carries after its 12-byte header: fixed, and per member (vlen)
_TRAILER = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12),
            17: (4, 0), 19: (0, 12)}


def btf_enum(data: bytes, enum_name: str) -> dict[int, str]:
    """{value: member name} of the enum named `enum_name` in a kernel's raw BTF (/sys/kernel/btf/vmlinux)."""
    if len(data) < 24:
        raise ValueError("not BTF: too short")
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
    if magic != _BTF_MAGIC:
        raise ValueError(f"not BTF: magic {magic:#x}")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
    types, strings = hdr_len + type_off, hdr_len + str_off
    end = types + type_len

    def name(off: int) -> str:
        at = strings + off
        return data[at:data.index(b"\0", at)].decode()

    pos = types
    while pos + 12 <= end:
        name_off, info, _size = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        fixed, each = _TRAILER.get(kind, (0, 0))
        body = pos + 12
        if kind in (_KIND_ENUM, _KIND_ENUM64) and name_off and name(name_off) == enum_name:
            out = {}
            for i in range(vlen):
                if kind == _KIND_ENUM:
                    m_name, m_val = struct.unpack_from("<Ii", data, body + 8 * i)
                else:
                    m_name, lo, hi = struct.unpack_from("<III", data, body + 12 * i)
                    m_val = lo | hi << 32
                out[m_val] = name(m_name)
            return out
        pos = body + fixed + each * vlen
    raise ValueError(f"no enum {enum_name} in this BTF")


def drop_reasons(data: bytes) -> dict[int, str]:
    """{reason number: name as the kfree_skb format prints it} from a kernel's BTF."""
    members = btf_enum(data, "skb_drop_reason")
    return {v: n.removeprefix("SKB_DROP_REASON_") for v, n in members.items() if n.startswith("SKB_DROP_REASON_")}


# ---- the window's account, in the shape of this machine's (trace.account) -------------------------

def gso_type_name(field: int, segs: int) -> str:
    """The tracepoint's u16 gso_type as names; 0 with more than one segment: a type above bit 15 (UDP_L4)."""
    from offlab.probes.trace import gso_names

    if field == 0 and segs > 1:
        return "UDP_L4"
    return gso_names(field)


def account(d: dict[str, dict[tuple, dict[str, int]]], role: str, reasons: dict[int, str]) -> TraceAccount:
    """One host's window (delta) as rows of trace.account: drops (counted in skbs), queue, xmit, rx
    and gro_in. The segments of the super-packets a queue was handed, and of those passed up, are not in
    their tracepoints: they are inferred (`segments_inferred`), docs/results.md."""
    drops: list[dict[str, Any]] = [{"host": role, "device": None, "reason": reasons.get(int(r), str(r)), "location": loc or None,
              "datagrams": v["hitcount"], "unit": "skbs"}
             for (r, loc), v in d.get(f"{NAME_PREFIX}drop", {}).items()]
    drops.sort(key=lambda x: -x["datagrams"])
    xmit: dict[tuple[str, str], list[int]] = {}
    for (dev, gt, segs), v in d.get(f"{NAME_PREFIX}xmit", {}).items():
        row = xmit.setdefault((str(dev), gso_type_name(int(gt), int(segs))), [0, 0])
        row[0] += v["hitcount"]
        row[1] += v["hitcount"] * max(int(segs), 1)
    xmit_rows: list[dict[str, Any]] = [{"host": role, "device": dev, "gso_type": gt, "skbs": n, "segments": s}
                 for (dev, gt), (n, s) in xmit.items()]

    def split(total: str, big: str, segments_of_big) -> list[dict]:
        rows = []
        for (dev,), v in d.get(f"{NAME_PREFIX}{total}", {}).items():
            supers = d.get(f"{NAME_PREFIX}{big}", {}).get((dev,), {}).get("hitcount", 0)
            frames = v["hitcount"] - supers
            if frames > 0:
                rows.append({"host": role, "device": str(dev), "gso_type": "-", "skbs": frames, "segments": frames})
            if supers:
                segs = max(segments_of_big(str(dev), frames), 2 * supers)
                rows.append({"host": role, "device": str(dev), "gso_type": "?", "skbs": supers, "segments": segs,
                             "segments_inferred": True})
        return rows

    def queued_segments(dev: str, frames: int) -> int:
        # what the driver was handed is what the queue was: its segments less the queue's single frames
        return sum(r["segments"] for r in xmit_rows if r["device"] == dev) - frames

    gro = {str(dev): v["hitcount"] for (dev,), v in d.get(f"{NAME_PREFIX}gro_in", {}).items()}

    def received_segments(dev: str, frames: int) -> int:
        # the frames NAPI handed GRO, less those passed up as they were
        return gro.get(dev, 0) - frames

    return TraceAccount.from_json({
        "drops": drops,
        "xmit": sorted(xmit_rows, key=lambda r: (r["device"], -r["skbs"])),
        "queue": split("queue", "queue_super", queued_segments),
        "rx": split("rx", "rx_super", received_segments),
        "gro_in": sorted(({"host": role, "device": dev, "frames": n} for dev, n in gro.items()),
                         key=lambda r: r["device"])})
