"""The loss witness compares like with like: the tool's loss over the window (from its receiver's
per-interval rows, placed on this machine's clock) against the kernel's over the same window.

The fixtures are real samples (tests/fixtures/witness/README.md): loss put on the path by a tbf on a
bridge's port only during the warm-up, or during the whole run.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from offlab.experiment import witnesses
from offlab.sample import Check, Probes, StoredSample, Traffic
from offlab.traffic import Workload, iperf3
from tests.conftest import requires_root
from tests.helpers import tool_saw_no_loss

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> dict:
    d = json.loads((FIX / "witness" / name).read_text())
    return {"traffic": d["traffic"], "probes": d["probes"], "workload": d["workload"]}


def loss_check(sample: dict) -> tuple[str, Check]:
    result = witnesses.cross_check(StoredSample.from_json(sample))
    (check,) = [c for c in result.checks if c.check == "loss"]
    return result.status, check


def rx_rows(sample: dict) -> list[list]:
    (rx,) = [s for s in sample["traffic"]["series"] if s["source"] == "offlab-engine rx"]
    return rx["rows"]


def test_loss_only_in_the_warmup_is_flagged_over_the_whole_run_and_not_over_the_window():
    s = load("engine_loss_in_warmup.json")
    assert s["traffic"]["loss"] > 0.15  # the engine's whole run, warm-up included
    status, check = loss_check(copy.deepcopy(s))
    assert status == "consistent" and check.tool_over == "window", check
    assert check.tool < 0.01 and check.kernel < 0.01 and check.tool_whole_run > 0.15
    assert "loss over the window 0.00 % by engine (its receiver's" in check.detail
    # the same sample without its series (`--interval 0`, or one stored before): the old comparison,
    # whole run against window, flags it, and says which figure it compared
    old = copy.deepcopy(s)
    old["traffic"]["series"] = []
    status, check = loss_check(old)
    assert status == "inconsistent" and check.tool_over == "whole run" and check.alignment_s == 0
    assert "over its whole run, warm-up included (not cut to the window: no receiver series" in check.detail


def test_the_rows_are_placed_by_their_own_start_so_a_wrong_start_brings_the_burst_into_the_window():
    s = load("engine_loss_in_warmup.json")
    (rx,) = [x for x in s["traffic"]["series"] if x["source"] == "offlab-engine rx"]
    rx["t0_mono_s"] += 1.5  # rows 1.5 s later: the warm-up's burst now lies in the window
    status, check = loss_check(s)
    assert status == "inconsistent" and check.tool > 0.1 and check.kernel < 0.01, check


def test_a_burst_in_a_row_at_the_windows_edge_counts_in_part_and_bounds_the_lost_count():
    s = load("engine_loss_in_warmup.json")
    (rx,) = [x for x in s["traffic"]["series"] if x["source"] == "offlab-engine rx"]
    cols = rx["columns"]
    t_s, dur, lost = (cols.index(c) for c in ("t_s", "dur_s", "lost"))
    burst = max(rx["rows"], key=lambda r: r[lost])
    assert burst[lost] > 1000
    # place the burst's row across the window's start, a quarter of it inside
    edge = s["probes"]["t0_mono_s"] + sum(s["probes"]["reads"]["server"]["start"]) / 2
    rx["t0_mono_s"] = edge - burst[t_s] - 0.75 * burst[dur]
    wl = witnesses.window_loss(Traffic.from_json(s["traffic"]), Probes.from_json(s["probes"]))
    others = sum(r[lost] for r in rx["rows"] if r is not burst and rx["t0_mono_s"] + r[t_s] >= edge)
    assert wl.lost_low == others and wl.lost_high == others + burst[lost], wl
    assert wl.lost_low < wl.lost < wl.lost_high and wl.lost == pytest.approx(others + burst[lost] / 4, abs=2)


def test_a_gap_counted_just_after_an_edge_within_the_runs_largest_latency_widens_the_bounds_over_that_edge():
    """A row counts a gap when the receiver reads past it: under load the receiver's socket queue holds
    datagrams sent up to the run's largest one-way latency earlier, so a gap counted just after the window's
    end may have gone missing inside it, and one counted just after its start may have gone missing before."""
    s = load("engine_loss_in_warmup.json")
    (rx,) = [x for x in s["traffic"]["series"] if x["source"] == "offlab-engine rx"]
    cols = rx["columns"]
    t_s, dur, lost = (cols.index(c) for c in ("t_s", "dur_s", "lost"))
    burst = max(rx["rows"], key=lambda r: r[lost])
    p = s["probes"]
    start = p["t0_mono_s"] + sum(p["reads"]["server"]["start"]) / 2
    end = p["t0_mono_s"] + p["window_s"] + sum(p["reads"]["server"]["end"]) / 2

    def bounds(row_start: float, latency_max_us: float | None) -> witnesses.WindowLoss:
        rx["t0_mono_s"] = row_start - burst[t_s]
        s["traffic"]["latency_us"] = None if latency_max_us is None else {"max": latency_max_us}
        return witnesses.window_loss(Traffic.from_json(s["traffic"]), Probes.from_json(s["probes"]))

    after_end = bounds(end + 0.01, None)  # counted 10 ms after the window's end: outside it
    assert after_end.detection_lag_s == 0, after_end
    lagging = bounds(end + 0.01, 50_000)  # ...by a receiver up to 50 ms behind: it may lie inside
    assert lagging.detection_lag_s == 0.05 and lagging.lost == after_end.lost, lagging
    assert lagging.lost_high == after_end.lost_high + burst[lost], lagging
    after_start = bounds(start + 0.01, None)  # counted 10 ms after the window's start, wholly inside it
    lagging = bounds(start + 0.01, 50_000)  # ...may have gone missing before the window
    assert after_start.lost_low - lagging.lost_low == burst[lost] and lagging.lost == after_start.lost, lagging


def test_loss_inside_the_window_agrees_and_a_tool_that_did_not_see_it_is_contradicted():
    s = load("engine_loss_in_window.json")
    status, check = loss_check(copy.deepcopy(s))
    assert status == "consistent" and check.tool_over == "window"
    assert check.kernel > 0.3 and abs(check.tool - check.kernel) < 0.02, check
    # the window and the rows may be apart by at most half a 100 ms row at each edge, plus the reads' spans
    assert 0 < check.alignment_s <= 0.1 + 0.02
    assert f"{check.alignment_s * 1000:.1f} ms its intervals and the kernel's reads may be apart" in check.detail
    status, lying = loss_check(tool_saw_no_loss(s))
    assert status == "inconsistent" and lying.tool == 0.0 and lying.kernel == check.kernel
    # a tool that saw half of it is contradicted as well: 18 points apart, beyond the stated tolerance
    half = copy.deepcopy(s)
    cols = half["traffic"]["series"][0]["columns"]
    for row in rx_rows(half):
        row[cols.index("lost")] //= 2
    status, check = loss_check(half)
    assert status == "inconsistent" and abs(check.tool - check.kernel) > check.tolerance


def test_a_receiver_with_its_own_clock_is_placed_by_its_offset_and_its_uncertainty_widens_the_tolerance():
    s = load("engine_loss_in_warmup.json")
    _, here = loss_check(copy.deepcopy(s))
    # the same rows, as if counted on a host whose clock runs 100.00–100.02 s ahead of this machine's
    (rx,) = [x for x in s["traffic"]["series"] if x["source"] == "offlab-engine rx"]
    rx["t0_mono_s"] += 100.01
    read = s["probes"]["reads"]["server"]
    read.update(own_window_s=s["probes"]["window_s"], clock_offset_s=[100.0, 100.02])
    status, there = loss_check(copy.deepcopy(s))
    assert status == "consistent" and there.tool == here.tool
    assert there.alignment_s == pytest.approx(here.alignment_s + 2 * 0.01, abs=1e-6)
    del read["clock_offset_s"]
    status, check = loss_check(s)
    assert check.tool_over == "whole run" and "the server's clock offset from this machine's is unknown" \
        in check.detail


def test_iperf3s_client_intervals_count_no_loss_so_its_whole_run_is_compared_and_it_says_so():
    doc = json.loads((FIX / "iperf3" / "udp_interval_100ms_omit.json").read_text())
    res = iperf3.parse(doc, Workload(tool="iperf3", protocol="udp", duration=1, warmup=1))
    why = witnesses.window_loss(Traffic.from_json(res.to_dict()), Probes(t0_mono_s=1.0, window_s=1.0)).why
    assert why == "iperf3's client reports the sender's intervals, which count no loss"


@pytest.mark.network
@requires_root
def test_a_real_loss_burst_in_the_warmup_leaves_a_correct_sample_consistent(lab_name, clean_machine):
    from offlab import lab as labs
    from offlab.experiment import teardown

    lab = labs.up("bridge", lab_name)
    try:
        d, marks = measure_with_warmup_burst(lab)
        assert marks["off"] < d["probes"]["t0_mono_s"], marks  # the burst ended before the window began
        status, check = loss_check(copy.deepcopy(d))
        assert check.tool_whole_run > 0.05 and check.kernel < 0.02, check
        assert status == "consistent" and check.tool_over == "window", check
        old = copy.deepcopy(d)
        old["traffic"]["series"] = []
        assert loss_check(old)[0] == "inconsistent"  # what the whole-run comparison said of it
    finally:
        teardown.down(lab_name)


def measure_with_warmup_burst(lab) -> tuple[dict, dict]:
    """An engine sample with a tbf (20 Mbit/s, under the 192 Mbit/s offered) on the switch's port to the
    server for the first 0.8 s of a 2 s warm-up. Returns (sample dict, when the tbf went on and off on
    CLOCK_MONOTONIC)."""
    from offlab.experiment.measure import measure

    switch, port = lab.host("switch"), lab.resolve_iface("switch", "to-server")
    marks: dict = {}

    def burst() -> None:
        switch.run(["tc", "qdisc", "add", "dev", port, "root", "tbf", "rate", "20mbit", "burst", "8k",
                    "latency", "5ms"])
        marks["on"] = time.monotonic()
        time.sleep(0.8)
        switch.run(["tc", "qdisc", "del", "dev", port, "root"])
        marks["off"] = time.monotonic()

    w = Workload(tool="engine", protocol="udp", size=1200, rate="20kpps", warmup=2.0, duration=2.0)
    try:
        s = measure(lab, w, alongside=burst)
    finally:
        switch.run(["tc", "qdisc", "del", "dev", port, "root"], check=False)
    stored = s.to_json()  # as the store holds it: the test edits its JSON
    return {"traffic": stored["traffic"], "probes": stored["probes"], "workload": stored["workload"]}, marks


def bytes_check(sample: dict) -> Check:
    result = witnesses.cross_check(StoredSample.from_json(sample))
    (check,) = [c for c in result.checks if c.check == "application bytes ≤ interface bytes"]
    return check


def test_application_bytes_are_the_receivers_rows_in_the_window_not_the_whole_runs_rate():
    """A whole-run throughput above the window's own (the sender slowed inside the window) must not make
    the application seem to have received more than the server's interfaces carried."""
    s = load("engine_loss_in_window.json")
    window = bytes_check(copy.deepcopy(s))
    assert window.ok and "intervals in the server's window" in window.detail, window
    faster = copy.deepcopy(s)
    faster["traffic"]["throughput_bps"] *= 1.15  # the whole run's rate, 15 % above the window's
    assert bytes_check(faster).application_bytes == window.application_bytes
    # without a receiver series the whole run's rate is all there is: the check says so, and flags it
    old = copy.deepcopy(faster)
    old["traffic"]["series"] = []
    check = bytes_check(old)
    assert "throughput × this machine's window" in check.detail and not check.ok, check
