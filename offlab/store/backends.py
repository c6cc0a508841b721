"""Where the results live: an SQLite file (the default path, or $OFFLAB_DB) or a PostgreSQL URL, and the
SQLAlchemy engine for each (SQLite over offlab's own sqlite3 connections, so offlab says when a write
transaction begins)."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import sqlalchemy as sa

from offlab.errors import BadInput


_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<slashes>/*)(?P<rest>.*)$", re.S)


def is_url(db: object) -> bool:
    """A database given as a URL (scheme://...), not a file path."""
    m = _URL_RE.match(str(db))
    return bool(m and m["slashes"] and len(m["scheme"]) > 1)


def pg_url(text: str) -> sa.URL:
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


def default_db_path() -> Path | str:
    """$OFFLAB_DB if set (a path, or a postgresql:// URL as given); else /var/lib/offlab/offlab.db as
    root; else ~/.local/share/offlab/offlab.db."""
    env = os.environ.get("OFFLAB_DB")
    if env:
        return env if is_url(env) else Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/var/lib/offlab/offlab.db")
    return Path.home() / ".local" / "share" / "offlab" / "offlab.db"


def first_line(exc: BaseException) -> str:
    """The first line of what the database (or its driver) said."""
    orig = getattr(exc, "orig", None) or exc
    lines = [l.strip() for l in str(orig).strip().splitlines() if l.strip()]
    return lines[0] if lines else type(orig).__name__


def sqlite_connect(path: Path, query: str | None = None) -> sqlite3.Connection:
    if query:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, isolation_level=None,
                               check_same_thread=False, timeout=10.0)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def sqlite_engine(path: Path, query: str | None = None) -> sa.Engine:
    """SQLAlchemy over our own sqlite3 connections: autocommit at the driver, so that offlab says when a
    transaction begins — BEGIN IMMEDIATE for a write (the write lock at once, never a deadlock
    between two upgrading readers), a plain BEGIN for a read."""
    engine = sa.create_engine("sqlite://", creator=lambda: sqlite_connect(path, query), poolclass=sa.pool.QueuePool,
                              pool_size=2, max_overflow=4)

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("offlab_write") else "BEGIN")

    return engine
