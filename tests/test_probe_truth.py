"""Figures the probes produce, checked on numbers that can be worked out by hand (issue 15)."""

from __future__ import annotations

import os

import pytest

from offlab.hosts.local import NetnsHost, _AnchorReader
from offlab.probes import cpu
from offlab.probes.capture import read_pcap, summarize
from offlab.sample import Iface

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "pcap")


def test_steal_is_not_counted_as_busy():
    # 100 ticks: user 10, system 5, softirq 5, idle 20, steal 60 (a hypervisor ran someone else)
    before = dict.fromkeys(cpu.STAT_FIELDS, 0)
    after = {**before, "user": 10, "system": 5, "softirq": 5, "idle": 20, "steal": 60}
    split = cpu.cpu_split(before, after)
    assert split.busy == 20.0
    assert split.steal == 60.0
    assert split.idle == 20.0


def test_busy_is_user_nice_system_irq_softirq():
    before = dict.fromkeys(cpu.STAT_FIELDS, 0)
    after = {**before, "user": 10, "nice": 10, "system": 10, "irq": 10, "softirq": 10, "idle": 40, "iowait": 10}
    split = cpu.cpu_split(before, after)
    assert split.busy == 50.0
    assert split.idle == 50.0
    assert split.steal == 0.0


def test_ipv6_capture_of_65507_byte_datagrams_counts_fragments_per_datagram():
    # Captured on a veth at MTU 1500: three 65507-byte UDP datagrams sent over IPv6.
    linktype, frames = read_pcap(os.path.join(FIX, "udp6_65507_fragments.pcap"))
    s = summarize(frames, host="server", iface="zz9b", mtu=1500, linktype=linktype)
    assert s.fragmented_datagrams == 3
    assert s.ip_fragments == 138
    assert s.fragments_per_datagram == 46  # 65515 bytes of UDP in 1448-byte fragment payloads
    assert s.udp_payload_sizes == {65507: 3}
    assert "46 IP fragments each" in s.verdict
    assert "no IP fragments" not in s.verdict


def test_ratio_with_a_baseline_indistinguishable_from_zero_is_unbounded_and_has_no_verdict():
    from offlab import stats
    from offlab.report import compare

    row = compare.Row(cell="c", baseline="b", metric="throughput_bps", label="throughput", unit="bit/s",
                      better="higher", level=99.0)
    compare._fill(row, [0.0, 1.0, 0.0, 1.0], [10.0, 11.0, 10.0, 11.0], 99.0)
    assert row.ratio == 21.0
    assert row.low is None and row.high is None and row.change_low_pct is None
    assert row.verdict == stats.UNBOUNDED
    assert not row.compared
    assert any("unbounded" in f for f in row.flags)


def test_ratio_interval_never_goes_below_zero_for_a_nonnegative_metric():
    from offlab.report import compare

    row = compare.Row(cell="c", baseline="b", metric="pps", label="pps", unit="pps", better="higher", level=99.0)
    compare._fill(row, [100.0, 104.0, 98.0, 101.0], [1.0, 30.0, 0.0, 2.0], 99.0)
    assert row.low == 0.0 and row.change_low_pct == -100.0
    assert row.high is not None and row.high > row.ratio


def test_segmentation_verdict_from_packets_and_bytes_against_the_mtu():
    from offlab.experiment import witnesses
    from offlab.sample import Probes

    probes = {"interfaces": {
        # seed 000's question: 1512 packets of 63 880 B on the veth, where tcpdump on the sender is ambiguous
        "client:olv0": {"tx_packets": 1512, "tx_bytes": 1512 * 63880, "rx_packets": 3, "rx_bytes": 180},
        "server:olv1": {"rx_packets": 66000, "rx_bytes": 66000 * 1514, "tx_packets": 0, "tx_bytes": 0},
        "router:olv2": {"rx_packets": 500, "rx_bytes": 500 * 1500, "tx_packets": 0, "tx_bytes": 0}}}
    seg = {(s.interface, s.direction): s for s in witnesses.segmentation(
        Probes.from_json(probes), {"client:olv0": 1500, "server:olv1": 1500})}
    assert set(seg) == {("client:olv0", "tx"), ("server:olv1", "rx"), ("router:olv2", "rx")}  # 3 ARP/ACKs: no claim
    assert seg[("client:olv0", "tx")].line == \
        "client:olv0 tx: 1512 pkts of avg 63880 B (super-packets: not segmented on this hop)"
    assert seg[("server:olv1", "rx")].verdict == "wire-size packets (≤ MTU 1500 + 14)"  # 1514 is a full frame
    assert seg[("router:olv2", "rx")].verdict == "MTU unknown: no verdict"


@pytest.mark.network
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces")
def test_super_packets_on_a_veth_are_proven_by_counters_and_segmented_ones_are_not(veth_lab):
    from offlab.experiment.measure import measure
    from offlab.traffic import Workload

    client = f"client:{veth_lab.resolve_iface('client')}"
    big = measure(veth_lab, Workload(tool="engine", protocol="udp", size=1400, gso=True, gro=True, duration=0.6,
                                     warmup=0.2))
    seg = {(s.interface, s.direction): s for s in big.segmentation or []}
    assert seg[(client, "tx")].mtu == 1500
    assert seg[(client, "tx")].avg_bytes > 1514 * 4, seg
    assert seg[(client, "tx")].verdict == "super-packets: not segmented on this hop"
    plain = measure(veth_lab, Workload(tool="engine", protocol="udp", size=1400, duration=0.6, warmup=0.2))
    seg = {(s.interface, s.direction): s for s in plain.segmentation or []}
    assert seg[(client, "tx")].avg_bytes == pytest.approx(1442, abs=1)  # 1400 + UDP 8 + IP 20 + Ethernet 14
    assert seg[(client, "tx")].verdict == "wire-size packets (≤ MTU 1500 + 14)"


class _SlowToEnter(NetnsHost):
    """A namespace whose processes take 0.3 s to enter it, as `ip netns exec` may on a loaded machine:
    until then /proc/PID/net is the root namespace's."""

    def wrap(self, argv):
        return ["sh", "-c", 'sleep 0.3; exec "$@"', "sh", *super().wrap(argv)]


@pytest.mark.network
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces")
def test_a_counter_reader_reads_its_namespace_from_the_first_read_even_when_entering_it_is_slow(veth_lab):
    host = _SlowToEnter(veth_lab.client.netns)
    reader = _AnchorReader(host)
    try:
        dev = reader.read("dev")  # at once, as a snapshot right after opening a ProbeSession does
    finally:
        reader.close()
    names = {line.split(":")[0].strip() for line in dev.splitlines() if ":" in line}
    mine = set(host.run(["ls", "/sys/class/net"]).stdout.split())
    assert names == mine, f"read {names}, the namespace has {mine}"


def test_a_capture_that_saw_no_frame_of_traffic_that_crossed_its_interface_is_an_error_not_a_figure():
    from offlab.errors import EnvironmentProblem
    from offlab.experiment.measure import _check_capture_saw_traffic

    linktype, frames = read_pcap(os.path.join(FIX, "udp6_65507_fragments.pcap"))
    seen = summarize(frames, host="server", iface="to-switch", mtu=1500, linktype=linktype)
    empty = summarize([], host="server", iface="to-switch", mtu=1500, linktype=linktype)
    crossed = {"server:to-switch": Iface(rx_packets=912, tx_packets=40)}
    _check_capture_saw_traffic(seen, crossed)  # frames and traffic: a figure
    _check_capture_saw_traffic(empty, {"server:to-switch": Iface(rx_packets=0, tx_packets=0)})  # nothing crossed
    with pytest.raises(EnvironmentProblem, match="capture on server:to-switch saw no frame while 952 packets crossed"):
        _check_capture_saw_traffic(empty, crossed)
