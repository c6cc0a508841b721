"""Shared fixtures: a private state directory per test, and a check that nothing is left behind."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUR_PROCESSES = ("iperf3", "offlab-engine", "ovs-vswitchd", "ovs-vswitchd-dp", "ovsdb-server", "tcpdump")
_counter = itertools.count()


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return {n["name"] for n in json.loads(out)} if out.strip() else set()


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return {l["ifname"] for l in json.loads(out)}


def our_processes(exclude_netns: set[str] = frozenset()) -> set[int]:
    """Processes with the names offlab starts, except those inside other people's namespaces.

    The machine is shared: another session's lab may be running iperf3 in its own
    named namespace at the same time; that is not ours to count.
    """
    foreign = set()
    for name in exclude_netns:
        try:
            foreign.add(os.stat(f"/run/netns/{name}").st_ino)
        except OSError:
            pass
    root_ns = os.stat("/proc/self/ns/net").st_ino
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,comm="], capture_output=True, text=True).stdout
    rows = [l.split(None, 3) for l in out.splitlines() if l.strip()]
    parent = {int(pid): int(ppid) for pid, ppid, _, _ in rows}
    pids = set()
    for pid, _, stat, comm in rows:
        # A zombie has exited: a detached daemon's parent here may be a PID 1 that never reaps it.
        if comm.strip() not in OUR_PROCESSES or stat.startswith("Z"):
            continue
        try:
            ns = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
        if ns in foreign or (ns == root_ns and not _descends_from_us(int(pid), parent)):
            continue
        pids.add(int(pid))
    return pids


def _descends_from_us(pid: int, parent: dict[int, int]) -> bool:
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        pid = parent.get(pid, 1)
    return False


requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces")


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("OFFLAB_STATE_DIR", str(d))
    return d


# Labs made by this test process (lab_name fixture) or by runners it starts (OFFLAB_LAB_PREFIX):
# the leftover check counts only these, since other sessions may build labs on the same machine.
TEST_TAG = f"{os.getpid() % 10000}"
os.environ["OFFLAB_LAB_PREFIX"] = f"x{TEST_TAG}"
OUR_NAMESPACES = (f"ol-t{TEST_TAG}", f"ol-x{TEST_TAG}")


PHYS_PORT_RE = re.compile(r"^ph(\d{1,4})[a-z]{1,2}$")


def phys_port(suffix: str) -> str:
    """A root link standing in for a NIC port in test_lab_phys (`ph<TEST_TAG><suffix>`)."""
    return f"ph{TEST_TAG}{suffix}"


def _another_runs_phys_port(link: str) -> bool:
    """A stand-in port of ANOTHER test run (its test_lab_phys is running beside ours): not ours to flag.
    Our own run's stand-ins, and every other new root link, are still flagged."""
    m = PHYS_PORT_RE.fullmatch(link)
    return bool(m) and m.group(1) != TEST_TAG


@pytest.fixture
def lab_name():
    """A lab name unique to this test run, so parallel sessions never collide."""
    return f"t{TEST_TAG}{next(_counter)}"[:10]


@pytest.fixture
def clean_machine(state_dir):
    """Assert that the test left no namespace, root link or process of ours behind."""
    before_ns, before_links, before_procs = netns_names(), root_links(), our_processes()
    yield
    left_ns = {n for n in netns_names() - before_ns if n.startswith(OUR_NAMESPACES)}
    left_links = {l for l in root_links() - before_links if not _another_runs_phys_port(l)}
    left_procs = our_processes(exclude_netns=netns_names() - {n for n in left_ns}) - before_procs
    if (state_dir / "labs").exists():
        from offlab import lab

        lab.down_all()
    assert not left_ns, f"namespaces left behind: {left_ns}"
    assert not left_links, f"links left behind: {left_links}"
    assert not left_procs, f"processes left behind: {left_procs}"


def offlab_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real `offlab` command (this checkout) as a person would."""
    return subprocess.run(
        [sys.executable, "-m", "offlab", *args], capture_output=True, text=True, timeout=timeout,
        cwd=REPO, env={**os.environ, **(env or {})},
    )


@pytest.fixture
def veth_lab(lab_name, clean_machine):
    """A veth lab (client ─ veth ─ server), removed after the test."""
    from offlab import lab

    built = lab.up("veth", lab_name)
    try:
        yield built
    finally:
        lab.down(lab_name)


def kill_9_once_daemon_is_recorded(topology: str, name: str, state_dir, what: str, timeout: float = 120,
                                   daemon_name: str | None = None, nth: int = 0) -> dict:
    """Start `offlab lab up TOPOLOGY --name NAME`, kill -9 it as soon as its first daemon (QEMU,
    testpmd: recorded when it exists, before offlab waits for it) — or its `nth` — is in the lab
    file; that daemon. With `daemon_name`: once the daemon of that name has a pid (ovs-dpdk records
    ovsdb-server first)."""
    import json
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "offlab", "lab", "up", topology, "--name", name],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = state_dir / "labs" / f"{name}.json"
    deadline = time.monotonic() + timeout
    daemon = None
    while daemon is None:
        assert time.monotonic() < deadline, f"{what} was never recorded in the lab file"
        try:
            daemons = [d for d in json.loads(path.read_text()).get("daemons", [])
                       if daemon_name is None or (d["name"] == daemon_name and d["pid"])]
            daemon = daemons[nth] if len(daemons) > nth else None
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return daemon


def running(pid: int) -> bool:
    """A process that exists and is not a zombie (PID 1 here does not reap detached daemons)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def module_lab(tmp_path_factory, topology: str, suffix: str, *args: str, timeout: float = 180):
    """`offlab lab up TOPOLOGY` for a whole test module (a lab whose daemons take long to start), in a
    state directory of its own; yields {name, env, shown, state} and, after `lab down`, adds its result
    ("down") for the module's own checks of what must be gone."""
    state = tmp_path_factory.mktemp(f"{suffix}-state")
    env = {"OFFLAB_STATE_DIR": str(state)}
    name = f"t{TEST_TAG}{suffix}"[:10]
    res = offlab_cli("lab", "up", topology, "--name", name, *args, "--json", env=env, timeout=timeout)
    assert res.returncode == 0, res.stderr
    lab = {"name": name, "env": env, "shown": json.loads(res.stdout), "state": state}
    try:
        yield lab
    finally:
        lab["down"] = offlab_cli("lab", "down", name, env=env)
    assert lab["down"].returncode == 0, lab["down"].stderr
