"""sockperf 3.7 ping-pong output (real captures) → whole round trips, whatever sockperf called them."""

from __future__ import annotations

from pathlib import Path

import pytest

from offlab.errors import EnvironmentProblem
from offlab.traffic.sockperf import parse_ping_pong

FIX = Path(__file__).parent / "fixtures" / "sockperf"


def test_half_round_trip_latency_is_doubled_into_rtt():
    r = parse_ping_pong((FIX / "ping-pong-udp-64.txt").read_text())
    assert not r.full_rtt
    # sockperf printed: percentile 50.000 = 23.339, 99.000 = 3154.898, avg-latency=201.073 (halves).
    assert r.rtt_p50_us == pytest.approx(46.678)
    assert r.rtt_p99_us == pytest.approx(6309.796)
    assert r.rtt_mean_us == pytest.approx(402.146)
    assert r.rtt_min_us == pytest.approx(27.19) and r.rtt_max_us == pytest.approx(34172.62)
    # Round trips are the [Valid Duration] ones; [Total Run] includes the warm-up.
    assert (r.round_trips, r.valid_s, r.total_sent, r.total_received) == (3856, 1.551, 5119, 5118)
    assert r.transactions_per_s == pytest.approx(3856 / 1.551)


def test_full_rtt_output_is_taken_as_is():
    r = parse_ping_pong((FIX / "ping-pong-udp-64-full-rtt.txt").read_text())
    assert r.full_rtt
    assert (r.rtt_p50_us, r.rtt_p90_us, r.rtt_p99_us, r.rtt_p99_9_us) == (43.814, 196.521, 4417.406, 17546.091)
    assert r.rtt_mean_us == 338.214 and r.round_trips == 4591
    assert r.rtt_min_us <= r.rtt_p50_us <= r.rtt_p99_us <= r.rtt_max_us


def test_tcp_output_parses_the_same_way():
    r = parse_ping_pong((FIX / "ping-pong-tcp-64-full-rtt.txt").read_text())
    assert r.full_rtt and r.round_trips == 4802 and r.total_sent == 6124
    assert r.rtt_mean_us == 323.444


def test_output_without_a_summary_is_an_environment_problem():
    with pytest.raises(EnvironmentProblem, match="no ping-pong summary"):
        parse_ping_pong("sockperf: ERROR: Connection refused\n")
