"""Labs in real namespaces: every topology reaches, MTU holds end to end, nothing is left."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import BadInput, ToolMissing
from tests.conftest import netns_names, offlab_cli, requires_root
from tests.helpers import run as offlab_in_process

pytestmark = [requires_root, pytest.mark.network]

TOPOLOGIES = ["veth", "bridge", "router", "vxlan", "ovs"]


def ping(lab, size: int | None = None) -> bool:
    argv = ["ping", "-c", "1", "-W", "1", "-q"]
    if size is not None:
        argv += ["-M", "do", "-s", str(size)]
    server = lab.entry("server").address
    return lab.client.run([*argv, server], check=False, timeout=10).ok


def tcp_connects(lab) -> bool:
    """A TCP connection and 1 MB through the path, with iperf3 itself."""
    server = lab.server.spawn(["iperf3", "-s", "-1", "-p", "5299"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if lab.server.run(["ss", "-Hltn", "sport = :5299"], check=False).stdout.strip():
                break
            time.sleep(0.05)
        res = lab.client.run(["iperf3", "-c", lab.entry("server").address, "-p", "5299", "-n", "1M", "-J"],
                             check=False, timeout=20)
        return res.ok and json.loads(res.stdout)["end"]["sum_received"]["bytes"] > 0
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("mtu", [1500, 9000])
def test_client_reaches_server_and_mtu_holds_end_to_end(topology, mtu, lab_name, clean_machine):
    lab = labs.up(topology, lab_name, mtu=mtu)
    try:
        assert ping(lab)
        assert tcp_connects(lab)
        # 8972 bytes of ICMP payload + 28 of headers = 9000: fits at 9000, not at 1500.
        assert ping(lab, 8972) is (mtu == 9000)
        assert ping(lab, mtu - 28) and not ping(lab, mtu - 27)
    finally:
        teardown.down(lab_name)


def test_vxlan_underlay_carries_50_bytes_more_and_options_apply(lab_name, clean_machine):
    lab = labs.up("vxlan", lab_name, mtu=1400, options={"vni": 77, "port": 8472})
    try:
        u0 = json.loads(lab.host("hv1").run(["ip", "-d", "-j", "link", "show", "vxlan0"]).stdout)[0]
        assert u0["linkinfo"]["info_data"]["id"] == 77
        assert u0["linkinfo"]["info_data"]["port"] == 8472
        under = json.loads(lab.host("hv1").run(["ip", "-j", "link", "show", "u0"]).stdout)[0]
        assert under["mtu"] == 1450
        assert ping(lab, 1372) and not ping(lab, 1373)
    finally:
        teardown.down(lab_name)


def test_ipv6_lab_reaches_over_fd00_200(lab_name, clean_machine):
    lab = labs.up("router", lab_name, ipv6=True)
    try:
        addr6 = lab.entry("server").address6
        assert addr6.startswith("fd00:200:")
        assert lab.client.run(["ping", "-6", "-c", "1", "-W", "2", addr6], check=False, timeout=10).ok
    finally:
        teardown.down(lab_name)


def test_ovs_runs_private_daemons_and_records_the_checksum_adjustment(lab_name, clean_machine, state_dir):
    lab = labs.up("ovs", lab_name)
    try:
        names = sorted(d.name for d in lab.daemons)
        assert names == ["ovs-vswitchd", "ovsdb-server"]
        for d in lab.daemons:
            assert open(f"/proc/{d.pid}/comm").read().strip() == d.name
        assert str(state_dir) in lab.rundir
        assert {(a.host, a.setting) for a in lab.adjustments} == {("client", "tx-checksumming"),
                                                                  ("server", "tx-checksumming")}
    finally:
        pids = [d.pid for d in lab.daemons]
        teardown.down(lab_name)
    from offlab.lab.ovs import alive

    assert not any(alive(p) for p in pids)  # gone, or exited and waiting for PID 1 to reap it


def test_two_labs_coexist_and_a_duplicate_name_is_refused(lab_name, clean_machine):
    other = lab_name[:-1] + "x"
    labs.up("veth", lab_name)
    try:
        labs.up("bridge", other)
        with pytest.raises(BadInput, match="already exists"):
            labs.up("veth", lab_name)
        assert {f"ol-{lab_name}-client", f"ol-{other}-client"} <= netns_names()
        assert {l.name for l in labs.list_labs()} >= {lab_name, other}
    finally:
        teardown.down(lab_name)
        teardown.down(other)


def test_down_is_idempotent(lab_name, clean_machine):
    labs.up("bridge", lab_name)
    assert teardown.down(lab_name)
    assert teardown.down(lab_name) == []


def test_failed_up_cleans_up_and_names_the_step(lab_name, clean_machine, monkeypatch):
    from offlab.lab import topologies

    def broken_bridge(b, mtu):
        b.host("client"), b.host("switch")
        b.wire("client", "switch", mtu=mtu)
        with b.step("add a port that does not exist"):
            b.ip("switch", "link", "set", "nosuchport", "master", "br0")

    monkeypatch.setattr(topologies, "bridge", broken_bridge)  # the bridge record names this function
    with pytest.raises(labs.LabBuildFailed, match="step 'add a port that does not exist'"):
        labs.up("bridge", lab_name)
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())
    assert labs.list_labs() == []


def test_down_after_kill_9_during_up_removes_what_was_built(lab_name, clean_machine, state_dir):
    """The state file is written before each namespace exists, so -9 mid-build is recoverable."""
    import os
    import signal
    import sys

    code = (
        "import time\nfrom offlab.lab import topologies, up\n"
        "def slow(b, mtu):\n    b.host('client'); b.host('switch'); print('built', flush=True); time.sleep(60)\n"
        "topologies.bridge = slow\n"
        f"up('bridge', '{lab_name}')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    assert proc.stdout.readline().strip() == "built"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert f"ol-{lab_name}-switch" in netns_names()
    res = offlab_cli("lab", "down", lab_name, env={"OFFLAB_STATE_DIR": str(state_dir)})
    assert res.returncode == 0, res.stderr
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["lab", "up", "mesh"], 2, "unknown topology 'mesh'"),
        (["lab", "up", "veth", "--mtu", "67"], 2, "out of range"),
        (["lab", "up", "veth", "--mtu", "70000"], 2, "out of range"),
        (["lab", "up", "vxlan", "--mtu", "65500"], 2, "too large for vxlan"),
        (["lab", "up", "veth", "--name", "Bad_Name"], 2, "invalid lab name"),
        (["lab", "up", "veth", "--name", "$(reboot)"], 2, "invalid lab name"),
        (["lab", "show", "nosuchlab"], 2, "no lab named 'nosuchlab'"),
        (["lab", "exec", "nosuchlab", "client", "--", "true"], 2, "no lab named"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(args, code, needle, state_dir):
    res = offlab_in_process(*args)
    assert res.returncode == code, res.stderr
    assert needle in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_not_root_and_missing_tool_exit_3(state_dir, tmp_path):
    from offlab import hosts

    with pytest.raises(ToolMissing) as err:
        hosts.require_tool("definitely-not-a-tool")
    assert err.value.exit_code == 3
    res = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *offlab_cli_argv(),
         "lab", "up", "veth", "--name", "nr"],
        capture_output=True, text=True, env={"OFFLAB_STATE_DIR": str(tmp_path / "nr"), "PATH": "/usr/bin:/bin"},
        cwd="/",
    )
    assert res.returncode == 3, res.stderr
    assert "needs root" in res.stderr


def offlab_cli_argv() -> list[str]:
    import sys
    from tests.conftest import REPO

    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {REPO!r}); from offlab.cli import main; main()"]


def test_lab_show_json_contract(lab_name, clean_machine, state_dir):
    labs.up("bridge", lab_name)
    try:
        res = offlab_in_process("lab", "show", lab_name, "--json")
        info = json.loads(res.stdout)
        assert info["topology"] == "bridge" and info["mtu"] == 1500
        client = info["hosts"]["client"]
        assert client["netns"] == f"ol-{lab_name}-client" and client["address"] == "10.200.1.1"
        iface = client["interfaces"][0]
        assert iface["mtu"] == 1500 and iface["addresses"] == ["10.200.1.1/24"]
        assert iface["features"]["tx-udp-segmentation"] is True
        assert set(info["hosts"]) == {"client", "switch", "server"}
        res = offlab_cli("lab", "exec", lab_name, "server", "--", "ip", "-br", "addr")
        assert res.returncode == 0 and "10.200.1.2/24" in res.stdout
    finally:
        teardown.down(lab_name)


def test_offlab_restore_leaves_a_lab_that_is_up_to_lab_down(veth_lab, state_dir):
    # restore puts settings back and removes labs whose `lab up` died; a lab that is up is the user's
    res = offlab_in_process("restore")
    assert res.returncode == 0, res.stderr
    assert veth_lab.name not in res.stdout
    assert (state_dir / "labs" / f"{veth_lab.name}.json").exists()
