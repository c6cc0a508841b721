"""Parsers and derived metrics on real captured outputs (tests/fixtures) and hand-checkable numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.netdev import parse_softnet
from offlab.probes import counters, cpu, parse_net_dev, service_demand
from offlab.probes.capture import read_pcap, summarize
from offlab.traffic import Workload
from offlab.traffic import iperf3
from offlab.errors import BadInput

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> dict:
    return json.loads((FIX / "iperf3" / name).read_text())


def test_iperf3_udp_reads_the_receivers_bytes_and_loss():
    r = iperf3.parse(load("udp_client_server_output.json"), Workload(protocol="udp", size=1472))
    assert r.throughput_bps == pytest.approx(4106564638.92, rel=1e-9)  # sum_received, not sum_sent
    assert r.datagrams_received == 360522 - 11766
    assert r.loss == pytest.approx(11766 / 360522)
    assert r.jitter_us == pytest.approx(4.1758, rel=1e-3)
    assert r.pps == pytest.approx((360522 - 11766) / 1.000094)


def test_iperf3_tcp_reads_retransmits_and_received_rate():
    r = iperf3.parse(load("tcp_client.json"), Workload(protocol="tcp"))
    assert r.retransmits == 3039
    assert r.throughput_bps == pytest.approx(10825355368.5, rel=1e-9)
    assert r.loss is None


def test_iperf3_error_becomes_a_clear_failure():
    with pytest.raises(iperf3.TrafficFailed, match="Connection refused"):
        iperf3.parse(load("connection_refused.json"), Workload())


def test_iperf3_argv_carries_warmup_rate_length_streams():
    argv = iperf3.client_argv(Workload(protocol="udp", size=1472, rate="1G", streams=2, warmup=1, duration=2),
                              "10.200.1.2", 5201)
    assert argv[argv.index("-t") + 1] == "2"
    assert argv[:5] == ["iperf3", "-c", "10.200.1.2", "-p", "5201"]
    assert ["-O", "1"] == argv[argv.index("-O"):argv.index("-O") + 2]
    # iperf3 gets the bit rate as a number: a rate it cannot read would silently mean "unlimited"
    assert "-u" in argv and argv[argv.index("-b") + 1] == "1000000000" and argv[argv.index("-l") + 1] == "1472"
    assert argv[argv.index("-P") + 1] == "2"


def test_proc_stat_split_of_one_cpu():
    before = {"user": 100, "nice": 0, "system": 200, "idle": 600, "iowait": 0, "irq": 0, "softirq": 100,
              "steal": 0, "guest": 0, "guest_nice": 0}
    after = dict(before, user=110, system=240, idle=630, softirq=120)  # +10 +40 +30 +20 = 100 ticks
    split = cpu.cpu_split(before, after).to_json()
    assert split == {"user": 10.0, "system": 40.0, "softirq": 20.0, "irq": 0.0, "idle": 30.0, "steal": 0.0, "busy": 70.0}


def test_proc_stat_fixture_has_every_cpu():
    cpus = cpu.parse_proc_stat((FIX / "proc" / "stat").read_text())
    assert set(cpus) == {"cpu0", "cpu1"}
    assert all(c["idle"] > 0 for c in cpus.values())


def test_pid_stat_with_spaces_and_parens_in_comm():
    text = "1234 (my (odd) proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 5 0 0"
    assert cpu.parse_pid_stat(text) == ("my (odd) proc", 250, 75)


def test_snmp_fixture_keeps_the_counters_that_explain_loss():
    snmp = counters.parse_snmp((FIX / "proc" / "snmp_server").read_text())
    assert {"InDatagrams", "RcvbufErrors"} <= set(snmp["Udp"])
    assert snmp["Udp"]["InDatagrams"] > 0
    assert "RetransSegs" in snmp["Tcp"] and "ReasmOKs" in snmp["Ip"]
    assert snmp["Ip"]["ReasmOKs"] > 0  # the 65507-byte datagrams were reassembled on the server


def test_netstat_gives_the_receive_queue_prune_counters_and_a_moved_one_is_flagged():
    text = (FIX / "proc" / "snmp_server").read_text() + (FIX / "proc" / "netstat_host").read_text()
    snmp = counters.parse_snmp(text)
    assert set(counters.SNMP_KEEP["TcpExt"]) <= set(snmp["TcpExt"]) and "Udp" in snmp
    assert counters.rcvq_pruned(counters.delta(snmp, snmp)) == {}
    # a guest receiving DPDK GRO's merged frames with the default tcp_rmem (notes/dpdk.md §6)
    moved = {"TcpExt": {"PruneCalled": 106, "RcvPruned": 37, "TCPRcvCollapsed": 20680, "TCPRcvQDrop": 22}}
    assert counters.rcvq_pruned(moved) == {"PruneCalled": 106, "RcvPruned": 37, "TCPRcvCollapsed": 20680}
    assert counters.rcvq_pruned({"Tcp": {"InSegs": 5}}) == {}


def test_softnet_fixture_per_cpu():
    rows = parse_softnet((FIX / "proc" / "softnet_stat").read_text())
    assert [r.cpu for r in rows] == [0, 1]
    assert all(r.processed > 0 for r in rows)
    assert [r.backlog for r in rows] == [0, 0]


def test_what_is_on_its_way_is_read_at_each_edge_from_the_backlogs_and_the_receive_queues():
    # captured on this machine (2026-11-30): during a UDP flood pinned beside CPU hogs on CPU 1, one packet
    # waiting in CPU 1's input queue (softnet_stat's column 12; 14 and 15 split it into input and process
    # queues); and a server namespace's /proc/net/udp with 5 datagrams of 1200 bytes unread on a socket
    # (0x2D00 = 11520 bytes: 2304 of truesize each), its udp6 with an idle one
    from offlab.probes.edge.in_flight import Edges, InFlightProbe, in_flight, receive_queue_bytes

    rows = parse_softnet((FIX / "proc" / "softnet_stat_backlog").read_text())
    assert [(r.cpu, r.backlog, r.dropped) for r in rows] == [(0, 0, 0), (1, 1, 362)]
    assert [r.backlog for r in parse_softnet((FIX / "proc" / "softnet_stat").read_text())] == [0, 0]
    assert receive_queue_bytes((FIX / "proc" / "net_udp_queued").read_text()) == 11520
    assert receive_queue_bytes((FIX / "proc" / "net_udp6_idle").read_text()) == 0
    start = {"backlog:cpu0": 0, "backlog:cpu1": 0, "rcvq:server": 0, "rcvq:client": None}
    end = {"backlog:cpu0": 0, "backlog:cpu1": 1, "rcvq:server": 11520, "rcvq:client": None}
    d = InFlightProbe.delta(None, start, end)
    assert d == {"backlog:cpu0": {"start": 0, "end": 0}, "backlog:cpu1": {"start": 0, "end": 1},
                 "rcvq:server": {"start": 0, "end": 11520}}  # a host not read is left out
    gauges = {k: Edges.from_json(v) for k, v in d.items()}
    assert in_flight(gauges, "server", 1200) == 1 + 9  # at most 9 of 1200 bytes in 11520 (5 in truth)
    assert in_flight(gauges, "server", 0) == 1  # no payload size: the backlog only
    assert in_flight({}, "server", 1200) is None  # a sample stored before the probe
    old = parse_softnet("015c4470 00000000 00000003 00000000 00000000 00000000 00000000 00000000 00000000 "
                        "00000000 00000000\n")  # a kernel before 5.10: 11 columns, no backlog
    assert old[0].backlog is None and InFlightProbe.delta(None, {"backlog:cpu0": None}, {"backlog:cpu0": None}) is None


def test_net_dev_fixture_and_average_packet_size():
    dev = parse_net_dev((FIX / "proc" / "net_dev_server").read_text())
    assert "lo" in dev and any(name.startswith("olfx") for name in dev)
    d = {"rx_bytes": 6_400_000, "rx_packets": 100, "tx_bytes": 0, "tx_packets": 0}
    assert counters.average_sizes(d) == {"rx_avg_bytes": 64000.0, "tx_avg_bytes": None}


def test_service_demand_is_cpu_microseconds_per_kib():
    # 50 % of one CPU for 2 s = 1e6 µs; 1e6 µs over 10 000 KiB = 100 µs/KiB.
    assert service_demand(50.0, 2.0, 10_000) == pytest.approx(100.0)
    assert service_demand(50.0, 2.0, 0) is None


def test_capture_of_65507_byte_datagrams_at_mtu_1500_counts_45_fragments_each():
    linktype, frames = read_pcap(FIX / "pcap" / "udp_1500.pcap")
    s = summarize(frames, host="server", iface="olfx1", mtu=1500, linktype=linktype)
    assert s.fragments_per_datagram == 45  # 65515 bytes of IP payload / 1480 per fragment → 45
    assert s.largest_frame == 1514 and s.over_mtu_frames == 0
    # 3 datagrams of 65507 bytes, 3 × 45 fragments minus the 18 the capture cut off at its start.
    assert s.udp_payload_sizes == {65507: 3} and (s.fragmented_datagrams, s.ip_fragments) == (3, 117)
    assert "45 IP fragments each" in s.verdict


def test_capture_of_8972_byte_datagrams_at_mtu_9000_has_no_fragments():
    linktype, frames = read_pcap(FIX / "pcap" / "udp_9000.pcap")
    s = summarize(frames, host="server", iface="olfx1", mtu=9000, linktype=linktype)
    assert s.ip_fragments == 0 and s.largest_frame == 9014
    assert set(s.udp_payload_sizes) == {8972}
    assert s.verdict.startswith("no IP fragments, every frame ≤ 9014 bytes")


def test_iperf3_whole_seconds_are_rounded_up_and_recorded():
    w = Workload(tool="iperf3", duration=1.2, warmup=0.3).check()
    assert (w.duration, w.warmup) == (2.0, 1.0)
    argv = iperf3.client_argv(w, "10.200.1.2", 5201)
    assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-O") + 1] == "1"


@pytest.mark.parametrize("kwargs, needle", [
    (dict(protocol="udp", size=65508), "--size 65508: a UDP payload for iperf3 is 16..65507"),
    (dict(protocol="udp", size=65508, ipv6=True), "16..65507"),  # iperf3 3.12's own limit, IPv6 too
    (dict(tool="engine", protocol="udp", size=65528, ipv6=True), "24..65527"),
    (dict(tool="engine", protocol="udp", size=20), "24..65507"),  # the engine's header is 24 bytes
    (dict(tool="engine", protocol="tcp"), "UDP only"),
    (dict(tool="iperf3", protocol="udp", gso=True), "--gso: needs tool engine"),
    (dict(tool="iperf3", rate="100kpps"), "iperf3 takes a bit rate"),
    (dict(tool="engine", protocol="udp", batch=0), "--batch 0: "),
    (dict(tool="engine", protocol="udp", batch=100000), "--batch 100000: "),
    (dict(rate="banana"), "--rate 'banana': a rate is"),
    (dict(warmup=-1), "--warmup -1"),
    (dict(duration=0), "--duration"),
    (dict(tool="ncat"), "choose iperf3 or engine"),
])
def test_workload_bad_input_names_the_option(kwargs, needle):
    with pytest.raises(BadInput, match=needle.replace("(", r"\(")):
        Workload(**kwargs).check()
