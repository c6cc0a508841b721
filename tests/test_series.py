"""Per-interval series (issue #12 item 3): engine rows that sum to the totals, iperf3's intervals in the
same shape, stored one row per interval, shown over time in the report and on the terminal."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from offlab import store as store_mod
from offlab.store import Store
from offlab.traffic import Workload, iperf3
from offlab.traffic import series as S
from tests.conftest import offlab_cli, requires_root

FIX = Path(__file__).parent / "fixtures" / "iperf3"


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


# -- shapes and small functions, by hand ----------------------------------------------------------------

def test_interval_is_100_ms_until_a_run_would_pass_6000_rows():
    assert S.interval_ms(2.5) == 100
    assert S.interval_ms(600) == 100  # 10 minutes at 100 ms = 6000 rows
    assert S.interval_ms(3600) == 600


def test_sparkline_levels_by_hand():
    assert S.sparkline([0, 7, 3.5, None]) == "▁█▅ "
    assert S.sparkline([5, 5]) == "▁▁"
    assert len(S.sparkline(list(range(100)), width=20)) == 20


def test_engine_stream_rows_move_back_by_the_warmup_and_are_marked():
    doc = {"series": {"interval_s": 0.1, "t_from": "start", "intervals_dropped": 0,
                      "columns": ["t_s", "dur_s", "datagrams", "bytes", "bps", "pps", "failed_calls"],
                      "rows": [[0, 0.1, 10, 100, 8000, 100, 0], [0.1, 0.1, 20, 200, 16000, 200, 0],
                               [0.2, 0.05, 5, 50, 8000, 100, 0]]}}
    s = S.from_engine(doc, "offlab-engine tx", warmup_s=0.1)
    assert s["columns"] == ["t_s", "dur_s", "warmup", "datagrams", "bytes", "bps", "pps"]  # failed_calls: not ours
    rows = S.as_dicts(s)
    assert [r["t_s"] for r in rows] == [-0.1, 0.0, 0.1]
    assert [r["warmup"] for r in rows] == [True, False, False]
    assert S.column(s, "datagrams") == [(0.0, 20), (0.1, 5)]


@pytest.mark.parametrize("fixture, total_key", [("udp_interval_100ms_omit.json", "sum_sent"),
                                                 ("tcp_interval_100ms_omit.json", "sum_sent")])
def test_iperf3_intervals_of_0_1_s_become_rows_that_sum_to_its_total(fixture, total_key):
    # Captured on this machine: iperf3 3.12 -J -t 1 -O 1 -i 0.1 (UDP at 100 Mbit/s, TCP unlimited).
    doc = load(fixture)
    udp = "udp" in fixture
    w = Workload(tool="iperf3", protocol="udp" if udp else "tcp", duration=1, warmup=1)
    res = iperf3.parse(doc, w)
    (s,) = res.series
    assert s["source"] == "iperf3 sender" and s["interval_s"] == 0.1
    rows = S.as_dicts(s)
    window = [r for r in rows if not r["warmup"]]
    warm = [r for r in rows if r["warmup"]]
    assert len(window) >= 9 and len(warm) >= 9
    assert all(r["t_s"] < 0 for r in warm) and all(r["t_s"] >= 0 for r in window)
    # iperf3's own lengths, as it measured them: about 0.1 s (its first window interval may hold 0.2 s,
    # the last omitted one folded in: the UDP capture shows it).
    durs = sorted(r["dur_s"] for r in window)
    assert abs(durs[len(durs) // 2] - 0.1) < 0.01 and max(durs) < 0.25
    total = doc["end"][total_key]["bytes"]
    largest = max(r["bytes"] for r in window)
    assert abs(sum(r["bytes"] for r in window) - total) <= largest  # within one interval
    if udp:
        assert all(r["pps"] > 0 for r in window) and "lost" in s["columns"]
    else:
        assert "retransmits" in s["columns"]


def test_iperf3_argv_asks_for_its_interval():
    argv = iperf3.client_argv(Workload(tool="iperf3", duration=2, warmup=1), "10.200.1.2", 5201)
    assert argv[argv.index("-i") + 1] == "0.1"


def test_iperf3_one_second_intervals_of_a_reverse_run_are_the_receivers():
    s = iperf3.parse(load("tcp_reverse_parallel_omit.json"), Workload(tool="iperf3", reverse=True, streams=2)).series[0]
    assert s["source"] == "iperf3 receiver"
    assert [r["warmup"] for r in S.as_dicts(s)] == [True, False]


# -- the store ------------------------------------------------------------------------------------------

SERIES = {"source": "offlab-engine rx", "interval_s": 0.1, "intervals_dropped": 0,
          "columns": ["t_s", "dur_s", "warmup", "datagrams", "bytes", "bps", "pps", "lost", "reordered"],
          "rows": [[-0.1, 0.1, True, 10, 100, 8000.0, 100.0, 0, 0], [0.0, 0.1, False, 20, 200, 16000.0, 200.0, 1, 0],
                   [0.1, 0.05, False, 0, 0, 0.0, 0.0, -1, 1]]}


def _sample(series: list[dict]) -> dict:
    return {"lab": "l", "workload": {"tool": "engine"}, "traffic": {"throughput_bps": 1.0, "series": series},
            "probes": {}}


def _run(st: Store) -> tuple[int, int]:
    run = st.create_run("r", "name: r", {}, 1, {}, None, {})
    cell = st.add_cells(run, [{"key": "all", "params": {}}])["all"]
    return run, cell


def test_series_rows_go_to_their_own_table_and_come_back_as_measured(tmp_path):
    with Store.open(tmp_path / "o.db") as st:
        run, cell = _run(st)
        sid = st.add_sample(run, cell, 1, _sample([SERIES]), {"throughput_bps": 1.0})
        got = st.samples(run)[0]["sample"]["traffic"]["series"]
        assert got == [SERIES]
        # Plain SQL reads a figure over time; the sample's JSON keeps only the header.
        rows = st.conn.execute("SELECT t_s, bps, warmup FROM sample_series WHERE sample_id = ? ORDER BY i",
                               (sid,)).fetchall()
        assert rows == [(-0.1, 8000.0, 1), (0.0, 16000.0, 0), (0.1, 0.0, 0)]
        stored = json.loads(st.conn.execute("SELECT sample FROM samples WHERE id = ?", (sid,)).fetchone()[0])
        assert "rows" not in stored["traffic"]["series"][0]


def test_series_two_levels_down_are_stored_and_drawn_too(tmp_path):
    # rr-under-load keeps its probes as sample["rr"]["idle"] and sample["rr"]["loaded"].
    from offlab.report import build_report

    rr = S.from_engine(RR_DOC, "offlab-engine rr")
    sample = {"traffic": {"throughput_bps": 1.0, "series": [SERIES]}, "rr": {"idle": {"series": [rr]},
                                                                             "loaded": {"series": [rr]}}}
    with Store.open(tmp_path / "o.db") as st:
        run, cell = _run(st)
        sid = st.add_sample(run, cell, 1, sample, {"throughput_bps": 1.0})
        assert st.samples(run)[0]["sample"] == sample
        parts = st.conn.execute("SELECT DISTINCT part FROM sample_series WHERE sample_id = ? ORDER BY part",
                                (sid,)).fetchall()
        assert parts == [("rr.idle",), ("rr.loaded",), ("traffic",)]
        html = build_report(st, run)
    assert html.count('<figure class="series"') == 3 and "all (rr.loaded): offlab-engine rr" in html


def _old_database(path: Path) -> None:
    """A database as the offlab before series wrote it: schema version 1, one sample."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript((Path(__file__).parent / "fixtures" / "schema_v1_sqlite.sql").read_text())
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs VALUES (1, 'old', 'done', NULL, '2026-01-01T00:00:00.000Z', NULL, '0.1.0', 1, "
                 "'name: old', '{}', '{}', NULL, '{}')")
    conn.execute("INSERT INTO cells VALUES (1, 1, 'all', 0, '{}', '{}', 'done', NULL)")
    conn.execute("INSERT INTO samples VALUES (1, 1, 1, 1, '2026-01-01T00:00:00.000Z', ?, NULL)",
                 (json.dumps({"traffic": {"throughput_bps": 5.0}}),))
    conn.close()


def test_an_old_database_is_migrated_and_its_samples_still_read(tmp_path):
    _old_database(tmp_path / "old.db")
    with Store.open(tmp_path / "old.db") as st:
        assert st.schema_version() == store_mod.SCHEMA_VERSION
        assert st.samples(1)[0]["sample"] == {"traffic": {"throughput_bps": 5.0}}
        sid = st.add_sample(1, 1, 2, _sample([SERIES]), {})
        assert st.samples(1)[1]["sample"]["traffic"]["series"][0]["rows"] == SERIES["rows"]
        assert sid == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to the nobody user")
def test_an_old_database_another_user_cannot_write_still_shows_its_results(shared_dir):
    from tests.helpers import as_nobody

    db = shared_dir / "old.db"
    _old_database(db)
    db.chmod(0o644)  # root's file: nobody reads it, cannot migrate it
    res = as_nobody("results", "show", "1", "--db", str(db), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["samples"][0]["sample"] == {"traffic": {"throughput_bps": 5.0}}
    with Store.open(db) as st:  # as root it migrates
        assert st.schema_version() == store_mod.SCHEMA_VERSION


# -- the report -----------------------------------------------------------------------------------------

def test_report_draws_one_over_time_chart_per_cell_with_the_rounds(tmp_path):
    from offlab.report import build_report

    with Store.open(tmp_path / "o.db") as st:
        run, cell = _run(st)
        st.add_sample(run, cell, 1, _sample([SERIES]), {"throughput_bps": 1.0})
        st.add_sample(run, cell, 2, _sample([SERIES]), {"throughput_bps": 1.0})
        html = build_report(st, run)
    assert 'id="over-time"' in html and html.count('<figure class="series"') == 1
    assert "offlab-engine rx, every\n  100 ms, 2 round(s)" in html


RR_DOC = {"series": {"interval_s": 0.1, "t_from": "window_start", "intervals_dropped": 0,
                     "columns": ["t_s", "dur_s", "warmup", "transactions", "lost", "tps", "rtt_p50_us", "rtt_p99_us",
                                 "rtt_max_us"],
                     "rows": [[-0.1, 0.1, True, 100, 0, 1000, 900.0, 1500.0, 1900.0],
                              [0.0, 0.1, False, 500, 0, 5000, 210.0, 230.0, 240.0],
                              [0.1, 0.1, False, 0, 1, 0, None, None, None]]}}


def test_rr_series_keep_their_rows_and_get_a_round_trip_panel(tmp_path):
    from offlab.report import build_report

    s = S.from_engine(RR_DOC, "offlab-engine rr")
    assert s["columns"] == RR_DOC["series"]["columns"] and s["rows"] == RR_DOC["series"]["rows"]  # no shift
    with Store.open(tmp_path / "o.db") as st:
        run, cell = _run(st)
        st.add_sample(run, cell, 1, {"traffic": {"throughput_bps": 1.0}, "rr": {"series": [s]}}, {"throughput_bps": 1.0})
        assert st.samples(run)[0]["sample"]["rr"]["series"] == [s]
        html = build_report(st, run)
    assert "all (rr): offlab-engine rr" in html and "round trip" in html and "transactions per second" in html


# -- real traffic ---------------------------------------------------------------------------------------

@pytest.fixture
def veth_lab(lab_name, clean_machine):
    from offlab import lab as labs
    from offlab.experiment import teardown

    lab = labs.up("veth", lab_name)
    yield lab
    teardown.down(lab_name)


def _sums(series: dict, col: str) -> tuple[float, float]:
    """(sum of the column over every row, the largest single row)."""
    vals = [v for _, v in S.column(series, col, window_only=False) if v is not None]
    return sum(vals), max(vals)


@requires_root
@pytest.mark.network
def test_a_real_engine_stream_has_intervals_that_sum_to_its_totals_and_a_report_chart(veth_lab, tmp_path):
    from offlab.experiment.measure import measure
    from offlab.metrics import metrics_of
    from offlab.report import build_report

    w = Workload(tool="engine", protocol="udp", size=1472, rate="20kpps", duration=1.0, warmup=0.3)
    sample = measure(veth_lab, w)
    rx, tx = (s.to_json() for s in sample.traffic.series)  # as stored: what the store gives back
    assert (rx["source"], tx["source"]) == ("offlab-engine rx", "offlab-engine tx")
    assert len([r for r in S.as_dicts(rx) if not r["warmup"]]) >= 9  # 1 s window at 100 ms
    got, biggest = _sums(rx, "datagrams")
    assert got == sample.traffic.datagrams_received  # rx counts every datagram once (no duplicates here)
    sent, _ = _sums(tx, "datagrams")
    assert sent == sample.traffic.datagrams_sent
    # Paced at 20 kpps: a full interval carries about 2000 datagrams (the median: a loaded machine may
    # stall the sender for one, which is what the series is for).
    full = sorted(r["datagrams"] for r in S.as_dicts(tx) if r["dur_s"] > 0.099)
    assert 1000 < full[len(full) // 2] < 3000
    with Store.open(tmp_path / "o.db") as st:
        run, cell = _run(st)
        st.add_sample(run, cell, 1, sample.to_json(), metrics_of(sample))
        assert st.samples(run)[0]["sample"]["traffic"]["series"] == [rx, tx]
        html = build_report(st, run)
    assert html.count('<figure class="series"') == 1 and "offlab-engine rx" in html


@requires_root
@pytest.mark.network
def test_a_real_rr_has_window_intervals_that_sum_to_its_transactions_and_a_report_chart(veth_lab, tmp_path):
    from offlab.report import build_report
    from offlab.traffic import rr

    r = rr.run_lab(veth_lab, rr.RrWorkload(protocol="udp", rate=2000, duration=1.0, warmup=0.3))
    (s,) = r.series
    rows = S.as_dicts(s)
    window = [x for x in rows if not x["warmup"]]
    assert len(window) == 10 and len(rows) == 13
    assert sum(x["transactions"] for x in window) == r.transactions
    assert sum(x["lost"] for x in window) == r.lost
    assert all(x["rtt_p50_us"] <= x["rtt_p99_us"] <= x["rtt_max_us"] for x in window if x["transactions"])
    assert max(x["rtt_max_us"] for x in window if x["transactions"]) == pytest.approx(r.rtt_max_us, rel=1e-6)
    with Store.open(tmp_path / "o.db") as st:
        run, cell = _run(st)
        st.add_sample(run, cell, 1, {"traffic": {"throughput_bps": 0.0}, "rr": r.to_dict()}, {})
        html = build_report(st, run)
    assert html.count('<figure class="series"') == 1 and "all (rr): offlab-engine rr" in html


@requires_root
@pytest.mark.network
def test_measure_json_shows_the_series_and_the_terminal_one_line(veth_lab):
    res = offlab_cli("measure", veth_lab.name, "--tool", "engine", "--rate", "5kpps", "--duration", "1",
                     "--warmup", "0.2", "--json")
    assert res.returncode == 0, res.stderr
    series = json.loads(res.stdout)["traffic"]["series"]
    assert series[0]["columns"][:3] == ["t_s", "dur_s", "warmup"] and len(series[0]["rows"]) >= 10
    res = offlab_cli("measure", veth_lab.name, "--tool", "engine", "--rate", "5kpps", "--duration", "1",
                     "--warmup", "0.2")
    assert res.returncode == 0, res.stderr
    line = next(l for l in res.stdout.splitlines() if "over time" in l)
    assert "per 100 ms, 10 intervals of the window: min" in line and "(offlab-engine rx)" in line


@requires_root
@pytest.mark.network
def test_a_sender_paused_for_350_ms_shows_as_empty_intervals(veth_lab):
    import signal
    import threading
    import time

    from offlab.traffic import engine

    def pause(tx_pid: int, rx_pid: int) -> None:  # noqa: ARG001
        def later() -> None:
            time.sleep(0.6)
            os.kill(tx_pid, signal.SIGSTOP)  # our own sender, by its pid
            try:
                time.sleep(0.35)
            finally:
                os.kill(tx_pid, signal.SIGCONT)
        threading.Thread(target=later, daemon=True).start()

    w = Workload(tool="engine", protocol="udp", size=1472, rate="10kpps", duration=1.5, warmup=0.2).check()
    r = engine.run(veth_lab.client, veth_lab.server, veth_lab.entry("server").address, w, on_started=pause)
    rx = S.as_dicts(r.series[0])
    empty = [x["t_s"] for x in rx if x["datagrams"] == 0]
    assert len(empty) >= 2, [x["datagrams"] for x in rx]  # 350 ms without a datagram: 2 or 3 whole intervals
    assert all(abs(b - a - 0.1) < 1e-6 for a, b in zip(empty, empty[1:], strict=False))  # one stretch
    assert sum(x["datagrams"] for x in rx) == r.datagrams_received
