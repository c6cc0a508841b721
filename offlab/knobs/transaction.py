"""Apply settings as one transaction: validate all, journal, apply, read back, restore on exit.

    with Transaction(label="cell 3") as tx:
        outcomes = tx.apply([Change(lab.client, "gro", "off", "to-server", lab)])
        if tx.impossible: skip the cell with tx.impossible[0].reason
        ... measure ...
    # every change is back to its original here, even after Ctrl-C, SIGTERM or SIGHUP

A run keeps one transaction open across consecutive samples and moves it from one cell's
settings to the next with `switch`: only what differs is put back or set, every change still
journalled before it is made and read back after.

SIGKILL cannot be caught: the journal stays behind and `offlab restore` replays it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Literal, Callable, Iterable

from offlab.errors import BadInput, CommandFailed, EnvironmentProblem
from offlab.hosts import Host
from offlab.interrupts import interrupts, protected, shielded
from offlab.knobs.base import Knob, Plan, failure_text
from offlab.knobs.features import forget_reads, shared_reads
from offlab.knobs import undo
from offlab.knobs.journal import Entry, Journal, dir_lock, remove_if_done
from offlab.knobs.undo import mark
from offlab.knobs.lease import Lease, take
from offlab.knobs.registry import knob_class, knob_for
from offlab.knobs.restore import Report, restore_entries
from offlab.knobs.target import target_for


@dataclass
class Change:
    host: Host
    key: str
    value: str | int | bool
    iface: str | None = None
    lab: object | None = None  # LabState: resolves `to-<peer>`, knows the OVS of an `ovs` lab

    def __str__(self) -> str:
        where = f"{self.host.name}:{self.iface}" if self.iface else self.host.name
        return f"{where} {self.key}={self.value}"


@dataclass
class Outcome:
    change: Change
    original: str
    requested: str
    actual: str
    ok: bool
    reason: str | None = None
    also_changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    also_why: dict[str, str] = field(default_factory=dict)  # why the kernel moved each of also_changed
    where: str = ""
    journalled: bool = False
    seqs: list[int] = field(default_factory=list, repr=False, compare=False)  # its journal entries

    def line(self) -> str:
        """One line for people: `client:olx0 gro: off → on (requested on)`."""
        head = f"{self.where} {self.change.key}: {self.original} → {self.actual}"
        if self.ok:
            text = head + ("" if self.journalled else " (already so)")
        else:
            text = f"{head} (requested {self.requested}) — {self.reason}"
        if self.also_changed:
            groups: dict[tuple, list[str]] = {}  # features that moved alike for one reason: named once
            for k, (a, b) in self.also_changed.items():
                groups.setdefault((a, b, self.also_why.get(k)), []).append(k)
            text += "; also changed: " + ", ".join(
                f"{', '.join(names)} {a}→{b}" + (f" ({why})" if why else "") for (a, b, why), names in groups.items())
        return text

    def to_dict(self) -> dict:
        return {"where": self.where, "key": self.change.key, "original": self.original,
                "requested": self.requested, "actual": self.actual, "ok": self.ok, "reason": self.reason,
                "also_changed": {k: list(v) for k, v in self.also_changed.items()},
                "also_changed_why": dict(self.also_why)}


class Transaction:
    """Journalled changes that are put back on exit (or kept, with `persist=True`, for `offlab restore`)."""

    def __init__(self, label: str = "offlab", persist: bool = False, *, prefix: str | None = None) -> None:
        self.label = label
        self.persist = persist
        self.prefix = prefix or ("persist" if persist else "tx")
        self.journal: Journal | None = None
        self.outcomes: list[Outcome] = []
        self.restore_report: Report | None = None
        self._signals: contextlib.ExitStack | None = None  # offlab's handlers while it is open
        self.leases: dict[str, Lease] = {}  # machine-wide settings this transaction holds
        self._applied: list[tuple[Outcome, Knob]] = []  # what this transaction holds in force now
        self.counts = {"applied": 0, "restored": 0, "kept": 0, "checked": 0}  # journalled writes, kept as they were

    # ---- context -------------------------------------------------------
    def __enter__(self) -> "Transaction":
        # A persistent one too: `lab set` interrupted while applying puts back what it set.
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(interrupts())
        try:
            with shielded():  # the journal is made whole (header, link, fsync) before a signal acts
                self.journal = Journal.create(self.label, persist=self.persist, prefix=self.prefix)
        except BaseException:
            if self.journal is not None:  # made, then the signal: nothing in it to keep
                remove_if_done(self.journal.path)
            self._signals.close()
            raise
        return self

    @protected  # a signal during the restore, or in the instant before it, is raised as it ends (an error
    def __exit__(self, exc_type, exc, tb) -> Literal[False]:  # leaving it gives way to the signal)
        assert self._signals is not None
        with self._signals:  # the previous handlers come back last
            try:
                if self.persist and exc_type is None:
                    self._release()
                else:
                    self.restore()
            finally:
                for lease in self.leases.values():
                    lease.release()
                self.leases.clear()
            failed = self.restore_report.failed if self.restore_report else []
            if failed:
                if exc_type is None:
                    raise EnvironmentProblem("; ".join(failed) + " (the journal is kept: `offlab restore` retries)")
                print("offlab: warning: " + "; ".join(failed), file=sys.stderr)
        return False

    # ---- the work ------------------------------------------------------
    def apply(self, changes: Iterable[Change]) -> list[Outcome]:
        """Validate every change (BadInput, nothing changed), then apply each in order and read it back."""
        if self.journal is None:
            raise RuntimeError("Transaction.apply needs `with Transaction(...) as tx:`")
        prepared = self._validate(list(changes))
        outcomes = [self._apply_one(change, knob, value) for change, knob, value in prepared]
        self.outcomes += outcomes
        return outcomes

    def switch(self, changes: Iterable[Change], scope: Callable[[Knob], bool] = lambda knob: True) -> list[Outcome]:
        """Move from the settings in force to `changes`, touching only the difference.

        Of what this transaction holds in force within `scope` (e.g. one lab and the machine), a
        setting `changes` does not ask for (or asks a different value of, or that was not made)
        is restored to its journalled original; a requested one not yet in force is applied as
        `apply` does (journal, apply, read back); one already in force is kept, and read back
        again if anything on its host was written (a restored feature can bring a kept one's
        dependency back, a bridge's features follow its ports'). Returns one outcome per change, in order: the cell's own `impossible` is
        `[o for o in outcomes if not o.ok]`."""
        if self.journal is None:
            raise RuntimeError("Transaction.switch needs `with Transaction(...) as tx:`")
        prepared = self._validate(list(changes))
        wanted = {_ident(knob): value for _, knob, value in prepared}
        held = {_ident(pair[1]): pair for pair in self._applied if scope(pair[1])}
        stale = [pair for ident, pair in held.items() if not pair[0].ok or wanted.get(ident) != pair[0].requested]
        kept = {ident: pair for ident, pair in held.items() if not any(pair is p for p in stale)}
        self._restore_held(stale)
        touched = {knob.target.host_key for o, knob in stale if o.seqs}  # hosts where something was written
        outcomes: list[Outcome] = []
        fresh: dict[tuple, Outcome] = {}
        for change, knob, value in prepared:
            if _ident(knob) in kept:
                continue
            out = fresh[_ident(knob)] = self._apply_one(change, knob, value)
            self.outcomes.append(out)
            if out.journalled:
                touched.add(knob.target.host_key)
        with shared_reads():  # kept features of one interface read back with one `ethtool -k`
            outcomes += self._check_kept(prepared, fresh, kept, touched)
        return outcomes

    def _check_kept(self, prepared: list, fresh: dict, kept: dict, touched: set) -> list[Outcome]:
        """switch's outcomes in order: the fresh ones as applied; a kept one read back where its host
        was written (set again if something restored took it back)."""
        outcomes: list[Outcome] = []
        for change, knob, value in prepared:
            if _ident(knob) in fresh:
                outcomes.append(fresh[_ident(knob)])
                continue
            old, old_knob = kept[_ident(knob)]
            self.counts["kept"] += 1
            if old_knob.target.host_key not in touched:  # nothing on its host changed since it was read
                outcomes.append(old)
                continue
            self.counts["checked"] += 1
            now = old_knob.snapshot()
            if old_knob.satisfied(value, now):
                old.actual = old_knob.show(now)
                outcomes.append(old)
                continue
            # Something restored took it back with it: set it again, journalled like any change.
            forget_reads()
            self._forget([kept[_ident(knob)]])
            out = self._apply_one(change, old_knob, value)
            out.original, out.seqs = old.original, old.seqs + out.seqs  # both entries go back, newest first
            self.outcomes.append(out)
            outcomes.append(out)
        return outcomes

    def release_scope(self, scope: Callable[[Knob], bool]) -> list[str]:
        """Put back what this transaction holds in `scope` (a lab about to go); the rest stays."""
        return self._restore_held([pair for pair in self._applied if scope(pair[1])])

    def _restore_held(self, held: list[tuple[Outcome, Knob]]) -> list[str]:
        """Restore these held settings' open journal entries, newest first, and stop holding them."""
        assert self.journal is not None
        seqs = {seq for o, _ in held for seq in o.seqs}
        report = Report()
        with shielded():  # a cell switch's restore finishes, and is counted, before a signal acts
            if seqs:
                with dir_lock():
                    restore_entries([e for e in self.journal.view().open_entries if e.seq in seqs], report)
            if report.failed:
                raise EnvironmentProblem("; ".join(report.failed) + " (the journal is kept: `offlab restore` retries)")
            self.counts["restored"] += len(seqs)
            self._forget(held)
        return report.lines

    def _forget(self, held: list[tuple[Outcome, Knob]]) -> None:
        gone = {id(pair) for pair in held}
        self._applied = [pair for pair in self._applied if id(pair) not in gone]

    def in_force(self, scope: Callable[[Knob], bool] = lambda knob: True) -> list[dict]:
        """Each setting held (in `scope`) as it reads now: what was really in force (e.g. at the end of a sample)."""
        out = []
        with shared_reads():  # several features of one interface: one `ethtool -k` (a guest's round trip)
            for outcome, knob in self._applied:
                if not scope(knob):
                    continue
                try:
                    value = knob.show(knob.snapshot())
                except (CommandFailed, OSError) as exc:
                    value = f"unreadable: {failure_text(exc) if isinstance(exc, CommandFailed) else exc}"
                out.append({"where": outcome.where, "key": outcome.change.key, "value": value,
                            "machine_wide": knob.target.is_machine})
        return out

    @property
    def impossible(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def restore(self) -> list[str]:
        """Put back everything applied so far, newest first; returns what was done."""
        report = Report()
        if self.journal is not None and self.journal.path.exists():
            with shielded(), dir_lock():
                entries = self.journal.view().entries
                restore_entries([e for e in entries if e.status == "open"], report)
                remove_if_done(self.journal.path)
                undo.let_go(self.journal.path, entries)
        self.restore_report = report
        return report.lines

    # ---- steps ---------------------------------------------------------
    def _validate(self, changes: list[Change]) -> list[tuple[Change, Knob, str]]:
        plan = Plan()
        prepared = []
        for change in changes:
            if not isinstance(change, Change):
                raise BadInput(f"not a Change: {change!r}")
            try:
                target = target_for(change.host, change.iface, change.lab,
                                    needs_iface=knob_class(change.key).needs_iface)
                knob = knob_for(target, change.key)
                value = knob.check(change.value, plan)
            except BadInput as exc:
                msg = str(exc)
                raise BadInput(msg if change.key in msg else f"{change.key}: {msg}") from None
            prepared.append((change, knob, value))
        return prepared

    def _apply_one(self, change: Change, knob: Knob, value: str) -> Outcome:
        assert self.journal is not None
        lease = None
        if knob.target.is_machine:
            # Leased before the original is read: another run's value must never pass for the original.
            key = knob.label
            if key not in self.leases:
                self.leases[key] = take(knob, self.label)
            lease = self.leases[key]
        before = knob.snapshot()
        original = knob.show(before)
        out = Outcome(change, original, value, original, True, where=knob.target.where)
        self._applied.append((out, knob))
        if knob.satisfied(value, before):
            return out
        why = knob.impossible(value, before)
        if why:
            out.ok, out.reason = False, why
            return out
        side_before = knob.side_state()
        if lease is not None:  # named first: a crash between the two must still point at the journal
            lease.journalled(self.journal.path, self.journal.next_seq)
        record = self.journal.add(knob.to_entry(), before, original, value)
        undo.copy_to_host(self.journal.path, record)
        seq = record["seq"]
        out.journalled = True
        out.seqs.append(seq)
        self.counts["applied"] += 1
        error = None
        try:
            knob.apply(value)
        except (CommandFailed, OSError) as exc:
            error = failure_text(exc) if isinstance(exc, CommandFailed) else (exc.strerror or str(exc))
        after = knob.snapshot()
        out.actual = knob.show(after)
        out.ok = error is None and knob.satisfied(value, after)
        if error is not None and knob.same(after, before):
            # Refused and nothing changed: the journal must not claim a change that never happened.
            mark(Entry(self.journal.path, seq, 0, {}), "dropped", f"the kernel refused it: {error}")
            out.journalled = False
        if not out.ok:
            out.reason = (f"{knob.label}: the kernel refused {value}: {error} — cannot test "
                          f"{change.key}={value} here") if error else knob.explain(value, before, after)
        side_after = knob.side_state()
        out.also_changed = {k: (side_before[k], v) for k, v in side_after.items()
                            if k in side_before and side_before[k] != v}
        out.also_why = knob.side_reasons(list(out.also_changed))
        if out.also_changed and out.journalled:
            self.journal.append({"op": "also-changed", "seq": seq, "why": out.also_why,
                                 "changed": {k: list(v) for k, v in out.also_changed.items()}})
        return out

    def _release(self) -> None:
        assert self.journal is not None
        if not self.journal.path.exists() or (not self.journal.view().open_entries
                                              and remove_if_done(self.journal.path)):
            return
        view = self.journal.view()
        self.journal.release()  # open entries, or a host's copy of an undo left: `offlab restore`'s now
        undo.let_go(self.journal.path, view.open_entries, hand_over=True)


def _ident(knob: Knob) -> tuple:
    """One setting: the same key on the same target (lab, host, interface)."""
    return knob.target, knob.key
