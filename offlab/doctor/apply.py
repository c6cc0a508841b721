"""`offlab doctor --apply ID ...`: which automatable fixes to make, and on which host.

A finding's fix is data (`FixChange(key, value, iface, netns)`); this module picks them from a
report and names the host each goes to. The cli turns them into knobs `Change`s, asks, and
applies them in one persistent Transaction, so `offlab restore` puts every original back.
"""

from __future__ import annotations

from offlab.doctor.model import FixChange, Report
from offlab.doctor.checks import all_checks
from offlab.doctor.source import LiveSource, Source
from offlab.errors import BadInput
from offlab.hosts import LOCAL, Host, NetnsHost

# Sysctls that exist once per machine (the initial namespace), whatever namespace was audited.
HOST_WIDE = ("net.core.netdev_budget", "net.core.netdev_budget_usecs", "net.core.netdev_max_backlog",
             "net.core.dev_weight")


def plan(report: Report, ids: list[str]) -> list[tuple[str, FixChange]]:
    """(check id, change) for every finding of `ids` that is not ok and has an automatable fix."""
    known = {s.id for s in all_checks()}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise BadInput(f"--apply: unknown check id(s) {', '.join(unknown)} (offlab doctor --list)")
    out = []
    for f in report.findings:
        if f.id in ids and f.status in ("info", "warn", "fail"):
            out += [(f.id, c) for c in f.changes]
    return out


def host_for(c: FixChange, audited: Host) -> Host:
    """Where a change goes: the machine for host-wide sysctls, its namespace, or the audited host."""
    if c.key in HOST_WIDE:
        return LOCAL
    if c.netns:
        return NetnsHost(c.netns)
    return audited


def fixes(report: Report, src: Source, ids: list[str]) -> tuple[list[tuple[str, FixChange, Host]], list[str]]:
    """(id, change, host) to make, and lines for the ids whose fix is by hand only."""
    if not isinstance(src, LiveSource):
        raise BadInput("--apply changes a live host: it cannot be used with --root")
    todo = [(cid, c, host_for(c, src.host)) for cid, c in plan(report, ids)]
    manual = []
    for cid in sorted({f.id for f in report.findings
                       if f.id in ids and f.status in ("info", "warn", "fail") and not f.changes}):
        by_hand = {f.fix for f in report.findings if f.id == cid and f.fix}
        manual.append(f"{cid}: not automatable; by hand: {' | '.join(sorted(by_hand))}")
    return todo, manual
