"""`offlab lab up ovs-dpdk`: a real private OVS-DPDK (ovs-vswitchd-dpdk, --no-huge --legacy-mem) with
net_tap dpdk ports between two namespaces; what it refuses at MTU 9000; nothing left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import (
    kill_9_once_daemon_is_recorded, module_lab, netns_names, new_links_of_ours, offlab_cli, root_links,
    running,
)

VSWITCHD = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk"
HAVE_OVS_DPDK = os.access(VSWITCHD, os.X_OK)
needs_ovs_dpdk = pytest.mark.skipif(os.geteuid() != 0 or not HAVE_OVS_DPDK,
                                    reason="needs root and openvswitch-switch-dpdk")
# µs the labs' PMD threads may sleep per loop when idle (--pmd-sleep; OVS's largest)
PMD_SLEEP = 10000



# ---- refused before anything is built --------------------------------------------------------------

@pytest.mark.parametrize("pmd, driver, frame", [("tap", "net_tap", "1522"), ("af_packet", "net_af_packet", "1518")])
def test_mtu_9000_is_refused_naming_the_port_type_and_its_limit_and_leaves_nothing(state_dir, lab_name, pmd,
                                                                                   driver, frame):
    before = netns_names()
    res = offlab_cli("lab", "up", "ovs-dpdk", "--name", lab_name, "--pmd", pmd, "--mtu", "9000")
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{pmd} ports ({driver}" in err and f"≤ {frame} B" in err and "--mtu 1500" in err
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names() - before)


def test_no_ovs_vswitchd_dpdk_is_exit_3_with_the_install_command(state_dir, monkeypatch, lab_name):
    from offlab import lab
    from offlab.errors import ToolMissing
    from offlab.lab import ovs_dpdk

    monkeypatch.setattr(ovs_dpdk, "VSWITCHD", "/nonexistent/ovs-vswitchd-dpdk")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(ToolMissing) as err:
        lab.up("ovs-dpdk", lab_name)
    assert err.value.exit_code == 3 and "apt-get install openvswitch-switch-dpdk" in str(err.value)
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()


@needs_ovs_dpdk
def test_a_dpdk_runtime_dir_that_is_not_ours_is_refused_and_left_alone(state_dir, lab_name, clean_machine,
                                                                        monkeypatch):
    from offlab import lab
    from offlab.dpdk.testpmd import RUNTIME_ROOT
    from offlab.errors import EnvironmentProblem
    from offlab.lab import ovs_dpdk

    monkeypatch.setattr(ovs_dpdk.secrets, "token_hex", lambda n: "beef")
    foreign = RUNTIME_ROOT / f"offlab-{lab_name}-ovsbeef"
    foreign.mkdir(parents=True)
    (foreign / "config").write_text("someone else's\n")
    try:
        with pytest.raises(EnvironmentProblem) as err:
            lab.up("ovs-dpdk", lab_name)
        assert str(foreign) in str(err.value) and "not this lab's" in str(err.value)
        assert (foreign / "config").read_text() == "someone else's\n"
        assert not (state_dir / "labs" / f"{lab_name}.json").exists()
    finally:
        (foreign / "config").unlink()
        foreign.rmdir()


# ---- a real OVS-DPDK ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ovs_dpdk_lab(tmp_path_factory):
    """One tap-port ovs-dpdk lab for the module; checked gone afterwards (daemons, dirs, namespaces, links).
    Its PMD thread sleeps when idle (--pmd-sleep): no test here measures throughput, and a busy-polled
    CPU would be taken from the other tests' processes for the module's whole run."""
    if os.geteuid() != 0 or not HAVE_OVS_DPDK:
        pytest.skip("needs root and openvswitch-switch-dpdk")
    links_before = root_links()
    for lab in module_lab(tmp_path_factory, "ovs-dpdk", "od", "--pmd-sleep", str(PMD_SLEEP), timeout=180):
        yield lab
    name, shown = lab["name"], lab["shown"]
    for d in shown["daemons"]:
        assert not running(d["pid"]), f"{d['name']} left running"
    assert not os.path.exists(shown["ovs"]["vswitchd"]["runtime_dir"]), "DPDK runtime directory left behind"
    assert not os.path.exists(shown["ovs"]["rundir"]), "OVS run directory left behind"
    assert not any(n.startswith(f"ol-{name}-") for n in netns_names())
    # links of ours only: other sessions and pytest workers on this machine make their own meanwhile
    assert new_links_of_ours(links_before) == set()


def _vsctl(lab: dict, *args: str) -> str:
    from offlab import netdev
    from offlab.hosts import NetnsHost

    return netdev.vsctl(NetnsHost(f"ol-{lab['name']}-switch"), lab["shown"]["ovs"]["rundir"], *args).strip()


def test_lab_up_runs_a_private_ovs_dpdk_without_hugepages(ovs_dpdk_lab):
    shown = ovs_dpdk_lab["shown"]
    assert [d["name"] for d in shown["daemons"]] == ["ovsdb-server", "ovs-vswitchd-dpdk"]
    ovs = shown["ovs"]
    assert ovs["vswitchd"]["running"] and ovs["dpdk_version"].startswith("22.")
    assert ovs["rundir"].startswith(str(ovs_dpdk_lab["state"]))
    runtime = Path(ovs["vswitchd"]["runtime_dir"])
    assert (runtime / "offlab-owner").read_text().startswith(f"offlab {ovs_dpdk_lab['state']} ")
    cmdline = Path(f"/proc/{ovs['vswitchd']['pid']}/cmdline").read_text().split("\0")
    assert cmdline[0] == VSWITCHD and cmdline[1] == f"unix:{ovs['rundir']}/db.sock"
    extra = _vsctl(ovs_dpdk_lab, "get", "Open_vSwitch", ".", "other_config:dpdk-extra")
    assert "--no-huge" in extra and "--legacy-mem" in extra and f"--file-prefix={runtime.name}" in extra
    assert _vsctl(ovs_dpdk_lab, "get", "Open_vSwitch", ".", "dpdk_initialized") == "true"
    assert _vsctl(ovs_dpdk_lab, "get", "Open_vSwitch", ".", "other_config:pmd-maxsleep") == f'"{PMD_SLEEP}"'
    assert ovs["pmd_sleep_us"] == PMD_SLEEP
    log = (Path(ovs["rundir"]) / "ovs-vswitchd.log").read_text()
    assert f"PMD max sleep request is {PMD_SLEEP} usecs" in log and "PMD load based sleeps are enabled" in log
    assert _vsctl(ovs_dpdk_lab, "get", "Bridge", "br0", "datapath_type") == "netdev"
    assert [(p["name"], p["type"], p["driver_name"], p["mtu"], p["error"]) for p in ovs["ports"]] == [
        ("dpdk0", "dpdk", "net_tap", "1500", "[]"), ("dpdk1", "dpdk", "net_tap", "1500", "[]")]
    client, server = shown["hosts"]["client"], shown["hosts"]["server"]
    assert [(i["kind"], i["addresses"]) for i in client["interfaces"]] == [("tap", ["10.200.1.1/24"])]
    assert [(i["kind"], i["addresses"]) for i in server["interfaces"]] == [("tap", ["10.200.1.2/24"])]


def _port_packets(lab: dict, port: str, key: str) -> int:
    stats = _vsctl(lab, "get", "Interface", port, "statistics")
    return int(stats.split(f"{key}=", 1)[1].split(",", 1)[0].rstrip("}"))


def test_tcp_crosses_ovs_dpdk_and_its_dpdk_ports_count_it(ovs_dpdk_lab):
    rx0 = _port_packets(ovs_dpdk_lab, "dpdk0", "rx_packets")
    tx1 = _port_packets(ovs_dpdk_lab, "dpdk1", "tx_packets")
    res = offlab_cli("measure", ovs_dpdk_lab["name"], "--tool", "iperf3", "--proto", "tcp", "--duration", "2",
                     "--warmup", "0", "--json", env=ovs_dpdk_lab["env"], timeout=120)
    assert res.returncode == 0, res.stderr
    sample = json.loads(res.stdout)
    assert sample["traffic"]["throughput_bps"] > 0
    # the data went through OVS's DPDK ports: in at the client's, out at the server's (OVS writes the
    # counters to its database every 5 s: stats-update-interval)
    deadline = time.monotonic() + 15
    while (_port_packets(ovs_dpdk_lab, "dpdk0", "rx_packets") - rx0 <= 1000
           or _port_packets(ovs_dpdk_lab, "dpdk1", "tx_packets") - tx1 <= 1000):
        assert time.monotonic() < deadline, "OVS's dpdk ports did not count the test's packets"
        time.sleep(0.5)


def test_the_mtu_knob_refuses_a_tap_dpdk_port_in_one_line_naming_it_its_type_and_limit(ovs_dpdk_lab):
    """OVS would take mtu_request=9000 (rc 0) and then detach the port: `lab set` refuses it first, exit 2,
    and a run-time change a net_tap port cannot make at all; nothing is changed or journalled."""
    name, env = ovs_dpdk_lab["name"], ovs_dpdk_lab["env"]
    for value, says in (("9000", "takes frames ≤ 1522 B, i.e. MTU ≤ 1500"),
                        ("1400", "cannot change its MTU while the lab runs")):
        res = offlab_cli("lab", "set", name, "switch", "dpdk1", f"mtu={value}", env=env)
        err = res.stderr.strip()
        assert res.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"switch:dpdk1 mtu={value}: dpdk1 (OVS type dpdk, net_tap, DPDK 22." in err and says in err, err
    assert _vsctl(ovs_dpdk_lab, "get", "Interface", "dpdk1", "mtu_request") == "1500"
    assert _vsctl(ovs_dpdk_lab, "get", "Interface", "dpdk1", "mtu") == "1500"
    assert "nothing to restore" in offlab_cli("restore", "--list", env=env).stdout
    res = offlab_cli("lab", "set", name, "switch", "dpdk1", "mtu=1500", env=env)  # what it has: no change
    assert res.returncode == 0 and "switch:dpdk1 mtu: 1500 → 1500 (already so)" in res.stdout, res.stderr
    ping = offlab_cli("lab", "exec", name, "client", "--", "ping", "-c", "2", "-W", "2", "10.200.1.2", env=env)
    assert ping.returncode == 0, ping.stdout + ping.stderr


def test_a_tap_port_refuses_mtu_request_9000_until_it_is_cleared(ovs_dpdk_lab, monkeypatch):
    """What `lab up --mtu 9000` refuses up front, seen on the running switch (notes/dpdk.md §5)."""
    from offlab.lab import LabState, ovs_dpdk

    log = Path(ovs_dpdk_lab["shown"]["ovs"]["rundir"]) / "ovs-vswitchd.log"
    server_tap = ovs_dpdk_lab["shown"]["hosts"]["server"]["interfaces"][0]["name"]
    _vsctl(ovs_dpdk_lab, "set", "Interface", "dpdk1", "mtu_request=9000")  # rc 0: OVS refuses it later
    try:
        deadline = time.monotonic() + 20
        while "Interface dpdk1 MTU (9000) setup error" not in log.read_text():
            assert time.monotonic() < deadline, "OVS took mtu_request=9000 on a net_tap port"
            time.sleep(0.2)
        assert "Frame size (9018) > device max frame size (1522)" in log.read_text()
        # the port left the datapath: nothing crosses (the Interface row's `error` column is only
        # filled in at OVS's next reconfiguration, so it is not the witness here)
        deadline = time.monotonic() + 10
        while offlab_cli("lab", "exec", ovs_dpdk_lab["name"], "client", "--", "ping", "-c", "1", "-W", "1",
                         "10.200.1.2", env=ovs_dpdk_lab["env"]).returncode == 0:
            assert time.monotonic() < deadline, "traffic still crossed the port whose mtu_request was refused"
    finally:
        _vsctl(ovs_dpdk_lab, "clear", "Interface", "dpdk1", "mtu_request")
    deadline = time.monotonic() + 20
    while _vsctl(ovs_dpdk_lab, "get", "Interface", "dpdk1", "mtu") != "1500":
        assert time.monotonic() < deadline, "dpdk1 did not come back after mtu_request was cleared"
        time.sleep(0.2)
    assert _vsctl(ovs_dpdk_lab, "get", "Interface", "dpdk1", "error") == "[]"
    monkeypatch.setenv("OFFLAB_STATE_DIR", str(ovs_dpdk_lab["state"]))
    deadline = time.monotonic() + 10
    moved: list[str] = []
    while not moved and time.monotonic() < deadline:  # OVS makes the new tap a moment after the port
        moved = ovs_dpdk.rehome_taps(LabState.load(ovs_dpdk_lab["name"]))
        time.sleep(0.2)
    assert moved == [server_tap]
    ping = offlab_cli("lab", "exec", ovs_dpdk_lab["name"], "client", "--", "ping", "-c", "2", "-W", "2",
                      "10.200.1.2", env=ovs_dpdk_lab["env"])
    assert ping.returncode == 0, ping.stdout + ping.stderr


def test_vswitchd_dying_mid_measure_fails_naming_it_and_the_lab_shows_broken(ovs_dpdk_lab):
    """Last in the module: it breaks the lab (the fixture's `lab down` still removes everything)."""
    pid = ovs_dpdk_lab["shown"]["ovs"]["vswitchd"]["pid"]
    import subprocess
    import sys

    from tests.conftest import REPO

    proc = subprocess.Popen([sys.executable, "-m", "offlab", "measure", ovs_dpdk_lab["name"], "--tool", "iperf3",
                             "--proto", "tcp", "--duration", "8"], cwd=REPO,
                            env={**os.environ, **ovs_dpdk_lab["env"]}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert f"ovs-vswitchd-dpdk (pid {pid}) of lab {ovs_dpdk_lab['name']} died" in err and "Traceback" not in err
    assert "offlab lab down" in err
    from tests.sshd import processes_in

    for role in ("client", "server"):  # the sender and receiver were ended, by pid (a zombie is gone: PID 1 reaps late)
        left = processes_in(f"ol-{ovs_dpdk_lab['name']}-{role}")
        assert left == {}, f"processes left in {role} (pid: command line): {left}"
    listed = offlab_cli("lab", "list", "--json", env=ovs_dpdk_lab["env"])
    row = next(r for r in json.loads(listed.stdout) if r["name"] == ovs_dpdk_lab["name"])
    assert row["status"] == "broken" and "ovs-vswitchd-dpdk" in row["why"] and row["fix"].startswith("offlab lab down")


@needs_ovs_dpdk
def test_offlab_restore_after_kill_9_of_lab_up_stops_ovs_dpdk_and_removes_its_dirs(lab_name, clean_machine,
                                                                                      state_dir):
    daemon = kill_9_once_daemon_is_recorded("ovs-dpdk", lab_name, state_dir, "ovs-vswitchd-dpdk", timeout=60,
                                            daemon_name="ovs-vswitchd-dpdk")
    assert daemon["runtime_dir"] and os.path.isdir(daemon["runtime_dir"])
    lab_file = json.loads((state_dir / "labs" / f"{lab_name}.json").read_text())
    res = offlab_cli("restore")
    assert res.returncode == 0, res.stderr
    assert f"removed (lab {lab_name}, its `lab up` died)" in res.stdout and "ovs-vswitchd-dpdk" in res.stdout
    for d in lab_file["daemons"]:
        assert not running(d["pid"]), f"{d['name']} left running"
    assert not os.path.exists(daemon["runtime_dir"])
    assert not os.path.exists(lab_file["rundir"])
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())


@needs_ovs_dpdk
def test_an_af_packet_dpdk_port_changes_mtu_at_run_time_and_one_ovs_refuses_is_put_back_at_once(
        lab_name, clean_machine, state_dir, monkeypatch):
    """An af_packet port's veth end stays in OVS's namespace, so its MTU does change at run time (read back,
    then put back). A value OVS takes and then cannot configure (here 9000 with offlab's own limit check
    switched off) fails naming the port, its type and what OVS logged (exit 3), and the original is back."""
    from offlab import lab as labs
    from offlab.experiment import teardown
    from offlab import netdev
    from offlab.knobs import Change, Transaction, link, list_pending

    lab = labs.up("ovs-dpdk", lab_name, options={"pmd": "af_packet", "pmd_sleep": PMD_SLEEP})
    try:
        switch, client = lab.host("switch"), lab.host("client")

        def vs(col: str) -> str:
            return netdev.vsctl(switch, lab.rundir, "get", "Interface", "dpdk1", col).strip()

        def ping(size: int) -> bool:  # DF set: a packet bigger than a hop's MTU is lost, not fragmented
            return client.run(["ping", "-M", "do", "-s", str(size), "-c", "2", "-W", "2", "10.200.1.2"],
                              check=False, timeout=30).ok

        with Transaction(label="test af_packet mtu") as tx:
            out, = tx.apply([Change(switch, "mtu", 1400, "dpdk1", lab)])
            assert (out.where, out.original, out.actual, out.ok) == ("switch:dpdk1", "1500", "1400", True)
            assert (vs("mtu"), vs("mtu_request"), vs("error")) == ("1400", "1400", "[]")
            assert ping(1372) and not ping(1472)  # 1400-byte packets cross dpdk1, 1500-byte ones do not
        assert (vs("mtu"), vs("mtu_request")) == ("1500", "1500")
        monkeypatch.setattr(link, "max_mtu", lambda ovs_type, driver: None)
        with pytest.raises(link.OvsPortRefused) as err:
            with Transaction(label="test af_packet mtu 9000") as tx:
                tx.apply([Change(switch, "mtu", 9000, "dpdk1", lab)])
        msg = str(err.value)
        assert err.value.exit_code == 3 and "\n" not in msg
        assert "dpdk1 (OVS type dpdk, net_af_packet" in msg and "mtu_request=9000" in msg and "dpdk1" in msg, msg
        assert (vs("mtu"), vs("mtu_request"), vs("error")) == ("1500", "1500", "[]")
        assert list_pending() == []
        deadline = time.monotonic() + 10
        while not ping(1472):  # the port is back in the datapath
            assert time.monotonic() < deadline, "dpdk1 did not forward again after its mtu_request was put back"
    finally:
        teardown.down(lab.name)


@needs_ovs_dpdk
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
@pytest.mark.parametrize("cleanup", [("lab", "down"), ("restore",)], ids=["lab-down", "restore"])
def test_after_kill_9_of_lab_up_ovs_dpdk_vm_nothing_of_ovs_qemu_or_dpdk_is_left(cleanup, lab_name, clean_machine,
                                                                               state_dir):
    """kill -9 of `lab up ovs-dpdk-vm` once the first guest's QEMU is recorded (OVS-DPDK up, its
    vhost-user sockets made): `lab down` or `offlab restore` leave no daemon, socket or directory."""
    qemu = kill_9_once_daemon_is_recorded("ovs-dpdk-vm", lab_name, state_dir, "QEMU", timeout=300,
                                          daemon_name="qemu-system-x86_64")
    lab_file = json.loads((state_dir / "labs" / f"{lab_name}.json").read_text())
    names = [d["name"] for d in lab_file["daemons"]]
    assert names[:2] == ["ovsdb-server", "ovs-vswitchd-dpdk"] and "qemu-system-x86_64" in names
    vswitchd = lab_file["daemons"][1]
    rundir = Path(lab_file["rundir"])
    sockets = [rundir / "vhu-client"] + ([rundir / "vhu-server"] if (rundir / "vhu-server").exists() else [])
    assert running(qemu["pid"]) and running(vswitchd["pid"]) and os.path.isdir(vswitchd["runtime_dir"])
    assert all(sock.is_socket() for sock in sockets)
    res = offlab_cli(*cleanup, *((lab_name,) if cleanup[0] == "lab" else ()))
    assert res.returncode == 0, res.stderr
    assert "qemu-system-x86_64" in res.stdout and "ovs-vswitchd-dpdk" in res.stdout
    if cleanup == ("restore",):
        assert f"removed (lab {lab_name}, its `lab up` died)" in res.stdout
    for d in lab_file["daemons"]:
        assert not running(d["pid"]), f"{d['name']} (pid {d['pid']}) left running"
    assert not os.path.exists(vswitchd["runtime_dir"]), "DPDK runtime directory left behind"
    assert not any(sock.exists() for sock in sockets), "vhost-user socket left behind"
    assert not rundir.exists()
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()


# ---- vhost-user ports to TCG guests: jumbo frames (seed 004) ----------------------------------------

def test_ovs_dpdk_vm_refuses_an_mtu_above_the_vhost_user_limit_and_pmd(state_dir, lab_name):
    res = offlab_cli("lab", "up", "ovs-dpdk-vm", "--name", lab_name, "--mtu", "9800")
    assert res.returncode == 2 and "vhost-user ports take at most MTU 9710" in res.stderr
    res = offlab_cli("lab", "up", "ovs-dpdk-vm", "--name", lab_name, "--pmd", "tap")
    assert res.returncode == 2 and "--pmd" in res.stderr and "Traceback" not in res.stderr
    res = offlab_cli("lab", "up", "ovs-dpdk-vm", "--name", lab_name, "--pmd-sleep", "10001")
    assert res.returncode == 2 and res.stderr.strip() == (
        "offlab: error: --pmd-sleep 10001: give 0..10000 µs (OVS's pmd-maxsleep); 0 busy-polls"), res.stderr
    res = offlab_cli("lab", "up", "dpdk", "--name", lab_name, "--pmd-sleep", "100")
    assert res.returncode == 2 and "--pmd-sleep is an option of the ovs-dpdk and ovs-dpdk-vm" in res.stderr
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()


@pytest.fixture(scope="module")
def jumbo_lab(tmp_path_factory):
    """Two TCG guests on OVS-DPDK vhost-user ports at MTU 9000; checked gone afterwards."""
    if os.geteuid() != 0 or not HAVE_OVS_DPDK:
        pytest.skip("needs root and openvswitch-switch-dpdk")
    links_before = root_links()
    for lab in module_lab(tmp_path_factory, "ovs-dpdk-vm", "oj", "--mtu", "9000", "--pmd-sleep", str(PMD_SLEEP),
                          timeout=600):
        yield lab
    name, shown = lab["name"], lab["shown"]
    for d in shown["daemons"]:
        assert not running(d["pid"]), f"{d['name']} left running"
    assert not os.path.exists(shown["ovs"]["vswitchd"]["runtime_dir"])
    assert not os.path.exists(shown["ovs"]["rundir"])
    assert not any(n.startswith(f"ol-{name}-") for n in netns_names())
    # links of ours only: other sessions and pytest workers on this machine make their own meanwhile
    assert new_links_of_ours(links_before) == set()


def _exec(lab: dict, role: str, *argv: str, timeout: float = 60):
    """What `lab exec` runs, through the lab's host in this process (a guest's agent answers it; the
    capture below still runs `offlab lab exec` itself)."""
    import subprocess

    from offlab.lab import LabState

    with pytest.MonkeyPatch.context() as mp:
        for k, v in lab["env"].items():
            mp.setenv(k, v)
        res = LabState.load(lab["name"]).host(role).run(list(argv), timeout=timeout, check=False)
    return subprocess.CompletedProcess(list(argv), res.rc, res.stdout, res.stderr)


def test_ovs_dpdk_vm_gives_vhost_user_ports_and_guests_mtu_9000(jumbo_lab):
    shown = jumbo_lab["shown"]
    assert sorted(d["name"] for d in shown["daemons"]) == ["ovs-vswitchd-dpdk", "ovsdb-server",
                                                           "qemu-system-x86_64", "qemu-system-x86_64"]
    assert [(p["name"], p["type"], p["mtu"], p["error"]) for p in shown["ovs"]["ports"]] == [
        ("vhu-client", "dpdkvhostuser", "9000", "[]"), ("vhu-server", "dpdkvhostuser", "9000", "[]")]
    for role in ("client", "server"):
        host = shown["hosts"][role]
        assert host["guest"]["accel"] in ("tcg", "kvm") and host["guest"]["nics"][0]["vhost_user"].endswith(
            f"vhu-{role}")
        assert [(i["name"], i["mtu"]) for i in host["interfaces"]] == [("eth0", 9000)]


def _capture_while_pinging(lab: dict, size: int) -> str:
    """tcpdump in the server guest while the client pings it with `size`-byte payloads."""
    import subprocess
    import sys

    from tests.conftest import REPO

    cap = subprocess.Popen([sys.executable, "-m", "offlab", "lab", "exec", lab["name"], "server", "--", "timeout", "40",
                            "tcpdump", "-c", "2", "-nn", "-e", "-i", "eth0", "icmp"], cwd=REPO,
                           env={**os.environ, **lab["env"]}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + 40
        while cap.poll() is None and time.monotonic() < deadline:
            ping = _exec(lab, "client", "ping", "-s", str(size), "-c", "1", "-W", "3", "10.200.1.2")
            assert ping.returncode == 0, ping.stdout + ping.stderr
        out, _ = cap.communicate(timeout=60)
    finally:
        if cap.poll() is None:
            cap.kill()
            cap.wait()
    return out


def test_9018_byte_frames_cross_and_a_capture_in_the_server_guest_sees_them(jumbo_lab):
    out = _capture_while_pinging(jumbo_lab, 8972)
    # 8972 B of ICMP payload + 8 ICMP + 20 IP = a 9000-byte IP packet in a 9014-byte frame
    # (tcpdump counts no FCS: 9018 B on a wire), unfragmented
    lines = [l for l in out.splitlines() if "ICMP echo" in l]
    assert lines and all("length 9014:" in l for l in lines), out


def _mtu_drops(lab: dict, port: str) -> int:
    stats = _vsctl(lab, "get", "Interface", port, "statistics")
    return int(stats.split("ovs_tx_mtu_exceeded_drops=", 1)[1].split(",", 1)[0].rstrip("}"))


# The jumbo path, port by port: each guest's eth0 and the vhost-user port OVS serves it
_PATH = (("switch", "vhu-client"), ("client", "eth0"), ("switch", "vhu-server"), ("server", "eth0"))


def _mtus(lab: dict) -> dict[str, str]:
    """The MTU of every hop as `lab show` reads it: OVS's `mtu` of the ports, the guests' eth0."""
    shown = json.loads(offlab_cli("lab", "show", lab["name"], "--json", env=lab["env"]).stdout)
    out = {f"switch:{p['name']}": p["mtu"] for p in shown["ovs"]["ports"]}
    out.update({f"{role}:eth0": str(shown["hosts"][role]["interfaces"][0]["mtu"]) for role in ("client", "server")})
    return out


def _frame_lengths(lab: dict, size: int) -> list[int]:
    """Lengths of the ICMP frames the server guest captures while the client pings it with `size` B."""
    return [int(n) for n in re.findall(r"length (\d+):", _capture_while_pinging(lab, size))]


@pytest.mark.timeout(900)  # a hang guard only: four settings rounds and three captures in TCG guests
def test_the_mtu_knob_takes_vhost_user_ports_and_guests_to_9000_and_puts_back_1500(jumbo_lab, monkeypatch):
    """Seed 004's jumbo path made with knobs. From 1500 (set with `lab set`, journalled), a transaction
    raises both vhost-user ports' mtu_request and both guests' eth0 to 9000, read back from OVS and the
    guests, and the server guest captures 9014-byte frames; on exit 1500 is back (fragments ≤ 1514 B);
    `offlab restore` then puts back the lab's own 9000."""
    from offlab.knobs import Change, Transaction
    from offlab.lab import LabState

    name, env = jumbo_lab["name"], jumbo_lab["env"]
    try:
        for role, iface in _PATH:
            res = offlab_cli("lab", "set", name, role, iface, "mtu=1500", env=env)
            assert res.returncode == 0 and f"{role}:{iface} mtu: 9000 → 1500" in res.stdout, res.stdout + res.stderr
        assert set(_mtus(jumbo_lab).values()) == {"1500"}
        lengths = _frame_lengths(jumbo_lab, 8972)
        assert lengths and max(lengths) <= 1514, lengths  # the guest fragments: nothing bigger crosses
        monkeypatch.setenv("OFFLAB_STATE_DIR", str(jumbo_lab["state"]))
        lab = LabState.load(name)
        with Transaction(label="test jumbo by knobs") as tx:
            outcomes = tx.apply([Change(lab.host(role), "mtu", 9000, iface, lab) for role, iface in _PATH])
            assert [(o.where, o.original, o.actual, o.ok, o.journalled) for o in outcomes] == [
                (f"{role}:{iface}", "1500", "9000", True, True) for role, iface in _PATH]
            assert set(_mtus(jumbo_lab).values()) == {"9000"}
            lengths = _frame_lengths(jumbo_lab, 8972)
            assert lengths and set(lengths) == {9014}, lengths  # 9000-byte IP packets, whole
        assert set(_mtus(jumbo_lab).values()) == {"1500"}
        lengths = _frame_lengths(jumbo_lab, 8972)
        assert lengths and max(lengths) <= 1514, lengths
    finally:
        res = offlab_cli("restore", env=env)
        assert res.returncode == 0, res.stderr
    assert set(_mtus(jumbo_lab).values()) == {"9000"}
    assert _exec(jumbo_lab, "client", "ping", "-s", "8972", "-c", "2", "-W", "3", "10.200.1.2").returncode == 0


_HOLD_MTU_6000 = """
import sys, time
from offlab import lab as labs
from offlab.experiment import teardown
from offlab.knobs import Change, Transaction
lab = labs.LabState.load(sys.argv[1])
tx = Transaction(label="test holds mtu 6000 on vhu-server")
tx.__enter__()
out, = tx.apply([Change(lab.host("switch"), "mtu", 6000, "vhu-server", lab)])
print(out.actual, flush=True)
time.sleep(600)
"""


def test_a_run_time_mtu_change_on_a_vhost_user_port_drops_bigger_frames_and_survives_kill_9(jumbo_lab):
    """Seed 004's test 2 through the knob: mtu 6000 on one vhost-user port at run time, read back from
    OVS; 9000-byte packets stop there (OVS counts them), 6000-byte ones cross. The process holding the
    change is killed with -9; `offlab restore` puts back exactly the journalled 9000."""
    import subprocess
    import sys

    from tests.conftest import REPO

    drops = _mtu_drops(jumbo_lab, "vhu-server")
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_MTU_6000, jumbo_lab["name"]], cwd=REPO,
                            env={**os.environ, **jumbo_lab["env"]}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "6000"  # read back once OVS had configured the port
        assert _vsctl(jumbo_lab, "get", "Interface", "vhu-server", "mtu") == "6000"
        assert _exec(jumbo_lab, "client", "ping", "-s", "8972", "-c", "2", "-W", "3", "10.200.1.2").returncode != 0
        assert _exec(jumbo_lab, "client", "ping", "-s", "5972", "-c", "2", "-W", "3", "10.200.1.2").returncode == 0
        # OVS writes statistics to its database every 5 s; a hang guard only (a loaded machine once took
        # longer than 15 s), the loop ends as soon as the drops are counted
        deadline = time.monotonic() + 90
        while _mtu_drops(jumbo_lab, "vhu-server") <= drops:
            assert time.monotonic() < deadline, "OVS counted no ovs_tx_mtu_exceeded_drops on vhu-server"
            time.sleep(0.5)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    res = offlab_cli("restore", env=jumbo_lab["env"])
    assert res.returncode == 0 and "switch:vhu-server mtu = 9000" in res.stdout, res.stdout + res.stderr
    assert _vsctl(jumbo_lab, "get", "Interface", "vhu-server", "mtu") == "9000"
    assert _vsctl(jumbo_lab, "get", "Interface", "vhu-server", "mtu_request") == "9000"
    assert _exec(jumbo_lab, "client", "ping", "-s", "8972", "-c", "2", "-W", "3", "10.200.1.2").returncode == 0


def test_the_mtu_knob_refuses_above_the_vhost_user_limit_naming_the_port_and_its_type(jumbo_lab):
    res = offlab_cli("lab", "set", jumbo_lab["name"], "switch", "to-server", "mtu=9800", env=jumbo_lab["env"])
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "vhu-server (OVS type dpdkvhostuser) takes frames ≤ 9728 B, i.e. MTU ≤ 9710" in err, err
    assert _vsctl(jumbo_lab, "get", "Interface", "vhu-server", "mtu_request") == "9000"


def test_a_plan_names_the_ovs_dpdk_labs_and_their_hosts_interfaces():
    from offlab.errors import BadInput
    from offlab.experiment.plan import load_plan

    plan = """
name: t
topology: {kind: KIND, mtu: MTU}
workload: {tool: iperf3, protocol: tcp, duration: 2}
axes:
  gro:
    "on": {features: {server: {gro: on}}}
    "off": {features: {server: {gro: off}}}
"""
    for kind, mtu in (("ovs-dpdk", 1500), ("ovs-dpdk-vm", 9000)):
        cells = load_plan(plan.replace("KIND", kind).replace("MTU", str(mtu)), "t.yaml").cells
        assert [c.key for c in cells] == ["gro=on", "gro=off"] and cells[0].topology.kind == kind
    with pytest.raises(BadInput) as err:
        load_plan(plan.replace("KIND", "ovs-dpdk").replace("MTU", "1500").replace("server: {gro", "router: {gro"),
                  "t.yaml")
    assert "router" in str(err.value)


def test_a_plan_on_ovs_dpdk_vm_sets_the_mtu_of_its_vhost_user_ports_and_guests():
    """Jumbo cells on a lab built at 1500: the ports by name or as to-<guest>, the guests' only NIC;
    an OVS-DPDK port has no kernel interface, so any other setting of it is refused at load time."""
    from offlab.errors import BadInput
    from offlab.experiment.plan import load_plan

    plan = """
name: t
topology: {kind: ovs-dpdk-vm, mtu: 1500}
workload: {tool: iperf3, protocol: tcp, duration: 2}
axes:
  mtu:
    "1500": {}
    "9000": {settings: {"switch:to-client": {mtu: 9000}, "switch:vhu-server": {mtu: 9000},
                        client: {mtu: 9000}, server: {mtu: 9000}}}
"""
    cells = {c.key: c for c in load_plan(plan, "t.yaml").cells}
    assert cells["mtu=1500"].changes == ()
    assert cells["mtu=9000"].changes == (("switch:to-client", "mtu", 9000), ("switch:vhu-server", "mtu", 9000),
                                         ("client", "mtu", 9000), ("server", "mtu", 9000))
    with pytest.raises(BadInput) as err:
        load_plan(plan.replace("client: {mtu: 9000}", '"switch:vhu-client": {gro: off}'), "t.yaml")
    assert "switch:vhu-client is an OVS-DPDK port" in str(err.value) and "its one setting is mtu" in str(err.value)


def test_measure_refuses_a_capture_inside_a_guest_in_one_line(jumbo_lab):
    res = offlab_cli("measure", jumbo_lab["name"], "--tool", "iperf3", "--duration", "1", "--capture", "server",
                     env=jumbo_lab["env"])
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "server is a QEMU guest" in res.stderr and f"offlab lab exec {jumbo_lab['name']} server -- tcpdump" in res.stderr
