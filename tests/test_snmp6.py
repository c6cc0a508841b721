"""IPv6 traffic has its own kernel counters (/proc/net/snmp6): read, compared and used to say where
IPv6 datagrams died, as /proc/net/snmp is for IPv4 (polish item 2)."""

from __future__ import annotations

import os

import pytest

from offlab.experiment import witnesses
from offlab.sample import StoredSample
from offlab.probes.counters import SNMP6_KEEP, delta, parse_snmp6
from tests.conftest import requires_root

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "probes")


def test_snmp6_gives_udp6_and_ip6_counters_under_the_ipv4_names():
    # /proc/net/snmp6 of a lab's server namespace after an IPv6 UDP run into a 4 KiB receive buffer
    with open(os.path.join(FIX, "snmp6_server_rcvbuf.txt")) as f:
        got = parse_snmp6(f.read())
    assert set(got) == {"Udp6", "Ip6"}
    udp6 = got["Udp6"]
    assert set(udp6) == set(SNMP6_KEEP["Udp6"])
    assert udp6["RcvbufErrors"] > 0 and udp6["InErrors"] >= udp6["RcvbufErrors"] and udp6["InDatagrams"] > 0
    assert {"InDiscards", "OutDiscards", "InNoRoutes", "ReasmFails", "InReceives"} <= set(got["Ip6"])
    assert "OutMcastPkts" not in got["Ip6"] and "Icmp6" not in got  # only what explains results
    assert parse_snmp6("") == {} and parse_snmp6("Udp6InDatagrams x\nnonsense\n") == {}
    assert delta(got, got)["Udp6"]["RcvbufErrors"] == 0


def test_ipv6_loss_is_witnessed_and_attributed_with_udp6_counters():
    s = {"traffic": {"tool": "iperf3", "loss": 0.0, "datagrams_sent": 1000, "datagrams_received": 1000},
         "workload": {"protocol": "udp", "ipv6": True, "gso": False, "gro": False},
         "probes": {"window_s": 1.0, "interfaces": {}, "softnet": {}, "snmp": {
             "client": {"Udp": {"OutDatagrams": 3}, "Udp6": {"OutDatagrams": 1000}},
             "server": {"Udp": {"InDatagrams": 3}, "Udp6": {"InDatagrams": 600, "RcvbufErrors": 400,
                                                            "InErrors": 400}, "Ip6": {"InDiscards": 0}}}}}
    s = StoredSample.from_json(s)
    assert witnesses.kernel_loss(s.probes, s.workload)[0] == pytest.approx(0.4)
    assert witnesses.cross_check(s).status == "inconsistent"  # the tool said 0 %
    la = witnesses.attribute_loss(s)
    assert la is not None and la.lost_source == "client Udp6 OutDatagrams − server Udp6 InDatagrams"
    assert [(p.where, p.count) for p in la.places] == [("server Udp6 RcvbufErrors", 400)]


@requires_root
@pytest.mark.network
def test_ipv6_receive_buffer_loss_is_attributed_to_udp6_rcvbuferrors(lab_name, clean_machine):
    from offlab import lab as labs
    from offlab.experiment import teardown
    from offlab.experiment.measure import measure
    from offlab.traffic import Workload

    lab = labs.up("veth", lab_name, ipv6=True)
    try:
        s = measure(lab, Workload(tool="engine", protocol="udp", ipv6=True, size=1200, rate="60kpps",
                                  rcvbuf=4096, duration=1.0, warmup=0.3))
        snmp = s.probes.snmp
        assert snmp["server"]["Udp6"]["RcvbufErrors"] > 0 and snmp["client"]["Udp6"]["OutDatagrams"] > 1000
        assert snmp["client"]["Udp"]["OutDatagrams"] < 10  # the IPv4 counters saw none of it
        la = s.loss_attribution
        assert la is not None and la.lost_source == "client Udp6 OutDatagrams − server Udp6 InDatagrams"
        top = la.places[0]
        assert top.where == "server Udp6 RcvbufErrors" and top.share > 0.9, la.places
        assert s.consistency is not None
        (check,) = [c for c in s.consistency.checks if c.check == "loss"]
        assert check.ok and "Udp6 OutDatagrams" in check.detail, check
    finally:
        teardown.down(lab_name)
