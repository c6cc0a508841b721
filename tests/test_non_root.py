"""Non-root use: the read-only commands work for any user; the others say they need root (exit 3)."""

from __future__ import annotations

import os
import subprocess

import pytest

from offlab.store import Store
from tests.conftest import REPO
from tests.helpers import DEBIAN_PYTHON, NOBODY, as_nobody
from tests.synthetic_results import make_uso_run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switches to the nobody user")



def test_makefile_builds_the_venv_with_an_interpreter_every_user_can_run(tmp_path):
    res = subprocess.run(["make", "-n", "-C", REPO, f"VENV={tmp_path}/venv", f"{tmp_path}/venv/.installed"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"{DEBIAN_PYTHON} -m venv {tmp_path}/venv" in res.stdout
    assert "chmod -R a+rX" in res.stdout
    assert subprocess.run([*NOBODY, DEBIAN_PYTHON, "-c", "import venv"], timeout=30).returncode == 0


def test_read_only_commands_work_for_a_non_root_user(shared_dir):
    db = shared_dir / "offlab.db"
    with Store.open(db) as store:
        run_id, _ = make_uso_run(store, rounds=2)
    out = shared_dir / "reports"
    out.mkdir()
    os.chown(out, 65534, 65534)
    env = {"OFFLAB_DB": str(db), "MPLCONFIGDIR": str(out)}
    for args in (["results", "list"], ["results", "show", str(run_id), "--json"], ["compare", str(run_id)],
                 ["report", str(run_id), "-o", str(out / "r.html")], ["mtu", "calc", "--mtu", "9000"],
                 ["doctor", "--root", f"{REPO}/tests/fixtures/doctor/tuned-host"], ["--help"],
                 ["lab", "list"]):
        res = as_nobody(*args, env={**env, "OFFLAB_STATE_DIR": str(shared_dir / "state")})
        assert res.returncode == 0, (args, res.stderr)
        assert "Traceback" not in res.stderr
    assert (out / "r.html").stat().st_size > 10_000


def test_commands_that_change_the_machine_say_they_need_root(shared_dir):
    plan = shared_dir / "p.yaml"
    plan.write_text("name: p\ntopology: {kind: veth}\nworkload: {tool: iperf3}\n")
    env = {"OFFLAB_DB": str(shared_dir / "none.db"), "OFFLAB_STATE_DIR": str(shared_dir / "state")}
    for args in (["run", str(plan)], ["run", "--resume", "1"], ["suite", "run", "quick"], ["restore"],
                 ["lab", "up", "veth", "--name", "nr"], ["lab", "set", "nr", "client", "-", "gro=off"]):
        res = as_nobody(*args, env=env)
        assert res.returncode == 3, (args, res.stderr)
        assert "needs root" in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    assert as_nobody("run", str(plan), "--validate", env=env).returncode == 0
