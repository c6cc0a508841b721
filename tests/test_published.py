"""`published`: a source's reported ratios in a plan, checked at load time, and shown beside ours by
`offlab compare`, `offlab results show` and the HTML report (stored synthetic results, no network)."""

from __future__ import annotations

import json

import pytest

from offlab.errors import BadInput
from offlab.experiment import suites
from offlab.experiment.plan import load_plan
from offlab.report import build_report, compare
from offlab.store import Store
from tests.helpers import run as offlab_in_process

PLAN = """\
name: gro-three-ways
topology: {kind: veth}
axes:
  gro:
    dpdk-gro: {features: {client: {gro: off}}}
    kernel-gro: {features: {server: {gro: on}}}
    no-gro: {features: {server: {gro: off}}}
workload: {tool: iperf3, protocol: tcp, duration: 1}
baseline: {gro: no-gro}
published:
  ref: seed 001
  ratios:
    - {cell: {gro: dpdk-gro}, baseline: {gro: kernel-gro}, change_pct: 49}
    - {cell: {gro: dpdk-gro}, change_pct: 63}
"""


def test_a_plan_carries_its_sources_ratios_each_with_its_baseline():
    p = load_plan(PLAN, "p.yaml")
    assert p.published == {"ref": "seed 001", "metric": "throughput_bps", "ratios": [
        {"cell": {"gro": "dpdk-gro"}, "baseline": {"gro": "kernel-gro"}, "change_pct": [49.0]},
        {"cell": {"gro": "dpdk-gro"}, "baseline": {"gro": "no-gro"}, "change_pct": [63.0]}]}  # the plan's baseline
    assert p.to_dict()["published"] == p.published
    ranged = load_plan(PLAN.replace("change_pct: 63", "change_pct: [0, 124]"), "p.yaml")
    assert ranged.published["ratios"][1]["change_pct"] == [0.0, 124.0]


@pytest.mark.parametrize("old, new, field", [
    ("change_pct: 49", "change_pct: lots", "published.ratios.0.change_pct"),
    ("change_pct: 49", "change_pct: -100", "published.ratios.0.change_pct"),
    ("change_pct: 63", "change_pct: [124, 0]", "published.ratios.1.change_pct"),
    ("change_pct: 49", "change_pct: true", "published.ratios.0.change_pct"),
    ("{gro: kernel-gro}, change_pct", "{gro: kernell-gro}, change_pct", "published.ratios.0.baseline.gro"),
    ("cell: {gro: dpdk-gro}, change_pct", "cell: {offload: on}, change_pct", "published.ratios.1.cell.offload"),
    ("cell: {gro: dpdk-gro}, change_pct", "cell: {gro: no-gro}, change_pct", "published.ratios.1"),
    ("ref: seed 001", "ref: ''", "published.ref"),
    ("ref: seed 001", "ref: seed 001\n  metric: speed", "published.metric"),
    ("ref: seed 001", "ref: seed 001\n  source: paper", "published.source"),
    ("    - {cell: {gro: dpdk-gro}, change_pct: 63}\n", "    - {cell: {gro: dpdk-gro}, change: 63}\n",
     "published.ratios.1.change"),
])
def test_a_bad_published_value_is_refused_naming_its_field_and_line(old, new, field):
    assert old in PLAN
    with pytest.raises(BadInput) as exc:
        load_plan(PLAN.replace(old, new), "p.yaml")
    text = str(exc.value)
    assert text.startswith("p.yaml:") and field in text, text


def test_a_bad_published_value_is_exit_2_in_one_line(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.replace("change_pct: 49", "change_pct: lots"))
    res = offlab_in_process("run", str(plan), "--validate")
    assert res.returncode == 2 and "published.ratios.0.change_pct" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_dpdk_suites_carry_seed_001s_ratios_and_uso_does_not():
    gro = suites.plans("dpdk-gro", quick=True)[0].published
    assert gro["ref"] == "seed 001" and [(r["baseline"]["gro"], r["change_pct"]) for r in gro["ratios"]] == [
        ("kernel-gro", [49.0]), ("no-gro", [63.0])]
    gso = suites.plans("dpdk-gso", quick=True)[0].published
    assert [(r["baseline"]["gso"], r["change_pct"]) for r in gso["ratios"]] == [("kernel-gso", [33.0]),
                                                                                 ("no-gso", [55.0])]
    # seed 000's 121 vs 970 Mbit/s are USO off at 1472 B vs on at 65507 B: not a comparison uso makes
    assert suites.plans("uso")[0].published is None


MEANS = {"dpdk-gro": 1.0e9, "kernel-gro": 0.8e9, "no-gro": 0.6e9}


@pytest.fixture
def stored(tmp_path):
    """A finished run of PLAN with 4 rounds of throughput per cell."""
    db = tmp_path / "offlab.db"
    store = Store.open(db)
    plan = load_plan(PLAN, "p.yaml")
    run = store.create_run(plan.name, plan.text, plan.to_dict(), 1, {}, plan.baseline, plan.repeat.model_dump())
    ids = store.add_cells(run, [{"key": c.key, "params": c.params, "settings": {}} for c in plan.cells])
    for c in plan.cells:
        for rnd, f in enumerate((0.98, 1.0, 1.02, 1.0)):
            store.add_sample(run, ids[c.key], rnd, {}, {"throughput_bps": MEANS[c.params["gro"]] * f})
        store.set_cell_status(ids[c.key], "done")
    store.set_run_status(run, "done")
    yield store, run, db
    store.close()


def test_compare_puts_the_published_ratio_beside_ours_for_each_baseline(stored):
    store, run, db = stored
    rows = {(r.cell, r.baseline): r for r in compare.compare_run(store, run, metrics=("throughput_bps",))}
    vs_none = rows[("gro=dpdk-gro", "gro=no-gro")]
    assert vs_none.published == "seed 001: +63 %" and round(vs_none.change_pct) == 67
    assert rows[("gro=kernel-gro", "gro=no-gro")].published is None  # the seed gives no figure for it
    both = {(r.cell, r.baseline): r for r in compare.published_rows(store, run)}
    assert set(both) == {("gro=dpdk-gro", "gro=kernel-gro"), ("gro=dpdk-gro", "gro=no-gro")}
    assert both[("gro=dpdk-gro", "gro=kernel-gro")].published == "seed 001: +49 %"
    assert round(both[("gro=dpdk-gro", "gro=kernel-gro")].change_pct) == 25

    res = offlab_in_process("compare", str(run), "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert "seed 001: +63 %" in res.stdout and "seed 001: +49 %" in res.stdout and "+66.7 %" in res.stdout
    assert "+25.0 %" in res.stdout  # ours against kernel GRO, beside the seed's +49 %
    res = offlab_in_process("compare", str(run), "--baseline", "gro=kernel-gro", "--json", "--db", str(db))
    row = next(r for r in json.loads(res.stdout)["rows"] if r["cell"] == "gro=dpdk-gro")
    assert row["published"] == "seed 001: +49 %" and round(row["change_pct"]) == 25


def test_results_show_and_the_report_show_both_figures(stored, tmp_path):
    store, run, db = stored
    res = offlab_in_process("results", "show", str(run), "--db", str(db))
    assert res.returncode == 0, res.stderr
    line = next(l for l in res.stdout.splitlines() if "gro=dpdk-gro vs gro=kernel-gro" in l)
    assert "+25.0 %" in line and "seed 001: +49 %" in line, line
    html = build_report(store, run)
    assert "Published ratios beside ours" in html and "seed 001: +49 %" in html and "seed 001: +63 %" in html
    assert "+25.0 %" in html and "+66.7 %" in html


def test_suite_runs_headline_lines_carry_the_published_figure(stored, capsys):
    """What `offlab suite run` prints under its table: the stored run's interval and verdict, then the seed's."""
    from types import SimpleNamespace

    from offlab.cli.experiment import _print_decisions

    store, run, _ = stored
    plan = load_plan(PLAN, "p.yaml")
    keys = {c.params["gro"]: c.key for c in plan.cells}

    def decision(cell: str, verdict: str) -> dict:
        return {"cell": keys[cell], "baseline": keys["no-gro"], "headline": True, "moot": False, "verdict": verdict,
                "pairs": 4, "level": 99.0, "metric": "throughput_bps", "cv_ratio_pct": 0.0, "cv_cell_pct": 1.6,
                "cv_baseline_pct": 1.6, "steal_pct": None, "needs_rounds": None, "needs_minutes": None,
                "needs_floor": False}

    runner = SimpleNamespace(plan=plan, decider=object(), run_id=run, decisions=[decision("dpdk-gro", "faster")])
    _print_decisions(runner, store)
    dpdk = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith(keys["dpdk-gro"]))
    assert "+66.7 % [+66.7, +66.7] faster (4 rounds" in dpdk and dpdk.endswith("| seed 001: +63 %"), dpdk
