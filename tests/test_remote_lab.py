"""Labs over existing machines (`lab up hosts`), the journal kept on the remote host, and fan-out.

Two stand-in machines `a` and `b` (namespaces, each with its own sshd) reached from a controller
namespace, joined by three test links t1..t3 (tests/sshd.py `start_pair`). Everything goes through
the real `offlab` command or the real library over real ssh; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from offlab import netdev
from offlab.errors import EnvironmentProblem
from offlab.hosts import NetnsHost
from tests import sshd as sshd_mod
from tests.conftest import OUR_NAMESPACES, REPO, offlab_cli, requires_root
from tests.helpers import pair_plan, run as offlab_in_process, stand_in_machines, tool_saw_no_loss

pytestmark = requires_root


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with stand_in_machines(lambda: sshd_mod.start_pair(tmp_path_factory.mktemp("rl"), f"{OUR_NAMESPACES[0]}rl", links=3)) as p:
        yield p


@pytest.fixture
def inv(pair, tmp_path, state_dir):
    path = tmp_path / "inventory.yml"
    path.write_text(json.dumps(pair.inventory()))  # JSON is YAML
    return path


def cli(state_dir, *args, timeout: float = 240) -> subprocess.CompletedProcess:
    return offlab_cli(*args, env={"OFFLAB_STATE_DIR": str(state_dir)}, timeout=timeout)


def in_state(state_dir, *args) -> subprocess.CompletedProcess:
    """`cli` in this process (tests.helpers.run): for commands that only read."""
    return offlab_in_process(*args, env={"OFFLAB_STATE_DIR": str(state_dir)})


def feature(ns: str, iface: str, name: str = "generic-receive-offload") -> bool:
    out = NetnsHost(ns).run(["ethtool", "--json", "-k", iface]).stdout
    return json.loads(out)[0][name]["active"]


def mtu(ns: str, iface: str) -> int:
    return json.loads(NetnsHost(ns).run(["ip", "-j", "link", "show", "dev", iface]).stdout)[0]["mtu"]


def sysctl(ns: str, key: str) -> str:
    return NetnsHost(ns).read("/proc/sys/" + key.replace(".", "/")).strip()


def back_up(pair, side: str) -> None:
    """The management link of `side` up again, and answering."""
    m = getattr(pair, side)
    NetnsHost(m.ns).run(["ip", "link", "set", "mgmt", "up"])
    for _ in range(20):
        if NetnsHost(pair.controller).run(["ping", "-c1", "-W1", m.ssh_ip], check=False).ok:
            return


def test_lab_up_hosts_measure_and_down_leave_the_machines_as_found(pair, inv, state_dir, lab_name):
    res = cli(state_dir, "lab", "up", "hosts", "--inventory", str(inv), "--pair", "a:t1,b:t1", "--name", lab_name, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["topology"] == "hosts"
    assert info["hosts"]["client"]["kind"] == "ssh" and info["hosts"]["server"]["address"] == pair.test_ip("b", 1)
    assert [i["name"] for i in info["hosts"]["server"]["interfaces"]] == ["t1"]
    # The engine was missing there: copied into the host's private directory, journalled there first.
    engine_dir = Path(pair.remote_dir("b")) / f"engine-{lab_name}"
    assert (engine_dir / "offlab-engine").is_file()
    assert any(p.name.endswith(f"lab-{lab_name}-server-engine.sh") for p in (Path(pair.remote_dir("b")) / "undo").iterdir())
    # `lab exec` runs on the remote machine, not here.
    res = cli(state_dir, "lab", "exec", lab_name, "server", "--", "ip", "netns", "identify")
    assert res.returncode == 0 and res.stdout.strip() == pair.b.ns, res.stderr
    assert feature(pair.b.ns, "t1") is False
    res = cli(state_dir, "lab", "set", lab_name, "server", "t1", "gro=on")
    assert res.returncode == 0 and feature(pair.b.ns, "t1") is True, res.stderr
    undo = [p.read_text() for p in (Path(pair.remote_dir("b")) / "undo").iterdir() if "engine" not in p.name]
    assert undo == ["# offlab: t1 gro: on → back to off\nethtool -K t1 rx-gro off\n"]
    # 2000 pps: datagrams over the lab, at any speed (a paced engine sleeps between sends at this rate)
    res = cli(state_dir, "measure", lab_name, "--tool", "engine", "--rate", "2000pps", "--duration", "1", "--json")
    assert res.returncode == 0, res.stderr
    sample = json.loads(res.stdout)
    assert sample["traffic"]["throughput_bps"] > 0 and sample["traffic"]["datagrams_received"] > 0
    res = cli(state_dir, "lab", "down", lab_name)
    assert res.returncode == 0, res.stderr
    assert "journalled setting, put back: " in res.stdout and feature(pair.b.ns, "t1") is False
    for side in ("a", "b"):  # nothing of offlab's is left on the machines
        assert not Path(pair.remote_dir(side)).exists(), list(Path(pair.remote_dir(side)).rglob("*"))


def test_pair_named_on_the_command_line_takes_its_addresses_from_the_hosts(pair, tmp_path, state_dir, lab_name):
    bare = pair.inventory()
    for h in bare["hosts"].values():
        h.pop("interfaces")
    del bare["pairs"]
    path = tmp_path / "bare.yml"
    path.write_text(json.dumps(bare))
    res = cli(state_dir, "lab", "up", "hosts", "--inventory", str(path), "--pair", "a:t2,b:t2", "--name", lab_name, "--json")
    assert res.returncode == 0, res.stderr
    hosts = json.loads(res.stdout)["hosts"]
    assert (hosts["client"]["address"], hosts["server"]["address"]) == (pair.test_ip("a", 2), pair.test_ip("b", 2))
    assert cli(state_dir, "lab", "down", lab_name).returncode == 0


def test_ports_that_would_cut_the_user_off_are_refused_in_one_line(pair, inv, tmp_path, state_dir, lab_name):
    def up(*args, inventory=inv):
        # The CLI in this process (helpers.run): each case is refused once the hosts have answered, with the
        # exit code and the one line `offlab` gives, without an interpreter's start-up per case.
        res = offlab_in_process("lab", "up", "hosts", "--inventory", str(inventory), "--name", lab_name, *args)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (state_dir / "labs" / f"{lab_name}.json").exists()  # nothing claimed
        return res.returncode, res.stderr

    rc, err = up("--pair", "a:mgmt,b:t1")
    assert rc == 2 and "host a (client): mgmt carries the SSH session (10.200.230.2)" in err, err
    res = cli(state_dir, "lab", "up", "hosts", "--inventory", str(inv), "--name", lab_name, "--pair", "a:mgmt,b:t1",
              "--allow-management-traffic")  # the user said so explicitly
    assert res.returncode == 0, res.stderr
    assert cli(state_dir, "lab", "down", lab_name).returncode == 0
    b = NetnsHost(pair.b.ns)
    b.run(["ip", "route", "add", "default", "via", pair.test_ip("a", 3), "dev", "t3"])
    try:
        rc, err = up("--pair", "a:t3,b:t3")
        assert rc == 2 and "host b (server): t3 carries the default route" in err, err
    finally:
        b.run(["ip", "route", "del", "default"])
    rc, err = up("--pair", "a:nope,b:t1")
    assert rc == 2 and "host a (client): no interface 'nope' (it has: " in err, err
    # Two ends with one address (read from the hosts: no declared addresses to catch it earlier).
    bare = pair.inventory()
    for h in bare["hosts"].values():
        h.pop("interfaces")
    del bare["pairs"]
    (tmp_path / "bare.yml").write_text(json.dumps(bare))
    for side in ("a", "b"):
        NetnsHost(getattr(pair, side).ns).run(["ip", "addr", "add", "10.200.239.9/32", "dev", "t2"])
    try:
        rc, err = up("--pair", "a:t2,b:t2", inventory=tmp_path / "bare.yml")
        assert rc == 2 and "both ends have address 10.200.239.9" in err, err
    finally:
        for side in ("a", "b"):
            NetnsHost(getattr(pair, side).ns).run(["ip", "addr", "del", "10.200.239.9/32", "dev", "t2"])
    # A declared address the host does not have: the host is not as the inventory says (exit 3).
    wrong = pair.inventory()
    wrong["hosts"]["b"]["interfaces"][0]["addresses"] = ["10.200.239.2/24"]
    (tmp_path / "wrong.yml").write_text(json.dumps(wrong))
    rc, err = up(inventory=tmp_path / "wrong.yml")
    assert rc == 3 and "host b (server): t1: declared address 10.200.239.2 is not configured there" in err, err
    # An unreachable host: exit 3 naming it and ssh's own reason.
    dead = pair.inventory(b={"port": 2299})
    (tmp_path / "dead.yml").write_text(json.dumps(dead))
    rc, err = up(inventory=tmp_path / "dead.yml")
    assert rc == 3 and "ssh host b: connecting failed (ssh exit 255)" in err and "Connection refused" in err, err


def test_a_non_root_login_without_sudo_is_refused_naming_the_host():
    from offlab.inventory import InventoryHost
    from offlab.lab.hosts import Facts, check_end

    facts = Facts("x86_64", 1000, None, None, {"e0": netdev.Link("e0")}, set())
    with pytest.raises(EnvironmentProblem, match=r"host h \(client\): logged in as uid 1000 without sudo"):
        check_end("client", InventoryHost("h", "192.0.2.1"), "e0", facts, False)


CONTROLLER = """
import sys, time
from offlab import lab
from offlab.experiment import teardown
from offlab.knobs import Change, Transaction
l = lab.LabState.load(sys.argv[1])
with Transaction("controller") as tx:
    tx.apply([Change(l.server, "gro", "on", "t1", l), Change(l.server, "mtu", 1400, "t1", l),
              Change(l.server, "net.ipv4.tcp_ecn", "1", None, l)])
    print("applied", flush=True)
    time.sleep(120)
"""


def apply_then_kill_controller(pair, lab_name: str, state_dir) -> None:
    """Run CONTROLLER (it changes gro, mtu and a sysctl on host b and waits), kill -9 it once it has,
    then end its ssh masters by pid: they outlive it for ControlPersist seconds (documented), and the
    machines' sshd must be left as found."""
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, lab_name], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    try:
        assert proc.stdout.readline().strip() == "applied", proc.stderr.read() if proc.poll() is not None else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        for line in sshd_mod.mux_processes(sshd_mod.Sshd(pair.dir, pair.controller, pair.b.ns, "", "")):
            if f"ControlPath=/tmp/offlab-ssh.{proc.pid}." in line:
                os.kill(int(line.split()[0]), signal.SIGTERM)


def test_controller_killed_mid_run_the_remote_restores_alone(pair, inv, state_dir, lab_name):
    from offlab.experiment import teardown
    from offlab.lab import hosts as hosts_lab

    hosts_lab.up(lab_name, str(inv), "a:t1,b:t1")
    try:
        before = (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1"), sysctl(pair.b.ns, "net.ipv4.tcp_ecn"))
        assert before[:2] == (False, 1500) and before[2] != "1"
        apply_then_kill_controller(pair, lab_name, state_dir)
        assert (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1"), sysctl(pair.b.ns, "net.ipv4.tcp_ecn")) == (True, 1400, "1")
        # On the remote machine alone: no ssh, no offlab, no controller; only sh and its tools.
        restore = f"{pair.remote_dir('b')}/restore.sh"
        res = NetnsHost(pair.b.ns).run(["sh", restore], check=False)
        assert res.rc == 0, res.stderr
        assert res.stdout.splitlines()[:3] == ["restored: - net.ipv4.tcp_ecn: 1 → back to " + before[2],
                                               "restored: t1 mtu: 1400 → back to 1500",
                                               "restored: t1 gro: on → back to off"]
        assert (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1"), sysctl(pair.b.ns, "net.ipv4.tcp_ecn")) == before
        # The controller's own journal still says what it changed; replaying it finds the originals in place.
        res = cli(state_dir, "restore")
        assert res.returncode == 0 and "restored server:t1 gro = off" not in res.stderr, res.stdout + res.stderr
        assert not list((state_dir / "journal").glob("*.journal"))
    finally:
        teardown.down(lab_name, force=True)
    assert not Path(pair.remote_dir("b")).exists()


LIBRARY_DOWN = """
import sys
from offlab.experiment import teardown
lines = teardown.down(sys.argv[1])
assert not [m for m in sys.modules if m.startswith("offlab.cli")], "the library path imported the CLI"
print("\\n".join(lines))
"""


def test_library_teardown_puts_an_ssh_hosts_settings_back_without_the_cli(pair, inv, state_dir, lab_name):
    """A lab taken down by library code (a runner, a benchmark: no `offlab.cli` imported) restores what a
    dead process journalled on the machines; it used to rely on hooks that only the CLI registered."""
    from offlab.experiment import teardown

    env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir)}
    # up in a process of its own, as a user's: its lease on the hosts ends with it (one taken in this
    # long-lived test process would hold the hosts' private directories open for the next tests)
    up = subprocess.run([sys.executable, "-m", "offlab", "lab", "up", "hosts", "--inventory", str(inv), "--name",
                         lab_name, "--pair", "a:t1,b:t1"], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert up.returncode == 0, up.stderr
    try:
        before = (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1"))
        apply_then_kill_controller(pair, lab_name, state_dir)
        assert (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1")) == (True, 1400)
        res = subprocess.run([sys.executable, "-c", LIBRARY_DOWN, lab_name], cwd=REPO, capture_output=True,
                             text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"journalled setting, put back: {lab_name}/server:t1 gro = off" in res.stdout.splitlines(), res.stdout
        assert (feature(pair.b.ns, "t1"), mtu(pair.b.ns, "t1")) == before
        assert not list((state_dir / "journal").glob("*.journal"))
    finally:
        teardown.down(lab_name, force=True)


def test_fan_out_runs_one_plan_on_three_pairs_and_compare_sets_them_side_by_side(pair, inv, tmp_path, state_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(pair_plan("pairs", 1))
    db = tmp_path / "results.db"
    res = cli(state_dir, "run", str(plan), "--inventory", str(inv), "--db", str(db), "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert [r["pair"] for r in out["pairs"]] == ["a:t1,b:t1", "a:t2,b:t2", "a:t3,b:t3"]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT r.name, COUNT(s.id) FROM runs r LEFT JOIN samples s ON s.run_id = r.id "
                            "GROUP BY r.id ORDER BY r.name").fetchall()
    assert rows == [("pairs @ a:t1,b:t1", 2), ("pairs @ a:t2,b:t2", 2), ("pairs @ a:t3,b:t3", 2)]
    ids = [str(r["run_id"]) for r in out["pairs"]]
    res = offlab_in_process("compare", *ids, "--db", str(db), "--json")  # the database alone: no interpreter start
    assert res.returncode == 0, res.stderr
    compared = {(r["run"], r["baseline_run"]) for r in json.loads(res.stdout)["rows"]}
    assert compared == {(int(ids[1]), int(ids[0])), (int(ids[2]), int(ids[0]))}
    assert feature(pair.b.ns, "t1") is False
    assert not list((state_dir / "labs").glob("*.json"))
    assert not Path(pair.remote_dir("b")).exists(), sorted(map(str, Path(pair.remote_dir("b")).rglob("*")))


def test_fan_out_into_a_shared_postgresql_and_compare_from_it(pair, inv, tmp_path, state_dir, pg):
    plan = tmp_path / "plan.yaml"
    plan.write_text(pair_plan("pairs", 1))  # one sample per cell tells each runner's samples from the other's
    url = pg.database()
    res = cli(state_dir, "run", str(plan), "--inventory", str(inv), "--pair", "a:t1,b:t1", "--pair", "a:t2,b:t2",
              "--db", url, "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    ids = [r["run_id"] for r in json.loads(res.stdout)["pairs"]]
    from offlab.store import Store

    with Store.open(url) as s:  # each pair's runner wrote its own run, its own samples only
        runs = {r["id"]: r for r in s.list_runs()}
        assert {runs[i]["name"] for i in ids} == {"pairs @ a:t1,b:t1", "pairs @ a:t2,b:t2"}
        assert all((runs[i]["status"], runs[i]["samples"]) == ("done", 2) for i in ids)
        for i in ids:
            assert {x["cell_id"] for x in s.samples(i)} <= {c["id"] for c in s.cells(i)}
    res = offlab_in_process("compare", *map(str, ids), "--db", url, "--json")  # the database alone
    assert res.returncode == 0, res.stderr
    assert {(r["run"], r["baseline_run"]) for r in json.loads(res.stdout)["rows"]} == {(ids[1], ids[0])}
    assert not Path(pair.remote_dir("a")).exists() and not Path(pair.remote_dir("b")).exists()


def test_a_setting_put_back_just_as_its_host_fell_silent_has_its_copy_there_removed_by_the_next_restore(
        pair, inv, state_dir, lab_name):
    res = cli(state_dir, "lab", "up", "hosts", "--inventory", str(inv), "--pair", "a:t1,b:t1", "--name", lab_name)
    assert res.returncode == 0, res.stderr
    res = cli(state_dir, "lab", "set", lab_name, "server", "t1", "gro=on")
    assert res.returncode == 0 and feature(pair.b.ns, "t1") is True, res.stderr
    (copy,) = [p for p in (Path(pair.remote_dir("b")) / "undo").iterdir() if "engine" not in p.name]
    from offlab.knobs import journal, undo

    (entry,) = [e for v in journal.all_journals() for e in v.open_entries]
    # A restore's last step met a host that had just fallen silent: the setting was put back, then b's
    # link went down before b's copy of the undo could go (what a run's cell switch met in CI).
    NetnsHost(pair.b.ns).run(["ethtool", "-K", "t1", "gro", "off"])
    NetnsHost(pair.b.ns).run(["ip", "link", "set", "mgmt", "down"])
    try:
        undo.mark(entry, "restored")
    finally:
        back_up(pair, "b")
    view = journal.load(entry.journal)
    assert copy.exists() and [e.seq for e in view.copies_left] == [entry.seq] and not view.open_entries
    # The journal stays for it (closed, not forgotten), and the next restore that reaches b removes it.
    res = in_state(state_dir, "restore", "--list")  # in this process: --list only reads
    assert res.returncode == 0 and "would remove the host's copy of the undo of " in res.stdout, res.stdout
    res = cli(state_dir, "restore")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "removed b's copy of the undo of " in res.stdout, res.stdout
    assert not copy.exists() and not entry.journal.exists()
    res = cli(state_dir, "lab", "down", lab_name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert feature(pair.b.ns, "t1") is False
    for side in ("a", "b"):
        assert not Path(pair.remote_dir(side)).exists(), list(Path(pair.remote_dir(side)).rglob("*"))


def test_a_host_that_dies_mid_run_keeps_the_samples_and_names_the_host(pair, inv, tmp_path, state_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(pair_plan("pairs", 6))
    db = tmp_path / "results.db"

    def kill_b_after_first_sample() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with sqlite3.connect(db) as conn:
                    if conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] >= 1:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.3)
        # What a crashed machine looks like: its end of our sessions gone, and no answer any more.
        NetnsHost(pair.b.ns).run(["ip", "link", "set", "mgmt", "down"])
        probe = sshd_mod.Sshd(pair.dir, pair.controller, pair.b.ns, "", "")
        for pid in probe.sshd_pids() - {pair.b.proc.pid}:
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_b_after_first_sample)
    killer.start()
    try:
        res = cli(state_dir, "run", str(plan), "--inventory", str(inv), "--pair", "a:t1,b:t1", "--db", str(db),
                  timeout=600)
    finally:
        killer.join()
        back_up(pair, "b")
    assert res.returncode == 3, res.stdout + res.stderr
    # Named, whichever step met the dead host first: a command (ssh's own error) or the next cell's settings.
    assert "a:t1,b:t1: failed: offlab: error: " in res.stdout and "samples kept in run 1" in res.stdout, res.stdout
    # (a host whose link went down may also first show as a command that did not finish in time there)
    assert ("ssh host b: " in res.stdout or "host 'b' is not reachable" in res.stdout
            or re.search(r"did not finish within \d+ s in b\b", res.stdout)), res.stdout
    assert "Traceback" not in res.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM samples WHERE run_id = 1").fetchone()[0] >= 1
        assert conn.execute("SELECT status FROM runs WHERE id = 1").fetchone()[0] == "failed"
    # Once b answers again, the journal (kept, since b could not be restored then) puts it back.
    res = cli(state_dir, "restore")
    assert res.returncode == 0, res.stdout + res.stderr
    res = cli(state_dir, "lab", "down", "--all")
    assert res.returncode == 0, res.stdout + res.stderr
    assert feature(pair.b.ns, "t1") is False
    left = [str(p) for p in Path(pair.remote_dir("b")).rglob("*")]
    assert not Path(pair.remote_dir("b")).exists(), (res.stdout, left)


def test_ssh_hosts_samples_state_the_skew_of_their_reads_and_still_flag_a_disagreement(pair, inv, state_dir, lab_name):
    from offlab import lab as labs
    from offlab.experiment import witnesses
    from offlab.sample import StoredSample
    from offlab.experiment.measure import measure
    from offlab.traffic import Workload

    res = cli(state_dir, "lab", "up", "hosts", "--inventory", str(inv), "--pair", "a:t3,b:t3", "--name", lab_name)
    assert res.returncode == 0, res.stderr
    try:
        lab = labs.LabState.load(lab_name)
        # 2000 pps: the reads' timing and a loss-free sample are checked, not speed
        clean = measure(lab, Workload(tool="engine", protocol="udp", size=1200, rate="2000pps", duration=2))
        assert clean.consistency is not None and clean.consistency.status == "consistent", clean.consistency
        # both ends answer over ssh: each read is timed and pinned by the host's own clock
        reads = clean.probes.reads
        assert set(reads) == {"client", "server"} and all(r.has("own_window_s") for r in reads.values())
        (check,) = [c for c in clean.consistency.checks if c.check == "loss"]
        # read over one stream per host: their reads far closer together than the window is long
        assert 0 < check.skew_s < clean.probes.window_s / 4 and "reads may be apart" in check.detail
        # datagrams dying in the server's 4 KiB receive buffer: engine and kernel agree ...
        # (receive-buffer loss comes in bursts, when the receiver is off the CPU: on a loaded machine a burst can
        # miss the counters' window, and the kernel then counts none there: measured again, at most thrice)
        for _ in range(3):
            lossy = measure(lab, Workload(tool="engine", protocol="udp", size=1200, rate="20kpps", rcvbuf=4096,
                                          duration=2))
            assert lossy.consistency is not None
            (check,) = [c for c in lossy.consistency.checks if c.check == "loss"]
            if check.kernel:
                break
        assert lossy.loss_attribution is not None, check.detail
        # both witnesses see the loss, and over the same window (the engine's receiver rows there: receive-
        # buffer loss comes in bursts, so its whole-run figure need not match the window's — docs/results.md)
        assert check.kernel > 0 and check.tool > 0 and check.tool_over == "window", check
        assert lossy.consistency.status == "consistent", check
        assert lossy.loss_attribution.places[0].where == "server Udp RcvbufErrors"
        # ... and a tool that did not see that loss is contradicted by the kernel's counters whenever the
        # loss exceeds the tolerance the check states
        # (its total and every row of its series doctored: the check compares the rows over the window)
        again = witnesses.cross_check(StoredSample.from_json(tool_saw_no_loss(lossy.to_json())))
        (zero,) = [c for c in again.checks if c.check == "loss"]
        assert again.status == ("inconsistent" if check.kernel > zero.tolerance else "consistent"), again
    finally:
        # the samples were measured in this process, which took leases on both hosts as any offlab process
        # does; a command's process releases them at its exit, this long-lived one here
        from offlab.hosts import lease

        lease.release_all()
        assert cli(state_dir, "lab", "down", lab_name).returncode == 0


def test_lab_show_lists_the_pending_changes_of_each_ssh_host(pair, inv, state_dir, lab_name):
    res = cli(state_dir, "lab", "up", "hosts", "--inventory", str(inv), "--pair", "a:t2,b:t2", "--name", lab_name)
    assert res.returncode == 0, res.stderr
    try:
        # `lab show` in this process (it only reads); `lab set` in its own, whose lease on the hosts ends with it
        assert json.loads(in_state(state_dir, "lab", "show", lab_name, "--json").stdout)["changes"] == []
        res = cli(state_dir, "lab", "set", lab_name, "server", "t2", "gro=on")
        assert res.returncode == 0, res.stderr
        res = cli(state_dir, "lab", "set", lab_name, "client", "t2", "mtu=1400")
        assert res.returncode == 0, res.stderr
        changes = json.loads(in_state(state_dir, "lab", "show", lab_name, "--json").stdout)["changes"]
        assert sorted((c["host"], c["iface"], c["key"], str(c["value"])) for c in changes) == \
            [("client", "t2", "mtu", "1400"), ("server", "t2", "gro", "on")], changes
        text = in_state(state_dir, "lab", "show", lab_name).stdout
        assert "journalled: server:t2 gro = on (was off;" in text and "journalled: client:t2 mtu = 1400" in text
    finally:
        assert cli(state_dir, "lab", "down", lab_name).returncode == 0
    assert feature(pair.b.ns, "t2") is False and mtu(pair.a.ns, "t2") == 1500


CRASH_PLAN = """
name: crash
topology: {kind: veth}
workload: %s
axes:
  gro:
    "on": {settings: {client:to-server: {gro: true, mtu: 1400}}}
repeat: {min: 2, max: 2, level: 95, width: 50}
"""


def name_of(cmdline: str) -> str:
    """A command line with its program's directory dropped (the engine runs from the copy offlab put there)."""
    head, _, rest = cmdline.partition(" ")
    return f"{os.path.basename(head)} {rest}"


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (read from /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


# What runs on each host mid-sample, as the start of its command line: the server on b, the client on a.
# They run for RUN_OUT s unless ended: far longer than any restore takes, so one that is gone was ended.
RUN_OUT = 300
# Both rate-limited: what is checked is that they run and are ended, and unlimited traffic for as long as a
# crash and its restore take would take the machine's 2 CPUs from everything else meanwhile.
TOOLS = {"iperf3": (f"{{tool: iperf3, protocol: tcp, duration: {RUN_OUT}, warmup: 0.2, rate: 10M}}", "iperf3 -s -1",
                    "iperf3 -c"),
         "engine": (f"{{tool: engine, protocol: udp, duration: {RUN_OUT}, warmup: 0.2, rate: 2kpps}}", "offlab-engine rx",
                    "offlab-engine tx")}


# Each way of putting the hosts back once: restore.sh on the hosts alone (with the engine's rx/tx: a tool
# offlab copied there too), `offlab restore` and `lab down --all --force` on the controller (with iperf3's
# server and client). restore.sh ends whatever offlab recorded there by pid, whichever tool it is, so an
# iperf3 case of it would prove that path a second time.
@pytest.mark.parametrize("tool,how", [("iperf3", "offlab restore"), ("iperf3", "lab down --all --force"),
                                      ("engine", "restore.sh")])
def test_controller_killed_mid_run_over_an_ansible_inventory_leaves_nothing_on_the_hosts(pair, tmp_path, state_dir,
                                                                                         tool, how):
    workload, server_cmd, client_cmd = TOOLS[tool]
    inv = tmp_path / "hosts.yml"
    inv.write_text(sshd_mod.ansible_inventory(pair))
    plan = tmp_path / "plan.yaml"
    plan.write_text(CRASH_PLAN % workload)
    before = (feature(pair.a.ns, "t1"), mtu(pair.a.ns, "t1"))
    assert before == (False, 1500)
    env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "offlab", "run", str(plan), "--inventory", str(inv), "--pair",
                             "a:t1,b:t1", "--db", str(tmp_path / "r.db")], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            # Mid-sample: the server on b and the client on a run (each for RUN_OUT s unless ended).
            servers = [c for c in sshd_mod.processes_in(pair.b.ns).values() if name_of(c).startswith(server_cmd)]
            clients = [c for c in sshd_mod.processes_in(pair.a.ns).values() if name_of(c).startswith(client_cmd)]
            if servers and clients and feature(pair.a.ns, "t1") is True and mtu(pair.a.ns, "t1") == 1400:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        # The controller and its runners, all at once: a crash. Stopped first, until no new child
        # appears, so none is forked past the list; then killed.
        killed: list[int] = []
        while new := [p for p in descendants(proc.pid) if p not in killed]:
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            killed += new
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        from offlab.hosts.process import process_start_time

        for _ in range(100):  # gone, or zombies nobody has reaped yet (as here: their parent died with them)
            alive = {pid: Path(f"/proc/{pid}/stat").read_text() for pid in killed if process_start_time(pid)}
            if not alive:
                break
            time.sleep(0.1)
        assert not alive, alive
        # Their ssh masters outlive them (for ControlPersist seconds, documented): ended here by pid.
        for line in sshd_mod.mux_processes(sshd_mod.Sshd(pair.dir, pair.controller, pair.b.ns, "", "")):
            if any(f"ControlPath=/tmp/offlab-ssh.{pid}." in line for pid in killed):
                os.kill(int(line.split()[0]), signal.SIGTERM)
    try:
        time.sleep(0.5)
        # What the crash left: the settings on a, the client on a and the server on b (minutes more to go).
        crashed = time.monotonic()
        assert (feature(pair.a.ns, "t1"), mtu(pair.a.ns, "t1")) == (True, 1400)
        assert any(name_of(c).startswith(server_cmd) for c in sshd_mod.processes_in(pair.b.ns).values()), sshd_mod.processes_in(pair.b.ns)
        assert any(name_of(c).startswith(client_cmd) for c in sshd_mod.processes_in(pair.a.ns).values()), sshd_mod.processes_in(pair.a.ns)
        if how == "restore.sh":  # on each host alone: only sh and its tools
            for side in ("a", "b"):
                res = NetnsHost(getattr(pair, side).ns).run(["sh", f"{pair.remote_dir(side)}/restore.sh"], check=False)
                assert res.rc == 0, res.stderr
            assert any(name_of(l.removeprefix("restored: stop ")).startswith(server_cmd)
                       for l in res.stdout.splitlines()), res.stdout
        else:
            if how == "offlab restore":  # --list says what it would end, and ends nothing
                res = in_state(state_dir, "restore", "--list")
                assert res.returncode == 0 and f"would end on b: stop {server_cmd}" in res.stdout, res.stdout
                assert any(name_of(c).startswith(server_cmd) for c in sshd_mod.processes_in(pair.b.ns).values())
            res = cli(state_dir, *how.removeprefix("offlab ").split())
            assert res.returncode == 0, res.stdout + res.stderr
            assert server_cmd in res.stdout, res.stdout
        assert (feature(pair.a.ns, "t1"), mtu(pair.a.ns, "t1")) == before, (res.stdout, killed, [
            (p.name, p.read_text()[:3000]) for p in (state_dir / "journal").glob("*")])
        # The controller's last commands there (a wait for iperf3's end, cut off with their ssh session)
        # stop looking once its directory is gone.
        left = {}
        for _ in range(25):
            left = {**sshd_mod.processes_in(pair.a.ns), **sshd_mod.processes_in(pair.b.ns)}
            if not left:
                break
            time.sleep(0.2)
        assert left == {}
        assert time.monotonic() - crashed < RUN_OUT - 60  # ended, not run out (not a timing target: minutes apart)
        if how == "restore.sh":  # nothing of offlab's on the hosts, before the controller is even asked
            for side in ("a", "b"):
                assert not Path(pair.remote_dir(side)).exists(), list(Path(pair.remote_dir(side)).rglob("*"))
    finally:
        # The controller's own state (its labs and journal) goes; the hosts stay as they are now.
        cli(state_dir, "restore")
        res = cli(state_dir, "lab", "down", "--all", "--force")
        assert res.returncode == 0, res.stdout + res.stderr
    for side in ("a", "b"):
        assert sshd_mod.processes_in(getattr(pair, side).ns) == {}, side
        assert not Path(pair.remote_dir(side)).exists(), list(Path(pair.remote_dir(side)).rglob("*"))
    assert (feature(pair.a.ns, "t1"), mtu(pair.a.ns, "t1")) == before
