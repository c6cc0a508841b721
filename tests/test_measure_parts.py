"""The pure parts of one measured sample (offlab.experiment.measure): service demand and the notes a
reader must see, on numbers checked by hand."""

from __future__ import annotations

from offlab.experiment.measure import PROCESSES_GONE_MARK, RCVQ_MARK, VETH_NOTE, sample_notes, service_demands
from offlab.metrics import TCG_MARK
from offlab.probes import ProbeResult
from offlab.sample import Cpu, CpuAccount, Guest, Iface


def probe(*, steal: float = 0.0, avg: float = 1500.0, snmp: dict | None = None) -> ProbeResult:
    return ProbeResult(
        window_s=2.0, t0_mono_s=0.0, reads={},
        cpu=CpuAccount(client=Cpu(busy=50.0), server=Cpu(busy=25.0), system=Cpu(busy_s=1.5, steal_pct=steal)),
        processes=[], interfaces={"client:a": Iface(rx_avg_bytes=None, tx_avg_bytes=avg)},
        snmp=snmp or {"server": {}})


def test_service_demand_per_side_and_total_by_hand():
    # 8 Mbit/s for 2 s = 2 MB = 1953.125 KiB; client 50 % of 2 s = 1 s of CPU = 1e6 µs → 512 µs/KiB
    sd = service_demands(probe(), 8e6, same_kernel=True)
    assert sd["client"] == 1e6 / 1953.125 and sd["server"] == 0.5e6 / 1953.125
    assert sd["total"] == 1.5e6 / 1953.125  # the whole system's 1.5 s busy
    assert "total" not in service_demands(probe(), 8e6, same_kernel=False)
    assert service_demands(probe(), 0.0, same_kernel=True)["client"] is None  # nothing moved


def test_notes_say_what_shaped_the_window_and_only_that():
    assert sample_notes(probe(), 1500, {}, channel_margin_s=None, late_start_s=None) == []
    notes = sample_notes(probe(steal=7.5, avg=64000), 1500, {"client": Guest(accel="tcg"), "server": Guest(accel="kvm")},
                         channel_margin_s=1.0, late_start_s=10.0)
    assert notes[0].startswith("traffic ran 2 s longer than the window, which began 1 s after the warm-up")
    (stopped,) = sample_notes(probe(), 1500, {}, channel_margin_s=1.0, late_start_s=None, stopped_at_end=True)
    assert stopped.startswith("the window began 1 s after the warm-up, once the traffic flowed, and the sender was "
                              "stopped once every host had read its counters at its end")
    assert notes[1].startswith("no traffic showed on this machine's lab interfaces within 10 s")
    assert notes[2].startswith("CPU steal 7.5 % of the window")
    assert notes[3] == VETH_NOTE
    assert notes[4] == f"{TCG_MARK}: client ran under TCG (an emulated CPU)"


def test_a_watched_process_gone_before_the_window_ended_is_said_with_how_early_the_traffic_ended():
    (note,) = sample_notes(probe(), 1500, {}, channel_margin_s=None, late_start_s=None, ended_before_s=0.31,
                           gone=["client", "server"])
    assert note == (f"{PROCESSES_GONE_MARK}: the client and server process(es) ended before the window did (the "
                    "traffic ended 0.31 s before the window's planned end, and the window with it): their CPU is not "
                    "in its process list")
    # a window that ended with traffic a little early, its processes still seen at both edges: nothing to say
    assert sample_notes(probe(), 1500, {}, channel_margin_s=None, late_start_s=None, ended_before_s=0.02) == []


def test_a_pruned_receive_queue_is_named_with_its_counters():
    snmp = {"server": {"TcpExt": {"RcvPruned": 3, "TCPRcvCollapsed": 40}}}
    (note,) = sample_notes(probe(snmp=snmp), 1500, {}, channel_margin_s=None, late_start_s=None)
    assert note.startswith(f"{RCVQ_MARK}: server hit its TCP receive-memory limit") and "RcvPruned 3" in note
