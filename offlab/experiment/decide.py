"""Which cells a round still needs when the run repeats comparisons until they are decided.

A comparison is a cell against its baseline cell on the plan's repeat metric. Its verdict is
replayed from the (round, value) history of both sides with offlab.stats.sequential_decision on
the pairs measured in the same round (one look per new pair), so it is the same after a resume. A cell
is sampled while a comparison it belongs to is undecided; under a time budget the headline
comparisons' cells go first in each round, so the budget is spent on them before the rest, and under
--quick the shape cells wait until each open headline comparison has had its first look.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from offlab.experiment.plan import Cell, Plan
from offlab.experiment.plan.axes import matches
from offlab.experiment.plan.load import baseline_key
from offlab.metrics import METRICS
from offlab.stats import MIN_PAIRS, UNDECIDED, Decision, Point, paired_ratio_ci, replay, rounds_to_decide
from offlab.stats import paired as pairs

ESTIMATE_LIMIT = 1000  # rounds; beyond it "undetermined" says "more than"


class Side(Protocol):
    """What the runner's CellState offers."""

    cell: Cell
    status: str
    rounds_done: set[int]
    history: list[Point]


@dataclass
class Comparison:
    cell: Side
    base: Side
    headline: bool
    decision: Decision | None = None
    steal_pct: list[float] = field(default_factory=list)  # per sample of either side, where measured

    @property
    def decided(self) -> bool:
        return self.decision is not None and self.decision.decided

    @property
    def moot(self) -> bool:
        """A side was skipped or failed: there is nothing to decide."""
        return self.cell.status in ("skipped", "failed") or self.base.status in ("skipped", "failed")


def cv_pct(values: list[float]) -> float | None:
    """Coefficient of variation in % (sample standard deviation / mean)."""
    n = len(values)
    if n < 2:
        return None
    mean = math.fsum(values) / n
    if mean == 0:
        return None
    return 100 * math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) / abs(mean)


class Decider:
    def __init__(self, plan: Plan, cells: list[Side]) -> None:
        self.plan, self.cells = plan, cells
        rep = plan.repeat
        self.level, self.equivalence, self.n0 = rep.level, rep.equivalence, rep.min
        self.better = METRICS[rep.metric].better
        by_key = {c.cell.key: c for c in cells}
        self.comparisons: list[Comparison] = []
        for cs in cells:
            bkey = baseline_key(cs.cell.params, plan.baseline or {})
            if bkey == cs.cell.key or bkey not in by_key:
                continue
            headline = not plan.headline or any(matches(cs.cell.params, h) for h in plan.headline)
            self.comparisons.append(Comparison(cs, by_key[bkey], headline))
        self.seconds: dict[str, list[float]] = {}  # cell key → wall seconds of each of its samples
        self.refresh()

    # ---- what to measure next -------------------------------------------
    def _open(self, comp: Comparison) -> bool:
        if comp.decided or comp.moot:
            return False
        shape = self.plan.shape_rounds
        return comp.headline or shape is None or len(comp.cell.rounds_done) < shape

    def _needs(self, cs: Side) -> tuple[bool, bool]:
        """(needed this round, for a headline comparison)."""
        if cs.status != "pending":
            return False, False
        mine = [c for c in self.comparisons if cs is c.cell or cs is c.base]
        if not mine:  # no baseline cell to compare with: the plan's minimum of rounds
            return len(cs.rounds_done) < (self.plan.shape_rounds or self.n0), False
        shape = self.plan.shape_rounds
        open_ = [c for c in mine if self._open(c)
                 and (c.headline or shape is None or len(cs.rounds_done) < shape)]
        return bool(open_), any(c.headline for c in open_)

    def order(self, rnd: int, seed: int) -> list[Side]:
        """This round's cells. One seeded shuffle serves two rounds, the second reversed (A B … B A),
        so a drift of the machine that is linear over the pair weighs every cell alike. Under a
        budget, the headline comparisons' cells go first (each group reversed on its own), so the
        budget is spent on them before the rest."""
        base = list(self.cells)
        random.Random(seed * 1009 + rnd // 2).shuffle(base)
        if rnd % 2:
            base.reverse()
        needed = [(cs, *self._needs(cs)) for cs in base]
        if not self.plan.budget_s:
            return [cs for cs, need, _ in needed if need]
        first = [cs for cs, need, head in needed if need and head]
        rest = [cs for cs, need, head in needed if need and not head]
        if first and self.plan.shape_rounds is not None and self._headline_before_first_look():
            return first  # --quick: the shape waits until every open headline comparison has had a look
        return first + rest

    def _headline_before_first_look(self) -> bool:
        first_look = max(self.n0, MIN_PAIRS)
        return any(len(pairs(c.base.history, c.cell.history)[0]) < first_look
                   for c in self.comparisons if c.headline and self._open(c))

    # ---- after samples ----------------------------------------------------
    def record(self, cs: Side, seconds: float, steal_pct: float | None) -> None:
        self.seconds.setdefault(cs.cell.key, []).append(seconds)
        if steal_pct is not None:
            for c in self.comparisons:
                if cs is c.cell or cs is c.base:
                    c.steal_pct.append(steal_pct)

    def refresh(self) -> None:
        for c in self.comparisons:
            c.decision = replay(c.base.history, c.cell.history, self.n0, self.level, self.equivalence,
                                self.better)

    def summary(self) -> list[dict]:
        """Every comparison: verdict, interval, rounds, noise and, when undecided, what it would need."""
        return [self.describe(c) for c in self.comparisons]

    def describe(self, c: Comparison) -> dict:
        a, b = pairs(c.base.history, c.cell.history)
        d = c.decision
        out = {"cell": c.cell.cell.key, "baseline": c.base.cell.key, "headline": c.headline,
               "verdict": d.verdict if d else UNDECIDED,
               # before the first look, the pairs' ratio so far and no interval, as compare's rows show it
               "ratio": d.ratio if d else (paired_ratio_ci(a, b).ratio if a else None),
               "low": d.low if d else None, "high": d.high if d else None, "looks": d.look if d else 0,
               "pairs": d.n if d and d.decided else len(a), "cv_cell_pct": cv_pct(b), "cv_baseline_pct": cv_pct(a),
               "cv_ratio_pct": cv_pct([y / x for x, y in zip(a, b, strict=True) if x > 0]),
               "steal_pct": max(c.steal_pct) if c.steal_pct else None, "level": self.level,
               "equivalence_pct": self.equivalence, "metric": self.plan.repeat.metric,
               "needs_rounds": None, "needs_minutes": None, "needs_floor": False, "moot": c.moot}
        if c.moot or (d is not None and d.decided):
            return out
        per_round = self.expected_seconds(c.cell) + self.expected_seconds(c.base)
        extra = rounds_to_decide(a, b, d.look if d else 0, self.level, self.equivalence, ESTIMATE_LIMIT)
        if extra is not None:
            out["needs_rounds"], out["needs_minutes"] = extra, extra * per_round / 60
        elif len(a) < max(self.n0, MIN_PAIRS):
            # Too few pairs to know the noise (e.g. the budget went to a guest's boot): the rounds
            # before the first look, each at least its samples' windows, are a floor, said as one.
            extra = max(self.n0, MIN_PAIRS) - len(a)
            per_round = per_round or sum(_window_s(x.cell) for x in (c.cell, c.base))
            out["needs_rounds"], out["needs_minutes"], out["needs_floor"] = extra, extra * per_round / 60, True
        return out

    def expected_seconds(self, cs: Side) -> float:
        """How long the cell's next sample should take: its own samples' mean, else every sample's."""
        s = self.seconds.get(cs.cell.key)
        if s:
            return sum(s) / len(s)
        every = [x for v in self.seconds.values() for x in v]
        return sum(every) / len(every) if every else 0.0


def _window_s(cell: Cell) -> float:
    """The least a sample of the cell takes: its warm-up and its window."""
    return cell.workload.warmup + cell.workload.duration


def reason(d: dict) -> str:
    """The cell's reason line for a comparison's outcome."""
    if d["verdict"] != UNDECIDED:
        return f"decided {d['verdict']} ({d['level']:g} % over every look, {detail(d)})"
    return f"undetermined{detail(d)}"


def detail(d: dict) -> str:
    """What the verdict rests on: for a decided comparison its rounds and noise; for an undecided one
    ": needs ~N more minutes …" or " after N rounds: …". The headline lines print it after the verdict
    that compare's rows carry (offlab.report.compare), so the verdict itself is written in one place."""
    noise = (f"noise: ratio cv {_pct(d['cv_ratio_pct'])}, cell {_pct(d['cv_cell_pct'])}, "
             f"baseline {_pct(d['cv_baseline_pct'])}")
    if d["steal_pct"] is not None and d["steal_pct"] >= 1:
        noise += f", CPU steal up to {d['steal_pct']:.1f} %"
    rounds = f"{d['pairs']} round{'' if d['pairs'] == 1 else 's'}"
    if d["verdict"] != UNDECIDED:
        return f"{rounds}, {noise}"
    if d.get("needs_floor"):
        return (f": needs at least ~{max(d['needs_minutes'], 0.1):.1f} more minutes "
                f"({d['needs_rounds']} more rounds before its first look; {rounds}, too few to know the noise)")
    if d["needs_minutes"] is not None:
        return (f": needs ~{max(d['needs_minutes'], 0.1):.1f} more minutes at this noise "
                f"(~{d['needs_rounds']} more rounds; {rounds}, {noise})")
    if d["pairs"] >= 2:
        return f" after {rounds}: more than {ESTIMATE_LIMIT} more rounds at this noise ({noise})"
    return f" after {rounds}: too few samples to estimate what it needs"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.1f} %"
