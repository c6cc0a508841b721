"""`offlab results list|show`, `offlab compare`, `offlab report`: reading the results database."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from offlab.cli.console import OnFirstUse, command_group
from offlab.cli.options import db_option

from offlab.errors import BadInput
from offlab.metrics import HEADLINE, METRICS, NOT_EXERCISED, TCG_MARK, not_exercised_by_cell

if TYPE_CHECKING:  # read by the commands that print samples, imported there
    from offlab.probes.edge.dpdk_ports import TestpmdCounters
    from offlab.sample import Capture, SearchTrial, StoredSample

out = OnFirstUse()

def register(app: typer.Typer) -> None:
    results = command_group("Runs stored in the results database.")
    results.command("list")(list_cmd)
    results.command("show")(show_cmd)
    results.command("import")(import_cmd)
    from offlab.cli.trend import trend_cmd

    results.command("trend")(trend_cmd)
    app.add_typer(results, name="results")
    app.command("compare")(compare_cmd)
    app.command("report")(report_cmd)


def _open(db: Optional[str]):
    from offlab.store import Store

    return Store.open(db, create=False)


def _one_format(as_json: bool, as_csv: bool) -> None:
    if as_json and as_csv:
        raise BadInput("choose one of --json and --csv")


def _json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False, default=str))


def list_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON."),
    db: Optional[str] = db_option(),
) -> None:
    """The runs in the database: status, times, cells and samples; then the bisects (offlab bisect)."""
    from rich.markup import escape
    from rich.table import Table

    with _open(db) as store:
        runs = store.list_runs()
        bisects = store.list_bisects()
    if as_json:  # a run that is a bisect's step says so (the bisects themselves: offlab bisect --show ID --json)
        steps = {s["run_id"]: {"id": b["id"], "release": s["release"]} for b in bisects for s in b["step_runs"]}
        _json([{**r, **({"bisect": steps[r["id"]]} if r["id"] in steps else {})} for r in runs])
        return
    if not runs:
        typer.echo("no runs yet: offlab run PLAN.yaml")
        return
    t = Table("id", "name", "status", "started", "finished", "cells", "samples", "note", box=None)
    for r in runs:
        t.add_row(str(r["id"]), escape(r["name"]), r["status"], r["started"], r["finished"] or "–",
                  str(r["cells"]), str(r["samples"]), escape(r["note"] or ""))
    out.print(t)
    if bisects:
        out.print("bisects (offlab bisect --show ID):")
        t = Table("id", "plan", "good", "bad", "status", "started", "measured", "note", box=None)
        for b in bisects:
            t.add_row(str(b["id"]), escape(b["plan"]), escape(str(b["good"])), escape(str(b["bad"])), b["status"],
                      b["started"], str(b["steps"]), escape(b["note"] or ""))
        out.print(t)


def import_cmd(
    files: list[Path] = typer.Argument(..., help="SQLite databases to merge in (e.g. copied from hosts that ran offline)."),
    db: Optional[str] = db_option(),
) -> None:
    """Merge SQLite databases into this one (SQLite or PostgreSQL), each run and bisect once.

    Each run comes with its plan, environment, host pair, cells, samples, metrics and intervals, in one
    transaction; a run already here (the same runs.uid) is skipped, so importing twice adds nothing.
    Bisects come with their steps, each pointing at its run as imported. The files are only read."""
    from offlab.store import Store

    with Store.open(db) as target:
        for f in files:
            with Store.open_read_only(f) as source:
                imported, skipped = target.import_from(source, lambda line, f=f: typer.echo(f"{f}: {line}"))
            typer.echo(f"{f}: {imported} run(s) imported, {skipped} already in {target.where}")


def show_cmd(
    run_id: int = typer.Argument(..., help="A run id (offlab results list)."),
    as_json: bool = typer.Option(False, "--json", help="Everything: run, plan, env, cells, samples, intervals."),
    as_csv: bool = typer.Option(False, "--csv", help="One row per sample with every metric."),
    db: Optional[str] = db_option(),
) -> None:
    """One run: header, environment, and per cell the mean ± CI of the headline metrics."""
    from offlab.stats import mean_ci

    _one_format(as_json, as_csv)
    with _open(db) as store:
        run = store.get_run(run_id)
        cells = store.cells(run_id)
        values = store.cell_metrics(run_id)
        samples = store.samples(run_id) if (as_json or as_csv) else []
    level = (run.get("repeat") or {}).get("level") or 99
    cis = {c["id"]: {m: mean_ci(v, level) for m, v in values.get(c["id"], {}).items()} for c in cells}
    if as_json:
        from offlab.sample import records

        unexercised = not_exercised_by_cell(records(samples))
        _json({"run": run,
               "cells": [{**c, "intervals": {m: ci.to_dict() for m, ci in cis[c["id"]].items()},
                          "not_exercised": unexercised.get(c["id"])} for c in cells],
               "samples": samples})
        return
    if as_csv:
        _samples_csv(run, cells, samples)
        return
    _print_run(run, cells, cis, level)
    with _open(db) as store:
        print_not_exercised(store, run_id)
        print_searches(store, run_id)
        print_captures(store, run_id)
        print_losses(store, run_id)
        print_testpmd(store, run_id)
        print_published(store, run_id, rule_named=False)


def _samples_csv(run: dict, cells: list[dict], rows: list[dict]) -> None:
    from offlab.sample import records

    samples = records(rows)
    axes = list(dict.fromkeys(k for c in cells for k in c["params"]))
    names = [m for m in METRICS if any(m in s.metrics for s in samples)]
    names += sorted({m for s in samples for m in s.metrics} - set(names))
    by_id = {c["id"]: c for c in cells}
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["run_id", "run", "cell_id", "cell", *axes, "cell_status", "round", "sample_id", "created_at", *names])
    for s in samples:
        c = by_id[s.cell_id]
        w.writerow([run["id"], run["name"], c["id"], c["key"], *(c["params"].get(a, "") for a in axes), c["status"],
                    s.round, s.id, s.created_at, *(_csv_num(s.metrics.get(m)) for m in names)])


def _csv_num(v: float | None) -> str:
    return "" if v is None else repr(v)


def print_comparison(store, run_id: int) -> None:
    """What `offlab run` prints at the end: each cell against its baseline, or, without a baseline
    (or with one that matches nothing), each cell's mean ± CI."""
    from rich.markup import escape
    from offlab.report import compare
    from offlab.stats import mean_ci

    run = store.get_run(run_id)
    if run.get("baseline"):
        try:
            _print_rows(compare.compare_run(store, run_id))
            print_searches(store, run_id)
            print_captures(store, run_id)
            print_losses(store, run_id)
            print_testpmd(store, run_id)
            print_published(store, run_id)
            return
        except BadInput as exc:
            out.print(f"[yellow]{escape(str(exc))}[/yellow]")
    cells = store.cells(run_id)
    values = store.cell_metrics(run_id)
    level = (run.get("repeat") or {}).get("level") or 99
    cis = {c["id"]: {m: mean_ci(v, level) for m, v in values.get(c["id"], {}).items()} for c in cells}
    _cells_table(cells, cis, level)
    print_not_exercised(store, run_id)
    print_searches(store, run_id)
    print_captures(store, run_id)
    print_losses(store, run_id)
    print_testpmd(store, run_id)


def print_not_exercised(store, run_id: int) -> None:
    """Cells with a setting set but not exercised (its effect witness), with the counters and the likely cause."""
    from rich.markup import escape
    from offlab.sample import records

    keys = {c["id"]: c["key"] for c in store.cells(run_id)}
    found = not_exercised_by_cell(records(store.samples(run_id)))
    for cid, line in sorted(found.items(), key=lambda kv: keys.get(kv[0], "")):
        out.print(f"[bold red]{NOT_EXERCISED}[/bold red]: {escape(keys.get(cid, '?'))}: {escape(line)}")


def print_published(store, run_id: int, rule_named: bool = True) -> None:
    """The ratios the run's plan says its source published, each beside ours for the same comparison;
    the rule of our verdicts below them unless a comparison table above already named it."""
    from rich.markup import escape
    from offlab.report import compare
    from offlab.report import format as fmt

    rows = compare.published_rows(store, run_id)
    if not rows:
        return
    out.print(f"\n[bold]published ratios beside ours[/bold] ({escape(rows[0].label)}; "
              f"{'the sequential rule' if rows[0].rule == compare.SEQUENTIAL else 'Fieller'}):")
    for r in rows:
        ours = fmt.verdict_text(r) if r.compared else r.verdict
        out.print(f"  {escape(r.cell)} vs {escape(r.baseline or '?')}: ours {escape(ours)} | {escape(r.published)}")
    if not rule_named:
        for line in compare.rule_lines(rows):
            out.print(f"[dim]  verdicts: {escape(line)}[/dim]")


def print_captures(store, run_id: int) -> None:
    """What the wire showed in each cell: the capture verdict of its first captured sample."""
    from rich.markup import escape
    from offlab.sample import StoredSample, records

    keys = {c["id"]: c["key"] for c in store.cells(run_id)}
    seen: dict[int, Capture] = {}
    for s in records(store.samples(run_id)):
        cap = (s.sample or StoredSample()).capture
        if cap and s.cell_id not in seen:
            seen[s.cell_id] = cap
    if not seen:
        return
    out.print("[bold]on the wire[/bold] (capture of the first sample of each cell)")
    for cid, cap in sorted(seen.items(), key=lambda kv: keys.get(kv[0], "")):
        out.print(f"  {escape(keys.get(cid, '?'))}: {cap.host}:{cap.iface} {cap.frames} frames: "
                  f"{escape(cap.verdict)}")


def print_losses(store, run_id: int) -> None:
    """Segmentation by counters per cell, then by the kernel's account; where each cell's lost datagrams
    died by the counters, then by the kernel's drop reasons (cells whose samples took it, `--trace`)."""
    from rich.markup import escape
    from offlab.sample import records
    from offlab.report import format as fmt
    from offlab.report import kernel, kernel_accounts, losses, segmentations

    cells = store.cells(run_id)
    samples = records(store.samples(run_id))
    segs = segmentations(cells, samples)
    accounts = kernel_accounts(cells, samples)
    if segs:
        out.print("[bold]segmentation by counters[/bold] (first sample of each cell: packets vs bytes per hop)")
        for c in segs:
            out.print(f"  {escape(c.cell)}:")
            for h in c.hops:
                out.print(f"    {escape(h.line)}")
    traced = {k: kernel.segmentation_lines(m) + kernel.unavailable_lines(m) for k, m in accounts.items()}
    if any(traced.values()):
        out.print("[bold]segmentation by the kernel's account[/bold] (tracepoints, the cell's samples summed: "
                  "skbs handed to each device's queue and driver, and passed up)")
        for key, lines in traced.items():
            if lines:
                out.print(f"  {escape(key)}:")
                for line in lines:
                    out.print(f"    {escape(line)}")
    found = losses(cells, samples)
    dropped = {k: kernel.loss_lines(m) for k, m in accounts.items()}
    if not found and not any(dropped.values()):
        return
    out.print("[bold]where the loss went[/bold] (counters before and after on every hop; share of the lost"
              + ("; then the kernel's drops by reason" if any(dropped.values()) else "") + ")")
    by_cell = {la.cell: la for la in found}
    for key in [c["key"] for c in cells if c["key"] in by_cell or dropped.get(c["key"])]:
        out.print(f"  {escape(key)}:")
        for line in fmt.loss_lines(by_cell.get(key)) + dropped.get(key, []):
            out.print(f"    {escape(line)}")


def print_testpmd(store, run_id: int) -> None:
    """testpmd's packets out per packet in for each cell of a dpdk lab: what GRO merged, GSO split;
    with a guest (dpdk-vm), its NIC's frames and IP packets, the CPU of testpmd, QEMU and the guest,
    and the samples where a receiver pruned its receive queue."""
    from rich.markup import escape
    from offlab.probes.edge.dpdk_ports import TestpmdPorts
    from offlab.sample import StoredSample, records

    keys = {c["id"]: c["key"] for c in store.cells(run_id)}
    per_cell: dict[int, list[TestpmdCounters]] = {}
    stages: dict[int, list[GuestStages]] = {}
    for s in records(store.samples(run_id)):
        sample = s.sample or StoredSample()
        tp = sample.probes.of(TestpmdPorts)
        if tp and tp.out_per_in is not None:
            per_cell.setdefault(s.cell_id, []).append(tp)
            stages.setdefault(s.cell_id, []).append(guest_stages(sample))
    if not per_cell:
        return
    out.print("[bold]testpmd port counters[/bold] (data direction; packets out per packet in, mean over samples)")
    for cid, tps in sorted(per_cell.items(), key=lambda kv: keys.get(kv[0], "")):
        ratio = sum(t.out_per_in or 0 for t in tps) / len(tps)
        d = tps[0].data
        errors = sum(p.lost for t in tps for p in t.ports.values())
        out.print(f"  {escape(keys.get(cid, '?'))}: {ratio:.3f} out per in (first sample: {d.rx_packets} in → "
                  f"{d.tx_packets} out, port {tps[0].data_direction.replace('>', ' → ')}); "
                  f"errors/missed/drops {errors}")
        st = stages.get(cid) or []
        if st and st[0].guest:
            first, n = st[0], len(st)
            out.print(f"    guest {first.guest}: eth0 rx {first.rx} / tx {first.tx} frames, IP packets in "
                      f"{first.ip_in} out {first.ip_out} (first sample); CPU % (mean) testpmd "
                      f"{sum(x.testpmd_cpu for x in st) / n:.0f}, QEMU {sum(x.qemu_cpu for x in st) / n:.0f}, "
                      f"guest {sum(x.guest_cpu for x in st) / n:.0f}")
            pruned = [x.pruned for x in st if x.pruned]
            if pruned:
                out.print(f"    [yellow]receive queue pruned in {len(pruned)} of {n} samples[/yellow]: "
                          + escape("; ".join(pruned)))


@dataclasses.dataclass
class GuestStages:
    """A dpdk-vm sample's guest side: its eth0 frames, IP packets, CPU; testpmd's and QEMU's CPU."""

    guest: str | None
    rx: int
    tx: int
    ip_in: int
    ip_out: int
    testpmd_cpu: float
    qemu_cpu: float
    guest_cpu: float
    pruned: str  # the receive-queue prune counts of the sample's notes, "" when none


def guest_stages(sample: StoredSample) -> GuestStages:
    from offlab.sample import Cpu, Iface
    from offlab.experiment.measure import RCVQ_MARK

    probes = sample.probes
    cpu = {name: sum(p.cpu_pct for p in probes.processes if p.comm.startswith(name))
           for name in ("dpdk-testpmd", "qemu")}
    guest = next(iter(sample.guests or {}), None)
    eth = probes.interfaces.get(f"{guest}:eth0") or Iface()
    own = probes.cpu.side(guest or "") or Cpu()
    return GuestStages(guest=guest, rx=eth.rx_packets, tx=eth.tx_packets,
                       ip_in=probes.counter(guest or "", "Ip", "InReceives") or 0,
                       ip_out=probes.counter(guest or "", "Ip", "OutRequests") or 0,
                       testpmd_cpu=cpu["dpdk-testpmd"], qemu_cpu=cpu["qemu"], guest_cpu=own.busy or 0,
                       pruned="; ".join(n.split(": ", 1)[1].split("):")[0] + ")" for n in sample.notes or []
                                        if n.startswith(RCVQ_MARK)))


def print_searches(store, run_id: int) -> None:
    """The zero-loss headline of each searched sample, with its trials (offered vs achieved)."""
    from rich.markup import escape
    from offlab.sample import records
    from offlab.report import searches

    found = searches(store.cells(run_id), records(store.samples(run_id)))
    if not found:
        return
    out.print("[bold]zero-loss search[/bold] (target → achieved offered pps, loss; ✓ met the criterion)")
    for row in found:
        z = row.search
        rate = (f"{z.found_pps / 1e3:.1f} kpps at {row.criterion}" if z.found_pps is not None
                else f"no rate met {row.criterion}") + (" (generator-limited)" if z.generator_limited else "")
        out.print(f"  {escape(row.cell)} round {row.round}: [bold]{escape(rate)}[/bold]")
        out.print(f"    {escape(z.verdict if z.has('verdict') else '')}")
        line = ", ".join(_trial_text(t) for t in z.trials)
        out.print(f"    [dim]{escape(line)}[/dim]")


def _trial_text(t: SearchTrial) -> str:
    loss = "loss ?" if t.loss is None else f"{100 * t.loss:.2g} %"
    marks = (" ✓" if t.passed else "") + (" gen-limited" if t.generator_limited else "") + (
        " (confirm)" if t.phase == "confirm" else "")
    kl = t.kernel_loss
    kernel = "" if kl is None else (" [kernel: not taken]" if kl.has("unavailable") else " [kernel: " + (", ".join(
        [f"{k} {v}" for k, v in sorted(kl.places.items(), key=lambda kv: -kv[1])]
        + ([f"unseen {kl.unseen}"] if kl.unseen else [])) or "no drop") + "]")
    return f"{t.target_pps / 1e3:.0f}k→{(t.achieved_pps or 0) / 1e3:.0f}k {loss}{marks}{kernel}"


def _print_run(run: dict, cells: list[dict], cis: dict, level: float) -> None:
    from rich.markup import escape
    from offlab.report import env_items
    from offlab.report.compare import emulated

    rep = run.get("repeat") or {}
    out.print(f"[bold]run {run['id']}: {escape(run['name'])}[/bold]  {run['status']}"
              + (f" ({escape(run['note'])})" if run["note"] else ""))
    out.print(f"  started {run['started_at']}, finished {run['finished_at'] or '–'}, offlab {run['offlab_version']}, "
              f"seed {run['seed']}")
    if (rep.get("until") or ("decided" if run["baseline"] else "width")) == "decided":
        rule = (f"{rep.get('min', '?')}..{rep.get('max', '?')} rounds until each comparison is decided on "
                f"{rep.get('metric', '?')} at {level:g} % over every look")
    else:
        rule = (f"{rep.get('min', '?')}..{rep.get('max', '?')} rounds until the {level:g} % interval is "
                f"≤ {rep.get('width', '?')} % of the mean")
    out.print(f"  repeat: {rule}" + (
                  f"; baseline {escape(','.join(f'{k}={v}' for k, v in run['baseline'].items()))}"
                  if run["baseline"] else ""))
    _print_emulated(emulated(run))
    facts = [(k, v) for k, v in env_items(run.get("env") or {}) if k.count(".") <= 1][:10]
    for k, v in facts:
        out.print(f"  [dim]{escape(k)}[/dim] {escape(v)}")
    _cells_table(cells, cis, level)


def _print_emulated(guests: list[str]) -> None:
    """The TCG mark, once, in bold: figures from an emulated guest give directions only."""
    from rich.markup import escape

    if guests:
        out.print(f"  [bold yellow]{TCG_MARK}[/bold yellow] (emulated: {escape(', '.join(guests))})")


def _cells_table(cells: list[dict], cis: dict, level: float) -> None:
    from rich.markup import escape
    from rich.table import Table
    from offlab.report import NO_FIGURES
    from offlab.report import format as fmt

    present = [m for m in HEADLINE if any(m in cis[c["id"]] for c in cells if c["status"] not in NO_FIGURES)]
    t = Table(box=None)
    t.add_column("cell", no_wrap=True)
    t.add_column("status")
    t.add_column("n", justify="right")
    for m in present:
        t.add_column(fmt.short(m), justify="right")
    for c in cells:
        # A failed cell shows why it failed (below), never the figures it took before failing.
        figures = ["–"] * len(present) if c["status"] in NO_FIGURES else [fmt.ci(m, cis[c["id"]].get(m))
                                                                           for m in present]
        t.add_row(escape(c["key"]), c["status"].replace("_", " "), str(c["n_samples"]), *figures)
    out.print(t)
    for c in cells:
        if c["reason"]:
            out.print(f"[yellow]{c['status'].replace('_', ' ')}[/yellow]: {escape(c['key'])}: {escape(c['reason'])}")
    out.print(f"[dim]mean ± half-width of the {level:g} % Student-t interval over n repetitions[/dim]")


def compare_cmd(
    runs: List[int] = typer.Argument(..., help="RUN_ID (each cell against its baseline cell), or RUN_A RUN_B "
                                               "[RUN_C ...] (the same cells, each against A: host pairs side by side)."),
    baseline: List[str] = typer.Option([], "--baseline", help="AXIS=VALUE, repeatable: overrides the run's "
                                                              "baseline, e.g. --baseline offload=off."),
    metric: List[str] = typer.Option([], "--metric", help="Metric to compare, repeatable (default: the headline "
                                                          "metrics)."),
    fail_if_slower: Optional[float] = typer.Option(None, "--fail-if-slower", metavar="PCT",
                                                   help="Exit 1 if throughput or pps of any cell is significantly "
                                                        "slower than its baseline by more than PCT %."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
    db: Optional[str] = db_option(),
) -> None:
    """Ratio with its confidence interval and a verdict, per cell and metric; with two runs or more, what
    changed between them (kernel, cmdline, accelerator, interfaces' offloads and MTUs, sysctls, settings
    held, versions, CPU, load), most likely cause first."""
    from rich.markup import escape
    from offlab.sample import StoredSample, records
    from offlab.report import compare

    _one_format(as_json, as_csv)
    if len(runs) >= 2 and baseline:
        raise BadInput("--baseline applies to one run; with RUN_A RUN_B every cell is compared with the same cell of A")
    if fail_if_slower is not None and fail_if_slower < 0:
        raise BadInput(f"--fail-if-slower {fail_if_slower:g}: a percentage ≥ 0")
    metrics = tuple(metric) or HEADLINE
    from offlab.report import envdiff

    problems: list[str] = []  # bad input that leaves the rest of the comparison standing: one line each, exit 2
    envs: list = []
    with _open(db) as store:
        if len(runs) == 1:
            rows = compare.compare_run(store, runs[0], compare.parse_assignments(baseline) or None, metrics)
        else:  # RUN_A RUN_B [RUN_C ...]: each against the first (e.g. the host pairs of `run --inventory`)
            known = []
            for r in runs:
                try:
                    store.get_run(r)
                    known.append(r)
                except BadInput as exc:
                    problems.append(str(exc))
            if len(known) < 2 or known[0] != runs[0]:
                raise BadInput(problems[0] if problems else "compare needs two runs")
            runs = known
            rows = compare.compare_many(store, runs, metrics)
            envs = envdiff.diffs(store, runs)
            problems += [m for d in envs for m in d.missing]
    failed = compare.fail_if_slower(rows, fail_if_slower) if fail_if_slower is not None else []
    if as_json:
        _json({"runs": runs, "rows": [r.to_dict() for r in rows],
               "environment": [d.to_dict() for d in envs],
               "trade_offs": [{"cell": g[0].cell, "baseline": g[0].baseline, "text": compare.trade_off(g)}
                              for g in compare.by_cell(rows) if compare.trade_off(g)],
               "fail_if_slower": None if fail_if_slower is None else
               {"pct": fail_if_slower, "failed": [{"cell": r.cell, "metric": r.metric, "change_pct": r.change_pct}
                                                  for r in failed]}})
    elif as_csv:
        _rows_csv(rows)
    else:
        _print_rows(rows)
        if len(runs) == 1:
            with _open(db) as store:
                print_published(store, runs[0])
        with _open(db) as store:
            for run_id in runs:  # the kernel's account beside the counters', where the run's samples took it
                accounts = [(s.sample or StoredSample()).kernel_account for s in records(store.samples(run_id))]
                if any(ka is not None and not ka.empty for ka in accounts):
                    out.print(f"\n[bold]run {run_id}[/bold]")
                    print_losses(store, run_id)
        for d in envs:
            out.print("\n" + "\n".join(escape(line) for line in envdiff.lines(d)))
    for p in dict.fromkeys(problems):
        typer.echo(f"offlab: {p}", err=True)
    if failed:
        for r in failed:
            against = r.baseline if r.run == r.baseline_run else f"run {r.baseline_run}"
            if r.change_pct is None:
                typer.echo(f"offlab: {r.cell}: failed ({r.cell_reason or 'no reason recorded'}): no {r.label} "
                           f"to compare with {against}", err=True)
                continue
            typer.echo(f"offlab: {r.cell}: {r.label} {r.change_pct:+.1f} % vs {against} "
                       f"[{r.change_low_pct:+.1f}, {r.change_high_pct:+.1f}]: slower by more than "
                       f"{fail_if_slower:g} %" + (f"; on other versions: {'; '.join(r.versions)}" if r.versions else ""),
                       err=True)
        for d in envs:  # what changed between the runs, most likely cause first
            for line in envdiff.lines(d, limit=10):
                typer.echo(f"offlab: {line}", err=True)
        # SystemExit, not typer.Exit: click's non-standalone mode (offlab.cli.main) drops typer.Exit's code.
        sys.exit(1)
    if problems:
        sys.exit(2)


CSV_FIELDS = ("run", "baseline_run", "cell", "baseline", "metric", "unit", "better", "level", "n_baseline",
              "mean_baseline", "n_cell", "mean_cell", "ratio", "low", "high", "change_pct", "change_low_pct",
              "change_high_pct", "diff", "diff_low", "diff_high", "verdict", "rule", "pairs", "flags", "cell_status",
              "cell_reason", "versions")


def _rows_csv(rows) -> None:
    w = csv.DictWriter(sys.stdout, CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        d = r.to_dict()
        d["flags"] = "; ".join(r.flags)
        d["versions"] = "; ".join(r.versions)
        w.writerow({k: "" if d.get(k) is None else d[k] for k in CSV_FIELDS})


TONE = {True: "green", False: "red"}
COLUMNS = (("metric", 15, "left"), ("baseline", 12, "right"), ("cell", 12, "right"), ("change [CI]", 24, "right"),
           ("verdict", 25, "left"))


def _print_rows(rows) -> None:
    """Per compared cell a title line and its metrics; cells that could not be compared below."""
    from rich.markup import escape
    from rich.table import Table
    from offlab.report import compare
    from offlab.report import format as fmt
    from offlab.stats import is_improvement

    if any(TCG_MARK in r.flags for r in rows):
        out.print(f"[bold yellow]{TCG_MARK}[/bold yellow] (a guest of these runs ran emulated)")
        rows = [dataclasses.replace(r, flags=[f for f in r.flags if f != TCG_MARK]) for r in rows]
    groups = compare.by_cell(rows)
    shown = [g for g in groups if compare.any_compared(g)]
    aside = [g for g in groups if not compare.any_compared(g)]
    common = {id(g[0]): [f for f in g[0].flags if all(f in r.flags for r in g)] for g in shown}
    with_notes = any(f not in common[id(g[0])] for g in shown for r in g for f in r.flags)
    for gi, g in enumerate(shown):
        r0 = g[0]
        if r0.run != r0.baseline_run:
            title = f"[bold]{escape(r0.cell)}[/bold]: run {r0.run} vs run {r0.baseline_run}"
        else:
            mine, theirs, shared = compare.difference(r0.params, r0.baseline_params)
            title = (f"{escape(shared)}: " if shared else "") + f"[bold]{escape(mine)}[/bold] vs {escape(theirs)}"
        flags = "".join(f"  [yellow]⚠ {escape(f)}[/yellow]" for f in common[id(r0)])
        both = compare.trade_off(g)
        flags += f"  [bold yellow]{escape(both)}[/bold yellow]" if both else ""
        flags += "".join(f"  [cyan]{escape(r.published)} ({escape(fmt.short(r.metric))}, published)[/cyan]"
                         for r in g if r.published)
        out.print(("\n" if gi else "") + title + flags)
        if r0.versions:  # ran on other guest kernels or QEMUs: named before any figure
            out.print(f"  [bold]on other versions[/bold]: {escape('; '.join(r0.versions))}")
        t = Table(box=None, show_header=gi == 0, padding=(0, 1))
        for name, width, justify in COLUMNS:
            t.add_column(name.replace("CI", f"{r0.level:g} % CI"), min_width=width, justify=justify)
        if with_notes:
            t.add_column("notes")
        for r in g:
            colour = TONE.get(is_improvement(r.verdict))
            verdict = f"[{colour}]{r.verdict}[/{colour}]" if colour else r.verdict
            cells = [fmt.short(r.metric), fmt.value(r.metric, r.mean_baseline), fmt.value(r.metric, r.mean_cell),
                     fmt.change(r), verdict]
            if with_notes:
                cells.append(f"[yellow]{escape('; '.join(f for f in r.flags if f not in common[id(r0)]))}[/yellow]")
            t.add_row(*cells)
        out.print(t)
    if shown:
        ns = sorted({f"{r.n_baseline}/{r.n_cell}" for g in shown for r in g})
        out.print(f"\n[dim]n (baseline/cell): {', '.join(ns)}. Verdicts:[/dim]")
        for line in compare.rule_lines([r for g in shown for r in g]):
            out.print(f"[dim]  {escape(line)}[/dim]")
    else:
        out.print("nothing to compare: no cell has measured values on both sides")
    for g in aside:
        r0 = g[0]
        why = r0.cell_reason if r0.verdict in (compare.SKIPPED, compare.FAILED) else r0.baseline_reason \
            if r0.verdict in (compare.BASELINE_SKIPPED, compare.BASELINE_FAILED) else "; ".join(r0.flags)
        out.print(f"[yellow]{r0.verdict}[/yellow]: {escape(r0.cell)}"
                  + (f" (baseline {escape(r0.baseline)})" if r0.baseline else "")
                  + (f": {escape(why)}" if why else ""))


def report_cmd(
    run_id: int = typer.Argument(..., help="A run id (offlab results list)."),
    output: Path = typer.Option(..., "-o", "--output", help="HTML file to write."),
    baseline: List[str] = typer.Option([], "--baseline", help="AXIS=VALUE, repeatable: compare against this "
                                                              "instead of the run's baseline."),
    db: Optional[str] = db_option(),
) -> None:
    """One self-contained HTML report (charts inline, opens offline)."""
    from offlab import report
    from offlab.report import compare

    with _open(db) as store:
        path = report.write_report(store, run_id, output, baseline=compare.parse_assignments(baseline) or None)
    typer.echo(f"wrote {path} ({path.stat().st_size // 1024} KiB): open file://{path.resolve()}")
