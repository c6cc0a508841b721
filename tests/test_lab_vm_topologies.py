"""`offlab lab up vm-router` and `vm-pair`: real TCG guests, one lab of each per module.

vm-router: client ─ br0 ─ tap ─ [guest: eth0 · ip_forward · eth1] ─ tap ─ br0 ─ server.
vm-pair:   [guest client] ─ tap ─ br0 (switch) ─ tap ─ [guest server].
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, TEST_TAG, netns_names, new_links_of_ours, offlab_cli, root_links, running
from tests.helpers import GUEST_MARKS, kill_9_once_qemu_is_recorded

pytestmark = GUEST_MARKS


@pytest.fixture(scope="module")
def module_state(tmp_path_factory):
    """One state directory for the module's labs (each guest boot costs seconds of TCG)."""
    d = tmp_path_factory.mktemp("vmtopo") / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OFFLAB_STATE_DIR", str(d))
        yield d


def _up(module_state, kind: str, name: str, *args: str) -> dict:
    before = root_links()
    res = offlab_cli("lab", "up", kind, "--name", name, *args, "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    assert new_links_of_ours(before) == set()  # every tap QEMU made stays in a lab namespace
    return json.loads(res.stdout)


def _down_leaves_nothing(name: str, shown: dict) -> None:
    pids = [d["pid"] for d in shown["daemons"]]
    res = offlab_cli("lab", "down", name, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("removed qemu-system-x86_64") == len(pids)
    assert not any(running(p) for p in pids)
    assert not any(n.startswith(f"ol-{name}-") for n in netns_names())
    assert not any(l.startswith(f"ol{name}") for l in root_links())


@pytest.fixture(scope="module")
def router(module_state):
    """A vm-router lab whose guest NICs have QEMU properties: 2 queues and a 1024-entry rx ring."""
    name = f"t{TEST_TAG}r"[:10]
    shown = _up(module_state, "vm-router", name, "--nic", "rx_queue_size=1024", "--nic", "queues=2",
                "--guest-cpus", "2")
    try:
        yield name, shown
    finally:
        _down_leaves_nothing(name, shown)


@pytest.fixture(scope="module")
def pair(module_state):
    name = f"t{TEST_TAG}p"[:10]
    shown = _up(module_state, "vm-pair", name)
    try:
        yield name, shown
    finally:
        if (module_state / "labs" / f"{name}.json").exists():  # the module's last test takes it down itself
            _down_leaves_nothing(name, shown)


def _exec(name: str, host: str, *argv: str) -> str:
    """What `lab exec` runs, through the lab's host in this process (test_lab_vm.py runs the command itself)."""
    from offlab import lab as labs

    res = labs.LabState.load(name).host(host).run(list(argv), timeout=60, check=False)
    assert res.rc == 0, res.stderr
    return res.stdout


def _forwarded(name: str) -> int:
    """Datagrams the router guest's kernel forwarded (Ip: ForwDatagrams in its /proc/net/snmp)."""
    head, values = [l.split() for l in _exec(name, "router", "cat", "/proc/net/snmp").splitlines()[:2]]
    return int(values[head.index("ForwDatagrams")])


# ---- vm-router ------------------------------------------------------------------------------

def test_vm_router_lists_the_guest_like_any_host_with_its_two_nics_and_qemu_properties(router):
    name, shown = router
    assert list(shown["hosts"]) == ["client", "router", "server"]
    guest = shown["hosts"]["router"]["guest"]
    assert guest["accel"] in ("tcg", "kvm") and guest["vhost"] is False and guest["cpus"] == 2
    assert [n["iface"] for n in guest["nics"]] == ["eth0", "eth1"]
    for nic in guest["nics"]:
        assert nic["queues"] == 2
        assert nic["properties"] == {"rx_queue_size": "1024", "mq": "on", "vectors": "6"}
    ifaces = {i["name"]: i for i in shown["hosts"]["router"]["interfaces"]}
    assert ifaces["eth0"]["addresses"] == ["10.200.1.254/24"] and ifaces["eth0"]["peer_host"] == "client"
    assert ifaces["eth1"]["addresses"] == ["10.200.2.254/24"] and ifaces["eth1"]["peer_host"] == "server"
    assert "tx-tcp-segmentation" in ifaces["eth0"]["features"]
    for role, nic, address in (("client", guest["nics"][0], "10.200.1.1/24"), ("server", guest["nics"][1], "10.200.2.2/24")):
        by_name = {i["name"]: i for i in shown["hosts"][role]["interfaces"]}
        assert by_name[nic["tap"]]["master"] == "br0" and by_name[nic["tap"]]["peer_host"] == "router"
        assert by_name["br0"]["addresses"] == [address]
    assert {(a["host"], a["setting"], a["value"]) for a in shown["adjustments"]} == {("router", "net.ipv4.ip_forward", "1")}
    (daemon,) = shown["daemons"]
    assert running(daemon["pid"])
    assert _exec(name, "router", "cat", "/proc/sys/net/ipv4/ip_forward") == "1\n"
    # each NIC's chain: its own QEMU device and its tap, moved to the end namespace it faces
    res = offlab_cli("lab", "explain", name, "router", "--json")
    assert res.returncode == 0, res.stderr
    chains = json.loads(res.stdout)["nics"]
    assert [(c["iface"], c["device_id"], c["tap"], c["tap_host"], c["problems"]) for c in chains] == [
        ("eth0", "nic0", guest["nics"][0]["tap"], "client", []), ("eth1", "nic1", guest["nics"][1]["tap"], "server", [])]
    for c in chains:
        mq = {r["prop"]: r for r in c["rows"]}["mq"]
        assert (mq["value"], mq["source"], mq["offered"], mq["accepted"]) == ("on", "set", True, True)


def test_qemu_device_properties_reach_the_guest_driver(router):
    name, _ = router
    for iface in ("eth0", "eth1"):
        ring = _exec(name, "router", "ethtool", "-g", iface)
        assert ring.split("Pre-set maximums:")[1].split("Current")[0].split("RX:")[1].split()[0] == "1024"
        channels = _exec(name, "router", "ethtool", "-l", iface)
        maxima, current = channels.split("Pre-set maximums:")[1].split("Current hardware settings:")
        assert maxima.split("Combined:")[1].split()[0] == "2"
        assert current.split("Combined:")[1].split()[0] == "2"  # 2 vCPUs: the driver uses both queues


def test_vm_router_forwards_traffic_both_ways_through_the_guest(router):
    from offlab import lab as labs
    from offlab.experiment.measure import measure
    from offlab.traffic import Workload

    name, _ = router
    lab = labs.LabState.load(name)
    for reverse in (False, True):
        before = _forwarded(name)
        # 100 Mbit/s: what is checked is that TCP crosses the router guest both ways, not how fast (full
        # speed takes both host CPUs under TCG)
        s = measure(lab, Workload(tool="iperf3", protocol="tcp", duration=1, warmup=0.3, reverse=reverse, rate="100M"))
        assert s.traffic.throughput_bps > 0
        # TCP's segments in one direction and its ACKs in the other all cross the guest's forwarding
        assert _forwarded(name) - before > 100
    # the UDP sample takes the kernel's account (--trace) on every hop: this machine's namespaces by bpftrace,
    # the router guest's own kernel by its hist triggers
    s = measure(lab, Workload(tool="engine", protocol="udp", duration=1, warmup=0.3, rate="20Mbit", gso=True),
                trace=True)
    assert s.traffic.datagrams_received > 0 and s.traffic.loss is not None
    hops = {(h.host, h.device): h for h in s.kernel_account.hops}
    client_dev = lab.resolve_iface("client", "to-router")
    server_dev = lab.resolve_iface("server", "to-router")
    sent = hops[("client", client_dev)].sent
    assert "UDP_L4" in sent.by_type and sent.by_type["UDP_L4"].super_packets > 0, hops  # the engine's GSO, as handed
    # the same super-packets reached the guest whole over virtio-net (two kernels, two tools: within TCG's
    # window skew), and what the guest's eth1 driver was handed (its exact segments) reached the server
    assert hops[("router", "eth0")].received.super_packets == pytest.approx(sent.super_packets, rel=0.35), hops
    out_segments = hops[("router", "eth1")].sent.segments
    assert out_segments == pytest.approx(hops[("server", server_dev)].received.segments, rel=0.35), hops
    assert not s.kernel_account.has("not_traced") and s.probes.trace.hist["router"].drops_counted_in == "skbs"


def test_static_hosts_and_interfaces_match_the_built_vm_router_and_vm_pair(router, pair):
    from offlab import lab as labs
    from offlab.experiment.plan import topology as static

    for kind, (name, _) in (("vm-router", router), ("vm-pair", pair)):
        lab = labs.LabState.load(name)
        built = {role: sorted(((i.kind, i.name if not i.name.startswith("ol") else None, i.peer_host)
                               for i in h.interfaces), key=repr) for role, h in lab.hosts.items()}
        known = {role: sorted(((i.kind, i.name, i.peer) for i in ifaces), key=repr)
                 for role, ifaces in static.HOSTS[kind].items()}
        assert built == known, kind
        for role, ifaces in static.HOSTS[kind].items():
            for i in ifaces:
                assert lab.resolve_iface(role, i.name or f"to-{i.peer}")


_HOLD_GRO_OFF = """
import sys, time
from offlab import lab as labs
from offlab.knobs import Change, Transaction
lab = labs.LabState.load(sys.argv[1])
tx = Transaction(label="test holds gro off in the router guest")
tx.__enter__()
tx.apply([Change(host=lab.host("router"), key="gro", value="off", iface="eth1", lab=lab)])
print("applied", flush=True)
time.sleep(600)
"""


def _gro(name: str) -> str:
    line = next(l for l in _exec(name, "router", "ethtool", "-k", "eth1").splitlines()
                if l.startswith("generic-receive-offload:"))
    return line.split()[1]


def test_a_guest_setting_is_journalled_and_restored_after_kill_9(router, module_state):
    name, _ = router
    assert _gro(name) == "on"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_GRO_OFF, name], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "applied"
        assert _gro(name) == "off"
        journal = [json.loads(l) for p in (module_state / "journal").glob("*.journal") for l in p.read_text().splitlines()]
        assert any(e.get("key") == "gro" and e.get("role") == "router" and e.get("original_text") == "on" for e in journal)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _gro(name) == "off"  # the process died holding it
    res = offlab_cli("restore", timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"restored {name}/router:eth1 gro = on" in res.stdout
    assert _gro(name) == "on"


def test_lab_down_after_kill_9_of_vm_router_up_stops_qemu_and_removes_every_namespace(module_state):
    name = f"t{TEST_TAG}k"[:10]
    pid = kill_9_once_qemu_is_recorded("vm-router", name, module_state)
    res = offlab_cli("lab", "down", name)
    assert res.returncode == 0, res.stderr
    assert "qemu-system-x86_64" in res.stdout and res.stdout.count("removed namespace") == 3
    assert not running(pid)
    assert not any(n.startswith(f"ol-{name}-") for n in netns_names())


# ---- vm-pair --------------------------------------------------------------------------------

def test_vm_pair_is_two_guests_on_one_bridge(pair):
    name, shown = pair
    assert list(shown["hosts"]) == ["switch", "client", "server"]
    taps = {}
    for role, address in (("client", "10.200.1.1/24"), ("server", "10.200.1.2/24")):
        h = shown["hosts"][role]
        assert h["guest"]["accel"] in ("tcg", "kvm") and h["netns"] == f"ol-{name}-switch"
        assert [(i["name"], i["addresses"]) for i in h["interfaces"]] == [("eth0", [address])]
        taps[h["guest"]["tap"]] = role
    switch = {i["name"]: i for i in shown["hosts"]["switch"]["interfaces"]}
    assert {t: (switch[t]["master"], switch[t]["peer_host"]) for t in taps} == {t: ("br0", r) for t, r in taps.items()}
    assert len({d["pid"] for d in shown["daemons"]}) == 2 and all(running(d["pid"]) for d in shown["daemons"])
    assert _exec(name, "server", "cat", "/proc/sys/kernel/hostname") == "offlab-guest\n"


def test_vm_pair_carries_traffic_guest_to_guest_both_ways(pair):
    from offlab import lab as labs
    from offlab.experiment.measure import measure
    from offlab.traffic import Workload

    name, shown = pair
    lab = labs.LabState.load(name)
    taps = {shown["hosts"][r]["guest"]["tap"]: r for r in ("client", "server")}

    def tap_rx() -> dict[str, int]:
        # a tap's rx is what its guest sent: the host side counts the other way round
        return {taps[t]: int(lab.host("switch").read(f"/sys/class/net/{t}/statistics/rx_packets")) for t in taps}

    for reverse in (False, True):
        before = tap_rx()
        # 100 Mbit/s: guest to guest both ways is checked, not speed
        s = measure(lab, Workload(tool="iperf3", protocol="tcp", duration=1, warmup=0.3, reverse=reverse, rate="100M"))
        after = tap_rx()
        assert s.traffic.throughput_bps > 0
        sender = "server" if reverse else "client"
        receiver = "client" if reverse else "server"
        # the sender's data and the receiver's ACKs: the sender's tap carries more bytes, both carry packets
        assert after[sender] - before[sender] > 100 and after[receiver] - before[receiver] > 10
    # the UDP sample takes the kernel's account (--trace) in both guests' own kernels and on the switch
    s = measure(lab, Workload(tool="engine", protocol="udp", duration=1, warmup=0.3, rate="10Mbit"), trace=True)
    assert s.traffic.datagrams_received > 0
    hops = {(h.host, h.device): h for h in s.kernel_account.hops}
    sent, received = hops[("client", "eth0")].sent.segments, hops[("server", "eth0")].received.segments
    # what the client guest's driver was handed reached the server guest's (three kernels' windows:
    # within TCG's skew), through the switch's tap toward the server
    assert sent > 100 and received == pytest.approx(sent, rel=0.35), hops
    to_server = next(t for t, r in taps.items() if r == "server")
    assert hops[("switch", to_server)].sent.segments == pytest.approx(received, rel=0.35), hops


def test_lab_down_drops_the_journal_entries_of_its_guests(pair):
    """Last in the module: it takes the vm-pair lab down (the fixture then has nothing to remove)."""
    name, shown = pair
    res = offlab_cli("lab", "set", name, "client", "eth0", "gro=off")
    assert res.returncode == 0, res.stderr
    show = json.loads(offlab_cli("lab", "show", name, "--json").stdout)
    assert [(c["host"], c["key"], c["value"]) for c in show["changes"]] == [("client", "gro", "off")]
    _down_leaves_nothing(name, shown)
    res = offlab_cli("restore", "--list")
    assert res.returncode == 0 and "gro" not in res.stdout, res.stdout
