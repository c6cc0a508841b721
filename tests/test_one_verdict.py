"""One comparison, one interval, one verdict: the headline line, the published-ratio line, `compare`,
`results show` and the report all take it from offlab.report.compare, by the run's sequential rule
where the run decided sequentially. Stored numbers for the disagreement the old code printed, and a
real run of the uso suite's headline cut short before its first look."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from conftest import offlab_cli
from offlab.experiment import suites
from offlab.experiment.plan import load_plan
from offlab.report import build_report, compare
from offlab.report import format as fmt
from offlab.store import Store
from tests.helpers import run as offlab_in_process

PLAN = """\
name: one-verdict
topology: {kind: veth}
axes:
  gro:
    kernel-gro: {features: {server: {gro: on}}}
    no-gro: {features: {server: {gro: off}}}
workload: {tool: iperf3, protocol: tcp, duration: 1}
baseline: {gro: no-gro}
repeat: {min: 3, max: 8, level: 99}
published:
  ref: seed 001
  ratios:
    - {cell: {gro: kernel-gro}, change_pct: 63}
"""
# Four rounds where the unpaired (Fieller) 99 % interval on the means excludes 1 ([+17, +113] %) but the
# sequential rule's running interval over the pairs of the same round, at its second look, does not
# ([−5, +148] %): the old published-ratio line said "faster", the headline line "undetermined".
NO_GRO = (0.498e9, 0.572e9, 0.430e9, 0.500e9)
KERNEL_GRO = (0.785e9, 0.799e9, 0.736e9, 0.735e9)
WORDS = re.compile(r"\b(faster|slower)\b")


@pytest.fixture
def undecided(tmp_path):
    db = tmp_path / "offlab.db"
    store = Store.open(db)
    plan = load_plan(PLAN, "p.yaml")
    run = store.create_run(plan.name, plan.text, plan.to_dict(), 1, {}, plan.baseline, plan.repeat.model_dump())
    ids = store.add_cells(run, [{"key": c.key, "params": c.params, "settings": {}} for c in plan.cells])
    for key, values in (("gro=no-gro", NO_GRO), ("gro=kernel-gro", KERNEL_GRO)):
        for rnd, v in enumerate(values):
            store.add_sample(run, ids[key], rnd, {}, {"throughput_bps": v})
        store.set_cell_status(ids[key], "confidence_not_reached")
    store.set_run_status(run, "done")
    yield store, run, db, plan
    store.close()


def test_the_fixed_sample_interval_alone_would_call_this_comparison_faster():
    """The premise: the two rules disagree on these numbers, so the tests below can fail."""
    from offlab import stats
    from offlab.stats import replay

    r = stats.ratio_ci(NO_GRO, KERNEL_GRO, 99)
    assert stats.verdict(r.ratio, r.low, r.high, "higher") == stats.FASTER
    d = replay(list(enumerate(NO_GRO)), list(enumerate(KERNEL_GRO)), 3, 99, 5.0, "higher")
    assert not d.decided and d.low < 1 < d.high


def test_every_view_of_an_undecided_comparison_says_undetermined_with_the_same_interval(undecided, capsys):
    from offlab.cli.experiment import _print_decisions

    store, run, db, plan = undecided
    row = next(r for r in compare.compare_run(store, run, metrics=("throughput_bps",)))
    assert row.rule == compare.SEQUENTIAL and row.verdict == "undetermined" and row.pairs == 4 and row.looks == 2
    assert row.change_low_pct < 0 < row.change_high_pct
    interval = f"[{row.change_low_pct:+.1f}".replace("-", "\u2212")

    lines = []
    runner = SimpleNamespace(plan=plan, decider=object(), run_id=run, decisions=[{
        "cell": "gro=kernel-gro", "baseline": "gro=no-gro", "headline": True, "moot": False, "verdict": "undecided",
        "pairs": 4, "level": 99.0, "metric": "throughput_bps", "cv_ratio_pct": 9.0, "cv_cell_pct": 4.0,
        "cv_baseline_pct": 11.0, "steal_pct": None, "needs_rounds": 6, "needs_minutes": 1.5, "needs_floor": False}])
    _print_decisions(runner, store)
    lines += [l for l in capsys.readouterr().out.splitlines() if "gro=kernel-gro vs" in l]
    for args in (("compare", str(run)), ("results", "show", str(run))):
        res = offlab_in_process(*args, "--db", str(db), env={"COLUMNS": "250"})
        assert res.returncode == 0, res.stderr
        text = res.stdout
        lines += [l for l in text.splitlines() if l.lstrip().startswith(("throughput ", "gro=kernel-gro vs")) and "%" in l
                  and "published)" not in l]
        assert "the run's sequential decision" in text, text  # the rule, named under the table
    html = build_report(store, run)
    assert "undetermined" in html and "the run&#39;s sequential decision" in html
    shown = re.sub(r'<ul class="note">.*?</ul>', "", html.split('<section id="cells">')[0], flags=re.S)
    assert not WORDS.search(shown.split("<body")[1]), "the report calls it faster"  # the rule's text aside

    assert len(lines) >= 4, lines  # headline, compare's row and published line, results show's published line
    for line in lines:
        assert not WORDS.search(line), line
        assert "undetermined" in line, line
    assert all(interval in l for l in lines if "%" in l and "[" in l), lines
    res = offlab_in_process("compare", str(run), "--json", "--db", str(db))
    row = json.loads(res.stdout)["rows"][0]
    assert row["verdict"] == "undetermined" and row["rule"] == "sequential"


def test_two_runs_against_each_other_keep_fieller_and_say_so(undecided):
    store, run, db, _ = undecided
    rows = compare.compare_runs(store, run, run, metrics=("throughput_bps",))
    assert {r.rule for r in rows} == {compare.FIELLER}
    assert any("Fieller" in line for line in compare.rule_lines(rows))


def uso_headline_plan() -> str:
    """The uso suite, its 1472 B headline comparison alone, two rounds: never enough for a first look."""
    text = suites.text("uso")
    text = re.sub(r"^repeat: .*$", "repeat: {min: 2, max: 2, level: 95}", text, flags=re.M)
    text = re.sub(r"^capture: .*$", "", text, flags=re.M)
    text = re.sub(r"^workload: \{", "workload: {duration: 1, ", text.replace("duration: 2, ", ""), flags=re.M)
    return text + 'only: [{payload: "1472@1500"}]\n'


def test_a_real_run_cut_short_before_its_first_look_is_undetermined_on_every_line(tmp_path, clean_machine):
    """USO on vs off at 1472 B (×10 here): two rounds are enough for a fixed-sample interval to call it
    faster, not for the sequential rule the run decides by; every line says undetermined."""
    plan = tmp_path / "uso-short.yaml"
    plan.write_text(uso_headline_plan())
    db = tmp_path / "offlab.db"
    res = offlab_cli("run", str(plan), "--db", str(db), env={"COLUMNS": "250"}, timeout=300)
    assert res.returncode == 0, res.stderr
    head = res.stdout.split("headline verdicts")[1].splitlines()[1]
    assert "payload=1472@1500,offload=on vs" in head and "undetermined" in head, res.stdout
    shown = [l for l in res.stdout.splitlines() if "offload=on" in l or l.lstrip().startswith("throughput")]
    assert shown and not any(WORDS.search(l) for l in shown), res.stdout
    with Store.open(db, create=False) as store:
        rows = compare.compare_run(store, 1, metrics=("throughput_bps",))
    assert rows[0].verdict == "undetermined" and rows[0].rule == compare.SEQUENTIAL and rows[0].pairs == 2
    # the two pairs' ratio, with no interval: the rule has not looked yet, so no line may show one
    assert rows[0].change_pct is not None and rows[0].low is None and rows[0].change_low_pct is None
    assert f"{fmt.signed(rows[0].change_pct)} % undetermined" in head and "[" not in head, head
