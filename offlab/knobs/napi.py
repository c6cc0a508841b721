"""NAPI deferral of one device: /sys/class/net/IF/gro_flush_timeout and napi_defer_hard_irqs.

`gro_flush_timeout` (ns) keeps GRO's held packets up to that long instead of flushing them at the
end of each poll, and, with `napi_defer_hard_irqs` N > 0, lets NAPI skip re-arming the device's
interrupt for N empty polls while a timer of that length polls instead: fewer interrupts and larger
GRO batches, bought with latency. On a veth they act on its NAPI instance, which exists while GRO
(or XDP) is on for the device. Busy polling itself (`net.core.busy_poll` / `busy_read`) is a
machine-wide sysctl (offlab.knobs.sysctl); see docs/knobs.md.
"""

from __future__ import annotations

from typing import Any

from offlab.errors import BadInput
from offlab.knobs.base import FileKnob, Plan, as_int

# The kernel stores gro_flush_timeout as an unsigned long of ns; past a second it is a typo, not a plan.
MAX_FLUSH_NS = 1_000_000_000
# napi_defer_hard_irqs is an int the kernel bounds at S32_MAX (it refuses 2^32 with EIO).
MAX_DEFER = 2**31 - 1
NAPI_KEYS = {"gro_flush_timeout": ("ns", MAX_FLUSH_NS), "napi_defer_hard_irqs": ("polls", MAX_DEFER)}


class NapiParam(FileKnob):
    kind = "napi"

    @classmethod
    def plan_value_problem(cls, key: str, value: Any) -> str | None:
        top = NAPI_KEYS[key][1]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            return f"{key} takes an integer 0..{top}, got {value!r}"
        return None

    @property
    def path(self) -> str:
        return f"/sys/class/net/{self.iface}/{self.key}"

    def check(self, value: Any, plan: Plan) -> str:
        unit, top = NAPI_KEYS[self.key]
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        if not self.host.exists(self.path):
            raise BadInput(f"{self.label}: this kernel has no {self.path}")
        return str(as_int(f"{self.label} ({unit})", value, 0, top))
