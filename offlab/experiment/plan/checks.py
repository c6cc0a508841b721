"""Everything about a plan that can be judged without a lab: hosts, interfaces, knobs, values, tools.

Each check here replaces an error that used to surface only once the lab was up
(or a child tool had started); `offlab run --validate` runs all of them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Callable

from offlab.errors import BadInput
from offlab.experiment.plan import topology as static
from offlab.experiment.plan.errors import PlanErrors
from offlab.experiment.plan.models import Cell, Plan
from offlab.catalog import BASE_TOOLS, TESTPMD_TOPOLOGIES, TOPOLOGIES, taking_option
from offlab.lab.topologies import vxlan_mtu_problem
from offlab.names import IFNAME_PATTERN, ROLE_PATTERN
from offlab.traffic import BadWorkload

TARGET_RE = re.compile(f"^(machine|{ROLE_PATTERN})(:{IFNAME_PATTERN})?$")
LAB_OPTIONS = ("underlay_mtu", "vni", "port", "ports", "testpmd_idle")  # a plan's topology keys that only some topologies take


def check_target(err: PlanErrors, path: tuple, target: Any, kind: str, *, machine_ok: bool = True) -> tuple[str, str | None]:
    """(host, iface ref) of `HOST[:IFACE]`, after checking the host and interface exist in a `kind` lab."""
    if not isinstance(target, str) or not TARGET_RE.fullmatch(target) or (target == "machine" and not machine_ok):
        err.fail(path, f"{target!r} is not a host: use {', '.join(static.HOSTS[kind])} (optionally :IFACE or "
                       ":to-HOST)" + (", or machine for host-wide sysctls" if machine_ok else ""))
    role, _, ref = target.partition(":")
    if role == "machine":
        if ref:
            err.fail(path, "machine takes host-wide sysctls: give no :IFACE")
        return role, None
    try:
        if ref:
            static.resolve(kind, role, ref)
        elif role not in static.HOSTS[kind]:
            static.resolve(kind, role, None)  # raises, naming the hosts there are
    except ValueError as exc:
        err.fail(path, str(exc))
    return role, ref or None


def check_knob(err: PlanErrors, path: tuple, kind: str, target: str, key: Any, value: Any, section: str) -> None:
    """One `features`/`settings` entry: a known key, on a host and interface it can apply to, a sane value.
    The knob's class judges its value and place (Knob.plan_value_problem, plan_place_problem)."""
    from offlab.knobs.base import PlanPlace
    from offlab.knobs.registry import plan_knob_class

    role, ref = target.partition(":")[0], target.partition(":")[2] or None
    try:
        cls = plan_knob_class(key, section)
    except BadInput as exc:
        err.fail(path, str(exc))
    problem = cls.plan_value_problem(key, value)
    if problem:
        err.fail(path, problem)
    if role == "machine":
        if not cls.on_machine:
            err.fail(path, f"'machine' takes host-wide sysctls only (net.*, kernel.*, vm.*), not {key!r}")
        return
    bridges = tuple(f"{r}:{i.name}" for r, ifs in static.HOSTS[kind].items() for i in ifs if i.kind == "bridge")
    place = PlanPlace(kind, target, role, ref, bridges=bridges, testpmd_labs=TESTPMD_TOPOLOGIES)
    if cls.needs_iface:
        try:
            iface = static.resolve(kind, role, ref)
        except ValueError as exc:
            err.fail(path, f"{key} is a setting of an interface: {exc}")
        if iface.kind == "ovs-dpdk" and not cls.on_ovs_dpdk_port:
            err.fail(path, f"{key}: {target} is an OVS-DPDK port, not a kernel interface; its one setting is mtu "
                           f"(its mtu_request)")
        place = replace(place, iface_kind=iface.kind)
    problem = cls.plan_place_problem(key, value, place)
    if problem:
        err.fail(path, problem)


def check_cell(err: PlanErrors, cell: Cell, blame: Callable[[str, str], tuple]) -> None:
    """Topology and workload values of one cell; `blame(section, key)` is the path that set the key."""
    from offlab.mtu.calc import MIN_MTU

    topo = cell.topology
    if topo.ipv6 and topo.mtu < MIN_MTU[6]:
        err.fail(blame("topology", "mtu"), f"mtu {topo.mtu} with ipv6: IPv6 needs an MTU of at least {MIN_MTU[6]}")
    record = TOPOLOGIES[topo.kind]
    if "underlay_mtu" in record.options:
        problem = vxlan_mtu_problem(topo.mtu, topo.underlay_mtu)
        if problem:
            err.fail(blame("topology", problem[0] if topo.underlay_mtu is not None else "mtu"), problem[1])
    for key in LAB_OPTIONS:
        if getattr(topo, key) is not None and key not in record.options:
            err.fail(blame("topology", key), f"{key} applies to a {' or '.join(taking_option(key))} lab only, "
                                             f"not {topo.kind}")
    if topo.nic or topo.guest_cpus is not None:
        _check_guest(err, cell, blame)
    if record.borrows_ports and (not topo.ports or len(topo.ports) != 2 or len(set(topo.ports)) != 2):
        err.fail(blame("topology", "ports" if topo.ports else "kind"),
                 f"a {topo.kind} lab needs ports: [IF1, IF2], two different ports of this machine cabled to each other")
    try:
        cell.workload.traffic(ipv6=topo.ipv6).check()
    except BadWorkload as exc:
        err.fail(blame("workload", exc.field), f"{exc.why} (got {exc.value})")
    if cell.workload.kind != "stream":
        from offlab.experiment.plan.models import RR_FIELDS

        try:
            cell.workload.rr_workload(ipv6=topo.ipv6).check()
        except BadWorkload as exc:
            plan_name = {v: k for k, v in RR_FIELDS.items()}.get(exc.field, exc.field)
            err.fail(blame("workload", plan_name), f"{exc.why} (got {exc.value})")


def _check_guest(err: PlanErrors, cell: Cell, blame: Callable[[str, str], tuple]) -> None:
    """A guest's NIC properties and vCPUs, judged as `lab up --nic` judges them (offlab.lab's
    check_guest_options: the properties this QEMU has). Without QEMU here `lab up` says so instead."""
    from offlab.errors import EnvironmentProblem
    from offlab.lab import GUEST_TOPOLOGIES, check_guest_options

    topo = cell.topology
    if topo.kind not in GUEST_TOPOLOGIES:
        err.fail(blame("topology", "nic" if topo.nic else "guest_cpus"),
                 f"nic and guest_cpus are for guest topologies ({', '.join(GUEST_TOPOLOGIES)}), not {topo.kind}")
    try:
        check_guest_options({"nic": dict(topo.nic), **({"guest_cpus": topo.guest_cpus} if topo.guest_cpus else {})})
    except BadInput as exc:
        err.fail(blame("topology", "nic"), str(exc))
    except EnvironmentProblem:
        pass


def no_op_warnings(plan: Plan) -> list[str]:
    """Settings of a cell known to do nothing before anything runs, one line per cell and setting:
    testpmd GRO/GSO outside csum forwarding; TSO/USO/GSO with a workload that makes nothing to segment."""
    from offlab.knobs.features import ALIASES, LEGACY
    from offlab.knobs.testpmd import check_value, is_testpmd_key, no_ops

    out = []
    for cell in plan.cells:
        tp = {k[len("testpmd."):]: check_value(k, v) for _, k, v in cell.changes if is_testpmd_key(k)}
        if TOPOLOGIES[cell.topology.kind].testpmd:
            out += [f"cell {cell.key}: {line}" for line in no_ops(tp)]
        if cell.workload.kind != "stream":
            continue
        w = cell.workload.traffic(ipv6=cell.topology.ipv6)
        on = [(target, key, ALIASES.get(key, LEGACY.get(key, (key,))[0])) for target, key, value in cell.changes
              if str(value).lower() in ("on", "true")]
        # A cell that turns on TSO and USO together sets a hop up for either protocol: no warning for the other.
        both = {"tcp-segmentation-offload", "tx-udp-segmentation"} <= {name for _, _, name in on}
        for target, key, name in on:
            if name == "tcp-segmentation-offload" and w.protocol == "udp" and not both:
                out.append(f"cell {cell.key}: {target} {key}=on does nothing for a UDP workload (TSO segments TCP)")
            elif name in ("tx-udp-segmentation", "generic-segmentation-offload") and w.protocol == "udp" \
                    and not w.gso:
                out.append(f"cell {cell.key}: {target} {key}=on has nothing to segment: UDP datagrams are sent one "
                           f"by one unless the workload sets gso (UDP_SEGMENT, the engine's)")
            elif name == "tx-udp-segmentation" and w.protocol == "tcp" and not both:
                out.append(f"cell {cell.key}: {target} {key}=on does nothing for a TCP workload (USO segments UDP)")
    return out


def required_tools(plan: Plan) -> list[str]:
    """The programs the plan's cells will start, and only those: iperf3 only if a cell uses it, etc."""
    tools = [*BASE_TOOLS, "taskset"]
    for kind in dict.fromkeys(c.topology.kind for c in plan.cells):
        tools += [t for t in TOPOLOGIES[kind].tools if t not in tools]  # the lab's own, as `lab up` checks them
    used = {c.workload.tool for c in plan.cells if c.workload.kind != "rr"}
    used |= {"engine" for c in plan.cells if c.workload.kind != "stream"}
    if "iperf3" in used:
        tools += ["iperf3", "ss"]
    if "engine" in used:
        tools.append("offlab-engine")
    if plan.capture is not None:
        tools.append("tcpdump")
    if any(c.workload.big_packets for c in plan.cells):
        tools.append("nft")  # the counters of packets over 64 KiB (offlab.probes.edge.bigpackets)
    return tools


def check_tools(plan: Plan) -> None:
    """ToolMissing (exit 3, with the install command) for the first tool the plan needs and lacks."""
    from offlab.hosts import require_tool
    from offlab.traffic.engine import engine_path

    for tool in required_tools(plan):
        if tool == "offlab-engine":
            engine_path()
        else:
            require_tool(tool)
