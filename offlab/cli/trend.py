"""`offlab results trend PLAN`: a plan's history per cell and metric, with its change points."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from offlab.cli.options import db_option

def trend_cmd(
    plan: str = typer.Argument(..., help="A plan's name as `offlab results list` shows its runs (e.g. uso, "
                                         "or 'gro @ a:eth1,b:eth1' for one host pair)."),
    cell: List[str] = typer.Option([], "--cell", help="A cell key (e.g. offload=on), repeatable (default: every cell)."),
    metric: List[str] = typer.Option([], "--metric", help="A metric, repeatable (default: the headline metrics "
                                                          "the runs measured)."),
    as_json: bool = typer.Option(False, "--json", help="Every point, group and change point as JSON."),
    db: Optional[str] = db_option(),
) -> None:
    """A plan's runs over time, per cell and metric, with its change points and what changed at each.

    Each point is one run of PLAN (oldest first): the mean of the cell's samples and their interval. The runs
    are grouped by minimum description length (FD.io CSIT's trend analysis; docs/results.md); at each change
    point the step (before → after, relative) and what changed between the runs on either side, most likely
    cause first."""
    from offlab.report import trend as tr
    from offlab.store import Store

    with Store.open(db, create=False) as store:
        found = tr.trend(store, plan, cell, metric)
    if as_json:
        typer.echo(json.dumps(found.to_dict(), indent=2, ensure_ascii=False, default=str))
        return
    for line in lines(found):
        typer.echo(line)


def lines(found) -> list[str]:
    """The trend as people read it: a header, then per series its points and change points."""
    from offlab.report import envdiff
    from offlab.report import format as fmt
    from offlab.report import trend as tr

    runs = found.runs
    head = (f"{found.plan}: {len(runs)} run{'' if len(runs) == 1 else 's'} "
            f"({runs[0]['started_at'][:16].replace('T', ' ')} → {runs[-1]['started_at'][:16].replace('T', ' ')}); "
            f"groups by {tr.METHOD}")
    text = [head] + ([found.tcg_line()] if found.emulated else [])
    if not found.series:
        text.append("no cell of these runs has a figure (each failed or was skipped)")
    for s in found.series:
        text.append("")
        text.append(f"{s.cell} · {fmt.short(s.metric)} ({METRIC_SENSE[tr.METRICS[s.metric].better]})")
        for i, p in enumerate(s.points):
            interval = (f"[{fmt.value(s.metric, p.ci.low)}, {fmt.value(s.metric, p.ci.high)}] at {p.ci.level:g} %"
                        if p.ci.low is not None else "one sample: no interval")
            status = "" if p.run_status == "done" else f"  ({p.run_status})"
            text.append(f"  run {p.run:<4} {p.started_at[:19].replace('T', ' ')}  n={p.ci.n:<3} "
                        f"{fmt.value(s.metric, p.ci.mean):>14}  {interval}  group {s.group_of(i) + 1}{status}")
        if not s.changes:
            text.append(f"  no change point over {len(s.points)} run{'' if len(s.points) == 1 else 's'}")
        for c in s.changes:
            rel = "" if c.relative is None else f" ({fmt.signed(100 * c.relative)} %)"
            text.append(f"  change point at run {c.run_after}: {fmt.value(s.metric, c.before)} → "
                        f"{fmt.value(s.metric, c.after)}{rel}, means of {c.runs_before} and {c.runs_after} runs")
            text += ["    " + line for line in envdiff.lines(c.environment, limit=10)]
            text += ["    " + m for m in c.environment.missing]
    return text


METRIC_SENSE = {"higher": "higher is better", "lower": "lower is better"}
