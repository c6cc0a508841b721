"""The check registry and the context a check reads through.

A check is a plain function decorated with `@check(...)`: the decorator holds
what never changes (id, area, title, the guide's reason, tier, needs_root) and
the function returns an `Outcome` from what it reads via `ctx`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

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


REGISTRY: list[CheckSpec] = []
AREAS = ("platform", "cpu", "kernel", "kvm", "nic", "irq", "napi", "bridge", "firewall", "mtu", "ovs")


def check(id: str, *, area: str, title: str, why: str, tier: str | None = None,
          needs_root: bool = False, per_iface: bool = False):
    """Register a check; `per_iface` checks are called once per audited interface."""
    assert area in AREAS, area
    assert tier in (None, "basic", "aggressive"), tier

    def deco(fn: Callable[..., Outcome]) -> Callable[..., Outcome]:
        REGISTRY.append(CheckSpec(id, area, title, why, tier, needs_root, per_iface, fn))
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

    # ---- shared views ----------------------------------------------------
    @cached_property
    def links(self) -> list[dict]:
        """Every link of this host/namespace (ip -d -j link; `ip -d address` text in a sosreport)."""
        out = self.run(["ip", "-d", "-j", "link", "show"])
        if out is None or not out.ok or not out.stdout.strip():
            out = self.run(["ip", "-d", "address"]) or self.run(["ip", "-d", "link"])
        if out is None or not out.stdout.strip():
            return [{"ifname": n} for n in self.src.listdir("/sys/class/net")]
        return parse.ip_links(out.stdout)

    def link(self, iface: str) -> dict | None:
        return next((l for l in self.links if l.get("ifname") == iface), None)

    def mtu(self, iface: str) -> int | None:
        link = self.link(iface)
        if link and "mtu" in link:
            return int(link["mtu"])
        return self.int_value(f"/sys/class/net/{iface}/mtu")

    @cached_property
    def cpus_online(self) -> set[int]:
        text = self.value("/sys/devices/system/cpu/online")
        if text:
            try:
                return parse.cpulist(text)
            except ValueError:
                pass  # damaged (e.g. a hand-edited capture): count the CPUs cpuinfo lists instead
        info = self.read("/proc/cpuinfo")
        return set(range(len(parse.cpuinfo(info)))) if info else set()

    @cached_property
    def numa_nodes(self) -> dict[int, set[int]]:
        """{node: CPUs} from /sys/devices/system/node; {} if the kernel shows none."""
        nodes = {}
        for entry in self.src.listdir("/sys/devices/system/node"):
            if entry.startswith("node") and entry[4:].isdigit():
                text = self.value(f"/sys/devices/system/node/{entry}/cpulist")
                if text is not None:
                    try:
                        nodes[int(entry[4:])] = parse.cpulist(text)
                    except ValueError:
                        continue  # a damaged node list says nothing about placement
        return nodes

    @cached_property
    def cpus_info(self) -> list[dict[str, str]]:
        info = self.read("/proc/cpuinfo")
        return parse.cpuinfo(info) if info else []

    @property
    def cpu_vendor(self) -> str | None:
        return self.cpus_info[0].get("vendor_id") if self.cpus_info else None

    @property
    def guest(self) -> bool:
        """A virtual machine: the CPU flags carry 'hypervisor'."""
        return bool(self.cpus_info) and "hypervisor" in self.cpus_info[0].get("flags", "").split()

    def ethtool(self, opt: str, iface: str, *extra: str) -> Output | None:
        return self.run(["ethtool", opt, iface, *extra])

    def features(self, iface: str) -> dict[str, Feature]:
        out = self.ethtool("-k", iface)
        if out is None:
            raise Skip("ethtool -k not available (apt-get install ethtool) and not in the capture")
        if not out.ok:
            raise Skip(f"ethtool -k {iface} failed: {last_line(out)}")
        return netdev.parse_features(out.stdout)

    def driver(self, iface: str) -> dict[str, str]:
        out = self.ethtool("-i", iface)
        return parse.key_values(out.stdout) if out is not None and out.ok else {}

    def is_bridge(self, iface: str) -> bool:
        link = self.link(iface) or {}
        if link.get("linkinfo", {}).get("info_kind") == "bridge":
            return True
        return self.src.exists(f"/sys/class/net/{iface}/bridge")


def last_line(out: Output) -> str:
    """The line of a failed command worth showing (its last stderr line)."""
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {out.rc}"
