"""The journal's copy on the SSH host itself: each change on an SSH host, as the commands that undo it.

The transaction calls `copy_to_host` with each journalled record: for a change on an SSH host, the
exact commands that put its original back are written on that host too, before the change is made
(offlab.hosts.remote_journal), so `sh <remote_dir>/restore.sh` run there alone restores it even when
this controller died with SIGKILL. `mark` (the journal's mark plus this copy's removal) is how a
restore or a refused change closes an entry, so the host's copy goes with it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from offlab.errors import CommandFailed, EnvironmentProblem
from offlab.hosts import from_ref
from offlab.hosts import remote_journal
from offlab.hosts.ssh import at_once
from offlab.knobs import journal
from offlab.knobs.journal import Entry
from offlab.knobs.ethtool_params import _EthtoolParam
from offlab.knobs.registry import knob_from_entry
from offlab.knobs.sysctl import Sysctl
from offlab.knobs.trace_hist import HistTriggers


def undo_argvs(entry: dict) -> list[list[str]] | None:
    """The commands that put the entry's original back with only ip/ethtool/sh (offlab's hist triggers:
    sh, grep, sed, umount); None when offlab itself is needed (an OVS port, a qdisc tree, an RPS mask)."""
    kind, snap = entry.get("kind"), entry.get("original")
    if kind == "sysctl":
        if not isinstance(snap, str):
            return None
        knob = knob_from_entry(entry)
        if not isinstance(knob, Sysctl):
            return None
        path = knob.path
        return [["sh", "-c", 'printf "%s\\n" "$1" >"$2"', "sh", snap, path]]
    if kind == "trace-hist":
        knob = knob_from_entry(entry)
        return [knob.restore_argv(snap)] if isinstance(knob, HistTriggers) else None
    iface = entry.get("iface")
    if not isinstance(iface, str):
        return None  # every other kind here is one of an interface
    if kind == "feature" and isinstance(snap, dict):
        args = [a for name, (_, requested, fixed) in snap.items() if not fixed
                for a in (name, "on" if requested else "off")]
        return [["ethtool", "-K", iface, *args]] if args else []
    if kind == "mtu" and isinstance(snap, dict) and "mtu_request" not in snap:
        return [["ip", "link", "set", "dev", iface, "mtu", str(int(snap["mtu"]))]]
    if kind == "txqueuelen" and snap is not None:
        return [["ip", "link", "set", "dev", iface, "txqueuelen", str(int(snap))]]
    knob = knob_from_entry(entry)
    if isinstance(knob, _EthtoolParam) and snap is not None:
        return [["ethtool", knob.set_flag, iface, knob.param, str(snap)]]
    return None


def _ssh_host(entry: dict):
    ref = entry.get("host")
    if not isinstance(ref, dict) or ref.get("kind") != "ssh":
        return None
    return from_ref(ref)


def _name(path: Path, seq: int) -> str:
    return f"{path.stem}-{seq}"


def copy_to_host(path: Path, record: dict) -> None:
    """A change on an SSH host is about to be made: its undo goes to the host first."""
    host = _ssh_host(record)
    if host is None:
        return
    where = f"{record.get('iface') or '-'} {record.get('key')}"
    title = f"{where}: {record.get('value')} → back to {record.get('original_text')}"
    argvs = undo_argvs(record)
    if argvs is None:
        # Said, not skipped: the host's restore.sh then names what only `offlab restore` can put back.
        argvs = [["sh", "-c", 'echo "$1" >&2; exit 1', "sh",
                  f"{where}: only `offlab restore` on the controller can put this back"]]
    remote_journal.record(host, host.remote_dir, _name(path, record["seq"]), title, argvs)


def mark(entry: Entry, op: str, note: str = "") -> None:
    """Close an entry (restored, dropped) in the journal here and, for an SSH host's change, remove the
    host's copy of its undo. A host that does not answer right then (it may have fallen silent just
    after the restore) keeps its copy, and the journal says so: it stays until `forget_copies` (a later
    restore or `lab down`) removes the copy there."""
    journal.mark(entry, op, note)
    data = entry.data or next((e.data for e in journal.load(entry.journal).entries if e.seq == entry.seq), {})
    host = _ssh_host(data)
    if host is None:
        return
    try:
        remote_journal.forget(host, host.remote_dir, _name(entry.journal, entry.seq))
    except (EnvironmentProblem, CommandFailed):
        if entry.journal.exists():
            journal.Journal(entry.journal).append({"op": "copy-left", "seq": entry.seq})
        entry.copy_left = True


def let_go(path: Path, entries: list[Entry], *, hand_over: bool = False) -> None:
    """A transaction ended: this process's leases on the SSH hosts of its entries are released where
    nothing they cover is left (a library's transaction in a longer-lived process, as a command's at
    its end). With `hand_over` (a persisted journal released), its changes there stay in force on
    purpose, so the lease no longer covers them (offlab.hosts.lease.hand_over)."""
    from offlab.hosts import lease

    hosts: dict[tuple[str, str], Any] = {}
    for entry in entries:
        host = _ssh_host(entry.data)
        if host is not None:
            hosts.setdefault((host._key, host.remote_dir), host)

    def release(host) -> None:
        try:
            if hand_over:
                lease.hand_over(host, host.remote_dir, f"-{path.stem}-")
            else:
                lease.release_idle(host, host.remote_dir)
        except (EnvironmentProblem, CommandFailed):
            pass  # unreachable: the lease lapses and its watchdog puts back what it covers, said then

    at_once([functools.partial(release, host) for host in hosts.values()])  # each host's round trip at once


def forget_copies(entries: list[Entry]) -> tuple[list[str], list[str]]:
    """Remove the SSH hosts' copies of the undo of entries closed while their host did not answer
    (`Entry.copy_left`); (lines, failures), a host still silent being a failure to name."""
    lines, failed = [], []
    for entry in entries:
        host = _ssh_host(entry.data)
        what = f"{entry.where} {entry.data.get('key')}"
        if host is None:
            continue
        try:
            remote_journal.forget(host, host.remote_dir, _name(entry.journal, entry.seq))
        except (EnvironmentProblem, CommandFailed) as exc:
            failed.append(f"the undo script of {what} ({entry.status} earlier) is still on {host.name}: {exc}; "
                          f"`offlab restore` again once it answers")
            continue
        journal.Journal(entry.journal).append({"op": "copy-removed", "seq": entry.seq})
        entry.copy_left = False
        lines.append(f"removed {host.name}'s copy of the undo of {what} ({entry.status} earlier, while "
                     f"{host.name} did not answer)")
    return lines, failed
