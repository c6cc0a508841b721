"""`offlab lab up dpdk-vm`: a real dpdk-testpmd between the client's tap (port 0) and a real TCG guest
on a vhost-user port (port 1, testpmd the vhost-user server, QEMU with shared memfd RAM).

Direction only: DPDK GRO must leave fewer packets out of the vhost port than went in, GRO off one
per packet in; no figure is checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import (
    kill_9_once_daemon_is_recorded, module_lab, netns_names, offlab_cli, root_links, running,
)

HAVE_TESTPMD = shutil.which("dpdk-testpmd") is not None
HAVE_QEMU = shutil.which("qemu-system-x86_64") is not None
needs_dpdk_vm = pytest.mark.skipif(os.geteuid() != 0 or not HAVE_TESTPMD or not HAVE_QEMU,
                                   reason="needs root, dpdk-testpmd and QEMU (scripts/install-deps)")



def _gone(name: str, shown_or_daemons) -> None:
    """Nothing of the lab is left: its daemons, runtime dir, vhost socket, namespaces."""
    for d in shown_or_daemons["daemons"]:
        assert not running(d["pid"]), f"{d['name']} (pid {d['pid']}) left running"
    assert not any(n.startswith(f"ol-{name}-") for n in netns_names()), "namespaces left behind"


@needs_dpdk_vm
def test_bad_dpdk_vm_options_are_exit_2_before_anything_is_built(state_dir, lab_name):
    for args, fragment in ((("--mtu", "9000"), "1522"), (("--pmd", "tap"), "--pmd is an option of the dpdk and ovs-dpdk topologies"),
                           (("--nic", "host_warp=on"), "host_warp")):
        res = offlab_cli("lab", "up", "dpdk-vm", "--name", lab_name, *args)
        assert res.returncode == 2 and fragment in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()


@needs_dpdk_vm
@pytest.mark.parametrize("cleanup", [("lab", "down"), ("restore",)], ids=["lab-down", "restore"])
def test_after_kill_9_of_lab_up_qemu_testpmd_and_the_vhost_socket_are_removed(
        cleanup, lab_name, clean_machine, state_dir):
    qemu = kill_9_once_daemon_is_recorded("dpdk-vm", lab_name, state_dir, "QEMU", timeout=240, nth=1)
    lab_file = json.loads((state_dir / "labs" / f"{lab_name}.json").read_text())
    testpmd = lab_file["daemons"][0]
    assert qemu["name"] == "qemu-system-x86_64" and testpmd["name"] == "dpdk-testpmd"
    assert running(qemu["pid"]) and running(testpmd["pid"]) and os.path.isdir(testpmd["runtime_dir"])
    rundir = Path(lab_file["rundir"])
    res = offlab_cli(*cleanup, *((lab_name,) if cleanup[0] == "lab" else ()))
    assert res.returncode == 0, res.stderr
    assert "qemu-system-x86_64" in res.stdout and "DPDK runtime directory" in res.stdout
    if cleanup == ("restore",):
        assert f"removed (lab {lab_name}, its `lab up` died)" in res.stdout
    _gone(lab_name, lab_file)
    assert not os.path.exists(testpmd["runtime_dir"]) and not (rundir / "vhost0.sock").exists()
    assert not rundir.exists()


@pytest.fixture(scope="module")
def vm_lab(tmp_path_factory):
    """One dpdk-vm lab for the module (testpmd + a TCG guest take ~30-70 s); checked gone afterwards."""
    if os.geteuid() != 0 or not HAVE_TESTPMD or not HAVE_QEMU:
        pytest.skip("needs root, dpdk-testpmd and QEMU")
    links_before = root_links()
    for lab in module_lab(tmp_path_factory, "dpdk-vm", "dv", "--nic", "host_tso4=on", "--nic", "guest_tso4=on",
                          "--testpmd-idle", "stop", timeout=300):
        yield lab
    name, shown, down = lab["name"], lab["shown"], lab["down"]
    assert "qemu-system-x86_64" in down.stdout and "dpdk-testpmd" in down.stdout
    _gone(name, shown)
    tp = shown["testpmd"]
    assert not os.path.exists(tp["runtime_dir"]), "DPDK runtime directory left behind"
    assert not os.path.exists(shown["hosts"]["server"]["guest"]["vhost_user"]), "vhost-user socket left behind"
    assert not os.path.exists(tp["rundir"])
    # the machine is shared: only this lab's links (ol<lab><n>) count
    assert {l for l in root_links() - links_before if l.startswith(f"ol{name}")} == set()


def _lab(lab: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return offlab_cli(*args, env=lab["env"], timeout=timeout)


@needs_dpdk_vm
def test_lab_up_dpdk_vm_puts_a_guest_on_testpmds_vhost_user_port(vm_lab):
    shown = vm_lab["shown"]
    tp = shown["testpmd"]
    assert tp["running"] and [p["pmd"] for p in tp["ports"]] == ["tap", "vhost"]
    assert "net_vhost1,iface=" in tp["ports"][1]["vdev"] and ",tso=1" in tp["ports"][1]["vdev"]
    assert [d["name"] for d in shown["daemons"]] == ["dpdk-testpmd", "qemu-system-x86_64"]
    guest = shown["hosts"]["server"]["guest"]
    assert guest["accel"] in ("tcg", "kvm") and os.path.exists(guest["vhost_user"])
    assert guest["nics"][0]["properties"] == {"host_tso4": "on", "guest_tso4": "on"}
    client = shown["hosts"]["client"]
    assert [(i["kind"], i["addresses"]) for i in client["interfaces"]] == [("tap", ["10.200.1.1/24"])]
    assert shown["hosts"]["server"]["address"] == "10.200.1.2"
    # the chain: DPDK's vhost port offers TSO but no USO, whatever QEMU's host_uso says
    explained = json.loads(_lab(vm_lab, "lab", "explain", vm_lab["name"], "server", "--json").stdout)
    rows = {r["prop"]: r for r in explained["nics"][0]["rows"]}
    assert (rows["host_tso4"]["source"], rows["host_tso4"]["offered"], rows["host_tso4"]["accepted"]) == ("set", True, True)
    assert (rows["host_uso"]["value"], rows["host_uso"]["offered"]) == ("on", False)
    assert "the vhost-user backend does not offer it" in rows["host_uso"]["why"]
    # testpmd maps the guest's RAM: QEMU must run with shared memfd memory
    argv = Path(f"/proc/{shown['daemons'][1]['pid']}/cmdline").read_bytes().split(b"\0")
    assert b"memory-backend-memfd,id=mem,size=512M,share=on" in argv
    # what plans are checked against before any lab exists is what was built
    built = {role: sorted((i["kind"], None if i["name"].startswith("ol") else i["name"]) for i in h["interfaces"])
             for role, h in shown["hosts"].items()}
    from offlab.experiment.plan import topology as static

    assert built == {role: sorted((i.kind, i.name) for i in ifaces)
                     for role, ifaces in static.HOSTS["dpdk-vm"].items()}
    # the vhost-user link is up once the guest's virtio-net driver is bound
    res = _lab(vm_lab, "lab", "exec", vm_lab["name"], "client", "--", "ping", "-c", "2", "-W", "3", "10.200.1.2")
    assert res.returncode == 0, res.stdout + res.stderr


def _measure(lab: dict, tries: int = 3) -> dict:
    """A TCP sample with enough packets to count: on this shared 2-CPU machine a TCG guest's TCP
    sometimes stalls in retransmission timeouts for a whole window; such a window is measured again.
    No warm-up: the checks read packet counts, and a warm-up was a second more of the guest's and testpmd's
    CPU with nothing counted."""
    for _ in range(tries):
        res = _lab(lab, "measure", lab["name"], "--tool", "iperf3", "--proto", "tcp", "--duration", "3",
                   "--warmup", "0", "--json", timeout=180)
        assert res.returncode == 0, res.stderr
        sample = json.loads(res.stdout)
        if sample["probes"]["testpmd"]["ports"]["0"]["rx_packets"] > 500:
            break
    return sample


@needs_dpdk_vm
def test_tcp_reaches_the_guest_and_dpdk_gro_merges_into_the_vhost_port(vm_lab):
    """Client → guest TCP through testpmd. GRO off: one packet out of the vhost port per packet in;
    DPDK GRO on: clearly fewer (the notes: ~12 tap segments per guest frame), and the guest's NIC
    receives frames bigger than the MTU (merged, accepted whole)."""
    base = ("testpmd.fwd=csum", "testpmd.csum.tcp=hw")  # hw: the vhost port marks merged frames NEEDS_CSUM
    samples = {}
    try:
        res = _lab(vm_lab, "lab", "set", vm_lab["name"], "server", "eth0", "gro=off")
        assert res.returncode == 0, res.stderr
        for gro in ("off", "on"):
            res = _lab(vm_lab, "lab", "set", vm_lab["name"], "switch", "-", *base, f"testpmd.gro={gro}")
            assert res.returncode == 0, res.stderr
            samples[gro] = _measure(vm_lab)
    finally:
        res = _lab(vm_lab, "restore")
        assert res.returncode == 0, res.stderr
    for gro, s in samples.items():
        assert s["traffic"]["throughput_bps"] > 0, gro
        tp = s["probes"]["testpmd"]
        assert tp["data_direction"] == "0>1" and tp["ports"]["0"]["rx_packets"] > 500, (gro, tp)
    off, on = samples["off"]["probes"], samples["on"]["probes"]
    # without GRO every packet in leaves once, or is dropped at the vhost port when the guest's rx ring is full
    tp = off["testpmd"]
    sent = tp["ports"]["1"]["tx_packets"] + tp["ports"]["1"].get("fwd_tx_dropped", 0) + tp["ports"]["1"]["tx_errors"]
    assert 0.95 <= sent / tp["ports"]["0"]["rx_packets"] <= 1.05, tp
    assert on["testpmd"]["out_per_in"] < 0.5, on["testpmd"]
    assert on["interfaces"]["server:eth0"]["rx_avg_bytes"] > 1514 >= off["interfaces"]["server:eth0"]["rx_avg_bytes"]
    assert on["snmp"]["server"]["Tcp"]["InCsumErrors"] == 0  # hw csum on the vhost port: no stale checksums
    # the sample's own effect witness says the same: GRO on was exercised (no witness for GRO off)
    [gro_on] = [e for e in samples["on"]["effects"] if e["setting"] == "testpmd.gro"]
    assert gro_on["status"] == "exercised", gro_on
    assert not [e for e in samples["off"]["effects"] if e["setting"] == "testpmd.gro"]
    assert "TCG" in " ".join(samples["on"].get("notes", [])) or samples["on"]["guests"]["server"]["accel"] == "kvm"


@needs_dpdk_vm
def test_a_setting_one_port_lacks_is_refused_for_all_ports_and_set_on_the_port_that_has_it(vm_lab):
    """net_vhost 22.11 has no IPV4_CKSUM (nor TCP_TSO); the tap port has both: `PORT:VALUE` sets one port."""
    res = _lab(vm_lab, "lab", "set", vm_lab["name"], "switch", "-", "testpmd.csum.ip=hw")
    assert res.returncode == 2 and "port 1 (vhost PMD) has no IPV4_CKSUM" in res.stderr, res.stderr
    res = _lab(vm_lab, "lab", "set", vm_lab["name"], "switch", "-", "testpmd.tso_segsz=1434")
    assert res.returncode == 2 and "port 1 (vhost PMD) has no TCP_TSO" in res.stderr, res.stderr
    res = _lab(vm_lab, "lab", "set", vm_lab["name"], "switch", "-", "testpmd.tso_segsz=7:1400")
    assert res.returncode == 2 and "not 7" in res.stderr, res.stderr
    try:
        res = _lab(vm_lab, "lab", "set", vm_lab["name"], "switch", "-", "testpmd.csum.ip=0:hw",
                   "testpmd.tso_segsz=0:1434", "testpmd.gso=0:on")
        assert res.returncode == 0, res.stderr
        assert "testpmd.csum.ip: sw → 0:hw 1:sw" in res.stdout and "testpmd.gso: off → 0:on 1:off" in res.stdout
        shown = json.loads(_lab(vm_lab, "lab", "show", vm_lab["name"], "--json").stdout)["testpmd"]["settings"]["ports"]
        assert (shown["0"]["csum"]["ip"], shown["0"]["tso_segsz"], shown["0"]["gso"]["on"]) == ("hw", 1434, True)
        assert (shown["1"]["csum"]["ip"], shown["1"]["tso_segsz"], shown["1"]["gso"]["on"]) == ("sw", 0, False)
    finally:
        res = _lab(vm_lab, "restore")
        assert res.returncode == 0, res.stderr
    shown = json.loads(_lab(vm_lab, "lab", "show", vm_lab["name"], "--json").stdout)["testpmd"]["settings"]["ports"]
    assert (shown["0"]["csum"]["ip"], shown["0"]["tso_segsz"], shown["0"]["gso"]["on"]) == ("sw", 0, False)


def test_a_plan_sets_testpmd_and_guest_settings_of_a_dpdk_vm_lab():
    from offlab.experiment.plan import load_plan

    plan = load_plan("""
name: t
topology: {kind: dpdk-vm, nic: {host_tso4: on}}
workload: {tool: iperf3, protocol: tcp, duration: 1}
axes:
  gro:
    dpdk: {testpmd: {fwd: csum, gro: on, csum: {tcp: hw}}, features: {server: {gro: off}}}
    kernel: {testpmd: {fwd: csum, gro: off}, features: {server: {gro: on}}}
""", "t.yaml")
    cells = {c.key: c for c in plan.cells}
    assert ("switch", "testpmd.gro", "on") in cells["gro=dpdk"].changes
    assert {c.topology.kind for c in plan.cells} == {"dpdk-vm"}
