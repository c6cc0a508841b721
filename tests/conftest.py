"""Shared fixtures: a private state directory per test, and a check that nothing is left behind."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.pgcluster import pg  # noqa: F401  (the session's private PostgreSQL, a fixture for every module)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every long-lived program offlab or a test starts (comm, cut to 15 characters as the kernel keeps it).
OUR_PROCESSES = ("iperf3", "offlab-engine", "ovs-vswitchd", "ovs-vswitchd-dp", "ovsdb-server", "tcpdump",
                 "qemu-system-x86", "dpdk-testpmd", "sockperf", "sshd")
_counter = itertools.count()


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return {n["name"] for n in json.loads(out)} if out.strip() else set()


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return {l["ifname"] for l in json.loads(out)}


def our_processes() -> set[int]:
    """Processes with the names offlab starts that belong to this test process.

    Ours: descendants of this process (in any namespace), and processes inside a namespace whose name
    is ours (a daemon that detached, e.g. `iperf3 -D`). Another pytest worker or session on this
    machine runs its own labs meanwhile: processes in its namespaces, or in the root namespace and
    not ours by descent, are not counted. A process in a namespace nobody names any more (deleted
    while the process lives on) counts: a leak, unless it is gone when `clean_machine` looks again.
    """
    root_ns = os.stat("/proc/self/ns/net").st_ino
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,comm="], capture_output=True, text=True).stdout
    rows = [l.split(None, 3) for l in out.splitlines() if l.strip()]
    parent = {int(pid): int(ppid) for pid, ppid, _, _ in rows}
    candidates = {}
    for pid, _, stat, comm in rows:
        # A zombie has exited: a detached daemon's parent here may be a PID 1 that never reaps it.
        if comm.strip() not in OUR_PROCESSES or stat.startswith("Z"):
            continue
        try:
            candidates[int(pid)] = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
    # Read the names after `ps`, so a namespace made meanwhile is named, not taken for an orphan.
    named = {}
    for name in netns_names():
        try:
            named[os.stat(f"/run/netns/{name}").st_ino] = name
        except OSError:
            pass
    pids = set()
    for pid, ns in candidates.items():
        if _descends_from_us(pid, parent):
            pids.add(pid)
        elif ns in named:
            if named[ns].startswith(OUR_NAMESPACES):
                pids.add(pid)
        elif ns != root_ns:
            pids.add(pid)
    return pids


def _descends_from_us(pid: int, parent: dict[int, int]) -> bool:
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        pid = parent.get(pid, 1)
    return False


requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces")


@pytest.fixture(autouse=True)
def _leases_end_with_their_test():
    """A test that reached SSH hosts in this process (a library transaction, a spawned remote process)
    may hold leases there, renewed by a thread of this process: released when the test ends, as a
    command's are when it ends, so no renewal reopens a master or reaches a stand-in torn down since."""
    yield
    leases = sys.modules.get("offlab.hosts.lease")
    if leases is not None:
        leases.release_all()


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("OFFLAB_STATE_DIR", str(d))
    return d


# Labs made by this test process (lab_name fixture) or by runners it starts (OFFLAB_LAB_PREFIX):
# the leftover check counts only these, since other sessions may build labs on the same machine.
# Four digits, so that one tag is never a prefix of another (tag 512 vs 5123).
TEST_TAG = f"{os.getpid() % 10000:04d}"
os.environ["OFFLAB_LAB_PREFIX"] = f"x{TEST_TAG}"
OUR_NAMESPACES = (f"ol-t{TEST_TAG}", f"ol-x{TEST_TAG}")


PHYS_PORT_RE = re.compile(r"^ph(\d{4})[a-z]{1,2}$")
# Root links a lab makes are `ol<lab><index>` (offlab.names.link_name); test labs are t<TAG>…, x<TAG>….
LAB_LINK_RE = re.compile(r"^ol[tx](\d{4})")


def phys_port(suffix: str) -> str:
    """A root link standing in for a NIC port in test_lab_phys (`ph<TEST_TAG><suffix>`)."""
    return f"ph{TEST_TAG}{suffix}"


def another_runs_link(link: str) -> bool:
    """A root link of ANOTHER test run or pytest worker on this machine (a phys stand-in port or a
    lab's link with another tag): not ours to flag. Ours, and every other new root link, are."""
    m = PHYS_PORT_RE.fullmatch(link) or LAB_LINK_RE.match(link)
    return bool(m) and m.group(1) != TEST_TAG


def new_links_of_ours(before: set[str]) -> set[str]:
    """Root links made since `before`, except another run's."""
    return {l for l in root_links() - before if not another_runs_link(l)}


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
    left_links = new_links_of_ours(before_links)
    left_procs = our_processes() - before_procs
    if left_procs:  # another worker's process in transit (its namespace just deleted) is gone by now
        time.sleep(1)
        left_procs &= our_processes()
    if (state_dir / "labs").exists():
        from offlab.experiment import teardown

        teardown.down_all()
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
    from offlab.experiment import teardown

    built = lab.up("veth", lab_name)
    try:
        yield built
    finally:
        teardown.down(lab_name)


def kill_9_once_daemon_is_recorded(topology: str, name: str, state_dir, what: str, timeout: float = 120,
                                   daemon_name: str | None = None, nth: int = 0) -> dict:
    """Start `offlab lab up TOPOLOGY --name NAME`, kill -9 it as soon as its first daemon (QEMU,
    testpmd: recorded when it exists, before offlab waits for it) — or its `nth` — is in the lab
    file; that daemon. With `daemon_name`: once the daemon of that name has a pid (ovs-dpdk records
    ovsdb-server first)."""
    import signal

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
    """A process that exists and is not a zombie (PID 1 here does not reap detached daemons); a zombie
    leader whose other threads still run (dpdk-testpmd for ~2 s after its leader exits) still runs."""
    from pathlib import Path

    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            return True
        return len(list(Path(f"/proc/{pid}/task").iterdir())) > 1
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


# `make test` runs four pytest workers (pytest-xdist, --dist loadfile): a module runs whole on one
# worker, so its shared lab or guest is built once. Two modules must therefore never change the same
# machine-wide setting (a lease on a host-wide sysctl): test_concurrency uses net.core.message_cost,
# test_knobs_napi net.core.busy_poll/busy_read, and nothing else takes a lease. The slowest modules go
# first, so that no worker is left with a long one at the end: each run records how long every
# module took (.venv/test-durations.json, this checkout's own); a fresh clone starts from the
# recorded run committed as tests/durations.json (refresh it with `make test-durations`).
RECORDED_DURATIONS = os.path.join(REPO, ".venv", "test-durations.json")
COMMITTED_DURATIONS = os.path.join(REPO, "tests", "durations.json")
_test_seconds: dict[str, float] = {}

# `make test-fast` (pytest --fast): the inner loop. A test is in it when its last recorded run took less
# than this (setup, call and teardown), it builds nothing shared with other tests of its module (no
# fixture wider than a test: a module's lab or guest, the session's PostgreSQL) — so leaving its
# neighbours out never moves their setup onto it. A test not recorded yet (a new one) is in.
FAST_TEST_SECONDS = 1.0


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true", default=False,
                     help=f"only tests recorded under {FAST_TEST_SECONDS} s that share no module- or session-wide "
                          "fixture (the inner loop; `make test` runs them all)")


def _module_of(nodeid: str) -> str:
    return os.path.basename(nodeid.split("::", 1)[0]).removesuffix(".py")


def recorded_durations() -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per test module and per test from the last recorded run (this checkout's, else the
    committed one). An older record holds modules only."""
    for path in (RECORDED_DURATIONS, COMMITTED_DURATIONS):
        try:
            with open(path) as f:
                data = json.load(f)
            if "modules" in data:
                return ({str(k): float(v) for k, v in data["modules"].items()},
                        {str(k): float(v) for k, v in data.get("tests", {}).items()})
            return {str(k): float(v) for k, v in data.items()}, {}
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    return {}, {}


def _shares_a_wide_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope != "function" and d.baseid != ""
               for defs in info.name2fixturedefs.values() for d in defs)


def pytest_collection_modifyitems(config, items):
    modules, tests = recorded_durations()
    if config.getoption("--fast"):
        keep, drop = [], []
        for item in items:
            seconds = tests.get(item.nodeid)
            slow = (seconds is not None and seconds >= FAST_TEST_SECONDS) or _shares_a_wide_fixture(item)
            (drop if slow else keep).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # slowest first; stable, so the order within a module is kept; an unrecorded module goes last
    items.sort(key=lambda item: -modules.get(item.module.__name__.rsplit(".", 1)[-1], 0.0))


def pytest_runtest_logreport(report):
    # Called in the process that runs the test and, under xdist, again in the controller for every report.
    _test_seconds[report.nodeid] = _test_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """The controller (or the only process) records the durations of a run that ran most modules."""
    if hasattr(session.config, "workerinput") or not os.path.isdir(os.path.dirname(RECORDED_DURATIONS)):
        return
    ran: dict[str, float] = {}
    for nodeid, seconds in _test_seconds.items():
        ran[_module_of(nodeid)] = ran.get(_module_of(nodeid), 0.0) + seconds
    if len(ran) < 20 or session.config.getoption("--fast"):  # a partial run says nothing of the rest
        return
    modules, tests = recorded_durations()
    modules.update({m: round(s, 1) for m, s in ran.items()})
    tests.update({t: round(s, 2) for t, s in _test_seconds.items()})
    data = {"modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])), "tests": dict(sorted(tests.items()))}
    tmp = RECORDED_DURATIONS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, RECORDED_DURATIONS)


@pytest.fixture
def shared_dir():
    """A directory other users can traverse (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="offlab-nonroot-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
