"""RPS and XPS CPU masks: /sys/class/net/IF/queues/rx-N/rps_cpus and tx-N/xps_cpus.

`rps` / `xps` set every queue of the interface; `rps.N` / `xps.N` one queue.
Masks are hex ("3" or "0x3"), and may not name CPUs the target host does not have (a guest has
its own vCPUs: its /sys/devices/system/cpu/possible is read through its Host).
"""

from __future__ import annotations

import re
from typing import Any

from offlab.errors import BadInput
from offlab.hosts import LOCAL, Host
from offlab.knobs.base import Knob, Plan

MASK_RE = re.compile(r"^(0x)?([0-9a-fA-F]{1,64})$")
QUEUE_RE = re.compile(r"^(rx|tx)-[0-9]{1,5}$")


def possible_cpus(host: Host = LOCAL) -> int:
    """Number of CPU ids on `host` (highest possible CPU + 1), from its /sys/devices/system/cpu/possible."""
    # A guest's or an SSH host's CPU ids are fixed for its life, and each read there is a channel round
    # trip, made at every validation of a cell's mask: kept in the host's memo, which ends with its lab.
    memo = None if host.shares_kernel else host.memo
    cpus = memo.get("possible cpus") if memo is not None else None
    if cpus is not None:
        return cpus
    text = host.read("/sys/devices/system/cpu/possible").strip()
    cpus = max(int(part.split("-")[-1]) for part in text.split(",")) + 1
    if memo is not None:
        memo.put("possible cpus", cpus)
    return cpus


def mask_value(text: str) -> int:
    """A mask as the kernel prints it ("00000000,00000003") → int."""
    return int(text.strip().replace(",", "") or "0", 16)


class QueueMask(Knob):
    kind = "queues"

    def __init__(self, target, key: str) -> None:
        super().__init__(target, key)
        base, _, index = key.partition(".")
        self.rx = base == "rps"
        self.index = index

    @property
    def _dir(self) -> str:
        return f"/sys/class/net/{self.iface}/queues"

    @property
    def _file(self) -> str:
        return "rps_cpus" if self.rx else "xps_cpus"

    def queues(self) -> list[str]:
        prefix = "rx-" if self.rx else "tx-"
        res = self.host.run(["ls", self._dir], check=False, timeout=10)
        names = [q for q in res.stdout.split() if QUEUE_RE.fullmatch(q) and q.startswith(prefix)]
        if self.index:
            names = [q for q in names if q == f"{prefix}{self.index}"]
        return sorted(names, key=lambda q: int(q.split("-")[1]))

    def check(self, value: Any, plan: Plan) -> str:
        if self.index and not self.index.isdigit():
            raise BadInput(f"{self.label}: the queue number must be an integer ({self.key.split('.')[0]}.0)")
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            mask = value
        elif isinstance(value, str) and (m := MASK_RE.fullmatch(value.strip())):
            mask = int(m.group(2), 16)
        else:
            raise BadInput(f"{self.label}: expected a hex CPU mask such as 3 or 0x3, got {value!r}")
        cpus = possible_cpus(self.host)
        if mask >= 1 << cpus:
            where = "this machine" if self.host.shares_kernel else f"host {self.target.where.split(':')[0]}"
            raise BadInput(f"{self.label}: mask {mask:#x} names CPUs {where} does not have "
                           f"({cpus} CPUs: at most {(1 << cpus) - 1:#x})")
        if not self.queues():
            # One queue may appear when a setting before it in the same cell raises the channels
            # (`channels.combined: 2, xps.1: "2"`): then only applying can tell (`impossible`).
            if not (self.index and self._any_queue()):
                raise BadInput(f"{self.label}: {self.iface} has no such {self._what}")
        return f"{mask:#x}"

    @property
    def _what(self) -> str:
        return f"queue {'rx' if self.rx else 'tx'}-{self.index}" if self.index else "queues"

    def _any_queue(self) -> bool:
        """The interface has queues of this direction at all (the asked one may come with more channels)."""
        index, self.index = self.index, ""
        try:
            return bool(self.queues())
        finally:
            self.index = index

    def impossible(self, value: str, snap: dict[str, str]) -> str | None:
        if not snap:
            return (f"{self.label}: {self.iface} has no {self._what} now (the channels in force are fewer) "
                    f"— cannot test {self.key}={value} here")
        return None

    def snapshot(self) -> dict[str, str]:
        return {q: self.host.read(f"{self._dir}/{q}/{self._file}").strip() for q in self.queues()}

    def show(self, snap: dict[str, str]) -> str:
        if not snap:
            return f"no {self._what}"
        values = {mask_value(v) for v in snap.values()}
        if len(values) == 1:
            return f"{values.pop():#x}"
        return ", ".join(f"{q} {mask_value(v):#x}" for q, v in snap.items())

    def apply(self, value: str) -> None:
        for q in self.queues():
            self.host.write(f"{self._dir}/{q}/{self._file}", f"{int(value, 16):x}\n")

    def restore(self, snap: dict[str, str]) -> None:
        now = self.snapshot()
        for q, text in snap.items():
            if q in now and mask_value(now[q]) != mask_value(text):
                self.host.write(f"{self._dir}/{q}/{self._file}", text + "\n")

    def same(self, a: dict[str, str], b: dict[str, str]) -> bool:
        # a queue that no longer exists (channels went down) has nothing left to restore
        return all(mask_value(v) == mask_value(b[q]) for q, v in a.items() if q in b)
