"""Who is using a lab right now: a run or a measurement holds it, `lab down` asks first.

A holder writes `labs/<name>.hold-<pid>-<n>` naming itself (pid and start time, so a
reused pid is not mistaken for it, and what it is: "run 7"). A holder that died without
removing its file does not count: liveness is checked, never assumed from the file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Iterator

from offlab.state import me, owner_alive, read_json, state_dir, write_json_atomic

_counter = itertools.count(1)


class Hold:
    """One holder's claim on one lab; `update` renames what holds it (e.g. once the run has an id)."""

    def __init__(self, lab: str, what: str) -> None:
        self.path = state_dir() / "labs" / f"{lab}.hold-{os.getpid()}-{next(_counter)}"
        self.info = {**me(), "what": what}
        write_json_atomic(self.path, self.info)

    def update(self, what: str) -> None:
        self.info["what"] = what
        write_json_atomic(self.path, self.info)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def hold(lab: str, what: str) -> Iterator[Hold]:
    h = Hold(lab, what)
    try:
        yield h
    finally:
        h.release()


def holders(lab: str, *, exclude_self: bool = True) -> list[dict]:
    """Live holders of `lab` (not this process unless asked); files of dead ones are removed."""
    live = []
    for path in sorted((state_dir() / "labs").glob(f"{lab}.hold-*")):
        try:
            info = read_json(path)
        except (OSError, ValueError):
            info = None
        if not owner_alive(info):
            _forget(path)
            continue
        if exclude_self and info["pid"] == os.getpid():
            continue
        live.append(info)
    return live


def _forget(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
