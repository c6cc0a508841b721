"""Per-queue packet counters (offlab.probes.edge.queues) parsed from real `ethtool -S` output captured here.

tests/fixtures/queues/veth-napi-2q.txt: queues.SCRIPT over a veth with two receive queues receiving
through NAPI (its GRO on, the sender's TSO off; 4 iperf3 streams) and `lo` (no statistics at all)."""

from __future__ import annotations

from pathlib import Path

from offlab import netdev
from offlab.probes.edge import qdisc, queues

FIXTURES = Path(__file__).parent / "fixtures" / "queues"
PROBES = Path(__file__).parent / "fixtures" / "probes"


def test_a_veth_counts_its_napi_receive_queues_and_not_its_xdp_only_transmit_ones():
    found = queues.parse_script((FIXTURES / "veth-napi-2q.txt").read_text())
    assert list(found) == ["ldvb"]  # lo has no statistics: left out
    assert (found["ldvb"].rx, found["ldvb"].tx) == ({"0": 68939, "1": 207711}, {})
    assert found["ldvb"].as_json() == {"rx": {"0": 68939, "1": 207711}}


def test_the_names_drivers_give_their_queue_counters_are_all_read():
    text = "\n".join(["     rx_queue_0_packets: 5", "     tx_queue_1_packets: 7", "     rx-2.packets: 9",
                      "     rx3_packets: 11", "     rx_queue_0_bytes: 999", "     tx_queue_0_xdp_xmit: 4"])
    stats = netdev.parse_queue_stats(text)
    assert (stats.rx, stats.tx) == ({"0": 5, "2": 9, "3": 11}, {"1": 7})
    assert stats.as_json() == {"rx": {"0": 5, "2": 9, "3": 11}, "tx": {"1": 7}}


def test_a_driver_that_prints_its_transmit_queues_first_is_stored_in_that_order():
    """ixgbe and ice print tx_queue_N_packets before rx_queue_N_packets; the stored JSON keeps ethtool's order."""
    stats = netdev.parse_queue_stats("     tx_queue_0_packets: 3\n     tx_queue_0_bytes: 300\n"
                                     "     rx_queue_0_packets: 4\n     rx_queue_0_bytes: 400\n")
    assert (stats.rx, stats.tx, stats.first) == ({"0": 4}, {"0": 3}, "tx")
    assert list(stats.as_json()) == ["tx", "rx"]


def test_the_window_keeps_only_queues_counted_at_both_edges():
    before = {"v": netdev.QueueStats(rx={"0": 10, "1": 5})}
    after = {"v": netdev.QueueStats(rx={"0": 25, "1": 5, "2": 3}), "w": netdev.QueueStats(tx={"0": 1}, first="tx")}
    assert queues.delta(before, after) == {"v": {"rx": {"0": 15, "1": 0}}}


def test_a_multiqueue_guest_nic_counts_its_transmit_queues_in_its_mq_qdiscs_children():
    """A guest (2 vCPUs, virtio-net queues=2) after UDP sent from queue 1: the agent's rtnetlink dump and tc
    (read a moment later) give the same children, parent :2 being transmit queue 1."""
    agent = qdisc.parse_tc((PROBES / "agent-qdisc-mq-guest.json").read_text())
    tc = qdisc.parse_tc((PROBES / "tc-qdisc-mq-guest.json").read_text())
    assert agent["eth0"]["kind"] == "mq" and set(agent["eth0"]["queues"]) == {"0", "1"}
    assert agent["eth0"]["queues"]["1"] > 50000 > agent["eth0"]["queues"]["0"]
    assert set(tc["eth0"]["queues"]) == {"0", "1"} and tc["eth0"]["queues"]["1"] >= agent["eth0"]["queues"]["1"]
    assert qdisc.delta(agent, tc) == {}  # nothing was sent between the two reads
    later = {"eth0": {**agent["eth0"], "packets": agent["eth0"]["packets"] + 5,
                      "queues": {"0": agent["eth0"]["queues"]["0"] + 5, "1": agent["eth0"]["queues"]["1"]}}}
    assert qdisc.delta(agent, later)["eth0"]["queues"] == {"0": 5, "1": 0}
