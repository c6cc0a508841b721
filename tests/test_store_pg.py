"""The PostgreSQL store: bad URLs and databases in one line, many writers at once, the run lock
there, and `results import` merging SQLite files into it. Against a private cluster (tests/pgcluster.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from offlab.errors import EnvironmentProblem
from offlab.experiment.runner import RunBusy, run_lock
from offlab.store import SCHEMA_VERSION, Store
from synthetic_results import make_uso_run
from tests.helpers import WRITER, run as offlab_in_process


def one_line_error(res: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_a_postgresql_url_is_a_database_never_a_directory_named_postgresql(pg, tmp_path):
    url = pg.database()
    res = subprocess.run([sys.executable, "-m", "offlab", "results", "list", "--db", url], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2 and "no offlab results in postgresql://" in one_line_error(res)
    with Store.open(url) as s:  # a run creates the tables
        make_uso_run(s, rounds=1)
    res = subprocess.run([sys.executable, "-m", "offlab", "results", "list", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OFFLAB_DB": url})
    assert res.returncode == 0, res.stderr
    assert [r["samples"] for r in json.loads(res.stdout)] == [5]
    assert list(tmp_path.iterdir()) == []  # no "postgresql:" directory, no SQLite file
    # Through a path type the URL loses a slash (postgresql:/...): still the same database.
    with Store.open(Path(url)) as s:
        assert [r["samples"] for r in s.list_runs()] == [5] and s.backend == "postgresql"


@pytest.mark.parametrize("how", ["no server", "no such role", "no such database", "not postgresql"])
def test_an_unreachable_or_refusing_database_is_one_line_exit_3(pg, tmp_path, how):
    url = {"no server": f"postgresql://postgres@/offlab?host={tmp_path}&port={pg.port}",
           "no such role": pg.url("postgres", user="nobody_here"),
           "no such database": pg.url("no_such_db"),
           "not postgresql": "mysql://root@db/offlab"}[how]
    res = offlab_in_process("results", "list", "--db", url)
    line = one_line_error(res)
    if how == "not postgresql":
        assert res.returncode == 2 and "--db mysql://root@db/offlab: offlab stores results in an SQLite file" in line
        return
    assert res.returncode == 3, res.stderr
    assert line.startswith("offlab: error: database postgresql://") and "connecting failed: " in line, line
    want = {"no server": "check that the server runs", "no such role": 'role "nobody_here" does not exist',
            "no such database": 'database "no_such_db" does not exist'}[how]
    assert want in line, line


def test_a_password_in_the_url_is_never_printed(pg):
    res = offlab_in_process("results", "list", "--db", pg.url("no_such_db", user="postgres:s3cret"))
    line = one_line_error(res)
    assert res.returncode == 3 and "s3cret" not in line and "postgres:***@" in line, line


def test_a_schema_newer_than_this_offlab_is_refused_in_one_line(pg):
    url = pg.database()
    Store.open(url).close()
    db = url.split("@/")[1].split("?")[0]
    pg.psql(f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'; "
            f"UPDATE meta SET value = '9.9.0' WHERE key = 'written_by'", db=db)
    with pytest.raises(EnvironmentProblem, match=rf"schema version {SCHEMA_VERSION + 1} \(written by offlab 9.9.0\)"):
        Store.open(url)
    res = offlab_in_process("results", "list", "--db", url)
    assert res.returncode == 3 and f"knows up to version {SCHEMA_VERSION}" in one_line_error(res)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_many_writers_at_once_lose_nothing_and_keep_each_runs_samples_apart(pg, tmp_path, backend):
    url = pg.database() if backend == "postgresql" else str(tmp_path / "w.db")
    Store.open(url).close()  # the schema, once
    writers, n = 6, 40
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, f"w{k}", str(n)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(writers)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, [o[1][-500:] for o in outs]
    with Store.open(url) as s:
        runs = s.list_runs()
        assert sorted(r["name"] for r in runs) == sorted(f"writer w{k}" for k in range(writers))
        ids = []
        for r in runs:
            assert (r["status"], r["samples"]) == ("done", n)
            tag = r["name"].split()[1]
            got = s.samples(r["id"])
            # Every sample of this run is its own writer's, in the order written, none lost or doubled.
            assert [(x["sample"]["writer"], x["round"]) for x in got] == [(tag, i) for i in range(n)]
            assert {x["cell_id"] for x in got} == {c["id"] for c in s.cells(r["id"])}
            ids += [x["id"] for x in got]
        assert len(set(ids)) == writers * n


HOLDER = textwrap.dedent("""
    import sys, time
    from offlab.store import Store
    from offlab.experiment.runner import run_lock
    s = Store.open(sys.argv[1])
    lock = run_lock(s, int(sys.argv[2]))
    print("locked", flush=True)
    time.sleep(300)
""")


def test_the_run_lock_holds_in_postgresql_and_goes_with_its_holder(pg):
    url = pg.database()
    with Store.open(url) as s:
        run = s.create_run("locked", "name: l", {}, 1, {}, None, {})
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(run)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked", holder.stderr.read() if holder.poll() else ""
            with pytest.raises(RunBusy, match=rf"run {run} is running as pid {holder.pid}:"):
                run_lock(s, run)
            # A "running" run whose runner holds the lock stays running, however old.
            pg.psql(f"UPDATE runs SET started_at = '2020-01-01T00:00:00.000Z' WHERE id = {run}",
                    db=url.split("@/")[1].split("?")[0])
            assert s.get_run(run)["status"] == "running"
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
        # Killed: the server drops its connection and the lock with it.
        for _ in range(50):
            if s.get_run(run)["status"] != "running":
                break
            time.sleep(0.1)
        assert s.get_run(run)["status"] == "interrupted"
        lock = run_lock(s, run)
        lock.release()


def test_a_database_lost_mid_run_keeps_the_samples_already_written(pg):
    url = pg.database()
    db = url.split("@/")[1].split("?")[0]
    s = Store.open(url)
    try:
        run = s.create_run("lost", "name: l", {}, 1, {}, None, {})
        cell = s.add_cells(run, [{"key": "all", "params": {}}])["all"]
        for i in range(3):
            s.add_sample(run, cell, i, {"i": i}, {"throughput_bps": 1.0 + i})
        pg.psql(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false; "
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
        with pytest.raises(EnvironmentProblem, match=rf"database postgresql://postgres@/{db}\?.*: writing failed: "):
            s.add_sample(run, cell, 3, {"i": 3}, {"throughput_bps": 4.0})
    finally:
        s.close()
        pg.psql(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
    with Store.open(url) as s:
        assert s.metric_values(run, cell, "throughput_bps") == [1.0, 2.0, 3.0]


def test_results_import_merges_sqlite_files_once_keeping_env_and_host_pair(pg, tmp_path):
    files = []
    for k, pair in enumerate(("a:t1,b:t1", "c:p0,d:p0")):
        path = tmp_path / f"host{k}.db"
        with Store.open(path) as s:
            make_uso_run(s, rounds=2, name=f"uso @ {pair}", seed=k)
        files.append(path)
    # A file an older offlab wrote (schema 2, no run ids): its run keeps one identity across imports.
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old, isolation_level=None)
    conn.executescript((Path(__file__).parent / "fixtures" / "schema_v2_sqlite.sql").read_text())
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO runs VALUES (1, 'old @ e:t1,f:t1', 'done', NULL, '2026-01-01T00:00:00.000Z', NULL, "
                 "'0.1.0', 1, 'name: old', '{}', '{\"kernel\": \"6.1\"}', NULL, '{}')")
    conn.execute("INSERT INTO cells VALUES (1, 1, 'all', 0, '{}', '{}', 'done', NULL)")
    conn.execute("INSERT INTO samples VALUES (1, 1, 1, 1, '2026-01-01T00:00:00.000Z', '{}', NULL)")
    conn.execute("INSERT INTO metrics VALUES (1, 1, 1, 'throughput_bps', 5.0)")
    conn.close()
    os.chmod(old, 0o444)  # read only: import never writes its sources
    files.append(old)
    url = pg.database()
    res = offlab_in_process("results", "import", *map(str, files), "--db", url)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("imported as run") == 3 and "1 run(s) imported, 0 already in" in res.stdout
    with Store.open(url) as s:
        runs = {r["name"]: r for r in s.list_runs()}
        assert set(runs) == {"uso @ a:t1,b:t1", "uso @ c:p0,d:p0", "old @ e:t1,f:t1"}
        assert (runs["uso @ c:p0,d:p0"]["cells"], runs["uso @ c:p0,d:p0"]["samples"]) == (6, 10)
        with Store.open(files[1]) as src:
            want, got = src.get_run(1), s.get_run(runs["uso @ c:p0,d:p0"]["id"])
            assert got["env"] == want["env"] and got["started_at"] == want["started_at"] and got["uid"] == want["uid"]
            assert [x["sample"] for x in s.samples(got["id"])] == [x["sample"] for x in src.samples(1)]
        assert s.get_run(runs["old @ e:t1,f:t1"]["id"])["env"] == {"kernel": "6.1"}
    again = offlab_in_process("results", "import", *map(str, files), "--db", url)
    assert again.returncode == 0, again.stderr
    assert "imported as run" not in again.stdout and again.stdout.count("0 run(s) imported, 1 already in") == 3
    # Pairs side by side from the shared database.
    with Store.open(url) as s:
        a, c = runs["uso @ a:t1,b:t1"]["id"], runs["uso @ c:p0,d:p0"]["id"]
    res = offlab_in_process("compare", str(a), str(c), "--db", url, "--json")
    assert res.returncode == 0, res.stderr
    assert {(r["run"], r["baseline_run"]) for r in json.loads(res.stdout)["rows"]} == {(c, a)}
    res = offlab_in_process("report", str(c), "-o", str(tmp_path / "c.html"), "--db", url)
    assert res.returncode == 0, res.stderr
    assert "uso @ c:p0,d:p0" in (tmp_path / "c.html").read_text()


@pytest.mark.parametrize("what", ["missing", "not sqlite", "a url"])
def test_results_import_of_a_file_that_is_not_an_offlab_database_is_one_line(tmp_path, what, pg):
    src = {"missing": str(tmp_path / "nope.db"), "not sqlite": str(tmp_path / "notes.db"), "a url": pg.url("x")}[what]
    (tmp_path / "notes.db").write_text("not a database\n" * 100)
    res = offlab_in_process("results", "import", src, "--db", str(tmp_path / "target.db"))
    line = one_line_error(res)
    assert res.returncode == 2, res.stderr
    assert {"missing": f"no SQLite database at {src}", "not sqlite": f"{src} is not an SQLite database",
            "a url": "results import reads SQLite files"}[what] in line, line


def test_a_sequential_runs_rounds_read_back_from_postgresql_as_from_sqlite(pg, tmp_path):
    """Store.cell_rounds (what a sequential compare pairs by round) reads through the same SQL on both
    backends: it once went through SQLite's raw connection and refused PostgreSQL."""
    rounds = {}
    for where in (pg.database(), tmp_path / "r.db"):
        with Store.open(where) as s:
            run_id, ids = make_uso_run(s, rounds=2)
            by_cell = s.cell_rounds(run_id, "throughput_bps")
            rounds[s.backend] = {key: by_cell.get(cid) for key, cid in ids.items()}
    assert rounds["postgresql"] == rounds["sqlite"]
    measured = [v for v in rounds["sqlite"].values() if v is not None]
    assert len(measured) == 5 and all([r for r, _ in v] == [0, 1] for v in measured)
