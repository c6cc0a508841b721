"""The check registry and the context a check reads through.

A check is a plain function decorated with `@check(...)`: the decorator puts on
it what never changes (id, area, title, the guide's reason, tier, needs_root) and
the function returns an `Outcome` from what it reads via `ctx`. The checks are
found by that mark in the modules offlab/doctor/checks/ lists (`all_checks`);
nothing is registered as a module loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, Callable, Sequence

from offlab.doctor import parse
from offlab.doctor.model import Outcome
from offlab.doctor.source import Output, Source, command_name
from offlab import netdev
from offlab.netdev import Feature


class Skip(Exception):
    """The check cannot say anything here; the message says why."""


class NotApplicable(Exception):
    """The check has no meaning for this target (a hardware check on a veth): no finding at all."""


@dataclass(frozen=True)
class CheckSpec:
    id: str
    area: str
    title: str
    why: str
    tier: str | None  # "basic" (100-500 kpps), "aggressive" (>= 500 kpps) or None: always matters
    needs_root: bool
    per_iface: bool
    func: Callable[..., Outcome]


PCI_ADDRESS = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def no_data(what: str) -> Skip:
    """The skip of a check whose facts are not in this source (a partial sosreport): never a pass."""
    return Skip(f"no data: {what}")


def traced(fn: Callable[["Context"], Any]) -> property:
    """A view built once per audit whose source files are credited to every check that uses it."""
    slot = "_view_" + fn.__name__

    @wraps(fn)
    def get(self: "Context") -> Any:
        if slot not in self.__dict__:
            with self.src.recording() as files:
                self.__dict__[slot] = (fn(self), list(files))
        value, files = self.__dict__[slot]
        self.src.note(*files)
        return value

    return property(get)


SPEC_ATTR = "doctor_check"  # where @check puts a check's CheckSpec
AREAS = ("platform", "cpu", "kernel", "kvm", "nic", "irq", "napi", "bridge", "firewall", "mtu", "ovs", "dpdk")


def check(id: str, *, area: str, title: str, why: str, tier: str | None = None,
          needs_root: bool = False, per_iface: bool = False):
    """Mark a function as a check; `per_iface` checks are called once per audited interface."""
    assert area in AREAS, area
    assert tier in (None, "basic", "aggressive"), tier

    def deco(fn: Callable[..., Outcome]) -> Callable[..., Outcome]:
        setattr(fn, SPEC_ATTR, CheckSpec(id, area, title, why, tier, needs_root, per_iface, fn))
        return fn

    return deco


@dataclass
class Context:
    """What a check may use: the source plus parsed, cached views of it."""

    src: Source
    netns: str | None = None  # the namespace audited, by name; None for the host's own
    ifaces: list[str] = field(default_factory=list)
    sample_seconds: float = 1.0
    target_pps: int | None = None

    # ---- raw access ------------------------------------------------------
    def read(self, path: str) -> str | None:
        return self.src.read(path)

    def value(self, path: str) -> str | None:
        text = self.src.read(path)
        return text.strip() if text is not None else None

    def int_value(self, path: str) -> int | None:
        v = self.value(path)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    def run(self, argv: Sequence[str], name: str | None = None) -> Output | None:
        return self.src.command(name or command_name(argv), argv)

    def present(self, path: str) -> bool:
        """Whether this source shows `path`'s part of the system at all: always live, not in every sosreport."""
        return self.src.covers(path)

    # ---- shared views ----------------------------------------------------
    @traced
    def links(self) -> list[netdev.Link]:
        """Every link of this host/namespace (ip -d -j link; `ip -d address` text in a sosreport)."""
        out = self.run(netdev.ip_argv("link", "show", details=True))
        if out is None or not out.ok or not out.stdout.strip():
            out = self.run(["ip", "-d", "address"]) or self.run(["ip", "-d", "link"])
        if out is not None and out.ok and out.stdout.strip():
            try:
                links = netdev.parse_links(out.stdout)
            except ValueError:  # JSON cut short: fall back to the sysfs names below
                links = []
            if links:
                return links
        return [netdev.Link(n) for n in self.src.listdir("/sys/class/net")]

    def link(self, iface: str) -> netdev.Link | None:
        return next((l for l in self.links if l.ifname == iface), None)

    def mtu(self, iface: str) -> int | None:
        link = self.link(iface)
        if link and link.mtu is not None:
            return int(link.mtu)
        return self.int_value(f"/sys/class/net/{iface}/mtu")

    @traced
    def lscpu(self) -> dict[str, str]:
        """`lscpu` as {field: value}: a sosreport's CPU facts when /sys and /proc/cpuinfo were not copied."""
        out = self.run(["lscpu"])
        return parse.lscpu(out.stdout) if out is not None and out.ok else {}

    @traced
    def cpus_online(self) -> set[int]:
        text = self.value("/sys/devices/system/cpu/online")
        if text:
            try:
                return parse.cpulist(text)
            except ValueError:
                pass  # damaged (e.g. a hand-edited capture): count the CPUs cpuinfo lists instead
        info = self.read("/proc/cpuinfo")
        if info and parse.cpuinfo(info):
            return set(range(len(parse.cpuinfo(info))))
        return parse.lscpu_cpus(self.lscpu.get("On-line CPU(s) list", ""))

    @traced
    def numa_nodes(self) -> dict[int, set[int]]:
        """{node: CPUs} from /sys/devices/system/node (else lscpu); {} if neither shows any."""
        nodes = {}
        for entry in self.src.listdir("/sys/devices/system/node"):
            if entry.startswith("node") and entry[4:].isdigit():
                text = self.value(f"/sys/devices/system/node/{entry}/cpulist")
                if text is not None:
                    try:
                        nodes[int(entry[4:])] = parse.cpulist(text)
                    except ValueError:
                        continue  # a damaged node list says nothing about placement
        if not nodes and not self.src.listdir("/sys/devices/system/node"):
            for key, value in self.lscpu.items():
                m = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key)
                if m:
                    nodes[int(m.group(1))] = parse.lscpu_cpus(value)
        return nodes

    @traced
    def cpus_info(self) -> list[dict[str, str]]:
        info = self.read("/proc/cpuinfo")
        return parse.cpuinfo(info) if info else []

    @property
    def cpu_vendor(self) -> str | None:
        if self.cpus_info:
            return self.cpus_info[0].get("vendor_id")
        return self.lscpu.get("Vendor ID")

    @property
    def guest(self) -> bool:
        """A virtual machine: the CPU flags carry 'hypervisor' (lscpu: a 'Hypervisor vendor' line)."""
        if self.cpus_info:
            return "hypervisor" in self.cpus_info[0].get("flags", "").split()
        return "Hypervisor vendor" in self.lscpu

    def has_device(self, iface: str) -> bool:
        """A link with hardware behind it: sysfs's `device`, else (sysfs not copied) its parent bus or PCI bus-info."""
        if self.src.exists(f"/sys/class/net/{iface}"):
            return self.src.exists(f"/sys/class/net/{iface}/device")
        link = self.link(iface)
        if link and (link.parentbus or link.parentdev):
            return True
        return bool(PCI_ADDRESS.match(self.driver(iface).bus_info))

    def ethtool(self, opt: str, iface: str, *extra: str) -> Output | None:
        return self.run(["ethtool", opt, iface, *extra])

    def features(self, iface: str) -> dict[str, Feature]:
        out = self.ethtool("-k", iface)
        if out is None:
            raise Skip("ethtool -k not available (apt-get install ethtool) and not in the capture")
        if not out.ok:
            raise Skip(f"ethtool -k {iface} failed: {last_line(out)}")
        feats = netdev.parse_features(out.stdout)
        if not feats:
            raise no_data(f"ethtool -k {iface} output holds no feature line ({last_line(out)})")
        return feats

    def driver(self, iface: str) -> netdev.Driver:
        out = self.ethtool("-i", iface)
        return netdev.parse_driver(out.stdout) if out is not None and out.ok else netdev.Driver()

    def is_bridge(self, iface: str) -> bool:
        link = self.link(iface)
        if link and link.kind == "bridge":
            return True
        return self.src.exists(f"/sys/class/net/{iface}/bridge")


def last_line(out: Output) -> str:
    """The line of a failed command worth showing (its last stderr line)."""
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {out.rc}"
