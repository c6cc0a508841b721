"""Second witnesses for headline figures (issue 15 item 5), on numbers worked out by hand.

The first case is the vxlan suite's UDP cell that printed "loss 137.537 %": iperf3 3.12 said
received −10318, while the kernel saw OutDatagrams 56319 at the client and InDatagrams 12970
at the server, with RcvbufErrors 43363.
"""

from __future__ import annotations

import pytest

from offlab.experiment import witnesses
from offlab.sample import SampleWorkload, StoredSample, Traffic


def _sample(traffic: dict, client_udp: dict, server_udp: dict, workload: dict | None = None) -> StoredSample:
    return StoredSample.from_json(_stored(traffic, client_udp, server_udp, workload))


def _stored(traffic: dict, client_udp: dict, server_udp: dict, workload: dict | None = None) -> dict:
    return {
        "traffic": {"tool": "iperf3", "throughput_bps": 1e6, **traffic},
        "workload": {"protocol": "udp", "size": 4096, "gso": False, "gro": False, **(workload or {})},
        "probes": {"window_s": 1.0, "snmp": {"client": {"Udp": client_udp}, "server": {"Udp": server_udp}},
                   "interfaces": {}, "softnet": {}},
    }


def test_impossible_tool_loss_is_replaced_by_the_kernels_witness_and_flagged():
    s = _sample({"datagrams_sent": 27497, "datagrams_received": -10318, "loss": 1.37537, "pps": -1340.0},
                {"OutDatagrams": 56319}, {"InDatagrams": 12970, "RcvbufErrors": 43363, "InErrors": 43363})
    notes = witnesses.bound(s.traffic)
    assert s.traffic.datagrams_received is None and s.traffic.pps is None
    assert any("impossible" in n for n in notes)
    check = witnesses.cross_check(s)
    assert check.status == "inconsistent"
    assert s.traffic.loss == pytest.approx((56319 - 12970) / 56319)  # 77 %
    stored = s.traffic.to_json()  # what the sample stores: the kernel's loss, named as such
    assert stored["loss_source"] == "kernel" and stored["datagrams_received"] is None


def test_loss_attribution_names_the_receive_buffer_without_double_counting_inerrors():
    s = _sample({"datagrams_sent": 100, "datagrams_received": 60, "loss": 0.4},
                {"OutDatagrams": 100}, {"InDatagrams": 60, "RcvbufErrors": 30, "InErrors": 35, "InCsumErrors": 0})
    la = witnesses.attribute_loss(s)
    assert la.lost == 40
    shares = {p.where.split(" (")[0]: p.share for p in la.places}
    assert shares == {"server Udp RcvbufErrors": 0.75, "server Udp InErrors": 0.125}
    assert la.unexplained == 5


def test_tool_and_kernel_agreeing_is_consistent():
    s = _sample({"datagrams_sent": 1000, "datagrams_received": 990, "loss": 0.01, "pps": 990.0,
                 "throughput_bps": 990 * 4096 * 8}, {"OutDatagrams": 1000}, {"InDatagrams": 985})
    assert witnesses.cross_check(s).status == "consistent"


def test_throughput_that_contradicts_pps_times_size_is_inconsistent():
    # the vxlan run's "273 Mbit/s next to 1.44 kpps" for 4096-byte datagrams (≈ 47 Mbit/s)
    s = _sample({"datagrams_sent": 1440, "datagrams_received": 1440, "loss": 0.0, "pps": 1440.0,
                 "throughput_bps": 273e6}, {"OutDatagrams": 1440}, {"InDatagrams": 1440})
    check = witnesses.cross_check(s)
    assert [c.check for c in check.checks if not c.ok] == ["throughput = pps × size"]


def test_gso_or_gro_counts_super_packets_so_the_kernel_cannot_witness_loss():
    s = _sample({"datagrams_sent": 44000, "datagrams_received": 44000, "loss": 0.0},
                {"OutDatagrams": 1000}, {"InDatagrams": 44000}, {"gso": True})
    assert witnesses.kernel_loss(s.probes, s.workload) == (None, None, None)
    assert all(c.check != "loss" for c in witnesses.cross_check(s).checks)


def test_every_displayed_metric_is_bounded_and_an_impossible_one_is_a_note_not_a_figure():
    from offlab.metrics import HEADLINE, METRICS, metrics_of

    # the vxlan run's comparison table: "pps 9223109178 Gpps" and "-1.34 kpps", a CPU above 100 %
    s = _stored({"datagrams_sent": 27497, "datagrams_received": 27000, "loss": 0.018, "pps": 9.223109178e18,
                 "throughput_bps": -1.0}, {"OutDatagrams": 27497}, {"InDatagrams": 27000})
    s["probes"]["cpu"] = {"client": {"busy": 100.4, "user": -0.5}, "server": {"busy": 40.0}}
    s["service_demand_us_per_kib"] = {"total": -3.0, "client": 2.0}
    got = metrics_of(StoredSample.from_json(s))
    assert got == {"loss": 0.018, "cpu_server_busy": 40.0, "sd_client_us_per_kib": 2.0}
    notes = witnesses.out_of_range(StoredSample.from_json(s))
    assert len(notes) == 5 and all("outside its possible range" in n for n in notes)
    assert any(n.startswith("datagrams received per second 9.22311e+18 pps") for n in notes)
    # every headline metric has a range (a rate an upper bound too, a share ≤ 100 %)
    assert all(METRICS[m].low == 0.0 for m in HEADLINE)
    assert all(METRICS[m].high is not None for m in HEADLINE if METRICS[m].unit in ("bit/s", "pps", "%", "fraction"))


def test_datagrams_that_found_no_socket_blame_the_harness_not_the_path():
    # Measured here (docs/vm.md, the USO finding): a guest sending with USO to a port where the
    # receiver had stopped — server UdpNoPorts counts one per 44-segment super-packet, the sender
    # gets ECONNREFUSED from the ICMP port-unreachable replies.
    s = _sample({"tool": "engine", "datagrams_sent": 213048, "datagrams_received": 0, "loss": 1.0,
                 "errors": {"ECONNREFUSED": 3}, "receiver_stop": "idle"},
                {"OutDatagrams": 4844}, {"InDatagrams": 0, "NoPorts": 4844}, {"gso": True, "size": 1472})
    la = witnesses.attribute_loss(s)
    assert la.lost == 213048
    assert "no socket listened" in la.receiver_absent and "harness race" in la.receiver_absent
    assert "super-packet" in la.receiver_absent and "ECONNREFUSED ×3" in la.receiver_absent
    assert "stopped on idle" in la.receiver_absent


def test_the_end_markers_own_noports_is_not_an_absent_receiver():
    s = _sample({"tool": "engine", "datagrams_sent": 1000, "datagrams_received": 990, "loss": 0.01,
                 "receiver_stop": "end"}, {"OutDatagrams": 1000}, {"InDatagrams": 990, "NoPorts": 1})
    assert witnesses.attribute_loss(s).receiver_absent is None


def test_a_sender_short_of_the_asked_rate_is_said_to_be_generator_limited():
    from offlab.experiment.witnesses import offered_short

    def short(rate: str | None, **traffic: float) -> str | None:
        return offered_short(SampleWorkload(rate=rate), Traffic(**traffic))

    note = short("100kpps", sent_pps=61_000.0)
    assert "61,000 pps of the 100,000 pps asked (39.0 % short)" in note and "generator-limited" in note
    assert "bit/s" in short("1G", sent_bps=5e8)
    # within 2 %, unlimited, or nothing sent-side measured: no note
    assert short("100kpps", sent_pps=98_500.0) is None
    assert short(None, sent_pps=10.0) is None
    assert short("0", sent_pps=10.0) is None
    assert short("1G", sent_pps=10.0) is None
