"""Deciding a comparison while looking after every round: error rates on synthetic data, seeded.

The data are normal samples with a known true ratio, so a verdict is right or wrong by
construction. Each simulated run measures one pair (baseline, cell) per round, looks once it has
max(n0, MIN_PAIRS) pairs and after every further pair, until a verdict or `rounds` pairs, like
the runner.
"""

from __future__ import annotations

import random
import re
import sqlite3
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from offlab import stats
from offlab.errors import BadInput
from offlab.experiment import suites
from offlab.experiment import decide
from offlab.experiment.decide import Decider
from offlab.experiment.plan import load_plan
from offlab.experiment.plan.load import parse_budget
from offlab.experiment.runner import Runner
from offlab.report.compare import SEQUENTIAL, compare_run
from offlab.store import Store
from tests.conftest import requires_root

SIMS = 2000


def simulate(true_ratio: float, cv: float, *, cv_cell: float | None = None, n0: int = 3, rounds: int = 10,
             level: float = 95, equivalence: float | None = 5, seed: int = 1, drift: float = 0.0,
             naive: bool = False) -> Counter:
    """Verdicts of SIMS simulated runs. drift: a load factor per round shared by both samples
    (sd as a fraction). naive: a fixed-level Fieller interval on independent samples every round."""
    rng = random.Random(seed)
    cv_cell = cv if cv_cell is None else cv_cell
    verdicts: Counter = Counter()
    for _ in range(SIMS):
        a, b = [], []
        previous, verdict, look = None, stats.UNDECIDED, 0
        for n in range(1, rounds + 1):
            load = max(rng.gauss(1, drift), 0.05) if drift else 1.0
            a.append(load * rng.gauss(100, 100 * cv))
            b.append(load * rng.gauss(100 * true_ratio, 100 * true_ratio * cv_cell))
            if n < max(n0, 2 if naive else stats.MIN_PAIRS):
                continue
            if naive:
                r = stats.ratio_ci(a, b, level)
                word = stats.verdict(r.ratio, r.low, r.high, "higher")
                verdict = stats.UNDECIDED if word == stats.NO_DIFFERENCE else word
            else:
                look += 1
                d = stats.sequential_decision(a, b, look, level, equivalence, "higher", previous)
                previous, verdict = (d.low, d.high), d.verdict
            if verdict != stats.UNDECIDED:
                break
        verdicts[verdict] += 1
    return verdicts


def wrong_direction(v: Counter) -> float:
    return (v[stats.FASTER] + v[stats.SLOWER]) / SIMS


@pytest.mark.parametrize("n0,rounds,level", [(3, 10, 95), (2, 8, 95), (3, 30, 95), (3, 10, 99)])
def test_no_effect_is_called_faster_or_slower_at_most_at_the_nominal_rate(n0, rounds, level):
    v = simulate(1.0, 0.05, n0=n0, rounds=rounds, level=level, equivalence=None)
    assert wrong_direction(v) <= 1 - level / 100, v


@pytest.mark.parametrize("cv_base,cv_cell", [(0.05, 0.15), (0.15, 0.05), (0.02, 0.30)])
def test_no_effect_with_unequal_noise_on_the_two_sides_stays_at_the_nominal_rate(cv_base, cv_cell):
    """Pairs are independent whatever each side's variance: a pooled test would fail here."""
    v = simulate(1.0, cv_base, cv_cell=cv_cell, rounds=10, equivalence=None)
    assert wrong_direction(v) <= 0.05, v


def test_no_effect_under_a_drifting_load_stays_at_the_nominal_rate():
    v = simulate(1.0, 0.05, drift=0.3, rounds=10, equivalence=None)
    assert wrong_direction(v) <= 0.05, v


def test_peeking_every_round_at_a_fixed_level_exceeds_it():
    """Why the looks must spend their error: the naive rule is wrong far more often than 5 %."""
    v = simulate(1.0, 0.05, n0=3, rounds=10, naive=True)
    assert wrong_direction(v) > 0.10, v


def test_a_true_difference_at_the_margin_is_rarely_called_equivalent():
    """True ratio 1.05 with a ±5 % margin: 'equivalent' would be a false claim."""
    v = simulate(1.05, 0.03, rounds=30)
    assert v[stats.EQUIVALENT] / SIMS <= 0.05, v
    assert v[stats.SLOWER] == 0, v


def test_a_clear_effect_is_decided_in_the_first_looks():
    v = simulate(1.3, 0.05, n0=2, rounds=6)
    assert v[stats.FASTER] / SIMS >= 0.95, v


def test_a_large_effect_is_decided_through_a_drifting_load_that_hides_it_from_unpaired_samples():
    """Load moving both sides ±30 % from round to round cancels in the paired ratio."""
    paired = simulate(1.5, 0.03, drift=0.3, rounds=5)
    unpaired = simulate(1.5, 0.03, drift=0.3, rounds=5, naive=True, level=99)
    assert paired[stats.FASTER] / SIMS >= 0.95, paired
    assert unpaired[stats.FASTER] < paired[stats.FASTER], (paired, unpaired)


def test_a_ten_percent_effect_at_five_percent_noise_is_found_in_most_runs_of_fifteen_rounds():
    v = simulate(1.10, 0.05, rounds=15)
    assert v[stats.FASTER] / SIMS >= 0.5 and v[stats.SLOWER] == 0, v


def test_no_effect_at_low_noise_is_decided_equivalent():
    v = simulate(1.0, 0.01, rounds=10)
    assert v[stats.EQUIVALENT] / SIMS >= 0.75, v


def test_the_looks_spend_alpha_over_k_k_plus_1_and_never_more_than_alpha():
    assert stats.look_alpha(0.05, 1) == pytest.approx(0.025)
    assert stats.look_alpha(0.05, 2) == pytest.approx(0.05 / 6)
    assert sum(stats.look_alpha(0.05, k) for k in range(1, 10_000)) == pytest.approx(0.05, rel=1e-3)
    assert sum(stats.look_alpha(0.05, k) for k in range(1, 10_000)) < 0.05


def test_paired_ratio_of_2_and_4_over_1_by_hand():
    """ln 2 = 0.6931, ln 4 = 1.3863: mean 1.0397, s = 0.4901, t(0.975, 1) = 12.706,
    half-width 12.706 · 0.4901 / √2 = 4.4035; ratio e^1.0397 = 2.8284 (the geometric mean)."""
    r = stats.paired_ratio_ci([1, 1], [2, 4], 95)
    assert r.ratio == pytest.approx(2.8284, abs=1e-4) and r.df == 1
    assert r.low == pytest.approx(2.8284 * 2.718281828 ** -4.4035, rel=1e-3)
    assert r.high == pytest.approx(2.8284 * 2.718281828 ** 4.4035, rel=1e-3)


def test_first_look_is_the_paired_interval_at_97_5_percent_of_a_95_percent_sequence():
    a, b = [100, 101, 99], [300, 310, 290]
    d = stats.sequential_decision(a, b, 1, 95)
    r = stats.paired_ratio_ci(a, b, 97.5)
    assert d.level == pytest.approx(97.5) and d.n == 3
    assert (d.ratio, d.low, d.high) == (pytest.approx(r.ratio), pytest.approx(r.low), pytest.approx(r.high))
    assert d.verdict == stats.FASTER and d.decided


def test_the_running_interval_is_the_intersection_of_the_looks():
    a, b = [100, 104, 96, 100], [103, 99, 107, 103]
    alone = stats.sequential_decision(a, b, 2, 95, None)
    narrowed = stats.sequential_decision(a, b, 2, 95, None, previous=(1.0, 1.02))
    assert alone.low < 1.0 < 1.02 < alone.high
    assert (narrowed.low, narrowed.high) == (pytest.approx(1.0), pytest.approx(1.02))


def test_costs_read_lower_and_higher():
    d = stats.sequential_decision([10, 10.2, 9.8], [5, 5.1, 4.9], 1, 95, better="lower")
    assert d.verdict == stats.LOWER


def test_a_zero_value_a_dead_path_stays_undecided():
    d = stats.sequential_decision([100, 101, 99], [0, 50, 51], 1, 95)
    assert d.verdict == stats.UNDECIDED and d.ratio is None


def test_rounds_to_decide_grows_with_noise():
    calm = stats.rounds_to_decide([100, 104, 96], [110, 113, 107], 1)
    noisy = stats.rounds_to_decide([100, 120, 80], [110, 100, 120], 1)
    assert calm is not None and noisy is not None and 0 < calm < noisy
    assert stats.rounds_to_decide([100], [110], 0) is None


def test_rounds_to_decide_is_roughly_what_a_simulation_needs():
    """Estimated from three pairs at the true noise; runs given that many more rounds decide in
    about half the cases or more (the estimate aims at the point where the expected interval
    just decides)."""
    rng = random.Random(5)
    a0, b0 = [100, 100, 100], [103, 110, 117.5]  # ratio 1.1, its log's sd 0.066 ≈ √2 · 5 %
    extra = stats.rounds_to_decide(a0, b0, 0)
    assert extra is not None and extra >= 1
    decided = 0
    for _ in range(400):
        a = [rng.gauss(100, 5) for _ in range(3 + extra)]
        b = [rng.gauss(110, 5.5) for _ in range(3 + extra)]
        previous = None
        for look, n in enumerate(range(3, 3 + extra + 1), start=1):
            d = stats.sequential_decision(a[:n], b[:n], look, 95, 5, "higher", previous)
            previous = (d.low, d.high)
            if d.decided:
                break
        decided += d.decided
    assert decided / 400 >= 0.4, (extra, decided)


# ---- plans: the fields that steer deciding ---------------------------------------------------

PLAN = textwrap.dedent("""\
    name: decide-test
    topology: {kind: veth}
    axes:
      offload:
        off: {features: {client: {uso: off}}, workload: {gso: false, gro: false}}
        on: {features: {client: {uso: on}}, workload: {gso: true, gro: true}}
        same: {features: {client: {uso: off}}, workload: {gso: false, gro: false}}
    workload: {tool: engine, protocol: udp, size: 1472, duration: 1, warmup: 0.3}
    repeat: {min: 3, max: 4, level: 95}
    baseline: {offload: "off"}
    headline: [{offload: "on"}]
    seed: 11
    """)


def test_a_plan_with_a_baseline_decides_and_one_without_keeps_the_width_rule():
    plan = load_plan(PLAN, "p.yaml")
    assert plan.repeat.rule(plan.baseline is not None) == "decided" and plan.repeat.equivalence == 5
    assert plan.headline == [{"offload": "on"}]
    bare = load_plan(PLAN.replace('baseline: {offload: "off"}\n', "").replace('headline: [{offload: "on"}]\n', ""))
    assert bare.repeat.rule(bare.baseline is not None) == "width"
    old = load_plan(PLAN.replace("level: 95}", "level: 95, until: width}"))
    assert old.repeat.rule(True) == "width"


def test_quick_keeps_the_headline_and_the_quick_cells_with_their_baselines_and_a_budget():
    plan = load_plan(PLAN + 'quick: [{offload: "on"}]\n', "p.yaml", quick=True)
    assert [c.key for c in plan.cells] == ["offload=off", "offload=on"]
    assert plan.budget_s == 120 and plan.shape_rounds == 2 and plan.repeat.min == 2
    assert plan.repeat.max == 30  # the budget, not the plan's max of 4, bounds a quick run's rounds
    assert len(load_plan(PLAN, "p.yaml", quick=True).cells) == 3  # no `quick:`: every cell


def test_a_composite_part_can_shorten_its_suites_samples_and_keeps_the_rest_of_the_workload():
    parts = suites.plans("quick", quick=True)
    assert [p.name for p in parts] == ["uso", "gro-gso", "jumbo"]
    for part, whole, seconds in zip(parts, ("uso", "gro-gso", "jumbo"), (1, 2, 1), strict=True):
        own = suites.plans(whole)[0].cells[0].workload
        for cell in part.cells:
            assert cell.workload.duration == seconds and own.duration == 2
            assert (cell.workload.warmup, cell.workload.tool) == (own.warmup, own.tool)


def test_quick_workload_applies_to_quick_runs_only_and_a_bad_one_names_the_field():
    text = PLAN + "quick_workload: {duration: 0.5}\n"
    assert {c.workload.duration for c in load_plan(text, "p.yaml", quick=True).cells} == {0.5}
    assert {c.workload.duration for c in load_plan(text, "p.yaml").cells} == {1}
    assert {c.workload.warmup for c in load_plan(text, "p.yaml", quick=True).cells} == {0.3}
    with pytest.raises(BadInput, match=r"p\.yaml:\d+: quick_workload.duration"):
        load_plan(PLAN + "quick_workload: {duration: soon}\n", "p.yaml")
    with pytest.raises(BadInput, match=r"quick_workload is a mapping"):
        load_plan(PLAN + "quick_workload: 1\n", "p.yaml")


@pytest.mark.parametrize("change,message", [
    ('headline: [{offload: "on"}]', 'headline: [{offload: "off"}]'),
    ('headline: [{offload: "on"}]', 'headline: [{speed: "on"}]'),
    ("level: 95}", "level: 95, equivalence: 0}"),
    ("level: 95}", "level: 95, until: forever}"),
])
def test_bad_deciding_fields_name_the_field(change, message):
    with pytest.raises(BadInput) as exc:
        load_plan(PLAN.replace(change, message), "p.yaml")
    field_name = "headline" if "headline" in message else "repeat"
    assert re.match(rf"p\.yaml:\d+: {field_name}", str(exc.value)), str(exc.value)


def test_headline_without_a_baseline_is_refused():
    with pytest.raises(BadInput, match="headline names comparisons with the baseline"):
        load_plan(PLAN.replace('baseline: {offload: "off"}\n', ""), "p.yaml")


@pytest.mark.parametrize("raw,seconds", [("2m", 120), ("90s", 90), ("1.5h", 5400), (600, 600), ("45", 45)])
def test_budget_durations(raw, seconds):
    assert parse_budget(raw) == seconds


@pytest.mark.parametrize("raw", ["0", "2 minutes", "-1m", "9999999h", True])
def test_bad_budgets_are_refused_naming_the_option(raw):
    with pytest.raises(BadInput, match="--budget is seconds"):
        parse_budget(raw, "--budget")


def test_every_built_in_suite_names_headline_comparisons_that_exist():
    for name in suites.names():
        for plan in suites.plans(name) + suites.plans(name, quick=True):
            if plan.baseline is None:
                continue
            decider = Decider(plan, [_Side(c) for c in plan.cells])
            assert any(c.headline for c in decider.comparisons), (name, plan.name)


class _Side:
    def __init__(self, cell):
        self.cell, self.status, self.rounds_done, self.history = cell, "pending", set(), []


# ---- recorded real runs (tests/fixtures/directions, README there) -----------------------------

DIRECTIONS = Path(__file__).parent / "fixtures" / "directions"

# fixture, the cell that is faster, its baseline; each an `offlab run` on this machine, loaded as named
RECORDED = [("uso-loaded", {"offload": "on"}, {"offload": "off"}),
            ("uso-shared", {"offload": "on"}, {"offload": "off"}),
            ("jumbo-loaded", {"mtu": "9000"}, {"mtu": "1500"}),
            ("jumbo-shared", {"mtu": "9000"}, {"mtu": "1500"})]


def recorded(name: str, tmp_path) -> tuple[Store, int]:
    """A recorded run, loaded from its SQL dump into a database of this test's own."""
    db = tmp_path / f"{name}.db"
    conn = sqlite3.connect(db)
    try:
        conn.executescript((DIRECTIONS / f"{name}.sql").read_text())
        # sqlite3's .dump leaves out PRAGMA user_version, where the store reads its schema version from
        [(version,)] = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        conn.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        conn.close()
    store = Store.open(db)
    [run] = store.list_runs()
    return store, run["id"]


def throughput_row(rows, params: dict):
    [row] = [r for r in rows if r.metric == "throughput_bps" and params.items() <= r.params.items()]
    return row


@pytest.mark.parametrize("name,faster,baseline", RECORDED, ids=[r[0] for r in RECORDED])
def test_a_recorded_run_is_decided_faster_now_as_the_runner_decided_it_then(name, faster, baseline, tmp_path):
    """The comparison's table replays the sequential rule over the recorded rounds: the verdict, and the
    number of pairs it took, are the ones the runner stopped on when it measured them."""
    store, run_id = recorded(name, tmp_path)
    row = throughput_row(compare_run(store, run_id), faster)
    then = re.match(r"decided faster \(95 % over every look, (\d+) rounds", row.cell_reason or "")
    assert then, row.cell_reason
    assert (row.rule, row.verdict, row.pairs) == (SEQUENTIAL, stats.FASTER, int(then[1])), row
    assert row.low > 1 and baseline.items() <= row.baseline_params.items(), row


@pytest.mark.parametrize("name,faster,baseline", RECORDED, ids=[r[0] for r in RECORDED])
def test_a_recorded_run_read_from_the_faster_side_is_slower_by_as_many_pairs(name, faster, baseline, tmp_path):
    store, run_id = recorded(name, tmp_path)
    forward = throughput_row(compare_run(store, run_id), faster)
    row = throughput_row(compare_run(store, run_id, baseline=faster), baseline)
    assert (row.rule, row.verdict, row.pairs) == (SEQUENTIAL, stats.SLOWER, forward.pairs), row
    assert row.high < 1 and row.ratio == pytest.approx(1 / forward.ratio), (row, forward)


@pytest.mark.parametrize("name", ["uso-loaded", "uso-shared"])
def test_the_same_settings_as_the_baseline_are_never_decided_a_direction(name, tmp_path):
    """`same` is the baseline's settings under another name: every look over its recorded rounds keeps
    no difference inside the interval, and the runner measured it to the plan's max."""
    store, run_id = recorded(name, tmp_path)
    row = throughput_row(compare_run(store, run_id), {"offload": "same"})
    max_rounds = store.get_run(run_id)["repeat"]["max"]
    assert (row.rule, row.pairs, row.cell_status) == (SEQUENTIAL, max_rounds, "confidence_not_reached"), row
    assert row.low < 1 < row.high and row.verdict not in (stats.FASTER, stats.SLOWER), row


# ---- real runs --------------------------------------------------------------------------------

@requires_root
@pytest.mark.network
def test_a_run_decides_uso_and_says_what_the_undecided_comparison_needs(tmp_path, clean_machine):
    store = Store.open(tmp_path / "d.db")
    # Up to 6 rounds: under `stress-ng --cpu 2` one plain sample with a starved receiver (23 Mbit/s
    # against ~1 Gbit/s) left the ×8 effect undecided after 4 rounds in 2 of 20 runs; a decided cell
    # stops at once, so the quiet machine still pays 3 rounds.
    runner = Runner(load_plan(PLAN.replace("max: 4", "max: 6"), "decide-test.yaml"), store)
    run_id = runner.run()
    assert store.get_run(run_id)["status"] == "done"
    cells = {c["key"]: c for c in store.cells(run_id)}
    on = cells["offload=on"]
    assert on["status"] == "done" and on["reason"].startswith("decided faster (95 % over every look"), (
        on["reason"], runner.decisions, [(s["cell_id"], s["round"], s["sample"]["traffic"].get("throughput_bps"))
                                         for s in store.samples(run_id)])
    decision = next(d for d in runner.decisions if d["cell"] == "offload=on")
    assert decision["headline"] and decision["ratio"] > 2 and decision["low"] > 1
    same = next(d for d in runner.decisions if d["cell"] == "offload=same")
    assert not same["headline"]
    if same["verdict"] == stats.UNDECIDED:  # no effect: only "equivalent" would decide it, at ±5 %
        assert re.match(r"undetermined (: needs ~[\d.]+ more minutes at this noise|after 6 rounds: more than)",
                        cells["offload=same"]["reason"].replace("undetermined:", "undetermined :")), cells
        assert cells["offload=same"]["status"] == "confidence_not_reached"
    # A decided cell stops; the baseline goes on while `same` is open.
    samples = store.samples(run_id)
    n = {k: sum(s["cell_id"] == c["id"] for s in samples) for k, c in cells.items()}
    assert n["offload=on"] == decision["pairs"] <= n["offload=off"]
    # Rounds 0 and 1 run the same cells, the second in the reverse order, each position recorded.
    order = {r: [s["cell_id"] for s in sorted((s for s in samples if s["round"] == r),
                                               key=lambda s: s["sample"]["round_position"])] for r in (0, 1)}
    assert len(order[0]) == 3 and order[1] == order[0][::-1]


@requires_root
@pytest.mark.network
def test_a_budget_goes_to_the_headline_comparison_first(tmp_path, clean_machine):
    store = Store.open(tmp_path / "b.db")
    # 4 s from the start of the run, the lab's build included: the headline's cells, not `same`
    plan = load_plan(PLAN.replace("seed: 11", "seed: 11\nbudget: 4"), "budget.yaml")
    runner = Runner(plan, store)
    run_id = runner.run()
    assert store.get_run(run_id)["status"] == "budget_exhausted"
    cells = {c["id"]: c["key"] for c in store.cells(run_id)}
    measured = {cells[s["cell_id"]] for s in store.samples(run_id)}
    assert measured and measured <= {"offload=on", "offload=off"}
    assert "offload=same" not in measured


def test_the_budget_counts_from_the_start_of_the_run_and_starts_no_sample_that_would_overrun_it():
    """A guest's boot is part of what a user's budget pays for; a sample that cannot end within the
    budget (as long as that cell's samples took so far) is not begun."""
    import time

    from offlab.experiment.runner import Runner

    plan = load_plan(PLAN, "p.yaml", quick=True)
    assert plan.budget_s == 120
    runner = Runner(plan, store=None)
    runner.started = time.monotonic() - 100  # e.g. a 40 s guest boot and 60 s of samples
    assert runner._budget_start() == runner.started
    assert not runner._over_budget(runner._budget_start(), next_sample_s=10)
    assert runner._over_budget(runner._budget_start(), next_sample_s=30)
    runner.started = time.monotonic() - 121
    assert runner._over_budget(runner._budget_start())
    plan.budget_s = None
    assert not runner._over_budget(runner._budget_start(), next_sample_s=1e6)


def test_under_quick_the_shape_waits_for_the_headlines_first_look():
    """uso-vm --quick: USO vs plain gets its 3 pairs before software GSO's 2 shape rounds, so a tight
    budget (a guest's boot is part of it) goes to the verdict first."""
    plan = load_plan(PLAN + 'quick: [{offload: "same"}]\n', "p.yaml", quick=True)
    sides = {c.key: _Side(c) for c in plan.cells}
    decider = Decider(plan, list(sides.values()))
    for rnd in range(3):
        assert sorted(s.cell.key for s in decider.order(rnd, 5)) == ["offload=off", "offload=on"]
        for key, value in (("offload=off", 1.0 + rnd / 100), ("offload=on", 1.02 - rnd / 100)):
            sides[key].history.append((rnd, value))
            sides[key].rounds_done.add(rnd)
        decider.refresh()
    later = sorted(s.cell.key for s in decider.order(3, 5))
    assert "offload=same" in later  # after the first look, the shape gets its rounds
    plan.shape_rounds = None  # a budget without --quick: every comparison from the first round
    assert "offload=same" in {s.cell.key for s in Decider(plan, [_Side(c) for c in plan.cells]).order(0, 5)}


def test_with_too_few_pairs_to_know_the_noise_the_undetermined_line_gives_a_floor():
    """A guest's boot can take most of a 2-minute budget: one pair, no noise known yet. The line says
    how long the rounds before the first look would take at least, and says it is a floor."""
    plan = load_plan(PLAN, "p.yaml", quick=True)
    sides = {c.key: _Side(c) for c in plan.cells}
    decider = Decider(plan, list(sides.values()))
    for key, value in (("offload=off", 1.0), ("offload=on", 3.0)):
        sides[key].history.append((0, value))
        sides[key].rounds_done.add(0)
        decider.record(sides[key], 20.0, None)
    decider.refresh()
    d = next(x for x in decider.summary() if x["cell"] == "offload=on")
    assert (d["verdict"], d["needs_floor"], d["needs_rounds"]) == (stats.UNDECIDED, True, 2)
    assert d["needs_minutes"] == pytest.approx(2 * 40 / 60)
    assert decide.reason(d).startswith("undetermined: needs at least ~1.3 more minutes (2 more rounds before its first look")
    none = Decider(plan, [_Side(c) for c in plan.cells]).summary()[0]  # nothing measured: the windows
    assert none["needs_floor"] and none["needs_minutes"] == pytest.approx(3 * 2 * 1.3 / 60)
