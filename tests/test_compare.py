"""Cells against their baseline cells: partial baselines, verdicts, flags, and --fail-if-slower."""

from __future__ import annotations

import itertools
import json

import pytest

from offlab.report import compare
from offlab.errors import BadInput
from offlab.store import Store
from synthetic_results import make_uso_run
from tests.helpers import run as offlab_in_process

REPEAT = {"min": 3, "max": 10, "level": 95, "width": 5}


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "offlab.db")
    yield s
    s.close()


def matrix_run(store: Store, axes: dict[str, list[str]], values, baseline: dict | None, statuses=None) -> int:
    """A run over the cartesian product of `axes`; values(params) → {metric: [values]} for each cell."""
    run = store.create_run("t", "name: t\n", {"axes": axes}, 1, {}, baseline, REPEAT)
    names = list(axes)
    for combo in itertools.product(*axes.values()):
        params = dict(zip(names, combo, strict=True))
        key = ",".join(f"{k}={v}" for k, v in params.items())
        cid = store.add_cells(run, [{"key": key, "params": params, "settings": {}}])[key]
        status, reason = (statuses or {}).get(key, ("done", None))
        if status == "skipped":
            store.set_cell_status(cid, status, reason)
            continue
        per_metric = values(params)
        n = len(next(iter(per_metric.values())))
        for i in range(n):
            store.add_sample(run, cid, i, {}, {m: vs[i] for m, vs in per_metric.items()})
        store.set_cell_status(cid, status, reason)
    return run


def thr(params) -> dict[str, list[float]]:
    base = {"1472": 2.0e9, "8972": 8.0e9}[params["payload"]]
    gain = 1.5 if params["offload"] == "on" else 1.0
    gain *= 1.2 if params.get("streams") == "2" else 1.0
    return {"throughput_bps": [base * gain * f for f in (0.99, 1.0, 1.01)]}


def test_partial_baseline_compares_each_payload_on_against_its_own_off(store):
    run = matrix_run(store, {"payload": ["1472", "8972"], "offload": ["off", "on"]}, thr, {"offload": "off"})
    rows = compare.compare_run(store, run, metrics=("throughput_bps",))
    assert {(r.cell, r.baseline) for r in rows} == {
        ("payload=1472,offload=on", "payload=1472,offload=off"),
        ("payload=8972,offload=on", "payload=8972,offload=off"),
    }
    for r in rows:
        assert r.ratio == pytest.approx(1.5)
        assert r.change_pct == pytest.approx(50.0)
        assert r.low < 1.5 < r.high and r.low > 1.0
        assert r.verdict == "faster" and r.improved is True
        assert (r.n_baseline, r.n_cell) == (3, 3)


def test_baseline_over_two_axes_holds_the_third_fixed(store):
    axes = {"payload": ["1472", "8972"], "offload": ["off", "on"], "streams": ["1", "2"]}
    run = matrix_run(store, axes, thr, None)
    rows = compare.compare_run(store, run, baseline={"offload": "off", "streams": "1"}, metrics=("throughput_bps",))
    pairs = {r.cell: r.baseline for r in rows}
    assert len(pairs) == 6  # 8 cells minus the 2 baselines
    assert pairs["payload=8972,offload=on,streams=2"] == "payload=8972,offload=off,streams=1"
    assert pairs["payload=1472,offload=off,streams=2"] == "payload=1472,offload=off,streams=1"
    on2 = next(r for r in rows if r.cell == "payload=8972,offload=on,streams=2")
    assert on2.ratio == pytest.approx(1.8)


def test_run_baseline_can_be_overridden(store):
    run = matrix_run(store, {"payload": ["1472", "8972"], "offload": ["off", "on"]}, thr, {"offload": "off"})
    rows = compare.compare_run(store, run, baseline={"offload": "on"}, metrics=("throughput_bps",))
    assert {r.cell for r in rows} == {"payload=1472,offload=off", "payload=8972,offload=off"}
    assert all(r.verdict == "slower" and r.change_pct == pytest.approx(-100 / 3) for r in rows)


def test_baseline_that_matches_no_cell_is_bad_input_naming_it(store):
    run = matrix_run(store, {"payload": ["1472", "8972"], "offload": ["off", "on"]}, thr, {"offload": "off"})
    with pytest.raises(BadInput, match=r"baseline offload=of matches no cell of run \d+ "
                                       r"\(offload is one of: off, on\)"):
        compare.compare_run(store, run, baseline={"offload": "of"})
    with pytest.raises(BadInput, match=r"baseline mtu=9000: run \d+ has no axis 'mtu'"):
        compare.compare_run(store, run, baseline={"mtu": "9000"})
    with pytest.raises(BadInput, match="unknown metric 'goodput'"):
        compare.compare_run(store, run, metrics=("goodput",))


def test_run_without_baseline_asks_for_one(store):
    run = matrix_run(store, {"offload": ["off", "on"]}, lambda p: thr({**p, "payload": "1472"}), None)
    with pytest.raises(BadInput, match=r"no baseline: pass --baseline AXIS=VALUE \(axes: offload \(off/on\)\)"):
        compare.compare_run(store, run)


def test_skipped_cells_and_unreached_confidence_are_flagged_not_hidden(store):
    statuses = {"payload=8972,offload=on": ("skipped", "tx-udp-segmentation is [fixed] off: cannot test here"),
                "payload=1472,offload=on": ("confidence_not_reached", "interval 7.1 % after 10 rounds")}
    run = matrix_run(store, {"payload": ["1472", "8972"], "offload": ["off", "on"]}, thr, {"offload": "off"},
                     statuses)
    rows = compare.compare_run(store, run, metrics=("throughput_bps", "pps"))
    skipped = [r for r in rows if r.cell == "payload=8972,offload=on"]
    assert [r.verdict for r in skipped] == ["skipped", "skipped"]
    assert skipped[0].cell_reason == "tx-udp-segmentation is [fixed] off: cannot test here"
    (unsure,) = [r for r in rows if r.cell == "payload=1472,offload=on"]  # pps has no values: no row
    assert unsure.verdict == "faster" and "cell: confidence not reached" in unsure.flags
    assert compare.sentence([unsure]).startswith("payload=1472: offload=on vs offload=off: +50.0 % throughput")


def test_baseline_mean_of_zero_is_judged_by_the_difference(store):
    def loss(p):
        return {"loss": [0.0, 0.0, 0.0] if p["offload"] == "off" else [0.010, 0.012, 0.014]}
    run = matrix_run(store, {"offload": ["off", "on"]}, loss, {"offload": "off"})
    (r,) = compare.compare_run(store, run, metrics=("loss",))
    assert r.ratio is None and r.change_pct is None
    assert r.diff == pytest.approx(0.012)
    assert r.verdict == "higher (worse)" and r.improved is False


def slowdowns(p) -> dict[str, list[float]]:
    """Cells slower than their baseline by: a 20 % (tight), b 3 % (tight), c 20 % (noisy: not significant)."""
    if p["variant"] == "base":
        return {"throughput_bps": [10.0, 10.1, 9.9], "sd_total_us_per_kib": [1.0, 1.01, 0.99]}
    mean, spread = {"a": (8.0, 0.1), "b": (9.7, 0.05), "c": (8.0, 6.0)}[p["variant"]]
    return {"throughput_bps": [mean - spread, mean, mean + spread],
            "sd_total_us_per_kib": [1.25 * 0.99, 1.25, 1.25 * 1.01]}


def test_fail_if_slower_takes_significant_slowdowns_beyond_pct(store):
    run = matrix_run(store, {"variant": ["base", "a", "b", "c"]}, slowdowns, {"variant": "base"})
    rows = compare.compare_run(store, run, metrics=("throughput_bps", "sd_total_us_per_kib"))
    assert {r.cell for r in compare.fail_if_slower(rows, 10)} == {"variant=a"}
    assert {r.cell for r in compare.fail_if_slower(rows, 2)} == {"variant=a", "variant=b"}
    assert compare.fail_if_slower(rows, 25) == []
    # Service demand +25 % is 1/1.25 = 20 % less work per CPU µs: counted only when asked for, by its inverse.
    inverse = compare.fail_if_slower(rows, 15, metrics=("sd_total_us_per_kib",))
    assert {r.cell for r in inverse} == {"variant=a", "variant=b", "variant=c"}
    assert compare.fail_if_slower(rows, 25, metrics=("sd_total_us_per_kib",)) == []


def test_compare_runs_matches_cell_keys_across_runs(store):
    a, _ = make_uso_run(store, rounds=3, seed=1)
    b, _ = make_uso_run(store, rounds=3, seed=2, scale=0.8, skip=None, name="uso-new-kernel")
    rows = compare.compare_runs(store, a, b, metrics=("throughput_bps",))
    by_cell = {r.cell: r for r in rows}
    assert len(by_cell) == 6
    assert by_cell["payload=1472@1500,offload=off"].verdict == "slower"
    assert by_cell["payload=1472@1500,offload=off"].change_pct == pytest.approx(-20, abs=3)
    assert by_cell["payload=65507@1500,offload=on"].verdict == "baseline skipped"  # skipped in A only
    assert {r.run for r in rows} == {b} and {r.baseline_run for r in rows} == {a}


def test_compare_cli_exits_1_when_asked_to_fail_on_a_slowdown(store, tmp_path):
    run = matrix_run(store, {"variant": ["base", "a", "b", "c"]}, slowdowns, {"variant": "base"})
    db = str(tmp_path / "offlab.db")
    ok = offlab_in_process("compare", str(run), "--db", db, "--fail-if-slower", "25", env={"COLUMNS": "160"})
    assert ok.returncode == 0, ok.stderr
    assert "variant=a" in ok.stdout and "slower" in ok.stdout and "−20.0 %" in ok.stdout
    bad = offlab_in_process("compare", str(run), "--db", db, "--fail-if-slower", "10", "--json")
    assert bad.returncode == 1
    out = json.loads(bad.stdout)
    assert [f["cell"] for f in out["fail_if_slower"]["failed"]] == ["variant=a"]
    assert "variant=a: throughput -20.0 %" in bad.stderr
    wrong = offlab_in_process("compare", str(run), "--db", db, "--baseline", "variant=z")
    assert wrong.returncode == 2 and "variant=z matches no cell" in wrong.stderr
    csv_out = offlab_in_process("compare", str(run), "--db", db, "--metric", "throughput_bps", "--csv").stdout.splitlines()
    assert csv_out[0].startswith("run,baseline_run,cell,baseline,metric,") and len(csv_out) == 1 + 3


def test_failed_cells_are_flagged_and_a_dead_path_fails_the_gate(store):
    def dead(p):
        return {"throughput_bps": [0.0, 0.0] if p["mtu"] == "1400" else [9.4e9, 9.5e9, 9.3e9]}
    statuses = {"mtu=1400": ("failed", "no data crossed the path (throughput 0)")}
    run = matrix_run(store, {"mtu": ["1500", "1400"]}, dead, {"mtu": "1500"}, statuses)
    (row,) = compare.compare_run(store, run, metrics=("throughput_bps",))
    # A failed cell shows no figures (not "−100 %" as if measured), only why; it still fails the gate.
    assert row.verdict == "failed" and row.change_pct is None and row.mean_cell is None
    assert row.cell_reason == "no data crossed the path (throughput 0)"
    assert "cell: failed" in row.flags
    assert compare.fail_if_slower(rows=[row], pct=50) == [row]
    cid = store.add_cells(run, [{"key": "mtu=1300", "params": {"mtu": "1300"}}])["mtu=1300"]
    store.set_cell_status(cid, "failed", "lab did not come up")
    rows = compare.compare_run(store, run, metrics=("throughput_bps",))
    assert {r.cell: r.verdict for r in rows}["mtu=1300"] == "failed"


def test_print_comparison_after_a_run_handles_runs_without_baseline(store, capsys):
    from offlab.cli import results

    with_base = matrix_run(store, {"payload": ["1472", "8972"], "offload": ["off", "on"]}, thr, {"offload": "off"})
    results.print_comparison(store, with_base)
    assert "offload=on vs offload=off" in capsys.readouterr().out
    without = matrix_run(store, {"payload": ["1472", "8972"], "offload": ["off", "on"]}, thr, None)
    results.print_comparison(store, without)
    printed = capsys.readouterr().out
    assert "payload=8972,offload=on" in printed and "Gbit/s" in printed


def coalescing(params) -> dict[str, list[float]]:
    """GRO on: more throughput, a worse p99 under load; the idle p50 does not move."""
    on = params["gro"] == "on"
    return {"throughput_bps": [(8e9 if on else 5e9) * f for f in (0.99, 1.0, 1.01)],
            "rtt_p50_us": [40.0, 41.0, 40.5],
            "loaded_rtt_p99_us": [(900.0 if on else 300.0) * f for f in (0.97, 1.0, 1.03)]}


def test_latency_is_lower_is_better_and_a_faster_cell_with_a_worse_p99_says_both(store):
    run = matrix_run(store, {"gro": ["off", "on"]}, coalescing, {"gro": "off"})
    rows = compare.compare_run(store, run, metrics=("throughput_bps", "rtt_p50_us", "loaded_rtt_p99_us"))
    by = {r.metric: r for r in rows}
    assert by["throughput_bps"].verdict == "faster" and by["throughput_bps"].improved is True
    assert by["loaded_rtt_p99_us"].better == "lower"
    assert by["loaded_rtt_p99_us"].verdict == "higher (worse)" and by["loaded_rtt_p99_us"].improved is False
    assert by["rtt_p50_us"].verdict == "no significant difference"
    assert compare.trade_off(rows) == "faster, but rtt p99 under load worse"
    assert compare.sentence(rows).endswith("— faster, but rtt p99 under load worse")


def test_no_trade_off_is_claimed_when_throughput_and_latency_agree_or_nothing_is_significant(store):
    run = matrix_run(store, {"gro": ["off", "on"]},
                     lambda p: {"throughput_bps": [5e9, 5.01e9, 4.99e9],
                                "loaded_rtt_p99_us": [(100.0 if p["gro"] == "on" else 300.0) * f
                                                      for f in (0.97, 1.0, 1.03)]}, {"gro": "off"})
    rows = compare.compare_run(store, run, metrics=("throughput_bps", "loaded_rtt_p99_us"))
    assert {r.metric: r.verdict for r in rows}["loaded_rtt_p99_us"] == "lower (better)"
    assert compare.trade_off(rows) is None


def test_compare_cli_shows_both_verdicts_and_the_trade_off(store, tmp_path):
    run = matrix_run(store, {"gro": ["off", "on"]}, coalescing, {"gro": "off"})
    store.close()
    res = offlab_in_process("compare", str(run), "--db", str(tmp_path / "offlab.db"), "--metric", "throughput_bps",
                            "--metric", "loaded_rtt_p99_us")
    assert res.returncode == 0, res.stderr
    assert "faster, but rtt p99 under load worse" in res.stdout
    assert "faster" in res.stdout and "higher (worse)" in res.stdout
    js = json.loads(offlab_in_process("compare", str(run), "--db", str(tmp_path / "offlab.db"), "--json").stdout)
    assert js["trade_offs"] == [{"cell": "gro=on", "baseline": "gro=off",
                                 "text": "faster, but rtt p99 under load worse"}]
