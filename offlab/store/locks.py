"""A run's one-writer lock: an flock beside an SQLite file, a session advisory lock in PostgreSQL; each
released by the kernel or the server when its holder dies, however it died."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from offlab.state import FlockFile
from offlab.store.schema import PG_LOCK_CLASS

if TYPE_CHECKING:
    from offlab.store import Store


def run_lock_path(store: "Store", run_id: int) -> Path:
    """The run's one-writer flock in SQLite (offlab.experiment.runner.run_lock): beside the database."""
    return Path(f"{store.path}.locks") / f"run-{run_id}.lock"

def run_lock(store: "Store", run_id: int) -> "FlockFile | PgRunLock":
    """The run's one-writer lock, not yet taken: an flock beside an SQLite file, an advisory lock in
    PostgreSQL; each released by the kernel or the server when its holder dies."""
    from offlab.state import FlockFile

    return FlockFile(store.run_lock_path(run_id)) if store.backend == "sqlite" else PgRunLock(store, run_id)

def pg_lock_holder(c: sa.Connection, run_id: int) -> dict | None:
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
                holder = pg_lock_holder(conn, self.run_id)
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
