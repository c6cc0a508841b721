"""`offlab lab up vm`: a real TCG guest as the client, the tap on a bridge in the server namespace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, netns_names, offlab_cli, requires_root

pytestmark = [
    requires_root,
    pytest.mark.network,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                       reason="QEMU is not installed (scripts/install-deps installs it)"),
]


def qemu_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_lab_up_vm_show_exec_measure_down(lab_name, clean_machine):
    res = offlab_cli("lab", "up", "vm", "--name", lab_name, "--json", timeout=240)
    assert res.returncode == 0, res.stderr
    try:
        shown = json.loads(offlab_cli("lab", "show", lab_name, "--json").stdout)
        client, server = shown["hosts"]["client"], shown["hosts"]["server"]
        assert client["guest"]["accel"] in ("tcg", "kvm") and client["guest"]["vhost"] is False
        assert [i["name"] for i in client["interfaces"]] == ["eth0"]
        assert client["interfaces"][0]["addresses"] == ["10.200.1.1/24"]
        assert "tx-tcp-segmentation" in client["interfaces"][0]["features"]
        tap = client["guest"]["tap"]
        assert {i["name"]: i.get("master") for i in server["interfaces"]}[tap] == "br0"
        (daemon,) = shown["daemons"]
        assert daemon["name"] == "qemu-system-x86_64" and qemu_running(daemon["pid"])

        res = offlab_cli("lab", "exec", lab_name, "client", "--", "cat", "/proc/sys/kernel/hostname")
        assert (res.returncode, res.stdout) == (0, "offlab-guest\n")
        res = offlab_cli("lab", "exec", lab_name, "client", "--", "sh", "-c", "exit 5")
        assert res.returncode == 5

        res = offlab_cli("measure", lab_name, "--tool", "iperf3", "--proto", "tcp", "--json", timeout=180)
        assert res.returncode == 0, res.stderr
        assert "bits_per_second" in res.stdout or "throughput" in res.stdout
    finally:
        down = offlab_cli("lab", "down", lab_name)
    assert down.returncode == 0, down.stderr
    assert not qemu_running(daemon["pid"])
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())


def kill_9_once_qemu_is_recorded(topology: str, name: str, state_dir) -> int:
    """Start `offlab lab up TOPOLOGY`, kill -9 it once its first QEMU is in the lab file; QEMU's pid."""
    proc = subprocess.Popen([sys.executable, "-m", "offlab", "lab", "up", topology, "--name", name],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = state_dir / "labs" / f"{name}.json"
    deadline = time.monotonic() + 120
    pid = None
    while pid is None:  # QEMU is recorded as soon as it exists, before the boot is waited for
        assert time.monotonic() < deadline, "QEMU was never recorded in the lab file"
        try:
            daemons = json.loads(path.read_text()).get("daemons", [])
            pid = daemons[0]["pid"] if daemons else None
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert qemu_running(pid)
    return pid


def test_lab_down_after_kill_9_during_boot_stops_qemu(lab_name, clean_machine, state_dir):
    pid = kill_9_once_qemu_is_recorded("vm", lab_name, state_dir)
    res = offlab_cli("lab", "down", lab_name)
    assert res.returncode == 0, res.stderr
    assert "qemu-system-x86_64" in res.stdout
    assert not qemu_running(pid)
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())
