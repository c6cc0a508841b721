"""A process killed in the middle of a transaction: SIGINT and SIGTERM restore by themselves,
SIGKILL leaves a journal that `offlab restore` replays. In every case the lab ends as it began."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from tests.conftest import REPO, offlab_cli, requires_root
from tests.helpers import journals, lab_state

pytestmark = [requires_root, pytest.mark.network]

CELL = """
import sys, time
from offlab.lab import LabState
from offlab.knobs import Change, Transaction
lab = LabState.load(sys.argv[1])
c = lab.client
with Transaction(label="signal test") as tx:
    out = tx.apply([Change(c, "gro", "on", None, lab), Change(c, "tx", "off", None, lab),
                    Change(c, "mtu", 9000, None, lab), Change(c, "qdisc", "pfifo_fast", None, lab),
                    Change(c, "net.ipv4.ip_forward", 1, None, lab)])
    assert all(o.ok for o in out), [o.line() for o in out]
    print("applied", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["sigint", "sigterm", "sigkill"])
def test_killed_cell_ends_with_every_setting_back(signum, lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = subprocess.Popen([sys.executable, "-c", CELL, lab_name], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
            assert lab_state(lab) != before
            listed = offlab_cli("restore", "--list")
            assert "belongs to running process" in listed.stdout and "would restore" not in listed.stdout
            os.kill(proc.pid, signum)
            rc = proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert rc == -signal.SIGKILL if signum == signal.SIGKILL else rc != 0
        if signum == signal.SIGTERM:
            assert rc == 128 + signal.SIGTERM
        if signum == signal.SIGKILL:
            assert len(journals(state_dir)) == 1
            assert lab_state(lab) != before
            res = offlab_cli("restore")
            assert res.returncode == 0 and res.stdout.count("restored ") == 5, res.stdout + res.stderr
        assert lab_state(lab) == before
        assert journals(state_dir) == []
    finally:
        teardown.down(lab_name)


def test_restore_force_takes_over_a_live_process_journal(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = subprocess.Popen([sys.executable, "-c", CELL, lab_name], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
            assert "left alone" in offlab_cli("restore").stdout
            assert lab_state(lab) != before
            res = offlab_cli("restore", "--force")
            assert res.returncode == 0 and res.stdout.count("restored ") == 5, res.stdout + res.stderr
            assert lab_state(lab) == before and journals(state_dir) == []
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=20) == 128 + signal.SIGTERM
            assert "warning" not in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert lab_state(lab) == before
    finally:
        teardown.down(lab_name)
