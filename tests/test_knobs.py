"""Knobs in real namespaces: every kind is put back exactly, side effects and fixed features are
reported, bad input changes nothing, `lab set` / `lab show` / `offlab restore` work by hand."""

from __future__ import annotations

import json
import re

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import BadInput
from offlab.hosts import LOCAL
from offlab.knobs import Change, Transaction, list_pending, restore_pending
from offlab.knobs.queues import possible_cpus
from offlab.lab.ovs import vsctl_for
from tests.conftest import offlab_cli, requires_root
from tests.helpers import journals, lab_state, run as offlab_in_process

pytestmark = [requires_root, pytest.mark.network]

@pytest.fixture
def veth(veth_lab):
    return veth_lab


def test_restore_puts_back_every_knob_kind_exactly(veth, state_dir):
    lab, c = veth, veth.client
    before = lab_state(lab)
    chans = min(2, possible_cpus())
    top = (1 << possible_cpus()) - 1
    changes = [
        Change(c, "tx", "off", "to-server", lab),
        Change(c, "gro", "on", "to-server", lab),
        Change(c, "gro-list", True, "to-server", lab),
        Change(c, "udp-gro-fwd", "on", "to-server", lab),
        Change(c, "tx-nocache-copy", "on", "to-server", lab),
        Change(c, "mtu", 9000, "to-server", lab),
        Change(c, "txqueuelen", 500, "to-server", lab),
        Change(c, "channels.rx", chans, "to-server", lab),
        Change(c, "channels.tx", chans, "to-server", lab),
        Change(c, "rps", f"{top:#x}", "to-server", lab),
        Change(c, "xps.0", "1", "to-server", lab),
        Change(c, "qdisc", "pfifo limit 50", "to-server", lab),
        Change(c, "net.ipv4.tcp_rmem", "4096 65536 1048576", None, lab),
        Change(c, "net.core.somaxconn", 1000, None, lab),
        Change(lab.server, "net.ipv4.ip_forward", 1, None, lab),
    ]
    with Transaction(label="every kind") as tx:
        outcomes = tx.apply(changes)
        assert [o for o in outcomes if not o.ok] == []
        assert {o.change.key: o.actual for o in outcomes} == {
            "tx": "off", "gro": "on", "gro-list": "on", "udp-gro-fwd": "on", "tx-nocache-copy": "on",
            "mtu": "9000", "txqueuelen": "500", "channels.rx": str(chans), "channels.tx": str(chans),
            "rps": f"{top:#x}", "xps.0": "0x1", "qdisc": "pfifo", "net.ipv4.tcp_rmem": "4096 65536 1048576",
            "net.core.somaxconn": "1000", "net.ipv4.ip_forward": "1"}
        assert lab_state(lab) != before
        assert len(journals(state_dir)) == 1
    assert lab_state(lab) == before
    assert journals(state_dir) == []
    assert all(line.startswith("restored ") for line in tx.restore_report.lines)


def test_tx_off_drags_tso_and_uso_with_it_and_says_so(veth, state_dir):
    lab = veth
    with Transaction() as tx:
        [o] = tx.apply([Change(lab.client, "tx", "off", None, lab)])
        assert (o.original, o.requested, o.actual, o.ok) == ("on", "off", "off", True)
        assert o.also_changed["tx-tcp-segmentation"] == ("on", "off")
        assert o.also_changed["tx-udp-segmentation"] == ("on", "off")
        assert "also changed: " in o.line() and "tx-udp-segmentation on→off" in o.line()
        # and why: the kernel drops TSO and USO without a checksum offload
        assert o.also_why["tx-tcp-segmentation"] == "needs tx-checksumming, which is off"
        assert o.also_why["tx-udp-segmentation"] == "needs tx-checksumming, which is off"
        assert "tx-udp-segmentation on→off (needs tx-checksumming, which is off)" in o.line()
        assert o.to_dict()["also_changed_why"]["tx-tcp6-segmentation"] == "needs tx-checksumming, which is off"
        took = [r for r in map(json.loads, tx.journal.path.read_text().splitlines()) if r.get("op") == "also-changed"]
        assert took[0]["changed"]["tx-udp-segmentation"] == ["on", "off"]
        assert took[0]["why"]["tx-udp-segmentation"] == "needs tx-checksumming, which is off"
        # TSO is still requested on; the kernel keeps it off while tx checksumming is off
        [tso] = tx.apply([Change(lab.client, "uso", "on", None, lab)])
        assert (tso.actual, tso.ok) == ("off", False)
        assert "needs tx (tx-checksumming)" in tso.reason and "cannot test uso=on here" in tso.reason
        assert tx.impossible == [tso]
        [back] = tx.apply([Change(lab.client, "tx", "on", None, lab)])
        assert back.also_changed["tx-udp-segmentation"] == ("off", "on")
        assert back.also_why["tx-udp-segmentation"] == "needs tx-checksumming, which is on again"
    feats = json.loads(lab.client.run(["ethtool", "--json", "-k", lab.resolve_iface("client")]).stdout)[0]
    assert feats["tx-udp-segmentation"]["active"] and feats["tx-tcp-segmentation"]["active"]


def test_fixed_feature_is_cannot_test_here_and_nothing_is_journalled(veth, state_dir):
    lab = veth
    before = lab_state(lab)
    with Transaction() as tx:
        [lro, already] = tx.apply([Change(lab.client, "lro", "on", None, lab),
                                   Change(lab.client, "lro", "off", None, lab)])
        assert (lro.ok, lro.actual) == (False, "off [fixed]")
        assert "[fixed]" in lro.reason and "cannot test lro=on here" in lro.reason
        assert already.ok and already.actual == "off [fixed]"
        assert list_pending() == []
    assert lab_state(lab) == before


def test_persisted_transaction_is_still_restored_when_its_block_fails(veth, state_dir):
    lab = veth
    before = lab_state(lab)
    with pytest.raises(RuntimeError):
        with Transaction(persist=True) as tx:
            tx.apply([Change(lab.client, "gro", "on", None, lab), Change(lab.client, "mtu", 4000, None, lab)])
            raise RuntimeError("the cell failed")
    assert lab_state(lab) == before
    assert journals(state_dir) == []


def test_ring_and_coalesce_on_veth_say_clearly_that_veth_has_none(veth, state_dir):
    lab = veth
    iface = lab.resolve_iface("client")
    with Transaction() as tx:
        ring, coal, comb = tx.apply([Change(lab.client, "ring.rx", 512, None, lab),
                                     Change(lab.client, "coalesce.rx-usecs", 10, None, lab),
                                     Change(lab.client, "channels.combined", 1, None, lab)])
    assert ring.reason.startswith(f"veth {iface} has no ring parameters (ethtool -g: Operation not supported)")
    assert coal.reason.startswith(f"veth {iface} has no coalescing parameters (ethtool -c: Operation not supported)")
    assert comb.reason.startswith(f"veth {iface} has no channels.combined (ethtool -l shows n/a)")
    assert not (ring.ok or coal.ok or comb.ok)


def test_qdisc_unknown_to_kernel_is_refused_and_configured_root_is_rebuilt_with_its_handle(veth, state_dir):
    lab, c = veth, veth.client
    iface = lab.resolve_iface("client")
    before = lab_state(lab)
    with Transaction() as outer:
        outer.apply([Change(c, "qdisc", "bfifo limit 30000", None, lab)])
        configured = json.loads(c.run(["tc", "-j", "qdisc", "show", "dev", iface]).stdout)
        with Transaction() as inner:
            [o] = inner.apply([Change(c, "qdisc", "pfifo_fast", None, lab)])
            assert (o.original, o.actual) == ("bfifo", "pfifo_fast")
            [bad] = inner.apply([Change(c, "qdisc", "nosuchq", None, lab)])
            assert not bad.ok and "unknown" in bad.reason
        assert json.loads(c.run(["tc", "-j", "qdisc", "show", "dev", iface]).stdout) == configured
    assert lab_state(lab) == before


def test_host_wide_sysctl_is_refused_in_a_lab_host_and_restored_exactly_on_the_machine(veth, state_dir):
    lab = veth
    for key in ("net.core.netdev_budget", "net.core.rmem_max", "vm.swappiness"):
        with pytest.raises(BadInput, match="host-wide"):
            with Transaction() as tx:
                tx.apply([Change(lab.client, key, 1000, None, lab)])
    path = "/proc/sys/net/core/netdev_budget"
    original = LOCAL.read(path)
    with Transaction() as tx:
        [o] = tx.apply([Change(LOCAL, "net.core.netdev_budget", int(original) + 1)])
        assert o.ok and LOCAL.read(path).strip() == str(int(original) + 1)
        assert o.where == "machine"
    assert LOCAL.read(path) == original
    assert journals(state_dir) == []


def test_bridge_mtu_follows_its_ports_and_nf_call_is_per_bridge(lab_name, clean_machine, state_dir):
    lab = labs.up("bridge", lab_name)
    try:
        sw = lab.host("switch")
        ports = [i.name for i in lab.entry("switch").interfaces if i.kind == "veth"]
        before = lab_state(lab)
        with pytest.raises(BadInput, match=r"switch:br0 mtu: 9000 is more than its port .* carries \(1500\)"):
            with Transaction() as tx:
                tx.apply([Change(sw, "mtu", 9000, "br0", lab)])
        with pytest.raises(BadInput, match="is not a bridge"):
            with Transaction() as tx:
                tx.apply([Change(sw, "nf_call_iptables", "on", ports[0], lab)])
        with Transaction() as tx:
            first, second, nf = tx.apply([Change(sw, "mtu", 9000, ports[0], lab),
                                          Change(sw, "mtu", 9000, ports[1], lab),
                                          Change(sw, "nf_call_iptables", "on", "br0", lab)])
            assert first.also_changed == {}
            assert second.also_changed == {"br0 mtu": ("1500", "9000")}
            assert nf.ok and sw.read("/sys/class/net/br0/bridge/nf_call_iptables").strip() == "1"
        assert lab_state(lab) == before
    finally:
        teardown.down(lab_name)


def test_vxlan_mtu_rules_refuse_before_anything_changes_and_tnl_seg_is_fixed(lab_name, clean_machine, state_dir):
    lab = labs.up("vxlan", lab_name)
    try:
        hv = lab.host("hv1")
        before = lab_state(lab)
        bad = [
            ([Change(hv, "gro", "on", "u0", lab), Change(hv, "mtu", 1501, "vxlan0", lab)],
             r"hv1:vxlan0 mtu: 1501 does not fit the VXLAN underlay u0 \(MTU 1550 − 50 = 1500\)"),
            ([Change(hv, "mtu", 1540, "u0", lab)], r"too small for the VXLAN device vxlan0"),
            ([Change(hv, "mtu", 9000, "vxlan0", lab), Change(hv, "mtu", 9050, "u0", lab)], r"raise u0 first"),
        ]
        for changes, message in bad:
            with pytest.raises(BadInput, match=message):
                with Transaction() as tx:
                    tx.apply(changes)
            assert lab_state(lab) == before
        with Transaction() as tx:
            up, over, tnl = tx.apply([Change(hv, "mtu", 9050, "u0", lab), Change(hv, "mtu", 9000, "vxlan0", lab),
                                      Change(hv, "tnl-seg", "on", "vxlan0", lab)])
            assert up.ok and over.ok
            # seed 003: tx-udp_tnl-segmentation: off [fixed]
            assert (tnl.ok, tnl.actual) == (False, "off [fixed]")
            assert tx.impossible == [tnl] and "cannot test tnl-seg=on here" in tnl.reason
        assert lab_state(lab) == before
    finally:
        teardown.down(lab_name)


def test_ovs_port_mtu_goes_through_mtu_request_and_comes_back(lab_name, clean_machine, state_dir):
    lab = labs.up("ovs", lab_name)
    try:
        sw = lab.host("switch")
        port = next(i.name for i in lab.entry("switch").interfaces if i.kind == "veth")
        request = vsctl_for(lab, "get", "Interface", port, "mtu_request").strip()
        before = lab_state(lab)
        with Transaction() as tx:
            [o] = tx.apply([Change(sw, "mtu", 9000, port, lab)])
            assert o.ok and o.actual == "9000"
            assert vsctl_for(lab, "get", "Interface", port, "mtu_request").strip() == "9000"
        assert vsctl_for(lab, "get", "Interface", port, "mtu_request").strip() == request
        assert lab_state(lab) == before
    finally:
        teardown.down(lab_name)


HOSTILE = ["eth0;rm -rf /", "$(reboot)", "a" * 16, "ëth0", "`id`", "to-server;id"]


@pytest.mark.parametrize("change, message", [
    (lambda lab: Change(lab.client, "grp", "on", None, lab), r"unknown feature 'grp'.*did you mean .*gro"),
    (lambda lab: Change(lab.client, "gro", 5, None, lab), r"gro: expected on or off, got 5"),
    (lambda lab: Change(lab.client, "mtu", "big", None, lab), r"mtu: expected an integer, got 'big'"),
    (lambda lab: Change(lab.client, "mtu", "9000;reboot", None, lab), r"expected an integer"),
    (lambda lab: Change(lab.client, "rps", "$(reboot)", None, lab), r"expected a hex CPU mask"),
    (lambda lab: Change(lab.client, "rps", "ffff", None, lab), r"names CPUs this machine does not have"),
    (lambda lab: Change(lab.client, "qdisc", "fq; rm -rf /", None, lab), r"invalid qdisc"),
    (lambda lab: Change(lab.client, "net.ipv4.ip_forward", "1;reboot", None, lab), r"expected 1 integer"),
    (lambda lab: Change(lab.client, "net.ipv4.tcp_congestion_control", "$(reboot)", None, lab), r"refusing value"),
    (lambda lab: Change(lab.client, "net.core.$(reboot)", 1, None, lab), r"invalid setting name"),
    (lambda lab: Change(lab.client, "gro", "on", "nosuch0", lab), r"no interface 'nosuch0'"),
    (lambda lab: Change(lab.client, "gro", "on", "to-nowhere", lab), r"has no interface 'to-nowhere'"),
    (lambda lab: Change(lab.client, "channels.rx", 4096, None, lab), r"more than .* allows \(maximum"),
    *[(lambda lab, n=n: Change(lab.client, "gro", "on", n, lab), r"invalid interface name") for n in HOSTILE],
])
def test_bad_input_names_the_problem_and_changes_nothing(veth, state_dir, change, message):
    before = lab_state(veth)
    good = Change(veth.client, "gro", "on", None, veth)
    with pytest.raises(BadInput, match=message) as err:
        with Transaction() as tx:
            tx.apply([good, change(veth)])
    assert "\n" not in str(err.value)
    assert lab_state(veth) == before
    assert journals(state_dir) == []


def test_lab_set_persists_until_restore_and_lab_show_lists_it(veth, state_dir):
    lab = veth
    before = lab_state(lab)
    res = offlab_cli("lab", "set", lab.name, "client", "to-server", "gro=on", "mtu=9000", "qdisc=pfifo_fast")
    assert res.returncode == 0, res.stderr
    assert re.search(r"client:\S+ gro: off → on", res.stdout)
    res = offlab_cli("lab", "set", lab.name, "server", "-", "net.ipv4.ip_forward=1")
    assert res.returncode == 0, res.stderr
    shown = json.loads(offlab_in_process("lab", "show", lab.name, "--json").stdout)
    assert {(c["host"], c["key"], c["value"], c["original"]) for c in shown["changes"]} == {
        ("client", "gro", "on", "off"), ("client", "mtu", "9000", "1500"),
        ("client", "qdisc", "pfifo_fast", "noqueue"), ("server", "net.ipv4.ip_forward", "1", "0")}
    assert "journalled: client:" in offlab_in_process("lab", "show", lab.name).stdout
    listed = offlab_in_process("restore", "--list")
    assert listed.returncode == 0 and listed.stdout.count("would restore") == 4
    assert lab_state(lab) != before
    res = offlab_in_process("restore")
    assert res.returncode == 0 and res.stdout.count("restored ") == 4, res.stdout + res.stderr
    assert lab_state(lab) == before
    assert journals(state_dir) == []
    assert offlab_in_process("restore").stdout.strip() == "nothing to restore"  # idempotent


def test_lab_set_bad_input_is_one_line_exit_2_and_impossible_is_exit_3(veth, state_dir):
    lab = veth
    before = lab_state(lab)
    for args, message in [
        (("client", "to-server", "grp=off"), "unknown feature 'grp'"),
        (("nohost", "x", "gro=on"), "has no host 'nohost'"),
        (("client", "eth0;rm -rf /", "gro=on"), "invalid interface name"),
        (("client", "to-server", "mtu=abc"), "mtu: expected an integer"),
        (("client", "-", "net.core.netdev_budget=600"), "host-wide"),
        (("client", "to-server", "gro"), "write KEY=VALUE"),
    ]:
        res = offlab_in_process("lab", "set", lab.name, *args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    res = offlab_in_process("lab", "set", lab.name, "client", "to-server", "ring.rx=256")
    assert res.returncode == 3 and "has no ring parameters (ethtool -g: Operation not supported)" in res.stdout
    assert lab_state(lab) == before
    assert journals(state_dir) == []


def test_lab_down_drops_the_journal_entries_of_its_namespaces(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        with Transaction(persist=True) as tx:
            tx.apply([Change(lab.client, "gro", "on", None, lab)])
        assert len(list_pending(lab.namespaces)) == 1
        res = offlab_in_process("lab", "down", lab_name)  # the cli wires knobs' hook into `lab down`
    finally:
        teardown.down(lab_name)
    assert res.returncode == 0 and "journalled setting" in res.stdout, res.stderr
    assert journals(state_dir) == []


def test_entry_whose_namespace_is_gone_is_dropped_with_a_note(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        with Transaction(persist=True) as tx:
            tx.apply([Change(lab.server, "gro", "on", None, lab)])
        LOCAL.run(["ip", "netns", "del", lab.entry("server").netns])
        assert any("namespace gone" in line for line in restore_pending(list_only=True))
        lines = restore_pending()
        assert any("namespace gone: nothing to restore" in line for line in lines)
        assert journals(state_dir) == []
        assert restore_pending() == ["nothing to restore"]
    finally:
        teardown.down(lab_name)


def test_an_xps_queue_that_a_channels_change_of_the_same_cell_brings_is_set_after_it(veth, state_dir):
    """virtio-tuning's q2-xps after its 1-queue-in-use cell: tx-1 exists only once channels go to 2."""
    lab, c = veth, veth.client
    if possible_cpus() < 2:
        pytest.skip("a veth gets one tx queue per possible CPU: this machine has one")
    iface = lab.resolve_iface("client", "to-server")
    queues = lambda: c.run(["ls", f"/sys/class/net/{iface}/queues"]).stdout.split()  # noqa: E731
    assert "tx-1" not in queues()  # a veth starts with one tx queue in use
    with Transaction() as tx:
        [alone] = tx.apply([Change(c, "xps.1", "1", "to-server", lab)])
        assert not alone.ok and "has no queue tx-1 now" in alone.reason and not alone.journalled
        chans, xps = tx.switch([Change(c, "channels.tx", 2, "to-server", lab), Change(c, "xps.1", "1", "to-server", lab)])
        assert (chans.ok, xps.ok, xps.actual) == (True, True, "0x1") and "tx-1" in queues()
    assert "tx-1" not in queues()
    with pytest.raises(BadInput, match="queue number must be an integer"):
        with Transaction() as tx:
            tx.apply([Change(c, "xps.x", "1", "to-server", lab)])
