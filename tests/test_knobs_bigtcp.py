"""BIG TCP in real namespaces: the four size limits and threaded NAPI set, read back and put back (also
when the lab goes); sizes a device cannot take refused naming its limit; and the proof by counters —
packets over 64 KiB cross the router only when BIG TCP is on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.experiment.measure import measure
from offlab.knobs import Change, Transaction
from offlab.knobs.bigtcp import LinkSize, link_sizes
from offlab.knobs.target import Target
from offlab.probes.edge.bigpackets import TABLE, BigPackets, merged, parse, seen
from offlab.traffic import Workload
from tests.conftest import REPO, offlab_cli, requires_root
from tests.helpers import journals, run as offlab_in_process

FIXTURES = Path(REPO) / "tests" / "fixtures" / "probes"
SIZES = ("gso_max_size", "gro_max_size", "gso_ipv4_max_size", "gro_ipv4_max_size")


def sizes(lab, role: str) -> dict[str, int]:
    return {k: v for k, v in link_sizes(lab.host(role), lab.resolve_iface(role)).items() if k in SIZES}


def test_nft_counters_parse_from_real_output():
    """`nft -j list table inet offlab_big` as nftables 1.0.6 printed it: a router mid-sample, and a fresh table."""
    assert parse((FIXTURES / "nft-offlab-big-router.json").read_text()) == {
        "olx3863a1": {"rx": 23, "tx": 0}, "olx3863a2": {"rx": 0, "tx": 0}}
    assert parse((FIXTURES / "nft-offlab-big-zero.json").read_text()) == {
        "bta": {"rx": 0, "tx": 0}, "btb": {"rx": 0, "tx": 0}}


def test_a_kernel_without_the_attribute_is_cannot_test_here():
    knob = LinkSize(Target("ol-nothing", "olx0"), "gso_ipv4_max_size")
    why = knob.impossible("196608", None)
    assert "this kernel has no gso_ipv4_max_size (Linux 6.3 and later)" in why and "cannot test" in why


@pytest.mark.network
@requires_root
def test_sizes_and_threaded_are_set_read_back_and_put_back(veth_lab, state_dir):
    lab, c = veth_lab, veth_lab.client
    iface = lab.resolve_iface("client")
    before = sizes(lab, "client")
    assert before == dict.fromkeys(SIZES, 65536)  # a fresh veth: the 64 KiB limits
    threaded_before = c.read(f"/sys/class/net/{iface}/threaded").strip()
    with Transaction(label="bigtcp") as tx:
        out = tx.apply([Change(c, k, 196608, "to-server", lab) for k in SIZES]
                       + [Change(c, "gro", "on", "to-server", lab), Change(c, "threaded", "on", "to-server", lab)])
        assert all(o.ok for o in out), [o.line() for o in out]
        assert sizes(lab, "client") == dict.fromkeys(SIZES, 196608)
        assert [o.original for o in out[:4]] == ["65536"] * 4 and [o.actual for o in out[:4]] == ["196608"] * 4
        assert c.read(f"/sys/class/net/{iface}/threaded").strip() == "1"
    assert sizes(lab, "client") == before
    assert c.read(f"/sys/class/net/{iface}/threaded").strip() == threaded_before
    assert journals(state_dir) == []


@pytest.mark.network
@requires_root
def test_threaded_without_napi_is_cannot_test_here(veth_lab, state_dir):
    """A veth with GRO off has no NAPI instance: the kernel refuses `threaded`, nothing is journalled."""
    lab = veth_lab
    with Transaction(label="bigtcp") as tx:
        out = tx.apply([Change(lab.client, "gro", "off", "to-server", lab),
                        Change(lab.client, "threaded", "on", "to-server", lab)])
        assert not out[1].ok and "cannot test threaded=on here" in out[1].reason
        assert out[1].actual == "off" and not out[1].journalled


@pytest.mark.network
@requires_root
def test_lab_set_and_validate_refuse_a_size_above_tso_max_size(veth_lab, state_dir, tmp_path):
    lab = veth_lab
    before = sizes(lab, "client")
    res = offlab_in_process("lab", "set", lab.name, "client", "to-server", "gso_max_size=600000")
    assert res.returncode == 2, res.stderr
    assert "tso_max_size 524280" in res.stderr and "Traceback" not in res.stderr
    res = offlab_in_process("lab", "set", lab.name, "client", "to-server", "gro_ipv4_max_size=600000")
    assert res.returncode == 2 and "GRO_MAX_SIZE 524280" in res.stderr, res.stderr
    assert sizes(lab, "client") == before
    plan = tmp_path / "big.yaml"
    plan.write_text("name: big\ntopology: {kind: router}\nworkload: {tool: iperf3, protocol: tcp}\n"
                    "axes:\n  size:\n    big: {settings: {\"client:to-router\": {gso_max_size: 524288}}}\n")
    res = offlab_in_process("run", str(plan), "--validate")
    assert res.returncode == 2 and "veth's tso_max_size, 524280" in res.stderr, res.stderr


@pytest.mark.network
@requires_root
def test_lab_set_sizes_go_with_the_lab(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        res = offlab_cli("lab", "set", lab_name, "client", "to-server", "gso_max_size=196608", "gso_ipv4_max_size=131072")
        assert res.returncode == 0, res.stderr
        assert "gso_ipv4_max_size: 65536 → 131072" in res.stdout
        assert sizes(lab, "client")["gso_ipv4_max_size"] == 131072
        assert "gso_max_size" in offlab_in_process("restore", "--list").stdout
    finally:
        teardown.down(lab_name)
    assert offlab_in_process("restore", "--list").stdout.strip() == "nothing to restore" and journals(state_dir) == []


@pytest.mark.network
@requires_root
def test_offlab_restore_puts_the_exact_original_back_from_the_journal(veth_lab, state_dir):
    """`lab set` leaves its journal to `offlab restore` (as after a kill -9): replayed from the entry alone."""
    lab = veth_lab
    before = sizes(lab, "server")
    res = offlab_cli("lab", "set", lab.name, "server", "to-client", "gro_max_size=131072", "gro_ipv4_max_size=189440")
    assert res.returncode == 0, res.stderr
    assert sizes(lab, "server") == {**before, "gro_max_size": 131072, "gro_ipv4_max_size": 189440}
    res = offlab_in_process("restore")
    assert res.returncode == 0 and "gro_ipv4_max_size = 65536" in res.stdout, res.stdout + res.stderr
    assert sizes(lab, "server") == before and journals(state_dir) == []


def _router_big_tx(lab, size: int) -> dict[str, dict[str, int]]:
    changes = [Change(lab.client, "gso_ipv4_max_size", size, "to-router", lab),
               Change(lab.host("router"), "gso_ipv4_max_size", size, "to-server", lab),
               Change(lab.server, "gro_ipv4_max_size", size, "to-router", lab)]
    with Transaction(label="bigtcp") as tx:
        assert all(o.ok for o in tx.apply(changes))
        sample = measure(lab, Workload(tool="iperf3", protocol="tcp", duration=1, warmup=1, big_packets=True).check())
    return sample


@pytest.mark.network
@requires_root
def test_packets_over_64k_cross_the_router_only_with_big_tcp(lab_name, clean_machine, state_dir):
    lab = labs.up("router", lab_name)
    try:
        off = _router_big_tx(lab, 65536)
        on = _router_big_tx(lab, 196608)
        router_tx = {s: sum(d.tx for n, d in x.probes.of(BigPackets).items() if n.startswith("router:"))
                     for s, x in (("off", off), ("on", on))}
        # counted on every interface of every namespace, 0 included
        assert len(off.probes.of(BigPackets)) == 4 and router_tx["off"] == 0
        assert router_tx["on"] > 0, on.probes.of(BigPackets)
        assert any("crossed the router unsegmented" in n for n in on.notes)
        assert any("no packet over 64 KiB" in n for n in off.notes)
        egress = f"router:{lab.resolve_iface('router', 'to-server')}"
        assert seen(on.probes.of(BigPackets), egress, "tx") > 0 == seen(off.probes.of(BigPackets), egress, "tx")
        assert seen(None, egress, "tx") is None
        for role in ("client", "router", "server"):  # the counters went with the sample
            tables = lab.host(role).run(["nft", "-j", "list", "tables"]).stdout
            assert TABLE not in tables
    finally:
        teardown.down(lab_name)
    assert journals(state_dir) == []


def test_plan_sizes_are_judged_without_a_lab():
    from offlab.knobs.bigtcp import plan_size_problem

    assert "integer" in plan_size_problem("gso_max_size", "big", "veth")
    assert plan_size_problem("gso_max_size", 524280, "veth") is None
    assert "GSO_MAX_SIZE" in plan_size_problem("gso_max_size", 600000, "nic")
    assert "a tap's tso_max_size, 65536" in plan_size_problem("gso_max_size", 65537, "tap")
    assert "GRO_MAX_SIZE" in plan_size_problem("gro_max_size", 524281, "veth")


def test_the_big_tcp_suite_needs_nft_and_counts_in_every_cell():
    from offlab.experiment.plan.checks import required_tools
    from offlab.experiment.suites import plans

    for quick in (False, True):
        for p in plans("big-tcp", quick=quick):
            assert "nft" in required_tools(p) and all(c.workload.big_packets for c in p.cells)


def _vxlan_big(lab, size: int):
    """BIG TCP through the tunnel at `size`: the sender's and hv1's VXLAN device's gso, GRO rebuilding
    super-packets on hv2's underlay (bounded by the gro size of hv2's VXLAN device, not u0's: with u0's
    alone none was rebuilt here), hv2's port to the server passing them on; the underlay stays 64 KiB."""
    hv1, hv2 = lab.host("hv1"), lab.host("hv2")
    changes = [Change(lab.client, "gso_ipv4_max_size", size, "to-hv1", lab),
               Change(hv1, "gso_ipv4_max_size", size, "vxlan0", lab),
               Change(hv2, "gro", "on", "u0", lab), Change(hv2, "gro_ipv4_max_size", size, "vxlan0", lab),
               Change(hv2, "gso_ipv4_max_size", size, "to-server", lab)]
    with Transaction(label="bigtcp") as tx:
        assert all(o.ok for o in tx.apply(changes))
        return measure(lab, Workload(tool="iperf3", protocol="tcp", duration=1, warmup=1, big_packets=True).check())


@pytest.mark.network
@requires_root
def test_packets_over_64k_cross_the_vxlan_tunnel_only_with_big_tcp(lab_name, clean_machine, state_dir):
    """The bridge table counts the VXLAN devices (bridge ports): super-packets enter hv1's vxlan0 and
    leave hv2's, rebuilt by GRO, only with the sizes above 64 KiB; the underlay between carries none."""
    lab = labs.up("vxlan", lab_name)
    try:
        off, on = _vxlan_big(lab, 65536), _vxlan_big(lab, 189440)
        to_server = f"hv2:{lab.resolve_iface('hv2', 'to-server')}"
        server = f"server:{lab.resolve_iface('server')}"
        for where, way in (("hv1:vxlan0", "tx"), ("hv2:vxlan0", "rx"), (to_server, "tx"), (server, "rx")):
            assert seen(off.probes.of(BigPackets), where, way) == 0, (where, off.probes.of(BigPackets))
            assert seen(on.probes.of(BigPackets), where, way) > 0, (where, on.probes.of(BigPackets))
        # between the hypervisors the underlay segmented them (its gso size is 64 KiB)
        assert sum(d.rx + d.tx for n, d in on.probes.of(BigPackets).items() if n.startswith("switch:")) == 0
        assert seen(on.probes.of(BigPackets), "hv2:u0", "rx") == 0
        for role in ("hv1", "switch", "hv2"):  # both tables went with the sample
            tables = lab.host(role).run(["nft", "list", "tables"]).stdout
            assert TABLE not in tables
    finally:
        teardown.down(lab_name)
    assert journals(state_dir) == []


def test_bridge_counters_parse_from_real_output_and_merge_with_inet():
    """`nft -j list table bridge offlab_big` from hv2 of a vxlan lab mid-sample (nftables 1.0.6): the
    decapsulated super-packets by bridge port; an interface's count is the larger of the two families'."""
    bridge = parse((FIXTURES / "nft-offlab-big-bridge-hv2.json").read_text())
    assert bridge == {"vxlan0": {"rx": 1222, "tx": 0}, "olx1052a4": {"rx": 0, "tx": 1222}}
    inet = {"br-int": {"rx": 1222, "tx": 1222}, "u0": {"rx": 0, "tx": 0}, "vxlan0": {"rx": 0, "tx": 0}}
    assert merged(inet, bridge) == {"br-int": {"rx": 1222, "tx": 1222}, "u0": {"rx": 0, "tx": 0},
                                    "vxlan0": {"rx": 1222, "tx": 0}, "olx1052a4": {"rx": 0, "tx": 1222}}


def test_big_tcp_quick_is_the_router_at_185k_vs_64k_and_a_full_run_adds_vxlan():
    from offlab.experiment.suites import plans

    full, quick = plans("big-tcp"), plans("big-tcp", quick=True)
    assert [p.name for p in full] == ["big-tcp-router", "big-tcp-vxlan"] and full[1].topology.kind == "vxlan"
    (router,) = quick
    assert router.name == "big-tcp-router" and router.budget_s == 120.0
    assert sorted(c.key for c in router.cells) == ["family=ipv4,size=185k", "family=ipv4,size=64k",
                                                   "family=ipv6,size=185k", "family=ipv6,size=64k"]
    # the tunnel part counts on the VXLAN devices' hops: both hypervisors' vxlan0 carry the size
    changes = {c.key: c.changes for c in full[1].cells}["family=ipv4,size=185k"]
    assert ("hv1:vxlan0", "gso_ipv4_max_size", 189440) in changes and ("hv2:vxlan0", "gro_ipv4_max_size", 189440) in changes
    assert ("hv1:u0", "tx-udp_tnl-segmentation", "off") in changes  # the underlay is a wire


@pytest.mark.network
@requires_root
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="QEMU is not installed (scripts/install-deps)")
def test_a_guest_nic_and_its_tap_refuse_big_tcp_and_no_packet_over_64k_crosses_the_tap(lab_name, clean_machine, state_dir):
    """Issue 29 item 5, one guest: virtio-net in the guest and the tap both have tso_max_size 65536, so a
    gso size above it is refused through the guest channel naming that limit; a gro size is set and put
    back; guest → host TCP crosses the tap as super-packets of at most 64 KiB."""
    lab = labs.up("vm", lab_name)
    try:
        link = lab.client.run(["ip", "-d", "link", "show", "eth0"]).stdout
        assert "tso_max_size 65536" in link and "gso_max_size 65536" in link, link
        res = offlab_cli("lab", "set", lab_name, "client", "to-server", "gso_max_size=196608")
        assert res.returncode == 2 and "eth0's tso_max_size 65536" in res.stderr and "Traceback" not in res.stderr, res.stderr
        res = offlab_cli("lab", "set", lab_name, "client", "to-server", "gro_ipv4_max_size=196608")
        assert res.returncode == 3 and "this host's `ip` does not show gro_ipv4_max_size" in res.stdout + res.stderr
        tap = lab.resolve_iface("server", "to-client")
        res = offlab_cli("lab", "set", lab_name, "server", tap, "gso_max_size=196608")
        assert res.returncode == 2 and f"{tap}'s tso_max_size 65536" in res.stderr, res.stderr
        res = offlab_cli("lab", "set", lab_name, "client", "to-server", "gro_max_size=196608")
        assert res.returncode == 0 and "gro_max_size: 65536 → 196608" in res.stdout, res.stdout + res.stderr
        sample = measure(lab, Workload(tool="iperf3", protocol="tcp", duration=1, warmup=1, big_packets=True).check())
        assert seen(sample.probes.of(BigPackets), f"server:{tap}", "rx") == 0
        tap_rx = sample.probes.interfaces[f"server:{tap}"]
        assert tap_rx.rx_bytes / tap_rx.rx_packets > 1514  # super-packets crossed it whole, at most 64 KiB
    finally:
        teardown.down(lab_name)
    assert journals(state_dir) == []  # gro_max_size went back with the lab


@pytest.mark.network
@requires_root
def test_a_request_response_sample_counts_packets_over_64k_when_asked(veth_lab, state_dir):
    """The kernel authors' own test is TCP_RR with 80000-byte messages: `measure --workload rr
    --big-packets` counts, and each message crosses as one packet over 64 KiB only with BIG TCP."""
    from offlab.experiment.measure import measure_rr
    from offlab.traffic import rr

    lab = veth_lab
    counted = {}
    for size in (65536, 196608):
        with Transaction(label="bigtcp") as tx:
            assert all(o.ok for o in tx.apply([Change(lab.client, "gso_ipv4_max_size", size, "to-server", lab),
                                                Change(lab.server, "gso_ipv4_max_size", size, "to-client", lab)]))
            rw = rr.RrWorkload(protocol="tcp", request_size=80000, response_size=80000, duration=1, warmup=0.5)
            sample = measure_rr(lab, rw.check(), big_packets=True)
        counted[size] = seen(sample.probes.of(BigPackets), f"client:{lab.resolve_iface('client')}", "tx")
    assert counted[65536] == 0 and counted[196608] > 0, counted
    assert journals(state_dir) == []
