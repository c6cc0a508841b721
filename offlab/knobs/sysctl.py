"""Sysctls, per network namespace or for the whole machine.

Which sysctls belong to a namespace is the kernel's call, and /proc/sys shows it:
inside a namespace, /proc/sys/net lets only the per-namespace ones be written
(`net.ipv4.*`, `net.core.somaxconn`, `net.bridge.bridge-nf-call-iptables` with
br_netfilter loaded). `net.core.netdev_budget`, `netdev_max_backlog` and
`default_qdisc` are absent there, `net.core.rmem_max` / `wmem_max` are shown
read-only (Linux 6.x), and every `kernel.*` / `vm.*` exists once: all of these
are host-wide, settable only in the machine's initial namespace. A host-wide sysctl asked for on a lab host is refused (it
would change the whole machine); to change one, target the machine itself
(`Change(LOCAL, ...)`), which is journalled the same way.
"""

from __future__ import annotations

import os
import re
from typing import Any

from offlab.errors import BadInput, CommandFailed
from offlab.hosts import LOCAL
from offlab.knobs.base import Knob, Plan, PlanPlace

SYSCTL_RE = re.compile(r"^(net|kernel|vm)(\.[A-Za-z0-9_:@/-]{1,64}){1,8}$")
WORD_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
INT_RE = re.compile(r"^-?[0-9]{1,19}$")
# Ranges the kernel enforces (proc_dointvec_minmax) for sysctls offlab's suites vary: checked before
# anything changes, so a typo is exit 2 rather than a write the kernel refuses mid-run.
RANGES = {"net.core.busy_poll": (0, 2**31 - 1), "net.core.busy_read": (0, 2**31 - 1)}


def is_sysctl_key(key: str) -> bool:
    return key.startswith(("net.", "kernel.", "vm."))


def sysctl_path(key: str) -> str:
    """`net.ipv4.conf.eth0/100.rp_filter` → /proc/sys/net/ipv4/conf/eth0.100/rp_filter (sysctl(8)'s rule)."""
    if not SYSCTL_RE.fullmatch(key):
        raise BadInput(f"invalid sysctl name {key!r}: use dotted words such as net.core.rmem_max")
    parts = [p.replace("/", ".") for p in key.split(".")]
    if any(p in (".", "..") for p in parts):
        raise BadInput(f"invalid sysctl name {key!r}")
    return "/proc/sys/" + "/".join(parts)


class Sysctl(Knob):
    kind = "sysctl"
    needs_iface = False
    on_machine = True

    @classmethod
    def plan_value_problem(cls, key: str, value: Any) -> str | None:
        if key not in RANGES:
            return None
        lo, hi = RANGES[key]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            return f"{key} takes an integer {lo}..{hi}, got {value!r}"
        return None

    @classmethod
    def plan_place_problem(cls, key: str, value: Any, place: PlanPlace) -> str | None:
        if key in RANGES:  # the machine-wide ones offlab's suites vary: no namespace has them
            return (f"{key} is host-wide (no network namespace has it): write it under machine, "
                    f"e.g. settings: {{machine: {{{key}: {value}}}}}")
        if place.ref is not None:
            return (f"{key} is a sysctl of {place.role}'s namespace, not of an interface: write {place.role} "
                    f"without :{place.ref}")
        return None

    @property
    def path(self) -> str:
        return sysctl_path(self.key)

    @property
    def label(self) -> str:
        return f"{self.target.where} {self.key}"

    def check(self, value: Any, plan: Plan) -> str:
        path = self.path
        where = self.target.where
        if not self._writable():
            if self.target.netns is not None and LOCAL.exists(path):
                raise BadInput(
                    f"{self.key} is host-wide (only the machine's initial network namespace can set it; "
                    f"a namespace sees it read-only or not at all): setting it from {where} would change "
                    f"the whole machine, so offlab refuses; set it on the machine explicitly if you mean to "
                    f"(a plan: settings: {{machine: {{{self.key}: VALUE}}}})"
                )
            if self.host.exists(path):
                raise BadInput(f"{self.key} is read-only in {where}")
            hint = " (net.bridge.* appears only with the br_netfilter module loaded)" if self.key.startswith(
                "net.bridge.") else ""
            raise BadInput(f"no sysctl {self.key} in {where}{hint}")
        if self.target.netns is not None and not self.key.startswith("net."):
            raise BadInput(f"{self.key} is host-wide (only net.* sysctls are per network namespace): "
                           f"offlab refuses to set it from {where}")
        try:
            current = self.snapshot()
        except (CommandFailed, OSError) as exc:
            raise BadInput(f"{self.label} cannot be read, so it could not be restored: refused") from exc
        return self._canonical(value, current)

    def _writable(self) -> bool:
        # /proc/sys honours the mode bits even for root: a namespace sees host-wide ones read-only
        if self.target.is_machine:
            return os.access(self.path, os.W_OK)
        return self.host.run(["test", "-w", self.path], check=False, timeout=10).rc == 0

    def _canonical(self, value: Any, current: str) -> str:
        if isinstance(value, bool):
            value = int(value)
        words = str(value).split() if isinstance(value, (str, int)) else None
        if not words:
            raise BadInput(f"{self.label}: expected a value like the current one ({current!r}), got {value!r}")
        now = current.split()
        if now and all(INT_RE.fullmatch(w) for w in now):
            if len(words) != len(now) or not all(INT_RE.fullmatch(w) for w in words):
                raise BadInput(f"{self.label}: expected {len(now)} integer(s) like the current {current!r}, "
                               f"got {value!r}")
            bounds = RANGES.get(self.key)
            if bounds is not None and not bounds[0] <= int(words[0]) <= bounds[1]:
                lo, hi = bounds
                raise BadInput(f"{self.label}: {words[0]} is out of range {lo}..{hi} (µs)")
        elif not all(WORD_RE.fullmatch(w) for w in words) or len(words) > 8:
            raise BadInput(f"{self.label}: refusing value {value!r} (letters, digits, _ . : - only)")
        return " ".join(words)

    def snapshot(self) -> str:
        return self.host.read(self.path).strip()

    def show(self, snap: str) -> str:
        return " ".join(snap.split())

    def apply(self, value: str) -> None:
        self.host.write(self.path, value + "\n")

    def restore(self, snap: str) -> None:
        if self.snapshot().split() != snap.split():
            self.host.write(self.path, snap + "\n")

    def same(self, a: str, b: str) -> bool:
        return a.split() == b.split()

    def gone(self) -> str | None:
        return None if self.host.exists(self.path) else f"sysctl {self.key} gone: nothing to restore"
