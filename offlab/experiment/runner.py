"""The matrix runner: rounds of shuffled cells until each comparison with the baseline is decided
(offlab.experiment.decide), or, in a plan without a baseline, until each cell's interval is narrow.

Inside a round the cells run in a shuffled order (seeded, recorded), so the slow
drift of a noisy machine spreads over every cell instead of biasing one. One
journalled transaction is open for the whole run: before each sample it moves the
cell's lab (and the machine) from the previous cell's settings to this cell's,
restoring and setting only what differs and reading each back (an impossible
setting skips the cell with its reason); the sample is committed to SQLite the
moment it exists; everything is restored when the run ends, however it ends.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.errors import BadInput, CannotTestHere, EnvironmentProblem, NotRoot, OfflabError
from offlab.experiment import decide
from offlab.experiment.decide import Decider
from offlab.experiment.env import environment
from offlab.experiment.plan import Cell, Plan, RepeatSpec, load_plan
from offlab.experiment.search import parse_pps, zero_loss_search
from offlab.hosts import LOCAL, is_root
from offlab.interrupts import interrupts, protected, shielded
from offlab.knobs import Change, Terminated, Transaction, knob_for
from offlab.knobs.lease import Lease, take
from offlab.knobs.target import target_for
from offlab.lab.model import LabState
from offlab.experiment.measure import CaptureRequest, measure, measure_rr, measure_rr_under_load
from offlab.lab.hold import Hold
from offlab.metrics import metrics_of
from offlab.sample import GuestBoot, Held, KnobOutcome, StoredSample, records
from offlab.state import FlockFile, me
from offlab.stats import UNDECIDED, converged
from offlab.store import Store

SYSCTL_PREFIXES = ("net.", "kernel.", "vm.")
TESTPMD_PREFIX = "testpmd."


@dataclass
class CellState:
    cell: Cell
    cell_id: int
    status: str = "pending"  # pending | done | confidence_not_reached | skipped
    reason: str | None = None
    rounds_done: set[int] = field(default_factory=set)
    values: list[float] = field(default_factory=list)
    history: list[tuple[int, float]] = field(default_factory=list)  # (round, value of repeat.metric)

    @property
    def active(self) -> bool:
        return self.status == "pending"


class Interrupted(Exception):
    pass


class RunBusy(EnvironmentProblem):
    """Another live process is writing this run."""


class LabRemoved(EnvironmentProblem):
    """A lab of the run vanished while a cell was measured in it."""


def run_lock(store: Store, run_id: int) -> FlockFile:
    """The one-writer lock of a run: an flock beside an SQLite database, dropped by the kernel when its
    holder dies; in PostgreSQL an advisory lock on a connection of its own, dropped by the server.

    With the database (not in the state directory) because two state directories, or two machines,
    may share one database, and it is the database's run that must have one writer.
    """
    lock = store.run_lock(run_id)
    holder = lock.acquire({**me(), "run": run_id})
    if holder is not None:
        pid = holder.get("pid", "?")
        raise RunBusy(f"run {run_id} is running as pid {pid}: wait for it to finish, or stop it "
                      f"(kill -INT {pid}) and then `offlab run --resume {run_id}`")
    return lock


class Runner:
    def __init__(self, plan: Plan, store: Store, *, run_id: int | None = None,
                 on_event: Callable[[str, dict], None] | None = None, lab: LabState | None = None) -> None:
        self.plan, self.store = plan, store
        self.given_lab = lab  # a lab that exists already (fan-out over SSH host pairs): used, never removed
        self.run_id = run_id
        self.on_event = on_event or (lambda kind, info: None)
        self.labs: dict[str, LabState] = {}
        self.seed = plan.seed if plan.seed is not None else random.randrange(2**31)
        self.cells: list[CellState] = []
        self.lock: FlockFile | None = None
        self.holds: list[Hold] = []
        self.leases: list[Lease] = []
        # Cells whose guests differ in boot-time QEMU properties: one guest lab up at a time (see _lab_for).
        self.one_guest_at_a_time = False
        self.guest_boots: list[GuestBoot] = []
        self.tx: Transaction | None = None  # the run's settings, moved from cell to cell (_sample_in)
        self.decider: Decider | None = None
        self.decisions: list[dict] = []  # every comparison's outcome, once the run ends
        self.started: float | None = None  # the budget's clock: from run(), so guest boots count
        self.cannot_run: dict[str, str] = {}  # lab_key → why its guests cannot run here (cells skipped)

    # ---- entry points -------------------------------------------------
    @classmethod
    def resume(cls, store: Store, run_id: int, **kw) -> "Runner":
        run = store.get_run(run_id)
        if run["status"] == "done":
            raise BadInput(f"run {run_id} is complete: nothing to resume (offlab results show {run_id})")
        lock = run_lock(store, run_id)  # before reading its samples: a live writer would add more
        try:
            plan = load_plan(run["plan_text"], f"run {run_id} plan")
            plan.repeat = RepeatSpec(**run["repeat"])
        except BaseException:
            lock.release()
            raise
        self = cls(plan, store, run_id=run_id, **kw)
        self.seed = run["seed"]
        # a run started with --trace goes on taking the kernel's account (the plan as run is stored)
        self.plan.trace = plan.trace or bool((run.get("plan") or {}).get("trace"))
        self.lock = lock
        return self

    def run(self) -> int:
        if not is_root():
            raise NotRoot("running an experiment")
        with interrupts():
            return self._run()

    def _run(self) -> int:
        self.started = time.monotonic()
        try:
            self._build_labs()
            self._open_run()
            self._lease_machine_settings()
            with Transaction(label=f"run {self.run_id} ({self.plan.name})") as self.tx:
                self._rounds()
            return self.run_id
        except (KeyboardInterrupt, Interrupted, Terminated):  # Terminated: SIGTERM or SIGHUP
            with shielded():  # a second signal waits until the run is marked resumable
                if self.run_id is not None:
                    self.store.set_run_status(self.run_id, "interrupted",
                                              f"interrupted; resume with `offlab run --resume {self.run_id}`")
                self.on_event("interrupted", {"run_id": self.run_id})
            raise KeyboardInterrupt from None
        except LabRemoved as exc:
            self.store.set_run_status(self.run_id, "interrupted", str(exc))
            self.on_event("interrupted", {"run_id": self.run_id})
            raise
        except BaseException as exc:
            if self.run_id is not None:
                # Why it failed goes into the store, so `results list` says it, not only this terminal.
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self._set_status_quietly("failed", f"{type(exc).__name__}: {why}" if why else type(exc).__name__)
            raise
        finally:
            self._finish()

    @protected  # a second Ctrl-C, or one in the instant the run ends, must not leave a lab half removed
    def _finish(self) -> None:
        """The run's leases and holds given back, the labs it made taken down, its lock released."""
        self.tx = None
        for lease in self.leases:
            lease.release()
        for h in self.holds:
            h.release()
        for lab in self.labs.values():
            if lab is not self.given_lab:
                teardown.down(lab.name, force=True)
        if self.lock is not None:
            self.lock.release()

    def _set_status_quietly(self, status: str, note: str) -> None:
        """Record a failure without hiding it behind a second one (a read-only or full database)."""
        try:
            self.store.set_run_status(self.run_id, status, note)
        except OfflabError:
            pass

    # ---- steps ---------------------------------------------------------
    def _build_labs(self) -> None:
        """One lab per distinct topology the cells need, all up for the whole run; but guests that
        differ in boot-time properties run one at a time (each idle TCG guest would eat CPU)."""
        if self.given_lab is not None:
            self.labs = {c.lab_key: self.given_lab for c in self.plan.cells}
            self.holds.append(Hold(self.given_lab.name, self._what()))
            return
        keys = list(dict.fromkeys(c.lab_key for c in self.plan.cells))
        self.one_guest_at_a_time = len(keys) > 1 and all(c.topology.kind in labs.GUEST_TOPOLOGIES
                                                         for c in self.plan.cells)
        self.cannot_run = {k: why for k in keys if (why := _cannot_run(self.plan, k)) is not None}
        keys = [k for k in keys if k not in self.cannot_run]
        for key in keys[:1] if self.one_guest_at_a_time else keys:
            self._lab_up(key)

    def _lab_up(self, key: str) -> LabState:
        # OFFLAB_LAB_PREFIX lets parallel sessions (and tests) keep their labs apart.
        prefix = os.environ.get("OFFLAB_LAB_PREFIX") or f"x{os.getpid() % 100000}"
        i = list(dict.fromkeys(c.lab_key for c in self.plan.cells)).index(key)
        topo = next(c.topology for c in self.plan.cells if c.lab_key == key)
        options = {k: v for k, v in (("underlay_mtu", topo.underlay_mtu), ("vni", topo.vni),
                                     ("port", topo.port), ("nic", topo.nic or None), ("guest_cpus", topo.guest_cpus),
                                     ("kernel_version", topo.kernel_version), ("qemu", topo.qemu), ("pmd", topo.pmd),
                                     ("testpmd_idle", topo.testpmd_idle),
                                     ("ports", list(topo.ports) if topo.ports else None)) if v is not None}
        self.on_event("lab", {"topology": topo.kind, "mtu": topo.mtu})
        self.labs[key] = labs.up(topo.kind, f"{prefix}{chr(97 + i)}", mtu=topo.mtu, ipv6=topo.ipv6,
                                 options=options)
        # Held for the whole run: `lab down` in this state dir refuses it (naming us) unless --force.
        self.holds.append(Hold(self.labs[key].name, self._what()))
        if topo.kind in labs.GUEST_TOPOLOGIES:
            self.guest_boots.append(GuestBoot.keyed(boot=len(self.guest_boots) + 1, lab=self.labs[key].name,
                                                    nic=dict(topo.nic), guest_cpus=topo.guest_cpus))
        return self.labs[key]

    def _lab_for(self, key: str) -> LabState:
        """The cell's lab; with one guest at a time, the guest up now is replaced (a restart, recorded)."""
        if key in self.labs:
            return self.labs[key]
        for old in list(self.labs):
            with shielded():  # the guest up now goes whole (settings, hold, lab) before a signal acts
                lab = self.labs.pop(old)
                if self.tx is not None:  # its settings go back while its hosts still exist
                    self.tx.release_scope(_in_lab(lab.name))
                for h in [h for h in self.holds if h.path.name.startswith(f"{lab.name}.hold-")]:
                    h.release()
                    self.holds.remove(h)
                teardown.down(lab.name, force=True)
        lab = self._lab_up(key)
        self.on_event("restart", {"boots": len(self.guest_boots), "lab": lab.name})
        return lab

    def _order(self, order: list[CellState], rnd: int) -> list[CellState]:
        """The round's shuffled order; with one guest at a time, grouped by guest, the one up now first,
        so each guest boots at most once a round."""
        random.Random(self.seed * 1009 + rnd).shuffle(order)
        return self._by_guest(order)

    def _by_guest(self, order: list[CellState]) -> list[CellState]:
        """With one guest at a time, the cells grouped by guest, the one up now first (each group in
        the order given), so each guest boots at most once a round; else the order as given."""
        if not self.one_guest_at_a_time:
            return order
        keys = list(dict.fromkeys(c.cell.lab_key for c in order))
        keys.sort(key=lambda k: k not in self.labs)  # stable: the rest keep their shuffled order
        return [c for k in keys for c in order if c.cell.lab_key == k]

    def _lease_machine_settings(self) -> None:
        """Hold every machine-wide setting the plan changes for the whole run, not only per sample:
        another run must not change it between two of our samples, nor we between two of its."""
        keys = sorted({k for c in self.plan.cells for t, k, _ in c.changes if t.partition(":")[0] == "machine"})
        for key in keys:
            knob = knob_for(target_for(LOCAL, None, needs_iface=False), key)
            self.leases.append(take(knob, f"run {self.run_id} ({self.plan.name})"))

    def _what(self) -> str:
        return f"run {self.run_id}" if self.run_id is not None else "an offlab run (starting)"

    def _open_run(self) -> None:
        cells = [{"key": c.key, "params": c.params, "settings": c.settings()} for c in self.plan.cells]
        if self.run_id is None:
            env = environment(self.plan, list(self.labs.values()))
            # a signal while the run is stored waits until the run knows its id, so it is marked interrupted
            with shielded():
                self.run_id = self.store.create_run(self.plan.name, self.plan.text, self.plan.to_dict(), self.seed,
                                                    env, self.plan.baseline, self.plan.repeat.model_dump())
                self.lock = run_lock(self.store, self.run_id)
        else:
            self.store.set_run_status(self.run_id, "running", "resumed")
        for h in self.holds:
            h.update(self._what())
        ids = self.store.add_cells(self.run_id, cells)
        known = {c["id"]: c for c in self.store.cells(self.run_id)}
        samples = records(self.store.samples(self.run_id))
        metric = self.plan.repeat.metric
        for cell in self.plan.cells:
            cs = CellState(cell, ids[cell.key])
            row = known.get(cs.cell_id, {})
            if row.get("status") in ("done", "confidence_not_reached", "skipped"):
                cs.status, cs.reason = row["status"], row.get("reason")
            elif cell.lab_key in self.cannot_run:
                cs.status, cs.reason = "skipped", f"cannot test here: {self.cannot_run[cell.lab_key]}"
                self.store.set_cell_status(cs.cell_id, "skipped", cs.reason)
            for s in samples:
                if s.cell_id == cs.cell_id:
                    cs.rounds_done.add(s.round)
                    if metric in s.metrics:
                        cs.values.append(s.metrics[metric])
                        cs.history.append((s.round, s.metrics[metric]))
            self.cells.append(cs)
        self.on_event("run", {"run_id": self.run_id, "cells": len(self.cells), "seed": self.seed})
        for cs in self.cells:
            if cs.cell.lab_key in self.cannot_run and cs.status == "skipped":
                self.on_event("skipped", {"cell": cs.cell.key, "reason": cs.reason})

    def _rounds(self) -> None:
        if self.plan.repeat.rule(self.plan.baseline is not None) == "decided":
            self._rounds_until_decided()
            return
        rep, started = self.plan.repeat, self._budget_start()
        for rnd in range(rep.max):
            order = [c for c in self.cells if c.active]
            if not order:
                break
            order = self._order(order, rnd)
            self.on_event("round", {"round": rnd, "cells": len(order)})
            for cs in order:
                if rnd in cs.rounds_done or not cs.active:
                    continue
                if self._over_budget(started):
                    self.store.set_run_status(self.run_id, "budget_exhausted",
                                              f"time budget of {self.plan.budget_s:g} s used up")
                    self.on_event("budget", {"run_id": self.run_id})
                    return
                self._sample(cs, rnd)
            for cs in self.cells:
                if cs.active:
                    self._judge(cs, rep)
        self.store.set_run_status(self.run_id, "done")
        self.on_event("done", {"run_id": self.run_id})

    def _rounds_until_decided(self) -> None:
        """Rounds until every comparison is decided, `repeat.max` rounds, or the budget is spent."""
        rep, started = self.plan.repeat, self._budget_start()
        self.decider = dec = Decider(self.plan, self.cells)
        for rnd in range(rep.max):
            order = self._by_guest(dec.order(rnd, self.seed))  # a guest boot costs more than any sample
            if not order:
                break
            order = [cs for cs in order if rnd not in cs.rounds_done]  # measured before a resume
            self.on_event("round", {"round": rnd, "cells": len(order)})
            for position, cs in enumerate(order):
                if not cs.active:
                    continue
                if self._over_budget(started, dec.expected_seconds(cs)):
                    why = f"time budget of {self.plan.budget_s:g} s used up"
                    self._conclude(why)
                    self.store.set_run_status(self.run_id, "budget_exhausted", why)
                    self.on_event("budget", {"run_id": self.run_id})
                    return
                t0 = time.monotonic()
                steal = self._sample(cs, rnd, position)
                dec.record(cs, time.monotonic() - t0, steal)
            dec.refresh()
            self.on_event("decisions", {"round": rnd, "comparisons": dec.summary()})
        self._conclude(f"{rep.max} rounds")
        self.store.set_run_status(self.run_id, "done", self._note())
        self.on_event("done", {"run_id": self.run_id})

    def _over_budget(self, started: float, next_sample_s: float = 0.0) -> bool:
        """The budget is spent, or the next sample (as long as this cell's took so far) would end
        beyond it: a budget bounds the run's wall time rather than when its last sample starts."""
        budget = self.plan.budget_s
        return bool(budget) and time.monotonic() - started + next_sample_s > budget

    def _budget_start(self) -> float:
        """The instant the budget counts from: the start of run(), before the first lab (a guest boot
        is 10-100 s of the budget a user sets), or now for a caller that skips run()."""
        return self.started if self.started is not None else time.monotonic()

    def _conclude(self, why: str) -> None:
        """Each cell's status from its comparisons: decided → done, else confidence not reached
        with what it would still need."""
        dec = self.decider
        dec.refresh()
        self.decisions = dec.summary()
        for d in self.decisions:
            cs = next(c for c in self.cells if c.cell.key == d["cell"])
            if not cs.active:
                continue
            decided = d["verdict"] != UNDECIDED
            cs.status, cs.reason = ("done" if decided else "confidence_not_reached"), decide.reason(d)
            if not decided and (d["needs_minutes"] is None or d["needs_floor"]):
                cs.reason += f"; stopped: {why}"
            self.store.set_cell_status(cs.cell_id, cs.status, cs.reason)
        for cs in self.cells:
            if cs.active and cs.rounds_done:
                cs.status = "done"
                self.store.set_cell_status(cs.cell_id, "done", None)

    def _note(self) -> str:
        head = [d for d in self.decisions if d["headline"] and not d["moot"]]
        decided = sum(d["verdict"] != UNDECIDED for d in head)
        return f"{decided} of {len(head)} headline comparisons decided"

    def _judge(self, cs: CellState, rep: RepeatSpec) -> None:
        n = len(cs.values)
        if n >= rep.min and converged(cs.values, rep.level, rep.width):
            cs.status = "done"
        elif n >= rep.max:
            cs.status = "confidence_not_reached"
            cs.reason = (f"±{rep.width / 2:g} % at {rep.level:g} % confidence not reached "
                         f"in {n} repetitions")
        else:
            return
        self.store.set_cell_status(cs.cell_id, cs.status, cs.reason)

    def _sample(self, cs: CellState, rnd: int, position: int | None = None) -> float | None:
        """Measure one sample of a cell; returns the CPU steal % of its window where measured."""
        cell, lab = cs.cell, self._lab_for(cs.cell.lab_key)
        self.on_event("sample", {"cell": cell.key, "round": rnd})
        try:
            return self._sample_in(cs, rnd, lab, position)
        except CannotTestHere as exc:  # e.g. the engine's io_uring send paths where io_uring is disabled
            cs.status, cs.reason = "skipped", f"cannot test here: {exc}"
            self.store.set_cell_status(cs.cell_id, "skipped", cs.reason)
            self.on_event("skipped", {"cell": cell.key, "reason": cs.reason})
            return None
        except (OfflabError, OSError, ValueError, KeyError):
            gone = labs.removed(lab)
            if gone is None:
                raise
            cs.status, cs.reason = "interrupted", f"interrupted: lab removed ({gone})"
            self.store.set_cell_status(cs.cell_id, "interrupted", cs.reason)
            self.on_event("skipped", {"cell": cell.key, "reason": cs.reason})
            raise LabRemoved(f"run {self.run_id}: lab {lab.name} was removed while cell {cell.key} ran "
                             f"({gone}); the samples measured so far are kept: "
                             f"`offlab run --resume {self.run_id}` continues") from None

    def _sample_in(self, cs: CellState, rnd: int, lab: LabState, position: int | None = None) -> float | None:
        cell, tx = cs.cell, self.tx
        assert tx is not None, "a sample is taken inside the run's transaction"
        changes = [self._change(lab, t, k, v) for t, k, v in cell.changes]
        scope = _in_lab(lab.name)
        before = dict(tx.counts)
        outcomes = tx.switch(changes, scope)
        writes = {k: tx.counts[k] - before[k] for k in tx.counts}
        self.on_event("knobs", {"cell": cell.key, "round": rnd, **writes})
        impossible = [o for o in outcomes if not o.ok]
        if impossible:
            reason = "; ".join(_with_chain(lab, o) for o in impossible)
            cs.status, cs.reason = "skipped", f"cannot test here: {reason}"
            self.store.set_cell_status(cs.cell_id, "skipped", cs.reason)
            self.on_event("skipped", {"cell": cell.key, "reason": cs.reason})
            return None
        w = cell.workload.traffic(ipv6=cell.topology.ipv6)
        cap = None
        if self.plan.capture and (self.plan.capture.rounds == "all" or rnd == 0):
            c = self.plan.capture
            cap = CaptureRequest(c.host, c.iface, c.frames)
        spec = cell.workload
        if spec.kind == "rr":
            sample = measure_rr(lab, spec.rr_workload(ipv6=cell.topology.ipv6), big_packets=spec.big_packets,
                                trace=self.plan.trace)
        elif spec.kind == "rr-under-load":
            sample = measure_rr_under_load(lab, w, spec.rr_workload(ipv6=cell.topology.ipv6), cap,
                                           trace=self.plan.trace)
        elif spec.search_max_loss is not None:
            sample = zero_loss_search(lab, w, spec.search_max_loss, parse_pps(spec.search_low),
                                      parse_pps(spec.search_high), spec.search_steps, cap, trace=self.plan.trace)
        else:
            # the cell's settings as they read back: each gets an effect witness over the sample's counters
            held = [Held(where=o.where, key=o.change.key, value=o.actual) for o in outcomes if o.ok]
            if cell.topology.mtu > 1500:  # a jumbo lab: its MTU is a setting the cell varies too
                held.append(Held(where=f"lab {lab.name} (topology mtu)", key="mtu", value=str(cell.topology.mtu)))
            sample = measure(lab, w, cap, settings=held, trace=self.plan.trace)
        broken = _broken_path(sample)
        if broken is not None:
            cs.status, cs.reason = "failed", broken
        knobs = [o.to_dict() for o in outcomes]  # requested against actual, also the store's own column
        # which boot of the guest took it, and how many boots the run has made so far
        boot = next(b for b in reversed(self.guest_boots) if b.lab == lab.name).plus(
            boots_so_far=len(self.guest_boots)) if self.guest_boots else None
        # in force: read again at the end of the window, the values really in force while it was measured
        as_run(sample, tx.in_force(scope), writes, knobs, boot, position)
        metrics = metrics_of(sample)
        self.store.add_sample(self.run_id, cs.cell_id, rnd, sample.to_json(), metrics, knobs)
        cs.rounds_done.add(rnd)
        if cs.status == "failed":
            self.store.set_cell_status(cs.cell_id, "failed", cs.reason)
            self.on_event("skipped", {"cell": cell.key, "reason": cs.reason})
        if self.plan.repeat.metric in metrics:
            cs.values.append(metrics[self.plan.repeat.metric])
            cs.history.append((rnd, metrics[self.plan.repeat.metric]))
        rep = self.plan.repeat
        remaining = sum(max(rep.min - len(c.rounds_done), 0) for c in self.cells if c.active)
        self.on_event("sampled", {"cell": cell.key, "round": rnd, "metrics": metrics, "remaining_min": remaining})
        system = sample.probes.cpu.system
        return system.steal_pct if system is not None else None

    @staticmethod
    def _change(lab: LabState, target: str, key: str, value) -> Change:
        role, _, ref = target.partition(":")
        if isinstance(value, bool):
            value = "on" if value else "off"
        if role == "machine":
            if not key.startswith(SYSCTL_PREFIXES):
                raise BadInput(f"'machine' takes host-wide sysctls only, not {key!r}")
            return Change(host=LOCAL, key=key, value=value)
        host = lab.host(role)
        if key.startswith(SYSCTL_PREFIXES) or key.startswith(TESTPMD_PREFIX):  # no interface: the host's own
            return Change(host=host, key=key, value=value, lab=lab)
        return Change(host=host, key=key, value=value, iface=lab.resolve_iface(role, ref or None), lab=lab)


def as_run(sample: StoredSample, in_force: list[dict], knob_writes: dict[str, int], knobs: list[dict],
           guest_boot: GuestBoot | None, position: int | None) -> StoredSample:
    """What a run adds to its sample: the settings in force at its end, the knobs' writes for it (journalled
    and set, restored, kept from the previous cell), its cell's settings made (offlab.knobs' outcomes),
    the guest boot that took it (a run that boots guests) and where in its round it ran (the interleaving)."""
    sample.in_force = [Held.from_json(h) for h in in_force]
    sample.knob_writes = knob_writes
    sample.knobs = [KnobOutcome.from_json(k) for k in knobs]
    sample.guest_boot = guest_boot
    sample.round_position = position
    return sample


def _broken_path(sample: StoredSample) -> str | None:
    """Why the sample proves its path broken (its cell then fails), or None."""
    if sample.traffic.throughput_bps == 0:
        return ("no data crossed the path (throughput 0): the path is broken, "
                "e.g. an MTU lowered on one hop drops every full-size frame")
    if sample.rr and sample.rr.idle and sample.rr.idle.transactions == 0:
        return "no request/response transaction was answered: the path or the peer is down"
    return None


def _cannot_run(plan: Plan, key: str) -> str | None:
    """Why the guests of the cells with lab `key` cannot run here, or None: a virtio-net property
    their QEMU does not have (QEMU 7.2 has no host_uso), a QEMU and guest kernel seen not to boot
    together (qemus.UNBOOTABLE). Their cells are skipped with it; the QEMU is fetched first if it
    is not cached."""
    from offlab.lab.vm import check_boots, guest_roles, kernel_for
    from offlab.vm import qemu, qemus

    topo = next(c.topology for c in plan.cells if c.lab_key == key)
    if topo.kind not in labs.GUEST_TOPOLOGIES or topo.qemu is None:
        return None
    for role in guest_roles(topo.kind):
        q = qemus.resolve(kernel_for(topo.qemu, role))
        try:
            qemu.Nic.from_options("tap0", "52:54:00:00:00:00", dict(topo.nic), q)
        except qemu.PropertyMissing as exc:
            return f"{role}: QEMU {q.version} has no property {exc.prop} (its guest cannot have the NIC the cell asks for)"
        try:
            check_boots(q, kernel_for(topo.kernel_version, role))
        except EnvironmentProblem as exc:
            return f"{role}: {exc}"
    return None


def _with_chain(lab: LabState, o) -> str:
    """An impossible setting's reason; for a guest NIC's feature, with its negotiation chain's why
    (QEMU has no such property / does not offer the bit / the guest's driver does not accept it)."""
    reason = o.reason or f"{o.change.key} could not be set"
    chain = chain_why(lab, o)
    return f"{chain} — {reason}" if chain else reason


def chain_why(lab: LabState, o) -> str:
    """For a guest NIC's feature that could not be set (a knobs Outcome), its chain's why; else ""."""
    from offlab.knobs.features import kernel_pattern
    from offlab.lab.explain import lacking_reason

    role = getattr(o.change.host, "role", None)
    if not (o.change.iface and role):
        return ""
    return lacking_reason(lab, role, o.change.iface, kernel_pattern(o.change.key))


def _in_lab(name: str) -> Callable:
    """The settings a cell of lab `name` decides: its lab's, and the machine's (shared by every lab)."""
    return lambda knob: knob.target.lab == name or knob.target.is_machine

