"""This machine's watchdog for its host-wide settings: a controller killed with SIGKILL while it held one
(a host-wide sysctl, a feature of the machine's own interfaces: knobs/lease.py) gets it put back.

The first host-wide change a process journals starts one watchdog for that process: `python -m
offlab.knobs.watchdog PID START LAPSE` in a session of its own, so it outlives the process. It looks at
the process twice a second (pid and start time, as the journal names its owner). While the process lives,
nothing happens, however long it runs or however busy the machine is: there is no renewal to miss. Once
the process is gone, the watchdog waits the lapse (`OFFLAB_MACHINE_LEASE` seconds, default 60: time for
`offlab restore` by hand), then puts back, newest first, the host-wide settings that process's journals
still hold open, records what it did in `$OFFLAB_STATE_DIR/lapsed/` (the next `offlab restore` says it),
and exits. A process that releases its last host-wide setting stops its watchdog (SIGTERM); one that dies
after putting everything back, or whose settings `offlab restore` puts back during the lapse, leaves a
watchdog that sees nothing open of it any more (its journals are read twice a second) and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from offlab.hosts import Process

DEFAULT_LAPSE = 60
POLL_S = 0.5


def lapse_s() -> float:
    try:
        return max(1.0, float(os.environ.get("OFFLAB_MACHINE_LEASE", DEFAULT_LAPSE)))
    except ValueError:
        return float(DEFAULT_LAPSE)


_PROC: list[tuple[int, Process]] = []  # (this process's pid, its watchdog), once started


def ensure() -> None:
    """This process's watchdog, started unless it runs."""
    from offlab.hosts import LOCAL
    from offlab.state import me, state_dir

    if _PROC and (_PROC[0][0] != os.getpid() or _PROC[0][1].poll() is not None):
        _PROC.clear()  # a forked child has none of its own yet; or it ended
    if _PROC:
        return
    owner = me()
    # This very offlab (a checkout, a venv), whatever the directory it was started from.
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir().resolve()),
           "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
    _PROC.append((os.getpid(), LOCAL.spawn(
        [sys.executable, "-m", "offlab.knobs.watchdog", str(owner["pid"]), str(owner["start"]), f"{lapse_s():g}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=env, cwd="/")))


def stop() -> None:
    """This process holds no host-wide setting any more: its watchdog goes."""
    if not _PROC or _PROC[0][0] != os.getpid():
        return
    _, proc = _PROC.pop()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _machine_wide(entry) -> bool:
    from offlab.errors import OfflabError
    from offlab.knobs.registry import knob_from_entry

    try:
        return knob_from_entry(entry.data).target.is_machine
    except (OfflabError, KeyError, ValueError):
        return False


def _held_by(owner: dict) -> list:
    """(journal, its open host-wide entries) of each journal `owner` holds (not released on purpose)."""
    from offlab.knobs.journal import all_journals

    return [(view, [e for e in view.open_entries if _machine_wide(e)]) for view in all_journals()
            if not view.released and view.header.get("owner") == owner]


def put_back(owner: dict) -> list[str]:
    """The host-wide settings `owner`'s journals still hold open, put back; what was done."""
    from offlab.knobs.journal import dir_lock, journal_dir, remove_if_done
    from offlab.knobs.restore import Report, restore_entries

    if not journal_dir().exists():
        return []
    report = Report()
    with dir_lock():
        for view, entries in _held_by(owner):
            restore_entries(entries, report)
            remove_if_done(view.path)
    return report.lines


def lapses(*, remove: bool = False) -> list[str]:
    """What this state directory's watchdogs put back after their process died, one line each."""
    from offlab.state import state_dir

    d = state_dir() / "lapsed"
    out: list[str] = []
    for path in sorted(d.glob("*.txt")) if d.is_dir() else []:
        out += path.read_text().splitlines()
        if remove:
            path.unlink(missing_ok=True)
    if remove and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
    return out


def main(argv: list[str]) -> int:
    from offlab.state import ensure_dir, owner_alive, state_dir

    owner = {"pid": int(argv[0]), "start": int(argv[1])}
    lapse = float(argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while owner_alive(owner):
        time.sleep(POLL_S)
    silent = time.time()
    # The lapse, cut short once nothing host-wide of the owner's is open any more (`offlab restore` put it
    # back meanwhile): there is nothing left to wait for (a test that killed a controller and restored at
    # once left this process behind for the whole lapse).
    end = time.monotonic() + lapse
    while time.monotonic() < end:
        if not any(entries for _, entries in _held_by(owner)):
            return 0
        time.sleep(POLL_S)
    lines = put_back(owner)
    if lines:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        head = (f"this machine: restored by its lease at {stamp} after pid {owner['pid']} ended at "
                f"{time.strftime('%H:%M:%S', time.localtime(silent))} (within {lapse:g} s)")
        d = ensure_dir(state_dir() / "lapsed")
        path = Path(d) / f"{owner['pid']}-{owner['start']}.txt"
        path.write_text("\n".join([head, *(f"this machine:   {l}" for l in lines)]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
