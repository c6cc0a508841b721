"""One typed record from measure to the store: assembled by measure's and the runner's own code, a real
sample's parts give back the very JSON it was stored as (keys, key order, nulls); the metrics read from
the record are the figures the store holds."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from offlab.experiment import effects, kernel_account, measure, witnesses
from offlab.experiment.runner import as_run
from offlab.metrics import metrics_of
from offlab.probes.capture import CaptureSummary
from offlab.sample import (MEASURED_KEYS, Consistency, Effect, GuestBoot, GuestNic, KernelAccount, KnobOutcome,
                           LossAttribution, NicRow, Probes, RrPhase, Segment, StoredSample, Traffic, records)
from offlab.store import Store
from offlab.traffic import TrafficResult, Workload
from offlab.traffic.rr import RrResult, RrWorkload
from tests.helpers import recorded_history

FIX = Path(__file__).parent / "fixtures"
RUN_KEYS = ("in_force", "knob_writes", "knobs", "guest_boot", "round_position")


def measured_parts(d: dict) -> StoredSample:
    """A sample made as measure makes it (`StoredSample.measured`), from stored sample `d`'s parts, each
    read through its view as its producer hands it over."""
    parts = StoredSample.from_json({k: d[k] for k in MEASURED_KEYS})
    return StoredSample.measured(**{k: getattr(parts, k) for k in MEASURED_KEYS})


def run_additions(sample: StoredSample, d: dict) -> StoredSample:
    """What the runner adds, through its own code, with stored sample `d`'s values."""
    boot = GuestBoot.from_json(d["guest_boot"]) if d.get("guest_boot") is not None else None
    return as_run(sample, d["in_force"], d["knob_writes"], d["knobs"], boot, d.get("round_position"))


@pytest.fixture
def found_as_stored(monkeypatch):
    """The witnesses stand in for by what sample `d` stored (their logic has moved on since some fixtures
    were measured): measure's `_witnessed` and `_judged` then assemble exactly what they found."""
    def stub(d: dict) -> None:
        monkeypatch.setattr(witnesses, "bound", lambda traffic: [])
        monkeypatch.setattr(witnesses, "offered_short", lambda workload, traffic: None)
        monkeypatch.setattr(witnesses, "cross_check", lambda s: Consistency.from_json(d["consistency"]))
        monkeypatch.setattr(witnesses, "attribute_loss", lambda s: d["loss_attribution"] and
                            LossAttribution.from_json(d["loss_attribution"]))
        monkeypatch.setattr(witnesses, "segmentation", lambda probes, mtus: [Segment.from_json(x)
                                                                             for x in d["segmentation"]])
        monkeypatch.setattr(witnesses, "zerocopy", lambda traffic: None)
        monkeypatch.setattr(witnesses, "big_packets", lambda probes: None)
        monkeypatch.setattr(witnesses, "out_of_range", lambda s: [])
        # made as the effect witnesses make them: fresh, every field given
        monkeypatch.setattr(effects, "witness", lambda s, settings: [Effect(**e) for e in d.get("effects") or []])
        monkeypatch.setattr(kernel_account, "judge", lambda s: None if d.get("kernel_account") is None
                            else KernelAccount.from_json(d["kernel_account"]))
        monkeypatch.setattr(kernel_account, "disagreements", lambda ka: [])
    return stub


STREAMS = ["sample/engine_udp_measure.json",  # offlab measure --json
           "effects/dpdk-vm-csum-gro.json",  # guests, effects
           "trace/rcvbuf-gso.json",  # kernel_account
           "effects/veth-busypoll-gro.json"]  # a run's sample: in_force, knob_writes, knobs


@pytest.mark.parametrize("name", STREAMS)
def test_a_stream_sample_assembled_by_measure_and_the_runner_is_the_json_it_was_stored_as(name, found_as_stored):
    d = json.loads((FIX / name).read_text())
    found_as_stored(d)
    sample = measured_parts({**d, "consistency": None, "loss_attribution": None, "segmentation": None,
                             "effects": None})
    sample = measure._witnessed(sample, [])
    if "in_force" in d:
        run_additions(sample, d)
    assert json.dumps(sample.to_json()) == json.dumps(d)


def test_every_sample_of_a_recorded_history_assembles_into_its_stored_json(tmp_path):
    with Store.open(recorded_history(tmp_path), create=False) as store:
        rows = [r for run in store.list_runs() for r in store.samples(run["id"])]
    assert len(rows) == 33
    for row in rows:
        d = row["sample"]
        assert json.dumps(run_additions(measured_parts(d), d).to_json()) == json.dumps(d)


def test_a_sample_not_traced_stores_no_kernel_account_and_a_traced_one_stores_it_after_guests():
    d = json.loads((FIX / "sample" / "engine_udp_measure.json").read_text())
    assert "kernel_account" not in measured_parts(d).to_json()
    traced = measured_parts(d)
    traced.kernel_account = {"unavailable": "no bpftrace"}
    assert list(traced.to_json()) == [*MEASURED_KEYS, "kernel_account"]


def test_a_runs_additions_are_stored_in_the_order_the_runner_always_wrote_them():
    d = json.loads((FIX / "sample" / "engine_udp_measure.json").read_text())
    boot = GuestBoot.keyed(boot=1, lab="x", nic={}, guest_cpus=None).plus(boots_so_far=2)
    s = as_run(measured_parts(d), [], {"applied": 0}, [], boot, 0)
    s.kernel_account = {"hops": []}
    assert list(s.to_json()) == [*MEASURED_KEYS, "kernel_account", *RUN_KEYS]
    assert s.to_json()["round_position"] == 0 and s.to_json()["in_force"] == [] and s.to_json()["knobs"] == []
    # no guest booted, no round position given: the keys stay out, as they always did
    assert list(as_run(measured_parts(d), [], {}, [], None, None).to_json()) == [*MEASURED_KEYS, *RUN_KEYS[:3]]


def _rr_under_load(d: dict, *, idle_account: dict | None = None, account: dict | None = None) -> StoredSample:
    """rr_under_load_measure.json assembled again by measure's code: the idle phase from its RrResult, the
    idle sample (measure_rr's), the loaded phase, and the stream's sample made rr-under-load's."""
    idle_stored, loaded_stored = d["rr"]["idle"], d["rr"]["loaded"]
    beside = ("cpu", "cpu_us_per_transaction")
    result = RrResult(**{k: v for k, v in idle_stored.items() if k not in beside})
    idle = measure.rr_sample(d["lab"], d["topology"], RrWorkload(**d["workload"]["rr"]), d["started_at"],
                             result.stored(**{k: idle_stored[k] for k in beside}), Probes(), [])
    idle.kernel_account = idle_account
    stream_workload = {k: v for k, v in d["workload"].items() if k not in ("kind", "rr")}
    notes = [n for n in d["notes"] if not n.startswith("rr idle: ")]  # the one under_load adds
    stream = measured_parts({**d, "workload": stream_workload, "rr": None, "notes": notes})
    stream.kernel_account = account
    return measure.under_load(stream, idle, RrResult(**loaded_stored).stored(), Workload(**stream_workload),
                              RrWorkload(**d["workload"]["rr"]))


def test_an_rr_under_load_sample_assembled_by_measure_is_the_json_it_was_stored_as():
    d = json.loads((FIX / "sample" / "rr_under_load_measure.json").read_text())
    assert json.dumps(_rr_under_load(d).to_json()) == json.dumps(d)


def test_a_traced_rr_under_load_sample_stores_each_phases_account_where_it_always_did():
    d = json.loads((FIX / "sample" / "rr_under_load_measure.json").read_text())
    got = _rr_under_load(d, idle_account={"hops": ["idle"]}, account={"hops": ["loaded"]}).to_json()
    # the idle phase's account after its figures, the sample's after `guests`
    expected = {**d, "rr": {**d["rr"], "idle": {**d["rr"]["idle"], "kernel_account": {"hops": ["idle"]}}},
                "kernel_account": {"hops": ["loaded"]}}
    assert json.dumps(got) == json.dumps(expected)


def test_an_rr_samples_json_has_every_measured_key_with_its_empty_stream_parts():
    d = json.loads((FIX / "sample" / "rr_under_load_measure.json").read_text())
    rw = RrWorkload(**d["workload"]["rr"])
    s = measure.rr_sample("l", "veth", rw, 1.0, RrPhase.from_json(d["rr"]["idle"]), Probes(), ["n"])
    out = s.to_json()
    assert list(out) == list(MEASURED_KEYS)
    assert out["traffic"] == {} and out["service_demand_us_per_kib"] == {} and out["capture"] is None
    assert out["workload"] == {"kind": "rr", **rw.to_dict()} and out["rr"] == {"idle": d["rr"]["idle"]}


def test_a_producer_hands_over_its_figures_as_the_view_of_what_it_stored():
    t = TrafficResult(tool="engine", protocol="udp", throughput_bps=1e9, loss=0.5, errors={"ENOBUFS": 2})
    assert isinstance(t.stored(), Traffic) and t.stored().error("ENOBUFS") == 2
    assert json.dumps(t.stored().to_json()) == json.dumps(t.to_dict())
    c = CaptureSummary(host="server", iface="eth0", mtu=1500, frames=3)
    assert json.dumps(c.stored().to_json()) == json.dumps(c.to_dict())


def test_an_effect_is_stored_with_every_field_in_order_even_at_its_default():
    e = Effect(setting="gro", where="server:eth0", value="on", status="off")
    assert list(e.stored().to_json()) == [f.name for f in dataclasses.fields(Effect) if f.name not in ("extra", "_keys")]
    assert e.stored().to_json()["cause"] is None and e.stored().to_json()["counters"] == {}


def test_the_metrics_of_a_typed_record_are_the_figures_the_store_holds(tmp_path):
    with Store.open(recorded_history(tmp_path), create=False) as store:
        rows = [r for run in store.list_runs() for r in store.samples(run["id"])]
    assert rows and all(r["metrics"] for r in rows)
    for row in rows:
        assert metrics_of(StoredSample.from_json(row["sample"])) == pytest.approx(row["metrics"], rel=1e-12)
        assert set(metrics_of(StoredSample.from_json(row["sample"]))) == set(row["metrics"])


def test_metrics_read_every_part_of_a_sample_through_its_fields():
    d = json.loads((FIX / "sample" / "rr_under_load_measure.json").read_text())
    m = metrics_of(StoredSample.from_json(d))
    assert m["throughput_bps"] == d["traffic"]["throughput_bps"]
    assert m["cpu_client_busy"] == d["probes"]["cpu"]["client"]["busy"]
    assert m["rtt_p50_us"] == d["rr"]["idle"]["rtt_p50_us"] and m["loaded_rtt_p99_us"] == d["rr"]["loaded"]["rtt_p99_us"]
    assert m["cpu_us_per_transaction"] == d["rr"]["idle"]["cpu_us_per_transaction"]
    assert m["sd_total_us_per_kib"] == d["service_demand_us_per_kib"]["total"]


def test_a_guests_record_assembled_by_measure_holds_each_nics_chain_as_it_was_stored(monkeypatch):
    d = json.loads((FIX / "effects" / "vm-xps-udp.json").read_text())
    nics = d["guests"]["client"]["nics"]
    monkeypatch.setattr(measure, "guest_chains", lambda lab: {"client": [GuestNic.from_json(n) for n in nics]})
    ran = {k: d["guests"]["client"].get(k) for k in measure.GUEST_KEYS}
    lab = SimpleNamespace(hosts={"client": SimpleNamespace(guest=ran), "server": SimpleNamespace(guest=None)})
    guests = measure.guests_of(lab)
    assert list(guests) == ["client"]
    # the keys a guest's run always stored, in their order, then its NICs' chains
    assert json.dumps(guests["client"].to_json()) == json.dumps({**ran, "nics": nics})
    (nic,) = guests["client"].nics
    assert (nic.iface, nic.tap, nic.tap_host) == ("eth0", nics[0]["tap"], "server")
    assert all(isinstance(r, NicRow) for r in nic.rows)
    assert [r.prop for r in nic.rows] == [r["prop"] for r in nics[0]["rows"]]
    fixed = [r.why for r in nic.rows if r.fixed_off]
    assert fixed == [r["why"] for r in nics[0]["rows"] if any(v.startswith("off [fixed]") for v in r["guest"].values())]


@pytest.mark.parametrize("name", ["sample/rr_under_load_measure.json", "sample/engine_udp_measure.json",
                                  "effects/bridge-tsooff.json"])
def test_a_samples_series_parts_are_the_parts_the_store_splits_series_from(name):
    from offlab.store import series_holders

    d = json.loads((FIX / name).read_text())
    if name == "sample/engine_udp_measure.json":  # and a request/response measurement stored whole under rr
        d["rr"] = {"transactions_per_s": 10.0, "series": [{"source": "offlab-engine rr", "columns": ["t_s"],
                                                           "rows": [[0.0]]}]}
    typed = [(part, [s.to_json() for s in series]) for part, series in StoredSample.from_json(d).series_parts()]
    assert json.dumps(typed) == json.dumps([(part, h["series"]) for part, h in series_holders(d)])


def test_a_store_rows_knobs_requested_against_actual_read_as_outcomes_and_write_back_the_same(tmp_path):
    db = tmp_path / "jumbo.db"
    conn = sqlite3.connect(db)
    conn.executescript((FIX / "directions" / "jumbo-loaded.sql").read_text())
    [(version,)] = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    conn.execute(f"PRAGMA user_version = {int(version)}")
    conn.close()
    with Store.open(db, create=False) as store:
        rows = [r for run in store.list_runs() for r in store.samples(run["id"])]
    assert rows and all(r["requested_vs_actual"] for r in rows)
    for row, rec in zip(rows, records(rows), strict=True):
        assert all(isinstance(o, KnobOutcome) for o in rec.requested_vs_actual)
        assert json.dumps(rec.to_json()) == json.dumps(row)
        first = row["requested_vs_actual"][0]
        o = rec.requested_vs_actual[0]
        assert (o.where, o.key, o.original, o.requested, o.actual, o.ok, o.reason) == (
            first["where"], first["key"], first["original"], first["requested"], first["actual"], first["ok"],
            first["reason"])
        # the runner stores the same outcomes in the sample's `knobs`
        assert [k.to_json() for k in rec.sample.knobs] == [k.to_json() for k in rec.requested_vs_actual]
