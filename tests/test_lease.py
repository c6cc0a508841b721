"""Leases (offlab.hosts.lease): an SSH host whose controller falls silent puts itself back.

Two stand-in machines `a` and `b` (tests/sshd.py `start_pair`: namespaces, each with its own sshd) reached
from a controller namespace, joined by two test links. The controllers are real offlab processes killed
with SIGKILL; the watchdogs are the real `sh` loops on the stand-in machines. Nothing is mocked. Leases are
a few seconds (the inventory's `lease`) so the proofs stay short.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offlab.hosts import NetnsHost
from tests import sshd as sshd_mod
from tests.conftest import OUR_NAMESPACES, REPO, requires_root
from tests.helpers import run as offlab_in_process, stand_in_machines

pytestmark = requires_root

LEASE = 3  # seconds: the lapse of the stand-in machines' leases in these tests


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with stand_in_machines(lambda: sshd_mod.start_pair(tmp_path_factory.mktemp("ls"), f"{OUR_NAMESPACES[0]}ls",
                                                       subnet=236, links=2)) as p:
        yield p


def inventory(pair, tmp_path, lease: int) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(json.dumps(pair.inventory(a={"lease": lease}, b={"lease": lease})))  # JSON is YAML
    return path


def feature(ns: str, iface: str) -> bool:
    out = NetnsHost(ns).run(["ethtool", "--json", "-k", iface]).stdout
    return json.loads(out)[0]["generic-receive-offload"]["active"]


def mtu(ns: str, iface: str) -> int:
    return json.loads(NetnsHost(ns).run(["ip", "-j", "link", "show", "dev", iface]).stdout)[0]["mtu"]


def leases_on(pair, side: str) -> list[str]:
    d = Path(pair.remote_dir(side)) / "lease"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def wait_for(what, check, guard: float = 120):
    """Poll `check` until it is true; the guard only stops a hang (not a timing target)."""
    end = time.monotonic() + guard
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within the {guard} s hang guard")


# A controller on the lab in argv[1]: changes gro and mtu on the server's t<argv[2]>, starts a server
# process there, says so, then waits (as a long sample would) until it is killed or sent SIGTERM.
CONTROLLER = """
import signal, sys, time
from offlab import lab
from offlab.knobs import Change, Transaction
from offlab.interrupts import interrupts
l = lab.LabState.load(sys.argv[1])
iface = "t" + sys.argv[2]
try:
    with interrupts(), Transaction("controller") as tx:
        tx.apply([Change(l.server, "gro", "on", iface, l), Change(l.server, "mtu", 1400, iface, l)])
        proc = l.host("server").spawn(["sleep", "300"])
        print("applied", flush=True)
        time.sleep(float(sys.argv[3]))
        proc.terminate(); proc.wait()
except (KeyboardInterrupt, SystemExit):  # SIGINT, SIGTERM, SIGHUP (offlab.interrupts): put back, then here
    pass
print("done", flush=True)
"""


def start_controller(pair, lab: str, link: int, state_dir, seconds: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, lab, str(link), str(seconds)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    line = proc.stdout.readline().strip()
    assert line == "applied", proc.stderr.read() if proc.poll() is not None else line
    return proc


def kill_controller(pair, proc: subprocess.Popen) -> None:
    """SIGKILL, then its ssh masters ended by pid (they outlive it for ControlPersist seconds, documented):
    from then on nothing reaches the machines from it."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()
    for line in sshd_mod.mux_processes(sshd_mod.Sshd(pair.dir, pair.controller, pair.b.ns, "", "")):
        if f"ControlPath=/tmp/offlab-ssh.{proc.pid}." in line or f"/ssh/{proc.pid}." in line:
            os.kill(int(line.split()[0]), signal.SIGTERM)


def lab_up(inv: Path, name: str, pair_text: str) -> None:
    """`lab up hosts` in this process; its leases (taken for the engine it copies) released as at the end of
    the `lab up` process: the engine copy stays journalled on the hosts for `lab down`."""
    from offlab.hosts import lease
    from offlab.lab import hosts as hosts_lab

    hosts_lab.up(name, str(inv), pair_text)
    lease.release_all()


def test_a_killed_controllers_host_puts_itself_back_and_the_next_restore_says_so(pair, tmp_path, state_dir,
                                                                                   lab_name):
    from offlab.experiment import teardown

    inv = inventory(pair, tmp_path, LEASE)
    lab_up(inv, lab_name, "a:t1,b:t1")
    try:
        before = (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1"))
        assert before == (False, 1500)
        proc = start_controller(pair, lab_name, 1, state_dir)
        assert (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1")) == (True, 1400)
        assert any(c.startswith("sleep 300") for c in sshd_mod.processes_in(pair.b.ns).values())
        kill_controller(pair, proc)
        # ...and the machine's management link cut at once: nothing from anywhere reaches it.
        NetnsHost(pair.b.ns).run(["ip", "link", "set", "mgmt", "down"])
        try:
            # No command is run anywhere: the machine's own watchdog puts it back once the lease lapses.
            wait_for("settings back and the server process ended on b",
                     lambda: (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1")) == before
                     and not any(c.startswith("sleep 300") for c in sshd_mod.processes_in(pair.b.ns).values()))
            # ...and then leaves: no process of offlab's on b (the watchdog neither), no lease.
            wait_for("the watchdog gone", lambda: sshd_mod.processes_in(pair.b.ns) == {} or print(sshd_mod.processes_in(pair.b.ns)))
            assert leases_on(pair, "b") == []
            record = list((Path(pair.remote_dir("b")) / "lapsed").glob("*.txt"))
            assert len(record) == 1, record
        finally:
            NetnsHost(pair.b.ns).run(["ip", "link", "set", "mgmt", "up"])
        # `lab show` and `hosts check` state the lease and what it did (and keep the record)...
        res = offlab_in_process("lab", "show", lab_name)
        assert res.returncode == 0, res.stderr
        assert f"lease server (b): {LEASE} s: the host puts itself back {LEASE} s after its controller falls " \
               "silent" in res.stdout, res.stdout
        assert "lapsed: b: restored by its lease at " in res.stdout, res.stdout
        res = offlab_in_process("hosts", "check", str(inv), "--host", "b")
        assert f"  info  lease: {LEASE} s: offlab's changes here are put back by the host itself" in res.stdout, res.stdout
        assert "  warn  lease lapsed: restored by its lease at " in res.stdout, res.stdout
        # ...and the next `offlab restore` that reaches b says it too, once, and clears it.
        res = offlab_in_process("restore")
        assert res.returncode == 0, res.stdout + res.stderr
        said = [l for l in res.stdout.splitlines() if l.startswith("b: ")]
        assert said and "restored by its lease at" in said[0] and "after the controller (pid " \
            f"{proc.pid}" in said[0] and "fell silent at" in said[0], res.stdout
        assert "b:   restored: t1 mtu: 1400 → back to 1500" in said and "b:   restored: t1 gro: on → back to off" \
            in said, said
        assert any(l.startswith("b:   restored: stop sleep 300") for l in said), said
        assert not (Path(pair.remote_dir("b")) / "lapsed").exists()
        assert "restored by its lease" not in offlab_in_process("restore").stdout
    finally:
        teardown.down(lab_name, force=True)
    assert not Path(pair.remote_dir("b")).exists(), list(Path(pair.remote_dir("b")).rglob("*"))
    assert sshd_mod.processes_in(pair.b.ns) == {}


def watchdog_of(pair, side: str, lease_id: str) -> int:
    pid, _ = (Path(pair.remote_dir(side)) / "lease" / lease_id / "ids").read_text().split()
    return int(pid)


def alive(pid: int) -> bool:
    from offlab.state import proc_start

    return proc_start(pid) is not None


def test_two_labs_on_one_host_each_have_their_own_lease_and_lab_down_stops_only_its_dead_ones(pair, tmp_path,
                                                                                              state_dir, lab_name):
    from offlab.experiment import teardown

    inv = inventory(pair, tmp_path, 60)  # nothing lapses in this test: lab down does the work
    labs = (lab_name, lab_name[:9] + "z")
    lab_up(inv, labs[0], "a:t1,b:t1")
    lab_up(inv, labs[1], "a:t2,b:t2")
    procs = []
    try:
        procs = [start_controller(pair, labs[0], 1, state_dir), start_controller(pair, labs[1], 2, state_dir)]
        ids = leases_on(pair, "b")
        assert len(ids) == 2 and leases_on(pair, "a") == [], ids  # one per controller; a was not changed
        owner = {i: int(i.split("-")[0]) for i in ids}
        first = next(i for i in ids if owner[i] == procs[0].pid)
        second = next(i for i in ids if owner[i] == procs[1].pid)
        dogs = {i: watchdog_of(pair, "b", i) for i in ids}
        assert all(alive(p) for p in dogs.values())
        kill_controller(pair, procs[0])
        # lab down of the first lab: its settings and process back, its dead controller's watchdog gone...
        res = offlab_in_process("lab", "down", labs[0])
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"stop the lease watchdog of pid {procs[0].pid} on " in res.stdout, res.stdout
        assert (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1")) == (False, 1500)
        wait_for("the first watchdog gone", lambda: not alive(dogs[first]))
        # ...and the second lab's lease, watchdog, settings and process untouched: its controller lives.
        assert leases_on(pair, "b") == [second] and alive(dogs[second])
        assert (feature(pair.b.ns, "t2"), mtu(pair.b.ns, "t2")) == (True, 1400)
        assert [c for c in sshd_mod.processes_in(pair.b.ns).values() if c.startswith("sleep 300")] == ["sleep 300"]
        # The second controller ends as interrupted (SIGTERM): it puts back, releases its lease and leaves.
        procs[1].send_signal(signal.SIGTERM)
        out, err = procs[1].communicate(timeout=120)
        assert out.strip() == "done", err
        assert leases_on(pair, "b") == [] and not alive(dogs[second])
        assert (feature(pair.b.ns, "t2"), mtu(pair.b.ns, "t2")) == (False, 1500)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for name in labs:
            teardown.down(name, force=True)
    assert sshd_mod.processes_in(pair.b.ns) == {} and sshd_mod.processes_in(pair.a.ns) == {}
    assert not Path(pair.remote_dir("b")).exists(), list(Path(pair.remote_dir("b")).rglob("*"))


def test_a_live_controller_is_never_undercut_and_a_failed_renewal_is_retried_and_said(pair, tmp_path, state_dir,
                                                                                        lab_name):
    """A controller holding its settings and process longer than twice its lease, whose renewals fail on the
    host for a while (the deadline cannot be written there): the failure is said, the renewals go on, the
    next that gets through is said too, and the host never puts itself back under it."""
    from offlab.experiment import teardown

    lease_s = 6  # renewals every 1.5 s: a block of 2.5 s fails at least one, and leaves the lease seconds to spare
    inv = inventory(pair, tmp_path, lease_s)
    lab_up(inv, lab_name, "a:t1,b:t1")
    proc = None
    try:
        proc = start_controller(pair, lab_name, 1, state_dir, seconds=2.5 * lease_s)
        ids = leases_on(pair, "b")
        lease_dir = Path(pair.remote_dir("b")) / "lease" / ids[0]
        seen, blocked = set(), False
        watch_until = time.monotonic() + 2 * lease_s  # then the controller ends its process and puts back
        while time.monotonic() < watch_until:
            # Held all along: the setting, the process, the lease.
            assert proc.poll() is None and leases_on(pair, "b") == ids, (leases_on(pair, "b"), proc.poll())
            seen.add((lease_dir / "deadline").read_text().split()[0])
            assert feature(pair.b.ns, "t1") is True
            assert any(c.startswith("sleep 300") for c in sshd_mod.processes_in(pair.b.ns).values())
            if not blocked and len(seen) >= 2:  # renewed at least once: now its renewals fail for a while
                (lease_dir / "deadline.t").mkdir()
                time.sleep(2.5)
                (lease_dir / "deadline.t").rmdir()
                blocked = True
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
        assert out.strip() == "done", err
        assert blocked and "offlab: lease on b: renewal failed (answered 'failed'); retrying every 1.5 s" in err, err
        assert "offlab: lease on b: renewed again after " in err and "lapsed" not in err, err
        assert len(seen) >= 3, seen  # the deadline moved on, before and after the failures
        assert not (Path(pair.remote_dir("b")) / "lapsed").exists()
        assert leases_on(pair, "b") == [] and (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1")) == (False, 1500)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        teardown.down(lab_name, force=True)
    assert sshd_mod.processes_in(pair.b.ns) == {}


# Host-wide and harmless (the burst of the kernel's network log rate limit), used by no other test.
MACHINE_SYSCTL = "net.core.message_burst"
MACHINE_PATH = Path("/proc/sys/net/core/message_burst")
MACHINE_HOLDER = """
import sys, time
from offlab.hosts import LOCAL
from offlab.knobs import Change, Transaction
with Transaction(label="holder") as tx:
    assert tx.apply([Change(LOCAL, sys.argv[1], sys.argv[2])])[0].ok
    print("ready", flush=True)
    time.sleep(300)
"""


@contextlib.contextmanager
def _machine_holder(state_dir, value: str, lapse: str):
    """A controller holding MACHINE_SYSCTL at `value` with a machine lease of `lapse` seconds, once it says
    it is ready; afterwards (whatever the test did to it) ended, and the sysctl as it was found."""
    original = MACHINE_PATH.read_text().strip()
    env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir), "OFFLAB_MACHINE_LEASE": lapse}
    holder = subprocess.Popen([sys.executable, "-c", MACHINE_HOLDER, MACHINE_SYSCTL, value],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read() if holder.poll() is not None else ""
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        holder.stderr.close()
        if MACHINE_PATH.read_text().strip() != original:
            MACHINE_PATH.write_text(original)


def test_a_host_wide_sysctl_of_a_killed_controller_comes_back_within_the_lapse_without_restore(tmp_path, state_dir):
    from offlab.state import proc_start

    original = MACHINE_PATH.read_text().strip()
    with _machine_holder(state_dir, str(int(original) + 7), "1") as holder:
        assert MACHINE_PATH.read_text().strip() == str(int(original) + 7)
        dogs = _watchdogs_of(holder.pid)
        assert len(dogs) == 1
        holder.kill()
        holder.wait()
        # Nothing is run: the watchdog sees the holder gone, waits the lapse, puts the sysctl back, leaves.
        wait_for("the sysctl back", lambda: MACHINE_PATH.read_text().strip() == original)
        wait_for("the watchdog gone", lambda: proc_start(dogs[0]) is None)
    # The next `offlab restore` says what the lease did, once; nothing is left to restore.
    res = offlab_in_process("restore")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("this machine: restored by its lease at ") and f"after pid {holder.pid} ended" \
        in lines[0], lines
    assert lines[1] == f"this machine:   restored machine {MACHINE_SYSCTL} = {original}", lines
    assert "restored by its lease" not in offlab_in_process("restore").stdout
    assert not list((state_dir / "journal").glob("*.journal"))


def test_a_killed_controllers_machine_watchdog_leaves_as_soon_as_offlab_restore_put_its_sysctl_back(state_dir):
    # With nothing of its owner's left open there is nothing to wait the lapse for (a test that killed a
    # controller and restored at once used to leave this process behind for the whole lapse).
    from offlab.hosts.process import signal_pid
    from offlab.state import proc_start

    original = MACHINE_PATH.read_text().strip()
    dogs: list[tuple[int, int | None]] = []  # each watchdog's pid and start time
    with _machine_holder(state_dir, str(int(original) + 5), "600") as holder:
        try:
            dogs = [(d, proc_start(d)) for d in _watchdogs_of(holder.pid)]
            [(dog, _)] = dogs
            holder.kill()
            holder.wait()
            res = offlab_in_process("restore")
            assert res.returncode == 0 and f"restored machine {MACHINE_SYSCTL} = {original}" in res.stdout, res.stdout
            wait_for("the watchdog gone", lambda: proc_start(dog) is None, guard=30)  # the lapse is 600 s
        finally:
            for dog, start in dogs:  # failed: the watchdog is not left for its 600 s (by pid and start time)
                if start is not None:
                    signal_pid(dog, signal.SIGTERM, start)
    assert not (state_dir / "lapsed").exists()  # it put nothing back itself


def _watchdogs_of(pid: int) -> list[int]:
    """The machine watchdogs (offlab.knobs.watchdog) of process `pid`, by their command line."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(
        f"{sys.executable} -m offlab.knobs.watchdog {pid} ")]


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("where,value,field", [
    ("offlab", "x", "host 'h': lease 'x'"), ("offlab", 1, "host 'h': lease 1"),
    ("ansible", "-5", "host 'h': lease '-5'"), ("ansible", 90000, "host 'h': lease 90000")])
def test_a_bad_lease_is_one_line_naming_the_host_and_the_field(where, value, field):
    from offlab import inventory
    from offlab.errors import BadInput

    if where == "offlab":
        data = {"hosts": {"h": {"ssh": "192.0.2.1", "lease": value}}}
    else:
        data = {"all": {"hosts": {"h": {"ansible_host": "192.0.2.1", "offlab_lease": value}}}}
    with pytest.raises(BadInput) as exc:
        inventory.parse(data, "inv.yml")
    assert str(exc.value).startswith(f"inv.yml: {field}: whole seconds, 2..86400 (the default is 60), or 0 for "
                                     "no lease"), str(exc.value)
    ok = {"hosts": {"h": {"ssh": "192.0.2.1", "lease": 0}}}
    assert inventory.parse(ok, "inv.yml").hosts["h"].ssh_host().lease == 0


# A controller whose first process on the server is cut short by its own SIGTERM, sent the moment the host
# has the record argv[3] names (a process's undo script, or a lease) and before the command that made it
# has answered: what the host goes on to do after that (start the process, the lease's watchdog) the
# controller never hears of.
CUT_SHORT = """
import glob, os, signal, sys, threading, time
from offlab import lab
from offlab.interrupts import interrupts
l = lab.LabState.load(sys.argv[1])
pattern = sys.argv[2] + {"process": "/undo/*-proc-*.sh", "lease": "/lease/*/owner"}[sys.argv[3]]
def fire():
    while not glob.glob(pattern):
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=fire, daemon=True).start()
try:
    with interrupts():
        l.host("server").spawn(["sleep", "300"])
        time.sleep(60)  # a hang guard: the signal comes long before
    print("not interrupted", flush=True)
except SystemExit:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("record", ["process", "lease"])
def test_a_command_cut_short_by_a_signal_leaves_nothing_of_it_on_the_host(pair, tmp_path, state_dir, lab_name,
                                                                          record):
    # The record appears on the host while the command that writes it is still running there. The
    # controller lets the command finish (its ssh client is not killed under it) and, at its exit, ends
    # what of its own the host holds that it lost track of. Without that: the process, its record and
    # directory, or the lease's watchdog (a `sh` and its `sleep`) stayed on b.
    from offlab.experiment import teardown

    inv = inventory(pair, tmp_path, 60)
    lab_up(inv, lab_name, "a:t1,b:t1")
    try:
        assert sshd_mod.processes_in(pair.b.ns) == {}
        res = subprocess.run([sys.executable, "-c", CUT_SHORT, lab_name, pair.remote_dir("b"), record], cwd=REPO,
                             capture_output=True, text=True, timeout=120,  # a hang guard
                             env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
        assert res.stdout == "interrupted\n", res.stdout + res.stderr
        remote = Path(pair.remote_dir("b"))
        assert not list(remote.glob("undo/*-proc-*.sh")) and not list(remote.glob("proc/*")), \
            list(remote.rglob("*"))
        assert leases_on(pair, "b") == []
        wait_for("no process of the controller's left on b", lambda: sshd_mod.processes_in(pair.b.ns) == {},
                 guard=10)
    finally:
        teardown.down(lab_name, force=True)
    assert not Path(pair.remote_dir("b")).exists(), list(Path(pair.remote_dir("b")).rglob("*"))


# `lab up hosts` in a process that sends itself SIGTERM the moment the server's journal has the record of
# the engine it is about to copy there (the command that wrote it not yet answered).
UP_CUT_SHORT = """
import glob, os, signal, sys, threading, time
from offlab.interrupts import interrupts
from offlab.lab import hosts as hosts_lab
def fire():
    while not glob.glob(sys.argv[3] + "/undo/*-engine.sh"):
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=fire, daemon=True).start()
try:
    with interrupts():
        hosts_lab.up(sys.argv[1], sys.argv[2], "a:t1,b:t1")
        time.sleep(60)  # a hang guard: the signal comes long before
    print("not interrupted", flush=True)
except SystemExit:
    print("interrupted", flush=True)
"""


def test_lab_up_hosts_interrupted_as_it_journals_its_engine_copy_leaves_neither_host_anything(pair, tmp_path,
                                                                                             state_dir, lab_name):
    # The host is in the lab before anything is put there, so the failed `lab up`'s teardown reaches it and
    # removes the record its interrupted command left (it used to be added only once its engine was copied).
    inv = inventory(pair, tmp_path, 60)
    res = subprocess.run([sys.executable, "-c", UP_CUT_SHORT, lab_name, str(inv), pair.remote_dir("b")], cwd=REPO,
                         capture_output=True, text=True, timeout=120,  # a hang guard
                         env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    assert res.stdout == "interrupted\n", res.stdout + res.stderr
    for side in ("a", "b"):
        assert not Path(pair.remote_dir(side)).exists(), list(Path(pair.remote_dir(side)).rglob("*"))
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()
