"""Effect witnesses (offlab.experiment.effects) on samples measured on real labs here.

tests/fixtures/effects/*.json are `offlab measure --json` samples (their per-interval series cut):
dpdk-*: a tap-PMD dpdk lab, `lab set L switch - testpmd...` as the name says; bridge-*: a bridge lab,
the client's or server's veth set as the name says (README in the folder lists each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.experiment import effects
from offlab.experiment.effects import EXERCISED, NOT_APPLICABLE, OFF
from offlab.experiment.effects.testpmd import resegment_factor
from offlab.metrics import NOT_EXERCISED, not_exercised_by_cell
from offlab.sample import records
from tests.helpers import judge_effects

FIXTURES = Path(__file__).parent / "fixtures" / "effects"


def sample(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def client_if(s: dict) -> str:
    return next(n for n in s["probes"]["interfaces"] if n.startswith("client:"))


def one(found: list[dict], setting: str) -> dict:
    [e] = [e for e in found if e["setting"] == setting]
    return e


# ---- testpmd ---------------------------------------------------------------------------------

def test_testpmd_gro_in_io_forwarding_is_set_but_not_exercised_naming_fwd_io():
    e = one(judge_effects(sample("dpdk-io-gro"), []), "testpmd.gro")
    assert e["status"] == NOT_EXERCISED
    assert e["counters"]["out_per_in"] > 0.99 and e["counters"]["fwd"] == "io"
    assert e["cause"] == "testpmd GRO runs only in its csum forwarding engine; fwd is io"


def test_testpmd_gro_in_csum_forwarding_merges_below_the_resegmenting_factor():
    """GSO at 1414 B cuts every unmerged 1514 B frame in two: 1.99 out per in without GRO, 1.12 with it."""
    on, off = sample("dpdk-csum-gro-gso1414"), sample("dpdk-csum-gso1414")
    e = one(judge_effects(on, []), "testpmd.gro")
    assert e["status"] == EXERCISED and e["counters"]["unmerged_out_per_in"] == 2
    assert e["counters"]["out_per_in"] < 0.75 * 2
    assert not [x for x in judge_effects(off, []) if x["setting"] == "testpmd.gro"]  # off: no GRO witness
    assert one(judge_effects(off, []), "testpmd.gso")["status"] == EXERCISED  # 1.99 out per in


def test_testpmd_gro_alone_in_csum_forwarding_is_exercised_though_the_tap_refuses_merged_frames():
    """342 in, 103 sent, 130 tx errors: the tap PMD refuses every merged frame over MTU + 22 B."""
    e = one(judge_effects(sample("dpdk-csum-gro"), []), "testpmd.gro")
    assert e["status"] == EXERCISED and e["counters"]["sent_per_in"] < 0.5 and e["counters"]["tx_errors"] > 0
    assert "refused merged frames" in e["detail"]


def test_testpmd_gso_with_nothing_larger_than_segsz_is_set_but_not_exercised():
    e = one(judge_effects(sample("dpdk-csum-gso1514"), []), "testpmd.gso")
    assert e["status"] == NOT_EXERCISED and "nothing to segment" in e["cause"]
    e = one(judge_effects(sample("dpdk-io-gso1514"), []), "testpmd.gso")
    assert e["status"] == NOT_EXERCISED and e["cause"].endswith("fwd is io")


def test_gro_then_gso_back_to_the_input_size_is_not_applicable_not_an_accusation():
    s = sample("dpdk-csum-gro-gso1414")
    ports = s["probes"]["testpmd_settings"]["ports"]
    ports["1"]["gso"]["segsz"] = 1514  # GRO → GSO at 1514: the counts cannot show the merge
    s["probes"]["testpmd"]["directions"]["0>1"]["tx_packets"] = s["probes"]["testpmd"]["directions"]["0>1"]["rx_packets"]
    s["probes"]["testpmd"]["directions"]["0>1"]["out_per_in"] = 1.0
    found = judge_effects(s, [])
    assert {e["setting"]: e["status"] for e in found} == {"testpmd.gro": NOT_APPLICABLE, "testpmd.gso": NOT_APPLICABLE}


def test_resegment_factor_of_gso_and_tso():
    assert resegment_factor(1514, 1414, 0) == 2  # 1448 B payloads at 1348 B
    assert resegment_factor(1514, 1514, 0) == 1
    assert resegment_factor(1514, 0, 1400) == 2
    assert resegment_factor(1514, 0, 0) == 1


# ---- kernel segmentation ---------------------------------------------------------------------

def test_tso_on_shows_super_packets_on_the_sender_and_the_next_hop():
    s = sample("bridge-tsoon")
    e = one(judge_effects(s, [{"where": client_if(s), "key": "tso", "value": "on"}]), "tso")
    assert e["status"] == EXERCISED
    assert e["counters"]["tx_avg_bytes"] > 30000 and e["counters"]["next_hop_rx_avg_bytes"] > 30000
    assert e["counters"]["next_hop"].startswith("switch:")


def test_tso_on_with_wire_size_packets_is_set_but_not_exercised():
    """The same wire-size counters as TSO off: had TSO been on, super-packets would have crossed the veth."""
    s = sample("bridge-tsooff")
    e = one(judge_effects(s, [{"where": client_if(s), "key": "tso", "value": "on"}]), "tso")
    assert e["status"] == NOT_EXERCISED and e["counters"]["tx_avg_bytes"] < 1515
    assert one(judge_effects(s, [{"where": client_if(s), "key": "tso", "value": "off"}]), "tso")["status"] == OFF


def test_gso_without_tso_on_tcp_is_not_applicable_since_tcp_always_builds_gso():
    s = sample("bridge-tsooff")
    e = one(judge_effects(s, [{"where": client_if(s), "key": "gso", "value": "on"}]), "gso")
    assert e["status"] == NOT_APPLICABLE and "4.13" in e["cause"]


def test_paced_or_small_writes_are_not_applicable_not_an_accusation():
    s = sample("bridge-tsooff")
    s["workload"]["rate"] = "100M"
    assert one(judge_effects(s, [{"where": client_if(s), "key": "tso", "value": "on"}]), "tso")["status"] \
        == NOT_APPLICABLE
    s["workload"].update(rate=None, size=512)
    assert one(judge_effects(s, [{"where": client_if(s), "key": "tso", "value": "on"}]), "tso")["status"] \
        == NOT_APPLICABLE


def test_uso_needs_udp_segment_and_shows_super_packets_with_it():
    plain, on = sample("bridge-udp-plain"), sample("bridge-udp-usoon")
    e = one(judge_effects(plain, [{"where": client_if(plain), "key": "uso", "value": "on"}]), "uso")
    assert e["status"] == NOT_APPLICABLE and "UDP_SEGMENT" in e["cause"]
    e = one(judge_effects(on, [{"where": client_if(on), "key": "uso", "value": "on"}]), "uso")
    assert e["status"] == EXERCISED and e["counters"]["tx_avg_bytes"] > 60000
    off = sample("bridge-udp-usooff")
    e = one(judge_effects(off, [{"where": client_if(off), "key": "uso", "value": "on"}]), "uso")
    assert e["status"] == NOT_EXERCISED  # the same workload with uso off sent wire-size packets


def test_udp_segment_and_udp_gro_socket_options_count_datagrams_per_call():
    on = judge_effects(sample("bridge-udp-usoon"), [])
    assert one(on, "workload gso (UDP_SEGMENT)")["status"] == EXERCISED
    assert one(on, "workload gso (UDP_SEGMENT)")["counters"]["datagrams_per_call"] > 40  # 64 KiB / 1472 B
    assert one(on, "workload gro (UDP_GRO)")["status"] == EXERCISED
    off = judge_effects(sample("bridge-udp-usooff"), [])
    e = one(off, "workload gro (UDP_GRO)")  # wire-size datagrams into a veth with GRO off: one per receive
    assert e["status"] == NOT_EXERCISED and e["counters"]["datagrams_per_call"] < 1.5


# ---- kernel merging --------------------------------------------------------------------------

def test_gro_on_a_forwarding_hop_merges_and_on_the_server_behind_it_has_nothing_left():
    s = sample("bridge-swgroon")
    ingress = next(n for n, v in s["probes"]["interfaces"].items()
                   if n.startswith("switch:") and v["rx_packets"] > 100000)
    server = next(n for n in s["probes"]["interfaces"] if n.startswith("server:"))
    found = judge_effects(s, [{"where": ingress, "key": "gro", "value": "on"},
                                {"where": server, "key": "gro", "value": "on"}])
    sw, srv = [e for e in found if e["setting"] == "gro"]
    assert sw["status"] == EXERCISED and sw["counters"]["after_per_received"] < 0.1
    assert srv["status"] == NOT_APPLICABLE and "already merged" in srv["cause"]


def test_gro_on_a_veth_whose_peer_has_tso_on_merges_nothing():
    s = sample("bridge-groon")
    server = next(n for n in s["probes"]["interfaces"] if n.startswith("server:"))
    e = one(judge_effects(s, [{"where": server, "key": "gro", "value": "on"}]), "gro")
    assert e["status"] == NOT_EXERCISED and e["counters"]["after_per_received"] > 0.99
    assert "peer's TSO off" in e["cause"]


def test_udp_gro_on_the_receiver_needs_the_socket_option():
    s = sample("bridge-udp-plain")
    server = next(n for n in s["probes"]["interfaces"] if n.startswith("server:"))
    e = one(judge_effects(s, [{"where": server, "key": "gro", "value": "on"}]), "gro")
    assert e["status"] == NOT_APPLICABLE and "UDP_GRO" in e["cause"]


# ---- MTU -------------------------------------------------------------------------------------

def test_jumbo_mtu_on_one_hop_of_a_1500_path_is_set_but_not_exercised():
    s = sample("bridge-tsooff")
    e = one(judge_effects(s, [{"where": client_if(s), "key": "mtu", "value": "9000"}]), "mtu")
    assert e["status"] == NOT_EXERCISED and e["counters"]["path_smallest_mtu"] == 1500


def test_jumbo_mtu_with_9000_frames_on_the_path_is_exercised():
    s = sample("bridge-tsooff")
    for name in s["probes"]["mtus"]:
        s["probes"]["mtus"][name] = 9000
    for d in s["probes"]["interfaces"].values():  # frames of a 9000 path: 9014 B on the wire
        for way in ("rx", "tx"):
            if (d[f"{way}_avg_bytes"] or 0) > 1000:
                d[f"{way}_avg_bytes"] = 9014.0
    e = one(judge_effects(s, [{"where": client_if(s), "key": "mtu", "value": "9000"}]), "mtu")
    assert e["status"] == EXERCISED and e["counters"]["largest_frame_at_least"] == 9014.0


# ---- marking ---------------------------------------------------------------------------------

def test_a_cell_line_names_the_setting_where_in_how_many_samples_and_why():
    bad = {**sample("dpdk-io-gro")}
    bad["effects"] = judge_effects(bad, [])
    good = {**sample("dpdk-csum-gro")}
    good["effects"] = judge_effects(good, [])
    lines = not_exercised_by_cell(records([{"cell_id": 1, "sample": bad}, {"cell_id": 1, "sample": bad},
                                           {"cell_id": 2, "sample": good}]))
    assert list(lines) == [1]
    assert lines[1].startswith("testpmd.gro=on at switch (testpmd port 0, rx) in 2 of 2 samples (port 0 received")
    assert lines[1].endswith("fwd is io)")


# What the witnesses say now that they did not say when the fixtures were measured, each a decision
# with its own test: (setting, value, status then, status now).
JUDGED_SINCE = {("gso", "on", NOT_EXERCISED, NOT_APPLICABLE)}  # TCP builds GSO itself since 4.13


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_every_fixture_is_judged_again_as_it_was_when_measured(name):
    """Each fixture keeps the effects offlab witnessed when it was measured, with the settings then in
    force: judged again from those settings, every witness gives its status of then, and none fails to
    read the counters of a whole sample (a witness that raises fails this test)."""
    s = sample(name)
    then = [(e["setting"], e["where"], e["value"], e["status"]) for e in s["effects"]]
    settings = [{"where": where, "key": key, "value": value} for key, where, value, _ in then
                if effects.witness_of(key) is not None]
    found = judge_effects(s, settings)
    assert not [e for e in found if (e["cause"] or "").startswith(effects.UNREADABLE)], found
    now = {(e["setting"], e["where"], e["value"]): e["status"] for e in found}
    assert set(now) == {(key, where, value) for key, where, value, _ in then}, (sorted(now), then)
    changed = {(key, value, status, now[key, where, value]) for key, where, value, status in then
               if now[key, where, value] != status}
    assert changed <= JUDGED_SINCE, changed


# ---- RPS and busy polling --------------------------------------------------------------------

def server_if(s: dict) -> str:
    return next(n for n in s["probes"]["interfaces"] if n.startswith("server:"))


def test_rps_to_another_cpu_counts_steered_packets_and_none_without_it():
    on, off = sample("bridge-rps2"), sample("bridge-rps0")
    e = one(judge_effects(on, [{"where": server_if(on), "key": "rps", "value": "0x2"}]), "rps")
    assert e["status"] == EXERCISED and e["counters"]["received_rps"]["1"] > 1000
    assert one(judge_effects(off, [{"where": server_if(off), "key": "rps", "value": "0x0"}]), "rps")["status"] == OFF
    e = one(judge_effects(off, [{"where": server_if(off), "key": "rps", "value": "0x2"}]), "rps")
    assert e["status"] == NOT_EXERCISED  # nothing was steered: what the counters say when RPS did nothing


def test_rps_to_the_cpu_where_packets_arrive_is_not_applicable():
    off = sample("bridge-rps0")  # the client sends on CPU 0: a veth's packets arrive there
    e = one(judge_effects(off, [{"where": server_if(off), "key": "rps", "value": "1"}]), "rps")
    assert e["status"] == NOT_APPLICABLE and "CPU 0" in e["cause"]


def test_busy_polling_is_exercised_only_on_a_device_with_napi():
    gro, plain = sample("veth-busypoll-gro"), sample("veth-busypoll-nonapi")
    setting = [{"where": "machine", "key": "net.core.busy_poll", "value": "50"}]
    e = one(judge_effects(gro, setting), "net.core.busy_poll")
    assert e["status"] == EXERCISED and e["counters"]["server_BusyPollRxPackets"] > 0
    e = one(judge_effects(plain, setting), "net.core.busy_poll")
    assert e["status"] == NOT_EXERCISED and "NAPI" in e["cause"]
    off = [{"where": "machine", "key": "net.core.busy_poll", "value": "0"}]
    assert one(judge_effects(plain, off), "net.core.busy_poll")["status"] == OFF


# ---- queues: channels and XPS; threaded NAPI; NAPI deferral ---------------------------------
# veth-* (a veth lab, client ollq0 ─ server ollq1; client tso off, server gro on: the server's veth
# receives through NAPI and counts per queue): see the folder's README for each one's settings.

CLIENT, SERVER = "client:ollq0", "server:ollq1"


def test_xps_sends_from_the_mapped_queue_and_names_the_cpu_a_mask_leaves_out():
    """UDP from CPU 0 with xps.1 = CPU 0 and xps.0 = CPU 1: every packet left on queue 1."""
    s = sample("veth-xps-udp")
    found = judge_effects(s, [{"where": CLIENT, "key": "xps.1", "value": "0x1"},
                                {"where": CLIENT, "key": "xps.0", "value": "0x2"}])
    mapped, other = one(found, "xps.1"), one(found, "xps.0")
    assert mapped["status"] == EXERCISED and mapped["counters"]["counted_at"] == f"{SERVER} rx"
    assert mapped["counters"]["queues"]["1"] > 100000 and mapped["counters"]["queues"]["0"] == 0
    assert other["status"] == NOT_EXERCISED and "sent from CPU 0, which the mask does not name" in other["cause"]
    assert one(judge_effects(s, [{"where": CLIENT, "key": "xps", "value": "0x1"}]), "xps")["status"] == NOT_APPLICABLE
    assert one(judge_effects(s, [{"where": CLIENT, "key": "xps.1", "value": "0"}]), "xps.1")["status"] == OFF


def test_two_queues_with_parallel_streams_are_exercised_and_not_when_the_peer_has_one():
    two, one_rx = sample("veth-channels2-streams12"), sample("veth-channels1-streams12")
    e = one(judge_effects(two, [{"where": SERVER, "key": "channels.rx", "value": "2"}]), "channels.rx")
    assert e["status"] == EXERCISED and min(e["counters"]["queues"].values()) > 1000
    e = one(judge_effects(one_rx, [{"where": CLIENT, "key": "channels.tx", "value": "2"}]), "channels.tx")
    assert e["status"] == NOT_EXERCISED and "server:ollq1 has 1 receive queue(s)" in e["cause"]
    # the client's receive queues carry only acknowledgements: not where the data went
    e = one(judge_effects(two, [{"where": CLIENT, "key": "channels.rx", "value": "2"}]), "channels.rx")
    assert e["status"] == NOT_APPLICABLE and "did not go through" in e["cause"]


def test_two_queues_with_one_flow_are_not_applicable():
    e = one(judge_effects(sample("veth-threaded-off"), [{"where": SERVER, "key": "channels.rx", "value": "2"}]),
            "channels.rx")
    assert e["status"] == NOT_APPLICABLE and e["cause"].startswith("one flow goes through one queue")


def test_a_sample_without_queue_counts_says_so_and_never_accuses():
    e = one(judge_effects(sample("bridge-rps2"), [{"where": server_if(sample("bridge-rps2")),
                                                     "key": "channels.rx", "value": "2"}]), "channels.rx")
    assert e["status"] == NOT_APPLICABLE and "did not read per-queue counters" in e["cause"]


def test_xps_in_a_guest_is_witnessed_by_its_mq_qdiscs_children():
    s = sample("vm-xps-udp")
    found = judge_effects(s, [{"where": "client:eth0", "key": "xps.1", "value": "0x1"},
                                {"where": "client:eth0", "key": "xps.0", "value": "0x2"}])
    assert one(found, "xps.1")["status"] == EXERCISED
    assert one(found, "xps.1")["counters"]["counted_at"] == "client:eth0 qdisc"
    assert one(found, "xps.0")["status"] == NOT_EXERCISED


def test_threaded_napi_is_exercised_by_its_thread_and_not_without_it():
    setting = [{"where": SERVER, "key": "threaded", "value": "on"}]
    e = one(judge_effects(sample("veth-threaded-on"), setting), "threaded")
    assert e["status"] == EXERCISED and e["counters"]["napi_threads_cpu_pct"] > 0
    e = one(judge_effects(sample("veth-threaded-off"), setting), "threaded")
    assert e["status"] == NOT_EXERCISED and "NAPI" in e["cause"]


def test_napi_deferral_on_a_veth_is_recorded_not_judged_with_why():
    s = sample("veth-threaded-off")
    e = one(judge_effects(s, [{"where": SERVER, "key": "napi_defer_hard_irqs", "value": "2"}]),
            "napi_defer_hard_irqs")
    assert e["status"] == NOT_APPLICABLE and "no interrupt count" in e["cause"]
    e = one(judge_effects(s, [{"where": SERVER, "key": "gro_flush_timeout", "value": "0"}]), "gro_flush_timeout")
    assert e["status"] == OFF


def test_plain_gro_on_a_udp_forwarding_hop_is_not_applicable_its_udp_fwd_witness_judges():
    s = sample("bridge-udp-plain")
    ingress = next(n for n, v in s["probes"]["interfaces"].items()
                   if n.startswith("switch:") and v["rx_packets"] > 100000)
    found = judge_effects(s, [{"where": ingress, "key": "gro", "value": "on"},
                                {"where": ingress, "key": "udp-gro-fwd", "value": "on"}])
    assert one(found, "gro")["status"] == NOT_APPLICABLE
    assert one(found, "udp-gro-fwd")["status"] == NOT_EXERCISED  # 1.0 forwarded per received: nothing merged


def test_a_captured_super_packet_is_no_wire_frame_for_the_mtu_witness():
    s = sample("bridge-tsoon")  # 59 KB super-packets on every veth
    setting = [{"where": client_if(s), "key": "mtu", "value": "9000"}]
    for name in s["probes"]["mtus"]:
        s["probes"]["mtus"][name] = 9000
    s["capture"] = {"mtu": 9000, "largest_frame": 65226}
    e = one(judge_effects(s, setting), "mtu")
    assert e["status"] == NOT_APPLICABLE and e["counters"]["largest_frame_captured"] is None
    s["capture"] = {"mtu": 9000, "largest_frame": 9014}
    assert one(judge_effects(s, setting), "mtu")["status"] == EXERCISED


def test_testpmd_gro_into_a_guest_counts_the_vhost_ports_drops_as_packets_out():
    """io forwarding into a TCG guest: 40353 sent + 3495 dropped of 43848 in is 1.000, not a 0.92 'merge'."""
    e = one(judge_effects(sample("dpdk-vm-io-gro"), []), "testpmd.gro")
    assert e["status"] == NOT_EXERCISED and e["counters"]["tx_dropped"] > 0
    assert abs(e["counters"]["out_per_in"] - 1.0) < 0.01 and e["cause"].endswith("fwd is io")
    e = one(judge_effects(sample("dpdk-vm-csum-gro"), []), "testpmd.gro")
    assert e["status"] == EXERCISED and e["counters"]["out_per_in"] < 0.1
    assert judge_effects(sample("dpdk-vm-grooff"), []) == []  # GRO off: nothing to witness


def test_a_witness_without_its_counters_says_so_and_the_others_still_judge():
    s = sample("dpdk-io-gro")
    # the data's direction named but its counters not there (a counter that is not there reads as 0:
    # offlab.sample; a missing record is what a witness cannot read)
    del s["probes"]["testpmd"]["directions"]["0>1"]
    found = judge_effects(s, [{"where": "client:x", "key": "tso", "value": "on"}])
    broken = one(found, "testpmd")
    assert broken["status"] == NOT_APPLICABLE and "KeyError" in broken["cause"]
    assert one(found, "tso")["status"] == NOT_APPLICABLE  # no counters for client:x: said, not accused


def test_segmentation_on_a_forwarding_hop_is_exercised_only_when_super_packets_leave_it():
    s = sample("bridge-swgroon")  # the switch merged (GRO) and sent ~58 KB super-packets to the server
    egress = next(n for n, v in s["probes"]["interfaces"].items()
                  if n.startswith("switch:") and (v["tx_avg_bytes"] or 0) > 30000)
    assert one(judge_effects(s, [{"where": egress, "key": "tso", "value": "on"}]), "tso")["status"] == EXERCISED
    t = sample("bridge-tsooff")  # wire-size all the way: nothing to segment on the switch
    egress = next(n for n, v in t["probes"]["interfaces"].items() if n.startswith("switch:") and v["tx_packets"] > 1000)
    e = one(judge_effects(t, [{"where": egress, "key": "tso", "value": "on"}]), "tso")
    assert e["status"] == NOT_APPLICABLE and "forwards what arrives" in e["cause"]


# ---- BIG TCP sizes and zero-copy sends -----------------------------------------------------------

def test_a_big_gso_size_is_exercised_only_when_packets_over_64k_left_the_interface():
    probes = {"big_packets": {"client:olx0": {"rx": 0, "tx": 6174}, "router:olx1": {"rx": 6174, "tx": 0}}}

    def big(key: str, value: str, where: str, p: dict) -> dict:
        return one(judge_effects({"probes": p}, [{"where": where, "key": key, "value": value}]), key)

    assert big("gso_max_size", "196608", "client:olx0", probes)["status"] == "exercised"
    assert big("gro_max_size", "196608", "router:olx1", probes)["status"] == "exercised"
    quiet = big("gso_max_size", "196608", "router:olx1", probes)
    assert quiet["status"] == "set but not exercised" and "no packet over 64 KiB" in quiet["cause"]
    assert big("gso_max_size", "65536", "client:olx0", probes)["status"] == "off"
    assert big("gso_max_size", "196608", "client:olx0", {})["status"] == "not applicable"


def test_zero_copy_sends_all_copied_are_set_but_not_exercised():
    def zerocopy(traffic: dict) -> list[dict]:
        return [e for e in judge_effects({"traffic": traffic}, []) if e["setting"] == "workload send (zerocopy)"]

    (copied,) = zerocopy({"zerocopy": {"completed": 4096, "copied": 4096}})
    assert copied["status"] == "set but not exercised" and "copied every send" in copied["cause"]
    (real,) = zerocopy({"zerocopy": {"completed": 4096, "copied": 10}})
    assert real["status"] == "exercised"
    assert zerocopy({}) == []
