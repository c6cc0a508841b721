"""`offlab bisect`: the first Debian guest kernel release at which a plan's comparison changes its verdict.

The releases are the archive's cloud kernels (offlab.vm.kernels) from the good one to the bad one, in
Debian's version order across suites. Each step runs the plan's comparison (one cell against its
baseline) with every guest on one release, decided by the plan's sequential rule within its budget
(offlab.experiment.decide), and names its verdict: faster, slower, equivalent (lower/higher for a
cost metric), undecided, "set but not exercised" (the cell's effect witness), or "cannot test" (the
cell was skipped, e.g. the guest's driver does not accept the feature). A release whose guest cannot be
built is "cannot be measured" and the search steps around it.

The search keeps two ends: `hi`, measured, with the bad end's verdict, and `lo`, with another one. The
good end is measured only when the change lies next to it, and the split leaves the side next to an
unmeasured good end the smaller, so that with n releases in the list (both ends included) it measures
at most ⌈log2 n⌉ + 1 of them. The search is a pure function of the verdicts so far, so a resumed bisect
replays its stored steps and measures only what was not decided. An undecided step stops it: it says the
range it narrowed the change to and never guesses.
"""

from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from offlab.errors import BadInput, EnvironmentProblem, OfflabError
from offlab.experiment import yamlio
from offlab.experiment.plan import Plan, load_plan
from offlab.experiment.plan.axes import matches
from offlab.experiment.plan.load import baseline_key
from offlab.hosts import LOCAL
from offlab.catalog import GUEST_TOPOLOGIES
from offlab.metrics import METRICS, NOT_EXERCISED, not_exercised_by_cell
from offlab.sample import records
from offlab.state import me, private_tmp
from offlab.stats import UNDECIDED, replay
from offlab.store import Store
from offlab.vm import kernels

CANNOT_TEST = "cannot test"  # the compared cell (or its baseline) was skipped: a setting the guest cannot take
FAILED = "failed"  # a side whose samples carried nothing (the path was broken)
UNMEASURABLE = "cannot be measured"  # no guest could be built from the release
# Verdicts that place no release on either side of the change.
OPEN = (UNDECIDED, UNMEASURABLE)


# ---- what is asked ---------------------------------------------------------------------------------
@dataclass
class Spec:
    """A bisect's question, as stored: the plan's comparison and the two ends."""

    good: str
    bad: str
    cell: str  # the compared cell's key
    baseline: str  # its baseline's key
    metric: str
    among: list[str] = field(default_factory=list)  # only these releases between the ends (specs)
    releases: list[dict] = field(default_factory=list)  # the list, good end first: {abi, version, suite}

    def to_json(self) -> dict:
        return asdict(self)

    def question(self) -> dict:
        """What the user asked, without the release list the archive gave then: the same command again
        asks the same question even after the archive has grown."""
        return {k: v for k, v in self.to_json().items() if k != "releases"}

    @classmethod
    def from_json(cls, data: dict) -> "Spec":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def usable(known: list[kernels.Release]) -> list[kernels.Release]:
    """Releases a guest can boot, one per package version: the archive also lists an ABI-less
    `linux-image-6.12-cloud-amd64` at the version of a real release, which carries no kernel of its own."""
    full = [r for r in known if not re.fullmatch(r"\d+\.\d+", r.abi)]
    seen: dict[str, kernels.Release] = {}
    for r in full:
        seen.setdefault(r.version, r)
    return sorted(seen.values(), key=lambda r: kernels.debian_key(r.version))


def release_list(known: list[kernels.Release], good: str, bad: str, among: list[str] | None = None
                 ) -> list[kernels.Release]:
    """good, the releases Debian offers between it and bad (in version order; only those `among` names,
    if given), bad. BadInput for an unknown release (with the nearest), good = bad, or nothing between."""
    known = usable(known)
    g = kernels.choose(good, known, "--good")
    b = kernels.choose(bad, known, "--bad")
    if g.version == b.version:
        raise BadInput(f"--good {good} and --bad {bad} are the same release ({g.abi}, {g.version}): "
                       f"name two releases to bisect between")
    lo, hi = sorted((g, b), key=lambda r: kernels.debian_key(r.version))
    between = [r for r in known if kernels.debian_key(lo.version) < kernels.debian_key(r.version)
               < kernels.debian_key(hi.version)]
    if among:
        picked = []
        for spec in among:
            try:
                r = kernels.choose(spec, between, "--among")
            except BadInput:
                elsewhere = kernels.choose(spec, known, "--among")  # BadInput naming the nearest if Debian lacks it
                raise BadInput(f"--among {spec}: {elsewhere.abi} is not between --good {g.abi} and --bad {b.abi}; "
                               f"name releases between them") from None
            if r not in picked:
                picked.append(r)
        between = sorted(picked, key=lambda r: kernels.debian_key(r.version))
    if not between:
        raise BadInput(f"nothing between --good {g.abi} and --bad {b.abi}: Debian's archive has no cloud kernel "
                       f"release between them, so {b.abi} is where a change would lie; no bisect is needed")
    out = [lo, *between, hi]
    return out if g is lo else out[::-1]


# ---- the search ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """Where a search ended. kind: found (the verdict changes at `first`), same (good and bad give one
    verdict), narrowed (an undecided or unmeasurable step: the change lies between lo and hi), bad-end
    (the bad end itself gave no verdict)."""

    kind: str
    lo: int
    hi: int
    why: str = ""


def split(lo: int, hi: int, lo_measured: bool) -> int:
    """The position to measure between lo and hi. With lo measured, the middle. With lo the unmeasured
    good end (measured last, only if the change lies next to it), the side next to it holds at most
    2^(t-1) - 1 intervals and the other at most 2^(t-1), t = ⌈log2(m + 1)⌉ for m = hi - lo intervals:
    the search then ends within t more measurements, the good end's included."""
    m = hi - lo
    if lo_measured:
        return lo + m // 2
    half = 2 ** (math.ceil(math.log2(m + 1)) - 1)
    low, high = max(1, m - half), min(m - 1, half - 1)
    return lo + min(max(m // 2, low), high)


def search(n: int, seen: dict[int, str]) -> int | Outcome:
    """The next position to measure (0 = good end, n - 1 = bad end), or where the search ends, from the
    verdicts so far (`seen`: position → verdict). Pure: a resumed bisect replays it over its stored steps."""
    last = n - 1
    if last not in seen:
        return last
    bad = seen[last]
    if bad in OPEN:
        return Outcome("bad-end", 0, last, f"the bad end gave no verdict ({bad})")
    lo, hi = 0, last
    while True:
        interior = [p for p in range(lo + 1, hi) if seen.get(p) != UNMEASURABLE]
        if not interior:
            if lo == 0 and 0 not in seen:
                return 0
            if lo == 0 and seen[0] in OPEN:
                return Outcome("narrowed", lo, hi, f"the good end gave no verdict ({seen[0]})")
            if lo == 0 and seen[0] == bad:
                return Outcome("same", lo, hi, f"the good end gives the bad end's verdict too ({bad})")
            if hi - lo > 1:
                return Outcome("narrowed", lo, hi, "no release between them could be measured")
            return Outcome("found", lo, hi)
        mid = split(lo, hi, lo in seen)
        p = min(interior, key=lambda q: (abs(q - mid), q))
        if p not in seen:
            return p
        if seen[p] == UNDECIDED:
            return Outcome("narrowed", lo, hi, "a step between them stayed undecided within its budget")
        if seen[p] == bad:
            hi = p
        else:
            lo = p


# ---- one step: the plan on one release -------------------------------------------------------------
def comparison(plan: Plan, cell: str | None) -> tuple[str, str]:
    """(cell key, baseline key) of the comparison to bisect: `cell` (a key or axis=value filter, e.g.
    tx=uso), else the plan's one headline comparison. BadInput naming the choices otherwise."""
    if plan.topology.kind not in GUEST_TOPOLOGIES:
        raise BadInput(f"plan {plan.name}: topology {plan.topology.kind} has no guests; bisect varies the guest "
                       f"kernel: use a topology with guests ({', '.join(GUEST_TOPOLOGIES)})")
    varied = sorted({str(c.topology.kernel_version) for c in plan.cells})
    if len(varied) > 1:
        raise BadInput(f"plan {plan.name}: its cells already vary kernel_version ({', '.join(varied)}); bisect "
                       f"sets every guest's kernel itself: drop that axis")
    if plan.baseline is None:
        raise BadInput(f"plan {plan.name} has no baseline: bisect decides a cell against its baseline")
    keys = {c.key for c in plan.cells}
    pairs = [(c.key, baseline_key(c.params, plan.baseline)) for c in plan.cells
             if baseline_key(c.params, plan.baseline) != c.key and baseline_key(c.params, plan.baseline) in keys]
    if cell is not None:
        want = dict(part.split("=", 1) for part in cell.split(",") if "=" in part)
        hits = [p for p in pairs if p[0] == cell or (want and matches(_params(p[0]), want))]
        what = "--cell " + cell
    else:
        hits = [p for p in pairs if not plan.headline or any(matches(_params(p[0]), h) for h in plan.headline)]
        what = "the plan's headline"
    if len(hits) != 1:
        choices = ", ".join(k for k, _ in pairs) or "none"
        raise BadInput(f"{what} names {len(hits)} compared cells of plan {plan.name}: name one with --cell "
                       f"(compared cells: {choices})")
    return hits[0]


def _params(key: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in key.split(","))


def step_plan_text(plan_text: str, source: str, spec: Spec, abi: str) -> str:
    """The plan's YAML with every guest on release `abi`, only the compared cell and its baseline (the
    headline), and the bisect's metric: what one step runs, stored with its run."""
    loaded, _ = yamlio.load(plan_text, source)
    data = dict(loaded)  # type: ignore[call-overload]  # a plan that loaded is a mapping
    data["topology"] = {**dict(data["topology"]), "kernel_version": abi}
    data["only"] = [_params(spec.cell), _params(spec.baseline)]
    data["headline"] = [_params(spec.cell)]
    data.pop("quick", None)
    data["repeat"] = {**dict(data.get("repeat") or {}), "metric": spec.metric}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def verdict_of(store: Store, run_id: int, spec: Spec, level: float, equivalence: float | None, n0: int
               ) -> tuple[str, dict]:
    """A step's verdict from its run's stored cells and samples (so a resumed bisect reads the same)."""
    cells = {c["key"]: c for c in store.cells(run_id)}
    cell, base = cells.get(spec.cell), cells.get(spec.baseline)
    if cell is None or base is None:
        raise EnvironmentProblem(f"run {run_id} lacks cell {spec.cell} or {spec.baseline}: not a step of this bisect")
    for side in (cell, base):
        if side["status"] == "skipped":
            return CANNOT_TEST, {"reason": side["reason"], "cell": side["key"]}
        if side["status"] == "failed":
            return FAILED, {"reason": side["reason"], "cell": side["key"]}
    samples = records(store.samples(run_id))
    history: dict[int, list[tuple[int, float]]] = {}
    for s in samples:
        if spec.metric in s.metrics:
            history.setdefault(s.cell_id, []).append((s.round, s.metrics[spec.metric]))
    d = replay(history.get(base["id"], []), history.get(cell["id"], []), n0, level, equivalence,
               METRICS[spec.metric].better)
    verdict = d.verdict if d else UNDECIDED
    detail: dict = {"verdict": verdict, "ratio": d.ratio if d else None,
              "low": d.low if d else None, "high": d.high if d else None, "pairs": d.n if d else 0,
              "samples": sum(1 for s in samples if s.cell_id in (cell["id"], base["id"]))}
    unexercised = not_exercised_by_cell(samples).get(cell["id"])
    if unexercised:
        detail["not_exercised"] = unexercised
        return NOT_EXERCISED, detail
    return verdict, detail


# ---- the Debian changelog between two releases -----------------------------------------------------
@dataclass
class Entry:
    """One entry of a Debian changelog: `linux (7.2.12-1) unstable; urgency=medium`, its lines, its trailer."""

    source: str  # linux; linux-6.12 for a bookworm rebuild; linux-signed-… for the signing package's own entry
    version: str
    distribution: str
    lines: list[str]
    trailer: str

    def header(self) -> str:
        return f"{self.source} ({self.version}) {self.distribution}"


_HEADER_RE = re.compile(r"^(\S+) \(([^)\s]+)\) ([^;]+);")


def parse_changelog(text: str) -> list[Entry]:
    """Entries of a Debian changelog (Debian Policy 4.4), newest first as the file has them."""
    out: list[Entry] = []
    for line in text.splitlines():
        m = _HEADER_RE.match(line)
        if m:
            out.append(Entry(m.group(1), m.group(2), m.group(3).strip(), [], ""))
        elif out and line.startswith(" -- "):
            out[-1].trailer = line[4:].strip()
        elif out and not out[-1].trailer and line.strip():
            out[-1].lines.append(line.rstrip())
    return out


def entries_between(entries: list[Entry], older: str, newer: str) -> list[Entry]:
    """The entries after package version `older`, up to and including `newer`, in Debian's version order
    of what each was rebuilt from: 7.2.12-1~bpo13+1 (a backport) is 7.2.12-1's code, so 7.2.12-1's entry
    belongs to it, and 7.2.9-1's to 7.2.9-1~bpo13+1. The signing package's entries are left out: their
    versions (6.12.117+1~deb12u1) are the signed package's own, and they only say which kernel was signed."""
    lo, hi = kernels.debian_key(rebuilt_from(older)), kernels.debian_key(rebuilt_from(newer))
    return [e for e in entries if not e.source.startswith("linux-signed")
            and lo < kernels.debian_key(rebuilt_from(e.version)) <= hi]


def rebuilt_from(version: str) -> str:
    """The version a backport (~bpo13+1) or a stable rebuild (~deb12u1) was rebuilt from."""
    return re.sub(r"~(bpo\d+\+\d+|deb\d+u\d+)$", "", version)


def changelog_text(release: kernels.Release, debs: list[Path]) -> str:
    """The release's Debian changelog, read from its own packages: changelog.Debian.gz (changelog.gz in a
    signed image package) in the doc directory of the image (from 6.19 on, binary) package, which may be a
    symlink to another part's (linux-base-…). EnvironmentProblem saying what is missing otherwise."""
    with private_tmp("changelog") as tmp:
        root = Path(tmp)
        for deb in debs:
            # only the doc directories: a kernel package is tens of MB
            LOCAL.run(["sh", "-c", 'dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" --wildcards "./usr/share/doc/*"',
                       "sh", str(deb), tmp], check=False, timeout=300)
        doc = root / "usr/share/doc"
        for d in release.debs:
            if not os.path.lexists(doc / d.name):
                continue
            for name in ("changelog.Debian.gz", "changelog.gz"):
                real = Path(os.path.realpath(doc / d.name / name))
                if real.is_relative_to(root.resolve()) and real.is_file():
                    return gzip.decompress(real.read_bytes()).decode("utf-8", "replace")
            if (doc / d.name).is_symlink():
                raise EnvironmentProblem(f"{d.name} {d.version}: its doc directory links to {os.readlink(doc / d.name)}, "
                                         f"a package of the release that the archive's lists do not hold")
        names = ", ".join(d.name for d in release.debs)
        raise EnvironmentProblem(f"{release.abi}: no usr/share/doc/*/changelog.Debian.gz or changelog.gz in {names}")


# ---- the whole bisect ------------------------------------------------------------------------------
@dataclass
class Step:
    position: int
    release: kernels.Release
    run_id: int | None = None
    verdict: str | None = None
    detail: dict = field(default_factory=dict)


Runner = Callable[[str, kernels.Release, int | None, Callable[[int], None]], int]


class Bisect:
    """One bisect in the store: its releases, the steps taken, and the search over them."""

    def __init__(self, store: Store, bisect_id: int, plan_text: str, source: str, spec: Spec,
                 on_event: Callable[[str, dict], None] | None = None) -> None:
        self.store, self.id, self.plan_text, self.source, self.spec = store, bisect_id, plan_text, source, spec
        self.on_event = on_event or (lambda kind, info: None)
        self.releases = [kernels.Release(r["abi"], r["version"], r["suite"], tuple(
            kernels.Deb(**d) for d in r.get("debs", []))) for r in spec.releases]
        self.steps: dict[int, Step] = {}
        for s in store.get_bisect(bisect_id)["steps"]:
            self.steps[s["position"]] = Step(s["position"], self.releases[s["position"]], s["run_id"], s["verdict"],
                                             s["detail"] or {})

    @classmethod
    def start(cls, store: Store, plan: Plan, good: str, bad: str, *, cell: str | None = None,
              metric: str | None = None, among: list[str] | None = None, fresh: bool = False,
              on_event: Callable[[str, dict], None] | None = None) -> "Bisect":
        """Check everything (nothing fetched but the archive's lists), then store a new bisect, or resume
        the unfinished one that asked the same question of the same plan (unless `fresh`)."""
        cell_key, base_key = comparison(plan, cell)
        metric = metric or plan.repeat.metric
        if metric not in METRICS:
            raise BadInput(f"--metric {metric}: not a metric offlab knows ({', '.join(sorted(METRICS))})")
        releases = release_list(kernels.releases(kernels.index()), good, bad, among)
        spec = Spec(good, bad, cell_key, base_key, metric, list(among or []),
                    [asdict(r) for r in releases])
        if not fresh:
            earlier = store.unfinished_bisect(plan.text, spec.question())
            if earlier is not None:  # the same command again: it carries on where that one stopped
                again = cls.resume(store, earlier, on_event)
                again.on_event("again", {"bisect_id": earlier})
                return again
        bisect_id = store.create_bisect(plan.name, plan.text, spec.to_json(), me())
        return cls(store, bisect_id, plan.text, plan.source, spec, on_event)

    @classmethod
    def resume(cls, store: Store, bisect_id: int, on_event: Callable[[str, dict], None] | None = None) -> "Bisect":
        b = store.get_bisect(bisect_id)
        if b["status"] == "done":
            raise BadInput(f"bisect {bisect_id} is complete: nothing to resume (offlab bisect --show {bisect_id})")
        if b["status"] == "running":
            raise EnvironmentProblem(f"bisect {bisect_id} is running in another process: wait for it, or stop it "
                                     f"and then `offlab bisect --resume {bisect_id}`")
        store.set_bisect_status(bisect_id, "running", None, owner=me())
        return cls(store, bisect_id, b["plan_text"], f"bisect {bisect_id} plan", Spec.from_json(b["spec"]), on_event)

    def bound(self) -> int:
        """The most releases the search measures: ⌈log2 n⌉ + 1 for n releases, both ends included."""
        return math.ceil(math.log2(len(self.releases))) + 1

    # -- running ---------------------------------------------------------------------------------
    def seen(self) -> dict[int, str]:
        return {p: s.verdict for p, s in self.steps.items() if s.verdict is not None}

    def run(self, measure: Runner) -> Outcome:
        """Steps until the search ends; `measure(plan_text, release, run_id_to_resume, on_run)` runs one."""
        while True:
            nxt = search(len(self.releases), self.seen())
            if isinstance(nxt, Outcome):
                return nxt
            self._step(nxt, measure)

    def _step(self, position: int, measure: Runner) -> None:
        release = self.releases[position]
        step = self.steps.setdefault(position, Step(position, release))
        self.on_event("step", {"position": position, "release": release, "resumed": step.run_id is not None})
        run_id = step.run_id
        if run_id is None or self.store.get_run(run_id)["status"] not in ("done", "budget_exhausted"):
            why = self._unmeasurable(release)
            if why is not None:
                step.verdict, step.detail = UNMEASURABLE, {"reason": why}
                self._save(step)
                self.on_event("verdict", {"step": step})
                return

            def on_run(rid: int) -> None:
                step.run_id = rid
                self._save(step)

            text = step_plan_text(self.plan_text, self.source, self.spec, release.abi)
            run_id = measure(text, release, run_id, on_run)
            step.run_id = run_id
        repeat = self.store.get_run(run_id)["repeat"]
        step.verdict, step.detail = verdict_of(self.store, run_id, self.spec, repeat["level"],
                                               repeat.get("equivalence"), repeat["min"])
        self._save(step)
        self.on_event("verdict", {"step": step})

    @staticmethod
    def _unmeasurable(release: kernels.Release) -> str | None:
        """Why no guest can be built from the release (its packages lack what the guest needs), or None.
        Fetching it (exit 3 naming the suite when that fails) happens here, once."""
        from offlab.vm import image as vm_image

        kernels.fetch(release)
        try:
            vm_image.build(release.abi)
        except EnvironmentProblem as exc:
            if "could not be fetched" in str(exc) or "could not be reached" in str(exc):
                raise
            return str(exc)
        return None

    def _save(self, step: Step) -> None:
        r = step.release
        self.store.put_bisect_step(self.id, step.position, r.abi, r.version, r.suite, step.run_id, step.verdict,
                                   step.detail or None)

    def execute(self, measure: Runner) -> dict:
        """The whole bisect to its end; interrupted (Ctrl-C, SIGTERM, SIGHUP) or failed, it is marked so,
        every decided step kept for `offlab bisect --resume`."""
        from offlab.interrupts import Terminated

        try:
            return self.finish(self.run(measure))
        except (KeyboardInterrupt, Terminated):
            self.store.set_bisect_status(self.id, "interrupted", f"interrupted; resume with "
                                                                 f"`offlab bisect --resume {self.id}`")
            raise
        except BaseException as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            try:
                self.store.set_bisect_status(self.id, "failed", f"{why}; resume with `offlab bisect --resume {self.id}`")
            except OfflabError:
                pass  # a read-only or full database: the first error is the one to show
            raise

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, outcome: Outcome) -> dict:
        """The result as stored: where the verdict changes (both packages and the changelog between them),
        or the range the bisect narrowed it to and why it stopped there."""
        lo, hi = self.releases[outcome.lo], self.releases[outcome.hi]
        seen = self.seen()
        result = {"kind": outcome.kind, "why": outcome.why,
                  "lo": _release_json(lo, seen.get(outcome.lo)), "hi": _release_json(hi, seen.get(outcome.hi)),
                  "measured": sum(1 for s in self.steps.values() if s.run_id is not None),
                  "n": len(self.releases), "bound": self.bound()}
        if outcome.kind == "found":
            result["first"] = hi.abi
            result["changelog"] = self._changelog(lo, hi)
        self.store.set_bisect_status(self.id, "done", _note(result), result)
        return result

    @staticmethod
    def _changelog(older: kernels.Release, newer: kernels.Release) -> dict:
        """The Debian changelog entries after the older release's version up to the newer one's, from the
        newer release's own changelog (it carries the history of its branch)."""
        old, new = sorted((older, newer), key=lambda r: kernels.debian_key(r.version))
        try:
            text = changelog_text(new, kernels.fetch(new))
        except OfflabError as exc:
            return {"from": new.abi, "error": str(exc), "entries": []}
        found = entries_between(parse_changelog(text), old.version, new.version)
        return {"from": new.abi, "entries": [asdict(e) for e in found]}


def plan_runner(store: Store, on_event: Callable[[str, dict], None] | None = None) -> Runner:
    """One step as `offlab run` runs a plan (offlab.experiment.runner), or resumes the step's run."""
    from offlab.experiment.runner import Runner as PlanRunner

    def measure(text: str, release: kernels.Release, run_id: int | None, on_run: Callable[[int], None]) -> int:
        def event(kind: str, info: dict) -> None:
            if kind == "run":
                on_run(info["run_id"])
            if on_event is not None:
                on_event(kind, info)

        if run_id is not None:
            return PlanRunner.resume(store, run_id, on_event=event).run()
        return PlanRunner(load_plan(text, f"bisect step {release.abi}"), store, on_event=event).run()

    return measure


def _release_json(r: kernels.Release, verdict: str | None) -> dict:
    return {"abi": r.abi, "package": r.name, "version": r.version, "suite": r.suite, "verdict": verdict}


def _note(result: dict) -> str:
    lo, hi = result["lo"], result["hi"]
    if result["kind"] == "found":
        return f"first {hi['abi']} ({hi['verdict']}; {lo['abi']} before it: {lo['verdict']})"
    if result["kind"] == "same":
        return f"no change: {lo['abi']} and {hi['abi']} both {hi['verdict']}"
    return f"{result['why']}: the change lies between {lo['abi']} and {hi['abi']}"
