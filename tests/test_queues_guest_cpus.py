"""An RPS/XPS mask is checked against the CPUs of the host it is set on: a guest's own vCPUs, not
this machine's (polish item 4)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import offlab_cli, requires_root

pytestmark = [
    requires_root,
    pytest.mark.network,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="QEMU is not installed"),
]


def _rps(name: str) -> str:
    res = offlab_cli("lab", "exec", name, "client", "--", "cat", "/sys/class/net/eth0/queues/rx-0/rps_cpus")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.mark.parametrize("cpus", [1, 2])
def test_an_rps_mask_beyond_the_guests_own_cpus_is_refused_naming_them(cpus, lab_name, clean_machine):
    res = offlab_cli("lab", "up", "vm", "--name", lab_name, "--guest-cpus", str(cpus), "--json", timeout=240)
    assert res.returncode == 0, res.stderr
    try:
        before = _rps(lab_name)
        # CPU 1 exists on this 2-CPU machine, and in the guest only when it has 2 vCPUs (RPS: the
    # guest NIC has one queue, whose xps_cpus the kernel does not show)
        res = offlab_cli("lab", "set", lab_name, "client", "eth0", "rps=0x2")
        if cpus == 1:
            assert res.returncode == 2, (res.stdout, res.stderr)
            line = res.stderr.strip().splitlines()[-1]
            assert "mask 0x2 names CPUs host client does not have (1 CPUs: at most 0x1)" in line, res.stderr
            assert "Traceback" not in res.stderr and _rps(lab_name) == before
        else:
            assert res.returncode == 0, res.stderr
            assert int(_rps(lab_name).replace(",", ""), 16) == 0x2
            shown = json.loads(offlab_cli("lab", "show", lab_name, "--json").stdout)
            assert [c["key"] for c in shown["changes"]] == ["rps"]
    finally:
        down = offlab_cli("lab", "down", lab_name)
    assert down.returncode == 0, down.stderr
