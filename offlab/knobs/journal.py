"""The settings journal: every original value, on disk before the setting changes.

One file per transaction, `$OFFLAB_STATE_DIR/journal/<label>-<pid>-<start>-<n>.journal`,
JSON lines, each appended, flushed and fsynced:

    {"offlab_journal": 1, "label": ..., "owner": {"pid": P, "start": T}, "persist": false, ...}
    {"op": "change", "seq": 1, "t": ..., "kind": "feature", "key": "gro", "netns": ..., "iface": ...,
     "original": <exact snapshot>, "original_text": "off", "value": "on"}
    {"op": "restored", "seq": 1}            or  {"op": "dropped", "seq": 1, "note": "namespace gone: ..."}
    {"op": "release"}                       (a persisted journal no longer belongs to its process)
    {"op": "copy-left", "seq": 1}           (closed, but its SSH host did not answer when the host's own
                                             copy of the undo was to go: the journal stays until a later
                                             restore removes it there and writes "copy-removed")
    {"op": "also-changed", "seq": 1, "changed": {"tx-tcp-segmentation": ["on", "off"]},
     "why": {"tx-tcp-segmentation": "needs tx-checksumming, which is off"}}
                                            (what the kernel took along; for people, restore ignores it)

The owner is a pid plus its start time from /proc/PID/stat, so a reused pid is
not mistaken for the process that wrote the journal. A torn last line (the
process died while writing it) is ignored: the setting had not changed yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from offlab.state import ensure_dir, me, owner_alive, proc_start, state_dir, write_failed

__all__ = ["Journal", "JournalView", "Entry", "load", "all_journals", "journal_dir", "dir_lock", "mark",
           "remove_if_done", "forget_namespaces", "proc_start", "me", "owner_alive"]

VERSION = 1
_counter = itertools.count(1)
def journal_dir() -> Path:
    return state_dir() / "journal"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def dir_lock() -> Iterator[None]:
    """Serialise restores and `lab down` clean-ups over the whole journal directory."""
    d = ensure_dir(journal_dir())
    fd = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass
class Entry:
    journal: Path
    seq: int
    t: int
    data: dict
    status: str = "open"  # open | restored | dropped
    note: str = ""
    copy_left: bool = False  # closed, but its SSH host's copy of the undo could not be removed then
    held_by: int | None = None  # pid of the live process that owns it, if any

    @property
    def where(self) -> str:
        d = self.data
        ref: dict = d["host"] if isinstance(d.get("host"), dict) else {}
        remote = ref.get("name") if ref.get("kind") not in (None, "local", "netns") else None
        host = d.get("role") or d.get("netns") or (remote if isinstance(remote, str) else None) or "machine"
        if d.get("lab") and d.get("role"):
            host = f"{d['lab']}/{d['role']}"
        return f"{host}:{d['iface']}" if d.get("iface") else host

    def describe(self) -> str:
        d = self.data
        return f"{self.where} {d.get('key')}: {d.get('value')} → back to {d.get('original_text')}"


@dataclass
class JournalView:
    path: Path
    header: dict
    entries: list[Entry] = field(default_factory=list)
    released: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def owner(self) -> dict | None:
        return None if self.released else self.header.get("owner")

    @property
    def alive(self) -> bool:
        return owner_alive(self.owner)

    @property
    def open_entries(self) -> list[Entry]:
        return [e for e in self.entries if e.status == "open"]

    @property
    def copies_left(self) -> list[Entry]:
        """Closed entries whose SSH host did not answer when its copy of the undo was to be removed."""
        return [e for e in self.entries if e.status != "open" and e.copy_left]


def load(path: Path) -> JournalView:
    header: dict = {}
    view = JournalView(path, header)
    by_seq: dict[int, Entry] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return view
    for n, line in enumerate(text.splitlines(keepends=True)):
        try:
            rec = json.loads(line)
            if not line.endswith("\n"):
                raise ValueError("torn line")
        except ValueError:
            view.problems.append(f"{path.name}: line {n + 1} unreadable (ignored)")
            continue
        if n == 0 and isinstance(rec, dict) and rec.get("offlab_journal"):
            header.update(rec)
            continue
        op = rec.get("op") if isinstance(rec, dict) else None
        if op == "change" and isinstance(rec.get("seq"), int):
            t = rec.get("t", 0)
            entry = Entry(path, rec["seq"], t if isinstance(t, int) else 0, rec)
            by_seq[entry.seq] = entry
            view.entries.append(entry)
        elif op in ("restored", "dropped") and rec.get("seq") in by_seq:
            by_seq[rec["seq"]].status = op
            by_seq[rec["seq"]].note = rec.get("note", "")
        elif op in ("copy-left", "copy-removed") and rec.get("seq") in by_seq:
            by_seq[rec["seq"]].copy_left = op == "copy-left"
        elif op == "release":
            view.released = True
    return view


def all_journals() -> list[JournalView]:
    d = journal_dir()
    if not d.exists():
        return []
    return [load(p) for p in sorted(d.glob("*.journal"))]


class Journal:
    """The journal of one transaction, written by the process that owns it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seq = 0

    @classmethod
    def create(cls, label: str, *, persist: bool, prefix: str = "tx") -> "Journal":
        d = ensure_dir(journal_dir())
        owner = me()
        slug = re.sub(r"[^a-z0-9]+", "-", prefix.lower()).strip("-")[:24] or "tx"
        path = d / f"{slug}-{owner['pid']}-{owner['start']}-{next(_counter)}.journal"
        header = {"offlab_journal": VERSION, "label": label, "owner": owner, "persist": persist,
                  "created": time.time()}
        # The header goes to a temporary name first: a journal is never seen without it.
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "x") as f:
                f.write(json.dumps(header, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # like rename, but fails instead of replacing an existing journal
            tmp.unlink()
            _fsync_dir(d)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise write_failed(path, exc) from exc
        return cls(path)

    def append(self, record: dict) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # A torn last line is ignored on reading, so a failed append leaves the journal readable.
            raise write_failed(self.path, exc) from exc

    @property
    def next_seq(self) -> int:
        return self._seq + 1

    def add(self, entry: dict, original: object, original_text: str, value: str) -> dict:
        """Record an original value; returns the record (its "seq" numbers it) only once it is on disk."""
        self._seq += 1
        record = {"op": "change", "seq": self._seq, "t": time.time_ns(), **entry,
                  "original": original, "original_text": original_text, "value": value}
        self.append(record)
        return record

    def release(self) -> None:
        self.append({"op": "release"})

    def view(self) -> JournalView:
        return load(self.path)


def mark(entry: Entry, op: str, note: str = "") -> None:
    rec = {"op": op, "seq": entry.seq}
    if note:
        rec["note"] = note
    if entry.journal.exists():
        Journal(entry.journal).append(rec)
    entry.status, entry.note = op, note


def remove_if_done(path: Path) -> bool:
    """Delete a journal once nothing in it is left to restore, nor any host's copy of an undo to remove."""
    view = load(path)
    if view.open_entries or view.copies_left or not path.exists():
        return False
    path.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return True


def in_guest_of(entry: Entry, labs: set[str]) -> bool:
    """An entry for a guest of one of these labs: a guest's settings live in its kernel, which ends
    with its QEMU, and its QEMU runs in a namespace of its lab."""
    ref = entry.data.get("host")
    return isinstance(ref, dict) and ref.get("kind") == "guest" and entry.data.get("lab") in labs


def _labs_of(namespaces: set[str]) -> set[str]:
    """The labs whose namespaces (`ol-<lab>-<host>`, offlab.names.netns_name) these are."""
    return {parts[1] for parts in (ns.split("-") for ns in namespaces) if len(parts) == 3 and parts[0] == "ol"}


def forget_namespaces(namespaces: list[str]) -> list[str]:
    """Drop entries that target these namespaces (their interfaces die with them) or the guests their
    lab ran in them; returns what was dropped."""
    gone = set(namespaces)
    dropped: list[str] = []
    if not gone or not journal_dir().exists():
        return dropped
    labs = _labs_of(gone)
    with dir_lock():
        for view in all_journals():
            for entry in view.open_entries:
                if entry.data.get("netns") in gone:
                    mark(entry, "dropped", "namespace removed by lab down")
                    dropped.append(entry.describe())
                elif in_guest_of(entry, labs):
                    mark(entry, "dropped", "guest stopped by lab down")
                    dropped.append(entry.describe())
            if not view.alive:
                remove_if_done(view.path)
    return dropped
