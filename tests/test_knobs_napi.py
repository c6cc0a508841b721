"""The latency trade-off knobs in real namespaces: NAPI deferral per device, busy polling on the
machine, coalescing where a device has it. Each is set, read back, and put back — also after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import BadInput
from offlab.hosts import LOCAL
from offlab.knobs import Change, Transaction
from tests.conftest import REPO, offlab_cli, requires_root
from tests.helpers import journals, run as offlab_in_process

pytestmark = [requires_root, pytest.mark.network]

BUSY = ("net.core.busy_poll", "net.core.busy_read")


def napi_state(lab) -> dict[str, str]:
    out = {}
    for role in ("client", "server"):
        iface = lab.resolve_iface(role)
        for key in ("gro_flush_timeout", "napi_defer_hard_irqs"):
            out[f"{role}/{key}"] = lab.host(role).read(f"/sys/class/net/{iface}/{key}").strip()
    return out


def busy_state() -> dict[str, str]:
    return {k: LOCAL.read("/proc/sys/" + k.replace(".", "/")).strip() for k in BUSY}


def test_napi_deferral_and_busy_poll_are_set_read_back_and_put_back(veth_lab, state_dir):
    lab, c = veth_lab, veth_lab.client
    iface = lab.resolve_iface("client")
    before, busy_before = napi_state(lab), busy_state()
    with Transaction(label="napi") as tx:
        out = tx.apply([Change(c, "gro_flush_timeout", 20000, "to-server", lab),
                        Change(c, "napi_defer_hard_irqs", "2", "to-server", lab),
                        Change(LOCAL, "net.core.busy_poll", 50),
                        Change(LOCAL, "net.core.busy_read", 50)])
        assert all(o.ok for o in out), [o.line() for o in out]
        assert [o.actual for o in out] == ["20000", "2", "50", "50"]
        assert c.read(f"/sys/class/net/{iface}/gro_flush_timeout").strip() == "20000"
        assert c.read(f"/sys/class/net/{iface}/napi_defer_hard_irqs").strip() == "2"
        assert busy_state() == {k: "50" for k in BUSY}
        assert out[2].where == "machine"
    assert napi_state(lab) == before and busy_state() == busy_before
    assert journals(state_dir) == []


@pytest.mark.parametrize("change, message", [
    (("napi_defer_hard_irqs", -1), "-1 is out of range"),
    (("napi_defer_hard_irqs", 2**31), "out of range 0..2147483647"),
    (("gro_flush_timeout", "20us"), "expected an integer"),
    (("gro_flush_timeout", 10**10), "out of range"),
    (("net.core.busy_poll", -5), "out of range 0..2147483647"),
    (("net.core.busy_read", "fast"), "expected 1 integer"),
])
def test_bad_values_name_the_setting_and_change_nothing(veth_lab, state_dir, change, message):
    lab = veth_lab
    before, busy_before = napi_state(lab), busy_state()
    key, value = change
    host, iface = (LOCAL, None) if key.startswith("net.") else (lab.client, "to-server")
    with pytest.raises(BadInput, match=message) as e:
        with Transaction() as tx:
            tx.apply([Change(lab.client, "gro_flush_timeout", 1000, "to-server", lab),
                      Change(host, key, value, iface, lab if iface else None)])
    assert key in str(e.value)
    assert napi_state(lab) == before and busy_state() == busy_before


def test_busy_poll_in_a_lab_host_is_refused_as_host_wide_naming_the_plan_form(veth_lab, state_dir):
    with pytest.raises(BadInput, match=r"host-wide.*machine: \{net.core.busy_poll"):
        with Transaction() as tx:
            tx.apply([Change(veth_lab.client, "net.core.busy_poll", 50, None, veth_lab)])


def test_coalescing_on_a_veth_is_cannot_test_here_exit_3_through_lab_set(veth_lab, state_dir):
    res = offlab_in_process("lab", "set", veth_lab.name, "client", "to-server", "coalesce.rx-usecs=10")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "has no coalescing parameters (ethtool -c: Operation not supported)" in res.stdout
    assert "cannot test coalesce.rx-usecs=10 here" in res.stdout
    assert journals(state_dir) == []


CELL = """
import sys, time
from offlab.hosts import LOCAL
from offlab.lab import LabState
from offlab.knobs import Change, Transaction
lab = LabState.load(sys.argv[1])
with Transaction(label="napi kill") as tx:
    out = tx.apply([Change(lab.client, "gro_flush_timeout", 50000, None, lab),
                    Change(lab.server, "napi_defer_hard_irqs", 3, None, lab),
                    Change(LOCAL, "net.core.busy_read", 25)])
    assert all(o.ok for o in out), [o.line() for o in out]
    print("applied", flush=True)
    time.sleep(60)
"""


def test_kill_9_leaves_a_journal_that_offlab_restore_replays(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before, busy_before = napi_state(lab), busy_state()
        proc = subprocess.Popen([sys.executable, "-c", CELL, lab_name], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
            assert napi_state(lab) != before and busy_state()["net.core.busy_read"] == "25"
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=20) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert len(journals(state_dir)) == 1
        res = offlab_in_process("restore")
        assert res.returncode == 0 and res.stdout.count("restored ") == 3, res.stdout + res.stderr
        assert napi_state(lab) == before and busy_state() == busy_before
        assert journals(state_dir) == []
    finally:
        teardown.down(lab_name)


def test_lab_down_takes_the_devices_napi_settings_with_it(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    res = offlab_cli("lab", "set", lab_name, "client", "to-server", "gro_flush_timeout=20000")
    assert res.returncode == 0 and "gro_flush_timeout: 0 → 20000" in res.stdout, res.stdout + res.stderr
    assert "gro_flush_timeout" in offlab_in_process("restore", "--list").stdout
    assert offlab_in_process("lab", "down", lab_name).returncode == 0
    assert "gro_flush_timeout" not in offlab_in_process("restore", "--list").stdout
    assert journals(state_dir) == []
    del lab
