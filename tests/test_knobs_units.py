"""Knob parts that need no namespace: names, parsers, journal format, validation of hostile input."""

from __future__ import annotations

import os

import pytest

from offlab import netdev
from offlab.errors import BadInput
from offlab.knobs import journal
from offlab.knobs.base import Plan
from offlab.knobs.features import resolve, state
from offlab.knobs.link import Mtu
from offlab.knobs.registry import knob_class, knob_from_entry
from offlab.knobs.sysctl import sysctl_path
from offlab.knobs.target import Target, check_netns
from offlab.netdev import Feature, Limit, parse_coalesce, parse_features, parse_limits

# What `ethtool -k` prints for a veth here (abridged): group headers (tx-checksumming, ...) have their
# members indented below them; single-feature legacy names (generic-receive-offload = rx-gro) carry
# the state themselves.
VETH_K = """Features for olx0:
tx-checksumming: on
\ttx-checksum-ipv4: off [fixed]
\ttx-checksum-ip-generic: on
\ttx-checksum-sctp: on
tcp-segmentation-offload: on
\ttx-tcp-segmentation: on
\ttx-tcp6-segmentation: off [requested on]
generic-receive-offload: off
large-receive-offload: off [fixed]
tx-udp-segmentation: on
tx-udp_tnl-segmentation: on
rx-gro-list: off
rx-udp-gro-forwarding: off
"""


def veth_leaves() -> dict[str, Feature]:
    from offlab.knobs.features import LONG_TO_KERNEL

    feats = parse_features(VETH_K)
    return {LONG_TO_KERNEL.get(n, n): f for n, f in feats.items() if f.requested is not None}


def test_ethtool_text_tells_groups_from_leaves_and_keeps_the_requested_bit():
    feats = parse_features(VETH_K)
    assert feats["tx-checksumming"] == Feature(True, False, None)  # a group: no bit of its own
    assert feats["tx-checksum-ipv4"] == Feature(False, True, False)
    assert feats["tx-tcp6-segmentation"] == Feature(False, False, True)  # [requested on]
    assert feats["generic-receive-offload"] == Feature(False, False, False)
    assert feats["rx-udp-gro-forwarding"].requested is False  # last line: a leaf, not a group


@pytest.mark.parametrize("key, leaves", [
    ("gro", ["rx-gro"]),
    ("generic-receive-offload", ["rx-gro"]),
    ("rx-gro", ["rx-gro"]),
    ("lro", ["rx-lro"]),
    ("uso", ["tx-udp-segmentation"]),
    ("udp-gro-fwd", ["rx-udp-gro-forwarding"]),
    ("gro-list", ["rx-gro-list"]),
    ("tnl-seg", ["tx-udp_tnl-segmentation"]),
    ("tso", ["tx-tcp-segmentation", "tx-tcp6-segmentation"]),
    ("tx", ["tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-sctp"]),
    ("tx-checksumming", ["tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-sctp"]),
])
def test_short_long_and_kernel_feature_names_resolve_to_kernel_features(key, leaves):
    assert resolve(key, veth_leaves(), "client:olx0") == leaves


def test_unknown_feature_suggests_the_closest_names():
    with pytest.raises(BadInput, match=r"unknown feature 'grp' on client:olx0; did you mean .*gro"):
        resolve("grp", veth_leaves(), "client:olx0")
    with pytest.raises(BadInput, match=r"did you mean .*tx-udp-segmentation"):
        resolve("tx-udp-segmentaton", veth_leaves(), "client:olx0")


def test_group_state_ignores_fixed_members_and_says_mixed():
    snap = {"a": [True, True, False], "b": [False, False, True], "c": [True, True, False]}
    assert state(list(snap), snap) == "on"
    snap["c"] = [False, True, False]
    assert state(list(snap), snap) == "mixed (a on, c off)"


def test_ethtool_channel_and_ring_output_is_parsed():
    text = ("Ring parameters for eth0:\nPre-set maximums:\nRX:\t\t4096\nRX Mini:\tn/a\nRX Jumbo:\tn/a\n"
            "TX:\t\t4096\nCurrent hardware settings:\nRX:\t\t256\nRX Mini:\tn/a\nRX Jumbo:\tn/a\n"
            "TX:\t\t512\nRX Buf Len:\t\tn/a\n")
    s = parse_limits(text)
    assert s["rx"] == Limit(256, 4096) and s["tx"] == Limit(512, 4096) and s["rx-mini"] == Limit(None, None)


def test_ethtool_coalesce_output_is_parsed_with_ethtool_C_names():
    text = ("Coalesce parameters for eth0:\nAdaptive RX: on  TX: off\nstats-block-usecs: n/a\n\n"
            "rx-usecs: 3\nrx-frames: n/a\n\ntx-usecs: 8\nCQE mode RX: n/a  TX: n/a\n")
    c = parse_coalesce(text)
    assert c.modes["adaptive-rx"] == "on" and c.modes["adaptive-tx"] == "off"
    assert c.values["rx-usecs"] == 3 and c.values["tx-usecs"] == 8 and c.values["rx-frames"] is None
    assert c.modes["cqe-mode-rx"] == "n/a"
    assert (c.text("rx-usecs"), c.text("rx-frames"), c.text("adaptive-tx")) == ("3", "n/a", "off")


@pytest.mark.parametrize("key, cls", [
    ("mtu", "Mtu"), ("txqueuelen", "TxQueueLen"), ("channels.combined", "Channels"), ("ring.rx", "Ring"),
    ("coalesce.rx-usecs", "Coalesce"), ("rps", "QueueMask"), ("xps.1", "QueueMask"), ("qdisc", "Qdisc"),
    ("nf_call_iptables", "BridgeNf"), ("net.core.netdev_budget", "Sysctl"), ("vm.swappiness", "Sysctl"),
    ("gro", "Feature"), ("tx-udp-segmentation", "Feature"),
])
def test_each_key_names_its_knob(key, cls):
    assert knob_class(key).__name__ == cls


def test_sysctl_names_cannot_escape_proc_sys():
    assert sysctl_path("net.ipv4.conf.eth0/100.rp_filter") == "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"
    for bad in ("net.ipv4.conf.//.x", "net.core.$(reboot)", "net.core.a;b", "fs.file-max", "net..x", "net"):
        with pytest.raises(BadInput):
            sysctl_path(bad)


@pytest.mark.parametrize("name", ["eth0;rm -rf /", "$(reboot)", "a" * 16, "ëth0", "a b", "", "..", "x\n"])
def test_hostile_interface_names_are_refused(name):
    with pytest.raises(BadInput):
        Target(None, name)


@pytest.mark.parametrize("name", ["ol-x;reboot", "$(reboot)", "../../etc", "", "a" * 65])
def test_hostile_namespace_names_are_refused(name):
    with pytest.raises(BadInput):
        check_netns(name)


class FakePlan(Plan):
    def __init__(self, links: dict[str, netdev.Link]) -> None:
        super().__init__()
        self._links = {Target(None).host_key: links}  # this machine's links, as the plan keys them


def vxlan_links(v6: bool) -> dict[str, netdev.Link]:
    data = {"link": "u0", **({"local6": "fd00::1"} if v6 else {"local": "10.0.0.1"})}
    return {
        "u0": netdev.Link("u0", mtu=1570, min_mtu=68, max_mtu=65535),
        "vxlan0": netdev.Link("vxlan0", mtu=1500, min_mtu=68, max_mtu=65535, kind="vxlan", info_data=data),
    }


@pytest.mark.parametrize("v6, largest", [(False, 1520), (True, 1500)])
def test_vxlan_mtu_leaves_50_bytes_for_ipv4_and_70_for_ipv6(v6, largest):
    knob = Mtu(Target(None, "vxlan0"), "mtu")
    assert knob.check(largest, FakePlan(vxlan_links(v6))) == str(largest)
    with pytest.raises(BadInput, match="does not fit the VXLAN underlay u0"):
        knob.check(largest + 1, FakePlan(vxlan_links(v6)))


def test_mtu_rules_see_earlier_changes_of_the_same_batch():
    plan = FakePlan(vxlan_links(False))
    Mtu(Target(None, "u0"), "mtu").check(9050, plan)
    assert Mtu(Target(None, "vxlan0"), "mtu").check(9000, plan) == "9000"


@pytest.mark.parametrize("value", ["abc", "9000;reboot", "$(reboot)", 9000.5, True, None, "-1", 67, 65536])
def test_mtu_values_of_the_wrong_type_or_range_are_refused(value):
    with pytest.raises(BadInput, match="mtu"):
        Mtu(Target(None, "u0"), "mtu").check(value, FakePlan(vxlan_links(False)))


def test_journal_ignores_a_torn_last_line_and_detects_pid_reuse(state_dir):
    j = journal.Journal.create("unit", persist=False)
    j.add({"kind": "mtu", "key": "mtu", "netns": None, "iface": "lo"}, {"mtu": 65536}, "65536", "1500")
    with open(j.path, "a") as f:
        f.write('{"op": "change", "seq": 2, "kind": "mt')  # the process died mid-write
    view = journal.load(j.path)
    assert [e.seq for e in view.open_entries] == [1]
    assert view.problems and view.alive
    assert "journal" in j.path.name and j.path.parent == state_dir / "journal"
    header = dict(view.header, owner={"pid": os.getpid(), "start": view.header["owner"]["start"] + 1})
    assert not journal.owner_alive(header["owner"])  # same pid, other start time: a reused pid
    j.path.unlink()


def test_a_journal_entry_carries_everything_restore_needs():
    entry = {"kind": "mtu", "key": "mtu", "netns": "ol-x-switch", "iface": "olx1",
             "ovs_rundir": "/run/offlab/ovs/x", "lab": "x", "role": "switch"}
    knob = knob_from_entry(entry)
    assert knob.target.netns == "ol-x-switch" and knob.target.ovs_rundir == "/run/offlab/ovs/x"
    with pytest.raises(BadInput):
        knob_from_entry({**entry, "kind": "feature"})  # a key that does not match its kind
    with pytest.raises(BadInput):
        knob_from_entry({**entry, "iface": "x;reboot"})
