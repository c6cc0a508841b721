"""The kernel's account as typed records: a real traced sample's `probes.trace` (TraceAccount) and
`kernel_account` (KernelAccount) read back the very JSON they were stored as, key order included, and
their fields hold the figures the JSON holds; the store gives them back as the same views."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.experiment import kernel_account
from offlab.metrics import metrics_of
from offlab.sample import (GsoTally, Hop, KernelAccount, KernelLoss, StoredSample, TraceAccount, TraceDrop,
                           UsoVerdict, records)
from offlab.store import Store

TRACE = Path(__file__).parent / "fixtures" / "trace"
TRACED = sorted(p.name for p in TRACE.glob("*.json"))


def _stored(name: str) -> dict:
    return json.loads((TRACE / name).read_text())


def test_every_traced_fixture_is_there():
    assert len(TRACED) == 10 and all("kernel_account" in _stored(n) for n in TRACED)


@pytest.mark.parametrize("name", TRACED)
def test_a_stored_trace_and_kernel_account_read_back_as_they_were_stored(name):
    d = _stored(name)
    trace, ka = d["probes"]["trace"], d["kernel_account"]
    assert json.dumps(TraceAccount.from_json(trace).to_json()) == json.dumps(trace)
    assert json.dumps(KernelAccount.from_json(ka).to_json()) == json.dumps(ka)
    s = StoredSample.from_json(d)
    assert isinstance(s.probes.trace, TraceAccount) and isinstance(s.kernel_account, KernelAccount)
    assert json.dumps(s.to_json()) == json.dumps(d)


def test_the_fields_hold_what_the_json_holds():
    # a queue of 1 packet on the client's veth: the engine's sends dropped as QDISC_DROP there
    d = _stored("qdisc-drops.json")
    s = StoredSample.from_json(d)
    tr, ka = s.probes.trace, s.kernel_account
    assert tr is not None and ka is not None
    (drop,) = tr.drops
    assert isinstance(drop, TraceDrop)
    assert (drop.host, drop.device, drop.reason, drop.location, drop.datagrams) == (
        "client", "olkacc30", "QDISC_DROP", "__dev_queue_xmit", 18586)
    assert (tr.tool, tr.window_s, tr.printed_s, tr.edge_lag_s) == ("bpftrace", 0.93706, [0.719788, 0.107177],
                                                                   [4e-05, 2.3e-05])
    assert [(r.host, r.device, r.gso_type, r.skbs, r.segments) for r in tr.xmit] == [
        ("client", "olkacc30", "-", 684, 684)]
    assert tr.queue[0].skbs == 19275 and tr.rx[0].device == "olkacc31" and tr.gro_in == []
    lo = ka.loss
    assert isinstance(lo, KernelLoss) and (lo.dropped, lo.lost, lo.unseen, lo.unseen_share) == (18586, 11, 0, 0.0)
    assert lo.places[0].share == 1.0 and lo.places[0].reason == "QDISC_DROP"
    assert lo.vs_lost is not None and (lo.vs_lost.kernel, lo.vs_lost.other, lo.vs_lost.difference) == (18586, 11, 18575)
    assert lo.vs_lost.agree is False and lo.vs_counters is not None and lo.vs_counters.difference_share is None
    (pair,) = lo.by_reason
    assert (pair.counter, pair.reasons, pair.kernel, pair.other) == ("qdisc", ["QDISC_DROP", "QDISC_OVERLIMIT"], 18586, 0)
    client, server = ka.hops
    assert isinstance(client, Hop) and (client.host, client.device) == ("client", "olkacc30")
    assert (client.queued.skbs, client.sent.skbs, server.received.skbs) == (19275, 684, 684)
    assert isinstance(ka.uso, UsoVerdict) and ka.uso.exercised is False and ka.uso.skbs == 684
    assert ka.unavailable is None and ka.effects == [] and not ka.has("effects")


def test_super_packets_by_gso_type_are_typed_too():
    # USO on the client's veth with the engine's UDP_SEGMENT: its driver was handed UDP_L4 super-packets
    d = _stored("uso-on-gso.json")
    ka = StoredSample.from_json(d).kernel_account
    assert ka is not None
    (client,) = [h for h in ka.hops if h.host == "client"]
    udp = client.sent.by_type["UDP_L4"]
    stored = next(h for h in d["kernel_account"]["hops"] if h["host"] == "client")["sent"]["by_type"]["UDP_L4"]
    assert isinstance(udp, GsoTally) and (udp.super_packets, udp.segments) == (stored["super_packets"], stored["segments"])
    assert udp.super_packets > 100
    assert ka.uso is not None and ka.uso.exercised is True


@pytest.mark.parametrize("name", TRACED)
def test_judging_a_stored_trace_again_gives_views_that_store_as_json(name):
    s = StoredSample.from_json(_stored(name))
    ka = kernel_account.judge(s)
    assert isinstance(ka, KernelAccount) and all(isinstance(h, Hop) for h in ka.hops)
    s.kernel_account = ka
    again = StoredSample.from_json(json.loads(json.dumps(s.to_json())))
    assert again.kernel_account is not None and again.kernel_account.to_json() == ka.to_json()
    assert json.dumps(again.to_json()) == json.dumps(s.to_json())


def test_the_store_gives_the_account_back_as_it_was_stored(tmp_path):
    d = _stored("nft-drops.json")
    with Store.open(tmp_path / "k.db") as store:
        run_id = store.create_run("kacc", "name: kacc", {}, 1, {}, {"rule": "drop"}, {})
        ids = store.add_cells(run_id, [{"key": "drop", "params": {"rule": "drop"}, "settings": {}}])
        store.add_sample(run_id, ids["drop"], 0, StoredSample.from_json(d).to_json(), metrics_of(StoredSample.from_json(d)))
        (row,) = records(store.samples(run_id))
    assert isinstance(row.sample.kernel_account, KernelAccount)
    assert json.dumps(row.sample.kernel_account.to_json()) == json.dumps(d["kernel_account"])
    assert json.dumps(row.sample.probes.to_json()["trace"]) == json.dumps(d["probes"]["trace"])


def test_a_view_is_read_by_its_fields_and_stores_the_json_it_was_read_from():
    d = _stored("rcvbuf-drops.json")
    ka = KernelAccount.from_json(d["kernel_account"])
    assert ka.to_json() == d["kernel_account"]
    assert d["kernel_account"]["loss"]["places"][0]["reason"] == ka.loss.places[0].reason == "SOCKET_RCVBUFF"  # type: ignore[union-attr]
    assert list(ka.to_json()) == list(d["kernel_account"]) and not ka.has("unavailable") and ka.unavailable is None
    with pytest.raises(TypeError):  # not a dict: no key reads
        ka["unavailable"]  # type: ignore[index]


def test_plus_stores_each_key_given_in_its_place_or_after_the_rest():
    row = {"host": "client", "device": "v0", "reason": "QDISC_DROP", "location": "x", "datagrams": 9}
    drop = TraceDrop.from_json(row)
    assert list(drop.plus(datagrams=0, what="sent again").to_json().items()) == list(
        {**row, "datagrams": 0, "what": "sent again"}.items())
    assert drop.to_json() == row  # the view it was made from is as it was


def test_a_cells_accounts_summed_are_typed_too():
    from offlab.report import kernel as rk

    accounts = [StoredSample.from_json(_stored(n)).kernel_account for n in ("nft-drops.json", "nft-drops.json")]
    m = rk.merge([*accounts, KernelAccount.from_json({"unavailable": "bpftrace did not start"})])
    assert isinstance(m, rk.CellKernelAccount) and (m.samples, m.traced) == (3, 2)
    assert m.unavailable == ["bpftrace did not start"]
    one = accounts[0]
    assert one is not None and one.loss is not None and m.loss is not None
    assert m.loss.samples == 2 and m.loss.dropped == 2 * one.loss.dropped
    assert [(p.host, p.reason) for p in m.loss.places] == [("server", "NETFILTER_DROP")]
    assert all(isinstance(h, Hop) for h in m.hops) and m.hops[0].sent.skbs == 2 * one.hops[0].sent.skbs
    assert isinstance(m.uso, rk.CellUso) and m.uso.samples == 2


def test_an_account_stored_as_an_empty_object_counts_as_none_taken():
    from offlab.report import kernel as rk

    d = _stored("nft-drops.json")
    s = StoredSample.from_json({**d, "probes": {**d["probes"], "trace": {}}})
    assert s.probes.trace is not None and s.probes.trace.empty and kernel_account.judge(s) is None
    empty = KernelAccount.from_json({})
    assert empty.empty and rk.merge([empty, None]) is None and kernel_account.disagreements(empty) == []
    assert rk.loss_lines(None) == rk.segmentation_lines(None) == rk.unavailable_lines(None) == []
    # an empty comparison is no disagreement; an empty loss or USO verdict is none in a cell's sum
    ka = d["kernel_account"]
    quiet = KernelAccount.from_json({**ka, "loss": {**ka["loss"], "vs_lost": {}, "vs_counters": {}}})
    assert kernel_account.disagreements(KernelAccount.from_json(ka)) != [] == kernel_account.disagreements(quiet)
    m = rk.merge([quiet])
    assert m is not None and m.loss is not None and not m.loss.has("vs_lost") and not m.loss.has("vs_counters")
    assert not any("DISAGREES" in line for line in rk.loss_lines(m))
    bare = rk.merge([KernelAccount.from_json({**ka, "loss": {}, "uso": {}})])
    assert bare is not None and bare.loss is None and bare.uso is None and bare.traced == 1
    assert rk.loss_lines(bare) == [] and not any(line.startswith("USO") for line in rk.segmentation_lines(bare))
