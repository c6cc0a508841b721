"""`offlab doctor --apply ID ...`: the automatable fixes, through the knobs journal.

A finding's fix is data (`FixChange(key, value, iface, netns)`); this module only
turns those into knobs `Change`s and applies them in one persistent Transaction,
so every original value is journalled and `offlab restore` puts it back.
"""

from __future__ import annotations

import sys

import typer

from offlab.doctor.model import FixChange, Report
from offlab.doctor.registry import REGISTRY
from offlab.doctor.source import LiveSource, Source
from offlab.errors import BadInput, EnvironmentProblem, NotRoot
from offlab.hosts import LOCAL, Host, NetnsHost, is_root

# Sysctls that exist once per machine (the initial namespace), whatever namespace was audited.
HOST_WIDE = ("net.core.netdev_budget", "net.core.netdev_budget_usecs", "net.core.netdev_max_backlog",
             "net.core.dev_weight")


def plan(report: Report, ids: list[str]) -> list[tuple[str, FixChange]]:
    """(check id, change) for every finding of `ids` that is not ok and has an automatable fix."""
    known = {s.id for s in REGISTRY}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise BadInput(f"--apply: unknown check id(s) {', '.join(unknown)} (offlab doctor --list)")
    out = []
    for f in report.findings:
        if f.id in ids and f.status in ("info", "warn", "fail"):
            out += [(f.id, c) for c in f.changes]
    return out


def _host(c: FixChange, audited: Host) -> Host:
    if c.key in HOST_WIDE:
        return LOCAL
    if c.netns:
        return NetnsHost(c.netns)
    return audited


def apply_fixes(report: Report, src: Source, ids: list[str], *, yes: bool = False, quiet: bool = False) -> int:
    """Apply, print what changed; 0 when every change took, 3 when some could not."""
    if not isinstance(src, LiveSource):
        raise BadInput("--apply changes a live host: it cannot be used with --root")
    say = (lambda msg: print(msg, file=sys.stderr)) if quiet else typer.echo
    todo = plan(report, ids)
    manual = sorted({f.id for f in report.findings
                     if f.id in ids and f.status in ("info", "warn", "fail") and not f.changes})
    for cid in manual:
        fixes = {f.fix for f in report.findings if f.id == cid and f.fix}
        say(f"{cid}: not automatable; by hand: {' | '.join(sorted(fixes))}")
    if not todo:
        say("nothing to apply: " + ("no automatable fix among " + ", ".join(ids)
                                     if manual else "the checks asked for are ok or skipped"))
        return 0
    if not is_root():
        raise NotRoot("doctor --apply")
    from offlab.knobs import Change, Transaction

    changes = [Change(_host(c, src.host), c.key, c.value, c.iface) for _, c in todo]
    say(f"doctor --apply will change {len(changes)} setting(s), journalled (undo: offlab restore):")
    for (cid, c), ch in zip(todo, changes):
        say(f"  [{cid}] {ch}")
    if not yes:
        try:
            confirmed = typer.confirm("Apply?", default=False, err=quiet)
        except (typer.Abort, EOFError):
            confirmed = False
        if not confirmed:
            say("nothing changed")
            return 0
    with Transaction(label="doctor --apply", persist=True) as tx:
        outcomes = tx.apply(changes)
    for o in outcomes:
        say("  " + o.line())
    failed = [o for o in outcomes if not o.ok]
    say("put back with: offlab restore")
    if failed:
        raise EnvironmentProblem(f"{len(failed)} of {len(outcomes)} change(s) did not take: {failed[0].reason}")
    return 0
