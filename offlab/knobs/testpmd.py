"""dpdk-testpmd's settings as knobs: `testpmd.gro`, `testpmd.csum.tcp`, `testpmd.gso_segsz`, ...

Each is read back from testpmd itself (`show config rxtx`, `show port N gro|gso`, `show port N
tx_offload configuration`), journalled like any knob and put back exactly: a per-port setting is
snapshotted per port. A value given once applies to every port; `PORT:VALUE[,PORT:VALUE]` sets
those ports only (e.g. `testpmd.csum.ip=0:hw` where port 1 lacks it). Stopping forwarding or the
ports, and moving tap ports back into testpmd's namespace and home again, is the driver's job
(`Testpmd.reconfigure`). A setting this DPDK or PMD lacks is refused before anything changes
(BadInput, naming the setting, the PMD and the DPDK version).

Three values testpmd only shows while in use (GRO flush cycles and GSO segment size while GRO/GSO
is on, the TSO segment size while TSO is on) are otherwise the value offlab last set, recorded in
testpmd's state file; testpmd's own defaults (1 cycle, 1514 B, 0) until then.
"""

from __future__ import annotations

from typing import Any

from offlab.dpdk import Testpmd
from offlab.dpdk.ports import PMD_MAX_MTU
from offlab.dpdk.testpmd import DESCRIPTORS_MAX, GSO_SEGSZ_MAX, TestpmdNoAnswer
from offlab.errors import BadInput
from offlab.knobs.base import Knob, Plan, PlanPlace, as_bool, as_int, onoff
from offlab.wire import TCP_FRAME_OVERHEAD

PREFIX = "testpmd."
FWD_MODES = ("io", "mac", "macswap", "csum", "5tswap", "rxonly", "icmpecho")
CSUM_PROTOS = {"ip": "IPV4_CKSUM", "udp": "UDP_CKSUM", "tcp": "TCP_CKSUM", "sctp": "SCTP_CKSUM"}
PER_PORT = {"gro", "gso", "tso_segsz", *(f"csum.{p}" for p in CSUM_PROTOS)}
# name → (lowest, highest) for the integer settings; testpmd's own limits (22.11 cmdline and config)
RANGES = {"burst": (1, 512), "rxd": (16, DESCRIPTORS_MAX), "txd": (16, DESCRIPTORS_MAX), "gro_flush": (1, 4),
          "gso_segsz": (64, GSO_SEGSZ_MAX), "tso_segsz": (0, 9000)}
TSO_HEADERS = TCP_FRAME_OVERHEAD  # the headers the tap PMD adds to a TSO segment
TAP_TSO_MAX = PMD_MAX_MTU - TSO_HEADERS  # the tap PMD drops a TSO segment whose size + headers exceed its MTU
NAMES = ("fwd", "burst", "rxd", "txd", "gro", "gro_flush", "gso", "gso_segsz", "tso_segsz",
         *(f"csum.{p}" for p in CSUM_PROTOS))
# Settings that need their port stopped (and so its tap moved back) to take: descriptors all ports.
PORT_STOP = {"rxd", "txd", "tso_segsz", *(f"csum.{p}" for p in CSUM_PROTOS)}


def is_testpmd_key(key: str) -> bool:
    return key.startswith(PREFIX)


def check_value(key: str, value: Any) -> str:
    """`value` of testpmd setting `key` in canonical text, or BadInput: what can be judged without a
    testpmd (a plan's --validate and `lab set` alike; the PMD's own limits are checked on the lab)."""
    name = key[len(PREFIX):]
    if name not in NAMES:
        raise BadInput(f"unknown testpmd setting {key!r}: use testpmd.{', testpmd.'.join(NAMES)}")
    if name in PER_PORT and ":" in str(value):
        return ",".join(f"{n}:{_one_value(key, name, v)}" for n, v in sorted(per_port(key, value).items()))
    return _one_value(key, name, value)


def _one_value(key: str, name: str, value: Any) -> str:
    if name == "fwd":
        if value not in FWD_MODES:
            raise BadInput(f"{key}: {value!r} is not a forwarding mode offlab drives; use one of {', '.join(FWD_MODES)}")
        return str(value)
    if name in ("gro", "gso"):
        return onoff(as_bool(key, value))
    if name.startswith("csum."):
        mode = str(value).lower()
        if mode not in ("hw", "sw"):
            raise BadInput(f"{key}: expected hw or sw, got {value!r}")
        return mode
    return str(as_int(key, value, *RANGES[name]))


def per_port(key: str, value: Any) -> dict[str, str]:
    """`PORT:VALUE[,PORT:VALUE]` (one port's setting, the others left as they are) → {port: value}."""
    out = {}
    for part in str(value).replace(" ", "").split(","):
        n, sep, v = part.partition(":")
        if not sep or not n.isdigit() or not v:
            raise BadInput(f"{key}={value}: write VALUE for every port, or PORT:VALUE[,PORT:VALUE] (e.g. 0:hw)")
        out[str(int(n))] = v
    return out


# testpmd 22.11 runs GRO and GSO only in its csum forwarding engine (csumonly.c): in any other mode they
# are accepted, read back "on" and do nothing (a dpdk-vm lab's guest got 0.995 packets per packet sent).
NEEDS_CSUM = ("gro", "gso")


def no_ops(values: dict[str, str]) -> list[str]:
    """Why settings that will be in force (`values`: name → canonical value, e.g. {"fwd": "io",
    "gro": "on"} or {"gro": "0:on"}) do nothing, one line each: known before any traffic runs."""
    fwd = values.get("fwd", "io")
    on = [name for name in NEEDS_CSUM
          if "on" in (part.rpartition(":")[2] for part in str(values.get(name, "")).split(","))]
    return [f"testpmd.{name}=on does nothing with testpmd.fwd={fwd}: testpmd runs GRO and GSO only in its csum "
            f"forwarding engine; add testpmd.fwd=csum (and testpmd.csum.tcp=hw on the port that sends merged "
            f"packets to a guest)" for name in on if fwd != "csum"]


class TestpmdSetting(Knob):
    kind = "testpmd"
    needs_iface = False

    @classmethod
    def plan_place_problem(cls, key: str, value: Any, place: PlanPlace) -> str | None:
        if place.topology not in place.testpmd_labs:
            return (f"{key} is a setting of dpdk-testpmd: only a {' or '.join(place.testpmd_labs)} lab runs one, "
                    f"not {place.topology}")
        if place.role != "switch" or place.ref is not None:
            return f"{key} is a setting of the testpmd on host switch, not of {place.target}"
        try:  # the same judgement as `lab set` makes before it asks testpmd
            check_value(key, value)
        except BadInput as exc:
            return str(exc)
        return None

    @property
    def name(self) -> str:
        name = self.key[len(PREFIX):]
        if name not in NAMES:
            raise BadInput(f"unknown testpmd setting {self.key!r}: use testpmd.{', testpmd.'.join(NAMES)}")
        return name

    @property
    def testpmd(self) -> Testpmd:
        lab = self.target.lab
        tp = Testpmd.for_lab(lab) if lab else None
        if tp is None:
            raise BadInput(f"{self.key}: lab {lab or '?'} runs no dpdk-testpmd (testpmd settings need a dpdk lab, "
                           f"on its switch host)")
        return tp

    @property
    def label(self) -> str:
        return f"{self.target.where} {self.key}"

    # ---- check -------------------------------------------------------------
    def check(self, value: Any, plan: Plan) -> str:
        name, tp = self.name, self.testpmd
        if self.target.role not in (None, "switch") or self.target.netns != tp.info.netns:
            raise BadInput(f"{self.key} is a setting of the testpmd on host switch, not of {self.target.where}")
        if not tp.alive():
            # the machine changed under us, not the input: exit 3, with what testpmd last said
            raise TestpmdNoAnswer(f"{self.key}: dpdk-testpmd (pid {tp.info.pid}) of lab {self.target.lab} died: "
                                  f"{tp.last_lines()}; `offlab lab down {self.target.lab}` and `lab up` again")
        if name in PER_PORT and ":" in str(value):
            ports = {str(p.index): p for p in tp.info.ports}
            per_port = self._per_port(value)
            for n in per_port:
                if n not in ports:
                    raise BadInput(f"{self.key}={value}: testpmd of lab {self.target.lab} has ports "
                                   f"{', '.join(sorted(ports))}, not {n}")
            return ",".join(f"{n}:{self._check_one(name, tp, v, [ports[n]])}" for n, v in sorted(per_port.items()))
        return self._check_one(name, tp, value, tp.info.ports)

    def _per_port(self, value: Any) -> dict[str, str]:
        return per_port(self.key, value)

    def _check_one(self, name: str, tp: Testpmd, value: Any, ports: list) -> str:
        ver, pmds = tp.info.version, sorted({p.pmd for p in ports})
        text = _one_value(self.key, name, value)
        if name in ("gro", "gso"):
            if text == "on" and "af_packet" in pmds:
                why = ("sets no mbuf packet type, so GRO merges nothing" if name == "gro" else
                       "has no TX checksum offload, so GSO output keeps the super-packet's TCP checksum")
                raise BadInput(f"{self.key}=on: the af_packet PMD {why} (DPDK {ver}); use `lab up dpdk --pmd tap`")
            return text
        if name.startswith("csum."):
            if text == "hw":
                self._need_capability(tp, CSUM_PROTOS[name[5:]], ports)
            return text
        if name == "fwd":
            return text
        n = int(text)
        if name == "tso_segsz" and n:
            self._need_capability(tp, "TCP_TSO", ports)
            if "tap" in pmds and n > TAP_TSO_MAX:
                raise BadInput(f"{self.key}={n}: the tap PMD (DPDK {ver}) drops every TSO segment whose segment "
                               f"size + {TSO_HEADERS} B of headers exceeds its MTU {PMD_MAX_MTU}; use at most {TAP_TSO_MAX}")
        return str(n)

    def _need_capability(self, tp: Testpmd, flag: str, ports: list) -> None:
        for p in ports:
            if flag not in tp.capabilities(p.index):
                raise BadInput(f"{self.key}: port {p.index} ({p.pmd} PMD) has no {flag} TX offload in DPDK "
                               f"{tp.info.version}: this setting cannot be tested here")

    # ---- read --------------------------------------------------------------
    def snapshot(self) -> Any:
        name, tp = self.name, self.testpmd
        s = tp.settings()
        ports = s["ports"]
        if name == "fwd":
            return s["fwd"]
        if name == "burst":
            return s["burst"]
        if name in ("rxd", "txd"):
            return ports[min(ports)][name]
        if name in ("gro", "gso"):
            return {str(n): onoff(p[name]["on"]) for n, p in ports.items()}
        if name == "gro_flush":
            shown = [p["gro"]["flush"] for p in ports.values() if p["gro"]["on"] and p["gro"]["flush"]]
            return shown[0] if shown else tp.info.gro_flush
        if name == "gso_segsz":
            shown = [p["gso"]["segsz"] for p in ports.values() if p["gso"]["on"] and p["gso"]["segsz"]]
            return shown[0] if shown else tp.info.gso_segsz
        if name == "tso_segsz":
            return {str(n): p["tso_segsz"] for n, p in ports.items()}
        return {str(n): p["csum"][name[5:]] for n, p in ports.items()}

    def show(self, snap: Any) -> str:
        if isinstance(snap, dict):
            values = set(map(str, snap.values()))
            return values.pop() if len(values) == 1 else " ".join(f"{n}:{v}" for n, v in sorted(snap.items()))
        return str(snap)

    def satisfied(self, value: str, snap: Any) -> bool:
        if isinstance(snap, dict) and ":" in value:
            return all(str(snap.get(n)) == v for n, v in self._per_port(value).items())
        return self.show(snap) == value

    def same(self, a: Any, b: Any) -> bool:
        def norm(s: Any) -> Any:
            return {str(k): str(v) for k, v in s.items()} if isinstance(s, dict) else str(s)
        return norm(a) == norm(b)

    # ---- change ------------------------------------------------------------
    def apply(self, value: str) -> None:
        tp = self.testpmd
        self._set(tp, self._per_port(value) if ":" in value else {str(p.index): value for p in tp.info.ports})

    def restore(self, snap: Any) -> None:
        if self.same(self.snapshot(), snap):
            return
        tp = self.testpmd
        self._set(tp, snap if isinstance(snap, dict) else {str(p.index): snap for p in tp.info.ports})

    def _set(self, tp: Testpmd, per_port: dict[str, Any]) -> None:
        name = self.name
        if name in PER_PORT:
            # only the ports whose setting differs: a port already so is neither written nor stopped
            now = self.snapshot()
            per_port = {n: v for n, v in per_port.items() if str(now.get(n)) != str(v)}
            if not per_port:
                return
        one = str(next(iter(per_port.values())))
        if name == "fwd":
            cmds = [f"set fwd {one}"]
        elif name == "burst":
            cmds = [f"set burst {one}"]
        elif name in ("rxd", "txd"):
            cmds = [f"port config all {name} {one}"]
        elif name == "gro_flush":
            cmds = [f"set gro flush {one}"]
        elif name == "gso_segsz":
            cmds = [f"set gso segsz {one}"]
        elif name in ("gro", "gso"):
            cmds = [f"set port {n} {name} {v}" for n, v in per_port.items()]
        elif name == "tso_segsz":
            cmds = [f"tso set {v} {n}" for n, v in per_port.items()]
        else:
            cmds = [f"csum set {name[5:]} {v} {n}" for n, v in per_port.items()]
        # testpmd 22.11 takes checksum and TSO changes only on a stopped port, descriptor counts only
        # with every port stopped; GRO, GSO, fwd and burst need forwarding stopped, not the ports
        stop = True if name in ("rxd", "txd") else [int(n) for n in per_port] if name in PORT_STOP else []
        tp.reconfigure(cmds, port_stop=stop)
        if name in ("gro_flush", "gso_segsz", "tso_segsz"):
            tp.remember(name, per_port)

    def gone(self) -> str | None:
        tp = Testpmd.for_lab(self.target.lab) if self.target.lab else None
        if tp is None or not tp.alive():
            return "dpdk-testpmd gone: nothing to restore"
        return None
