"""`lab up phys`: a veth pair made here, outside offlab, stands in for two cabled NIC ports.

Each stand-in is given a state of its own first (an address, an altname, an MTU, a feature off,
one end down), so that "given back as it was" is checked against values offlab did not choose.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from offlab.hosts import LOCAL
from tests.conftest import REPO, TEST_TAG, netns_names, offlab_cli, phys_port, requires_root
from tests.helpers import run

pytestmark = [requires_root, pytest.mark.network]

NET = 200 + int(TEST_TAG) % 50  # 10.200.NET.0/24 on the stand-ins, per test run


def ip_j(*args: str, netns: str | None = None) -> list[dict]:
    argv = ["ip", *(["-n", netns] if netns else []), "-j", *args]
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    return json.loads(out) if out.strip() else []


def port_state(name: str) -> dict:
    """What a person would check by hand, read with ip and ethtool (not through offlab)."""
    links = ip_j("-d", "addr", "show", "dev", name)
    assert links, f"{name} is not in the root namespace"
    link = links[0]
    feats = subprocess.run(["ethtool", "-k", name], capture_output=True, text=True, check=True).stdout
    return {
        "mtu": link["mtu"], "up": "UP" in link["flags"], "mac": link["address"], "ifindex": link["ifindex"],
        "master": link.get("master"), "altnames": link.get("altnames", []),
        "addresses": sorted(f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"]
                            if not (a["family"] == "inet6" and a["scope"] == "link")),
        "features": sorted(l.strip() for l in feats.splitlines()[1:] if l.strip()),
        "routes": [r for fam in ("-4", "-6") for r in ip_j(fam, "route", "show", "dev", name)
                   if r.get("protocol") != "kernel"],
        "conf": {f"{fam}/{key}": open(f"/proc/sys/net/{fam}/conf/{name}/{key}").read()
                 for fam in ("ipv4", "ipv6") for key in sorted(os.listdir(f"/proc/sys/net/{fam}/conf/{name}"))
                 if key != "stable_secret"},  # unreadable until set
    }


@pytest.fixture
def ports(clean_machine):
    """Two stand-in ports with their own settings, removed (with anything left of them) at the end."""
    a, b = phys_port("a"), phys_port("b")
    sh = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    sh("ip", "link", "add", a, "mtu", "1400", "type", "veth", "peer", "name", b, "mtu", "1450")
    try:
        sh("ip", "link", "property", "add", "dev", a, "altname", phys_port("alt"))
        sh("ip", "addr", "add", f"10.200.{NET}.1/24", "dev", a)
        sh("ip", "addr", "add", f"fd00:200:{NET:x}::1/64", "dev", a, "nodad")
        sh("ip", "addr", "add", f"10.200.{NET}.2/24", "dev", b)
        sh("ethtool", "-K", a, "tso", "off")
        sh("ethtool", "-K", b, "rx-udp-gro-forwarding", "on")
        sh("ip", "link", "set", a, "up")  # b stays down: up/down state must come back too
        # Dropped by any move to another namespace: routes through the port, its per-interface sysctls.
        sh("ip", "route", "add", f"10.200.{NET - 100}.0/24", "via", f"10.200.{NET}.9", "dev", a)
        sh("ip", "-6", "route", "add", f"fd00:200:{NET - 100:x}::/64", "via", f"fd00:200:{NET:x}::9", "dev", a)
        sh("sysctl", "-qw", f"net.ipv4.conf.{a}.arp_ignore=1", f"net.ipv6.conf.{a}.accept_ra=0",
           f"net.ipv4.conf.{b}.rp_filter=2")
        yield a, b
    finally:
        for ns in netns_names():  # a stand-in stranded in a test namespace would outlive the test
            if ns.startswith(f"ol-t{TEST_TAG}"):
                subprocess.run(["ip", "-n", ns, "link", "del", a], capture_output=True)
        subprocess.run(["ip", "link", "del", a], capture_output=True)


def state_env(state_dir) -> dict:
    return {"OFFLAB_STATE_DIR": str(state_dir)}


def cli(state_dir, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return offlab_cli(*args, env=state_env(state_dir), timeout=timeout)


def assert_given_back(before: dict, ports: tuple[str, str], lab_name: str) -> None:
    for p in ports:
        assert port_state(p) == before[p], p
    assert not any(n.startswith(f"ol-{lab_name}-") for n in netns_names())


def test_up_measure_knob_down_gives_the_ports_back_exactly(ports, lab_name, state_dir):
    a, b = ports
    before = {p: port_state(p) for p in ports}
    res = cli(state_dir, "lab", "up", "phys", "--ports", f"{a},{b}", "--name", lab_name, "--mtu", "9000",
              "--ipv6", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    client, server = info["hosts"]["client"], info["hosts"]["server"]
    assert [i["name"] for i in client["interfaces"]] == [a] and [i["name"] for i in server["interfaces"]] == [b]
    assert client["interfaces"][0]["addresses"] == ["10.200.1.1/24", "fd00:200:0:1::1/64"]
    assert client["interfaces"][0]["mtu"] == 9000 and server["address"] == "10.200.1.2"
    assert not ip_j("link", "show", "dev", a)  # gone from the root namespace, under its own name in the lab
    assert ip_j("link", "show", "dev", a, netns=f"ol-{lab_name}-client")[0]["ifname"] == a
    # The lab file recorded the port as it was before anything moved.
    rec = json.loads((state_dir / "labs" / f"{lab_name}.json").read_text())["ports"][0]
    assert (rec["name"], rec["mtu"], rec["up"], rec["altnames"]) == (a, 1400, True, [phys_port("alt")])
    assert rec["features"]["tx-tcp-segmentation"] is False
    assert rec["sysctls"]["ipv4/arp_ignore"] == "1" and len(rec["routes"]) == 2

    res = cli(state_dir, "measure", lab_name, "--tool", "iperf3", "--proto", "tcp", "--duration", "1",
              "--warmup", "0", "--rate", "100M", "--json")  # traffic over the ports, at any speed
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["traffic"]["throughput_bps"] > 0

    # A knob on a port goes through the journal like in any lab, and back before the port leaves.
    res = run("lab", "set", lab_name, "client", "to-server", "tso=on", "mtu=1500", env=state_env(state_dir))
    assert res.returncode == 0, res.stderr
    res = cli(state_dir, "lab", "down", lab_name)
    assert res.returncode == 0, res.stderr
    assert "journalled setting, put back" in res.stdout and f"port {a} (back in the root namespace" in res.stdout
    assert_given_back(before, ports, lab_name)
    assert not list((state_dir / "journal").glob("*.journal"))


SLOW_UP = """
import sys, time
from offlab import lab
from offlab.experiment import teardown
from offlab.lab import build, phys

point, name, a, b = sys.argv[1:]
def pause(*args, **kwargs):
    print("paused", flush=True)
    time.sleep(120)
if point == "first-port-moved":
    phys.Interface = pause  # called right after the client's port moved, before the server's
else:
    build.Builder.verify = pause  # both ports moved and addressed, the lab not yet up
lab.up("phys", name, options={"ports": [a, b]})
"""


@pytest.mark.parametrize("point", ["first-port-moved", "before-verify"])
def test_kill_9_during_lab_up_then_restore_gives_the_ports_back(point, ports, lab_name, state_dir):
    a, b = ports
    before = {p: port_state(p) for p in ports}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_UP, point, lab_name, a, b], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    try:
        assert proc.stdout.readline().strip() == "paused", proc.stderr.read() if proc.poll() is not None else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert ip_j("link", "show", "dev", a, netns=f"ol-{lab_name}-client"), "the client's port had moved"
    res = run("restore", "--list", env=state_env(state_dir))  # in this process: it only reads
    assert res.returncode == 0 and f"would remove lab {lab_name}" in res.stdout, res.stdout + res.stderr
    res = cli(state_dir, "restore")
    assert res.returncode == 0, res.stderr
    assert f"port {a} (back in the root namespace" in res.stdout, res.stdout
    assert_given_back(before, ports, lab_name)
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()


def test_kill_9_mid_measure_then_restore_gives_the_ports_back(ports, lab_name, state_dir):
    from offlab import lab

    a, b = ports
    before = {p: port_state(p) for p in ports}
    lab.up("phys", lab_name, options={"ports": [a, b]})
    ns = f"ol-{lab_name}-client"
    proc = subprocess.Popen([sys.executable, "-m", "offlab", "measure", lab_name, "--tool", "iperf3", "--proto", "tcp",
                             "--duration", "30", "--warmup", "0", "--rate", "100M"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    try:
        deadline = time.monotonic() + 30
        while not LOCAL.run(["ip", "netns", "pids", ns], check=False).stdout.strip():  # the iperf3 client runs
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert ip_j("link", "show", "dev", b, netns=f"ol-{lab_name}-server")
    res = cli(state_dir, "restore")
    assert res.returncode == 0, res.stderr
    assert f"gave back (phys lab {lab_name}): port {b} (back in the root namespace" in res.stdout, res.stdout
    assert_given_back(before, ports, lab_name)


def test_a_phys_lab_held_by_a_live_measurement_is_left_to_it(ports, lab_name, state_dir):
    from offlab import lab
    from offlab.experiment import teardown
    from offlab.lab import hold

    lab.up("phys", lab_name, options={"ports": list(ports)})
    try:
        with hold(lab_name, "measure (this test)"):
            res = subprocess.run([sys.executable, "-m", "offlab", "restore", "--list"], cwd=REPO, capture_output=True,
                                 text=True, env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
            assert res.returncode == 0 and lab_name not in res.stdout, res.stdout
    finally:
        teardown.down(lab_name)


@pytest.fixture
def other_ns(lab_name):
    ns = f"ol-{lab_name}-elsewhere"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)


def refusal(state_dir, ports_arg: str, lab_name: str, env: dict | None = None, real_process: bool = False) -> str:
    """`lab up phys` refused; in this process unless `real_process` (one test keeps the real command's edge)."""
    argv = ("lab", "up", "phys", "--ports", ports_arg, "--name", lab_name)
    env = {**state_env(state_dir), **(env or {})}
    res = offlab_cli(*argv, env=env) if real_process else run(*argv, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (state_dir / "labs" / f"{lab_name}.json").exists()
    assert not any(n.startswith(f"ol-{lab_name}-c") or n.startswith(f"ol-{lab_name}-s") for n in netns_names())
    return res.stderr.strip()


def test_bad_ports_are_refused_in_one_line_before_anything_changes(ports, lab_name, state_dir, other_ns):
    a, b = ports
    before = {p: port_state(p) for p in ports}
    assert "port nosuch0 does not exist" in refusal(state_dir, f"{a},nosuch0", lab_name)
    assert f"--ports names {a} twice" in refusal(state_dir, f"{a},{a}", lab_name)
    assert "port lo is the loopback device" in refusal(state_dir, f"lo,{b}", lab_name)
    assert "needs --ports IF1,IF2" in refusal(state_dir, a, lab_name)
    assert "invalid --ports port name" in refusal(state_dir, f"{a},$(reboot)", lab_name)
    assert f"altname of {a}" in refusal(state_dir, f"{phys_port('alt')},{b}", lab_name)
    # An SSH session on the port's address (this process's own, as sshd tells a login shell).
    msg = refusal(state_dir, f"{a},{b}", lab_name, env={"SSH_CONNECTION": f"10.200.{NET}.9 50000 10.200.{NET}.1 22"})
    assert msg.endswith(f"port {a} carries an SSH session (10.200.{NET}.1 ↔ 10.200.{NET}.9:50000): moving it would "
                        f"cut it; choose another port"), msg
    assert {p: port_state(p) for p in ports} == before

    # A port of another namespace (e.g. another lab's), a bridge member.
    br = phys_port("br")
    subprocess.run(["ip", "link", "add", br, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "link", "set", b, "master", br], check=True)
        assert f"port {b} is a member of {br} (bridge/bond)" in refusal(state_dir, f"{a},{b}", lab_name)
        subprocess.run(["ip", "link", "set", b, "nomaster"], check=True)
    finally:
        subprocess.run(["ip", "link", "del", br], check=True)
    subprocess.run(["ip", "link", "set", b, "netns", other_ns], check=True)
    try:
        msg = refusal(state_dir, f"{a},{b}", lab_name)
        assert f"port {b} is not in this machine's root network namespace (it is in namespace {other_ns}" in msg
    finally:
        subprocess.run(["ip", "-n", other_ns, "link", "set", b, "netns", "1"], check=True)
    # A move by hand drops what offlab's own move puts back: the address and the per-interface sysctl.
    assert port_state(b) != before[b]
    subprocess.run(["ip", "addr", "add", f"10.200.{NET}.2/24", "dev", b], check=True)
    subprocess.run(["sysctl", "-qw", f"net.ipv4.conf.{b}.rp_filter=2"], check=True)
    assert {p: port_state(p) for p in ports} == before


def test_the_default_route_port_is_refused_and_left_untouched(ports, lab_name, state_dir):
    """This machine's eth0 carries its default route: refused before any change (eth0 is only read)."""
    routes = ip_j("route", "show", "default")
    dev = routes[0]["dev"] if routes else pytest.skip("no default route on this machine")
    before = port_state(dev)
    msg = refusal(state_dir, f"{ports[0]},{dev}", lab_name, real_process=True)
    assert msg.endswith(f"port {dev} carries the default route (IPv4 default via {routes[0]['gateway']}): moving it "
                        f"would cut this machine off; choose a port that does not"), msg
    assert port_state(dev) == before


def test_a_port_in_a_lab_is_refused_for_another_and_lab_up_help_names_phys(ports, lab_name, state_dir):
    from offlab import lab
    from offlab.experiment import teardown

    a, b = ports
    lab.up("phys", lab_name, options={"ports": [a, b]})
    try:
        other = lab_name[:-1] + "z"
        msg = refusal(state_dir, f"{a},{b}", other)
        assert f"port {a} is not in this machine's root network namespace (it is in namespace ol-{lab_name}-client, " \
               f"offlab lab {lab_name}'s)" in msg
    finally:
        teardown.down(lab_name)
    res = run("lab", "up", "--help")
    assert "phys" in res.stdout and "--ports" in res.stdout


PLAN = """
name: phys-gro
topology: {kind: phys, ports: [%s, %s]}
workload: {tool: iperf3, protocol: tcp, rate: 100M, duration: 1, warmup: 0}
axes:
  gro:
    "off": {settings: {server: {gro: false}}}
    "on": {settings: {server: {gro: true}}}
repeat: {min: 1, max: 1}
"""


def test_a_plan_runs_on_the_ports_and_gives_them_back(ports, tmp_path, state_dir):
    before = {p: port_state(p) for p in ports}
    plan = tmp_path / "phys.yaml"
    plan.write_text(PLAN % ports)
    db = str(tmp_path / "r.db")
    res = cli(state_dir, "run", str(plan), "--db", db, "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)[0]["run_id"]
    res = cli(state_dir, "results", "show", str(run_id), "--db", db, "--json")
    shown = json.loads(res.stdout)
    assert {c["key"]: c["n_samples"] for c in shown["cells"]} == {"gro=off": 1, "gro=on": 1}
    assert all(s["metrics"]["throughput_bps"] > 0 for s in shown["samples"])
    # The knob went to the server's port in its namespace, and was read back there.
    on = next(s for s in shown["samples"] if s["requested_vs_actual"][0]["requested"] == "on")
    assert on["requested_vs_actual"][0]["where"] == f"server:{ports[1]}" and on["requested_vs_actual"][0]["ok"]
    for p in ports:
        assert port_state(p) == before[p], p


def test_a_phys_plan_that_varies_the_topology_or_names_no_ports_is_refused(tmp_path, state_dir):
    bad = {"vary": "name: v\ntopology: {kind: phys, ports: [a0, b0]}\nworkload: {tool: iperf3}\naxes:\n"
                   "  mtu:\n    small: {topology: {mtu: 1500}}\n    big: {topology: {mtu: 9000}}\n",
           "none": "name: n\ntopology: {kind: phys}\nworkload: {tool: iperf3}\n",
           "other": "name: o\ntopology: {kind: veth, ports: [a0, b0]}\nworkload: {tool: iperf3}\n"}
    want = {"vary": "a phys plan has one pair of ports, so one lab", "none": "a phys lab needs ports: [IF1, IF2]",
            "other": "ports applies to a phys lab only, not veth"}
    for key, text in bad.items():
        (tmp_path / f"{key}.yaml").write_text(text)
        res = cli(state_dir, "run", str(tmp_path / f"{key}.yaml"), "--validate")
        assert res.returncode == 2 and want[key] in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


def test_the_leftover_check_ignores_only_another_runs_stand_in_ports_and_lab_links():
    from tests.conftest import another_runs_link

    other = "0001" if TEST_TAG != "0001" else "0002"
    assert another_runs_link(f"ph{other}a") and another_runs_link(f"ph{other}br")
    assert another_runs_link(f"olt{other}30") and another_runs_link(f"olx{other}ab1")
    assert not another_runs_link(phys_port("a"))  # ours: still flagged when left behind
    assert not another_runs_link(f"olt{TEST_TAG}30")
    for link in ("pha", f"ph{other}", f"ph{other}abc", f"ph{other[:3]}a", f"olt{other[:3]}", "eth1",
                 f"xph{other}a", f"ol{other}0"):
        assert not another_runs_link(link), link
