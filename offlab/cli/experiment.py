"""`offlab run`, `offlab suite ...`, `offlab demo`: experiments from plans and built-in suites."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

from typing import TYPE_CHECKING

import typer
from offlab.cli.console import OnFirstUse, command_group
from offlab.cli.options import db_option

if TYPE_CHECKING:  # names for annotations only; imported for real inside the commands
    from offlab.experiment.plan import Plan
    from offlab.experiment.runner import Runner
    from offlab.store import Store

# The experiment machinery (pydantic plans, the runner, SQLite, scipy) is imported inside the
# commands that use it, so that `offlab lab down` does not pay for it at start-up.

out = OnFirstUse(stderr=True)
QUICK_HELP = ("The headline comparisons first, decided within 2 minutes (or --budget), with the plan's "
              "quick_workload (e.g. 1-second samples), and 2 rounds of the other cells to show the shape; "
              "plans without a baseline: 1–2 repetitions, wide interval.")
TRACE_HELP = ("Every stream sample takes the kernel's own account of its window beside the counters': drops by "
              "reason and place, skbs by gso_type per device, from tracepoints (bpftrace in this machine's "
              "namespaces; tracefs hist triggers in a guest's or an SSH host's own kernel). Off by default: seconds per sample to start, a few % of throughput.")
BUDGET_HELP = ("Wall time of the run, lab builds and guest boots included, e.g. 90s, 2m, 1h: rounds go to "
               "undecided comparisons (headline first); "
               "what is left undetermined says how many more minutes it would need.")
UNTIL_HELP = ("decided: repeat each comparison with the baseline until faster, slower or equivalent; "
              "width: repeat each cell until its interval is repeat.width % wide (netperf -I, the old rule).")
suite_app = command_group("Built-in suites that reproduce the seed documents.")


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
    app.add_typer(suite_app, name="suite")
    app.command("demo")(demo_cmd)


def run_cmd(
    plan: Optional[Path] = typer.Argument(None, help="Plan file (YAML)."),
    db: Optional[str] = db_option(),
    resume: Optional[int] = typer.Option(None, "--resume", metavar="RUN_ID", help="Continue an interrupted run."),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP),
    budget: Optional[str] = typer.Option(None, "--budget", help=BUDGET_HELP),
    until: Optional[str] = typer.Option(None, "--until", help=UNTIL_HELP),
    validate: bool = typer.Option(False, "--validate", help="Only check the plan and list its cells."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="Run the plan on SSH host pairs at once "
                                                                        "(one run per pair; docs/remote.md)."),
    pair: List[str] = typer.Option([], "--pair", metavar="CLIENT:IF,SERVER:IF", help=(
        "With --inventory: a client and a server host and their test interfaces, repeatable (default: the "
        "inventory's pairs).")),
    trace: bool = typer.Option(False, "--trace", help=TRACE_HELP),
) -> None:
    """Run a plan: every cell, repeated until each comparison is decided (or its confidence target is met);
    results in SQLite or PostgreSQL."""
    if inventory is not None or pair:
        _fan_out(plan, inventory, pair, db, quick, as_json, resume, validate, trace)
        return
    from offlab.errors import BadInput
    from offlab.experiment.plan import check_tools, load_plan_file
    from offlab.experiment.request import PlanOverrides, override
    from offlab.experiment.runner import Runner
    from offlab.store import Store, default_db_path

    if (plan is None) == (resume is None):
        raise BadInput("give a PLAN file or --resume RUN_ID")
    if validate and plan is None:
        raise BadInput("--validate checks a PLAN file: offlab run PLAN.yaml --validate")
    if plan is not None:
        # The plan is judged before the database is opened, so --validate needs none.
        p = load_plan_file(str(plan), quick=quick)
        override([p], PlanOverrides(budget=budget, until=until, trace=trace))
        _warn_no_ops(p)
        if validate:
            _validate_tools(p)
            _print_cells(p)
            return
    if resume is not None:
        _need_root("offlab run --resume")
        store = Store.open(db or default_db_path())
        runner = Runner.resume(store, resume, on_event=_Progress().event)
        runner.plan.trace = runner.plan.trace or trace
        check_tools(runner.plan)
        _finish(store, runner, as_json)
        return
    _ready([p], "offlab run")  # before the database: a non-root user's first error should be root
    _run_plans([p], Store.open(db or default_db_path()), as_json)


def _fan_out(plan, inventory, pairs, db, quick: bool, as_json: bool, resume, validate: bool, trace: bool) -> None:
    """`run PLAN --inventory FILE`: the plan on every host pair at once, then the pairs side by side."""
    from offlab.errors import BadInput, EnvironmentProblem
    from offlab.experiment.fanout import fan_out
    from offlab.store import default_db_path

    if inventory is None:
        raise BadInput("--pair with `offlab run` needs --inventory FILE")
    if plan is None or resume is not None or validate:
        raise BadInput("--inventory runs a PLAN file (not --resume or --validate)")
    _need_root("offlab run --inventory")
    db_path = str(db or default_db_path())
    runs = fan_out(str(plan), str(inventory), db_path, list(pairs) or None, quick=quick, trace=trace,
                   on_line=(lambda line: None) if as_json else out.print)
    if as_json:
        typer.echo(json.dumps({"db": db_path, "pairs": [r.to_dict() for r in runs]}, indent=2))
    else:
        for r in runs:
            typer.echo(f"{r.pair}: " + (f"run {r.run_id}" if r.rc == 0 else f"failed: {r.error}")
                       + (f" (samples kept in run {r.run_id})" if r.rc != 0 and r.run_id else ""))
        done = [str(r.run_id) for r in runs if r.run_id is not None]
        if len(done) > 1:
            typer.echo(f"side by side: offlab compare {' '.join(done)}" + (f" --db {db}" if db else ""))
    failed = [r for r in runs if r.rc != 0]
    if failed:
        raise EnvironmentProblem(f"{len(failed)} of {len(runs)} pair(s) failed: " + "; ".join(
            f"{r.pair}: {r.error or f'exit {r.rc}'}" for r in failed))


def _ready(plans: list[Plan], what: str) -> None:
    """Root, then every tool every plan needs, before a database is opened or a lab built."""
    from offlab.experiment.plan import check_tools

    _need_root(what)
    for plan in plans:
        check_tools(plan)


def _validate_tools(plan: Plan) -> None:
    """Tools are root's to have (plans run as root); another user cannot see root's, so is told so."""
    from offlab.experiment.plan import check_tools, required_tools
    from offlab.hosts import is_root

    if is_root():
        check_tools(plan)
    else:
        out.print(f"note: not root, so the tools were not checked ({', '.join(required_tools(plan))}); "
                  "`offlab run` checks them as root")


def _warn_no_ops(plan: Plan) -> None:
    """Settings known to do nothing in a cell, on stderr before anything runs (the run goes on: the
    sample's effect witness then shows the same thing in numbers)."""
    from offlab.experiment.plan import no_op_warnings

    for line in no_op_warnings(plan):
        typer.echo(f"warning: {line}", err=True)


def _need_root(what: str) -> None:
    from offlab.errors import NotRoot
    from offlab.hosts import is_root

    if not is_root():
        raise NotRoot(what)


@suite_app.command("list")
def suite_list() -> None:
    """The built-in suites and what each reproduces."""
    from offlab.experiment import suites as suite_lib

    for name in suite_lib.names():
        desc = suite_lib.description(name)
        typer.echo(f"{name:8s} {desc[:150]}{'…' if len(desc) > 150 else ''}")


@suite_app.command("show")
def suite_show(name: str = typer.Argument(..., help="A built-in suite (offlab suite list).")) -> None:
    """A suite's plan, as YAML, and its cells."""
    from offlab.experiment import suites as suite_lib

    typer.echo(suite_lib.text(name))
    for p in suite_lib.plans(name):
        _print_cells(p)


@suite_app.command("run")
def suite_run(
    name: str = typer.Argument(..., help="A built-in suite (offlab suite list)."),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP),
    budget: Optional[str] = typer.Option(None, "--budget", help=BUDGET_HELP),
    until: Optional[str] = typer.Option(None, "--until", help=UNTIL_HELP),
    db: Optional[str] = db_option(),
    report_dir: Optional[Path] = typer.Option(None, "--report-dir", help="Write an HTML report per run here."),
    as_json: bool = typer.Option(False, "--json", help="Print each run's summary as JSON."),
    trace: bool = typer.Option(False, "--trace", help=TRACE_HELP),
) -> None:
    """Run a built-in suite."""
    from offlab.experiment import suites as suite_lib
    from offlab.experiment.request import PlanOverrides, override
    from offlab.store import Store, default_db_path

    plans = suite_lib.plans(name, quick=quick)
    override(plans, PlanOverrides(budget=budget, until=until, trace=trace))
    _ready(plans, "offlab suite run")
    _run_plans(plans, Store.open(db or default_db_path()), as_json, report_dir)


def demo_cmd(
    db: Optional[str] = db_option(),
    report_dir: Path = typer.Option(Path("offlab-reports"), "--report-dir", help="Where the reports go."),
) -> None:
    """The `make demo` job: the quick suite, its summaries, and where the reports are."""
    from offlab.experiment import suites as suite_lib
    from offlab.store import Store, default_db_path

    plans = suite_lib.plans("quick")
    _ready(plans, "offlab demo")
    _run_plans(plans, Store.open(db or default_db_path()), False, report_dir)


def _run_plans(plans: list[Plan], store: Store, as_json: bool, report_dir: Path | None = None) -> None:
    from offlab.experiment.runner import Runner

    results = []
    for plan in plans:
        runner = Runner(plan, store, on_event=_Progress().event)
        results.append(_finish(store, runner, as_json, report_dir))
    if as_json:
        typer.echo(json.dumps(results, indent=2, default=str))


def _finish(store: Store, runner: Runner, as_json: bool, report_dir: Path | None = None) -> dict:
    try:
        run_id = runner.run()
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: exit 130 each (README, docs/knobs.md)
        if runner.run_id is None:
            out.print("[yellow]interrupted before the run was stored (while its labs were built): settings "
                      "restored, labs removed; nothing to resume, run the plan again[/yellow]")
        else:
            out.print(f"[yellow]interrupted: settings restored, labs removed; "
                      f"resume with `offlab run --resume {runner.run_id}`[/yellow]")
        raise typer.Exit(130) from None
    summary = {"run_id": run_id, "name": runner.plan.name, "status": store.get_run(run_id)["status"]}
    if runner.decider is not None:
        summary["decisions"] = runner.decisions
    summary["not_exercised"] = _not_exercised(store, run_id)  # cell key → settings set but not exercised
    if report_dir is not None:
        from offlab.report import write_report

        report_dir.mkdir(parents=True, exist_ok=True)
        path = report_dir / f"run-{run_id}-{runner.plan.name}.html"
        write_report(store, run_id, path)
        summary["report"] = str(path.resolve())
    if not as_json:
        from offlab.cli.results import print_comparison

        print_comparison(store, run_id)  # lists skipped / failed cells with their reasons too
        _print_decisions(runner, store)
        if "report" in summary:
            typer.echo(f"report: {summary['report']}")
        typer.echo(f"run {run_id} ({runner.plan.name}) {summary['status']}: offlab results show {run_id}")
    from offlab.hosts import lease

    note = lease.renewal_note()
    if note and not as_json:
        typer.echo(note)
    return summary


def _print_decisions(runner: Runner, store) -> None:
    """The headline comparisons: interval and verdict from the same rows `compare` and `results show`
    print (offlab.report.compare, the run's sequential rule), then what each rests on or still needs,
    and any setting of either side that was set but not exercised (its effect witness)."""
    from offlab.metrics import NOT_EXERCISED
    from offlab.report import compare
    from offlab.report import format as fmt

    if runner.decider is None or not runner.decisions:
        return
    rep = runner.plan.repeat
    head = [d for d in runner.decisions if d["headline"] and not d["moot"]]
    rest = [d for d in runner.decisions if not d["headline"] and not d["moot"]]
    rows = {(r.cell, r.baseline): r for r in compare.compare_run(store, runner.run_id, metrics=[rep.metric])}
    typer.echo(f"headline verdicts ({fmt.short(rep.metric)}, the sequential rule named under the table):")
    unexercised = _not_exercised(store, runner.run_id)
    for d in head:
        row = rows.get((d["cell"], d["baseline"]))
        if row is None:  # not comparable in the stored rows (a side without values): the runner's word
            from offlab.experiment.decide import reason

            typer.echo(f"  {d['cell']} vs {d['baseline']}: {reason(d)}{_published(runner, d)}")
        else:
            typer.echo(f"  {d['cell']} vs {d['baseline']}: {fmt.verdict_text(row)}{_detail(row, d)}"
                       f"{_published(runner, d)}")
        for who in ("cell", "baseline"):
            if d[who] in unexercised:
                typer.echo(f"    ⚠ {NOT_EXERCISED} in the {who} {d[who]}: {unexercised[d[who]]}")
    if rest:
        decided = sum(d["verdict"] != "undecided" for d in rest)
        typer.echo(f"other comparisons: {decided} of {len(rest)} decided (offlab results show {runner.run_id})")


def _detail(row, d: dict) -> str:
    """What the row's verdict rests on (decided) or still needs (undetermined), from the runner's summary."""
    from offlab.experiment.decide import detail

    text = detail(d)
    return f" ({text})" if row.verdict != "undetermined" else text


def _not_exercised(store, run_id: int) -> dict[str, str]:
    """cell key → its settings set but not exercised (the samples' effect witnesses)."""
    from offlab.metrics import not_exercised_by_cell
    from offlab.sample import records

    if store is None:  # a runner that stored nothing has nothing to mark
        return {}
    keys = {c["id"]: c["key"] for c in store.cells(run_id)}
    return {keys[cid]: line for cid, line in not_exercised_by_cell(records(store.samples(run_id))).items()}


def _published(runner: Runner, d: dict) -> str:
    """` | seed 001: +63 %`: what the plan's source published for this comparison, if it did."""
    from offlab.report.compare import published_text

    params = {c.key: c.params for c in runner.plan.cells}
    text = published_text({"plan": {"published": runner.plan.published}}, params.get(d["cell"], {}),
                          params.get(d["baseline"], {}), d["metric"])
    return f" | {text}" if text else ""


def _print_cells(p: Plan) -> None:
    rep = p.repeat
    if rep.rule(p.baseline is not None) == "decided":
        rule = (f"each comparison repeated {rep.min}..{rep.max} times until decided at {rep.level:g} % "
                f"(equivalent within ±{rep.equivalence:g} %)")
    else:
        rule = f"repeat {rep.min}..{rep.max} at {rep.level:g} % ±{rep.width / 2:g} %"
    budget = f", budget {p.budget_s:g} s" if p.budget_s else ""
    typer.echo(f"# {p.name}: {len(p.cells)} cells, {rule}{budget}, baseline {p.baseline}")
    if p.headline:
        typer.echo(f"  headline: {', '.join(','.join(f'{k}={v}' for k, v in h.items()) for h in p.headline)}")
    if p.published:
        typer.echo(f"  published ({p.published['ref']}): " + "; ".join(
            f"{_filter_text(r['cell'])} vs {_filter_text(r['baseline'])} "
            + " … ".join(f"{x:+g}" for x in r["change_pct"]) + " %" for r in p.published["ratios"]))
    for c in p.cells:
        typer.echo(f"  {c.key}")


def _filter_text(f: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in f.items())


class _Progress:
    """Progress of a run on stderr: a live bar (cell, round, ETA) on a terminal, one line per event otherwise."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.done = 0
        self.bar = None
        if out.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("samples, ETA"), TimeRemainingColumn(), console=out.made(), transient=True)
            self.task = self.bar.add_task("starting", total=None)

    def _line(self, text: str) -> None:
        from rich.markup import escape

        # escaped: a reason such as "tx-udp-segmentation is off [fixed]" is text, not rich markup
        out.print(escape(f"[{time.monotonic() - self.t0:6.1f}s] {text}"))

    def event(self, kind: str, info: dict) -> None:
        from rich.markup import escape

        if kind == "lab":
            self._line(f"lab up: {info['topology']} mtu {info['mtu']}")
        elif kind == "run":
            self._line(f"run {info['run_id']}: {info['cells']} cells, shuffle seed {info['seed']}")
            if self.bar:
                self.bar.start()
        elif kind == "round" and not self.bar:
            self._line(f"round {info['round'] + 1}: {info['cells']} cells")
        elif kind == "sample" and self.bar:
            self.bar.update(self.task, description=f"round {info['round'] + 1} {info['cell']}")
        elif kind == "sampled":
            self.done += 1
            m = info["metrics"]
            text = (f"round {info['round'] + 1} {info['cell']}: "
                    + (f"{m['throughput_bps'] / 1e9:.2f} Gbit/s" if "throughput_bps" in m else "")
                    + (f", loss {100 * m['loss']:.3f} %" if "loss" in m else "")
                    + (f", rtt p50/p99 idle {m['rtt_p50_us']:.0f}/{m['rtt_p99_us']:.0f} µs" if "rtt_p99_us" in m
                       else "")
                    + (f", loaded {m['loaded_rtt_p50_us']:.0f}/{m['loaded_rtt_p99_us']:.0f} µs"
                       if "loaded_rtt_p99_us" in m else "")).replace(": , ", ": ")
            if self.bar:
                # The total grows when a cell needs more repetitions than the minimum.
                self.bar.update(self.task, completed=self.done, total=self.done + info["remaining_min"])
                self.bar.console.print(f"  {text}")
            else:
                eta = info["remaining_min"] * (time.monotonic() - self.t0) / self.done
                self._line(f"  {text}" + (f"  (ETA ≥ {eta:.0f} s)" if info["remaining_min"] else ""))
        elif kind == "restart":
            self._line(f"guest restart: lab {info['lab']} up with other QEMU properties (guest boot {info['boots']} of this run)")
        elif kind == "skipped":
            self._line(f"  {info['cell']}: skipped — {escape(info['reason'])}")  # "[fixed]" is no markup
        elif kind == "decisions":
            comps = info["comparisons"]
            decided = sum(d["verdict"] != "undecided" for d in comps)
            steal = max((d["steal_pct"] or 0 for d in comps), default=0)
            open_cv = [max(x for x in (d["cv_cell_pct"], d["cv_baseline_pct"]) if x is not None)
                       for d in comps if d["verdict"] == "undecided" and not d["moot"]
                       and (d["cv_cell_pct"] is not None or d["cv_baseline_pct"] is not None)]
            text = f"round {info['round'] + 1}: {decided} of {len(comps)} comparisons decided"
            if open_cv:
                text += f"; noisiest undecided cv {max(open_cv):.1f} %"
            if steal >= 1:
                text += f"; CPU steal up to {steal:.1f} %"
            self._line(text)
        elif kind in ("done", "budget", "interrupted"):
            if self.bar:
                self.bar.stop()
            self._line(f"run {info['run_id']}: {kind}")
