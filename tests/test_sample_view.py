"""offlab.sample: a stored sample read as dataclasses loses nothing, and its readers give what the dicts gave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.sample import Iface, Probes, SampleRecord, StoredSample, Traffic

FIX = Path(__file__).parent / "fixtures"
# Real samples (offlab measure --json and stored runs' samples), each with the shape of its day.
REAL = sorted(p for p in FIX.rglob("*.json") if "probes" in json.loads(p.read_text()))


def test_the_fixtures_hold_real_samples_of_every_kind():
    names = {p.name for p in REAL}
    assert len(REAL) >= 20 and "engine_udp_measure.json" in names and "dpdk-vm-grooff.json" in names


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_reading_a_stored_sample_and_writing_it_back_loses_nothing(path):
    d = json.loads(path.read_text())
    back = StoredSample.from_json(d).to_json()
    assert back == d
    assert json.dumps(back) == json.dumps(d)  # key order too: the JSON a user diffs stays the same


def test_the_real_engine_sample_reads_as_typed_fields():
    d = json.loads((FIX / "sample" / "engine_udp_measure.json").read_text())
    s = StoredSample.from_json(d)
    assert s.traffic.tool == "engine" and s.workload.protocol == "udp" and s.workload.size == 1200
    assert s.traffic.throughput_bps == d["traffic"]["throughput_bps"] > 0
    assert s.probes.window_s == d["probes"]["window_s"] > 0
    iface = next(iter(d["probes"]["interfaces"]))
    assert isinstance(s.probes.interfaces[iface], Iface)
    assert s.probes.interfaces[iface].rx_packets == d["probes"]["interfaces"][iface]["rx_packets"]
    assert s.probes.counter("client", "Udp", "OutDatagrams") == d["probes"]["snmp"]["client"]["Udp"]["OutDatagrams"]
    assert s.consistency.status == d["consistency"]["status"]
    assert [c.check for c in s.consistency.checks] == [c["check"] for c in d["consistency"]["checks"]]
    assert s.traffic.series[0].source == d["traffic"]["series"][0]["source"]


def test_an_absent_key_reads_as_its_default_and_stays_absent():
    t = Traffic.from_json({"tool": "iperf3"})
    assert t.loss is None and t.errors == {} and t.error("ENOBUFS") == 0
    assert t.to_json() == {"tool": "iperf3"}
    p = Probes.from_json({"snmp": {"server": {"Udp": {"NoPorts": 3}}}})
    assert p.counter("server", "Udp", "NoPorts") == 3 and p.counter("client", "Udp", "NoPorts") == 0
    assert p.counter("server", "Udp", "InDatagrams", None) is None


def test_a_field_set_after_reading_is_written_after_the_keys_that_came():
    t = Traffic.from_json({"tool": "engine", "loss": None})
    t.loss, t.loss_source = 0.25, "kernel"
    assert list(t.to_json().items()) == [("tool", "engine"), ("loss", 0.25), ("loss_source", "kernel")]


def test_a_key_no_reader_names_is_kept_as_it_came():
    d = {"lab": "x", "probes": {"window_s": 1.0, "some_new_probe": {"a": [1, 2]}}, "future": 7}
    s = StoredSample.from_json(d)
    assert s.extra == {"future": 7} and s.probes.extra == {"some_new_probe": {"a": [1, 2]}}
    assert s.to_json() == d


def test_a_store_row_reads_with_its_sample():
    row = {"id": 3, "cell_id": 2, "round": 1, "created_at": "2026-11-26 06:00:00", "metrics": {"loss": 0.1},
           "sample": {"lab": "l", "capture": {"host": "server", "iface": "eth0", "frames": 9, "verdict": "ok"}},
           "requested_vs_actual": None}
    r = SampleRecord.from_json(row)
    assert (r.id, r.cell_id, r.round, r.metrics["loss"]) == (3, 2, 1, 0.1)
    assert (r.sample.capture.host, r.sample.capture.frames, r.sample.capture.verdict) == ("server", 9, "ok")
    assert r.to_json() == row


def test_a_dpdk_vm_samples_guest_stages_are_read_from_its_fields():
    from offlab.cli.results import guest_stages

    d = json.loads((FIX / "effects" / "dpdk-vm-grooff.json").read_text())
    st = guest_stages(StoredSample.from_json(d))
    # the figures of this real sample, read by hand from its JSON
    assert (st.guest, st.rx, st.tx, st.ip_in, st.ip_out) == ("server", 25986, 286, 903, 281)
    assert (st.testpmd_cpu, st.qemu_cpu, st.guest_cpu, st.pruned) == (23.31, 20.22, 100.0, "")


def test_results_show_prints_a_dpdk_vm_runs_testpmd_and_guest_counters(tmp_path):
    from offlab.cli.results import out, print_testpmd
    from offlab.store import Store

    d = json.loads((FIX / "effects" / "dpdk-vm-grooff.json").read_text())
    d["notes"].append("receive queue pruned: server hit its TCP receive-memory limit and pruned or collapsed its "
                      "receive queue (TCPRcvQDrop 3): this measured its socket receive memory")
    store = Store.open(tmp_path / "x.db")
    run = store.create_run("vm", "name: vm", {}, 1, {}, None, {})
    ids = store.add_cells(run, [{"key": "gro=off", "params": {"gro": "off"}, "settings": {}}])
    store.add_sample(run, ids["gro=off"], 0, d, {"throughput_bps": 1e9})
    with out.capture() as got:
        print_testpmd(store, run)
    store.close()
    text = " ".join(got.get().split())  # as read, whatever the terminal's width
    tp = d["probes"]["testpmd"]
    data = tp["directions"][tp["data_direction"]]
    assert f"gro=off: {tp['out_per_in']:.3f} out per in (first sample: {data['rx_packets']} in → " \
           f"{data['tx_packets']} out, port 0 → 1); errors/missed/drops 726" in text  # port 1's fwd_tx_dropped
    assert "guest server: eth0 rx 25986 / tx 286 frames, IP packets in 903 out 281" in text
    assert "testpmd 23, QEMU 20, guest 100" in text
    assert "receive queue pruned in 1 of 1 samples: server hit its TCP receive-memory limit and pruned or " \
           "collapsed its receive queue (TCPRcvQDrop 3)" in text


def test_rr_under_load_prints_the_idle_and_loaded_round_trips_of_a_real_sample():
    from offlab.cli.measure import out, print_rr_under_load

    d = json.loads((FIX / "sample" / "rr_under_load_measure.json").read_text())
    s = StoredSample.from_json(d)
    idle, loaded = d["rr"]["idle"], d["rr"]["loaded"]
    assert (s.rr.idle.rtt_p99_us, s.rr.loaded.transactions_per_s) == (idle["rtt_p99_us"], loaded["transactions_per_s"])
    with out.capture() as got:
        print_rr_under_load(s.rr)
    text = " ".join(got.get().split())
    f = d["rr"]["loaded_over_idle"]["rtt_p99_us"]
    assert f"p99 {idle['rtt_p99_us']:.1f} µs {loaded['rtt_p99_us']:.1f} µs {f:.1f}" in text
    assert f"transactions/s {idle['transactions_per_s']:.0f} {loaded['transactions_per_s']:.0f}" in text
    assert f"rr udp {idle['request_size']}/{idle['response_size']} B, {idle['flows']} flow(s)" in text
    assert "idle cpu client cpu0" in text


def test_a_shape_no_view_expects_is_kept_as_it_came():
    # an older or damaged sample: a CPU side that is null, a capture that is text, places that are not objects
    d = {"probes": {"cpu": {"client": None, "server": {"busy": 50.0}}}, "capture": "none",
         "loss_attribution": {"lost": 3, "places": ["?"]}}
    s = StoredSample.from_json(d)
    assert s.probes.cpu.client is None and s.probes.cpu.server is not None and s.probes.cpu.server.busy == 50.0
    assert s.to_json() == d
