"""A run keeps one journalled transaction and moves it from cell to cell: on a real veth lab, each
sample sets and restores only the settings that differ from the previous cell's, records what was
in force, and the lab ends as it began — also after kill -9 and `offlab restore`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.experiment.plan import load_plan
from offlab.experiment.runner import Runner
from offlab.store import Store
from tests.conftest import REPO, offlab_cli, requires_root
from tests.helpers import journals, lab_state

pytestmark = [requires_root, pytest.mark.network]

# Two cells that share four settings and differ in one each (server gro on; server tso off).
PLAN = textwrap.dedent("""\
    name: carry-test
    topology: {kind: veth}
    axes:
      shared:
        all:
          features: {client: {tso: off, gso: off, gro: on}}
          settings: {client: {txqueuelen: 500}}
      own:
        a: {features: {server: {gro: on}}}
        b: {features: {server: {tso: off}}}
    workload: {tool: engine, protocol: udp, size: 1472, rate: 500pps, duration: 0.5, warmup: 0.2}
    repeat: {min: ROUNDS, max: ROUNDS, level: 95, width: 200}
    seed: 3
    """)
SHARED = 4

CHILD = """
import sys
from offlab.experiment.plan import load_plan
from offlab.experiment.runner import Runner
from offlab.lab import LabState
from offlab.store import Store
Runner(load_plan(open(sys.argv[2]).read(), sys.argv[2]), Store.open(sys.argv[3]), lab=LabState.load(sys.argv[1])).run()
"""


def _own(event: dict) -> str:
    return event["cell"].split("own=")[1]


def _base_differs(lab) -> dict[str, bool]:
    """Whether each cell's own setting differs from the lab's base state (then it must be written)."""
    iface = lab.resolve_iface("server", None)
    srv = lab_state(lab)[f"server/{iface}/features"][0]
    return {"a": not srv["generic-receive-offload"]["active"],
            "b": any(srv[k]["active"] for k in srv if k.startswith("tx-tcp") and k.endswith("segmentation"))}


def test_consecutive_cells_write_only_the_settings_that_differ(veth_lab, tmp_path, state_dir):
    lab = veth_lab
    before = lab_state(lab)
    own_written = _base_differs(lab)
    events: list[tuple[str, dict]] = []
    store = Store.open(tmp_path / "c.db")
    runner = Runner(load_plan(PLAN.replace("ROUNDS", "3"), "carry.yaml"), store, lab=lab,
                    on_event=lambda kind, info: events.append((kind, info)))
    run_id = runner.run()
    writes = [info for kind, info in events if kind == "knobs"]
    assert len(writes) == 6  # 2 cells × 3 rounds
    first, previous = writes[0], None
    assert first["restored"] == 0 and first["kept"] == 0 and first["applied"] >= 1
    for w in writes:
        cell = _own(w)
        if previous is None:
            pass
        elif previous == cell:  # the same cell again: nothing to write, nothing to read back
            assert (w["applied"], w["restored"], w["kept"], w["checked"]) == (0, 0, SHARED + 1, 0), w
        else:  # the other cell: the shared four kept, only the own setting of each side written
            assert w["kept"] == SHARED, writes
            assert w["restored"] == int(own_written[previous]), w
            assert w["applied"] == int(own_written[cell]), w
        previous = cell
    # A transaction per sample applied (and restored) every setting of the cell that differs from the base.
    shared_written = first["applied"] - int(own_written[_own(first)])
    per_sample = sum(shared_written + int(own_written[_own(w)]) for w in writes)
    carried = sum(w["applied"] for w in writes)
    assert carried < per_sample, (carried, per_sample)
    # Each sample records what was in force at the end of its window: exactly its cell's five settings.
    for s in store.samples(run_id):
        cell = next(c for c in store.cells(run_id) if c["id"] == s["cell_id"])["key"]
        in_force = {f"{f['where'].split(':')[0]} {f['key']}": f["value"] for f in s["sample"]["in_force"]}
        own = {"a": {"server gro": "on"}, "b": {"server tso": "off"}}[cell.split("own=")[1]]
        assert in_force == {"client tso": "off", "client gso": "off", "client gro": "on",
                            "client txqueuelen": "500", **own}, (cell, in_force)
        assert s["sample"]["knob_writes"]["kept"] in (0, SHARED, SHARED + 1)
    assert lab_state(lab) == before
    assert journals(state_dir) == []


def test_kill_9_mid_run_leaves_a_journal_that_restore_replays_to_the_base_state(veth_lab, tmp_path, state_dir):
    lab = veth_lab
    before = lab_state(lab)
    plan = tmp_path / "carry.yaml"
    plan.write_text(PLAN.replace("ROUNDS", "20"))
    db = tmp_path / "k.db"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, lab.name, str(plan), str(db)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        store, deadline = Store.open(db), time.monotonic() + 90
        while True:  # three samples: both cells measured, the transaction moved between them
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the run took no three samples in 90 s"
            runs = store.list_runs() if db.exists() else []
            if runs and len(store.samples(runs[0]["id"])) >= 3:
                break
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=20) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = journals(state_dir)
    assert len(left) == 1, left
    text = (state_dir / "journal" / left[0]).read_text()
    assert '"op": "restored"' in text  # the move between cells put a setting back, journalled
    assert lab_state(lab) != before  # a cell's settings were in force when it died
    res = offlab_cli("restore")
    assert res.returncode == 0 and "restored " in res.stdout, res.stdout + res.stderr
    assert lab_state(lab) == before
    assert journals(state_dir) == []


def test_a_kept_setting_that_a_restore_brought_back_is_set_again(veth_lab, state_dir):
    """sg off takes GSO down with it (measured here on a veth), so `gso off` is already so; when the
    next cell drops sg off, restoring sg brings GSO back, and the kept `gso off` is read again and set,
    journalled."""
    from offlab.knobs import Change, Transaction

    lab = veth_lab
    before = lab_state(lab)
    c = lab.client
    with Transaction(label="carry") as tx:
        first = tx.switch([Change(c, "sg", "off", None, lab), Change(c, "gso", "off", None, lab)])
        assert [o.ok for o in first] == [True, True] and not first[1].journalled  # already off with sg
        second = tx.switch([Change(c, "gso", "off", None, lab)])
        assert tx.counts["restored"] == 1 and tx.counts["checked"] == 1
        assert second[0].ok and second[0].journalled and second[0].actual == "off"
        assert [f["value"] for f in tx.in_force()] == ["off"]
        assert lab_state(lab) != before
        third = tx.switch([])  # nothing asked: everything back
        assert third == [] and lab_state(lab) == before
    assert lab_state(lab) == before and journals(state_dir) == []


def test_settings_of_another_lab_stay_until_that_lab_is_released(lab_name, clean_machine, state_dir):
    """A cell of lab B leaves lab A's settings alone (only B and the machine are in its scope); the
    runner releases A's before A goes (one guest at a time), and B's stay until the end."""
    from offlab.experiment.runner import _in_lab
    from offlab.knobs import Change, Transaction

    a, b = labs.up("veth", lab_name), labs.up("veth", lab_name[:-1] + "z")
    try:
        base_a, base_b = lab_state(a), lab_state(b)
        with Transaction(label="two labs") as tx:
            tx.switch([Change(a.client, "gso", "off", None, a)], _in_lab(a.name))
            tx.switch([Change(b.client, "gso", "off", None, b)], _in_lab(b.name))
            assert tx.counts["restored"] == 0 and lab_state(a) != base_a and lab_state(b) != base_b
            assert [f["key"] for f in tx.in_force(_in_lab(b.name))] == ["gso"]
            tx.release_scope(_in_lab(a.name))
            assert lab_state(a) == base_a and lab_state(b) != base_b
        assert lab_state(b) == base_b and journals(state_dir) == []
    finally:
        teardown.down(a.name)
        teardown.down(b.name)
