"""`offlab results trend`: a plan's runs per cell and metric, grouped by minimum description length, each change
point named with the environment difference across it. On a recorded real history (tests/fixtures/trend, README
there) in SQLite and in PostgreSQL, on numbers worked out by hand, and on a tiny history measured live."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from offlab.report import trend as tr
from offlab.store import Store
from tests.conftest import offlab_cli, requires_root
from tests.helpers import recorded_history
from tests.helpers import run as offlab_in_process

SYSCTL = "net.ipv4.tcp_rmem"  # what rmem-small.yaml sets on the server from run 4 on


def first_run_setting(db: Path, plan: str, key: str) -> int:
    """The first run of `plan` whose samples held `key` (from the stored samples, not from the README)."""
    with Store.open(db, create=False) as s:
        for run in tr.plan_runs(s, plan):
            for sample in s.samples(run["id"]):
                if any(h.get("key") == key for h in sample["sample"].get("in_force") or []):
                    return run["id"]
    raise AssertionError(f"no run of {plan} held {key}")


# ---- the method, on numbers worked by hand --------------------------------------------------------------

def test_a_groups_bits_are_its_place_mean_spread_and_its_values_on_a_sphere():
    q = 3.0 / 4096  # the quantum when the largest value of the series is 3
    assert tr.group_bits([3.0], q, 8) == pytest.approx(3 + 12)  # log2(8) for its end, 12 for its mean
    assert tr.group_bits([3.0, 1.0], q, 8) == pytest.approx(3 + 12 + 12 + 1)  # + spread + which one is larger
    # [1, 2, 3]: mean 2, radius √2, a circle (dimension 1) of circumference 2π·√2 in quanta
    assert tr.group_bits([1.0, 2.0, 3.0], q, 8) == pytest.approx(3 + 24 + math.log2(2 * math.pi * math.sqrt(2) / q))
    # equal values: a radius under one quantum counts as one quantum; the unit 2-sphere's surface is 4π
    assert tr.group_bits([2.0] * 4, q, 8) == pytest.approx(3 + 24 + math.log2(4 * math.pi))


def test_a_step_well_beyond_the_scatter_is_cut_and_scatter_alone_is_not():
    assert tr.groups([10, 10.2, 9.9, 5, 5.1, 4.9]) == [(0, 3), (3, 6)]
    assert tr.groups([10, 10.5, 9.6, 10.2, 9.8, 10.4]) == [(0, 6)]  # ±5 %: no cut pays for a group's 24 bits
    assert tr.groups([7.0] * 6) == [(0, 6)] and tr.groups([0.0] * 3) == [(0, 3)] and tr.groups([]) == []
    # one run on either side of a step is not enough to tell it from one odd run: a group's mean and spread
    # cost more than its one or two values save
    assert tr.groups([10, 5]) == [(0, 2)] and tr.groups([10, 10.1, 5]) == [(0, 3)]


# ---- the recorded history --------------------------------------------------------------------------------

def test_the_change_point_is_at_the_run_where_the_sysctl_changed_and_named_by_it(tmp_path):
    db = recorded_history(tmp_path)
    changed = first_run_setting(db, "trend-rmem", SYSCTL)
    with Store.open(db, create=False) as s:
        found = tr.trend(s, "trend-rmem", metrics=["throughput_bps"])
    [series] = found.series
    [change] = series.changes
    runs = [p.run for p in series.points]
    assert change.run_after == changed and change.run_before == runs[runs.index(changed) - 1]
    assert change.after < change.before and change.relative == pytest.approx(change.after / change.before - 1)
    # the two groups are the runs before the setting and the runs with it
    assert [(series.points[a].run, series.points[b - 1].run) for a, b in series.groups] == \
        [(runs[0], runs[runs.index(changed) - 1]), (changed, runs[-1])]
    [held] = [c for c in change.environment.changes if SYSCTL in c.what]
    assert held.what == f"server {SYSCTL}" and held.b == "4096 8192 16384" and "not set by the plan" in held.a
    text = offlab_in_process("results", "trend", "trend-rmem", "--db", str(db), "--metric", "throughput_bps")
    assert text.returncode == 0, text.stderr
    assert f"change point at run {changed}:" in text.stdout and f"server {SYSCTL}: " in text.stdout


def test_a_history_of_identical_runs_has_no_change_point_in_any_metric(tmp_path):
    db = recorded_history(tmp_path)
    res = offlab_in_process("results", "trend", "trend-same", "--db", str(db), "--json")
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert found["series"] and {s["metric"] for s in found["series"]} >= {"throughput_bps"}
    for s in found["series"]:
        assert s["change_points"] == [] and len(s["groups"]) == 1, s["metric"]
        assert len(s["points"]) == len(found["runs"])


def test_the_same_trend_from_postgresql(pg, tmp_path):
    db = recorded_history(tmp_path)
    url = pg.database()
    res = offlab_in_process("results", "import", str(db), "--db", url)
    assert res.returncode == 0, res.stderr
    for plan in ("trend-rmem", "trend-same"):
        a = json.loads(offlab_in_process("results", "trend", plan, "--db", str(db), "--json").stdout)
        b = json.loads(offlab_in_process("results", "trend", plan, "--db", url, "--json").stdout)
        # run ids are each database's own: compare what was measured and where the groups cut it
        shape = lambda t: [(s["cell"], s["metric"], [p["mean"] for p in s["points"]],  # noqa: E731
                            [g["runs"] for g in s["groups"]],
                            [[c["what"] for c in cp["environment"]["changes"]] for cp in s["change_points"]])
                           for s in t["series"]]
        assert shape(a) == shape(b) and len(a["runs"]) == len(b["runs"])
    assert any(s["change_points"] for s in b["series"]) is False  # the last one read: trend-same


def test_bad_input_is_one_line(tmp_path):
    db = recorded_history(tmp_path)
    cases = [(("nope",), 2, "plan 'nope': no run of that name in DB"),
             (("trend-rmem", "--cell", "stream=udp"), 2, "--cell stream=udp: no cell of that key in plan 'trend-rmem'; "
                                                         "its cells: stream=tcp"),
             (("trend-rmem", "--metric", "speed"), 2, "--metric speed: unknown metric; one of throughput_bps"),
             (("trend-rmem", "--metric", "rtt_p50_us"), 2, "--metric rtt_p50_us: no run of plan 'trend-rmem' measured "
                                                           "it; measured: throughput_bps")]
    for args, code, words in cases:
        res = offlab_in_process("results", "trend", *args, "--db", str(db))
        assert res.returncode == code and words in res.stderr, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    res = offlab_in_process("results", "trend", "nope", "--db", str(db))
    assert "plans it has: 'trend-rmem' (6 runs), 'trend-same' (5 runs)" in res.stderr
    garbage = tmp_path / "not-a.db"
    garbage.write_text("not a database\n" * 100)
    nowhere = f"postgresql://postgres@/offlab?host={tmp_path}"  # no server listens there
    for path, code, words in ((garbage, 2, "is not an SQLite database"), (tmp_path / "missing.db", 2, "no offlab database"),
                              (nowhere, 3, "connecting failed")):
        res = offlab_in_process("results", "trend", "trend-rmem", "--db", str(path))
        assert res.returncode == code and words in res.stderr and str(path) in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr


def test_the_report_shows_the_plans_history_with_the_change_point_and_its_difference(tmp_path):
    db = recorded_history(tmp_path)
    changed = first_run_setting(db, "trend-rmem", SYSCTL)
    with Store.open(db, create=False) as s:
        [last_same] = [r["id"] for r in tr.plan_runs(s, "trend-same")][-1:]
    for run, plan in ((changed, "trend-rmem"), (last_same, "trend-same")):
        out = tmp_path / f"r{run}.html"
        res = offlab_in_process("report", str(run), "--db", str(db), "-o", str(out))
        assert res.returncode == 0, res.stderr
        html = out.read_text()
        section = html[html.index('<section id="history">'):]
        section = section[:section.index("</section>")]
        assert f"History of plan {plan}" in section and section.count('<svg class="spark"') >= 1
        if plan == "trend-rmem":
            assert f"<b>at run {changed}</b>" in section and f"server {SYSCTL}: " in section
        else:
            assert "<b>at run" not in section and "none" in section
    # a plan run once has no history to show
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM runs WHERE name = 'trend-same' AND id <> ?", (last_same,))
    out = tmp_path / "once.html"
    assert offlab_in_process("report", str(last_same), "--db", str(db), "-o", str(out)).returncode == 0
    assert 'id="history"' not in out.read_text()


TINY = """\
name: trend-live
topology: {kind: veth}
axes:
  stream: {tcp: {}}
workload: {tool: iperf3, protocol: tcp, rate: 200M, duration: 1, warmup: 0.3}  # a history to read, at any speed
repeat: {min: 2, max: 2}
"""


@requires_root
def test_trend_reads_a_tiny_history_measured_live(tmp_path, clean_machine):
    plan, db = tmp_path / "trend-live.yaml", tmp_path / "live.db"
    plan.write_text(TINY)
    for _ in range(2):
        res = offlab_cli("run", str(plan), "--db", str(db), timeout=300)
        assert res.returncode == 0, res.stderr
    res = offlab_in_process("results", "trend", "trend-live", "--db", str(db), "--json", "--metric", "throughput_bps")
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    [series] = found["series"]
    assert [p["run"] for p in series["points"]] == [r["id"] for r in found["runs"]] and len(found["runs"]) == 2
    assert all(p["n"] == 2 and p["mean"] > 0 for p in series["points"])
    assert sum(g["runs"] for g in series["groups"]) == 2


def test_a_history_with_emulated_guests_says_so(tmp_path):
    import copy

    from offlab.metrics import TCG_MARK
    from tests.helpers import ENV, store_two

    env = copy.deepcopy(ENV)
    env["labs"][0]["hosts"]["client"]["guest"] = {"accel": "tcg", "qemu_version": "10.0.2"}
    db, _, rb = store_two(tmp_path, ENV, env)
    res = offlab_in_process("results", "trend", "p", "--db", db)
    assert res.returncode == 0, res.stderr
    assert f"{TCG_MARK} (emulated: run {rb}: " in res.stdout and "(tcg, QEMU 10.0.2)" in res.stdout
