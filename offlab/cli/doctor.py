"""`offlab doctor`: audit this host, a namespace or a captured tree against seed 002's guide."""

from __future__ import annotations

import json
import re
import sys
from typing import List, Optional

import typer
from offlab.cli.console import console as make_console

from offlab.errors import BadInput, EnvironmentProblem, NotRoot

NETNS_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _host_for(netns: str | None):
    from offlab import netdev
    from offlab.hosts import LOCAL, NetnsHost, is_root

    if netns is None:
        return LOCAL
    if not NETNS_RE.fullmatch(netns):
        raise BadInput(f"invalid --netns {netns!r}: use letters, digits, _ . -")
    if not is_root():
        raise NotRoot("doctor --netns")
    names = set(netdev.netns_names(LOCAL, timeout=30))
    if netns not in names:
        raise BadInput(f"no network namespace {netns!r} (ip netns list)")
    return NetnsHost(netns)


def _split(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]


def doctor(
    iface: Optional[List[str]] = typer.Option(None, "--iface", "-i", help="Interface to audit (repeatable; default: the NICs)."),
    netns: Optional[str] = typer.Option(None, "--netns", help="Audit inside this network namespace."),
    root: Optional[str] = typer.Option(None, "--root", metavar="DIR", help="Audit a captured tree: offlab --capture output or a sosreport."),
    target_pps: Optional[int] = typer.Option(None, "--target-pps", help="Packet rate to tune for; grades findings by the guide's tiers."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (schema offlab-doctor/1)."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", metavar="STATUS", help="Exit 1 if a finding is at or above: warn | fail."),
    apply: Optional[List[str]] = typer.Option(None, "--apply", metavar="CHECK", help="Apply the automatable fix of this check id (repeatable), journalled."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Apply without asking."),
    capture: Optional[str] = typer.Option(None, "--capture", metavar="DIR", help="Write what the checks read to this new directory."),
    sample: float = typer.Option(1.0, "--sample", metavar="SECONDS", help="Seconds between the two softnet_stat snapshots."),
    only: Optional[List[str]] = typer.Option(None, "--check", help="Run only this check id (repeatable)."),
    list_checks: bool = typer.Option(False, "--list", help="List the checks and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show why/fix for every finding."),
) -> None:
    """Audit a host against the KVM + bridge + virtio tuning guide and say what to do."""
    from offlab import doctor as doc
    from offlab.doctor.render import render, render_list

    console = make_console() if not as_json else None
    if list_checks:
        render_list(console or make_console())
        return
    if fail_on not in (None, "warn", "fail"):
        raise BadInput(f"--fail-on {fail_on!r}: choose warn or fail")
    if root and (netns or capture or apply):
        raise BadInput("--root reads a captured tree: it cannot be combined with --netns, --capture or --apply")
    if capture and apply:
        raise BadInput("--capture and --apply do not mix: capture first, apply in a separate run")
    if apply and not yes and not sys.stdin.isatty():
        raise BadInput("--apply asks for confirmation on a terminal: add --yes to apply without asking")
    ifaces = _split(iface)
    if root:
        src = doc.open_root(root)
    else:
        src = doc.LiveSource(_host_for(netns))
    if capture:
        from offlab.doctor.capture import capture as do_capture

        report, counts = do_capture(capture, src, ifaces=ifaces or None, sample_seconds=sample)
        msg = (f"captured {counts['files']} files, {counts['commands']} command outputs and "
               f"{counts['samples']} sample(s) into {capture}; analyse with: offlab doctor --root {capture}")
        if as_json:
            typer.echo(json.dumps({**report.to_json(), "capture": {"directory": capture, **counts}}, indent=2))
        else:
            typer.echo(msg)
        return
    report = doc.audit(src, ifaces=ifaces or None, target_pps=target_pps, sample_seconds=sample,
                       only=set(_split(only)) or None)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        render(report, console, verbose=verbose)
    if apply:
        _apply_fixes(report, src, _split(apply), yes=yes, quiet=as_json)
    if fail_on:
        from offlab.doctor.model import SEVERITY

        if SEVERITY[report.worst()] >= SEVERITY[fail_on]:
            raise typer.Exit(1)


def _apply_fixes(report, src, ids: list[str], *, yes: bool, quiet: bool) -> None:
    """Ask, then apply the automatable fixes of `ids` in one journalled Transaction; print what changed."""
    from offlab.doctor.apply import fixes

    say = (lambda msg: print(msg, file=sys.stderr)) if quiet else typer.echo
    todo, manual = fixes(report, src, ids)
    for line in manual:
        say(line)
    if not todo:
        say("nothing to apply: " + ("no automatable fix among " + ", ".join(ids)
                                     if manual else "the checks asked for are ok or skipped"))
        return
    from offlab.hosts import is_root

    if not is_root():
        raise NotRoot("doctor --apply")
    from offlab.knobs import Change, Transaction

    changes = [Change(host, c.key, c.value, c.iface) for _, c, host in todo]
    say(f"doctor --apply will change {len(changes)} setting(s), journalled (undo: offlab restore):")
    for (cid, _, _), ch in zip(todo, changes, strict=True):
        say(f"  [{cid}] {ch}")
    if not yes:
        try:
            confirmed = typer.confirm("Apply?", default=False, err=quiet)
        except (typer.Abort, EOFError):
            confirmed = False
        if not confirmed:
            say("nothing changed")
            return
    with Transaction(label="doctor --apply", persist=True) as tx:
        outcomes = tx.apply(changes)
    for o in outcomes:
        say("  " + o.line())
    failed = [o for o in outcomes if not o.ok]
    say("put back with: offlab restore")
    if failed:
        raise EnvironmentProblem(f"{len(failed)} of {len(outcomes)} change(s) did not take: {failed[0].reason}")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
