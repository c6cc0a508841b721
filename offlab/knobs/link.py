"""Link settings: MTU (with its dependency rules, and OVS `mtu_request`) and txqueuelen.

MTU rules checked before anything changes:
- a VXLAN device fits its underlay: MTU ≤ underlay − 50 (IPv4) or − 70 (IPv6);
  the underlay cannot drop below what its VXLAN devices need;
- a bridge's MTU follows its ports: it may not exceed its smallest port
  (raise the ports and the bridge follows by itself);
- the device's own min_mtu..max_mtu.
On an OVS port the MTU is `mtu_request` in the lab's private OVS database: OVS
would put a kernel-set MTU back behind our back. An OVS-DPDK port (dpdk, dpdkvhostuser)
has no kernel interface at all: its MTU is OVS's `mtu` column, read back once OVS has
reconfigured the port, and a value its PMD cannot take is refused before it is asked
(OVS would accept it, then take the port out of the datapath).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from offlab.dpdk.ports import DPDK_TYPES, PINNED_MTU, max_mtu
from offlab.errors import BadInput, EnvironmentProblem
from offlab.knobs.base import Knob, Plan, PlanPlace, as_int
from offlab.mtu.calc import VXLAN_OVERHEAD
from offlab.names import MTU_MAX, MTU_MIN, check_mtu
from offlab.netdev import link as _link
from offlab.netdev import vsctl


# How long OVS may take to reconfigure a DPDK port for a new MTU (a vhost-user port makes a new
# mempool; under load on 2 CPUs this took seconds).
OVS_DPDK_MTU_WAIT = 30.0


class OvsPortRefused(EnvironmentProblem):
    """OVS took the mtu_request, then could not configure the port (exit 3); the journal puts it back."""


class Mtu(Knob):
    kind = "mtu"
    on_ovs_dpdk_port = True  # its mtu_request

    @classmethod
    def plan_place_problem(cls, key: str, value: Any, place: PlanPlace) -> str | None:
        try:
            check_mtu(value, "mtu")
        except BadInput as exc:
            return str(exc)
        return None

    def __init__(self, target, key: str) -> None:
        super().__init__(target, key)
        self._ovs_port: bool | None = None
        self._ovs_type: str | None = None
        self._status_seen: dict[str, str] = {}  # the port's status while it was attached, for messages

    def _vsctl(self, *args: str) -> str:
        """ovs-vsctl against the lab's private database (works from the journal alone)."""
        return vsctl(self.host, self._rundir(), *args).strip()

    def _rundir(self) -> str:
        """The lab's private OVS run directory (only OVS ports get here: `_is_ovs_port` checked it)."""
        if not self.target.ovs_rundir:
            raise BadInput(f"{self.label}: {self.iface} is not a port of an OVS of this lab")
        return self.target.ovs_rundir

    def _is_ovs_port(self) -> bool:
        if not self.target.ovs_rundir:
            return False
        if self._ovs_port is None:
            self._ovs_port = self._vsctl("--if-exists", "get", "Interface", self.iface, "mtu_request") != ""
        return self._ovs_port

    def _is_dpdk_port(self) -> bool:
        """An OVS-DPDK port: an OVS Interface with no kernel interface behind it."""
        if not self._is_ovs_port():
            return False
        if self._ovs_type is None:
            self._ovs_type = self._vsctl("get", "Interface", self.iface, "type").strip('"')
        return self._ovs_type in DPDK_TYPES

    def _status(self) -> dict[str, str]:
        """The port's OVS `status` column (driver_name, if_descr, ...) as a dict."""
        text = self._vsctl("get", "Interface", self.iface, "status").strip("{}")
        status = {k.strip(): v.strip().strip('"') for k, _, v in
                  (part.partition("=") for part in re.findall(r'[A-Za-z_]+=(?:"[^"]*"|[^,]*)', text))}
        if status.get("driver_name") or not self._status_seen:
            self._status_seen = status
        return self._status_seen

    def _port_kind(self) -> str:
        """`dpdk1 (OVS type dpdk, net_tap, DPDK 22.11.11)` for messages."""
        status = self._status()
        what = [f"OVS type {self._ovs_type}"]
        if status.get("driver_name"):
            what.append(status["driver_name"])
        m = re.search(r"DPDK (\S+)", status.get("if_descr", ""))
        if m:
            what.append(f"DPDK {m.group(1)}")
        return f"{self.iface} ({', '.join(what)})"

    def _check_dpdk_port(self, mtu: int) -> str:
        status = self._status()
        driver = status.get("driver_name")
        limit = max_mtu(self._ovs_type or "", driver)
        if limit is not None and mtu > limit[0]:
            raise BadInput(f"{self.label}={mtu}: {self._port_kind()} takes frames ≤ {limit[1]} B, i.e. MTU ≤ "
                           f"{limit[0]}; OVS would accept mtu_request={mtu}, then take the port out of the "
                           f"datapath until it is put back")
        current = self._ovs_mtu()
        if driver in PINNED_MTU and mtu != current:
            raise BadInput(f"{self.label}={mtu}: {self._port_kind()} cannot change its MTU while the lab runs: "
                           f"{PINNED_MTU[driver]}; its MTU is the lab's (`lab up --mtu`, now {current})")
        return str(mtu)

    def _ovs_mtu(self) -> int | None:
        """OVS's `mtu` column: the MTU the port was configured with; None while it is out of the datapath."""
        out = self._vsctl("get", "Interface", self.iface, "mtu")
        return int(out) if out.isdigit() else None

    def _port_error(self) -> str:
        out = self._vsctl("get", "Interface", self.iface, "error")
        return "" if out in ("[]", '""') else out.strip('"')

    def _set_request(self, request: str, mtu: int | None = None) -> None:
        """Put back `mtu_request` as the journal has it. Cleared (`[]`), OVS keeps the MTU it last
        configured and undoes a kernel-set one: so first ask for the original `mtu`, then clear."""
        if request == "[]":
            if mtu is not None:
                self._vsctl("set", "Interface", self.iface, f"mtu_request={int(mtu)}")
            self._vsctl("clear", "Interface", self.iface, "mtu_request")
        else:
            self._vsctl("set", "Interface", self.iface, f"mtu_request={as_int('mtu_request', request)}")

    def _log_since(self, offset: int) -> list[str]:
        """Warnings and errors about this port that ovs-vswitchd logged after `offset` bytes."""
        try:
            with open(Path(self._rundir()) / "ovs-vswitchd.log", "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        name = re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(self.iface)}(?![A-Za-z0-9_-])")
        return [l.split("|", 4)[-1].strip() for l in text.splitlines()
                if ("|ERR|" in l or "|WARN|" in l) and (name.search(l) or "Frame size" in l)]

    def _log_size(self) -> int:
        try:
            return (Path(self._rundir()) / "ovs-vswitchd.log").stat().st_size
        except OSError:
            return 0

    def _apply_dpdk_port(self, mtu: int) -> None:
        """Ask OVS for `mtu` and wait until it has configured the port with it; OvsPortRefused
        (naming the port, its type and what OVS logged) when OVS could not."""
        offset = self._log_size()
        self._set_request(str(mtu))
        deadline = time.monotonic() + OVS_DPDK_MTU_WAIT
        while True:
            logged, error = self._log_since(offset), self._port_error()
            if logged or error:
                raise OvsPortRefused(f"{self.label}={mtu}: OVS could not configure {self._port_kind()} with "
                                     f"mtu_request={mtu}: {' | '.join(logged[-3:]) or error}; the original is put "
                                     f"back (the port may stay out of the datapath until it is: `offlab restore`)")
            if self._ovs_mtu() == mtu:
                return
            if time.monotonic() > deadline:
                raise OvsPortRefused(f"{self.label}={mtu}: OVS did not configure {self._port_kind()} with "
                                     f"mtu_request={mtu} within {OVS_DPDK_MTU_WAIT:g} s (its mtu reads "
                                     f"{self._ovs_mtu()})")
            time.sleep(0.2)

    def check(self, value: Any, plan: Plan) -> str:
        mtu = as_int(f"{self.label}", value, MTU_MIN, MTU_MAX)
        if self._is_dpdk_port():
            return self._check_dpdk_port(mtu)
        links = plan.links(self.target)
        me = links.get(self.iface)
        if me is None:
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        lo, hi = me.min_mtu or MTU_MIN, me.max_mtu or MTU_MAX
        if not lo <= mtu <= hi:
            raise BadInput(f"{self.label}: {mtu} is outside what {self.iface} accepts ({lo}..{hi})")
        under = me.vxlan_dev
        if under is not None:
            if under in links:
                over = VXLAN_OVERHEAD[me.vxlan_family]
                room = plan.mtu(self.target, under) - over
                if mtu > room:
                    raise BadInput(
                        f"{self.label}: {mtu} does not fit the VXLAN underlay {under} "
                        f"(MTU {plan.mtu(self.target, under)} − {over} = {room}); raise {under} first"
                    )
        for name, link in links.items():
            if link.vxlan_dev == self.iface:
                need = plan.mtu(self.target, name) + VXLAN_OVERHEAD[link.vxlan_family]
                if mtu < need:
                    raise BadInput(
                        f"{self.label}: {mtu} is too small for the VXLAN device {name} on top of it "
                        f"(its MTU {plan.mtu(self.target, name)} needs an underlay of at least {need}); "
                        f"lower {name} first"
                    )
        if me.kind == "bridge":
            ports = {n: plan.mtu(self.target, n) for n, l in links.items() if l.master == self.iface}
            if ports and mtu > min(ports.values()):
                small = min(ports, key=lambda n: ports[n])
                raise BadInput(
                    f"{self.label}: {mtu} is more than its port {small} carries ({ports[small]}); "
                    f"a bridge's MTU follows its ports: set the ports' MTU instead"
                )
        plan.mtus[(self.target.host_key, self.iface)] = mtu
        return str(mtu)

    def snapshot(self) -> dict:
        if self._is_dpdk_port():
            return {"mtu": self._ovs_mtu(), "mtu_request": self._vsctl("get", "Interface", self.iface, "mtu_request")}
        snap: dict = {"mtu": int(_link(self.host, self.iface).mtu or 0)}
        if self._is_ovs_port():
            snap["mtu_request"] = self._vsctl("get", "Interface", self.iface, "mtu_request")
        return snap

    def show(self, snap: dict) -> str:
        return "none (out of the datapath)" if snap["mtu"] is None else str(snap["mtu"])

    def apply(self, value: str) -> None:
        if self._is_dpdk_port():
            self._apply_dpdk_port(int(value))
        elif self._is_ovs_port():
            self._vsctl("set", "Interface", self.iface, f"mtu_request={int(value)}")
        else:
            self.host.run(["ip", "link", "set", "dev", self.iface, "mtu", str(int(value))], timeout=10)

    def restore(self, snap: dict) -> None:
        if self._is_dpdk_port():
            if self.same(self.snapshot(), snap):
                return
            self._set_request(snap["mtu_request"], snap["mtu"])
            deadline = time.monotonic() + OVS_DPDK_MTU_WAIT  # the caller reads it back and judges
            while self._ovs_mtu() != snap["mtu"] and time.monotonic() < deadline:
                time.sleep(0.2)
            return
        if "mtu_request" in snap and self._is_ovs_port():
            self._set_request(snap["mtu_request"], snap["mtu"])
        if int(_link(self.host, self.iface).mtu or 0) != snap["mtu"]:
            self.host.run(["ip", "link", "set", "dev", self.iface, "mtu", str(int(snap["mtu"]))], timeout=10)

    def explain(self, value: str, before: Any, after: Any) -> str:
        if self._is_dpdk_port():
            return f"{self.label}: requested {value}, OVS configured {self._port_kind()} with {self.show(after)}"
        return super().explain(value, before, after)

    def gone(self) -> str | None:
        """An OVS port goes with its lab's OVS (or out of it); any other interface with its namespace."""
        rundir = self.target.ovs_rundir
        if rundir and not (Path(rundir) / "db.sock").exists():
            return f"the OVS of lab {self.target.lab or '?'} is gone ({rundir}): nothing to restore"
        if rundir and self._vsctl("--if-exists", "get", "Interface", self.iface, "type") != "":
            return None
        return super().gone()

    def side_state(self) -> dict[str, str]:
        """The MTU of the bridge this port belongs to: it follows its ports."""
        if self._is_dpdk_port():
            return {}
        master = _link(self.host, self.iface).master
        if not master:
            return {}
        return {f"{master} mtu": str(_link(self.host, master).mtu)}


class TxQueueLen(Knob):
    kind = "txqueuelen"

    def check(self, value: Any, plan: Plan) -> str:
        n = as_int(self.label, value, 0, 1_000_000)
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        return str(n)

    def snapshot(self) -> int:
        return int(_link(self.host, self.iface).txqlen or 0)

    def apply(self, value: str) -> None:
        self.host.run(["ip", "link", "set", "dev", self.iface, "txqueuelen", str(int(value))], timeout=10)

    def restore(self, snap: int) -> None:
        if self.snapshot() != snap:
            self.apply(str(int(snap)))
