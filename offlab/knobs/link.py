"""Link settings: MTU (with its dependency rules, and OVS `mtu_request`) and txqueuelen.

MTU rules checked before anything changes:
- a VXLAN device fits its underlay: MTU ≤ underlay − 50 (IPv4) or − 70 (IPv6);
  the underlay cannot drop below what its VXLAN devices need;
- a bridge's MTU follows its ports: it may not exceed its smallest port
  (raise the ports and the bridge follows by itself);
- the device's own min_mtu..max_mtu.
On an OVS port the MTU is `mtu_request` in the lab's private OVS database: OVS
would put a kernel-set MTU back behind our back.
"""

from __future__ import annotations

from typing import Any

from offlab.errors import BadInput
from offlab.knobs.base import Knob, Plan, as_int
from offlab.mtu.calc import VXLAN_OVERHEAD
from offlab.names import MTU_MAX, MTU_MIN
from offlab.netdev import link as _link
from offlab.netdev import vsctl


def _kind(link: dict) -> str:
    return link.get("linkinfo", {}).get("info_kind", "")


def _vxlan_family(link: dict) -> int:
    data = link.get("linkinfo", {}).get("info_data", {})
    return 6 if any(k in data for k in ("local6", "remote6", "group6")) else 4


class Mtu(Knob):
    kind = "mtu"

    def __init__(self, target, key: str) -> None:
        super().__init__(target, key)
        self._ovs_port: bool | None = None

    def _vsctl(self, *args: str) -> str:
        """ovs-vsctl against the lab's private database (works from the journal alone)."""
        return vsctl(self.host, self.target.ovs_rundir, *args).strip()

    def _is_ovs_port(self) -> bool:
        if not self.target.ovs_rundir:
            return False
        if self._ovs_port is None:
            self._ovs_port = self._vsctl("--if-exists", "get", "Interface", self.iface, "mtu_request") != ""
        return self._ovs_port

    def check(self, value: Any, plan: Plan) -> str:
        mtu = as_int(f"{self.label}", value, MTU_MIN, MTU_MAX)
        links = plan.links(self.target)
        me = links.get(self.iface)
        if me is None:
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        lo, hi = me.get("min_mtu", MTU_MIN), me.get("max_mtu", MTU_MAX)
        if not lo <= mtu <= hi:
            raise BadInput(f"{self.label}: {mtu} is outside what {self.iface} accepts ({lo}..{hi})")
        if _kind(me) == "vxlan":
            under = me.get("linkinfo", {}).get("info_data", {}).get("link")
            if under in links:
                over = VXLAN_OVERHEAD[_vxlan_family(me)]
                room = plan.mtu(self.target, under) - over
                if mtu > room:
                    raise BadInput(
                        f"{self.label}: {mtu} does not fit the VXLAN underlay {under} "
                        f"(MTU {plan.mtu(self.target, under)} − {over} = {room}); raise {under} first"
                    )
        for name, link in links.items():
            if _kind(link) == "vxlan" and link.get("linkinfo", {}).get("info_data", {}).get("link") == self.iface:
                need = plan.mtu(self.target, name) + VXLAN_OVERHEAD[_vxlan_family(link)]
                if mtu < need:
                    raise BadInput(
                        f"{self.label}: {mtu} is too small for the VXLAN device {name} on top of it "
                        f"(its MTU {plan.mtu(self.target, name)} needs an underlay of at least {need}); "
                        f"lower {name} first"
                    )
        if _kind(me) == "bridge":
            ports = {n: plan.mtu(self.target, n) for n, l in links.items() if l.get("master") == self.iface}
            if ports and mtu > min(ports.values()):
                small = min(ports, key=ports.get)
                raise BadInput(
                    f"{self.label}: {mtu} is more than its port {small} carries ({ports[small]}); "
                    f"a bridge's MTU follows its ports: set the ports' MTU instead"
                )
        plan.mtus[(self.target.host_key, self.iface)] = mtu
        return str(mtu)

    def snapshot(self) -> dict:
        snap: dict = {"mtu": int(_link(self.host, self.iface)["mtu"])}
        if self._is_ovs_port():
            snap["mtu_request"] = self._vsctl("get", "Interface", self.iface, "mtu_request")
        return snap

    def show(self, snap: dict) -> str:
        return str(snap["mtu"])

    def apply(self, value: str) -> None:
        if self._is_ovs_port():
            self._vsctl("set", "Interface", self.iface, f"mtu_request={int(value)}")
        else:
            self.host.run(["ip", "link", "set", "dev", self.iface, "mtu", str(int(value))], timeout=10)

    def restore(self, snap: dict) -> None:
        if "mtu_request" in snap and self._is_ovs_port():
            req = snap["mtu_request"]
            if req == "[]":
                self._vsctl("clear", "Interface", self.iface, "mtu_request")
            else:
                self._vsctl("set", "Interface", self.iface, f"mtu_request={as_int('mtu_request', req)}")
        if int(_link(self.host, self.iface)["mtu"]) != snap["mtu"]:
            self.host.run(["ip", "link", "set", "dev", self.iface, "mtu", str(int(snap["mtu"]))], timeout=10)

    def side_state(self) -> dict[str, str]:
        """The MTU of the bridge this port belongs to: it follows its ports."""
        master = _link(self.host, self.iface).get("master")
        if not master:
            return {}
        return {f"{master} mtu": str(_link(self.host, master)["mtu"])}


class TxQueueLen(Knob):
    kind = "txqueuelen"

    def check(self, value: Any, plan: Plan) -> str:
        n = as_int(self.label, value, 0, 1_000_000)
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        return str(n)

    def snapshot(self) -> int:
        return int(_link(self.host, self.iface).get("txqlen", 0))

    def apply(self, value: str) -> None:
        self.host.run(["ip", "link", "set", "dev", self.iface, "txqueuelen", str(int(value))], timeout=10)

    def restore(self, snap: int) -> None:
        if self.snapshot() != snap:
            self.apply(str(int(snap)))
