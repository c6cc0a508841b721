"""The results database's schema: its tables (SQLAlchemy Core, each dialect writes its own DDL), the
statuses rows may hold, and MIGRATIONS, which take a database from any older version to this one.

MIGRATIONS[v] takes a database from v - 1 to v, on either backend; a database newer than this offlab
is refused (exit 3).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from typing import TYPE_CHECKING

import sqlalchemy as sa

from offlab import __version__
from offlab.errors import BadInput, EnvironmentProblem
from offlab.store.codec import now_utc

if TYPE_CHECKING:
    from offlab.store import Store

SCHEMA_VERSION = 4

# Versions this offlab reads without migrating (a read-only file): 1 lacks sample_series, 2 runs.uid,
# 3 the bisect tables.
READABLE_VERSIONS = (1, 2, 3, SCHEMA_VERSION)

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


def too_new(store: "Store", version: int) -> EnvironmentProblem:
    made_by = store.meta("written_by") or "a newer offlab"
    return EnvironmentProblem(
        f"{store.where} has schema version {version} (written by offlab {made_by}); this offlab "
        f"{__version__} knows up to version {SCHEMA_VERSION}: upgrade offlab, or pass --db to another database")


def migrate(store: "Store") -> None:
    """Take the database to SCHEMA_VERSION, each MIGRATIONS step in one write transaction (inside the
    write lock, so two processes never both migrate); refuse a newer or foreign database."""
    version = store.schema_version()
    if version == 0:
        with store.engine.connect() as c:
            foreign = [t for t in sa.inspect(c).get_table_names() if not t.startswith("sqlite_")]
        if foreign:
            # another offlab may have made it between the two reads (its tables and version come in one commit)
            version = store.schema_version()
            if version == 0:
                raise BadInput(f"{store.where} is a database but not offlab's (it has tables "
                               f"{', '.join(sorted(foreign)[:5])}): pass --db to another one")
    if version > SCHEMA_VERSION:
        raise too_new(store, version)
    if version == SCHEMA_VERSION:
        return
    if store.path is not None and version > 0 and not os.access(store.path, os.W_OK):
        # Another user's file or a read-only file system: Store.open reads it as it is, unmigrated.
        raise sqlite3.OperationalError("attempt to write a readonly database")
    with store._tx() as c:
        # Inside the write lock (SQLite's, or an advisory lock): another process may have migrated meanwhile.
        if store.backend == "postgresql":
            c.execute(sa.text("SELECT pg_advisory_xact_lock(:c, 0)"), {"c": PG_LOCK_CLASS})
            version = (int(r[0]) if (r := c.execute(sa.text("SELECT value FROM meta WHERE key = 'schema_version'"))
                                     .first()) else 0) if sa.inspect(c).has_table("meta") else 0
        else:
            version = int(c.exec_driver_sql("PRAGMA user_version").scalar() or 0)
        if version > SCHEMA_VERSION:
            raise too_new(store, version)
        for v in range(version + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[v]:
                if isinstance(step, str):
                    c.execute(sa.text(step))
                elif isinstance(step, sa.Table):
                    step.create(c)
                else:
                    step(c)
            if store.backend == "sqlite":
                c.exec_driver_sql(f"PRAGMA user_version = {v}")
        if version < SCHEMA_VERSION:
            put = ("INSERT INTO meta(key, value) VALUES (:k, :v) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            c.execute(sa.text(put), [{"k": "schema_version", "v": str(SCHEMA_VERSION)},
                                     {"k": "written_by", "v": __version__}])
            if version == 0:
                c.execute(sa.text(put), {"k": "created_at", "v": now_utc()})
