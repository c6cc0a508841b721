"""Leases on machine-wide settings: one transaction at a time may change a host-wide sysctl
or a feature of the machine's own interfaces.

A lab's settings live in its own namespaces, so two runs never meet there; the machine's
are shared by every run, whatever its state directory. Each such setting has a lease file
in one machine-wide place (`/run/offlab-leases/`, or `$OFFLAB_LEASE_DIR`), held with an
flock for as long as the transaction that changed it is open (the kernel drops it when the
holder dies). The file names its holder (pid, label, state directory) for the message a
waiting run gives, and after a change, the journal entry holding the original: a holder
that died before putting the setting back leaves that behind, so the next run refuses to
read a changed value as "the original" until `offlab restore` has run in that state dir.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from offlab.errors import EnvironmentProblem
from offlab.knobs.base import Knob
from offlab.knobs.journal import load
from offlab.state import FlockFile, me, state_dir

DEFAULT_LEASE_DIR = "/run/offlab-leases"
DEFAULT_WAIT_S = 30.0


class LeaseBusy(EnvironmentProblem):
    """Another live run holds a machine-wide setting."""


def lease_dir() -> Path:
    return Path(os.environ.get("OFFLAB_LEASE_DIR", DEFAULT_LEASE_DIR))


def wait_s() -> float:
    try:
        return max(0.0, float(os.environ.get("OFFLAB_LEASE_WAIT", DEFAULT_WAIT_S)))
    except ValueError:
        return DEFAULT_WAIT_S


def lease_name(knob: Knob) -> str:
    """One file per setting: `sysctl-net.core.rmem_max`, `feature-gro@eth1`."""
    name = f"{knob.kind}-{knob.key}" + (f"@{knob.target.iface}" if knob.target.iface else "")
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name)[:200] + ".lease"


# Leases this process holds, by file name: a run holds its machine settings for the whole run and
# each sample's transaction takes them again, re-entrantly, without waiting on itself.
_HELD: dict[str, "Lease"] = {}


def take(knob: Knob, label: str) -> "Lease":
    """The lease of `knob`'s setting for this process: the one already held, or a new one (may wait)."""
    name = lease_name(knob)
    lease = _HELD.get(name)
    if lease is None:
        lease = Lease(knob, label).acquire()
        _HELD[name] = lease
    lease.count += 1
    return lease


class Lease:
    """The lease of one machine-wide setting, held by this process (see `take`)."""

    def __init__(self, knob: Knob, label: str) -> None:
        self.knob = knob
        self.name = lease_name(knob)
        self.file = FlockFile(lease_dir() / self.name)
        self.info = {**me(), "label": label, "state_dir": str(state_dir().resolve()), "setting": knob.label}
        self.count = 0

    def acquire(self) -> "Lease":
        wait = wait_s()
        holder = self.file.acquire(self.info, wait=wait)
        if holder is not None:
            raise LeaseBusy(
                f"{self.knob.label} is machine-wide and held by pid {holder.get('pid', '?')} "
                f"({holder.get('label', '?')}, state dir {holder.get('state_dir', '?')}); waited {wait:g} s: "
                f"run again when it is done, or raise OFFLAB_LEASE_WAIT")
        left = _unrestored(self.file.previous)
        if left:
            self.file.release(keep=self.file.previous)
            raise EnvironmentProblem(
                f"{self.knob.label} was changed by pid {self.file.previous.get('pid', '?')} "
                f"({self.file.previous.get('label', '?')}), which ended before putting it back; the original "
                f"is in {left}: run `OFFLAB_STATE_DIR={self.file.previous.get('state_dir', '?')} offlab restore` "
                f"first")
        return self

    def journalled(self, journal: Path, seq: int) -> None:
        """The change is about to happen: name the journal entry that can undo it."""
        from offlab.knobs import watchdog

        self.info.update(journal=str(journal), seq=seq)
        self.file.write(self.info)
        watchdog.ensure()  # puts it back should this process die holding it

    def release(self) -> None:
        """Drop one hold; the last gives the setting back (if it could not be restored, the file
        keeps naming the journal entry that can)."""
        self.count -= 1
        if self.count > 0:
            return
        _HELD.pop(self.name, None)
        self.file.release(keep=self.info if _unrestored(self.info) else None)
        if not _HELD:
            from offlab.knobs import watchdog

            watchdog.stop()


def _unrestored(info: dict) -> str | None:
    """The journal still holding an open entry for this lease, if any."""
    path, seq = info.get("journal"), info.get("seq")
    if not isinstance(path, str) or not isinstance(seq, int):
        return None
    view = load(Path(path))
    return path if any(e.seq == seq for e in view.open_entries) else None
