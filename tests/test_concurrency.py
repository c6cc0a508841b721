"""Concurrency: one writer per run, a held lab is not pulled away, machine-wide settings have one owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from offlab.errors import EnvironmentProblem
from offlab.experiment.runner import Runner
from offlab.hosts import LOCAL
from offlab.knobs import Change, Transaction
from offlab.store import Store
from tests.conftest import REPO, offlab_cli, requires_root
from tests.helpers import ended, run_until_samples

pytestmark = [requires_root, pytest.mark.network]

PLAN = textwrap.dedent("""\
    name: conc-test
    topology: {kind: veth}
    axes:
      size:
        small: {workload: {size: 1000}}
        large: {workload: {size: 1472}}
    workload: {tool: engine, protocol: udp, rate: 500pps, duration: 1, warmup: 0.3}
    repeat: {min: 20, max: 20, level: 95, width: 50}
    seed: 3
    """)

# The plans' traffic is paced at 500 pps (a paced engine sleeps between sends; unlimited, it takes a CPU):
# these tests check locks, holds and exit codes of runs in progress, never what the traffic achieved.

# Host-wide, harmless (the rate limit of kernel network log messages), used by no other test.
SYSCTL = "net.core.message_cost"
SYSCTL_PATH = "/proc/sys/net/core/message_cost"


def _start_run(tmp_path: Path, state_dir: Path, samples: int) -> tuple[subprocess.Popen, Store, int]:
    """`offlab run` in the background, returned once it has committed `samples` samples."""
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN)
    proc, store, _ = run_until_samples(plan, tmp_path / "c.db", state_dir, samples)
    return proc, store, store.list_runs()[0]["id"]


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return ended(proc, 60)


def test_resume_of_a_run_that_is_still_running_is_refused_naming_its_pid(tmp_path, state_dir, clean_machine):
    proc, store, run_id = _start_run(tmp_path, state_dir, 1)
    try:
        with pytest.raises(EnvironmentProblem, match=f"run {run_id} is running as pid {proc.pid}"):
            Runner.resume(store, run_id)
        res = offlab_cli("run", "--resume", str(run_id), "--db", str(store.path))
        assert res.returncode == 3, res.stderr
        assert f"run {run_id} is running as pid {proc.pid}" in res.stderr
    finally:
        _stop(proc)
    assert proc.returncode == 130
    n = len(store.samples(run_id))
    runner = Runner.resume(store, run_id)  # the lock died with its holder
    runner.lock.release()
    assert len(store.samples(run_id)) == n


def test_lab_down_refuses_a_lab_a_live_run_holds_and_force_ends_the_cell_as_interrupted(
        tmp_path, state_dir, clean_machine):
    proc, store, run_id = _start_run(tmp_path, state_dir, 2)
    try:
        res = offlab_cli("lab", "down", "--all", env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert res.returncode == 3, res.stderr
        assert f"in use by run {run_id} (pid {proc.pid})" in res.stderr and "--force" in res.stderr
        listing = offlab_cli("lab", "list", env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert f"in use by run {run_id}" in listing.stdout
        kept = len(store.samples(run_id))
        res = offlab_cli("lab", "down", "--all", "--force", env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert res.returncode == 0 and "removed namespace" in res.stdout, res.stderr
        _, err = ended(proc, 60)
    finally:
        _stop(proc)
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "was removed while cell" in err
    run = store.get_run(run_id)
    assert run["status"] == "interrupted" and "removed" in run["note"]
    interrupted = [c for c in store.cells(run_id) if c["status"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["reason"].startswith("interrupted: lab removed")
    assert len(store.samples(run_id)) >= kept


_HOLDER = textwrap.dedent(f"""\
    import sys
    from offlab.hosts import LOCAL
    from offlab.knobs import Change, Transaction
    with Transaction(label="holder") as tx:
        tx.apply([Change(LOCAL, "{SYSCTL}", sys.argv[1])])
        print("ready", flush=True)
        sys.stdin.read()
    """)


def _count_polls(monkeypatch, on_first=None) -> list[float]:
    """The pauses a lease's wait takes between its tries, in a list that grows with each; `on_first`
    runs at the first pause (offlab.state's clock and sleep are otherwise the real ones)."""
    import offlab.state

    polls: list[float] = []

    def pause(seconds: float) -> None:
        polls.append(seconds)
        if on_first is not None and len(polls) == 1:
            on_first()
        time.sleep(seconds)

    monkeypatch.setattr(offlab.state, "time", SimpleNamespace(monotonic=time.monotonic, sleep=pause))
    return polls


def test_a_machine_wide_sysctl_has_one_owner_across_state_dirs(tmp_path, state_dir, monkeypatch):
    original = Path(SYSCTL_PATH).read_text().strip()
    other = tmp_path / "other-state"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(int(original) + 2)], cwd=REPO,
                              env={**os.environ, "OFFLAB_STATE_DIR": str(other)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        monkeypatch.setenv("OFFLAB_LEASE_WAIT", "0.5")
        polls = _count_polls(monkeypatch)
        with pytest.raises(EnvironmentProblem, match=f"held by pid {holder.pid} \\(holder, state dir {other.resolve()}\\); "
                                                     "waited 0.5 s"):
            with Transaction(label="second") as tx:
                tx.apply([Change(LOCAL, SYSCTL, str(int(original) + 3))])
        assert polls, "the second run gave up without waiting for the lease"
        # The second run changed nothing and recorded nothing: the holder's value stands.
        assert Path(SYSCTL_PATH).read_text().strip() == str(int(original) + 2)
        # A third waits for the lease and takes it once the holder is gone: here the holder ends at the
        # third's first poll. The wait's 120 s only stop a hang.
        monkeypatch.setenv("OFFLAB_LEASE_WAIT", "120")
        polls = _count_polls(monkeypatch, on_first=lambda: holder.communicate(input="", timeout=30))
        with Transaction(label="third") as tx:
            out = tx.apply([Change(LOCAL, SYSCTL, str(int(original) + 3))])
            assert polls and holder.returncode == 0, holder.stderr
            assert out[0].original == original and out[0].actual == str(int(original) + 3)
            assert tx.in_force() == [{"where": "machine", "key": SYSCTL, "value": str(int(original) + 3),
                                      "machine_wide": True}]
    finally:
        holder.communicate(input="", timeout=30)
    assert holder.returncode == 0, holder.stderr
    assert Path(SYSCTL_PATH).read_text().strip() == original


def test_a_machine_setting_left_changed_by_a_killed_run_is_not_taken_for_the_original(tmp_path, state_dir):
    original = Path(SYSCTL_PATH).read_text().strip()
    other = tmp_path / "other-state"
    env = {**os.environ, "OFFLAB_STATE_DIR": str(other)}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(int(original) + 4)], cwd=REPO, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        holder.kill()
        holder.wait()
        with pytest.raises(EnvironmentProblem, match=f"ended before putting it back.*OFFLAB_STATE_DIR={other.resolve()} offlab restore"):
            with Transaction(label="next") as tx:
                tx.apply([Change(LOCAL, SYSCTL, str(int(original) + 5))])
        assert Path(SYSCTL_PATH).read_text().strip() == str(int(original) + 4)
    finally:
        res = offlab_cli("restore", env={"OFFLAB_STATE_DIR": str(other)})
        holder.communicate()
    assert res.returncode == 0, res.stderr
    assert Path(SYSCTL_PATH).read_text().strip() == original
    with Transaction(label="after restore") as tx:
        assert tx.apply([Change(LOCAL, SYSCTL, str(int(original) + 5))])[0].ok
    assert Path(SYSCTL_PATH).read_text().strip() == original


def test_lab_down_during_offlab_measure_is_refused_and_force_ends_it_in_one_line(lab_name, state_dir, clean_machine):
    from offlab import lab as labs

    labs.up("veth", lab_name)
    env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir)}
    # Ten minutes: only the forced down ends it (30 s ran out at load 20 before the two CLI starts below were
    # done, and the measure ended on its own); communicate's timeout stops a hang.
    proc = subprocess.Popen([sys.executable, "-m", "offlab", "measure", lab_name, "--tool", "engine", "--proto", "udp",
                             "--rate", "500pps", "--duration", "600", "--warmup", "0.2"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # a loaded machine may take long to start the measure
        while not list((state_dir / "labs").glob(f"{lab_name}.hold-*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(1.5)  # inside the traffic window
        res = offlab_cli("lab", "down", lab_name, env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert res.returncode == 3 and f"in use by offlab measure (pid {proc.pid})" in res.stderr, res.stderr
        res = offlab_cli("lab", "down", "--force", lab_name, env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert res.returncode == 0, res.stderr
        _, err = ended(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (2, 3), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


MACHINE_PLAN = textwrap.dedent(f"""\
    name: machine-test
    topology: {{kind: veth}}
    axes:
      cost:
        raised: {{settings: {{machine: {{{SYSCTL}: VALUE}}}}}}
    workload: {{tool: engine, protocol: udp, size: 1000, rate: 500pps, duration: 1, warmup: 0.2}}
    repeat: {{min: 20, max: 20, level: 95, width: 50}}
    seed: 5
    """)


def test_two_runs_on_one_machine_sysctl_the_second_fails_naming_the_first_and_samples_record_it(
        tmp_path, state_dir, clean_machine, monkeypatch):
    from offlab.experiment.plan import load_plan

    original = Path(SYSCTL_PATH).read_text().strip()
    first_value = str(int(original) + 2)
    plan = tmp_path / "m.yaml"
    plan.write_text(MACHINE_PLAN.replace("VALUE", first_value))
    proc, store, _ = run_until_samples(plan, tmp_path / "m.db", state_dir, 2)
    try:
        first = store.list_runs()[0]["id"]
        # A second run, from another state directory and database, wants the same sysctl.
        other = tmp_path / "other-state"
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(other))
        monkeypatch.setenv("OFFLAB_LEASE_WAIT", "1.5")
        monkeypatch.setenv("OFFLAB_LAB_PREFIX", os.environ["OFFLAB_LAB_PREFIX"] + "b")  # its own lab names
        second_store = Store.open(tmp_path / "second.db")
        second = Runner(load_plan(MACHINE_PLAN.replace("VALUE", str(int(original) + 3)), "m2.yaml"), second_store)
        with pytest.raises(EnvironmentProblem, match=f"held by pid {proc.pid} \\(run {first} \\(machine-test\\), "
                                                     f"state dir {state_dir.resolve()}\\)"):
            second.run()
        run2 = second_store.list_runs()[0]
        assert run2["status"] == "failed" and f"held by pid {proc.pid}" in run2["note"]
        assert second_store.samples(run2["id"]) == []
        assert Path(SYSCTL_PATH).read_text().strip() in (first_value, original)  # never the second's value
    finally:
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(state_dir))
        _stop(proc)
    samples = store.samples(first)
    assert samples and all(s["sample"]["in_force"] == [{"where": "machine", "key": SYSCTL, "value": first_value,
                                                        "machine_wide": True}] for s in samples)
    assert Path(SYSCTL_PATH).read_text().strip() == original
