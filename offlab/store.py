"""The results database: runs, their cells, every sample, and each metric in long format.

SQLite in WAL mode, one file. Every sample is committed in its own transaction the moment it is
measured, so a killed run keeps what it measured and a reader (`offlab results show`) sees it
while the run goes on. Tables are meant to be queried with plain SQL (docs/results.md); JSON
columns are TEXT that SQLite's json_extract() reads.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sqlite3
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from offlab import __version__
from offlab.errors import BadInput, EnvironmentProblem
from offlab.state import owner_alive

SCHEMA_VERSION = 2

# Versions this offlab reads without migrating (a read-only file): 1 lacks only sample_series.
READABLE_VERSIONS = (1, SCHEMA_VERSION)

# A "running" run whose lock names no live process, or that has no lock this long after it started
# (the runner takes the lock right after creating the run), died without saying so (kill -9).
NO_LOCK_GRACE_S = 60.0

RUN_STATUSES = ("running", "done", "interrupted", "failed", "budget_exhausted")
CELL_STATUSES = ("pending", "running", "done", "confidence_not_reached", "skipped", "failed", "interrupted")

# MIGRATIONS[v] takes a database from version v - 1 to v. Never edit a released step: add one.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        """CREATE TABLE runs (
            id             INTEGER PRIMARY KEY,
            name           TEXT NOT NULL,
            status         TEXT NOT NULL,
            note           TEXT,
            started_at     TEXT NOT NULL,
            finished_at    TEXT,
            offlab_version TEXT NOT NULL,
            seed           INTEGER,
            plan_text      TEXT NOT NULL,
            plan           TEXT NOT NULL,
            env            TEXT NOT NULL,
            baseline       TEXT,
            repeat         TEXT NOT NULL
        )""",
        """CREATE TABLE cells (
            id       INTEGER PRIMARY KEY,
            run_id   INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            key      TEXT NOT NULL,
            position INTEGER NOT NULL,
            params   TEXT NOT NULL,
            settings TEXT NOT NULL,
            status   TEXT NOT NULL DEFAULT 'pending',
            reason   TEXT,
            UNIQUE (run_id, key)
        )""",
        """CREATE TABLE samples (
            id                  INTEGER PRIMARY KEY,
            run_id              INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            cell_id             INTEGER NOT NULL REFERENCES cells(id) ON DELETE CASCADE,
            round               INTEGER NOT NULL,
            created_at          TEXT NOT NULL,
            sample              TEXT NOT NULL,
            requested_vs_actual TEXT
        )""",
        """CREATE TABLE metrics (
            sample_id INTEGER NOT NULL REFERENCES samples(id) ON DELETE CASCADE,
            cell_id   INTEGER NOT NULL REFERENCES cells(id) ON DELETE CASCADE,
            run_id    INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            name      TEXT NOT NULL,
            value     REAL NOT NULL,
            PRIMARY KEY (sample_id, name)
        )""",
        "CREATE INDEX cells_run ON cells(run_id)",
        "CREATE INDEX samples_cell ON samples(cell_id)",
        "CREATE INDEX metrics_cell_name ON metrics(cell_id, name)",
        "CREATE INDEX metrics_run_name ON metrics(run_id, name)",
        # One row per (sample, metric) with the cell key beside it: the table people query first.
        """CREATE VIEW sample_metrics AS
            SELECT m.run_id, r.name AS run_name, c.id AS cell_id, c.key AS cell, s.round,
                   m.sample_id, m.name AS metric, m.value
            FROM metrics m
            JOIN samples s ON s.id = m.sample_id
            JOIN cells c ON c.id = m.cell_id
            JOIN runs r ON r.id = m.run_id""",
    ],
    # Per-interval rows of each sample (issue #12): one row per interval, a column per figure.
    2: [
        """CREATE TABLE sample_series (
            sample_id    INTEGER NOT NULL REFERENCES samples(id) ON DELETE CASCADE,
            cell_id      INTEGER NOT NULL REFERENCES cells(id) ON DELETE CASCADE,
            run_id       INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            part         TEXT NOT NULL,
            source       TEXT NOT NULL,
            i            INTEGER NOT NULL,
            t_s          REAL NOT NULL,
            dur_s        REAL,
            warmup       INTEGER NOT NULL DEFAULT 0,
            bytes        INTEGER,
            bps          REAL,
            datagrams    INTEGER,
            pps          REAL,
            lost         INTEGER,
            reordered    INTEGER,
            retransmits  INTEGER,
            transactions INTEGER,
            tps          REAL,
            rtt_p50_us   REAL,
            rtt_p99_us   REAL,
            rtt_max_us   REAL,
            PRIMARY KEY (sample_id, part, source, i)
        ) WITHOUT ROWID""",
        "CREATE INDEX sample_series_cell ON sample_series(cell_id)",
    ],
}

# The figures a series row can hold: sample_series's columns after t_s, in order (offlab.traffic.series).
SERIES_VALUES = ("dur_s", "warmup", "bytes", "bps", "datagrams", "pps", "lost", "reordered", "retransmits",
                 "transactions", "tps", "rtt_p50_us", "rtt_p99_us", "rtt_max_us")


def series_holders(sample: dict | None, depth: int = 3) -> Iterator[tuple[str, dict]]:
    """(dotted part, dict) for every dict with a `series` list within `depth` levels of the sample:
    ("traffic", sample["traffic"]), ("rr.loaded", sample["rr"]["loaded"]), ..."""
    if not isinstance(sample, dict) or depth == 0:
        return
    for key, sub in sample.items():
        if isinstance(sub, dict):
            if isinstance(sub.get("series"), list):
                yield str(key), sub
            for part, inner in series_holders(sub, depth - 1):
                yield f"{key}.{part}", inner


def _split_series(sample: dict) -> tuple[dict, list[tuple[str, dict]]]:
    """A copy of the sample without its series' rows (each series keeps its header and `rows_in`), and
    (part, series) for every series in it."""
    found: list[tuple[str, dict]] = []
    out = copy.deepcopy(sample)
    for part, holder in series_holders(out):
        headers = []
        for s in holder["series"]:
            if isinstance(s, dict) and isinstance(s.get("rows"), list):
                found.append((part, s))
                headers.append({k: v for k, v in s.items() if k != "rows"} | {"rows_in": "sample_series"})
            else:
                headers.append(s)
        holder["series"] = headers
    return out, found


def _series_rows(sample_id: int, cell_id: int, run_id: int, part: str, s: dict) -> list[tuple]:
    cols = list(s.get("columns") or [])
    if "t_s" not in cols:
        return []
    idx = {c: cols.index(c) for c in cols}
    rows = []
    for i, r in enumerate(s["rows"]):
        vals = []
        for name in SERIES_VALUES:
            v = r[idx[name]] if name in idx and idx[name] < len(r) else None
            vals.append(int(bool(v)) if name == "warmup" else _clean(v))
        rows.append((sample_id, cell_id, run_id, part, str(s.get("source") or "?"), i, r[idx["t_s"]], *vals))
    return rows


def _join_series(sample: dict | None, rows: dict[tuple[str, str], list[dict]]) -> None:
    """Puts the rows of sample_series back into the series headers the sample kept."""
    for part, holder in list(series_holders(sample)):
        for s in holder["series"]:
            if isinstance(s, dict) and s.pop("rows_in", None) == "sample_series":
                cols = s.get("columns") or []
                s["rows"] = [[d.get(c) for c in cols] for d in rows.get((part, str(s.get("source") or "?")), [])]


def default_db_path() -> Path:
    """$OFFLAB_DB if set; else /var/lib/offlab/offlab.db as root; else ~/.local/share/offlab/offlab.db."""
    env = os.environ.get("OFFLAB_DB")
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/var/lib/offlab/offlab.db")
    return Path.home() / ".local" / "share" / "offlab" / "offlab.db"


def now_utc() -> str:
    """ISO 8601 in UTC with milliseconds, e.g. 2024-05-01T12:00:00.123Z (SQLite's datetime() reads it)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (json_extract rejects them), tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), default=str, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None, where: str = "a JSON column") -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{where} is damaged (not valid JSON: {exc}): inspect it with `sqlite3`, or pass "
                       f"--db PATH to another database") from None


class Store:
    """One open results database. Safe to share between threads (writes are serialised)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self._lock = threading.RLock()
        self.read_only = False

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path | None = None, *, create: bool = True) -> "Store":
        """Open (and with `create`, make) the database at `path`; migrate an older schema."""
        path = Path(path).expanduser() if path is not None else default_db_path()
        if not path.exists():
            if not create:
                raise BadInput(f"no offlab database at {path}: `offlab run PLAN.yaml` creates it "
                               f"(or pass --db PATH / set OFFLAB_DB)")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise EnvironmentProblem(f"cannot create {path.parent}: {exc.strerror} "
                                         f"(pass --db PATH or set OFFLAB_DB to a writable place)") from exc
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
            conn.execute("PRAGMA busy_timeout = 10000")
            conn.execute("PRAGMA foreign_keys = ON")
            store = cls(conn, path)
            store._migrate()
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise BadInput(f"{path} is not an SQLite database (pass --db PATH to an offlab database)") from exc
            if not path.exists():
                raise EnvironmentProblem(f"cannot open database {path}: {exc} "
                                         f"(check permissions, or pass --db PATH / set OFFLAB_DB)") from exc
            # A read-only file or file system, or a full disk: reading must still work.
            store = cls._open_read_only(path, exc)
        return store

    @classmethod
    def _open_read_only(cls, path: Path, why: Exception) -> "Store":
        """The database opened for reading only; writes then fail with one line."""
        last: Exception = why
        for query in ("mode=ro", "immutable=1"):  # immutable: a WAL database on a read-only file system
            try:
                conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, isolation_level=None,
                                       check_same_thread=False, timeout=10.0)
                store = cls(conn, path)
                store.read_only = True
                if store.schema_version() not in READABLE_VERSIONS:
                    raise EnvironmentProblem(
                        f"{path} has schema version {store.schema_version()} and is read-only, so this offlab "
                        f"(version {SCHEMA_VERSION}) cannot migrate it: make it writable ({why})")
                conn.execute("SELECT count(*) FROM runs").fetchone()
                return store
            except sqlite3.DatabaseError as exc:
                last = exc
        raise EnvironmentProblem(f"cannot open database {path}: {last} "
                                 f"(check permissions, or pass --db PATH / set OFFLAB_DB)") from last

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            made_by = self._meta("written_by") or "a newer offlab"
            raise EnvironmentProblem(
                f"{self.path} has schema version {version} (written by offlab {made_by}); this offlab "
                f"{__version__} knows up to version {SCHEMA_VERSION}: upgrade offlab, or pass --db PATH "
                f"to another database")
        if version == 0:
            foreign = [r[0] for r in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            if foreign:
                raise BadInput(f"{self.path} is an SQLite database but not offlab's (it has tables "
                               f"{', '.join(sorted(foreign)[:5])}): pass --db PATH to another file")
        if version == SCHEMA_VERSION:
            return
        if version > 0 and not os.access(self.path, os.W_OK):
            # Another user's file or a read-only file system: Store.open reads it as it is, unmigrated.
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._tx():
            # Re-read inside the write lock: another process may have migrated meanwhile.
            version = self.schema_version()
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[v]:
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {v}")
            if version < SCHEMA_VERSION:
                self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                                  (str(SCHEMA_VERSION),))
                self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('written_by', ?)",
                                  (__version__,))
                if version == 0:
                    self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('created_at', ?)",
                                      (now_utc(),))

    def _meta(self, key: str) -> str | None:
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return row[0] if row else None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed on leaving (BEGIN IMMEDIATE: take the write lock now)."""
        with self._lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._write_failed(exc) from None
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                self._rollback()
                raise self._write_failed(exc) from None
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            pass  # SQLite already rolled back (e.g. a full disk)

    def _write_failed(self, exc: sqlite3.OperationalError) -> EnvironmentProblem:
        """One line for a write the database refused: read-only, full, locked."""
        why = str(exc)
        if "readonly" in why or self.read_only:
            fix = "it is read-only here: run as its owner (root), or pass --db PATH to a writable database"
        elif "full" in why:
            fix = f"free space on the file system of {self.path.parent}, or pass --db PATH elsewhere"
        else:
            fix = "pass --db PATH to another database"
        return EnvironmentProblem(f"cannot write to database {self.path}: {why} ({fix}); reading it still works")

    # -- writing -----------------------------------------------------------------------------

    def create_run(self, name: str, plan_text: str, plan: dict, seed: int, env: dict,
                   baseline: dict | None, repeat: dict) -> int:
        """A new run, status "running", started now by this offlab version."""
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO runs(name, status, started_at, offlab_version, seed, plan_text, plan, env, "
                "baseline, repeat) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, now_utc(), __version__, seed, plan_text, _dumps(plan), _dumps(env),
                 None if baseline is None else _dumps(baseline), _dumps(repeat)))
            return int(cur.lastrowid)

    def add_cells(self, run_id: int, cells: list[dict]) -> dict[str, int]:
        """Add the run's cells (key, params, settings); key → cell id. Adding the same keys again
        (resume) returns the same ids and leaves those cells as they are."""
        self._run_row(run_id)
        ids: dict[str, int] = {}
        with self._tx() as c:
            existing = {row[0]: (row[1], row[2]) for row in c.execute(
                "SELECT key, id, params FROM cells WHERE run_id = ?", (run_id,))}
            position = c.execute("SELECT coalesce(max(position) + 1, 0) FROM cells WHERE run_id = ?",
                                 (run_id,)).fetchone()[0]
            for cell in cells:
                key = cell["key"]
                params = _dumps(cell.get("params") or {})
                if key in existing:
                    cell_id, stored = existing[key]
                    if json.loads(stored) != json.loads(params):
                        raise BadInput(f"cell {key!r} of run {run_id} exists with params {stored}, "
                                       f"not {params}: resume with the plan the run started with")
                    ids[key] = cell_id
                    continue
                cur = c.execute(
                    "INSERT INTO cells(run_id, key, position, params, settings, status) "
                    "VALUES (?, ?, ?, ?, ?, 'pending')",
                    (run_id, key, position, params, _dumps(cell.get("settings") or {})))
                position += 1
                ids[key] = int(cur.lastrowid)
                existing[key] = (ids[key], params)
        return ids

    def set_cell_status(self, cell_id: int, status: str, reason: str | None = None) -> None:
        if status not in CELL_STATUSES:
            raise ValueError(f"cell status {status!r} is not one of {', '.join(CELL_STATUSES)}")
        with self._tx() as c:
            cur = c.execute("UPDATE cells SET status = ?, reason = ? WHERE id = ?", (status, reason, cell_id))
            if cur.rowcount == 0:
                raise BadInput(f"no cell {cell_id} in {self.path}")

    def add_sample(self, run_id: int, cell_id: int, round_no: int, sample: dict, metrics: dict[str, float],
                   requested_vs_actual: list[dict] | None = None) -> int:
        """Store one measured sample and its metrics, committed before returning; the sample id.
        Per-interval series go to sample_series, one row per interval; the sample keeps their headers."""
        sample, found = _split_series(sample)
        with self._tx() as c:
            row = c.execute("SELECT run_id FROM cells WHERE id = ?", (cell_id,)).fetchone()
            if row is None or row[0] != run_id:
                raise BadInput(f"no cell {cell_id} in run {run_id} of {self.path}")
            cur = c.execute(
                "INSERT INTO samples(run_id, cell_id, round, created_at, sample, requested_vs_actual) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, cell_id, round_no, now_utc(), _dumps(sample),
                 None if requested_vs_actual is None else _dumps(requested_vs_actual)))
            sample_id = int(cur.lastrowid)
            for part, s in found:
                c.executemany(
                    f"INSERT OR REPLACE INTO sample_series(sample_id, cell_id, run_id, part, source, i, t_s, "
                    f"{', '.join(SERIES_VALUES)}) VALUES ({', '.join('?' * (7 + len(SERIES_VALUES)))})",
                    _series_rows(sample_id, cell_id, run_id, part, s))
            c.executemany(
                "INSERT INTO metrics(sample_id, cell_id, run_id, name, value) VALUES (?, ?, ?, ?, ?)",
                [(sample_id, cell_id, run_id, name, float(v)) for name, v in metrics.items()
                 if v is not None and math.isfinite(float(v))])
        return sample_id

    def set_run_status(self, run_id: int, status: str, note: str | None = None) -> None:
        """Set the run's status; any status but "running" also stamps finished_at (resume clears it)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
        finished = None if status == "running" else now_utc()
        with self._tx() as c:
            cur = c.execute("UPDATE runs SET status = ?, note = ?, finished_at = ? WHERE id = ?",
                            (status, note, finished, run_id))
            if cur.rowcount == 0:
                raise self._no_run(run_id)

    # -- reading -----------------------------------------------------------------------------

    def _json(self, text: str | None, column: str, run_id: int, table: str = "run", row: int | None = None) -> Any:
        where = f"column {column} of {table} {row if row is not None else run_id}" + \
            (f" (run {run_id})" if table != "run" else "") + f" in {self.path}"
        return _loads(text, where)

    def _no_run(self, run_id: int) -> BadInput:
        return BadInput(f"no run {run_id} in DB {self.path} (offlab results list)")

    def _run_row(self, run_id: int) -> sqlite3.Row:
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        row = cur.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise self._no_run(run_id)
        return row

    def run_lock_path(self, run_id: int) -> Path:
        """The run's one-writer flock (offlab.experiment.runner.run_lock): beside the database."""
        return Path(f"{self.path}.locks") / f"run-{run_id}.lock"

    def _dead_note(self, run_id: int, started_at: str) -> str | None:
        """Why a run stored as "running" is not running any more; None when its process is alive."""
        try:
            holder = json.loads(self.run_lock_path(run_id).read_text() or "{}")
        except FileNotFoundError:
            holder = None
        except (OSError, ValueError):
            return None  # unreadable: claim nothing
        if isinstance(holder, dict) and holder.get("pid") is not None:
            if owner_alive(holder):
                return None
            who = f"its process (pid {holder['pid']})"
        else:
            try:
                age = (datetime.now(timezone.utc) - datetime.strptime(started_at, "%Y-%m-%dT%H:%M:%S.%fZ")
                       .replace(tzinfo=timezone.utc)).total_seconds()
            except ValueError:
                return None
            if age < NO_LOCK_GRACE_S:
                return None  # just created: its runner is about to take the lock
            who = "its process"
        return f"interrupted: {who} ended without finishing the run; resume with `offlab run --resume {run_id}`"

    def _settle(self, run_id: int, status: str, note: str | None, started_at: str) -> tuple[str, str | None]:
        """(status, note) as they really are: a "running" run whose process is gone is "interrupted",
        written back when the database is writable (only while still "running": a resume wins)."""
        if status != "running":
            return status, note
        dead = self._dead_note(run_id, started_at)
        if dead is None:
            return status, note
        if not self.read_only:
            try:
                with self._tx() as c:
                    c.execute("UPDATE runs SET status = 'interrupted', note = ? WHERE id = ? AND status = 'running'",
                              (dead, run_id))
            except EnvironmentProblem:
                pass  # a read-only or full database: still shown as interrupted
        return "interrupted", dead

    def get_run(self, run_id: int) -> dict:
        """Everything about a run: plan (text and parsed), env, baseline, repeat, seed, status, times."""
        r = self._run_row(run_id)
        status, note = self._settle(run_id, r["status"], r["note"], r["started_at"])
        return {
            "id": r["id"], "name": r["name"], "status": status, "note": note,
            "started_at": r["started_at"], "finished_at": r["finished_at"],
            "offlab_version": r["offlab_version"], "seed": r["seed"],
            "plan_text": r["plan_text"], "plan": self._json(r["plan"], "plan", run_id),
            "env": self._json(r["env"], "env", run_id), "baseline": self._json(r["baseline"], "baseline", run_id),
            "repeat": self._json(r["repeat"], "repeat", run_id),
        }

    def list_runs(self) -> list[dict]:
        """Every run, oldest first, with counts of cells and samples."""
        rows = self.conn.execute(
            "SELECT r.id, r.name, r.status, r.note, r.started_at, r.finished_at, "
            "(SELECT count(*) FROM cells c WHERE c.run_id = r.id), "
            "(SELECT count(*) FROM samples s WHERE s.run_id = r.id) "
            "FROM runs r ORDER BY r.id").fetchall()
        out = []
        for i, n, s, note, st, fi, nc, ns in rows:
            s, note = self._settle(i, s, note, st)
            out.append({"id": i, "name": n, "status": s, "note": note, "started": st, "finished": fi,
                        "cells": nc, "samples": ns})
        return out

    def cells(self, run_id: int) -> list[dict]:
        """The run's cells in plan order, each with its sample count."""
        self._run_row(run_id)
        rows = self.conn.execute(
            "SELECT c.id, c.key, c.position, c.params, c.settings, c.status, c.reason, "
            "(SELECT count(*) FROM samples s WHERE s.cell_id = c.id) "
            "FROM cells c WHERE c.run_id = ? ORDER BY c.position, c.id", (run_id,)).fetchall()
        return [{"id": i, "key": k, "position": pos, "params": self._json(p, "params", run_id, "cell", i),
                 "settings": self._json(st, "settings", run_id, "cell", i),
                 "status": status, "reason": reason, "n_samples": n}
                for i, k, pos, p, st, status, reason, n in rows]

    def samples(self, run_id: int, cell_id: int | None = None) -> list[dict]:
        """The run's samples (or one cell's) in the order measured, with their metrics."""
        self._run_row(run_id)
        where, args = "run_id = ?", [run_id]
        if cell_id is not None:
            where, args = where + " AND cell_id = ?", args + [cell_id]
        rows = self.conn.execute(
            f"SELECT id, cell_id, round, created_at, sample, requested_vs_actual FROM samples "
            f"WHERE {where} ORDER BY id", args).fetchall()
        metrics: dict[int, dict[str, float]] = {}
        for sid, name, value in self.conn.execute(
                f"SELECT sample_id, name, value FROM metrics WHERE {where} ORDER BY sample_id, name", args):
            metrics.setdefault(sid, {})[name] = value
        series = self._series(where, args)
        out = []
        for sid, cid, rnd, at, s, rva in rows:
            sample = self._json(s, "sample", run_id, "sample", sid)
            _join_series(sample, series.get(sid, {}))
            out.append({"id": sid, "cell_id": cid, "round": rnd, "created_at": at, "metrics": metrics.get(sid, {}),
                        "sample": sample,
                        "requested_vs_actual": self._json(rva, "requested_vs_actual", run_id, "sample", sid)})
        return out

    def _series(self, where: str, args: list) -> dict[int, dict[tuple[str, str], list[dict]]]:
        """sample id → (part, source) → rows as {column: value}, in time order."""
        out: dict[int, dict[tuple[str, str], list[dict]]] = {}
        names = ("t_s",) + SERIES_VALUES
        if self.schema_version() < 2:
            return out  # an old database opened read-only: no series were stored then
        for row in self.conn.execute(
                f"SELECT sample_id, part, source, {', '.join(names)} FROM sample_series WHERE {where} "
                f"ORDER BY sample_id, part, source, i", args):
            d = dict(zip(names, row[3:], strict=True))
            d["warmup"] = bool(d["warmup"])
            out.setdefault(row[0], {}).setdefault((row[1], row[2]), []).append(d)
        return out

    def metric_values(self, run_id: int, cell_id: int, metric: str) -> list[float]:
        """One metric's values in a cell, in the order measured."""
        return [v for (v,) in self.conn.execute(
            "SELECT value FROM metrics WHERE run_id = ? AND cell_id = ? AND name = ? ORDER BY sample_id",
            (run_id, cell_id, metric))]

    def cell_rounds(self, run_id: int, metric: str) -> dict[int, list[tuple[int, float]]]:
        """cell id → (round, value of `metric`) per sample, in the order measured: what a sequential
        decision pairs by round."""
        out: dict[int, list[tuple[int, float]]] = {}
        for cid, rnd, value in self.conn.execute(
                "SELECT s.cell_id, s.round, m.value FROM metrics m JOIN samples s ON s.id = m.sample_id "
                "WHERE m.run_id = ? AND m.name = ? ORDER BY s.id", (run_id, metric)):
            out.setdefault(cid, []).append((rnd, value))
        return out

    def cell_metrics(self, run_id: int) -> dict[int, dict[str, list[float]]]:
        """cell id → metric name → values in the order measured, for the whole run in one query."""
        out: dict[int, dict[str, list[float]]] = {}
        for cid, name, value in self.conn.execute(
                "SELECT cell_id, name, value FROM metrics WHERE run_id = ? ORDER BY sample_id", (run_id,)):
            out.setdefault(cid, {}).setdefault(name, []).append(value)
        return out
