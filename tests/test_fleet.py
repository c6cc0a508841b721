"""`offlab fleet run`: a plan across an Ansible inventory, driven by the real ansible-playbook.

Eight stand-in machines (namespaces a1 b1 ... a4 b4, each with its own sshd, its own prefix, remote_dir and
authorized_keys; tests/sshd.py `start_fleet`) behind one controller namespace where offlab and Ansible
run, shared by the module's tests: the first run installs offlab on a1 b1 a2 b2 (a fresh install, checked)
and the runs after it keep that installation, as a team's would; a3 b3 a4 b4 join for the run that
loses two servers at once (b4 unreachable from its start), they and a2 b2 (whose installation the
lease test's `fleet clean` removed) given a copy of a1's checked
installation (`installed_like`: that run is not about installing, and the fresh install stays proven by
the first). The bundle is `make bundle`'s (dist/offlab-bundle.tar) when
present and newer than the package, else built once for the module into a temp dir. Nothing is mocked:
Ansible installs the bundle on each machine, each pair's plan runs from its client machine, the results
come home.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

import pytest

from offlab.hosts import NetnsHost
from tests import sshd as sshd_mod
from tests.conftest import OUR_NAMESPACES, REPO, requires_root
from tests.helpers import live_in, pair_plan, run as offlab_in_process, stand_in_machines

# A hang guard only, as fleet_cli's own: the first test builds the bundle (its fixture's time counts
# in the test's) and installs four machines, which took just over pyproject's 300 s per test at load 20
# on 2 cores, and 876 s (399 s of it the bundle) at load 26-40, where 900 s failed main's first test.
pytestmark = [requires_root, pytest.mark.timeout(1800)]

PLAN = pair_plan("fleet", 1)
# The machines most runs use (two pairs); a3 b3 a4 b4 only for the run that loses two servers.
TWO_PAIRS = ["a1", "b1", "a2", "b2"]


def _newest_source() -> float:
    return max(p.stat().st_mtime for p in (Path(REPO) / "offlab").rglob("*") if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    made = Path(REPO) / "dist" / "offlab-bundle.tar"
    if made.is_file() and made.stat().st_mtime > _newest_source():
        return made
    d = tmp_path_factory.mktemp("bundle")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", str(REPO), "uv>=0.5,<1", "-w",
                    str(d / "wheels")], check=True, timeout=900, cwd=REPO)
    with tarfile.open(d / "offlab-bundle.tar", "w") as tar:
        for whl in sorted((d / "wheels").iterdir()):
            tar.add(whl, arcname=whl.name)
    return d / "offlab-bundle.tar"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with stand_in_machines(lambda: sshd_mod.start_fleet(tmp_path_factory.mktemp("fl"), f"{OUR_NAMESPACES[0]}fl",
                                                        pairs=4)) as f:
        yield f


def fleet_cli(f, tmp_path, *args: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real `offlab` in the controller namespace, as the team's Ansible controller runs it."""
    env = {**os.environ, "OFFLAB_STATE_DIR": str(tmp_path / "state"), **(env or {})}
    return subprocess.run(["ip", "netns", "exec", f.controller, sys.executable, "-m", "offlab", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def run_files(f, tmp_path, plan_text: str = PLAN, machines: list[str] = TWO_PAIRS) -> tuple[Path, Path, Path]:
    """The inventory of `machines` and the plan written under tmp_path, and where the results database goes."""
    inv, plan = tmp_path / "inventory.yml", tmp_path / "plan.yaml"
    inv.write_text(f.ansible_inventory(only=machines))
    plan.write_text(plan_text)
    return inv, plan, tmp_path / "results.db"


def leftovers_on_the_machines(f) -> list[str]:
    """What a run must not leave: a fleet key, a run directory, a remote journal, a process in a machine."""
    found = []
    for name, m in f.machines.items():
        keys = f.path("authorized_keys", name).read_text().splitlines()
        found += [f"{name}: key {k.split()[-1]}" for k in keys if "offlab-fleet-" in k]
        runs = f.path("prefix", name) / "runs"
        found += [f"{name}: {p}" for p in runs.iterdir()] if runs.is_dir() else []
        if f.path("remote", name).exists():
            found.append(f"{name}: {f.path('remote', name)}")
        pids = subprocess.run(["ip", "netns", "pids", m.ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm != "sshd":
                found.append(f"{name}: process {pid} {comm}")
    return found


def installed_like(fleet, source: str, names: list[str]) -> None:
    """Machines `names` given machine `source`'s installation as the playbook's install leaves a host: its
    venv hard-linked into each one's own prefix (the files that name `source`'s prefix, the scripts'
    interpreter lines and pyvenv.cfg, written anew there) and the bundle's hash beside it. The playbook
    then finds them installed from this bundle and keeps that, as on a1 b1; `hosts check` and the run on
    each still start that machine's own venv. Seconds of CPU less than a fresh install and its first
    imports compiled again per machine (the first test proves the fresh install)."""
    src = fleet.path("prefix", source)
    old = str(src).encode()
    for name in names:
        dst = fleet.path("prefix", name)
        dst.mkdir(mode=0o755)
        subprocess.run(["cp", "-al", str(src / "venv"), str(dst / "venv")], check=True)
        shutil.copyfile(src / "bundle.sha256", dst / "bundle.sha256")
        for f in [dst / "venv" / "pyvenv.cfg", *(dst / "venv" / "bin").iterdir()]:
            if f.is_symlink() or not f.is_file() or old not in (data := f.read_bytes()):
                continue
            mode = f.stat().st_mode
            f.unlink()  # a file of its own, not the source's link
            f.write_bytes(data.replace(old, str(dst).encode()))
            f.chmod(mode)


def feature(ns: str, iface: str = "t1", name: str = "generic-receive-offload") -> bool:
    return json.loads(NetnsHost(ns).run(["ethtool", "--json", "-k", iface]).stdout)[0][name]["active"]


def settings_of(f) -> dict[str, tuple[bool, str]]:
    """Each machine's test link as the plan touches it: gro, and the link's MTU as a witness of the rest."""
    return {name: (feature(m.ns), NetnsHost(m.ns).run(["cat", "/sys/class/net/t1/mtu"]).stdout.strip())
            for name, m in f.machines.items()}


def run_times(db) -> dict[str, tuple[datetime, datetime]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name, started_at, finished_at FROM runs").fetchall()
    return {n: (datetime.fromisoformat(s), datetime.fromisoformat(e)) for n, s, e in rows}


def samples_on(fleet, name: str) -> int:
    """Samples the run started on machine `name` has committed so far (its own SQLite file; 0 before)."""
    n = 0
    for f in (fleet.path("prefix", name) / "runs").glob("*/results.db"):
        try:
            with sqlite3.connect(f"file:{f}?mode=ro", uri=True, timeout=1) as conn:
                n = max(n, conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        except sqlite3.Error:
            pass
    return n


@contextlib.contextmanager
def once_measuring(fleet, name: str, act: Callable[[], bool | None], ready: Callable[[], bool] = lambda: True):
    """While the block runs, call `act()` until it acts: as soon as the run on machine `name` has stored a
    sample and `ready()` holds (a crash, a cut, a database dropped mid-run); an `act` that finds the
    moment gone after all returns False and is called again at the next."""
    stop = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not stop.is_set():
            if samples_on(fleet, name) >= 1 and ready() and act() is not False:
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def test_fleet_run_runs_each_pair_from_its_client_and_imports_both_side_by_side(fleet, bundle, tmp_path):
    inv, plan, db = run_files(fleet, tmp_path)
    log = tmp_path / "ansible.log"
    res = fleet_cli(fleet, tmp_path, "fleet", "run", str(plan), "--inventory", str(inv), "--group", "rack",
                    "--db", str(db), "--bundle", str(bundle), "--forks", "4", env={"OFFLAB_FLEET_LOG": str(log)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    # The module's first run: a fresh install on every host (the bundle copied, offlab installed from it).
    text = log.read_text()
    for task in ("bundle copied", "offlab installed from the bundle's wheels"):
        assert task_results(text, task) == ["changed a1", "changed a2", "changed b1", "changed b2"], text[-3000:]
    assert task_results(text, "offlab hosts check") == ["ok a1", "ok a2", "ok b1", "ok b2"], text[-3000:]
    lines = res.stdout.splitlines()
    assert [l.split(": ok:")[0] for l in lines if ": ok: run " in l] == ["a1:t1,b1:t1", "a2:t1,b2:t1"], res.stdout
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT r.name, r.status, COUNT(s.id) FROM runs r LEFT JOIN samples s ON s.run_id = r.id "
                            "GROUP BY r.id ORDER BY r.name").fetchall()
    assert rows == [("fleet @ a1:t1,b1:t1", "done", 2), ("fleet @ a2:t1,b2:t1", "done", 2)]
    # No --serial: one batch, both pairs measured at once (each started before the other finished).
    (s1, e1), (s2, e2) = run_times(db)["fleet @ a1:t1,b1:t1"], run_times(db)["fleet @ a2:t1,b2:t1"]
    assert s1 < e2 and s2 < e1, run_times(db)
    # Each run was made on its client machine (its own offlab, its own state directory), not here.
    with sqlite3.connect(db) as conn:
        envs = [json.loads(e) for (e,) in conn.execute("SELECT env FROM runs ORDER BY name")]
    assert all(e for e in envs)
    assert not (tmp_path / "state" / "labs").exists() or not list((tmp_path / "state" / "labs").glob("*.json"))
    side = [l for l in lines if l.startswith("side by side: offlab compare ")]
    assert side, res.stdout
    ids = side[0].split("compare ")[1].split(" --db")[0].split()
    cmp = fleet_cli(fleet, tmp_path, "compare", *ids, "--db", str(db), "--json")
    assert cmp.returncode == 0, cmp.stderr
    assert {(r["run"], r["baseline_run"]) for r in json.loads(cmp.stdout)["rows"]} == {(int(ids[1]), int(ids[0]))}
    # What the run put there is gone; the installation stays, each machine in its own prefix.
    assert leftovers_on_the_machines(fleet) == []
    for name in TWO_PAIRS:
        assert (fleet.path("prefix", name) / "venv" / "bin" / "offlab-engine").is_file()
        # installed by the bundle's uv, into a venv made without pip
        assert not (fleet.path("prefix", name) / "venv" / "bin" / "pip").exists()


def batches_of(log: str, task: str) -> list[list[str]]:
    """The hosts that ran `task`, per time the playbook's output shows it (each serial batch shows it anew)."""
    batches, current = [], None
    for line in log.splitlines():
        if line.startswith("TASK ["):
            current = [] if line.startswith(f"TASK [{task}]") else None
            if current is not None:
                batches.append(current)
        elif current is not None and line.split(":")[0] in ("ok", "changed", "failed", "fatal"):
            current.append(line.split("[", 1)[1].split("]")[0])
    return batches


def task_results(log: str, task: str) -> list[str]:
    """`STATUS HOST` of each host in the playbook's output of `task` (its first showing), sorted."""
    shown = log.split(f"TASK [{task}", 1)[1].split("TASK [", 1)[0].split("PLAY [", 1)[0]
    return sorted(l.split(":")[0] + " " + l.split("[", 1)[1].split("]")[0] for l in shown.splitlines()
                  if l.startswith(("ok:", "changed:", "skipping:", "failed:", "fatal:")))


# One run for two things that do not meet: Ansible's batches (--serial, the playbook's business) and the
# results' import into a database that went away meanwhile (offlab's, after the playbook).
def test_serial_runs_the_pairs_in_batches_and_a_database_gone_meanwhile_keeps_their_results_in_files_it_names(
        fleet, bundle, tmp_path, pg):  # noqa: F811
    inv, plan, _ = run_files(fleet, tmp_path)
    url = pg.database()
    name = url.split("@/")[1].split("?")[0]
    log = tmp_path / "ansible.log"
    # the database answered at the start; it is gone at the import (dropped while the first batch measures)
    with once_measuring(fleet, "a1", lambda: pg.psql(f"DROP DATABASE {name}")):
        res = fleet_cli(fleet, tmp_path, "fleet", "run", str(plan), "--inventory", str(inv), "--group", "rack",
                        "--db", url, "--bundle", str(bundle), "--forks", "4", "--serial", "1",
                        env={"OFFLAB_FLEET_LOG": str(log)})
    assert res.returncode == 3, (res.stdout + res.stderr)[-3000:]
    assert "forks 4, serial 1" in res.stdout.splitlines()[0], res.stdout
    # Ansible's own batches: the run play shown once per batch, each with one client host.
    text = log.read_text()
    assert text.count("PLAY [run the plan from each pair's client host]") == 2, text[-3000:]
    assert batches_of(text, "offlab run, from the client host") == [["a1"], ["a2"]], text[-3000:]
    # The installation the first run made is kept: each host found it made from this bundle (its hash), and
    # checked there in the same task, so the bundle is neither copied nor installed again on any host.
    assert task_results(text, "offlab installed from this bundle") == ["ok a1", "ok a2", "ok b1", "ok b2"], text[-3000:]
    for task in ("bundle copied", "offlab installed from the bundle's wheels", "offlab hosts check"):
        assert task_results(text, task) == ["skipping a1", "skipping a2", "skipping b1", "skipping b2"], text[-3000:]
    # The database: one line naming it and where both pairs' results are kept.
    line = res.stderr.strip()
    assert "Traceback" not in line and len(line.splitlines()) == 1, res.stderr
    assert f'database "{name}" does not exist' in line and "the pairs' results are kept in " in line, line
    home = Path(line.split("the pairs' results are kept in ")[1].split()[0])
    try:
        assert sorted(f.name for f in home.iterdir()) == ["a1_t1-b1_t1.db", "a2_t1-b2_t1.db"]
        db = tmp_path / "later.db"
        for f in sorted(home.iterdir()):  # what the line says to do once a database answers
            imp = fleet_cli(fleet, tmp_path, "results", "import", str(f), "--db", str(db))
            assert imp.returncode == 0, imp.stderr
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT r.name, r.status, COUNT(s.id) FROM runs r LEFT JOIN samples s ON s.run_id = r.id "
                                "GROUP BY r.id ORDER BY r.name").fetchall()
        assert rows == [("fleet @ a1:t1,b1:t1", "done", 2), ("fleet @ a2:t1,b2:t1", "done", 2)]
        # ...and in them, the batches: the second pair's run started after the first pair's had finished.
        times = run_times(db)
        assert times["fleet @ a1:t1,b1:t1"][1] <= times["fleet @ a2:t1,b2:t1"][0], times
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert leftovers_on_the_machines(fleet) == []


# A dropped terminal (SIGHUP) while the first pair measures, the second waiting for its batch: the
# controller ends the playbook, each client host's run ends on SIGTERM (both ends put back, its samples
# kept), its samples come home, the run's keys and directories go, and offlab exits as interrupted.
def test_a_signal_to_fleet_run_ends_each_pairs_run_keeps_what_it_measured_and_leaves_the_machines_as_found(
        fleet, bundle, tmp_path):
    inv, plan, db = run_files(fleet, tmp_path, pair_plan("fleet", 3))
    before = settings_of(fleet)
    env = {**os.environ, "OFFLAB_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(["ip", "netns", "exec", fleet.controller, sys.executable, "-m", "offlab", "fleet", "run",
                             str(plan), "--inventory", str(inv), "--group", "rack", "--db", str(db), "--bundle",
                             str(bundle), "--serial", "1"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hung_up: list[float] = []

    def hang_up() -> None:
        proc.send_signal(signal.SIGHUP)
        hung_up.append(time.monotonic())

    try:
        with once_measuring(fleet, "a1", hang_up):
            out, err = proc.communicate(timeout=900)  # a hang guard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = f"{time.monotonic() - hung_up[0]:.1f} s after the SIGHUP" if hung_up else "no SIGHUP sent"
    assert hung_up, f"a1's run stored no sample before the fleet run ended: {out[-2000:]}{err[-2000:]}"
    assert proc.returncode == 130, f"exit {proc.returncode}, {took}: {out[-3000:]}{err[-2000:]}"
    assert err.strip().splitlines()[-1] == "offlab: interrupted" and "Traceback" not in err, err
    lines = out.splitlines()
    assert "offlab: interrupted: ending each pair's run on its client host and bringing its samples home" in lines, out
    first = next((l for l in lines if l.startswith("a1:t1,b1:t1: ")), out)
    assert first.startswith("a1:t1,b1:t1: interrupted: its run on a1 ended on SIGTERM and put a1 and b1 back ("), first
    assert "a2:t1,b2:t1: interrupted: not started" in lines, out
    # what a1's run measured before it ended is here, once, in the run the line names
    kept, run_id = (int(x) for x in first.rsplit("(", 1)[1].removesuffix(")").split(" samples kept in run "))
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT r.id, r.name, r.status, COUNT(s.id) FROM runs r LEFT JOIN samples s "
                            "ON s.run_id = r.id GROUP BY r.id").fetchall()
    assert rows == [(run_id, "fleet @ a1:t1,b1:t1", "interrupted", kept)] and kept >= 1, rows
    assert leftovers_on_the_machines(fleet) == []
    assert settings_of(fleet) == before
    assert live_in(fleet.controller, skip=lambda comm: comm == "sshd") == [], took


# A fleet run's server whose controller (the client host's `offlab run`, started there by Ansible) is killed
# outright, its own management link cut at once: nothing reaches it, and it puts itself back by its lease.
def test_a_fleet_runs_server_puts_itself_back_by_its_lease_when_its_controller_dies_and_its_link_is_cut(
        fleet, bundle, tmp_path):
    lease = 3
    inv, plan, db = run_files(fleet, tmp_path, pair_plan("fleet", 3), machines=["a2", "b2"])
    inv.write_text(fleet.ansible_inventory({"b2": {"offlab_lease": lease}}, only=["a2", "b2"]))
    before = settings_of(fleet)
    a2, b2 = fleet.machines["a2"].ns, fleet.machines["b2"].ns
    crashed: dict[str, object] = {}

    def crash() -> bool:
        with sshd_mod.frozen(b2):  # b2 holding the run's setting, and nothing there acting meanwhile
            if feature(b2) == before["b2"][0]:
                return False
            # The controller and all it started on a2, stopped until none is forked past the list, then killed.
            killed: list[int] = []
            crashed["commands"] = list(sshd_mod.processes_in(a2).values())
            while new := [p for p in sshd_mod.processes_in(a2) if p not in killed]:
                for pid in new:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                killed += new
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            sshd_mod.cut(fleet, "b2")
            crashed["gro"], crashed["killed"], crashed["at"] = feature(b2), killed, time.monotonic()
        return True

    try:
        with once_measuring(fleet, "a2", crash, ready=lambda: feature(b2) != before["b2"][0]):
            res = fleet_cli(fleet, tmp_path, "fleet", "run", str(plan), "--inventory", str(inv), "--group", "rack",
                            "--db", str(db), "--bundle", str(bundle), "--forks", "2")
        assert "gro" in crashed, (res.stdout + res.stderr)[-3000:]
        assert crashed["gro"] != before["b2"][0]
        assert any(" -m offlab run " in f" {c} " or "offlab run " in c for c in crashed["commands"]), crashed  # type: ignore[attr-defined]
        # No command from anywhere: b2's watchdog puts its setting back and ends the run's server there,
        # then leaves itself (a hang guard only: the time it took is printed, not judged).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (settings_of(fleet)["b2"] != before["b2"] or sshd_mod.processes_in(b2)):
            time.sleep(0.2)
        took = time.monotonic() - crashed["at"]  # type: ignore[operator]
        assert settings_of(fleet)["b2"] == before["b2"] and not sshd_mod.processes_in(b2), (took, sshd_mod.processes_in(b2))
        lapsed = list((fleet.path("remote", "b2") / "lapsed").glob("*.txt"))
        # One record per lease of the killed processes (the run and its pair's runner each hold their own).
        records = "".join(p.read_text() for p in lapsed)
        assert lapsed and "restored: t1 gro" in records and "controller pid " in records, records
        print(f"b2 put back by its {lease}-s lease {took:.1f} s after its controller was killed")
    finally:
        sshd_mod.reconnect(fleet, "b2")
    assert res.returncode != 0, res.stdout
    # The next `fleet run` on that pair says what b2's lease did, as `offlab restore` would, before anything
    # runs there: its pair's runner reads (and removes) the records of its hosts when it tears its lab
    # down, and its output does not reach the fleet's. One round: only what it says is checked here.
    after = tmp_path / "after.yaml"
    after.write_text(pair_plan("fleet-after", 1))
    res = fleet_cli(fleet, tmp_path, "fleet", "run", str(after), "--inventory", str(inv), "--group", "rack",
                    "--db", str(db), "--bundle", str(bundle), "--forks", "2")
    said = [l for l in res.stdout.splitlines() if l.startswith("b2: ")]
    assert said and said[0].startswith("b2: restored by its lease at ") and "fell silent at" in said[0], res.stdout
    assert any(l.startswith("b2:   restored: t1 gro") for l in said), res.stdout
    # What a2's killed controller left (its own settings, its run directory): `fleet clean`; b2's record
    # was said once, and is gone.
    res = fleet_cli(fleet, tmp_path, "fleet", "clean", "--inventory", str(inv), "--host", "a2", "--host", "b2")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert not [l for l in res.stdout.splitlines() if "restored by its lease" in l], res.stdout
    assert leftovers_on_the_machines(fleet) == []
    assert settings_of(fleet) == before


# Two servers lost mid-run in one fleet run of four pairs, each a pair of its own, so that neither loss
# touches the other's pair: b2's management link cut (then its own restore.sh), b3's sshd stopped with
# every session (then `fleet clean` alone, once it is back); and b4 unreachable from the start (nothing
# listens at its port): its pair is not run, and named. a1 b1 go on, into a shared PostgreSQL. a2 b2 a3
# b3 a4 have a copy of a1's installation, which the run keeps, as the runs above keep the first run's: `fleet
# clean` of the failed pairs removes theirs.
def test_servers_lost_mid_run_or_unreachable_cost_only_their_pairs_the_other_goes_on_and_fleet_clean_puts_all_back(
        fleet, bundle, tmp_path, pg):  # noqa: F811
    # Two rounds of the two cells: a loss lands after a pair's first sample, with samples still to come.
    inv, plan, _ = run_files(fleet, tmp_path, pair_plan("fleet", 2), machines=fleet.names())
    # The lost servers' leases outlast the test: what is proven here is that `fleet clean` and restore.sh
    # put them back; a lease that lapses on its own is test_lease's (it would race these checks).
    inv.write_text(fleet.ansible_inventory({"b2": {"offlab_lease": 3600}, "b3": {"offlab_lease": 3600},
                                            "b4": {"ansible_port": 2299}}, only=fleet.names()))
    # a2 b2's installation went with the lease test's `fleet clean`; a3 b3 a4 never had one
    installed_like(fleet, "a1", ["a2", "b2", "a3", "b3", "a4"])
    url = pg.database()
    before = settings_of(fleet)
    lost: dict[str, object] = {}

    def lose_b3() -> bool:
        # Read and lost as one step (b3 frozen meanwhile): the run may have just switched back to the
        # original between `ready` and here, and a b3 lost then would have nothing of the run's to keep.
        # A command caught mid-way (the run putting the setting back) dies with b3's sessions: resumed,
        # it would change b3 after its loss (a suite run at HEAD found gro back at its original so).
        with sshd_mod.frozen(fleet.machines["b3"].ns):
            gro = feature(fleet.machines["b3"].ns)
            if gro == before["b3"][0]:
                return False
            sshd_mod.lose(fleet, "b3")  # the listener, every session and its commands, by pid
        lost["gro"] = gro
        return True

    try:
        # b2 once a2 has stored a sample; b3 once a3 has, and the plan's setting is changed on b3
        with once_measuring(fleet, "a2", lambda: sshd_mod.cut(fleet, "b2")), \
                once_measuring(fleet, "a3", lose_b3, ready=lambda: feature(fleet.machines["b3"].ns) != before["b3"][0]):
            res = fleet_cli(fleet, tmp_path, "fleet", "run", str(plan), "--inventory", str(inv), "--group", "rack",
                            "--db", url, "--bundle", str(bundle), "--forks", "8",
                            env={"OFFLAB_FLEET_LOG": str(tmp_path / "ansible.log")})
    finally:
        sshd_mod.reconnect(fleet, "b2")
        if fleet.machines["b3"].proc is None:
            sshd_mod.bring_back(fleet, "b3")
    assert "gro" in lost, (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 3, (res.stdout + res.stderr)[-3000:]
    # The copied installations are ones the playbook keeps and checks, as a1 b1's; b4 never answered.
    text = (tmp_path / "ansible.log").read_text()
    reached = sorted(n for n in fleet.names() if n != "b4")
    assert task_results(text, "offlab installed from this bundle") == ["fatal b4"] + [f"ok {n}" for n in reached], \
        text[-3000:]
    assert task_results(text, "bundle copied") == [f"skipping {n}" for n in reached], text[-3000:]
    failed = [l for l in res.stdout.splitlines() if l.startswith("a4:t1,b4:t1: failed: ")]
    assert len(failed) == 1 and "host b4 unreachable" in failed[0] and "2299" in failed[0], res.stdout
    assert "a1:t1,b1:t1: ok: run " in res.stdout, res.stdout
    for client, server in (("a2", "b2"), ("a3", "b3")):
        failed = [l for l in res.stdout.splitlines() if l.startswith(f"{client}:t1,{server}:t1: failed: ")]
        assert len(failed) == 1 and server in failed[0].split("failed: ", 1)[1] and "samples kept in run" in failed[0], \
            res.stdout
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "3 of 4 pair(s) failed: " in res.stderr and "a4:t1,b4:t1: host b4 unreachable" in res.stderr, res.stderr
    from offlab.store import Store

    with Store.open(url) as store:
        runs = {r["name"]: r for r in store.list_runs()}
    assert sorted(runs) == [f"fleet @ a{k}:t1,b{k}:t1" for k in (1, 2, 3)], runs  # none of b4's pair
    assert (runs["fleet @ a1:t1,b1:t1"]["status"], runs["fleet @ a1:t1,b1:t1"]["samples"]) == ("done", 4), runs
    assert 1 <= runs["fleet @ a2:t1,b2:t1"]["samples"] < 4 and 1 <= runs["fleet @ a3:t1,b3:t1"]["samples"] < 4, runs
    # The lost pairs' journals stay on their ends and b2, b3 keep the run's key (they were cut off); the
    # other pair left nothing. Nobody could put b3 back while it was gone: its setting is still there.
    found = leftovers_on_the_machines(fleet)
    assert "b2: key offlab-fleet-" in " ".join(found) and "b3: key offlab-fleet-" in " ".join(found), found
    assert f"b3: {fleet.path('remote', 'b3')}" in found, found
    assert all(l.startswith(("a2: ", "b2: ", "a3: ", "b3: ")) for l in found), found
    assert lost["gro"] != before["b3"][0] and feature(fleet.machines["b3"].ns) == lost["gro"]
    # b2's pair: each machine's own restore.sh first, by hand. b3's: `fleet clean` alone (the host's own
    # restore.sh first). Then neither pair has anything left on either end, and every setting is back.
    for name in ("a2", "b2"):
        script = fleet.path("remote", name) / "restore.sh"
        if script.exists():
            NetnsHost(fleet.machines[name].ns).run(["sh", str(script)])
    res = fleet_cli(fleet, tmp_path, "fleet", "clean", "--inventory", str(inv), "--host", "a2", "--host", "b2",
                    "--host", "a3", "--host", "b3", "--host", "a4")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert leftovers_on_the_machines(fleet) == []
    assert settings_of(fleet) == before
    # --host: only the hosts named; the others keep their installation.
    assert [n for n in fleet.names() if fleet.path("prefix", n).exists()] == ["a1", "b1"]


# The run above cleaned its lost pairs' hosts with --host; what is left installed is a1 b1's (the first run's),
# and a clean without --host takes every host of the inventory it is given: these two.
def test_fleet_clean_removes_the_installation_from_every_host(fleet, tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(fleet.ansible_inventory(only=["a1", "b1"]))
    stale = fleet.path("authorized_keys", "b1")  # a key a crashed run left behind
    stale.write_text(stale.read_text() + "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDontUseThisKeyAnywhereXXXXXXXXXXXXXXXXXXXX offlab-fleet-0123abcd\n")
    res = fleet_cli(fleet, tmp_path, "fleet", "clean", "--inventory", str(inv))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    for name in ("a1", "b1"):
        assert not fleet.path("prefix", name).exists()
        assert "offlab-fleet-" not in fleet.path("authorized_keys", name).read_text()
        assert fleet.path("authorized_keys", name).read_text().startswith("ssh-ed25519 ")
    assert leftovers_on_the_machines(fleet) == []


def _bad(tmp_path, inventory: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    inv = tmp_path / "inventory.yml"
    inv.write_text(inventory)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    bundle = tmp_path / "bundle.tar"
    bundle.write_bytes(b"")
    # The CLI in this process (each refusal comes before a host or the playbook is reached, so nothing of
    # it runs elsewhere): the same exit code and streams as `offlab ...`, without an interpreter's start-up
    # per case; an exception other than offlab's one-line errors fails the test as a traceback would.
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        res = offlab_in_process("fleet", "run", str(plan), "--inventory", str(inv), "--bundle", str(bundle), *args)
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res


THREE = """
all:
  children:
    rack:
      hosts:
        h1: {ansible_host: 192.0.2.1, offlab_interfaces: [{name: t1, addresses: [10.200.1.1/24]}]}
        h2: {ansible_host: 192.0.2.2, offlab_interfaces: [{name: t1, addresses: [10.200.1.2/24]}]}
        h3: {ansible_host: 192.0.2.3, offlab_interfaces: [{name: t1, addresses: [10.200.2.1/24]}]}
"""


def test_bad_fleet_input_is_refused_in_one_line_before_anything_connects(tmp_path):
    res = _bad(tmp_path, THREE, "--group", "rack")
    assert res.returncode == 2 and "group 'rack' has 3 hosts (h1, h2, h3): pairs need an even number" in res.stderr
    res = _bad(tmp_path, THREE, "--pair", "h1:t1,h9:t1")
    assert res.returncode == 2 and "no host 'h9' in the inventory (hosts: h1, h2, h3)" in res.stderr, res.stderr
    res = _bad(tmp_path, THREE, "--pair", "h1:t1,h2:t1", "--pair", "h3:t1,h2:t1")
    assert res.returncode == 2 and "host 'h2' is also in pair 'h1:t1,h2:t1'" in res.stderr, res.stderr
    res = _bad(tmp_path, THREE, "--pair", "h1:t1,h2:t1", env={"OFFLAB_ANSIBLE_PLAYBOOK": "/nonexistent/ansible-playbook"})
    assert res.returncode == 3 and "OFFLAB_ANSIBLE_PLAYBOOK=/nonexistent/ansible-playbook: not an executable" in res.stderr
    res = _bad(tmp_path, THREE, "--pair", "h1:t1,h2:t1", "--bundle", str(tmp_path / "none.tar"))
    assert res.returncode == 2 and "none.tar: no such file: build it with `make bundle`" in res.stderr, res.stderr


def test_a_database_that_cannot_take_the_results_is_refused_before_any_host_is_touched(tmp_path, pg):
    res = _bad(tmp_path, THREE, "--pair", "h1:t1,h2:t1", "--db", f"postgresql://postgres@/offlab?host={tmp_path}&port={pg.port}")
    assert res.returncode == 3 and "connecting failed: " in res.stderr and "check that the server runs" in res.stderr
    assert "ansible-playbook: " not in res.stdout, res.stdout  # the playbook never started
    url = pg.database()
    from offlab.store import SCHEMA_VERSION, Store

    Store.open(url).close()
    pg.psql(f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'", db=url.split("@/")[1].split("?")[0])
    res = _bad(tmp_path, THREE, "--pair", "h1:t1,h2:t1", "--db", url)
    assert res.returncode == 3 and f"schema version {SCHEMA_VERSION + 1}" in res.stderr, res.stderr
    assert "ansible-playbook: " not in res.stdout, res.stdout  # the playbook never started
