"""The zero-loss search's decisions, driven by a simulated device under test.

These test the algorithm (what it keeps, what it claims); the network is exercised by the pps
suite's tests. The simulated trial returns what a measurement would: the generator offers
min(target, its ceiling); the device loses what exceeds its capacity.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from offlab.experiment.search import zero_loss_search
from offlab.sample import Probes, StoredSample, Traffic
from offlab.traffic import Workload


class Dut:
    def __init__(self, capacity: float, ceiling: float, loss_unknown_above: float | None = None) -> None:
        self.capacity, self.ceiling, self.unknown = capacity, ceiling, loss_unknown_above
        self.rates: list[float] = []

    def __call__(self, lab, w: Workload, capture) -> StoredSample:
        target = float(w.rate.removesuffix("pps"))
        self.rates.append(target)
        offered = min(target, self.ceiling)
        got = min(offered, self.capacity)
        loss = (offered - got) / offered
        if self.unknown is not None and offered > self.unknown:
            loss = None
        return StoredSample(traffic=Traffic(sent_pps=offered, pps=got, datagrams_sent=int(offered),
                                            datagrams_received=int(got), loss=loss), probes=Probes(window_s=1.0))


W = Workload(tool="engine", protocol="udp", size=64)


def test_the_reported_rate_was_offered_and_passed_and_the_trace_has_every_trial():
    dut = Dut(capacity=400_000, ceiling=5_000_000)
    s = zero_loss_search(None, W, 0.0, 10_000, 3_000_000, 12, trial=dut)
    found = s.search.found_pps
    assert 390_000 <= found <= 400_000
    assert s.search.generator_limited is False
    assert s.search.trials[-1].phase == "confirm" and s.search.trials[-1].passed
    assert len(s.search.trials) == len(dut.rates)
    assert all(t.loss > 0 for t in s.search.trials if t.achieved_pps > 400_000)


def test_a_search_stores_every_key_in_the_order_it_always_did_and_reads_back_the_same():
    from offlab.sample import SampleRecord
    from tests.synthetic_results import search_of

    s = zero_loss_search(None, W, 0.0, 10_000, 3_000_000, 12, trial=Dut(capacity=400_000, ceiling=5_000_000))
    stored = s.to_json()["search"]
    shape = search_of(1, None, 2)  # the record's shape as a search stored it before it was typed
    assert list(stored) == list(shape)
    # each trial: every key, null too (a trial without --trace stores kernel_loss null)
    assert all(list(t) == [*shape["trials"][0], "kernel_loss"] and t["kernel_loss"] is None for t in stored["trials"])
    back = SampleRecord.from_json({"sample": json.loads(json.dumps(s.to_json()))}).sample
    assert back.search == s.search and json.dumps(back.to_json()) == json.dumps(s.to_json())
    assert back.search.trials[-1].phase == "confirm" and back.search.found_pps == s.search.found_pps


def test_a_generator_that_cannot_offer_the_target_is_never_reported_as_that_rate():
    # the router case of issue 15: asked for up to 3 Mpps, the sender peaks near 210 kpps, no loss
    dut = Dut(capacity=10_000_000, ceiling=210_000)
    s = zero_loss_search(None, W, 0.0, 10_000, 3_000_000, 8, trial=dut)
    assert s.search.found_pps <= 210_000
    assert s.search.generator_limited is True
    assert s.search.generator_ceiling_pps == 210_000
    assert "generator's ceiling" in s.search.verdict and "not the bottleneck" in s.search.verdict


def test_loss_unknown_counts_as_failure():
    dut = Dut(capacity=10_000_000, ceiling=10_000_000, loss_unknown_above=100_000)
    s = zero_loss_search(None, W, 0.0, 10_000, 3_000_000, 12, trial=dut)
    assert s.search.found_pps <= 100_000
    assert all(not t.passed for t in s.search.trials if t.loss is None)


def test_a_tolerance_admits_a_little_loss():
    dut = Dut(capacity=1_000_000, ceiling=5_000_000)
    strict = zero_loss_search(None, W, 0.0, 10_000, 3_000_000, 14, trial=dut).search.found_pps
    loose = zero_loss_search(None, W, 0.01, 10_000, 3_000_000, 14, trial=Dut(1_000_000, 5_000_000)).search.found_pps
    assert strict <= 1_000_000 < loose <= 1_000_000 / 0.99 + 1


def test_nothing_passes_says_so_without_a_rate():
    dut = Dut(capacity=1_000, ceiling=5_000_000)
    s = zero_loss_search(None, W, 0.0, 10_000, 3_000_000, 10, trial=dut)
    assert s.search.found_pps is None
    assert min(dut.rates) == 10_000  # the lowest allowed rate was tried
    assert "no rate met" in s.search.verdict


def test_bad_bounds_are_bad_input():
    from offlab.errors import BadInput

    with pytest.raises(BadInput):
        zero_loss_search(None, W, 0.0, 3_000_000, 10_000, 5, trial=Dut(1, 1))


class ShortSender(Dut):
    """A sender that offers `offer(target)` instead of the target, in front of a DUT that loses."""

    def __init__(self, capacity: float, ceiling: float, offer) -> None:
        super().__init__(capacity, ceiling)
        self.offer = offer

    def __call__(self, lab, w: Workload, capture) -> StoredSample:
        return super().__call__(lab, dataclasses.replace(w, rate=f"{self.offer(float(w.rate.removesuffix('pps')))}pps"),
                                capture)


def test_a_short_sender_at_the_low_bound_does_not_hide_a_lossy_device():
    # vm-router, issue 10: the 1000 pps trial sent 932 pps and passed, the 81 kpps trial lost 87 %;
    # the search once said "generator-limited, the device under test was not the bottleneck".
    dut = ShortSender(1_500, 81_000, lambda t: t * 0.932 if t <= 2_000 else t)  # timer granularity
    s = zero_loss_search(None, W, 0.0, 1_000, 81_000, 8, trial=dut)
    assert s.search.generator_limited is False
    assert "not the bottleneck" not in s.search.verdict
    assert s.search.lowest_failing_pps is not None


def test_a_failed_trial_whose_sender_also_fell_short_is_loss_not_a_ceiling():
    # pps suite, issue 15: "no loss up to the generator's ceiling of 255571 pps" while the 256 k trial lost 35 %.
    dut = ShortSender(180_000, 255_571, lambda t: t * 0.97)  # a loaded sender, 3 % short at every rate
    s = zero_loss_search(None, W, 0.0, 10_000, 400_000, 10, trial=dut)
    assert s.search.generator_limited is False
    assert "not the bottleneck" not in s.search.verdict and "loss exceeded the threshold" in s.search.verdict
    assert 170_000 <= s.search.found_pps <= 180_000


# ---- on a real lab ---------------------------------------------------------------------------

def _shaper_drops(lab) -> int:
    """The datagrams the tbf on the router's egress to the server has dropped so far."""
    iface = lab.resolve_iface("router", "to-server")
    qdiscs = json.loads(lab.host("router").run(["tc", "-s", "-j", "qdisc", "show", "dev", iface]).stdout)
    [tbf] = [q for q in qdiscs if q["kind"] == "tbf"]
    return tbf["drops"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces")
def test_search_through_a_shaped_router_reports_a_rate_it_delivered_below_the_shaper(lab_name, clean_machine):
    """A router whose egress is shaped (tbf, ~960 pps of these datagrams): the search reports a rate at
    which the receiver really got the datagrams (loss within the threshold), and every search trial
    above it failed because the shaper dropped datagrams, by the shaper's own drop count; every
    setting goes back afterwards. Counts only: how fast this machine sends is not the question.

    The shaper's bucket (128 KB, 123 of these datagrams) holds the engine's largest catch-up burst at
    any rate below the shaper: a stalled sender sends what fell due at once, up to 100 ms of it (its
    pacing's MAX_LAG_NS; beyond that it moves its schedule). With a 16 KB bucket, a whole suite once
    had both confirmations fail (the highest passing rate near the shaper, and 632 pps after a stall)
    and found nothing. A 1.3 s trial within about a bucket of the shaper's rate passes: what it
    delivered is what it reports."""
    from offlab import lab as labs
    from offlab.experiment import teardown
    from offlab.experiment.measure import measure
    from offlab.knobs import Change, Transaction

    payload, max_loss = 1000, 0.01
    drops: list[int] = []  # the shaper's drops during each trial, in the trials' order

    def shaped_trial(lab, w, capture):
        before = _shaper_drops(lab)
        sample = measure(lab, w, capture)
        drops.append(_shaper_drops(lab) - before)
        return sample

    lab = labs.up("router", lab_name)
    try:
        with Transaction("search-test") as tx:
            tx.apply([Change(lab.host("router"), "qdisc", "tbf rate 8mbit burst 128kb latency 20ms", "to-server", lab)])
            w = Workload(tool="engine", protocol="udp", size=payload, duration=1.0, warmup=0.3)
            sample = zero_loss_search(lab, w, max_loss, low=100, high=4000, steps=5, trial=shaped_trial)
        iface = lab.resolve_iface("router", "to-server")
        qdisc = lab.host("router").run(["tc", "qdisc", "show", "dev", iface]).stdout
        assert "tbf" not in qdisc, qdisc
    finally:
        teardown.down(lab_name)
    s = sample.search
    assert s.found_pps is not None, (s.verdict, [(t.phase, t.target_pps, t.achieved_pps, t.loss, t.passed)
                                                  for t in s.trials], drops)
    assert len(drops) == len(s.trials)
    last = s.trials[-1]
    assert last.phase == "confirm" and last.passed and last.loss <= max_loss
    # delivered, counted: the receiver got all but the allowed share of what the confirmation sent
    assert last.sent > 0 and last.received >= last.sent * (1 - max_loss), last
    # the bisection's failures bound the search (a confirmation may fail too: then the next lower rate is
    # taken), and each is the shaper's doing
    failed = [(t, d) for t, d in zip(s.trials, drops, strict=True) if not t.passed and t.phase == "search"]
    assert failed and all(d > 0 for _, d in failed), (s.trials, drops)
    assert min(t.achieved_pps for t, _ in failed) > s.found_pps, s.trials
    assert s.lowest_failing_pps == int(min(t.achieved_pps for t, _ in failed))
