"""Putting journalled settings back: newest first, each read back, the journal removed when done."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Iterable

from offlab.errors import OfflabError
from offlab.hosts.refs import remote_machine
from offlab.hosts.ssh import at_once
from offlab.knobs.journal import (Entry, all_journals, dir_lock, forget_namespaces, in_guest_of, journal_dir,
                                  remove_if_done)
from offlab.knobs.undo import forget_copies, mark
from offlab.knobs.registry import knob_from_entry
from offlab.knobs.target import Target, netns_exists


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _newest_first(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (e.t, e.seq), reverse=True)


def _gone(entry: Entry) -> str | None:
    ns = entry.data.get("netns")
    if ns is not None and not netns_exists(ns):
        return f"namespace gone: nothing to restore ({ns})"
    ref = entry.data.get("host")
    if isinstance(ref, dict) and ref.get("kind") not in ("local", "netns"):
        host = Target.from_dict(entry.data).host
        # An SSH machine that does not answer keeps its settings: restoring it fails, the entry stays.
        if host.settings_die_with_host and not host.alive():
            return f"host gone: nothing to restore ({ref.get('kind')} {ref.get('name', '')})".rstrip()
    return None


def restore_one(entry: Entry, report: Report) -> None:
    key, was = entry.data.get("key"), entry.data.get("original_text")
    try:
        knob = knob_from_entry(entry.data)
        why = _gone(entry) or knob.gone()
        if why:
            mark(entry, "dropped", why)
            report.lines.append(f"{entry.where} {key}: {why}")
            return
        knob.restore(entry.data["original"])
        after = knob.snapshot()
    except (OfflabError, OSError, KeyError, ValueError) as exc:
        msg = f"could not restore {entry.where} {key} to {was}: {exc}"
        report.lines.append(msg)
        report.failed.append(msg)
        return
    if knob.same(after, entry.data["original"]):
        mark(entry, "restored")
        report.lines.append(f"restored {entry.where} {key} = {was}")
    else:
        msg = f"could not restore {entry.where} {key}: wanted {was}, it reads {knob.show(after)}"
        report.lines.append(msg)
        report.failed.append(msg)


def restore_entries(entries: Iterable[Entry], report: Report | None = None) -> Report:
    """Each open entry put back, newest first on each machine. The SSH machines are done at once, one
    thread each (their round trips are what an interrupted run waits for); this machine's own entries
    (namespaces, guests) here, as before. Lines come per machine, in the order the machines first appear."""
    report = report or Report()
    groups: dict[tuple[str, str] | None, list[Entry]] = {}
    for entry in _newest_first(e for e in entries if e.status == "open"):
        groups.setdefault(remote_machine(entry.data.get("host")), []).append(entry)
    reports = {machine: Report() for machine in groups}

    def restore_all(machine: tuple[str, str] | None) -> None:
        for entry in groups[machine]:
            restore_one(entry, reports[machine])

    at_once([functools.partial(restore_all, m) for m in groups if m is not None])
    if None in groups:
        restore_all(None)
    for machine in groups:
        report.lines += reports[machine].lines
        report.failed += reports[machine].failed
    return report


def _forget_copies(entries: list[Entry], report: Report) -> None:
    lines, failed = forget_copies(entries)
    report.lines += lines + failed
    report.failed += failed


def restore_report(*, list_only: bool = False, force: bool = False) -> Report:
    """Restore (or list) what journals of dead processes, and released persisted journals, hold."""
    report = Report()
    if not journal_dir().exists():
        report.lines.append("nothing to restore")
        return report
    with dir_lock():
        chosen = []
        for view in all_journals():
            report.lines += view.problems
            if view.alive and not force:
                if view.open_entries:
                    report.lines.append(
                        f"{view.path.name}: belongs to running process {(view.owner or {}).get('pid')} "
                        f"({view.header.get('label', '?')}); left alone (--force restores it anyway)")
                continue
            chosen.append(view)
        entries = [e for v in chosen for e in v.open_entries]
        copies = [e for v in chosen for e in v.copies_left]  # before this restore adds any of its own
        if list_only:
            for e in _newest_first(entries):
                why = _gone(e)
                report.lines.append(f"would drop {e.where} {e.data.get('key')}: {why}" if why else
                                    f"would restore {e.describe()}  [{e.journal.name}]")
            report.lines += [f"would remove the host's copy of the undo of {e.where} {e.data.get('key')} "
                             f"({e.status} earlier)  [{e.journal.name}]" for e in copies]
        else:
            restore_entries(entries, report)
            _forget_copies(copies, report)
            for view in chosen:
                if remove_if_done(view.path):
                    report.lines.append(f"removed {view.path.name}")
    if not report.lines:
        report.lines.append("nothing to restore")
    return report


def restore_lab(name: str) -> Report:
    """Put back the settings journalled on lab `name` by processes that are gone (or `lab set`): `lab down`
    of a lab over existing machines, where nothing is removed that could take them along."""
    report = Report()
    if not journal_dir().exists():
        return report
    with dir_lock():
        views = [v for v in all_journals() if not v.alive]
        copies = [e for v in views for e in v.copies_left if e.data.get("lab") == name]
        restore_entries([e for v in views for e in v.open_entries if e.data.get("lab") == name], report)
        _forget_copies(copies, report)
        for view in views:
            remove_if_done(view.path)
    return report


def restore_pending(list_only: bool = False, *, force: bool = False) -> list[str]:
    """Put back every journalled setting whose process is gone (or was released); human lines."""
    return restore_report(list_only=list_only, force=force).lines


def list_pending(namespaces: Iterable[str] | None = None, lab: str | None = None) -> list[Entry]:
    """Journalled changes not yet restored, newest first; only those in `namespaces` (and on the
    guests and SSH hosts of `lab`) if given."""
    wanted = set(namespaces) if namespaces is not None else None
    out = []
    for view in all_journals():
        pid = (view.owner or {}).get("pid") if view.alive else None
        for e in view.open_entries:
            if wanted is None or e.data.get("netns") in wanted or (lab and in_guest_of(e, {lab})) \
                    or (lab and _on_remote_host_of(e, lab)):
                e.held_by = pid
                out.append(e)
    return _newest_first(out)


def _on_remote_host_of(entry: Entry, lab: str) -> bool:
    """An entry for an SSH host of lab `lab` (a `hosts` lab: its settings live on that machine)."""
    ref = entry.data.get("host")
    return isinstance(ref, dict) and ref.get("kind") == "ssh" and entry.data.get("lab") == lab


def pending_changes(role_of: dict[str, str], lab: str | None = None) -> list[dict]:
    """Open journal entries in the namespaces of `role_of` (netns → host role) and in the guests of
    `lab`, as `lab show` lists them."""
    return [{"host": role_of.get(e.data.get("netns") or "", e.data.get("netns") or e.data.get("role")),
             "iface": e.data.get("iface"), "key": e.data.get("key"), "value": e.data.get("value"),
             "original": e.data.get("original_text"), "journal": e.journal.name, "held_by": e.held_by}
            for e in list_pending(role_of, lab)]


def forget_lab_namespaces(namespaces: list[str]) -> list[str]:
    """`lab down` (experiment.teardown): drop the entries of namespaces that went with the lab; lines for its report."""
    dropped = forget_namespaces(namespaces)
    return [f"{len(dropped)} journalled setting(s) of its namespaces and guests (they went with them)"] if dropped else []
