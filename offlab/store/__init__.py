"""The results database: runs, their cells, every sample, and each metric in long format.

Two backends behind one layer of SQL (SQLAlchemy Core, docs/results.md says why):

- SQLite, the default: one file in WAL mode, embedded, nothing to run;
- PostgreSQL (`--db postgresql://USER@HOST/DB` or `OFFLAB_DB`), through psycopg 3: one history
  that many runners on many machines write at once.

Every sample is committed in its own transaction the moment it is measured, so a killed run keeps
what it measured and a reader (`offlab results show`) sees it while the run goes on. Tables are meant
to be queried with plain SQL (docs/results.md); JSON columns are TEXT (SQLite's json_extract() reads
them, PostgreSQL's `::jsonb` casts them). The schema is versioned: MIGRATIONS[v] takes a database
from v - 1 to v, on either backend; a database newer than this offlab is refused (exit 3).

The package by job: schema.py (tables, statuses, migrations), backends.py (paths, URLs, engines),
codec.py (timestamps, JSON columns), series.py (per-interval rows), locks.py (a run's one-writer
lock), liveness.py (runs whose process died), merge.py (`results import`); this module is the
Store that writes and reads runs, cells, samples and bisects.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import sqlalchemy as sa

from offlab import __version__
from offlab.errors import BadInput, EnvironmentProblem
from offlab.interrupts import shielded
from offlab.state import FlockFile, owner_alive
from offlab.store import locks, merge
from offlab.store.backends import default_db_path, first_line, is_url, pg_url, safe_url, sqlite_connect, sqlite_engine
from offlab.store.codec import dumps, loads, now_utc
from offlab.store.liveness import settle
from offlab.store.locks import PgRunLock
from offlab.store.schema import (BISECT_STATUSES, CELL_STATUSES, MIGRATIONS, READABLE_VERSIONS, RUN_STATUSES,
                                 SCHEMA_VERSION, SERIES_VALUES, legacy_uid, migrate)
from offlab.store.series import join_series, series_holders, series_rows, split_series

__all__ = ["Store", "PgRunLock", "default_db_path", "is_url", "safe_url", "now_utc", "series_holders", "legacy_uid",
           "SCHEMA_VERSION", "READABLE_VERSIONS", "MIGRATIONS", "RUN_STATUSES", "CELL_STATUSES", "BISECT_STATUSES"]


class Store:
    """One open results database. Safe to share between threads (writes are serialised)."""

    def __init__(self, engine: sa.Engine, path: Path | None, url: str | None = None) -> None:
        self.engine = engine
        self.path = path  # the SQLite file; None for PostgreSQL
        self.url = url  # the PostgreSQL URL as given (password hidden in every message)
        self.where = str(path) if path is not None else safe_url(url or "")
        self.backend = engine.dialect.name  # "sqlite" or "postgresql"
        self._lock = threading.RLock()
        self.read_only = False
        self._raw: sqlite3.Connection | None = None

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path | None = None, *, create: bool = True) -> "Store":
        """Open (and with `create`, make) the database at `path` (a file, or a postgresql:// URL);
        migrate an older schema."""
        if path is None:
            path = default_db_path()
        if is_url(path):
            return cls._open_pg(str(path), create=create)
        path = Path(path).expanduser()
        if not path.exists():
            if not create:
                raise BadInput(f"no offlab database at {path}: `offlab run PLAN.yaml` creates it "
                               f"(or pass --db PATH / set OFFLAB_DB)")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise EnvironmentProblem(f"cannot create {path.parent}: {exc.strerror} "
                                         f"(pass --db PATH or set OFFLAB_DB to a writable place)") from exc
        store = cls(sqlite_engine(path), path)
        try:
            migrate(store)
            raw = store.engine.raw_connection()  # outside any transaction, where SQLite can change it
            try:
                conn = raw.driver_connection
                assert conn is not None  # a pooled connection that is open: it has its driver's
                conn.execute("PRAGMA journal_mode = WAL")
            finally:
                raw.close()
        except (sa.exc.DBAPIError, sqlite3.DatabaseError) as exc:
            store.engine.dispose()
            orig = getattr(exc, "orig", exc)
            if "not a database" in str(orig):
                raise BadInput(f"{path} is not an SQLite database (pass --db PATH to an offlab database)") from None
            if not path.exists():
                raise EnvironmentProblem(f"cannot open database {path}: {orig} "
                                         f"(check permissions, or pass --db PATH / set OFFLAB_DB)") from None
            # A read-only file or file system, or a full disk: reading must still work.
            store = cls._open_read_only(path, orig)
        return store

    @classmethod
    def open_read_only(cls, path: str | Path) -> "Store":
        """An SQLite file opened for reading only (`results import` reads its sources so)."""
        if is_url(path):
            raise BadInput(f"{safe_url(str(path))}: results import reads SQLite files (from hosts that ran "
                           f"offline); the database they go into is --db")
        path = Path(path).expanduser()
        if not path.is_file():
            raise BadInput(f"no SQLite database at {path}")
        return cls._open_read_only(path, None)

    @classmethod
    def _open_read_only(cls, path: Path, why: Exception | None) -> "Store":
        """The database opened for reading only; writes then fail with one line."""
        last: Exception | None = why
        for query in ("mode=ro", "immutable=1"):  # immutable: a WAL database on a read-only file system
            store = cls(sqlite_engine(path, query), path)
            store.read_only = True
            try:
                version = store.schema_version()
                if version not in READABLE_VERSIONS:
                    raise EnvironmentProblem(
                        f"{path} has schema version {version} and is read-only, so this offlab "
                        f"(version {SCHEMA_VERSION}) cannot "
                        + ("read it: upgrade offlab" if version > SCHEMA_VERSION
                           else f"migrate it: make it writable ({why})"))
                store._q("SELECT count(*) FROM runs")
                return store
            except (sa.exc.DBAPIError, sqlite3.DatabaseError) as exc:
                store.engine.dispose()
                last = getattr(exc, "orig", exc)
                if "not a database" in str(last):
                    raise BadInput(f"{path} is not an SQLite database") from None
        raise EnvironmentProblem(f"cannot open database {path}: {last} "
                                 f"(check permissions, or pass --db PATH / set OFFLAB_DB)") from None

    @classmethod
    def _open_pg(cls, text: str, *, create: bool) -> "Store":
        url = pg_url(text)
        engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4,
                                  connect_args={"connect_timeout": 10})
        store = cls(engine, None, text)
        try:
            with engine.connect() as c:
                c.execute(sa.text("SELECT 1"))
        except sa.exc.DBAPIError as exc:
            engine.dispose()
            raise store._env_problem("connecting", exc) from None
        if not create and store.schema_version() == 0:
            engine.dispose()
            raise BadInput(f"no offlab results in {store.where}: `offlab run PLAN.yaml --db {store.where}` "
                           f"creates them")
        try:
            migrate(store)
        except sa.exc.DBAPIError as exc:
            engine.dispose()
            raise store._env_problem("setting up its tables", exc) from None
        return store

    def _env_problem(self, doing: str, exc: BaseException) -> EnvironmentProblem:
        """One line for a database that does not answer or refuses us: which one, what it said."""
        why = first_line(exc)
        if "password" in why or "authentication" in why or "role" in why:
            fix = "check the user and password in the URL (or ~/.pgpass, PGPASSWORD)"
        elif "does not exist" in why and "database" in why:
            fix = "create it (createdb), or name another database in the URL"
        elif "permission denied" in why:
            fix = "grant this user CREATE on the database's public schema, or use another database"
        else:
            fix = "check that the server runs and that the URL's host, port or socket directory is right"
        return EnvironmentProblem(f"database {self.where}: {doing} failed: {why} ({fix})")

    @property
    def conn(self) -> sqlite3.Connection:
        """A plain sqlite3 connection to the same file (for plain SQL beside the API; SQLite only)."""
        if self.path is None:
            raise BadInput(f"{self.where} is PostgreSQL: query it with psql")
        if self._raw is None:
            self._raw = sqlite_connect(self.path, "mode=ro" if self.read_only else None)
        return self._raw

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- SQL ----------------------------------------------------------------------------------

    def _q(self, sql: str, params: dict | None = None) -> list[sa.Row]:
        """Rows of one read (its own short transaction)."""
        try:
            with self.engine.connect() as c:
                return list(c.execute(sa.text(sql), params or {}).all())
        except sa.exc.DBAPIError as exc:
            if self.backend == "sqlite":
                raise
            raise self._env_problem("reading", exc) from None

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        """One write transaction, committed on leaving (SQLite: BEGIN IMMEDIATE, the write lock now).
        Shielded: a signal meanwhile waits for its commit or rollback (raised in the middle, it could skip
        the rollback and leave the write lock held, and the run's own last write — "interrupted" — then
        waited out the busy timeout and failed: database is locked)."""
        with self._lock, shielded():
            try:
                conn = self.engine.connect().execution_options(offlab_write=True)
            except sa.exc.DBAPIError as exc:
                raise self._write_failed(exc) from None
            try:
                with conn.begin():
                    yield conn
            except sa.exc.DBAPIError as exc:
                raise self._write_failed(exc) from None
            finally:
                conn.close()

    def _write_failed(self, exc: sa.exc.DBAPIError) -> EnvironmentProblem:
        """One line for a write the database refused: read-only, full, locked, gone."""
        if self.backend != "sqlite":
            return self._env_problem("writing", exc)
        why = str(getattr(exc, "orig", exc))
        if "readonly" in why or self.read_only:
            fix = "it is read-only here: run as its owner (root), or pass --db PATH to a writable database"
        elif "full" in why:
            fix = f"free space on the file system of {Path(self.where).parent}, or pass --db PATH elsewhere"
        else:
            fix = "pass --db PATH to another database"
        return EnvironmentProblem(f"cannot write to database {self.path}: {why} ({fix}); reading it still works")

    # -- the schema ------------------------------------------------------------------------------

    def schema_version(self) -> int:
        if self.backend == "sqlite":
            return int(self._q("PRAGMA user_version")[0][0])
        try:
            with self.engine.connect() as c:
                if not sa.inspect(c).has_table("meta"):
                    return 0
                row = c.execute(sa.text("SELECT value FROM meta WHERE key = 'schema_version'")).first()
        except sa.exc.DBAPIError as exc:
            raise self._env_problem("reading its schema version", exc) from None
        return int(row[0]) if row else 0

    def meta(self, key: str) -> str | None:
        """A value of the meta table (schema_version, written_by, created_at); None when unreadable."""
        try:
            rows = self._q("SELECT value FROM meta WHERE key = :k", {"k": key})
        except (sa.exc.DBAPIError, EnvironmentProblem):
            return None
        return rows[0][0] if rows else None

    # -- the run lock --------------------------------------------------------------------------

    def run_lock_path(self, run_id: int) -> Path:
        """The run's one-writer flock in SQLite (offlab.experiment.runner.run_lock): beside the database."""
        return locks.run_lock_path(self, run_id)

    def run_lock(self, run_id: int) -> "FlockFile | PgRunLock":
        """The run's one-writer lock, not yet taken (store/locks.py)."""
        return locks.run_lock(self, run_id)

    # -- merging another database -------------------------------------------------------------

    def import_from(self, other: "Store", on_line: Callable[[str], None] = lambda line: None) -> tuple[int, int]:
        """Copy every run and bisect of `other` that this database does not hold yet (by uid), each run in
        one transaction; (imported, skipped) runs (store/merge.py)."""
        return merge.import_from(self, other, on_line)

    # -- writing -----------------------------------------------------------------------------

    def create_run(self, name: str, plan_text: str, plan: dict, seed: int, env: dict,
                   baseline: dict | None, repeat: dict) -> int:
        """A new run, status "running", started now by this offlab version."""
        with self._tx() as c:
            return self._insert_run(c, {
                "name": name, "status": "running", "note": None, "started_at": now_utc(), "finished_at": None,
                "offlab_version": __version__, "seed": seed, "plan_text": plan_text, "plan": dumps(plan),
                "env": dumps(env), "baseline": None if baseline is None else dumps(baseline),
                "repeat": dumps(repeat), "uid": uuid.uuid4().hex})

    @staticmethod
    def _insert_run(c: sa.Connection, row: dict) -> int:
        return int(c.execute(sa.text(
            "INSERT INTO runs(name, status, note, started_at, finished_at, offlab_version, seed, plan_text, plan, env, "
            "baseline, repeat, uid) VALUES (:name, :status, :note, :started_at, :finished_at, :offlab_version, :seed, "
            ":plan_text, :plan, :env, :baseline, :repeat, :uid) RETURNING id"), row).scalar_one())

    def add_cells(self, run_id: int, cells: list[dict]) -> dict[str, int]:
        """Add the run's cells (key, params, settings); key → cell id. Adding the same keys again
        (resume) returns the same ids and leaves those cells as they are."""
        self._run_row(run_id)
        ids: dict[str, int] = {}
        with self._tx() as c:
            existing = {row[0]: (row[1], row[2]) for row in c.execute(
                sa.text("SELECT key, id, params FROM cells WHERE run_id = :r"), {"r": run_id})}
            position = c.execute(sa.text("SELECT coalesce(max(position) + 1, 0) FROM cells WHERE run_id = :r"),
                                 {"r": run_id}).scalar_one()
            for cell in cells:
                key = cell["key"]
                params = dumps(cell.get("params") or {})
                if key in existing:
                    cell_id, stored = existing[key]
                    if json.loads(stored) != json.loads(params):
                        raise BadInput(f"cell {key!r} of run {run_id} exists with params {stored}, "
                                       f"not {params}: resume with the plan the run started with")
                    ids[key] = cell_id
                    continue
                ids[key] = self._insert_cell(c, {"run_id": run_id, "key": key, "position": position, "params": params,
                                                 "settings": dumps(cell.get("settings") or {}), "status": "pending",
                                                 "reason": None})
                position += 1
                existing[key] = (ids[key], params)
        return ids

    @staticmethod
    def _insert_cell(c: sa.Connection, row: dict) -> int:
        return int(c.execute(sa.text(
            "INSERT INTO cells(run_id, key, position, params, settings, status, reason) "
            "VALUES (:run_id, :key, :position, :params, :settings, :status, :reason) RETURNING id"), row).scalar_one())

    def set_cell_status(self, cell_id: int, status: str, reason: str | None = None) -> None:
        if status not in CELL_STATUSES:
            raise ValueError(f"cell status {status!r} is not one of {', '.join(CELL_STATUSES)}")
        with self._tx() as c:
            cur = c.execute(sa.text("UPDATE cells SET status = :s, reason = :r WHERE id = :id"),
                            {"s": status, "r": reason, "id": cell_id})
            if cur.rowcount == 0:
                raise BadInput(f"no cell {cell_id} in {self.where}")

    def add_sample(self, run_id: int, cell_id: int, round_no: int, sample: dict, metrics: dict[str, float],
                   requested_vs_actual: list[dict] | None = None) -> int:
        """Store one measured sample and its metrics, committed before returning; the sample id.
        Per-interval series go to sample_series, one row per interval; the sample keeps their headers."""
        with self._tx() as c:
            row = c.execute(sa.text("SELECT run_id FROM cells WHERE id = :id"), {"id": cell_id}).first()
            if row is None or row[0] != run_id:
                raise BadInput(f"no cell {cell_id} in run {run_id} of {self.where}")
            return self._insert_sample(c, run_id, cell_id, round_no, now_utc(), sample, metrics, requested_vs_actual)

    @staticmethod
    def _insert_sample(c: sa.Connection, run_id: int, cell_id: int, round_no: int, created_at: str, sample: dict,
                       metrics: dict[str, float], requested_vs_actual: list[dict] | None) -> int:
        sample, found = split_series(sample)
        sample_id = int(c.execute(sa.text(
            "INSERT INTO samples(run_id, cell_id, round, created_at, sample, requested_vs_actual) "
            "VALUES (:r, :c, :n, :at, :s, :rva) RETURNING id"),
            {"r": run_id, "c": cell_id, "n": round_no, "at": created_at, "s": dumps(sample),
             "rva": None if requested_vs_actual is None else dumps(requested_vs_actual)}).scalar_one())
        names = ("sample_id", "cell_id", "run_id", "part", "source", "i", "t_s", *SERIES_VALUES)
        rows: dict[tuple, dict] = {}  # the last of two rows with one key wins, as INSERT OR REPLACE did
        for part, s in found:
            for r in series_rows(sample_id, cell_id, run_id, part, s):
                rows[r[3:6]] = dict(zip(names, r, strict=True))
        if rows:
            c.execute(sa.text(f"INSERT INTO sample_series({', '.join(names)}) "
                              f"VALUES ({', '.join(':' + n for n in names)})"), list(rows.values()))
        values = [{"s": sample_id, "c": cell_id, "r": run_id, "n": name, "v": float(v)} for name, v in metrics.items()
                  if v is not None and math.isfinite(float(v))]
        if values:
            c.execute(sa.text("INSERT INTO metrics(sample_id, cell_id, run_id, name, value) "
                              "VALUES (:s, :c, :r, :n, :v)"), values)
        return sample_id

    def set_run_status(self, run_id: int, status: str, note: str | None = None) -> None:
        """Set the run's status; any status but "running" also stamps finished_at (resume clears it)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
        finished = None if status == "running" else now_utc()
        with self._tx() as c:
            cur = c.execute(sa.text("UPDATE runs SET status = :s, note = :n, finished_at = :f WHERE id = :id"),
                            {"s": status, "n": note, "f": finished, "id": run_id})
            if cur.rowcount == 0:
                raise self._no_run(run_id)

    # -- bisects ------------------------------------------------------------------------------

    def create_bisect(self, plan_name: str, plan_text: str, spec: dict, owner: dict) -> int:
        """A new bisect, status "running", owned by this process (`owner`: pid and start time)."""
        with self._tx() as c:
            return int(c.execute(sa.text(
                "INSERT INTO bisects(plan_name, plan_text, spec, status, owner, started_at, offlab_version, uid) "
                "VALUES (:n, :t, :s, 'running', :o, :at, :v, :u) RETURNING id"),
                {"n": plan_name, "t": plan_text, "s": dumps(spec), "o": dumps(owner), "at": now_utc(),
                 "v": __version__, "u": uuid.uuid4().hex}).scalar_one())

    def set_bisect_status(self, bisect_id: int, status: str, note: str | None = None, result: dict | None = None,
                          owner: dict | None = None) -> None:
        """Status (and result, when it has one); any status but "running" stamps finished_at."""
        if status not in BISECT_STATUSES:
            raise ValueError(f"bisect status {status!r} is not one of {', '.join(BISECT_STATUSES)}")
        values = {"s": status, "n": note, "f": None if status == "running" else now_utc(), "id": bisect_id}
        sets = "status = :s, note = :n, finished_at = :f"
        if result is not None:
            sets, values["r"] = sets + ", result = :r", dumps(result)
        if owner is not None:
            sets, values["o"] = sets + ", owner = :o", dumps(owner)
        with self._tx() as c:
            if c.execute(sa.text(f"UPDATE bisects SET {sets} WHERE id = :id"), values).rowcount == 0:
                raise self._no_bisect(bisect_id)

    def put_bisect_step(self, bisect_id: int, position: int, release: str, package_version: str, suite: str,
                        run_id: int | None = None, verdict: str | None = None, detail: dict | None = None) -> None:
        """Create or update the step at `position`: the run measuring it, then its verdict once decided."""
        row = {"b": bisect_id, "p": position, "rel": release, "pv": package_version, "su": suite, "run": run_id,
               "v": verdict, "d": None if detail is None else dumps(detail), "at": now_utc(),
               "dec": now_utc() if verdict is not None else None}
        with self._tx() as c:
            done = c.execute(sa.text(
                "UPDATE bisect_steps SET run_id = coalesce(:run, run_id), verdict = :v, detail = :d, decided_at = :dec "
                "WHERE bisect_id = :b AND position = :p"), row).rowcount
            if not done:
                c.execute(sa.text(
                    "INSERT INTO bisect_steps(bisect_id, position, release, package_version, suite, run_id, verdict, "
                    "detail, created_at, decided_at) VALUES (:b, :p, :rel, :pv, :su, :run, :v, :d, :at, :dec)"), row)

    def _no_bisect(self, bisect_id: int) -> BadInput:
        return BadInput(f"no bisect {bisect_id} in DB {self.where} (offlab results list)")

    def get_bisect(self, bisect_id: int) -> dict:
        """A bisect with its spec, result and steps (in the order they were taken)."""
        if self.schema_version() < 4:
            raise self._no_bisect(bisect_id)
        rows = self._q("SELECT * FROM bisects WHERE id = :id", {"id": bisect_id})
        if not rows:
            raise self._no_bisect(bisect_id)
        r = dict(rows[0]._mapping)
        where = f"bisect {bisect_id}"
        status, note = r["status"], r["note"]
        owner = loads(r["owner"], f"column owner of {where}")
        if status == "running" and not owner_alive(owner):
            status, note = "interrupted", f"its process ended; resume with `offlab bisect --resume {bisect_id}`"
        steps = [{"position": s["position"], "release": s["release"], "package_version": s["package_version"],
                  "suite": s["suite"], "run_id": s["run_id"], "verdict": s["verdict"],
                  "detail": loads(s["detail"], f"column detail of a step of {where}") if s["detail"] else None,
                  "created_at": s["created_at"], "decided_at": s["decided_at"]}
                 for s in (dict(x._mapping) for x in self._q(
                     "SELECT * FROM bisect_steps WHERE bisect_id = :b ORDER BY id", {"b": bisect_id}))]
        return {"id": r["id"], "plan_name": r["plan_name"], "plan_text": r["plan_text"],
                "spec": loads(r["spec"], f"column spec of {where}"), "status": status, "note": note,
                "result": loads(r["result"], f"column result of {where}") if r["result"] else None,
                "started_at": r["started_at"], "finished_at": r["finished_at"], "uid": r["uid"], "steps": steps}

    def unfinished_bisect(self, plan_text: str, question: dict) -> int | None:
        """The newest bisect of this plan text that asked `question` (its spec without the release list)
        and has not finished (running, interrupted or failed), or None."""
        if self.schema_version() < 4:
            return None
        for bid, spec in self._q("SELECT id, spec FROM bisects WHERE plan_text = :t AND status != 'done' "
                                 "ORDER BY id DESC", {"t": plan_text}):
            asked = loads(spec, f"column spec of bisect {bid}")
            if {k: v for k, v in asked.items() if k != "releases"} == question:
                return int(bid)
        return None

    def bisect_of_run(self, run_id: int) -> dict | None:
        """The bisect one of whose steps is this run, or None."""
        if self.schema_version() < 4:
            return None
        rows = self._q("SELECT bisect_id FROM bisect_steps WHERE run_id = :r", {"r": run_id})
        return self.get_bisect(rows[0][0]) if rows else None

    def list_bisects(self) -> list[dict]:
        """Every bisect, oldest first: id, plan, good and bad, status, steps measured, the first changed release."""
        if self.schema_version() < 4:
            return []
        out = []
        for i in [r[0] for r in self._q("SELECT id FROM bisects ORDER BY id")]:
            b = self.get_bisect(i)
            out.append({"id": i, "plan": b["plan_name"], "good": b["spec"].get("good"), "bad": b["spec"].get("bad"),
                        "status": b["status"], "note": b["note"], "started": b["started_at"],
                        "steps": sum(1 for s in b["steps"] if s["run_id"] is not None),
                        "step_runs": [{"run_id": s["run_id"], "release": s["release"]} for s in b["steps"]
                                      if s["run_id"] is not None],
                        "first": (b["result"] or {}).get("first")})
        return out

    # -- reading -----------------------------------------------------------------------------

    def _json(self, text: str | None, column: str, run_id: int, table: str = "run", row: int | None = None) -> Any:
        where = f"column {column} of {table} {row if row is not None else run_id}" + \
            (f" (run {run_id})" if table != "run" else "") + f" in {self.where}"
        return loads(text, where)

    def _no_run(self, run_id: int) -> BadInput:
        return BadInput(f"no run {run_id} in DB {self.where} (offlab results list)")

    def _run_row(self, run_id: int) -> dict:
        rows = self._q("SELECT * FROM runs WHERE id = :id", {"id": run_id})
        if not rows:
            raise self._no_run(run_id)
        return dict(rows[0]._mapping)

    def get_run(self, run_id: int) -> dict:
        """Everything about a run: plan (text and parsed), env, baseline, repeat, seed, status, times, uid."""
        r = self._run_row(run_id)
        status, note = settle(self, run_id, r["status"], r["note"], r["started_at"])
        return {
            "id": r["id"], "name": r["name"], "status": status, "note": note,
            "started_at": r["started_at"], "finished_at": r["finished_at"],
            "offlab_version": r["offlab_version"], "seed": r["seed"],
            "plan_text": r["plan_text"], "plan": self._json(r["plan"], "plan", run_id),
            "env": self._json(r["env"], "env", run_id), "baseline": self._json(r["baseline"], "baseline", run_id),
            "repeat": self._json(r["repeat"], "repeat", run_id),
            "uid": r.get("uid") or legacy_uid(r["name"], r["started_at"], r["seed"], r["plan_text"]),
        }

    def list_runs(self) -> list[dict]:
        """Every run, oldest first, with counts of cells and samples."""
        rows = self._q(
            "SELECT r.id, r.name, r.status, r.note, r.started_at, r.finished_at, "
            "(SELECT count(*) FROM cells c WHERE c.run_id = r.id), "
            "(SELECT count(*) FROM samples s WHERE s.run_id = r.id) "
            "FROM runs r ORDER BY r.id")
        out = []
        for i, n, s, note, st, fi, nc, ns in rows:
            s, note = settle(self, i, s, note, st)
            out.append({"id": i, "name": n, "status": s, "note": note, "started": st, "finished": fi,
                        "cells": nc, "samples": ns})
        return out

    def cells(self, run_id: int) -> list[dict]:
        """The run's cells in plan order, each with its sample count."""
        self._run_row(run_id)
        rows = self._q(
            "SELECT c.id, c.key, c.position, c.params, c.settings, c.status, c.reason, "
            "(SELECT count(*) FROM samples s WHERE s.cell_id = c.id) "
            "FROM cells c WHERE c.run_id = :r ORDER BY c.position, c.id", {"r": run_id})
        return [{"id": i, "key": k, "position": pos, "params": self._json(p, "params", run_id, "cell", i),
                 "settings": self._json(st, "settings", run_id, "cell", i),
                 "status": status, "reason": reason, "n_samples": n}
                for i, k, pos, p, st, status, reason, n in rows]

    def samples(self, run_id: int, cell_id: int | None = None) -> list[dict]:
        """The run's samples (or one cell's) in the order measured, with their metrics."""
        self._run_row(run_id)
        where, args = "run_id = :r", {"r": run_id}
        if cell_id is not None:
            where, args = where + " AND cell_id = :c", {**args, "c": cell_id}
        rows = self._q(f"SELECT id, cell_id, round, created_at, sample, requested_vs_actual FROM samples "
                       f"WHERE {where} ORDER BY id", args)
        metrics: dict[int, dict[str, float]] = {}
        for sid, name, value in self._q(f"SELECT sample_id, name, value FROM metrics WHERE {where} "
                                        f"ORDER BY sample_id, name", args):
            metrics.setdefault(sid, {})[name] = value
        series = self._series(where, args)
        out = []
        for sid, cid, rnd, at, s, rva in rows:
            sample = self._json(s, "sample", run_id, "sample", sid)
            join_series(sample, series.get(sid, {}))
            out.append({"id": sid, "cell_id": cid, "round": rnd, "created_at": at, "metrics": metrics.get(sid, {}),
                        "sample": sample,
                        "requested_vs_actual": self._json(rva, "requested_vs_actual", run_id, "sample", sid)})
        return out

    def _series(self, where: str, args: dict) -> dict[int, dict[tuple[str, str], list[dict]]]:
        """sample id → (part, source) → rows as {column: value}, in time order."""
        out: dict[int, dict[tuple[str, str], list[dict]]] = {}
        names = ("t_s",) + SERIES_VALUES
        if self.schema_version() < 2:
            return out  # an old database opened read-only: no series were stored then
        for row in self._q(f"SELECT sample_id, part, source, {', '.join(names)} FROM sample_series WHERE {where} "
                           f"ORDER BY sample_id, part, source, i", args):
            d = dict(zip(names, row[3:], strict=True))
            d["warmup"] = bool(d["warmup"])
            out.setdefault(row[0], {}).setdefault((row[1], row[2]), []).append(d)
        return out

    def metric_values(self, run_id: int, cell_id: int, metric: str) -> list[float]:
        """One metric's values in a cell, in the order measured."""
        return [v for (v,) in self._q(
            "SELECT value FROM metrics WHERE run_id = :r AND cell_id = :c AND name = :n ORDER BY sample_id",
            {"r": run_id, "c": cell_id, "n": metric})]

    def cell_rounds(self, run_id: int, metric: str) -> dict[int, list[tuple[int, float]]]:
        """cell id → (round, value of `metric`) per sample, in the order measured: what a sequential
        decision pairs by round."""
        out: dict[int, list[tuple[int, float]]] = {}
        for cid, rnd, value in self._q(
                "SELECT s.cell_id, s.round, m.value FROM metrics m JOIN samples s ON s.id = m.sample_id "
                "WHERE m.run_id = :r AND m.name = :n ORDER BY s.id", {"r": run_id, "n": metric}):
            out.setdefault(cid, []).append((rnd, value))
        return out

    def cell_metrics(self, run_id: int) -> dict[int, dict[str, list[float]]]:
        """cell id → metric name → values in the order measured, for the whole run in one query."""
        out: dict[int, dict[str, list[float]]] = {}
        for cid, name, value in self._q(
                "SELECT cell_id, name, value FROM metrics WHERE run_id = :r ORDER BY sample_id", {"r": run_id}):
            out.setdefault(cid, {}).setdefault(name, []).append(value)
        return out
