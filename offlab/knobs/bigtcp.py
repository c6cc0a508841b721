"""BIG TCP's four size limits of a device, and threaded NAPI.

`gso_max_size` / `gro_max_size` (IPv6, Linux 5.19) and `gso_ipv4_max_size` / `gro_ipv4_max_size`
(IPv4, Linux 6.3) let the stack build and merge TCP super-packets beyond 64 KiB. A device's
`gso_*` may not exceed its `tso_max_size` (a veth: 524280) and `gro_*` may not exceed the kernel's
GRO_MAX_SIZE (8 × 65535 = 524280): both are refused here, before anything changes, with the limit
named. On this machine's kernel (a namespace, the machine) the sizes are read and set over rtnetlink
by `offlab.rtnl`, run inside the namespace through the host (Debian 12's `ip` cannot set the IPv4
ones); on a guest or SSH host by that host's own `ip`. A kernel without an attribute is "cannot
test here".

`threaded` is /sys/class/net/IF/threaded: the device's NAPI polled by a kernel thread (napi/IF-N)
instead of in softirq. A veth has a NAPI instance only while it is up with GRO (or XDP) on; with none
the kernel refuses the write, reported as "cannot test here".
"""

from __future__ import annotations

import json
import sys
from typing import Any

from offlab import rtnl
from offlab.errors import BadInput
from offlab.knobs.base import FileKnob, Knob, Plan, PlanPlace, as_bool, as_int
from offlab.knobs.features import forget_reads, shared_memo
from offlab.netdev import link as _link
from offlab.wire import IP_MAX

SIZE_KEYS = {"gso_max_size": "IPv6 (and IPv4 before Linux 6.3)", "gro_max_size": "IPv6",
             "gso_ipv4_max_size": "IPv4", "gro_ipv4_max_size": "IPv4"}
SINCE = {"gso_max_size": "2.6", "gro_max_size": "5.19", "gso_ipv4_max_size": "6.3", "gro_ipv4_max_size": "6.3"}
GRO_MAX_SIZE = 8 * IP_MAX  # include/linux/netdevice.h: the most any gro_*max_size may be
LEGACY_MAX = 65536  # GSO_LEGACY_MAX_SIZE / GRO_LEGACY_MAX_SIZE: the sizes before BIG TCP
THREADED_KEYS = {"threaded"}
# Before a lab exists (`run --validate`), the device's tso_max_size is not known; the kernel bounds every
# device's at GSO_MAX_SIZE (524280, "net: limit GSO_MAX_SIZE to 524280 bytes"); a veth takes all of it, a
# tap (with or without vnet_hdr) keeps the legacy 65536 (both read with `ip -d -j link show` on Linux 6.18).
GSO_MAX_SIZE = 524280
TSO_MAX_BY_KIND = {"veth": 524280, "tap": 65536}


def plan_size_problem(key: str, value: Any, iface_kind: str) -> str | None:
    """What is wrong with `key: value` in a plan on an interface of this kind, judged without a lab."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"{key} takes a size in bytes (an integer ≥ 1), got {value!r}"
    if key.startswith("gso"):
        limit = TSO_MAX_BY_KIND.get(iface_kind, GSO_MAX_SIZE)
        whose = f"a {iface_kind}'s tso_max_size" if iface_kind in TSO_MAX_BY_KIND else \
            "the largest tso_max_size a device may have (GSO_MAX_SIZE)"
        if value > limit:
            return f"{key}={value}: more than {whose}, {limit}; use at most {limit}"
    elif value > GRO_MAX_SIZE:
        return f"{key}={value}: more than the kernel's GRO_MAX_SIZE {GRO_MAX_SIZE} (8 × 65535); use at most {GRO_MAX_SIZE}"
    return None


def link_sizes(host, iface: str) -> dict[str, int]:
    """The device's size attributes as its kernel reports them (absent: the kernel lacks it); inside
    features.shared_reads() read once per interface (the four sizes of a cell read back together)."""
    memo, key = shared_memo(), ("link_size", host.key, iface)
    if memo is not None and key in memo:
        return memo[key]
    if host.shares_kernel:
        out = host.run([sys.executable, "-I", rtnl.__file__, "get", iface], timeout=15).stdout
        sizes = {k: int(v) for k, v in json.loads(out).items()}
    else:
        info = _link(host, iface)
        sizes = {k: info.sizes[k] for k in rtnl.ATTRS if k in info.sizes}
    if memo is not None:
        memo[key] = sizes
    return sizes


class LinkSize(Knob):
    kind = "link_size"

    @classmethod
    def plan_place_problem(cls, key: str, value: Any, place: PlanPlace) -> str | None:
        problem = plan_size_problem(key, value, place.iface_kind or "")
        return f"{place.target} {problem}" if problem else None

    def check(self, value: Any, plan: Plan) -> str:
        me = plan.links(self.target).get(self.iface)
        if me is None:
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        size = as_int(f"{self.label} (bytes)", value, 1, 2**32 - 1)
        if self.key.startswith("gso"):
            tso = me.sizes.get("tso_max_size")
            if isinstance(tso, int) and size > tso:
                raise BadInput(f"{self.label}={size}: more than {self.iface}'s tso_max_size {tso} (the largest "
                               f"super-packet this device takes); use at most {tso}")
        elif size > GRO_MAX_SIZE:
            raise BadInput(f"{self.label}={size}: more than the kernel's GRO_MAX_SIZE {GRO_MAX_SIZE} "
                           f"(8 × 65535); use at most {GRO_MAX_SIZE}")
        return str(size)

    def snapshot(self) -> int | None:
        return link_sizes(self.host, self.iface).get(self.key)

    def show(self, snap: Any) -> str:
        return "absent" if snap is None else str(snap)

    def impossible(self, value: str, snap: Any) -> str | None:
        if snap is None and not self.host.shares_kernel:
            # A guest or SSH host is read by its own `ip`: iproute2 before 6.3 (Debian 12's 6.1, which the
            # guest image carries) shows neither IPv4 size, whatever the kernel has (a 6.12 guest has both).
            return (f"{self.label}: this host's `ip` does not show {self.key} (iproute2 6.3 and later do; "
                    f"the kernel needs Linux {SINCE[self.key]}) — cannot test {self.key}={value} here")
        if snap is None:
            return (f"{self.label}: this kernel has no {self.key} (Linux {SINCE[self.key]} and later) — "
                    f"cannot test {self.key}={value} here")
        return None

    def apply(self, value: str) -> None:
        forget_reads()
        if self.host.shares_kernel:
            self.host.run([sys.executable, "-I", rtnl.__file__, "set", self.iface, self.key, str(int(value))],
                          timeout=15)
        else:
            self.host.run(["ip", "link", "set", "dev", self.iface, self.key, str(int(value))], timeout=15)

    def restore(self, snap: Any) -> None:
        if snap is not None and self.snapshot() != snap:
            self.apply(str(int(snap)))


class Threaded(FileKnob):
    kind = "threaded"

    @property
    def path(self) -> str:
        return f"/sys/class/net/{self.iface}/threaded"

    def check(self, value: Any, plan: Plan) -> str:
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        if not self.host.exists(self.path):
            raise BadInput(f"{self.label}: this kernel has no {self.path}")
        return "on" if as_bool(self.label, value) else "off"

    def show(self, snap: str) -> str:
        return {"0": "off", "1": "on"}.get(snap, snap)

    def apply(self, value: str) -> None:
        self.host.write(self.path, "1\n" if value == "on" else "0\n")

    def explain(self, value: str, before: Any, after: Any) -> str:
        return (f"{self.label}: requested {value}, the kernel left {self.show(after)} (a veth has NAPI only "
                f"while it is up with GRO or XDP on)")
