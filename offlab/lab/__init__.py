"""Labs: topologies of network namespaces that offlab builds and tears down."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from typing import Callable

from offlab import netdev
from offlab.errors import BadInput, EnvironmentProblem, NotRoot, OfflabError
from offlab.hosts import LOCAL, NetnsHost, is_root, require_tool
from offlab.hosts.process import exited, process_start_time, running, signal_pid
from offlab.interrupts import protected, shielded
from offlab.lab import owner
from offlab.lab.build import Builder, LabBuildFailed
from offlab.lab.hold import hold, holders
from offlab.catalog import BASE_TOOLS, GUEST_TOPOLOGIES, HOSTS, TOPOLOGIES, borrows_ports, taking_option
from offlab.lab.model import LabState
from offlab.lab.ovs import stop_daemon
from offlab.lab.vm import check_guest_options
from offlab.names import check_lab_name, check_mtu
from offlab.state import state_dir

__all__ = ["up", "remove", "Removal", "state_names", "daemon_died", "LabDaemonDied", "GUEST_TOPOLOGIES", "list_labs", "health", "removed", "hold", "holders", "LabState",
           "LabBuildFailed", "LabInUse", "TOPOLOGIES"]


class LabInUse(EnvironmentProblem):
    """A live run or measurement holds the lab."""


def _check_request(topology: str, name: str, mtu: int, options: dict) -> None:
    if topology not in TOPOLOGIES:
        raise BadInput(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    check_lab_name(name)
    check_mtu(mtu)
    topo = TOPOLOGIES[topology]
    if topo.guests:
        check_guest_options(options, topology)
    if "ports" in options and "ports" not in topo.options:
        raise BadInput(f"--ports is for `lab up {' / '.join(taking_option('ports'))}`, not {topology}")
    if topo.check is not None:
        topo.check(name, mtu, options)


def up(topology: str, name: str | None = None, *, mtu: int = 1500, ipv6: bool = False,
       options: dict | None = None) -> LabState:
    """Build a lab; on failure tear down what was built and raise naming the step."""
    name = name or topology.replace("-", "")[:10]
    options = dict(options or {})
    _check_request(topology, name, mtu, options)
    if not is_root():
        raise NotRoot("building a lab")
    for tool in (*BASE_TOOLS, *TOPOLOGIES[topology].tools):
        require_tool(tool)
    if TOPOLOGIES[topology].ovs_dpdk:
        from offlab.lab.ovs_dpdk import require_vswitchd  # here: DPDK's parts are for DPDK labs only

        require_vswitchd()
    lab = LabState(name=name, topology=topology, mtu=mtu, ipv6=ipv6, options=options,
                   owner=owner.owner_tag()[len(owner.PREFIX):],
                   builder={"pid": os.getpid(), "start_time": process_start_time(os.getpid())})
    _refuse_foreign(name)
    _claim(lab)
    try:
        builder = Builder(lab)
        TOPOLOGIES[topology].build(builder, mtu)
        _check_mtus(lab)
        builder.verify()
        if TOPOLOGIES[topology].testpmd:
            from offlab.dpdk import Testpmd  # here: DPDK's parts are for DPDK labs only

            tp = Testpmd.for_lab(name)
            if tp is not None:
                tp.rest()  # up and checked: one that rests while idle forwards from now on only while offlab sends
        lab.status, lab.step = "up", ""
        lab.save()
    except BaseException as exc:
        _undo_failed_up(lab, exc)
        if isinstance(exc, OfflabError) and not isinstance(exc, LabBuildFailed):
            raise LabBuildFailed(f"lab up {name}: step '{lab.step}' failed: {exc}") from exc
        raise
    return lab


@protected  # a second Ctrl-C, or one in the instant the build failed, waits until what was built is gone
def _undo_failed_up(lab: LabState, exc: BaseException) -> None:
    """What a failed (or interrupted) `lab up` built, removed; its state says failed meanwhile."""
    lab.status = "failed"
    try:
        lab.save()
    except OfflabError:
        pass  # e.g. a full disk: the older state file still lists everything built
    try:
        # Nothing was journalled yet (knobs act on a lab that is up): nothing to put back.
        remove(lab.name, force=True, put_back=lambda _lab: [])
    except OfflabError as undo:  # e.g. a phys port that would not come back: both must be said
        raise LabBuildFailed(f"lab up {lab.name}: step '{lab.step}' failed: {exc}; and undoing it failed: "
                             f"{undo}") from exc


def _refuse_foreign(name: str) -> None:
    """A lab of this name made from another state directory: its namespaces are not ours to reuse."""
    for ns in _namespaces_named(name):
        who = owner.owner_of(ns)
        if who and owner.owner_tag() != owner.PREFIX + who:
            raise BadInput(f"lab name {name!r} is taken by the state directory {who} (namespace {ns}): "
                           f"choose another --name, or OFFLAB_STATE_DIR={who} offlab lab down {name}")


def _claim(lab: LabState) -> None:
    """Create the state file exclusively: two `lab up` of one name cannot both win."""
    path = lab.path
    path.parent.mkdir(parents=True, exist_ok=True)
    claimed = False
    try:
        with shielded():  # a SIGHUP between the create and the write left an empty file: "corrupt lab"
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise BadInput(
                    f"a lab named {lab.name!r} already exists: `offlab lab down {lab.name}` or choose another --name"
                ) from None
            claimed = True
            os.close(fd)
            lab.save()
    except BaseException:  # an error, or a signal that waited for the claim: nothing was built yet
        if claimed:
            path.unlink(missing_ok=True)
        raise


def _check_mtus(lab: LabState) -> None:
    """Every interface must have the MTU asked for; the kernel may have clamped one."""
    for role, entry in lab.hosts.items():
        if entry.netns is None:
            continue  # an SSH host: a lab over existing machines sets no MTU of its own
        links = netdev.link_rows(lab.host(role), details=True, timeout=30)
        for link in links:
            if link.ifname in ("lo", "ovs-netdev"):
                continue
            want = lab.options.get("underlay_mtu") if _is_underlay(lab, role, link.ifname) else lab.mtu
            if link.mtu != want:
                raise BadInput(
                    f"MTU {want} did not take on {role}:{link.ifname} (it has {link.mtu}, "
                    f"max_mtu {link.max_mtu})"
                )


def _is_underlay(lab: LabState, role: str, ifname: str) -> bool:
    topo = TOPOLOGIES.get(lab.topology)
    return topo is not None and (role in topo.underlay_roles or ifname in topo.underlay_ifaces)


@dataclasses.dataclass
class Removal:
    """What `remove` did: a line per thing removed, and the namespaces that went (their settings with them)."""

    lines: list[str]
    namespaces: list[str]


def remove(name: str, *, put_back: Callable[[LabState], list[str]], force: bool = False) -> Removal:
    """Remove everything this state directory made for a lab; idempotent. Callers use
    `offlab.experiment.teardown.down`, which also restores and forgets the lab's journalled settings.

    Refuses a lab that a live run or measurement holds (unless `force`), and never touches a
    namespace another state directory made (see lab/owner.py), even one that has our lab's name.
    A lab over interfaces that outlive it (`hosts`, `phys`) first has `put_back(lab)` return their
    journalled settings (lab imports no knobs, so the caller passes the step).
    """
    check_lab_name(name)
    path = LabState.path_for(name)
    lab = None
    if path.exists():
        try:
            lab = LabState.load(name)
        except BadInput:
            if not force:
                raise
            lab = None  # a torn state file: the owner marks in the namespaces still say what is ours
    named = _namespaces_named(name)
    if not is_root() and (lab is not None or named):
        raise NotRoot("removing a lab")
    users = holders(name)
    if users and not force:
        who = ", ".join(f"{u.get('what', 'a process')} (pid {u['pid']})" for u in users)
        raise LabInUse(f"lab {name!r} is in use by {who}: wait for it to finish, or "
                       f"`offlab lab down --force {name}` to pull it from under it")
    if lab is not None and lab.status != "removing":
        lab.status = "removing"  # first, so a run whose lab this was can tell "removed" from a failure
        try:
            lab.save()
        except OfflabError:
            pass  # a full disk must not keep a lab alive
    recorded = lab.namespaces if lab else []
    inodes = lab.netns_inodes if lab else {}
    ours, foreign, half_made = [], {}, []
    for ns in dict.fromkeys([*recorded, *named]):
        mine = owner.is_ours(ns, recorded, inodes)
        if mine:
            ours.append(ns)
        elif mine is False:
            foreign[ns] = owner.owner_of(ns) or "no offlab state directory (unmarked)"
        elif ns in recorded and owner.half_made(ns):
            half_made.append(ns)  # our `ip netns add` was cut off; its name was recorded before it ran
    if foreign and lab is None and not path.exists():
        ns, who = next(iter(foreign.items()))
        raise BadInput(f"lab {name!r} is not this state directory's ({owner.owner_tag()[len(owner.PREFIX):]}): "
                       f"namespace {ns} belongs to {who}; offlab leaves it alone"
                       + (f" (OFFLAB_STATE_DIR={who} offlab lab down {name})" if who.startswith("/") else ""))
    removed: list[str] = []
    if lab is not None and (lab.topology == HOSTS or borrows_ports(lab.topology)):
        # Interfaces that outlive the lab (an SSH host's port, a phys port): their settings go back first.
        removed += put_back(lab)
    if lab is not None and lab.topology == HOSTS:
        from offlab.lab import hosts as hosts_lab

        removed += hosts_lab.teardown(lab, also={u["pid"] for u in users if isinstance(u.get("pid"), int)})
    if lab is not None:
        from offlab.dpdk import remove_runtime  # here: only DPDK labs' daemons have a runtime directory

        for d in reversed(lab.daemons):
            if d.netns is None or d.netns in ours:
                stop_daemon(d, netns_inode=owner.inode(d.netns) if d.netns else None)
                removed.append(f"{d.name} (pid {d.pid})")
                if d.runtime_dir and remove_runtime(d.runtime_dir):
                    removed.append(f"DPDK runtime directory {d.runtime_dir}")
    for ns in ours:
        _kill_processes_in(ns)
    if lab is not None and lab.ports:
        from offlab.lab import phys

        # Before any namespace goes: removing one would destroy a veth inside it. Raises (the lab
        # file kept, namespaces kept) when a port does not come back as it was.
        removed += phys.give_back(lab)
        removed += phys.ifindex_note(lab)
    for ns in ours:
        removed.append(_delete_namespace(ns))
    for ns in half_made:
        owner.remove_half_made(ns)
        removed.append(f"the file of namespace {ns} (its `ip netns add` was cut off before mounting it)")
    for ns, who in foreign.items():
        removed.append(f"nothing of namespace {ns}: it belongs to {who}, not to this state directory")
    if lab is not None and lab.rundir:
        shutil.rmtree(lab.rundir, ignore_errors=True)
    _forget_hosts(lab, ours)
    path.unlink(missing_ok=True)
    return Removal(removed, ours)


def _forget_hosts(lab: LabState | None, namespaces: list[str]) -> None:
    """What this process kept about the lab's hosts ends with the lab (hosts/memo.py): a lab of the
    same name built next starts with nothing learned from this one."""
    hosts = [NetnsHost(ns) for ns in namespaces]
    for role in lab.hosts if lab is not None else []:
        try:
            hosts.append(lab.host(role))
        except OfflabError:
            pass  # a reference this offlab cannot follow kept nothing here either
    for host in hosts:
        host.forget()


def _delete_namespace(ns: str) -> str:
    """`ip netns del`, retried: a process that was just killed can keep the namespace busy briefly."""
    err = ""
    for _ in range(10):
        res = LOCAL.run(["ip", "netns", "del", ns], check=False)
        # Not ok but gone: a run whose lab this was removed it at the same moment; gone all the same.
        if res.ok or owner.inode(ns) is None:
            return f"namespace {ns}"
        err = res.stderr.strip()
        time.sleep(0.1)
    raise EnvironmentProblem(f"could not remove namespace {ns}: {err}; run `offlab lab down` again")


def abandoned() -> list[str]:
    """Labs whose `lab up` died before the lab was up (kill -9 mid-build): their QEMU, testpmd and
    namespaces belong to nobody now. A lab that is up is the user's until `lab down`."""
    names = []
    for lab in list_labs():
        b = lab.builder
        if lab.status != "up" and b.get("pid") and process_start_time(b["pid"]) != b.get("start_time"):
            names.append(lab.name)
    return names


def phys_in_use_by_nobody(*, force: bool = False) -> list[str]:
    """Phys labs that are up and that no live run or measurement holds (any, with `force`): their ports
    are this machine's own, which `offlab restore` gives back like every setting offlab changed."""
    return [lab.name for lab in list_labs() if borrows_ports(lab.topology) and lab.status == "up"
            and (force or not holders(lab.name))]


def state_names() -> list[str]:
    """The names of every lab with a state file in this state directory, readable or not."""
    return sorted(p.stem for p in (state_dir() / "labs").glob("*.json"))


def list_labs() -> list[LabState]:
    """The labs whose state file loads; see `survey` for the broken and unreadable ones too."""
    return [lab for lab, _ in survey() if lab is not None]


def survey() -> list[tuple[LabState | None, str | None]]:
    """Every lab state file: (lab, None) when healthy, (lab, why) when broken, (None, why) when unreadable."""
    out: list[tuple[LabState | None, str | None]] = []
    for p in sorted((state_dir() / "labs").glob("*.json")):
        try:
            lab = LabState.load(p.stem)
        except BadInput as exc:
            out.append((None, f"{p.stem}: {exc}"))
            continue
        out.append((lab, health(lab)))
    return out


def removed(lab: LabState) -> str | None:
    """Why a lab this process uses is being or has been removed (by `lab down`), else None."""
    path = LabState.path_for(lab.name)
    try:
        status = LabState.load(lab.name).status if path.exists() else "gone"
    except BadInput:
        status = "unreadable"
    if status == "gone":
        return "its state file was removed"
    if status == "removing":
        return "`lab down` is removing it"
    return health(lab) if any(owner.inode(ns) is None for ns in lab.namespaces) else None


def health(lab: LabState) -> str | None:
    """Why a lab is broken (a namespace or daemon gone, a namespace not ours), None if all is there."""
    problems = []
    for ns in lab.namespaces:
        mine = owner.is_ours(ns, lab.namespaces, lab.netns_inodes)
        if mine is None:
            problems.append(f"namespace {ns} is gone")
        elif not mine:
            problems.append(f"namespace {ns} belongs to {owner.owner_of(ns) or 'someone else'}")
    problems += [f"{d.name} (pid {d.pid}) is not running" + (f" (its last lines: {words})" if words else "")
                 for d, words in _dead_daemons(lab)]
    if lab.status != "up" and not problems:
        problems.append(f"status {lab.status} at step '{lab.step}'")
    return "; ".join(problems) or None


class LabDaemonDied(EnvironmentProblem):
    """A daemon the lab depends on (testpmd, ovs-vswitchd) died while the lab was in use."""


def daemon_died(lab: LabState) -> LabDaemonDied | None:
    """The error to raise when one of a lab's daemons is gone: it, its last lines, and the fix."""
    dead = _dead_daemons(lab)
    if not dead:
        return None
    d, words = dead[0]
    return LabDaemonDied(f"{d.name} (pid {d.pid}) of lab {lab.name} died: {words or '(no log)'}; "
                         f"`offlab lab down {lab.name}` and `offlab lab up {lab.topology} --name {lab.name}` "
                         f"make it again")


def _dead_daemons(lab: LabState) -> list[tuple]:
    """(daemon, its last log lines or "") for every recorded daemon that has exited (its leader a zombie
    counts: a killed testpmd's taps are gone at once, its threads take seconds more to end, and a
    measure that failed meanwhile must name the daemon, not its traffic's error)."""
    dead = []
    for d in lab.daemons:
        if d.pid and not exited(d.pid) and (d.start_time is None or process_start_time(d.pid) == d.start_time):
            continue
        dead.append((d, _last_words(lab, d.name)))
    return dead


def _last_words(lab: LabState, daemon: str) -> str:
    """What a dead daemon last logged: testpmd's console, ovs-vswitchd's warnings and errors."""
    try:
        if daemon == "dpdk-testpmd":
            from offlab.dpdk import Testpmd

            tp = Testpmd.for_lab(lab.name)
            return tp.last_lines() if tp is not None else ""
        if daemon == "ovs-vswitchd-dpdk" and lab.rundir:
            from pathlib import Path

            from offlab.lab.ovs_dpdk import last_lines

            return last_lines(Path(lab.rundir))
    except (OfflabError, OSError):
        return ""
    return ""


def _namespaces_named(lab: str) -> list[str]:
    """Namespaces that follow this lab's naming (ol-<lab>-<host>), state file or not."""
    prefix = f"ol-{lab}-"
    return [n for n in netdev.netns_names(LOCAL, timeout=30) if n.startswith(prefix) and "-" not in n[len(prefix):]]


def _kill_processes_in(ns: str) -> None:
    """Processes inside a lab namespace can only have been started there through offlab. Listed
    again once they are gone: one still entering it (`ip netns exec` joins, then execs) when the
    namespace was first listed is in it by then. A zombie is gone (hosts.process.running): waiting
    for its parent to reap it only delayed the teardown."""
    seen: set[int] = set()
    for _ in range(3):
        res = LOCAL.run(["ip", "netns", "pids", ns], check=False)
        pids = [int(p) for p in res.stdout.split() if int(p) not in seen] if res.ok else []
        if not pids:
            return
        seen.update(pids)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                signal_pid(pid, sig)
            deadline = time.monotonic() + 2
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if running(p)]
                time.sleep(0.02)
            if not pids:
                break
