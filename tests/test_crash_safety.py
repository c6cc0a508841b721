"""Crash-safety and honest status: torn files, full disks, read-only databases, damaged rows,
labs that are no longer all there, changes the kernel refused. One line, never a traceback."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import EnvironmentProblem
from offlab.hosts import LOCAL
from offlab.store import Store
from tests.conftest import netns_names, requires_root
from tests.helpers import run as offlab_in_process
from tests.synthetic_results import make_uso_run

pytestmark = [requires_root]

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"


def one_line(res: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str = "256k"):
    """A small file system of our own, so a full disk can be made without filling the machine's."""
    where.mkdir(parents=True, exist_ok=True)
    LOCAL.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)])
    try:
        yield where
    finally:
        LOCAL.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> None:
    """Write until the file system is full."""
    try:
        with open(fs / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass


# ---- torn state files ------------------------------------------------------------------

def test_an_empty_lab_state_file_gets_one_line_and_lab_down_force_repairs_it(lab_name, state_dir, clean_machine):
    lab = labs.up("veth", lab_name)
    lab.path.write_text("")  # what a write interrupted before its first byte used to leave
    env = {"OFFLAB_STATE_DIR": str(state_dir)}
    res = offlab_in_process("lab", "show", lab_name, env=env)
    assert res.returncode == 2
    assert "is empty (a write was interrupted)" in one_line(res)
    assert f"offlab lab down --force {lab_name}" in res.stderr
    listing = json.loads(offlab_in_process("lab", "list", "--json", env=env).stdout)
    assert listing == [{"name": lab_name, "topology": None, "mtu": None, "status": "corrupt", "hosts": [],
                        "why": listing[0]["why"], "fix": f"offlab lab down --force {lab_name}"}]
    res = offlab_in_process("lab", "down", lab_name, env=env)
    assert res.returncode == 2 and "--force" in one_line(res)
    res = offlab_in_process("lab", "down", "--force", lab_name, env=env)
    assert res.returncode == 0, res.stderr
    assert f"removed namespace ol-{lab_name}-client" in res.stdout
    assert not set(lab.namespaces) & netns_names()
    assert not lab.path.exists()


def test_torn_and_damaged_journals_are_reported_and_cleared_by_restore(state_dir):
    jdir = state_dir / "journal"
    jdir.mkdir(parents=True)
    (jdir / "tx-1-1-1.journal").write_text("")
    (jdir / "tx-2-2-1.journal").write_text('{"offlab_journal": 1, "owner": {"pid": 2, "sta')
    header = {"offlab_journal": 1, "label": "x", "owner": {"pid": 999999, "start": 1}, "persist": False}
    bad_t = {"op": "change", "seq": 1, "t": "noon", "kind": "sysctl", "key": "net.core.message_cost",
             "netns": "ol-nosuchlab-client", "original": "5", "original_text": "5", "value": "6"}
    (jdir / "tx-3-3-1.journal").write_text(json.dumps(header) + "\n" + json.dumps(bad_t) + "\n[1, 2]\n")
    env = {"OFFLAB_STATE_DIR": str(state_dir)}
    res = offlab_in_process("restore", "--list", env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "would drop" in res.stdout and "line 1 unreadable" in res.stdout
    res = offlab_in_process("restore", "--force", env=env)
    assert res.returncode == 0, res.stderr
    assert not list(jdir.glob("*.journal"))


def test_a_full_state_dir_fails_with_one_line_and_leaves_nothing_half_made(lab_name, state_dir, clean_machine):
    env = {"OFFLAB_STATE_DIR": str(state_dir)}
    with tiny_tmpfs(state_dir):
        lab = labs.up("veth", lab_name)
        try:
            fill(state_dir)
            res = offlab_in_process("lab", "up", "veth", "--name", f"{lab_name[:9]}z", env=env)
            assert res.returncode == 3
            assert "No space left on device" in one_line(res) and "free space" in res.stderr
            assert not (state_dir / "labs" / f"{lab_name[:9]}z.json").exists()
            assert not any(n.startswith(f"ol-{lab_name[:9]}z-") for n in netns_names())
            ecn = lab.client.read("/proc/sys/net/ipv4/tcp_ecn").strip()
            res = offlab_in_process("lab", "set", lab_name, "client", "-", f"net.ipv4.tcp_ecn={1 - int(ecn) % 2}", env=env)
            assert res.returncode == 3 and "No space left on device" in one_line(res)
            assert lab.client.read("/proc/sys/net/ipv4/tcp_ecn").strip() == ecn  # not journalled: not changed
            res = offlab_in_process("lab", "list", env=env)
            assert res.returncode == 0 and lab_name in res.stdout
        finally:
            res = offlab_in_process("lab", "down", lab_name, env=env)
        assert res.returncode == 0 and "removed namespace" in res.stdout, res.stderr


# ---- the results database ---------------------------------------------------------------

def test_a_read_only_or_full_database_still_reads_and_writes_fail_with_one_line(tmp_path):
    with tiny_tmpfs(tmp_path / "fs", size="2m") as fs:
        db = fs / "r.db"
        with Store.open(db) as store:
            run_id, _ = make_uso_run(store, rounds=2)
        LOCAL.run(["mount", "-o", "remount,ro", str(fs)])
        res = offlab_in_process("results", "list", "--db", str(db))
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert str(run_id) in res.stdout
        assert offlab_in_process("results", "show", str(run_id), "--db", str(db)).returncode == 0
        store = Store.open(db)
        assert store.read_only and store.get_run(run_id)["status"]
        with pytest.raises(EnvironmentProblem, match="cannot write to database .*read-only.*reading it still works"):
            store.set_run_status(run_id, "failed", "x")
        store.close()
        LOCAL.run(["mount", "-o", "remount,rw", str(fs)])
        store = Store.open(db)
        fill(fs)
        with pytest.raises(EnvironmentProblem, match="cannot write to database .*full"):
            for _ in range(200):
                store.set_run_status(run_id, "failed", "y" * 100_000)
        assert store.get_run(run_id)["id"] == run_id
        store.close()


def test_bad_json_in_a_database_row_is_one_line_naming_the_row(tmp_path):
    db = tmp_path / "b.db"
    with Store.open(db) as store:
        run_id, _ = make_uso_run(store, rounds=2)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET env = '{\"kernel\": ' WHERE id = ?", (run_id,))
    res = offlab_in_process("results", "show", str(run_id), "--db", str(db))
    assert res.returncode == 2
    assert f"column env of run {run_id} in {db} is damaged" in one_line(res)


# ---- doctor ----------------------------------------------------------------------------

@pytest.mark.parametrize("online", ["0-x", "0-99999999999", "3-1", ",,-"])
def test_doctor_root_with_a_malformed_cpu_online_counts_cpus_from_cpuinfo(tmp_path, online):
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "tuned-host", root)
    (root / "sys/devices/system/cpu/online").write_text(online + "\n")
    res = offlab_in_process("doctor", "--root", str(root), "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert json.loads(res.stdout)["host"]["cpus"] == 8


# ---- honest status ---------------------------------------------------------------------

@pytest.mark.network
def test_lab_list_shows_a_lab_whose_namespace_vanished_as_broken_with_the_fix(lab_name, state_dir, clean_machine):
    lab = labs.up("veth", lab_name)
    LOCAL.run(["ip", "netns", "del", f"ol-{lab_name}-server"])
    res = offlab_in_process("lab", "list", "--json", env={"OFFLAB_STATE_DIR": str(state_dir)})
    row = json.loads(res.stdout)[0]
    assert row["status"] == "broken"
    assert row["why"] == f"namespace ol-{lab_name}-server is gone"
    assert row["fix"] == f"offlab lab down {lab_name}"
    text = offlab_in_process("lab", "list", env={"OFFLAB_STATE_DIR": str(state_dir)}).stdout
    assert f"{lab_name}: broken — namespace ol-{lab_name}-server is gone; fix: offlab lab down {lab_name}" in text
    res = offlab_in_process("lab", "show", lab_name, env={"OFFLAB_STATE_DIR": str(state_dir)})
    assert res.returncode == 3
    assert f"is broken: namespace ol-{lab_name}-server is gone; `offlab lab down {lab_name}`" in one_line(res)
    teardown.down(lab_name)
    assert not set(lab.namespaces) & netns_names()


@pytest.mark.network
def test_a_qdisc_the_kernel_refused_is_not_journalled(lab_name, state_dir, clean_machine):
    labs.up("veth", lab_name)
    env = {"OFFLAB_STATE_DIR": str(state_dir)}
    try:
        res = offlab_in_process("lab", "set", lab_name, "client", "-", "qdisc=nosuchq", env=env)
        assert res.returncode == 3 and "the kernel refused nosuchq" in res.stdout
        assert "journalled:" not in offlab_in_process("lab", "show", lab_name, env=env).stdout
        assert offlab_in_process("restore", "--list", env=env).stdout.strip() == "nothing to restore"
        assert not list((state_dir / "journal").glob("*.journal"))
    finally:
        teardown.down(lab_name)


@pytest.mark.network
def test_a_failed_run_stores_why(tmp_path, state_dir, clean_machine, monkeypatch):
    from offlab.experiment import runner as runner_mod
    from offlab.experiment.plan import load_plan

    def broken(*a, **kw):
        raise EnvironmentProblem("offlab-engine vanished (test)")

    monkeypatch.setattr(runner_mod, "measure", broken)
    plan = load_plan("name: f\ntopology: {kind: veth}\nworkload: {tool: engine, protocol: udp, duration: 1, warmup: 0.2}\n"
                     "repeat: {min: 1, max: 1}\n", "f.yaml")
    store = Store.open(tmp_path / "f.db")
    with pytest.raises(EnvironmentProblem):
        runner_mod.Runner(plan, store).run()
    run = store.list_runs()[0]
    assert run["status"] == "failed"
    assert run["note"] == "EnvironmentProblem: offlab-engine vanished (test)"


HOLDER = """
import sys, time
from offlab.state import private_tmp
with private_tmp(sys.argv[1]) as d:
    (d / "wire.pcap").write_bytes(b"x")
    print(d, flush=True)
    time.sleep(600)
"""


@requires_root
def test_a_temporary_directory_of_a_killed_process_is_removed_by_restore_and_a_live_ones_is_kept(state_dir):
    """A measure killed with SIGKILL never removes its capture directory (its `with` never ends): the
    directory is named by its owner (pid and start time), so `offlab restore` knows it is garbage."""
    import signal
    import sys

    from tests.conftest import REPO

    def holder(what: str) -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, what], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        return proc, Path(proc.stdout.readline().strip())

    killed, gone_dir = holder("cap")
    live, live_dir = holder("engine")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert gone_dir.is_dir() and gone_dir.name.startswith(f"offlab-cap.{killed.pid}.")
        res = offlab_in_process("restore", env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert res.returncode == 0, res.stderr
        assert not gone_dir.exists() and (live_dir / "wire.pcap").is_file()
    finally:
        live.send_signal(signal.SIGTERM)
        live.wait(timeout=30)
        for proc in (killed, live):
            assert proc.stdout is not None
            proc.stdout.close()
    shutil.rmtree(live_dir, ignore_errors=True)  # SIGTERM ends it without its `with` ending
