"""Bridge netfilter per bridge: /sys/class/net/BR/bridge/nf_call_{iptables,ip6tables,arptables}.

Whether bridged frames go through iptables (seed 002 turns this off). The
host-wide switch is the sysctl `net.bridge.bridge-nf-call-iptables` (per
namespace since Linux 5.3, with br_netfilter loaded); these are the per-bridge ones.
"""

from __future__ import annotations

from typing import Any

from offlab.errors import BadInput
from offlab.knobs.base import FileKnob, Plan, PlanPlace, as_bool, onoff

BRIDGE_NF_KEYS = ("nf_call_iptables", "nf_call_ip6tables", "nf_call_arptables")


class BridgeNf(FileKnob):
    kind = "bridge_nf"

    @classmethod
    def plan_place_problem(cls, key: str, value: Any, place: PlanPlace) -> str | None:
        if place.iface_kind != "bridge":
            return (f"{key} is a per-bridge setting; {place.target} is not a bridge (a {place.topology} lab's "
                    f"bridges: {', '.join(place.bridges)})")
        return None

    @property
    def path(self) -> str:
        return f"/sys/class/net/{self.iface}/bridge/{self.key}"

    def check(self, value: Any, plan: Plan) -> str:
        flag = as_bool(self.label, value)
        links = plan.links(self.target)
        if self.iface not in links:
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        if links[self.iface].kind != "bridge":
            raise BadInput(f"{self.label}: {self.iface} is not a bridge; {self.key} is a per-bridge setting")
        return onoff(flag)

    def show(self, snap: str) -> str:
        return onoff(snap == "1")

    def apply(self, value: str) -> None:
        super().apply("1" if value == "on" else "0")
