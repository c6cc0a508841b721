"""`offlab lab up vm`: a real TCG guest as the client, the tap on a bridge in the server namespace."""

from __future__ import annotations

import json


from tests.conftest import netns_names, offlab_cli, running
from tests.helpers import GUEST_MARKS, kill_9_once_qemu_is_recorded

pytestmark = GUEST_MARKS


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
        # nothing set on the command line, yet QEMU's defaults show: USO offered to the guest
        (nic,) = client["guest"]["nics"]
        assert nic["properties"] == {} and nic["effective_properties"]["host_uso"] == "on"
        explained = json.loads(offlab_cli("lab", "explain", lab_name, "client", "--json").stdout)
        uso = {r["prop"]: r for r in explained["nics"][0]["rows"]}["host_uso"]
        assert (uso["value"], uso["source"], uso["offered"], uso["accepted"]) == ("on", "default", True, True)
        (daemon,) = shown["daemons"]
        assert daemon["name"] == "qemu-system-x86_64" and running(daemon["pid"])

        res = offlab_cli("lab", "exec", lab_name, "client", "--", "cat", "/proc/sys/kernel/hostname")
        assert (res.returncode, res.stdout) == (0, "offlab-guest\n")
        res = offlab_cli("lab", "exec", lab_name, "client", "--", "sh", "-c", "exit 5")
        assert res.returncode == 5

        # The check is that data crossed, not how fast: at 50 Mbit/s the TCG guest does not take both
        # host CPUs for the sample (at full speed it does), and the bound below is 50 times lower. One
        # second, no warm-up (iperf3 takes it in whole seconds: the defaults were 3 s of traffic).
        res = offlab_cli("measure", lab_name, "--tool", "iperf3", "--proto", "tcp", "--rate", "50M", "--duration", "1",
                         "--warmup", "0", "--json", timeout=180)
        assert res.returncode == 0, res.stderr
        sample = json.loads(res.stdout)
        # Data crossed the guest's NIC: the receiver counted it, and the tap saw it (TCG: ~0.7 Gbit/s here).
        assert sample["traffic"]["throughput_bps"] > 1e6, sample["traffic"]
        assert sample["probes"]["window_s"] > 0
    finally:
        down = offlab_cli("lab", "down", lab_name)
    assert down.returncode == 0, down.stderr
    assert not running(daemon["pid"])
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())


def test_offlab_restore_after_kill_9_during_boot_stops_qemu_and_removes_the_lab(lab_name, clean_machine, state_dir):
    pid = kill_9_once_qemu_is_recorded("vm", lab_name, state_dir)
    listed = offlab_cli("restore", "--list")
    assert f"would remove lab {lab_name}" in listed.stdout and running(pid)
    res = offlab_cli("restore")
    assert res.returncode == 0, res.stderr
    assert f"removed (lab {lab_name}, its `lab up` died)" in res.stdout and "qemu-system-x86_64" in res.stdout
    assert not running(pid)
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()


def test_lab_down_after_kill_9_during_boot_stops_qemu(lab_name, clean_machine, state_dir):
    pid = kill_9_once_qemu_is_recorded("vm", lab_name, state_dir)
    res = offlab_cli("lab", "down", lab_name)
    assert res.returncode == 0, res.stderr
    assert "qemu-system-x86_64" in res.stdout
    assert not running(pid)
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())


def test_a_guest_sample_runs_no_command_in_the_guest_during_its_window(lab_name, clean_machine):
    # Probes read a guest's counters, qdiscs and MTUs through its agent's own process, and the
    # traffic's end is awaited by the agent on inotify: inside the window the guest forks nothing of
    # offlab's. Every request to the guest is recorded here with its type (Q: a command, F: in-process).
    import time

    from offlab import lab as labs
    from offlab.experiment import teardown
    from offlab.experiment.measure import measure
    from offlab.hosts import guest as guest_mod
    from offlab.traffic import Workload

    sent: list[tuple[float, float, str]] = []
    call = guest_mod._Channel.call

    def recording(self, cmd, stdin, timeout, *, ops=None):
        t0 = time.monotonic()
        try:
            return call(self, cmd, stdin, timeout, ops=ops)
        finally:
            sent.append((t0, time.monotonic(), "F" if ops is not None else "P" if cmd is None else "Q"))

    lab = labs.up("vm", lab_name)
    try:
        guest_mod._Channel.call = recording
        # what is checked is which requests reach the guest when, not the traffic's speed: a rate keeps
        # the TCG guest from saturating both host CPUs through the window and its margins
        sample = measure(lab, Workload(tool="iperf3", protocol="tcp", rate="50M", duration=2.0, warmup=1.0))
    finally:
        guest_mod._Channel.call = call
        teardown.down(lab.name)
    t0, t1 = sample.probes.t0_mono_s, sample.probes.t0_mono_s + sample.probes.window_s
    kinds = {k for _, _, k in sent}
    assert "Q" in kinds and "F" in kinds  # the client's start and end are commands; the reads are not
    during = [(a, b, k) for a, b, k in sent if k == "Q" and a < t1 and b > t0]
    assert during == [], f"commands in the guest during the window [{t0:.2f}, {t1:.2f}]: {during}"
    snapshots = [(a, b) for a, b, k in sent if k == "F" and t0 - 5 < a < t1 + 5]
    assert snapshots, "the guest's counters were not read around the window"
    assert sample.traffic.throughput_bps > 0 and "client" in sample.probes.reads
