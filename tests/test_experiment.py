"""Whole pipeline in real labs: plan → runner → SQLite → comparison, with effects large enough to be robust."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from offlab.report.compare import compare_run
from offlab.experiment.plan import load_plan
from offlab.experiment.runner import Runner
from offlab.store import Store
from tests.conftest import REPO, netns_names, requires_root
from tests.helpers import USO, ended, run_until_samples, uso_plan

pytestmark = [requires_root, pytest.mark.network]

def test_uso_gso_gro_sends_super_packets_and_an_impossible_feature_is_skipped(tmp_path, clean_machine):
    store = Store.open(tmp_path / "r.db")
    run_id = Runner(load_plan(USO, "uso-test.yaml"), store).run()
    run = store.get_run(run_id)
    assert run["status"] == "done" and run["seed"] == 7
    cells = {c["key"]: c for c in store.cells(run_id)}
    assert cells["offload=lro"]["status"] == "skipped"
    assert re.fullmatch(r"cannot test here: lro is off \[fixed\] on client:\S+: the driver does not let it change"
                        r" — cannot test lro=on here", cells["offload=lro"]["reason"]), cells["offload=lro"]["reason"]
    assert store.samples(run_id, cells["offload=lro"]["id"]) == []
    [row] = [r for r in compare_run(store, run_id) if r.metric == "throughput_bps" and r.cell == "offload=on"]
    # The comparison is the sequential rule's over the 3 paired rounds. Which side is faster is decided on
    # recorded runs (test_sequential): ×8.6-10.7, yet undetermined at the first look in 2 of 20 live runs
    # under stress-ng beside other jobs, when one plain sample's receiver was starved.
    assert (row.rule, row.pairs) == ("sequential", 3), row
    # What GSO+GRO does, by the server veth's counters in every round: super-packets, against wire frames.
    for key, avg in (("offload=on", lambda b: b > 20_000), ("offload=off", lambda b: b == pytest.approx(1514, abs=20))):
        for s in store.samples(run_id, cells[key]["id"]):
            server = next(v for k, v in s["sample"]["probes"]["interfaces"].items() if k.startswith("server:"))
            assert avg(server["rx_avg_bytes"]), (key, server)
    env = run["env"]
    assert env["kernel"] and env["cpus"] == os.cpu_count() and env["labs"][0]["hosts"]["client"]["interfaces"]
    # The knobs' requested vs actual state is stored with every sample.
    on = store.samples(run_id, cells["offload=on"]["id"])[0]["sample"]["knobs"]
    assert on[0]["requested"] == "on" and on[0]["actual"] == "on"


def test_jumbo_9000_through_a_bridge_carries_9014_byte_frames_and_1500_never_fragments(tmp_path, clean_machine):
    """Plan → runner → capture with each sample. Which MTU is faster is decided on recorded runs
    (test_sequential; 3 or 4 rounds at ×2.9-3.0, too close to three to decide live at any load)."""
    plan = textwrap.dedent("""\
        name: jumbo-test
        topology: {kind: bridge}
        axes:
          mtu: {"1500": {mtu: 1500}, "9000": {mtu: 9000}}
          # All offloads off, so the MTU is what sizes every frame.
          off: {all: {features: {client: {tso: off, gso: off}, server: {gro: off}}}}
        workload: {tool: iperf3, protocol: tcp, duration: 1, warmup: 0.5}
        repeat: {min: 1, max: 1, level: 95, width: 50}
        capture: {on: server, frames: 200}
        """)
    store = Store.open(tmp_path / "j.db")
    run_id = Runner(load_plan(plan, "jumbo-test.yaml"), store).run()
    assert store.get_run(run_id)["status"] == "done"
    caps = {c["mtu"]: c for c in (s["sample"]["capture"] for s in store.samples(run_id))}
    assert set(caps) == {1500, 9000}, caps
    # full-size TCP segments: a frame of the MTU plus the Ethernet header, never an IP fragment
    assert all(c["ip_fragments"] == 0 and c["largest_frame"] == mtu + 14 for mtu, c in caps.items()), caps


def test_sigint_mid_run_then_resume_completes_without_lost_or_duplicated_samples(tmp_path, clean_machine, state_dir):
    plan_path = tmp_path / "p.yaml"
    plan_path.write_text(uso_plan((3, 3), lro=False))
    db = tmp_path / "i.db"
    # interrupt once two samples exist, i.e. in the middle of the matrix
    proc, store, env = run_until_samples(plan_path, db, state_dir, 2)
    client_ns = next(n for n in netns_names() if n.startswith(f"ol-{os.environ['OFFLAB_LAB_PREFIX']}") and n.endswith("-client"))
    proc.send_signal(signal.SIGINT)
    _, err = ended(proc, 60)
    assert proc.returncode == 130, err
    run_id = store.list_runs()[0]["id"]
    assert store.get_run(run_id)["status"] == "interrupted"
    assert f"--resume {run_id}" in err
    assert client_ns not in netns_names(), err
    assert not [p for p in state_dir.rglob("*journal*") if p.is_file()], "settings journal left after an interrupt"
    before = {(s["cell_id"], s["round"]) for s in store.samples(run_id)}
    res = subprocess.run([sys.executable, "-m", "offlab", "run", "--resume", str(run_id), "--db", str(db)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    samples = store.samples(run_id)
    keys = [(s["cell_id"], s["round"]) for s in samples]
    assert len(keys) == len(set(keys)), "a (cell, round) sample was measured twice"
    assert before <= set(keys)
    assert sorted(keys) == sorted((c["id"], r) for c in store.cells(run_id) for r in range(3))
    assert store.get_run(run_id)["status"] == "done"


def test_sigterm_mid_cell_ends_interrupted_and_resumable(tmp_path, clean_machine, state_dir):
    plan_path = tmp_path / "p.yaml"
    plan_path.write_text(uso_plan((2, 2), lro=False))
    db = tmp_path / "t.db"
    proc, store, env = run_until_samples(plan_path, db, state_dir, 1)  # the next cell is being measured
    time.sleep(0.5)  # inside the next cell (1.3 s of traffic), its knobs' transaction open
    proc.send_signal(signal.SIGTERM)
    _, err = ended(proc, 60)
    run_id = store.list_runs()[0]["id"]
    run = store.get_run(run_id)
    assert run["status"] == "interrupted", (run["status"], err)
    assert run["note"] == f"interrupted; resume with `offlab run --resume {run_id}`"
    assert proc.returncode == 130 and f"--resume {run_id}" in err, err
    assert not [p for p in state_dir.rglob("*journal*") if p.is_file()], "settings journal left after SIGTERM"
    res = subprocess.run([sys.executable, "-m", "offlab", "run", "--resume", str(run_id), "--db", str(db)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert store.get_run(run_id)["status"] == "done"
    assert len(store.samples(run_id)) == 2 * 2  # 2 cells × 2 rounds, none lost or measured twice


def test_time_budget_stops_the_run_between_samples(tmp_path, clean_machine):
    plan = load_plan(USO.replace("seed: 7", "seed: 7\nbudget: 1"), "budget-test.yaml")
    assert plan.budget_s == 1
    store = Store.open(tmp_path / "b.db")
    run_id = Runner(plan, store).run()
    run = store.get_run(run_id)
    assert run["status"] == "budget_exhausted" and run["note"] == "time budget of 1 s used up"
    # A sample takes 1.3 s of traffic and the budget counts from the start of the run, lab build
    # included, so it is spent after the first cell that measures, or before it when the build took
    # most of the second (the lro cell is skipped without a sample, whenever its turn comes).
    assert len(store.samples(run_id)) <= 1
