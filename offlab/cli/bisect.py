"""`offlab bisect`: the first Debian guest kernel release at which a plan's comparison changes its verdict."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer

from offlab.cli.console import OnFirstUse
from offlab.cli.options import db_option

err = OnFirstUse(stderr=True)
CHANGELOG_LINES = 60  # changelog lines printed; --json and `--show ID --json` carry every entry

HELP = """Find the first Debian guest kernel release at which a plan's comparison changes its verdict.

The releases are Debian's cloud kernels from --good to --bad, in Debian's version order across suites
(bookworm … sid; `offlab vm image --list` shows what is cached). Each step runs the comparison (a cell
against its baseline, the plan's own rule) with every guest on one release, decided by the plan's
sequential rule within its budget: faster, slower, equivalent, undecided, "set but not exercised" (the
cell's effect witness) or "cannot test" (the cell was skipped, with the negotiation chain's reason).
With n releases from --good to --bad it measures at most ⌈log2 n⌉+1 of them. It prints the first
release where the verdict changes, both packages and the Debian changelog entries between them; an
undecided step stops it with the range it narrowed the change to. Killed, the same command again (or
`--resume ID`) continues without measuring a decided step again; --fresh starts over. Every step is a run in the results database (`offlab results
list` lists bisects too). Guests under TCG: verdicts are directions, not absolute figures."""


def register(app: typer.Typer) -> None:
    # one line per paragraph: the terminal wraps it
    app.command("bisect", help=" ".join(HELP.split("\n", 1)[0].split()) + "\n\n" + " ".join(HELP.split("\n", 1)[1].split()))(bisect_cmd)


def bisect_cmd(
    plan: Optional[Path] = typer.Argument(None, help="Plan file (YAML) with guests and a baseline."),
    good: Optional[str] = typer.Option(None, "--good", metavar="RELEASE", help=(
        "A release with the old verdict: a series (6.1), a release as Debian names it (6.12.57+deb12, "
        "6.1.0-56) or newest.")),
    bad: Optional[str] = typer.Option(None, "--bad", metavar="RELEASE", help="A release with the new verdict (same forms)."),
    cell: Optional[str] = typer.Option(None, "--cell", help="The compared cell, by key or axis=value (e.g. "
                                                            "tx=uso); default: the plan's one headline comparison."),
    metric: Optional[str] = typer.Option(None, "--metric", help="The metric the rule decides on (default: the "
                                                                "plan's repeat.metric)."),
    among: List[str] = typer.Option([], "--among", metavar="RELEASE", help=(
        "Only these releases between the ends (repeatable, or comma-separated): a shorter bisect.")),
    resume: Optional[int] = typer.Option(None, "--resume", metavar="ID", help="Continue an interrupted bisect."),
    fresh: bool = typer.Option(False, "--fresh", help="A new bisect even if one of the same plan, ends and "
                                                      "cell stopped unfinished (by default it carries on)."),
    show: Optional[int] = typer.Option(None, "--show", metavar="ID", help="Print a stored bisect."),
    db: Optional[str] = db_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the bisect as JSON."),
) -> None:
    from rich.markup import escape
    from offlab.errors import BadInput
    from offlab.store import Store, default_db_path

    if show is not None:
        with Store.open(db or default_db_path(), create=False) as store:
            print_bisect(store.get_bisect(show), as_json)
        return
    if (plan is None) == (resume is None):
        raise BadInput("give a PLAN file with --good and --bad, or --resume BISECT_ID")
    from offlab.experiment import bisect as bis
    from offlab.experiment.plan import check_tools, load_plan_file

    b_lines = _Lines()

    if plan is not None:
        if not good or not bad:
            raise BadInput(f"--{'good' if not good else 'bad'} is missing: offlab bisect PLAN --good V --bad V")
        p = load_plan_file(str(plan))
        bis.comparison(p, cell)  # the plan's own problems before root, the database or the archive
        _need_root()
        check_tools(p)
        store = Store.open(db or default_db_path())
        picks = [a.strip() for x in among for a in x.split(",") if a.strip()]
        b = bis.Bisect.start(store, p, good, bad, cell=cell, metric=metric, among=picks, fresh=fresh,
                             on_event=b_lines.event)
    else:
        assert resume is not None
        _need_root()
        store = Store.open(db or default_db_path())
        b = bis.Bisect.resume(store, resume, on_event=b_lines.event)
    n = len(b.releases)
    err.print(escape(f"bisect {b.id}: {b.spec.cell} vs {b.spec.baseline} on {b.spec.metric}, {n} releases from "
                     f"{b.releases[0].abi} to {b.releases[-1].abi} (at most {b.bound()} measured)"))
    from offlab.cli.experiment import _Progress

    progress = _Progress()
    progress.t0 = b_lines.t0  # one clock for the bisect's lines and its runs'
    try:
        b.execute(bis.plan_runner(store, progress.event))
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted: the same command again (or `offlab bisect --resume {b.id}`) carries on[/yellow]")
        raise typer.Exit(130) from None
    print_bisect(store.get_bisect(b.id), as_json)


def _need_root() -> None:
    from offlab.errors import NotRoot
    from offlab.hosts import is_root

    if not is_root():
        raise NotRoot("offlab bisect")


class _Lines:
    """One line per step on stderr as the bisect goes."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def event(self, kind: str, info: dict) -> None:
        from rich.markup import escape

        t = f"[{time.monotonic() - self.t0:6.1f}s]"
        if kind == "again":
            i = info["bisect_id"]
            err.print(f"{t} bisect: bisect {i} asked this of this plan and did not finish: carrying on with it, "
                      f"its decided steps kept (--fresh starts over)")
        elif kind == "step":
            r = info["release"]
            again = " (resuming its run)" if info["resumed"] else ""
            err.print(escape(f"{t} bisect: measuring {r.abi} ({r.name} {r.version}, {r.suite}){again}"))
        elif kind == "verdict":
            s = info["step"]
            err.print(escape(f"{t} bisect: {s.release.abi}: {step_line(s.verdict, s.detail, s.run_id)}"))


def step_line(verdict: str | None, detail: dict | None, run_id: int | None) -> str:
    """A step's verdict, what it rests on (ratio, interval, pairs) and why (a skipped cell's reason)."""
    d = detail or {}
    text = verdict or "not decided yet"
    if d.get("ratio") is not None:
        text += f" ×{d['ratio']:.2f}"
        if d.get("low") is not None:
            text += f" [{d['low']:.2f}, {d['high']:.2f}]"
    if "samples" in d:
        text += f", {d.get('pairs', 0)} pairs, {d['samples']} samples"
    if run_id is not None:
        text += f" (run {run_id})"
    if d.get("reason"):
        text += f" — {d['reason']}"
    if d.get("not_exercised"):
        text += f" — {d['not_exercised']}"
    return text


def print_bisect(b: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(b, indent=2, default=str))
        return
    spec, result = b["spec"], b["result"] or {}
    typer.echo(f"bisect {b['id']} ({b['plan_name']}): {spec['cell']} vs {spec['baseline']} on {spec['metric']}, "
               f"--good {spec['good']} --bad {spec['bad']}: {b['status']}")
    releases = spec["releases"]
    typer.echo(f"  {len(releases)} releases: {releases[0]['abi']} … {releases[-1]['abi']}")
    for i, s in enumerate(b["steps"], 1):
        typer.echo(f"  step {i}: {s['release']} ({s['suite']}): {step_line(s['verdict'], s['detail'], s['run_id'])}")
    if not result:
        if b["note"]:
            typer.echo(f"  {b['note']}")
        return
    lo, hi = result["lo"], result["hi"]
    typer.echo(f"  measured {result['measured']} of {result['n']} releases (at most {result['bound']}); "
               f"TCG guests: verdicts are directions")
    if result["kind"] == "found":
        typer.echo(f"first release where the verdict changes: {hi['abi']} ({hi['verdict']})")
        typer.echo(f"  before it: {lo['package']} {lo['version']} ({lo['suite']}): {lo['verdict']}")
        typer.echo(f"  from:      {hi['package']} {hi['version']} ({hi['suite']}): {hi['verdict']}")
        _print_changelog(result.get("changelog") or {}, lo, hi)
    elif result["kind"] == "same":
        typer.echo(f"no change: {lo['abi']} and {hi['abi']} both give {hi['verdict']}")
    else:
        typer.echo(f"not decided: {result['why']}; the change lies between {lo['abi']} ({lo['verdict'] or 'not measured'}) "
                   f"and {hi['abi']} ({hi['verdict'] or 'not measured'})")


def _print_changelog(log: dict, lo: dict, hi: dict) -> None:
    if log.get("error"):
        typer.echo(f"  Debian changelog: {log['error']}")
        return
    entries = log.get("entries") or []
    typer.echo(f"  Debian changelog between them ({len(entries)} entries, from {log.get('from')}'s changelog.Debian.gz):")
    lines = []
    for e in entries:
        lines.append(f"    {e['source']} ({e['version']}) {e['distribution']}")
        lines += [f"    {line}" for line in e["lines"]]
    for line in lines[:CHANGELOG_LINES]:
        typer.echo(line)
    if len(lines) > CHANGELOG_LINES:
        typer.echo(f"    … {len(lines) - CHANGELOG_LINES} more lines (offlab bisect --show ID --json has them all)")
