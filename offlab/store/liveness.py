"""Runs stored as "running" whose process is gone (kill -9, a lost machine): found by their lock and
shown, and written back where the database is writable, as interrupted."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import sqlalchemy as sa

from offlab.errors import EnvironmentProblem
from offlab.state import owner_alive
from offlab.store.locks import pg_lock_holder, run_lock_path

if TYPE_CHECKING:
    from offlab.store import Store

# A "running" run whose lock names no live process, or that has no lock this long after it started
# (the runner takes the lock right after creating the run), died without saying so (kill -9).
NO_LOCK_GRACE_S = 60.0


def dead_note(store: "Store", run_id: int, started_at: str) -> str | None:
    """Why a run stored as "running" is not running any more; None when its process is alive."""
    if store.backend == "sqlite":
        try:
            holder = json.loads(run_lock_path(store, run_id).read_text() or "{}")
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
            with store.engine.connect() as c:
                if pg_lock_holder(c, run_id) is not None:
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

def settle(store: "Store", run_id: int, status: str, note: str | None, started_at: str) -> tuple[str, str | None]:
    """(status, note) as they really are: a "running" run whose process is gone is "interrupted",
    written back when the database is writable (only while still "running": a resume wins)."""
    if status != "running":
        return status, note
    dead = dead_note(store, run_id, started_at)
    if dead is None:
        return status, note
    if not store.read_only:
        try:
            with store._tx() as c:
                c.execute(sa.text("UPDATE runs SET status = 'interrupted', note = :n "
                                  "WHERE id = :id AND status = 'running'"), {"n": dead, "id": run_id})
        except EnvironmentProblem:
            pass  # a read-only or full database: still shown as interrupted
    return "interrupted", dead
