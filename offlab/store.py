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
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import sqlalchemy as sa

from offlab import __version__
from offlab.errors import BadInput, EnvironmentProblem
from offlab.state import owner_alive

SCHEMA_VERSION = 4

# Versions this offlab reads without migrating (a read-only file): 1 lacks sample_series, 2 runs.uid,
# 3 the bisect tables.
READABLE_VERSIONS = (1, 2, 3, SCHEMA_VERSION)

# A "running" run whose lock names no live process, or that has no lock this long after it started
# (the runner takes the lock right after creating the run), died without saying so (kill -9).
NO_LOCK_GRACE_S = 60.0

RUN_STATUSES = ("running", "done", "interrupted", "failed", "budget_exhausted")
BISECT_STATUSES = ("running", "done", "interrupted", "failed")
CELL_STATUSES = ("pending", "running", "done", "confidence_not_reached", "skipped", "failed", "interrupted")

# PostgreSQL: the advisory-lock class of offlab's locks (the run lock: (class, run id); migrating: (class, 0)).
PG_LOCK_CLASS = 0x0FF1AB

# ---- the schema, as SQLAlchemy tables (each dialect writes its own DDL: INTEGER PRIMARY KEY for
# SQLite, SERIAL for PostgreSQL; Double is REAL there and double precision here) ----------------
_ddl = sa.MetaData()
_ID = lambda: sa.Column("id", sa.Integer, primary_key=True)  # noqa: E731
_FK = lambda name, table: sa.Column(name, sa.Integer, sa.ForeignKey(f"{table}.id", ondelete="CASCADE"),  # noqa: E731
                                    nullable=False)
META = sa.Table("meta", _ddl, sa.Column("key", sa.Text, primary_key=True), sa.Column("value", sa.Text, nullable=False))
RUNS = sa.Table(
    "runs", _ddl, _ID(),
    sa.Column("name", sa.Text, nullable=False), sa.Column("status", sa.Text, nullable=False),
    sa.Column("note", sa.Text), sa.Column("started_at", sa.Text, nullable=False), sa.Column("finished_at", sa.Text),
    sa.Column("offlab_version", sa.Text, nullable=False), sa.Column("seed", sa.BigInteger),
    sa.Column("plan_text", sa.Text, nullable=False), sa.Column("plan", sa.Text, nullable=False),
    sa.Column("env", sa.Text, nullable=False), sa.Column("baseline", sa.Text),
    sa.Column("repeat", sa.Text, nullable=False))
CELLS = sa.Table(
    "cells", _ddl, _ID(), _FK("run_id", "runs"),
    sa.Column("key", sa.Text, nullable=False), sa.Column("position", sa.Integer, nullable=False),
    sa.Column("params", sa.Text, nullable=False), sa.Column("settings", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="pending"), sa.Column("reason", sa.Text),
    sa.UniqueConstraint("run_id", "key"))
SAMPLES = sa.Table(
    "samples", _ddl, _ID(), _FK("run_id", "runs"), _FK("cell_id", "cells"),
    sa.Column("round", sa.Integer, nullable=False), sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("sample", sa.Text, nullable=False), sa.Column("requested_vs_actual", sa.Text))
METRICS = sa.Table(
    "metrics", _ddl,
    sa.Column("sample_id", sa.Integer, sa.ForeignKey("samples.id", ondelete="CASCADE"), nullable=False),
    _FK("cell_id", "cells"), _FK("run_id", "runs"),
    sa.Column("name", sa.Text, nullable=False), sa.Column("value", sa.Double, nullable=False),
    sa.PrimaryKeyConstraint("sample_id", "name"))
# The figures a series row can hold: sample_series's columns after t_s, in order (offlab.traffic.series).
SERIES_VALUES = ("dur_s", "warmup", "bytes", "bps", "datagrams", "pps", "lost", "reordered", "retransmits",
                 "transactions", "tps", "rtt_p50_us", "rtt_p99_us", "rtt_max_us")
_SERIES_TYPES = {"dur_s": sa.Double, "warmup": sa.Integer, "bytes": sa.BigInteger, "bps": sa.Double,
                 "datagrams": sa.BigInteger, "pps": sa.Double, "lost": sa.BigInteger, "reordered": sa.BigInteger,
                 "retransmits": sa.BigInteger, "transactions": sa.BigInteger, "tps": sa.Double,
                 "rtt_p50_us": sa.Double, "rtt_p99_us": sa.Double, "rtt_max_us": sa.Double}
SAMPLE_SERIES = sa.Table(
    "sample_series", _ddl,
    sa.Column("sample_id", sa.Integer, sa.ForeignKey("samples.id", ondelete="CASCADE"), nullable=False),
    _FK("cell_id", "cells"), _FK("run_id", "runs"),
    sa.Column("part", sa.Text, nullable=False), sa.Column("source", sa.Text, nullable=False),
    sa.Column("i", sa.Integer, nullable=False), sa.Column("t_s", sa.Double, nullable=False),
    *[sa.Column(n, t, nullable=n != "warmup", server_default="0" if n == "warmup" else None)
      for n, t in _SERIES_TYPES.items()],
    sa.PrimaryKeyConstraint("sample_id", "part", "source", "i"), sqlite_with_rowid=False)

# A bisect (offlab.experiment.bisect): what it was asked, the releases it may measure, and where it
# ended; one step per release it looked at, each pointing to the run whose samples decided it.
BISECTS = sa.Table(
    "bisects", _ddl, _ID(),
    sa.Column("plan_name", sa.Text, nullable=False), sa.Column("plan_text", sa.Text, nullable=False),
    sa.Column("spec", sa.Text, nullable=False), sa.Column("status", sa.Text, nullable=False),
    sa.Column("note", sa.Text), sa.Column("result", sa.Text), sa.Column("owner", sa.Text),
    sa.Column("started_at", sa.Text, nullable=False), sa.Column("finished_at", sa.Text),
    sa.Column("offlab_version", sa.Text, nullable=False), sa.Column("uid", sa.Text, nullable=False, unique=True))
BISECT_STEPS = sa.Table(
    "bisect_steps", _ddl, _ID(), _FK("bisect_id", "bisects"),
    sa.Column("position", sa.Integer, nullable=False),  # the release's index in the bisect's list
    sa.Column("release", sa.Text, nullable=False), sa.Column("package_version", sa.Text, nullable=False),
    sa.Column("suite", sa.Text, nullable=False),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="SET NULL")),
    sa.Column("verdict", sa.Text), sa.Column("detail", sa.Text),
    sa.Column("created_at", sa.Text, nullable=False), sa.Column("decided_at", sa.Text),
    sa.UniqueConstraint("bisect_id", "position"))

# MIGRATIONS[v] takes a database from version v - 1 to v: each step is portable SQL text, a table
# (created in the dialect's DDL), or a function of the open transaction. Never edit a released step: add one.
MIGRATIONS: dict[int, list] = {
    1: [META, RUNS, CELLS, SAMPLES, METRICS,
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
            JOIN runs r ON r.id = m.run_id"""],
    # Per-interval rows of each sample (issue #12): one row per interval, a column per figure.
    2: [SAMPLE_SERIES, "CREATE INDEX sample_series_cell ON sample_series(cell_id)"],
    # A run's identity across databases (issue #28: `results import` merges without duplicates).
    3: ["ALTER TABLE runs ADD COLUMN uid TEXT",
        lambda c: _backfill_uids(c),
        "CREATE UNIQUE INDEX runs_uid ON runs(uid)"],
    # `offlab bisect` (issue #33): bisects and their steps.
    4: [BISECTS, BISECT_STEPS],
}


def legacy_uid(name: str, started_at: str, seed: int | None, plan_text: str) -> str:
    """The identity of a run stored before runs had one: the same on every copy of that database."""
    return "v2-" + hashlib.sha256(json.dumps([name, started_at, seed, plan_text]).encode()).hexdigest()[:32]


def _backfill_uids(c: sa.Connection) -> None:
    rows = c.execute(sa.text("SELECT id, name, started_at, seed, plan_text FROM runs WHERE uid IS NULL")).all()
    if rows:
        c.execute(sa.text("UPDATE runs SET uid = :uid WHERE id = :id"),
                  [{"id": r[0], "uid": legacy_uid(r[1], r[2], r[3], r[4])} for r in rows])


_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<slashes>/*)(?P<rest>.*)$", re.S)


def is_url(db: object) -> bool:
    """A database given as a URL (scheme://...), not a file path."""
    m = _URL_RE.match(str(db))
    return bool(m and m["slashes"] and len(m["scheme"]) > 1)


def _pg_url(text: str) -> sa.URL:
    """A postgresql:// URL for SQLAlchemy with psycopg 3; BadInput naming what is wrong with it."""
    m = _URL_RE.match(text)
    if m is None:  # callers ask is_url first
        raise BadInput(f"--db {safe_url(text)}: not a URL (postgresql://USER@HOST/DB)")
    scheme = m["scheme"].lower()
    if scheme not in ("postgresql", "postgres", "postgresql+psycopg"):
        raise BadInput(f"--db {safe_url(text)}: offlab stores results in an SQLite file (a path) or in "
                       f"PostgreSQL (postgresql://USER@HOST/DB), not {scheme}")
    # A URL that went through a path type lost one of its slashes (postgresql:/x): put it back.
    text = f"postgresql+psycopg://{m['rest']}"
    try:
        url = sa.make_url(text)
    except sa.exc.ArgumentError as exc:
        raise BadInput(f"--db {safe_url(text)}: not a valid URL ({exc}); e.g. postgresql://offlab@db.lab/offlab "
                       f"or postgresql://postgres@/offlab?host=/run/postgresql") from None
    if not url.database:
        raise BadInput(f"--db {safe_url(text)}: names no database; e.g. postgresql://offlab@db.lab/offlab")
    return url


def safe_url(text: str) -> str:
    """The URL as it may be printed: without its password."""
    return re.sub(r"(://[^:/@?]*):[^@/?]*@", r"\1:***@", str(text)).replace("postgresql+psycopg://", "postgresql://")



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


def default_db_path() -> Path | str:
    """$OFFLAB_DB if set (a path, or a postgresql:// URL as given); else /var/lib/offlab/offlab.db as
    root; else ~/.local/share/offlab/offlab.db."""
    env = os.environ.get("OFFLAB_DB")
    if env:
        return env if is_url(env) else Path(env).expanduser()
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
        raise BadInput(f"{where} is damaged (not valid JSON: {exc}): inspect it with `sqlite3` or `psql`, or "
                       f"pass --db to another database") from None




def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [l.strip() for l in str(orig).strip().splitlines() if l.strip()]
    return lines[0] if lines else type(orig).__name__


class PgRunLock:
    """The one-writer lock of a run in PostgreSQL: a session advisory lock (PG_LOCK_CLASS, run id) held
    on a connection of its own; the server drops it when that connection ends, however its process
    died. The holder is named by the connection's application_name, for messages."""

    def __init__(self, store: "Store", run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self.conn: sa.Connection | None = None

    def acquire(self, info: dict, wait: float = 0.0) -> dict | None:
        conn = self.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:c, :r)"),
                               {"c": PG_LOCK_CLASS, "r": self.run_id}).scalar()
            if not got:
                holder = self.store._pg_lock_holder(conn, self.run_id)
                conn.close()
                return holder or {"pid": "?"}
            name = f"offlab run {self.run_id} pid {info.get('pid')} on {os.uname().nodename}"[:63]
            conn.execute(sa.text("SELECT set_config('application_name', :n, false)"), {"n": name})
        except sa.exc.DBAPIError as exc:
            conn.close()
            raise self.store._env_problem("taking the run lock", exc) from None
        self.conn = conn
        return None

    def write(self, info: dict) -> None:
        pass  # the holder is named by the connection itself

    def release(self, keep: dict | None = None) -> None:
        if self.conn is not None:
            try:
                self.conn.execute(sa.text("SELECT pg_advisory_unlock(:c, :r)"), {"c": PG_LOCK_CLASS, "r": self.run_id})
            except sa.exc.DBAPIError:
                pass  # the connection is gone: so is the lock
            finally:
                self.conn.close()
                self.conn = None


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
        store = cls(_sqlite_engine(path), path)
        try:
            store._migrate()
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
            store = cls(_sqlite_engine(path, query), path)
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
        url = _pg_url(text)
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
            store._migrate()
        except sa.exc.DBAPIError as exc:
            engine.dispose()
            raise store._env_problem("setting up its tables", exc) from None
        return store

    def _env_problem(self, doing: str, exc: BaseException) -> EnvironmentProblem:
        """One line for a database that does not answer or refuses us: which one, what it said."""
        why = _first_line(exc)
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
            self._raw = _sqlite_connect(self.path, "mode=ro" if self.read_only else None)
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
        """One write transaction, committed on leaving (SQLite: BEGIN IMMEDIATE, the write lock now)."""
        with self._lock:
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

    def _meta(self, key: str) -> str | None:
        try:
            rows = self._q("SELECT value FROM meta WHERE key = :k", {"k": key})
        except (sa.exc.DBAPIError, EnvironmentProblem):
            return None
        return rows[0][0] if rows else None

    def _too_new(self, version: int) -> EnvironmentProblem:
        made_by = self._meta("written_by") or "a newer offlab"
        return EnvironmentProblem(
            f"{self.where} has schema version {version} (written by offlab {made_by}); this offlab "
            f"{__version__} knows up to version {SCHEMA_VERSION}: upgrade offlab, or pass --db to another database")

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise self._too_new(version)
        if version == 0:
            with self.engine.connect() as c:
                foreign = [t for t in sa.inspect(c).get_table_names() if not t.startswith("sqlite_")]
            if foreign:
                raise BadInput(f"{self.where} is a database but not offlab's (it has tables "
                               f"{', '.join(sorted(foreign)[:5])}): pass --db to another one")
        if version == SCHEMA_VERSION:
            return
        if self.path is not None and version > 0 and not os.access(self.path, os.W_OK):
            # Another user's file or a read-only file system: Store.open reads it as it is, unmigrated.
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._tx() as c:
            # Inside the write lock (SQLite's, or an advisory lock): another process may have migrated meanwhile.
            if self.backend == "postgresql":
                c.execute(sa.text("SELECT pg_advisory_xact_lock(:c, 0)"), {"c": PG_LOCK_CLASS})
                version = (int(r[0]) if (r := c.execute(sa.text("SELECT value FROM meta WHERE key = 'schema_version'"))
                                         .first()) else 0) if sa.inspect(c).has_table("meta") else 0
            else:
                version = int(c.exec_driver_sql("PRAGMA user_version").scalar() or 0)
            if version > SCHEMA_VERSION:
                raise self._too_new(version)
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS[v]:
                    if isinstance(step, str):
                        c.execute(sa.text(step))
                    elif isinstance(step, sa.Table):
                        step.create(c)
                    else:
                        step(c)
                if self.backend == "sqlite":
                    c.exec_driver_sql(f"PRAGMA user_version = {v}")
            if version < SCHEMA_VERSION:
                put = ("INSERT INTO meta(key, value) VALUES (:k, :v) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
                c.execute(sa.text(put), [{"k": "schema_version", "v": str(SCHEMA_VERSION)},
                                         {"k": "written_by", "v": __version__}])
                if version == 0:
                    c.execute(sa.text(put), {"k": "created_at", "v": now_utc()})

    # -- writing -----------------------------------------------------------------------------

    def create_run(self, name: str, plan_text: str, plan: dict, seed: int, env: dict,
                   baseline: dict | None, repeat: dict) -> int:
        """A new run, status "running", started now by this offlab version."""
        with self._tx() as c:
            return self._insert_run(c, {
                "name": name, "status": "running", "note": None, "started_at": now_utc(), "finished_at": None,
                "offlab_version": __version__, "seed": seed, "plan_text": plan_text, "plan": _dumps(plan),
                "env": _dumps(env), "baseline": None if baseline is None else _dumps(baseline),
                "repeat": _dumps(repeat), "uid": uuid.uuid4().hex})

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
                params = _dumps(cell.get("params") or {})
                if key in existing:
                    cell_id, stored = existing[key]
                    if json.loads(stored) != json.loads(params):
                        raise BadInput(f"cell {key!r} of run {run_id} exists with params {stored}, "
                                       f"not {params}: resume with the plan the run started with")
                    ids[key] = cell_id
                    continue
                ids[key] = self._insert_cell(c, {"run_id": run_id, "key": key, "position": position, "params": params,
                                                 "settings": _dumps(cell.get("settings") or {}), "status": "pending",
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
        sample, found = _split_series(sample)
        sample_id = int(c.execute(sa.text(
            "INSERT INTO samples(run_id, cell_id, round, created_at, sample, requested_vs_actual) "
            "VALUES (:r, :c, :n, :at, :s, :rva) RETURNING id"),
            {"r": run_id, "c": cell_id, "n": round_no, "at": created_at, "s": _dumps(sample),
             "rva": None if requested_vs_actual is None else _dumps(requested_vs_actual)}).scalar_one())
        names = ("sample_id", "cell_id", "run_id", "part", "source", "i", "t_s", *SERIES_VALUES)
        rows: dict[tuple, dict] = {}  # the last of two rows with one key wins, as INSERT OR REPLACE did
        for part, s in found:
            for r in _series_rows(sample_id, cell_id, run_id, part, s):
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
                {"n": plan_name, "t": plan_text, "s": _dumps(spec), "o": _dumps(owner), "at": now_utc(),
                 "v": __version__, "u": uuid.uuid4().hex}).scalar_one())

    def set_bisect_status(self, bisect_id: int, status: str, note: str | None = None, result: dict | None = None,
                          owner: dict | None = None) -> None:
        """Status (and result, when it has one); any status but "running" stamps finished_at."""
        if status not in BISECT_STATUSES:
            raise ValueError(f"bisect status {status!r} is not one of {', '.join(BISECT_STATUSES)}")
        values = {"s": status, "n": note, "f": None if status == "running" else now_utc(), "id": bisect_id}
        sets = "status = :s, note = :n, finished_at = :f"
        if result is not None:
            sets, values["r"] = sets + ", result = :r", _dumps(result)
        if owner is not None:
            sets, values["o"] = sets + ", owner = :o", _dumps(owner)
        with self._tx() as c:
            if c.execute(sa.text(f"UPDATE bisects SET {sets} WHERE id = :id"), values).rowcount == 0:
                raise self._no_bisect(bisect_id)

    def put_bisect_step(self, bisect_id: int, position: int, release: str, package_version: str, suite: str,
                        run_id: int | None = None, verdict: str | None = None, detail: dict | None = None) -> None:
        """Create or update the step at `position`: the run measuring it, then its verdict once decided."""
        row = {"b": bisect_id, "p": position, "rel": release, "pv": package_version, "su": suite, "run": run_id,
               "v": verdict, "d": None if detail is None else _dumps(detail), "at": now_utc(),
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
        owner = _loads(r["owner"], f"column owner of {where}")
        if status == "running" and not owner_alive(owner):
            status, note = "interrupted", f"its process ended; resume with `offlab bisect --resume {bisect_id}`"
        steps = [{"position": s["position"], "release": s["release"], "package_version": s["package_version"],
                  "suite": s["suite"], "run_id": s["run_id"], "verdict": s["verdict"],
                  "detail": _loads(s["detail"], f"column detail of a step of {where}") if s["detail"] else None,
                  "created_at": s["created_at"], "decided_at": s["decided_at"]}
                 for s in (dict(x._mapping) for x in self._q(
                     "SELECT * FROM bisect_steps WHERE bisect_id = :b ORDER BY id", {"b": bisect_id}))]
        return {"id": r["id"], "plan_name": r["plan_name"], "plan_text": r["plan_text"],
                "spec": _loads(r["spec"], f"column spec of {where}"), "status": status, "note": note,
                "result": _loads(r["result"], f"column result of {where}") if r["result"] else None,
                "started_at": r["started_at"], "finished_at": r["finished_at"], "uid": r["uid"], "steps": steps}

    def unfinished_bisect(self, plan_text: str, question: dict) -> int | None:
        """The newest bisect of this plan text that asked `question` (its spec without the release list)
        and has not finished (running, interrupted or failed), or None."""
        if self.schema_version() < 4:
            return None
        for bid, spec in self._q("SELECT id, spec FROM bisects WHERE plan_text = :t AND status != 'done' "
                                 "ORDER BY id DESC", {"t": plan_text}):
            asked = _loads(spec, f"column spec of bisect {bid}")
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

    # -- the run lock --------------------------------------------------------------------------

    def run_lock_path(self, run_id: int) -> Path:
        """The run's one-writer flock in SQLite (offlab.experiment.runner.run_lock): beside the database."""
        return Path(f"{self.path}.locks") / f"run-{run_id}.lock"

    def run_lock(self, run_id: int):
        """The run's one-writer lock, not yet taken: an flock beside an SQLite file, an advisory lock in
        PostgreSQL; each released by the kernel or the server when its holder dies."""
        from offlab.state import FlockFile

        return FlockFile(self.run_lock_path(run_id)) if self.backend == "sqlite" else PgRunLock(self, run_id)

    def _pg_lock_holder(self, c: sa.Connection, run_id: int) -> dict | None:
        """Who holds run `run_id`'s advisory lock in this database (from its connection's name); None: nobody."""
        row = c.execute(sa.text(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :c AND l.objid = :r AND l.objsubid = 2 "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
            {"c": PG_LOCK_CLASS, "r": run_id}).first()
        if row is None:
            return None
        m = re.search(r"pid (\d+) on (\S+)", row[0] or "")
        return {"pid": int(m[1]) if m else "?", "host": m[2] if m else "?"}

    # -- reading -----------------------------------------------------------------------------

    def _json(self, text: str | None, column: str, run_id: int, table: str = "run", row: int | None = None) -> Any:
        where = f"column {column} of {table} {row if row is not None else run_id}" + \
            (f" (run {run_id})" if table != "run" else "") + f" in {self.where}"
        return _loads(text, where)

    def _no_run(self, run_id: int) -> BadInput:
        return BadInput(f"no run {run_id} in DB {self.where} (offlab results list)")

    def _run_row(self, run_id: int) -> dict:
        rows = self._q("SELECT * FROM runs WHERE id = :id", {"id": run_id})
        if not rows:
            raise self._no_run(run_id)
        return dict(rows[0]._mapping)

    def _dead_note(self, run_id: int, started_at: str) -> str | None:
        """Why a run stored as "running" is not running any more; None when its process is alive."""
        if self.backend == "sqlite":
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
                return f"interrupted: {who} ended without finishing the run; resume with `offlab run --resume {run_id}`"
        else:
            try:
                with self.engine.connect() as c:
                    if self._pg_lock_holder(c, run_id) is not None:
                        return None  # its runner's connection holds the lock, on whichever machine
            except sa.exc.DBAPIError:
                return None
        try:
            age = (datetime.now(timezone.utc) - datetime.strptime(started_at, "%Y-%m-%dT%H:%M:%S.%fZ")
                   .replace(tzinfo=timezone.utc)).total_seconds()
        except ValueError:
            return None
        if age < NO_LOCK_GRACE_S:
            return None  # just created: its runner is about to take the lock
        return f"interrupted: its process ended without finishing the run; resume with `offlab run --resume {run_id}`"

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
                    c.execute(sa.text("UPDATE runs SET status = 'interrupted', note = :n "
                                      "WHERE id = :id AND status = 'running'"), {"n": dead, "id": run_id})
            except EnvironmentProblem:
                pass  # a read-only or full database: still shown as interrupted
        return "interrupted", dead

    def get_run(self, run_id: int) -> dict:
        """Everything about a run: plan (text and parsed), env, baseline, repeat, seed, status, times, uid."""
        r = self._run_row(run_id)
        status, note = self._settle(run_id, r["status"], r["note"], r["started_at"])
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
            s, note = self._settle(i, s, note, st)
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
            _join_series(sample, series.get(sid, {}))
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
        for cid, rnd, value in self.conn.execute(
                "SELECT s.cell_id, s.round, m.value FROM metrics m JOIN samples s ON s.id = m.sample_id "
                "WHERE m.run_id = ? AND m.name = ? ORDER BY s.id", (run_id, metric)):
            out.setdefault(cid, []).append((rnd, value))
        return out

    def cell_metrics(self, run_id: int) -> dict[int, dict[str, list[float]]]:
        """cell id → metric name → values in the order measured, for the whole run in one query."""
        out: dict[int, dict[str, list[float]]] = {}
        for cid, name, value in self._q(
                "SELECT cell_id, name, value FROM metrics WHERE run_id = :r ORDER BY sample_id", {"r": run_id}):
            out.setdefault(cid, {}).setdefault(name, []).append(value)
        return out

    # -- merging another database -------------------------------------------------------------

    def import_from(self, other: "Store", on_line: Callable[[str], None] = lambda line: None) -> tuple[int, int]:
        """Copy every run of `other` that this database does not hold yet (by its uid), with its cells,
        samples, metrics and series, each run in one transaction; (imported, skipped)."""
        imported = skipped = 0
        for listed in other.list_runs():
            run = other.get_run(listed["id"])
            have = self._q("SELECT id FROM runs WHERE uid = :u", {"u": run["uid"]})
            if have:
                skipped += 1
                on_line(f"run {run['id']} ({run['name']}): already here as run {have[0][0]}")
                continue
            cells = other.cells(run["id"])
            samples = other.samples(run["id"])
            try:
                with self._tx() as c:
                    new = self._insert_run(c, {
                        "name": run["name"], "status": run["status"], "note": run["note"],
                        "started_at": run["started_at"], "finished_at": run["finished_at"],
                        "offlab_version": run["offlab_version"], "seed": run["seed"], "plan_text": run["plan_text"],
                        "plan": _dumps(run["plan"]), "env": _dumps(run["env"]),
                        "baseline": None if run["baseline"] is None else _dumps(run["baseline"]),
                        "repeat": _dumps(run["repeat"]), "uid": run["uid"]})
                    ids = {cell["id"]: self._insert_cell(c, {
                        "run_id": new, "key": cell["key"], "position": cell["position"],
                        "params": _dumps(cell["params"]), "settings": _dumps(cell["settings"]),
                        "status": cell["status"], "reason": cell["reason"]}) for cell in cells}
                    for smp in samples:
                        self._insert_sample(c, new, ids[smp["cell_id"]], smp["round"], smp["created_at"],
                                            smp["sample"], smp["metrics"], smp["requested_vs_actual"])
            except EnvironmentProblem:
                if self._q("SELECT id FROM runs WHERE uid = :u", {"u": run["uid"]}):
                    skipped += 1  # another import took it at the same moment (the unique uid said no to us)
                    on_line(f"run {run['id']} ({run['name']}): already here (imported at the same time)")
                    continue
                raise
            imported += 1
            on_line(f"run {run['id']} ({run['name']}): imported as run {new}, {len(cells)} cells, "
                    f"{len(samples)} samples")
        self._import_bisects(other, on_line)
        return imported, skipped

    def _import_bisects(self, other: "Store", on_line: Callable[[str], None]) -> None:
        """Copy `other`'s bisects not held here (by uid), each step pointing to its run as imported here.
        A bisect whose process has ended arrives interrupted (an owner's pid means nothing on this host)."""
        if other.schema_version() < 4:
            return
        bisects = [dict(r._mapping) for r in other._q("SELECT * FROM bisects ORDER BY id")]
        if not bisects:
            return
        # run id there → run id here, by uid: one query on each side, not two per step
        uid_of = {rid: uid for rid, uid in other._q("SELECT id, uid FROM runs WHERE uid IS NOT NULL")}
        id_here = {uid: rid for rid, uid in self._q("SELECT id, uid FROM runs WHERE uid IS NOT NULL")}
        for raw in bisects:
            have = self._q("SELECT id FROM bisects WHERE uid = :u", {"u": raw["uid"]})
            if have:
                on_line(f"bisect {raw['id']} ({raw['plan_name']}): already here as bisect {have[0][0]}")
                continue
            read = other.get_bisect(raw["id"])  # its status as its owner's liveness makes it
            steps = [dict(r._mapping) for r in other._q("SELECT * FROM bisect_steps WHERE bisect_id = :b ORDER BY id",
                                                        {"b": raw["id"]})]
            runs = {st["run_id"]: id_here.get(uid_of.get(st["run_id"])) for st in steps if st["run_id"] is not None}
            with self._tx() as c:
                new = int(c.execute(sa.text(
                    "INSERT INTO bisects(plan_name, plan_text, spec, status, note, result, owner, started_at, "
                    "finished_at, offlab_version, uid) VALUES (:n, :t, :s, :st, :no, :r, :o, :at, :f, :v, :u) "
                    "RETURNING id"),
                    {"n": raw["plan_name"], "t": raw["plan_text"], "s": raw["spec"], "st": read["status"],
                     "no": read["note"], "r": raw["result"], "o": raw["owner"] if read["status"] == "running" else None,
                     "at": raw["started_at"], "f": raw["finished_at"], "v": raw["offlab_version"],
                     "u": raw["uid"]}).scalar_one())
                for st in steps:
                    c.execute(sa.text(
                        "INSERT INTO bisect_steps(bisect_id, position, release, package_version, suite, run_id, "
                        "verdict, detail, created_at, decided_at) VALUES (:b, :p, :rel, :pv, :su, :run, :v, :d, :at, "
                        ":dec)"), {"b": new, "p": st["position"], "rel": st["release"], "pv": st["package_version"],
                                   "su": st["suite"], "run": runs.get(st["run_id"]), "v": st["verdict"],
                                   "d": st["detail"], "at": st["created_at"], "dec": st["decided_at"]})
            on_line(f"bisect {raw['id']} ({raw['plan_name']}): imported as bisect {new}, {len(steps)} steps")


def _sqlite_connect(path: Path, query: str | None = None) -> sqlite3.Connection:
    if query:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, isolation_level=None,
                               check_same_thread=False, timeout=10.0)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _sqlite_engine(path: Path, query: str | None = None) -> sa.Engine:
    """SQLAlchemy over our own sqlite3 connections: autocommit at the driver, so that offlab says when a
    transaction begins — BEGIN IMMEDIATE for a write (the write lock at once, never a deadlock
    between two upgrading readers), a plain BEGIN for a read."""
    engine = sa.create_engine("sqlite://", creator=lambda: _sqlite_connect(path, query), poolclass=sa.pool.QueuePool,
                              pool_size=2, max_overflow=4)

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("offlab_write") else "BEGIN")

    return engine
