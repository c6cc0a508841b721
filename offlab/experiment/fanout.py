"""`offlab run PLAN --inventory FILE`: one plan on several SSH host pairs at once.

    pair 1: a:t1 ─ b:t1   ─┐
    pair 2: c:p0 ─ d:p0   ─┼─ one `hosts` lab each, one runner process each (one cell per pair at a time)
    pair 3: e:p0 ─ f:p0   ─┘   → one run per pair in one database, its name tagged "@ PAIR"

Each pair's runner is its own process (`python -m offlab.experiment.fanout child ...`): a runner
owns its signals, its journal and its SSH masters, and one pair failing (a host that died) stops
only that pair. The labs are made before and removed after, by this process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from offlab.state import private_tmp
from offlab import inventory as inv_mod
from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import BadInput, OfflabError
from offlab.hosts import LOCAL
from offlab.interrupts import protected
from offlab.lab import hosts as hosts_lab
from offlab.catalog import PAIR_TOPOLOGIES

TAG = " @ "  # run name = "<plan name> @ <pair>"


@dataclass
class PairRun:
    pair: str
    lab: str
    run_id: int | None = None
    rc: int | None = None
    error: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def pair_of(run_name: str) -> str | None:
    """The pair a fan-out run was tagged with, from its name."""
    return run_name.rsplit(TAG, 1)[1] if TAG in run_name else None


def check_plan(plan) -> None:
    """A plan for host pairs: one client─server lab whose topology nothing varies (the hosts are as they are)."""
    kinds = {c.topology.kind for c in plan.cells}
    keys = {c.lab_key for c in plan.cells}
    if not kinds <= set(PAIR_TOPOLOGIES) or len(keys) != 1:
        raise BadInput(f"{plan.source}: a plan run with --inventory runs on two existing hosts (client, server): "
                       f"its topology must be `kind: {' or '.join(PAIR_TOPOLOGIES)}` and the same in every cell (found "
                       f"{', '.join(sorted(kinds))}{'' if len(keys) == 1 else ' varying'}); vary mtu as a setting "
                       f"of client:to-server instead")


def fan_out(plan_path: str, inventory: str, db: str, pairs: list[str] | None = None, *, quick: bool = False,
            trace: bool = False, on_line: Callable[[str], None] = lambda line: None) -> list[PairRun]:
    """Run the plan on every pair at once; a PairRun per pair (run id, or the error that stopped it).
    `trace`: every stream sample takes the kernel's account on the pair's hosts (--trace)."""
    from offlab.experiment.plan import load_plan_file

    plan = load_plan_file(plan_path, quick=quick)
    check_plan(plan)
    inv = inv_mod.load(inventory)
    pairs = list(pairs or inv_mod.pairs_of(inv))
    for pair in pairs:
        inv_mod.parse_pair(pair, inv)  # every pair checked before anything connects
    prefix = os.environ.get("OFFLAB_LAB_PREFIX") or f"x{os.getpid() % 100000}"
    runs = [PairRun(pair, f"{prefix}f{i}"[:15]) for i, pair in enumerate(pairs)]
    # The database made (schema and all) before the runners start: several runners creating one new
    # SQLite file at once raced, one finding the others' half-made schema ("not offlab's").
    from offlab.store import Store

    Store.open(db).close()
    made: list[str] = []
    try:
        for r in runs:
            on_line(f"lab up hosts {r.lab}: {r.pair}")
            hosts_lab.up(r.lab, inventory, r.pair)
            made.append(r.lab)
        _run_children(runs, plan_path, db, quick, on_line, trace=trace)
    finally:
        for name in made:
            try:
                for line in teardown.down(name, force=True):
                    on_line(f"lab down {name}: {line}")
            except OfflabError as exc:
                on_line(f"lab down {name}: {exc}")
    return runs


def _run_children(runs: list[PairRun], plan_path: str, db: str, quick: bool, on_line: Callable[[str], None], *,
                  trace: bool = False) -> None:
    with private_tmp("fanout") as tmp:
        procs = []
        for i, r in enumerate(runs):
            argv = [sys.executable, "-m", "offlab.experiment.fanout", "child", "--lab", r.lab, "--pair", r.pair,
                    "--db", db, "--plan", os.path.abspath(plan_path)] + (["--quick"] if quick else []) \
                + (["--trace"] if trace else [])
            out, err = open(Path(tmp) / f"{i}.out", "w+"), open(Path(tmp) / f"{i}.err", "w+")
            procs.append((r, LOCAL.spawn(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL), out, err))
        try:
            while any(p.poll() is None for _, p, _, _ in procs):
                time.sleep(0.2)
        except BaseException:
            # A Ctrl-C from the terminal reached the children too; a SIGTERM or SIGHUP sent to this
            # pid alone did not: pass it on (a second one to a child waits for its restore).
            for _, p, _, _ in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            raise
        finally:
            _collect(procs, on_line)


@protected  # a second signal must not leave a child unwaited for, its lab up
def _collect(procs: list, on_line: Callable[[str], None]) -> None:
    """Wait for each child (interrupted: they restore and stop), then read what it said."""
    for r, p, out, err in procs:
        if p.poll() is None:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        r.rc = p.returncode
        out.seek(0)
        err.seek(0)
        note = None
        for line in out.read().splitlines():
            if line.startswith("{"):
                r.run_id = json.loads(line).get("run_id")
                note = json.loads(line).get("leases")
        lines = [l for l in err.read().splitlines() if l.strip()]
        # The error (its child prints it on one line), not a lease's word on a renewal said after it
        # (offlab.hosts.lease, at exit) nor a fragment of a command quoted in a traceback-free message
        errors = [l for l in lines if l.startswith("offlab: error: ")] or \
            [l for l in lines if not l.startswith("offlab: lease on ")] or lines
        r.error = errors[-1] if r.rc != 0 and errors else ""
        out.close()
        err.close()
        on_line(f"{r.pair}: " + (f"run {r.run_id} done" if r.rc == 0 else f"failed (exit {r.rc}): {r.error}"
                                 + (f" (samples kept in run {r.run_id})" if r.run_id is not None else ""))
                + (f"; {note}" if note else ""))


def _child(argv: list[str]) -> int:
    """One pair's runner: the plan on an existing lab, the run named after the pair."""
    import argparse

    from offlab.experiment.plan import load_plan_file
    from offlab.experiment.runner import Runner
    from offlab.store import Store

    ap = argparse.ArgumentParser(prog="offlab.experiment.fanout child")
    for opt in ("--lab", "--pair", "--db", "--plan"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trace", action="store_true")
    a = ap.parse_args(argv)
    run_id = None
    try:
        plan = load_plan_file(a.plan, quick=a.quick)
        plan = dataclasses.replace(plan, name=f"{plan.name}{TAG}{a.pair}", trace=plan.trace or a.trace)
        runner = Runner(plan, Store.open(a.db), lab=labs.LabState.load(a.lab))
        try:
            run_id = runner.run()
        finally:
            run_id = runner.run_id
            from offlab.hosts import lease

            print(json.dumps({"run_id": run_id, "pair": a.pair, "leases": lease.renewal_note()}), flush=True)
    except OfflabError as exc:
        print("offlab: error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever it quotes
        return exc.exit_code
    except KeyboardInterrupt:
        print("offlab: interrupted: settings restored", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["child"]:
        raise SystemExit("internal entry point of `offlab run --inventory`")
    from offlab.interrupts import keep_for_life

    try:
        raise SystemExit(_child(sys.argv[2:]))
    finally:
        keep_for_life()
