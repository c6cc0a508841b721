"""A run's status tells the truth after the process that ran it is gone (issue 15 item 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from offlab.store import Store
from tests.conftest import REPO, netns_names, requires_root
from tests.helpers import run as offlab_in_process
from tests.helpers import run_until_samples, uso_plan


@requires_root
@pytest.mark.network
def test_a_run_killed_with_sigkill_is_listed_interrupted_once_its_pid_is_gone(tmp_path, clean_machine, state_dir):
    plan_path = tmp_path / "p.yaml"
    plan_path.write_text(uso_plan((3, 3), lro=False))
    db = tmp_path / "k.db"
    proc, store, env = run_until_samples(plan_path, db, state_dir, 1)
    run_id = store.list_runs()[0]["id"]
    try:
        assert store.list_runs()[0]["status"] == "running"  # alive: its lock names a live process
        os.kill(proc.pid, signal.SIGKILL)  # no handler runs: nothing marks the run
        proc.communicate(timeout=30)
        # read in this process (no interpreter start): what is checked is the status read from the store
        listed = offlab_in_process("results", "list", "--json", "--db", str(db))
        assert listed.returncode == 0, listed.stderr
        (run,) = json.loads(listed.stdout)
        assert run["status"] == "interrupted", run
        assert f"offlab run --resume {run_id}" in run["note"] and f"pid {proc.pid}" in run["note"]
        shown = offlab_in_process("results", "show", str(run_id), "--db", str(db))
        assert f"run {run_id}: uso-test  interrupted" in shown.stdout, shown.stdout
        with Store.open(db) as s:  # written back, so plain SQL sees it too
            assert s.conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0] == "interrupted"
    finally:
        # kill -9 left the run's labs and journalled settings: put the machine back as offlab promises.
        for argv in (["restore"], ["lab", "down", "--all", "--force"]):
            subprocess.run([sys.executable, "-m", "offlab", *argv], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert not [n for n in netns_names() if n.startswith(f"ol-{os.environ['OFFLAB_LAB_PREFIX']}")]


def test_a_running_run_without_a_lock_is_running_for_a_minute_then_interrupted(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        run = store.create_run("r", "name: r\n", {}, 1, {}, None, {})
        assert store.get_run(run)["status"] == "running"  # just created: the runner takes the lock next
        store.conn.execute("UPDATE runs SET started_at = '2020-01-01T00:00:00.000Z' WHERE id = ?", (run,))
        got = store.get_run(run)
        assert got["status"] == "interrupted" and f"--resume {run}" in got["note"]


def test_sigterm_before_the_run_is_stored_prints_no_resume_hint(monkeypatch):
    import typer
    from rich.console import Console

    from offlab.cli import experiment
    from offlab.cli.experiment import _finish

    record = Console(record=True, width=200)
    monkeypatch.setattr(experiment, "out", record)

    class Early:  # SIGTERM while the labs were being built: no run id yet
        run_id = None

        def run(self):
            raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as exc:
        _finish(None, Early(), False)
    assert exc.value.exit_code == 130
    out = record.export_text()
    assert "--resume None" not in out and "nothing to resume" in out
