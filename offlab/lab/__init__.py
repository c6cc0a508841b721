"""Labs: topologies of network namespaces that offlab builds and tears down."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

from offlab.errors import BadInput, NotRoot, OfflabError
from offlab.hosts import LOCAL, is_root, require_tool
from offlab.lab.build import Builder, LabBuildFailed
from offlab.lab.model import TOPOLOGIES, LabState
from offlab.lab.ovs import stop_daemon
from offlab.lab.topologies import BUILDERS, VXLAN_OVERHEAD_V4
from offlab.names import MTU_MAX, check_lab_name, check_mtu
from offlab.state import state_dir

__all__ = ["up", "down", "down_all", "list_labs", "LabState", "LabBuildFailed", "TOPOLOGIES"]

TOOLS_BY_TOPOLOGY = {
    "ovs": ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovsdb-tool"),
    "vm": ("qemu-system-x86_64",),
}


def _check_request(topology: str, name: str, mtu: int, options: dict) -> None:
    if topology not in BUILDERS:
        raise BadInput(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    check_lab_name(name)
    check_mtu(mtu)
    if topology == "vxlan":
        under = options.get("underlay_mtu")
        if under is not None:
            check_mtu(under, "--underlay-mtu")
            if mtu > under - VXLAN_OVERHEAD_V4:
                raise BadInput(
                    f"--mtu {mtu} does not fit the VXLAN underlay: at most underlay MTU {under} - 50 = {under - 50}"
                )
        elif mtu + VXLAN_OVERHEAD_V4 > MTU_MAX:
            raise BadInput(f"--mtu {mtu} is too large for vxlan: the underlay needs {mtu} + 50 ≤ {MTU_MAX}")
        for key, lo, hi in (("vni", 1, 2**24 - 1), ("port", 1, 65535)):
            val = options.get(key)
            if val is not None and not (isinstance(val, int) and lo <= val <= hi):
                raise BadInput(f"--{key} {val!r} is out of range {lo}..{hi}")


def up(topology: str, name: str | None = None, *, mtu: int = 1500, ipv6: bool = False,
       options: dict | None = None) -> LabState:
    """Build a lab; on failure tear down what was built and raise naming the step."""
    name = name or topology[:10]
    options = dict(options or {})
    _check_request(topology, name, mtu, options)
    if not is_root():
        raise NotRoot("building a lab")
    for tool in ("ip", "ethtool", *TOOLS_BY_TOPOLOGY.get(topology, ())):
        require_tool(tool)
    lab = LabState(name=name, topology=topology, mtu=mtu, ipv6=ipv6, options=options)
    _claim(lab)
    try:
        builder = Builder(lab)
        BUILDERS[topology](builder, mtu)
        _check_mtus(lab)
        builder.verify()
        lab.status, lab.step = "up", ""
        lab.save()
    except BaseException as exc:
        lab.status = "failed"
        lab.save()
        down(name)
        if isinstance(exc, OfflabError) and not isinstance(exc, LabBuildFailed):
            raise LabBuildFailed(f"lab up {name}: step '{lab.step}' failed: {exc}") from exc
        raise
    return lab


def _claim(lab: LabState) -> None:
    """Create the state file exclusively: two `lab up` of one name cannot both win."""
    path = lab.path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise BadInput(
            f"a lab named {lab.name!r} already exists: `offlab lab down {lab.name}` or choose another --name"
        ) from None
    os.close(fd)
    lab.save()


def _check_mtus(lab: LabState) -> None:
    """Every interface must have the MTU asked for; the kernel may have clamped one."""
    for role, entry in lab.hosts.items():
        links = json.loads(lab.host(role).run(["ip", "-d", "-j", "link", "show"]).stdout)
        for link in links:
            if link["ifname"] == "lo" or link.get("ifname") == "ovs-netdev":
                continue
            want = lab.options.get("underlay_mtu") if _is_underlay(lab, role, link["ifname"]) else lab.mtu
            if link["mtu"] != want:
                raise BadInput(
                    f"MTU {want} did not take on {role}:{link['ifname']} (it has {link['mtu']}, "
                    f"max_mtu {link.get('max_mtu')})"
                )


def _is_underlay(lab: LabState, role: str, ifname: str) -> bool:
    return lab.topology == "vxlan" and (role == "switch" or ifname == "u0")


def down(name: str) -> list[str]:
    """Remove everything a lab made; idempotent; returns what it removed."""
    check_lab_name(name)
    path = LabState.path_for(name)
    removed: list[str] = []
    lab = None
    if path.exists():
        try:
            lab = LabState.load(name)
        except (ValueError, KeyError):
            lab = None  # a torn state file: fall back to the naming convention below
    if not is_root() and (lab is not None or _namespaces_named(name)):
        raise NotRoot("removing a lab")
    if lab is not None:
        for d in reversed(lab.daemons):
            stop_daemon(d)
            removed.append(f"{d.name} (pid {d.pid})")
    namespaces = list(dict.fromkeys([*(lab.namespaces if lab else []), *_namespaces_named(name)]))
    for ns in namespaces:
        _kill_processes_in(ns)
    for ns in namespaces:
        if LOCAL.run(["ip", "netns", "del", ns], check=False).ok:
            removed.append(f"namespace {ns}")
    if lab is not None and lab.rundir:
        shutil.rmtree(lab.rundir, ignore_errors=True)
    from offlab.knobs.journal import forget_namespaces  # here: knobs imports lab

    dropped = forget_namespaces(namespaces)
    if dropped:
        removed.append(f"{len(dropped)} journalled setting(s) of its namespaces (they went with them)")
    path.unlink(missing_ok=True)
    return removed


def down_all() -> list[str]:
    """Every lab that has a state file in this state directory."""
    removed = []
    for lab_name in sorted(p.stem for p in (state_dir() / "labs").glob("*.json")):
        removed += down(lab_name)
    return removed


def list_labs() -> list[LabState]:
    labs = []
    for p in sorted((state_dir() / "labs").glob("*.json")):
        try:
            labs.append(LabState.load(p.stem))
        except (OfflabError, ValueError, KeyError):
            continue
    return labs


def _namespaces_named(lab: str) -> list[str]:
    """Namespaces that follow this lab's naming (ol-<lab>-<host>), state file or not."""
    res = LOCAL.run(["ip", "-j", "netns", "list"], check=False)
    if not res.ok or not res.stdout.strip():
        return []
    prefix = f"ol-{lab}-"
    return [n["name"] for n in json.loads(res.stdout) if n["name"].startswith(prefix)
            and "-" not in n["name"][len(prefix):]]


def _kill_processes_in(ns: str) -> None:
    """Processes inside a lab namespace can only have been started there through offlab."""
    res = LOCAL.run(["ip", "netns", "pids", ns], check=False)
    pids = [int(p) for p in res.stdout.split()] if res.ok else []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
            time.sleep(0.02)
        if not pids:
            return
