"""What every knob is: read the exact original, apply, read back, restore that original.

A knob's `snapshot()` is the exact, JSON-serialisable original that goes into the
journal; `restore(snapshot)` puts exactly that back. `show()` turns a snapshot
into the short text people read ("on", "9000", "fq").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from offlab import netdev
from offlab.errors import BadInput, CommandFailed
from offlab.hosts import Host
from offlab.knobs.target import Target

KEY_RE = re.compile(r"^[A-Za-z0-9_.:/@-]{1,128}$")

TRUE_WORDS = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False,
              "yes": True, "no": False}


class Plan:
    """What the links will look like once earlier changes of the same batch are applied.

    Validation walks the changes in order, so an MTU rule is checked against the
    MTUs the batch itself sets before it (raise the underlay, then the VXLAN).
    """

    def __init__(self) -> None:
        self._links: dict[str | None, dict[str, dict]] = {}
        self.mtus: dict[tuple[str | None, str], int] = {}

    def links(self, target: Target) -> dict[str, dict]:
        if target.host_key not in self._links:
            self._links[target.host_key] = {l["ifname"]: l for l in netdev.link_rows(target.host, details=True)}
        return self._links[target.host_key]

    def mtu(self, target: Target, iface: str) -> int:
        key = (target.host_key, iface)
        if key in self.mtus:
            return self.mtus[key]
        return int(self.links(target)[iface]["mtu"])


@dataclass(frozen=True)
class PlanPlace:
    """Where a plan sets a knob, as far as it is known before any lab exists."""

    topology: str  # the lab's kind: veth, router, dpdk, ...
    target: str  # HOST[:IFACE] as the plan writes it
    role: str
    ref: str | None  # the IFACE part, if any
    iface_kind: str | None = None  # the kind of the interface it names (veth, bridge, ovs-dpdk, ...), if known
    bridges: tuple[str, ...] = ()  # the lab's bridges, as HOST:NAME


class Knob:
    """One setting of one target. Subclasses fill in the five verbs."""

    kind: ClassVar[str] = ""
    needs_iface: ClassVar[bool] = True
    on_machine: ClassVar[bool] = False  # a plan may set it host-wide, under `machine`
    on_ovs_dpdk_port: ClassVar[bool] = False  # an OVS-DPDK port (no kernel interface) takes it

    # ---- a plan's judgement, before any lab exists ---------------------
    @classmethod
    def plan_value_problem(cls, key: str, value: Any) -> str | None:
        """What is wrong with `key: value` wherever a plan sets it; None if nothing."""
        return None

    @classmethod
    def plan_place_problem(cls, key: str, value: Any, place: PlanPlace) -> str | None:
        """What is wrong with `key: value` at `place` (its interface resolved if it needs one); None if nothing."""
        return None

    def __init__(self, target: Target, key: str) -> None:
        self.target = target
        self.key = key

    @property
    def host(self) -> Host:
        return self.target.host

    @property
    def iface(self) -> str:
        assert self.target.iface is not None
        return self.target.iface

    @property
    def label(self) -> str:
        return f"{self.target.where} {self.key}"

    # ---- the verbs ----------------------------------------------------
    def check(self, value: Any, plan: Plan) -> str:
        """The requested value in canonical text, or BadInput naming what is wrong."""
        raise NotImplementedError

    def snapshot(self) -> Any:
        """The exact current state, JSON-serialisable: what restore puts back."""
        raise NotImplementedError

    def show(self, snap: Any) -> str:
        return str(snap)

    def read(self) -> str:
        return self.show(self.snapshot())

    def impossible(self, value: str, snap: Any) -> str | None:
        """Why `value` cannot be set here at all (fixed, unsupported), before trying."""
        return None

    def apply(self, value: str) -> None:
        raise NotImplementedError

    def restore(self, snap: Any) -> None:
        raise NotImplementedError

    # ---- read-back ----------------------------------------------------
    def satisfied(self, value: str, snap: Any) -> bool:
        return self.show(snap) == value

    def same(self, a: Any, b: Any) -> bool:
        """Two snapshots describe the same state (restore compares with this)."""
        return a == b

    def explain(self, value: str, before: Any, after: Any) -> str:
        return f"{self.label}: requested {value}, the kernel left {self.show(after)}"

    def side_state(self) -> dict[str, str]:
        """Related state that may change as a side effect (reported as `also_changed`)."""
        return {}

    def side_reasons(self, changed: list[str]) -> dict[str, str]:
        """Why each of these side states moved, where known (from the last two side_state reads)."""
        return {}

    def gone(self) -> str | None:
        """Why this setting no longer exists (its interface was removed), or None."""
        if self.target.iface is None:
            return None
        try:  # a host that does not answer raises (HostUnreachable): its entry waits for it
            gone = netdev.ip_json_or_none(self.host, "link", "show", "dev", self.iface) is None
        except ValueError:  # ip answered, not in JSON: the interface is there
            gone = False
        return f"interface {self.iface} gone: nothing to restore" if gone else None

    # ---- journal ------------------------------------------------------
    def to_entry(self) -> dict:
        return {"kind": self.kind, "key": self.key, **self.target.to_dict()}


class FileKnob(Knob):
    """A setting that is one file's text (under /sys or /proc): read it, write it, put it back."""

    @property
    def path(self) -> str:
        raise NotImplementedError

    def snapshot(self) -> str:
        return self.host.read(self.path).strip()

    def apply(self, value: str) -> None:
        self.host.write(self.path, value + "\n")

    def restore(self, snap: str) -> None:
        if self.snapshot() != snap:
            self.host.write(self.path, snap + "\n")


# ---- helpers shared by the knobs ----------------------------------------

def as_bool(label: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS:
        return TRUE_WORDS[value.strip().lower()]
    raise BadInput(f"{label}: expected on or off, got {value!r}")


def as_int(label: str, value: Any, lo: int = 0, hi: int = 2**31 - 1) -> int:
    if isinstance(value, bool):
        raise BadInput(f"{label}: expected an integer, got {value!r}")
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,10}", value.strip()):
        value = int(value.strip())
    if not isinstance(value, int):
        raise BadInput(f"{label}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise BadInput(f"{label}: {value} is out of range {lo}..{hi}")
    return value


def onoff(flag: bool) -> str:
    return "on" if flag else "off"


def failure_text(exc: CommandFailed) -> str:
    """The last meaningful line a command wrote to stderr."""
    lines = [l.strip() for l in exc.stderr.splitlines() if l.strip()]
    return lines[-1] if lines else f"exit code {exc.rc}"
