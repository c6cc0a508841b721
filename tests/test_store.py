"""The results database: schema versioning, WAL, sample-by-sample commits, resume, plain SQL."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from offlab.store import backends, schema
from offlab.errors import BadInput, EnvironmentProblem
from offlab.store import SCHEMA_VERSION, Store, default_db_path
from synthetic_results import ENV, PLAN_TEXT, make_uso_run, sample
from tests.helpers import run as offlab_in_process

REPEAT = {"min": 3, "max": 10, "level": 99, "width": 5}
CELLS = [
    {"key": "payload=1472@1500,offload=off", "params": {"payload": "1472@1500", "offload": "off"},
     "settings": {"udp_payload": 1472, "mtu": 1500, "features": {"client": {"tx-udp-segmentation": "off"}}}},
    {"key": "payload=1472@1500,offload=on", "params": {"payload": "1472@1500", "offload": "on"},
     "settings": {"udp_payload": 1472, "mtu": 1500, "features": {"client": {"tx-udp-segmentation": "on"}}}},
]


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "lab" / "offlab.db"


@pytest.fixture
def sqlite_store(db):
    s = Store.open(db)
    yield s
    s.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request, tmp_path) -> str:
    """Each test that takes it runs twice: on an SQLite file, and on a database of the private PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "lab" / "offlab.db")
    return request.getfixturevalue("pg").database()


@pytest.fixture
def store(any_db):
    s = Store.open(any_db)
    yield s
    s.close()


def new_run(store: Store) -> int:
    return store.create_run("uso", PLAN_TEXT, {"name": "uso"}, 42, ENV, {"offload": "off"}, REPEAT)


def test_open_creates_directories_schema_version_meta_and_wal(db):
    with Store.open(db) as s:
        assert s.schema_version() == SCHEMA_VERSION
    assert db.exists()
    other = sqlite3.connect(db)
    assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(other.execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["written_by"]
    tables = {r[0] for r in other.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    assert {"runs", "cells", "samples", "metrics", "meta", "sample_metrics"} <= tables


def test_reopening_an_existing_database_keeps_its_runs(db):
    with Store.open(db) as s:
        run = new_run(s)
    with Store.open(db) as s:
        assert s.get_run(run)["name"] == "uso"
        assert s.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_each_sample_is_committed_before_the_run_ends(sqlite_store, db):
    store = sqlite_store
    run = new_run(store)
    ids = store.add_cells(run, CELLS)
    smp = sample(__import__("random").Random(1), payload=1472, mtu=1500, gso=False, throughput_bps=2e9)
    sid = store.add_sample(run, ids[CELLS[0]["key"]], 0, smp, {"throughput_bps": 2.0e9, "cpu_client_busy": 81.5},
                           requested_vs_actual=[{"knob": "mtu", "requested": 1500, "actual": 1500}])
    # A second connection, as `offlab results show` in another terminal, sees it while the run is running.
    reader = sqlite3.connect(db)
    assert reader.execute("SELECT status FROM runs WHERE id = ?", (run,)).fetchone()[0] == "running"
    assert reader.execute("SELECT count(*) FROM samples WHERE id = ?", (sid,)).fetchone()[0] == 1
    assert dict(reader.execute("SELECT name, value FROM metrics WHERE sample_id = ?", (sid,))) == {
        "throughput_bps": 2.0e9, "cpu_client_busy": 81.5}
    stored = json.loads(reader.execute("SELECT sample FROM samples WHERE id = ?", (sid,)).fetchone()[0])
    assert stored["traffic"]["throughput_bps"] == smp["traffic"]["throughput_bps"]


def test_add_cells_again_on_resume_returns_the_same_ids(store):
    run = new_run(store)
    first = store.add_cells(run, CELLS)
    store.set_cell_status(first[CELLS[0]["key"]], "done")
    again = store.add_cells(run, CELLS + [{"key": "payload=8972@9000,offload=off",
                                            "params": {"payload": "8972@9000", "offload": "off"}, "settings": {}}])
    assert {k: again[k] for k in first} == first
    assert len(set(again.values())) == 3
    cells = store.cells(run)
    assert [c["key"] for c in cells] == [c["key"] for c in CELLS] + ["payload=8972@9000,offload=off"]
    assert cells[0]["status"] == "done"  # resume does not reset what was done
    assert cells[1]["settings"]["features"] == {"client": {"tx-udp-segmentation": "on"}}


def test_add_cells_with_a_known_key_but_other_params_is_refused(store):
    run = new_run(store)
    store.add_cells(run, CELLS)
    changed = [{**CELLS[0], "params": {"payload": "8972@9000", "offload": "off"}}]
    with pytest.raises(BadInput, match="payload=1472@1500,offload=off"):
        store.add_cells(run, changed)


def test_unknown_run_is_bad_input_pointing_at_results_list(store):
    with pytest.raises(BadInput, match=r"no run 7 in DB .*offlab results list") as exc:
        store.get_run(7)
    assert exc.value.exit_code == 2
    with pytest.raises(BadInput):
        store.cells(7)
    with pytest.raises(BadInput):
        store.set_run_status(7, "done")


def test_database_from_a_newer_schema_is_refused_with_exit_3(db):
    Store.open(db).close()
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.execute("UPDATE meta SET value = '9.9.0' WHERE key = 'written_by'")
    raw.commit()
    raw.close()
    with pytest.raises(EnvironmentProblem, match=rf"schema version {SCHEMA_VERSION + 1} \(written by offlab 9.9.0\)"
                                                 rf".*knows up to version {SCHEMA_VERSION}") as exc:
        Store.open(db)
    assert exc.value.exit_code == 3


def test_migrations_run_in_order_from_an_older_version(db, monkeypatch):
    Store.open(db).close()
    extra = {**schema.MIGRATIONS, SCHEMA_VERSION + 1: ["ALTER TABLE runs ADD COLUMN host TEXT"]}
    monkeypatch.setattr(schema, "MIGRATIONS", extra)
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with Store.open(db) as s:
        assert s.schema_version() == SCHEMA_VERSION + 1
        cols = {r[1] for r in s.conn.execute("PRAGMA table_info(runs)")}
        assert "host" in cols
        assert s.meta("schema_version") == str(SCHEMA_VERSION + 1)


def test_a_file_that_is_not_an_offlab_database_is_bad_input(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("these are not the tables you are looking for\n" * 100)
    with pytest.raises(BadInput, match="not an SQLite database"):
        Store.open(text)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE inventory (item TEXT)").connection.commit()
    with pytest.raises(BadInput, match="not offlab's"):
        Store.open(other)


def test_a_database_another_offlab_makes_while_it_is_opened_is_offlabs(tmp_path, monkeypatch):
    # A run creating its database as a reader opens it (a test polling for its first sample did): the reader's
    # first look at the version came before the creation's commit, its look at the tables after it.
    with Store.open(tmp_path / "runs.db"):
        pass
    real = Store.schema_version
    looks: list[int] = []

    def before_the_commit(self) -> int:
        looks.append(1)
        return 0 if len(looks) == 1 else real(self)

    monkeypatch.setattr(Store, "schema_version", before_the_commit)
    with Store.open(tmp_path / "runs.db") as s:
        assert s.list_runs() == [] and len(looks) >= 2


def test_opening_without_create_does_not_make_a_database(tmp_path):
    with pytest.raises(BadInput, match="no offlab database at"):
        Store.open(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_default_db_path_prefers_offlab_db_then_root_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("OFFLAB_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    monkeypatch.delenv("OFFLAB_DB")
    monkeypatch.setattr(backends.os, "geteuid", lambda: 0)
    assert default_db_path() == Path("/var/lib/offlab/offlab.db")
    monkeypatch.setattr(backends.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_db_path() == tmp_path / ".local/share/offlab/offlab.db"


def test_run_round_trips_plan_env_baseline_repeat_and_status(store):
    plan = {"name": "uso", "axes": {"offload": ["off", "on"]}}
    run = store.create_run("uso", PLAN_TEXT, plan, 42, ENV, {"offload": "off"}, REPEAT)
    r = store.get_run(run)
    assert (r["plan_text"], r["plan"], r["env"], r["baseline"], r["repeat"], r["seed"]) == (
        PLAN_TEXT, plan, ENV, {"offload": "off"}, REPEAT, 42)
    assert r["status"] == "running" and r["finished_at"] is None and r["started_at"].endswith("Z")
    assert r["offlab_version"]
    store.set_run_status(run, "interrupted", "SIGINT after 3 of 6 cells")
    r = store.get_run(run)
    assert (r["status"], r["note"]) == ("interrupted", "SIGINT after 3 of 6 cells") and r["finished_at"]
    store.set_run_status(run, "running")  # resume
    assert store.get_run(run)["finished_at"] is None
    with pytest.raises(ValueError):
        store.set_run_status(run, "finished")
    with pytest.raises(ValueError):
        store.set_cell_status(1, "ok")


def test_samples_and_metric_values_come_back_in_measured_order_without_nan(store):
    run = new_run(store)
    ids = store.add_cells(run, CELLS)
    cid = ids[CELLS[1]["key"]]
    for i, v in enumerate([3.1e9, 3.0e9, 3.2e9]):
        store.add_sample(run, cid, i, {"traffic": {"throughput_bps": v, "jitter_us": math.nan}},
                         {"throughput_bps": v, "pps": None, "jitter_us": math.nan})
    assert store.metric_values(run, cid, "throughput_bps") == [3.1e9, 3.0e9, 3.2e9]
    assert store.metric_values(run, cid, "pps") == []
    got = store.samples(run, cid)
    assert [s["round"] for s in got] == [0, 1, 2]
    assert got[0]["metrics"] == {"throughput_bps": 3.1e9}
    assert got[0]["sample"]["traffic"]["jitter_us"] is None  # NaN is stored as JSON null
    assert store.samples(run, ids[CELLS[0]["key"]]) == []
    with pytest.raises(BadInput, match="no cell"):
        store.add_sample(run, 9999, 0, {}, {})


def test_list_runs_counts_cells_and_samples(store):
    run, _ = make_uso_run(store, rounds=3)
    (row,) = store.list_runs()
    assert row["id"] == run and row["status"] == "done" and row["finished"]
    assert (row["cells"], row["samples"]) == (6, 5 * 3)


def test_metrics_table_answers_plain_sql(sqlite_store, db):
    run, _ = make_uso_run(sqlite_store, rounds=3)
    sql = sqlite3.connect(db)
    means = dict(sql.execute(
        "SELECT c.key, avg(m.value) FROM metrics m JOIN cells c ON c.id = m.cell_id "
        "WHERE m.name = 'throughput_bps' AND m.run_id = ? GROUP BY c.key", (run,)))
    assert set(means) == {f"payload={p},offload={o}" for p in ("1472@1500", "8972@9000", "65507@1500")
                          for o in ("off", "on")} - {"payload=65507@1500,offload=on"}
    assert means["payload=1472@1500,offload=on"] == pytest.approx(3.1e9, rel=0.05)
    by_offload = dict(sql.execute(
        "SELECT json_extract(c.params, '$.offload'), count(*) FROM sample_metrics v JOIN cells c ON c.id = v.cell_id "
        "WHERE v.metric = 'throughput_bps' GROUP BY 1"))
    assert by_offload == {"off": 9, "on": 6}
    assert sql.execute("SELECT reason FROM cells WHERE status = 'skipped'").fetchone()[0].startswith("tx-udp")


def test_results_cli_lists_shows_and_exports(store, any_db):
    db = any_db
    run, _ = make_uso_run(store, rounds=3)
    listed = offlab_in_process("results", "list", "--json", "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)[0]["samples"] == 15
    shown = offlab_in_process("results", "show", str(run), "--db", str(db), env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "payload=1472@1500,offload=on" in shown.stdout and "Gbit/s" in shown.stdout
    assert "tx-udp-segmentation is [fixed] off" in shown.stdout  # reason printed as text, not rich markup
    rows = offlab_in_process("results", "show", str(run), "--csv", "--db", str(db)).stdout.splitlines()
    assert rows[0].startswith("run_id,run,cell_id,cell,payload,offload,cell_status,round,sample_id,created_at,")
    assert len(rows) == 1 + 15
    everything = json.loads(offlab_in_process("results", "show", str(run), "--json", "--db", str(db)).stdout)
    assert everything["run"]["plan_text"] == PLAN_TEXT and len(everything["samples"]) == 15
    missing = offlab_in_process("results", "show", "77", "--db", str(db))
    assert missing.returncode == 2 and "no run 77" in missing.stderr


def test_a_signal_in_the_middle_of_a_write_waits_for_its_commit_and_the_next_write_goes_through(sqlite_store, db):
    """A Ctrl-C inside a write transaction (a sample being stored) is raised once it has committed: the lock is
    free at once for the run's own last write (its status), instead of held until the busy timeout."""
    import os
    import signal
    import time

    from offlab.interrupts import interrupts

    run = new_run(sqlite_store)
    with pytest.raises(KeyboardInterrupt), interrupts():
        with sqlite_store._tx() as c:
            c.exec_driver_sql("UPDATE runs SET note = 'half' WHERE id = ?", (run,))
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the signal is here now, and waits
            c.exec_driver_sql("UPDATE runs SET note = 'whole' WHERE id = ?", (run,))
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT note FROM runs WHERE id = ?", (run,)).fetchone()[0] == "whole"
    start = time.monotonic()
    sqlite_store.set_run_status(run, "interrupted", "interrupted")
    assert time.monotonic() - start < 5  # a hang guard: a held lock would wait out the 10-s busy timeout
    assert sqlite_store.get_run(run)["status"] == "interrupted"
