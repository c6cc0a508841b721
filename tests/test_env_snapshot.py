"""The environment stored with a run: what machine, which tools, which settings, what each lab looked like."""

from __future__ import annotations

import os
import platform
from types import SimpleNamespace

import pytest

from offlab import __version__
from offlab import lab as labs
from offlab.experiment import teardown
from offlab.experiment.env import SYSCTLS, environment
from offlab.knobs import Change, Transaction
from tests.conftest import requires_root

pytestmark = [requires_root, pytest.mark.network]


def test_snapshot_names_machine_tools_sysctls_and_the_lab_as_it_is(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name, mtu=1400)
    try:
        client_if = lab.resolve_iface("client")
        with Transaction(persist=True) as tx:  # a setting left journalled, as `lab set` leaves it
            tx.apply([Change(lab.client, "gro", "on", client_if, lab)])
        env = environment(SimpleNamespace(text="name: snap\n"), [lab])
        live = lab.client.run(["ethtool", "-k", client_if]).stdout
    finally:
        teardown.down(lab_name)
    assert env["kernel"] == platform.release() and env["cpus"] == os.cpu_count()
    assert env["hostname"] == platform.node() and env["plan_text"] == "name: snap\n"
    # what `compare A B` sets beside each other: the governor (or why none) and the load as the run started
    governor = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    assert env["governor"].startswith("none: no cpufreq") != os.path.exists(governor), env["governor"]
    with open("/proc/loadavg") as f:
        assert abs(env["loadavg"] - float(f.read().split()[0])) < 5
    assert env["versions"]["offlab"] == __version__ and env["versions"]["python"] == platform.python_version()
    assert env["versions"]["ethtool"].startswith("ethtool version")  # the tool's own first line
    assert env["versions"]["ip"].startswith("ip utility")
    assert set(env["sysctls"]) == set(SYSCTLS)
    with open("/proc/sys/net/core/rmem_max") as f:
        assert env["sysctls"]["net.core.rmem_max"] == f.read().strip()
    (snap,) = env["labs"]
    assert (snap["name"], snap["topology"], snap["mtu"]) == (lab_name, "veth", 1400)
    (iface,) = [i for i in snap["hosts"]["client"]["interfaces"] if i["name"] == client_if]
    assert iface["mtu"] == 1400 and iface["addresses"] == ["10.200.1.1/24"]
    assert iface["features"]["generic-receive-offload"] is True  # the journalled gro=on, in force
    assert "generic-receive-offload: on" in live
    assert [(c["host"], c["iface"], c["key"], c["value"], c["original"]) for c in snap["changes"]] == [
        ("client", client_if, "gro", "on", "off")]
