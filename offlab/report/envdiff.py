"""What changed between two runs: their stored environments and the settings in force during their
samples, side by side, most likely causes of a different figure first.

Every run stores its environment (offlab.experiment.env: kernel, cmdline, CPU, versions, sysctls and every
lab interface's features and MTU) and every sample the settings its cell held, read back at the end of its
window (`in_force`). Interfaces are named per lab (`olx2371a1`), so they are matched across runs by host
role and the host at the other end (`server:to-client`), never by name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Iterable

from offlab.errors import BadInput
from offlab.sample import Cpu, SampleRecord, StoredSample, records
from offlab.store import Store

# Most likely cause of a different figure first: a guest's kernel and QEMU, the kernel and how it was
# booted, and an emulated CPU; the offloads and MTUs of the path; sysctls; the software on the path;
# the CPU; the machine's load.
GUEST_VERSIONS = ("kernel_release", "kernel_package_version", "kernel_suite", "qemu_version")
RANKS = {"guest": 0, "kernel": 0, "accelerator": 0, "feature": 1, "mtu": 1, "sysctl": 2, "setting": 2, "version": 3,
         "cpu": 4, "load": 5}
# Steal or load that differ by less than this say nothing about a figure measured on a shared machine.
STEAL_POINTS = 2.0
LOAD_RATIO = 1.5


@dataclass(frozen=True)
class Change:
    kind: str  # a key of RANKS
    what: str  # "server:to-client generic-receive-offload", "sysctl net.core.netdev_max_backlog"
    a: str
    b: str
    note: str = ""  # e.g. "in 2 of 2 cells"

    @property
    def rank(self) -> int:
        return RANKS[self.kind]

    def line(self) -> str:
        return f"{self.what}: {self.a} → {self.b}" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict:
        return {**asdict(self), "rank": self.rank}


@dataclass
class EnvDiff:
    run_a: int
    run_b: int
    view: str  # "same machine, 2 h apart" / "different machines: a (cpu) vs b (cpu)"
    changes: list[Change]
    missing: list[str]  # one line per run without a stored environment

    def to_dict(self) -> dict:
        return {"run_a": self.run_a, "run_b": self.run_b, "view": self.view,
                "changes": [c.to_dict() for c in self.changes], "missing": self.missing}


def env_diff(store: Store, run_a: int, run_b: int) -> EnvDiff:
    """The differences between two runs' environments and settings in force, most likely causes first."""
    ra, rb = store.get_run(run_a), store.get_run(run_b)
    ea, eb = ra.get("env") or {}, rb.get("env") or {}
    missing = [f"run {r['id']} ({r['name']}) has no stored environment (stored by an older offlab): "
               f"nothing to compare it by; run the plan again to record one" for r, e in ((ra, ea), (rb, eb))
               if not e.get("kernel")]
    changes: list[Change] = []
    if not missing:
        changes += _machine(ea, eb)
        changes += _interfaces(ea, eb)
        changes += _in_force(store, ra, rb, ea, eb)
        changes += _load(store, ra, rb, ea, eb)
    changes.sort(key=lambda c: c.rank)  # stable: within a rank, the order found
    return EnvDiff(run_a, run_b, _view(ra, rb, ea, eb), changes, missing)


def _view(ra: dict, rb: dict, ea: dict, eb: dict) -> str:
    """Same machine or not, and how far apart in time: the frame for reading the differences."""
    apart = _apart(ra.get("started_at"), rb.get("started_at"))
    if not ea or not eb:
        return f"runs {ra['id']} and {rb['id']}, started {apart} apart"
    same = ea.get("hostname") == eb.get("hostname") and ea.get("cpu_model") == eb.get("cpu_model")
    plan = _plan_text(ra, rb)
    if same:
        return f"same machine ({ea.get('hostname')}), runs started {apart} apart, {plan}"
    return (f"different machines: {ea.get('hostname')} ({ea.get('cpu_model')}, {ea.get('cpus')} CPUs) vs "
            f"{eb.get('hostname')} ({eb.get('cpu_model')}, {eb.get('cpus')} CPUs), started {apart} apart, {plan}")


def _plan_text(ra: dict, rb: dict) -> str:
    """"the same plan" or how many of its lines differ (the settings they change are listed below)."""
    a, b = (ra.get("plan_text") or "").splitlines(), (rb.get("plan_text") or "").splitlines()
    if a == b:
        return "the same plan"
    import difflib

    changed = sum(1 for line in difflib.ndiff(a, b) if line[:1] in "+-")
    return f"plans differ in {changed} line{'' if changed == 1 else 's'}"


def _apart(a: str | None, b: str | None) -> str:
    try:
        s = abs((datetime.fromisoformat(b.rstrip("Z")) - datetime.fromisoformat(a.rstrip("Z"))).total_seconds())
    except (AttributeError, TypeError, ValueError):
        return "an unknown time"
    for unit, n in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.1f} {unit}"
    return f"{s:.0f} s"


def _text(v) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, bool):
        return "on" if v else "off"
    return " ".join(str(v).split())


def _pairs(kind: str, prefix: str, a: dict, b: dict) -> list[Change]:
    return [Change(kind, f"{prefix}{k}", _text(a.get(k)), _text(b.get(k)))
            for k in sorted(set(a) | set(b)) if _text(a.get(k)) != _text(b.get(k))]


def _machine(ea: dict, eb: dict) -> list[Change]:
    ga, gb = _guest_versions(ea), _guest_versions(eb)
    out = _pairs("guest", "", {k: v for k, v in ga.items() if k in gb}, {k: v for k, v in gb.items() if k in ga})
    out += _pairs("kernel", "", {k: ea.get(k) for k in ("kernel", "kernel_version", "cmdline")},
                 {k: eb.get(k) for k in ("kernel", "kernel_version", "cmdline")})
    out += _pairs("accelerator", "", _guests(ea, "accel"), _guests(eb, "accel"))
    out += _pairs("sysctl", "sysctl ", ea.get("sysctls") or {}, eb.get("sysctls") or {})
    out += _pairs("version", "", {**(ea.get("versions") or {}), **_dpdk(ea)}, {**(eb.get("versions") or {}), **_dpdk(eb)})
    out += _pairs("cpu", "", {k: ea.get(k) for k in ("cpu_model", "cpus", "governor")},
                  {k: eb.get(k) for k in ("cpu_model", "cpus", "governor")})
    return out


def _guest_versions(env: dict) -> dict:
    """Each guest's kernel (release, package version, archive suite) and QEMU version (_machine compares
    the fields both runs recorded: an older offlab stored no package version or suite)."""
    out = {}
    for field in GUEST_VERSIONS:
        out.update(_guests(env, field))
    return out


def _guests(env: dict, field: str) -> dict:
    """{"guest server accel": "kvm"} per guest of the run's labs, keyed by lab position and role."""
    out = {}
    for i, lab in enumerate(env.get("labs") or []):
        for role, host in (lab.get("hosts") or {}).items():
            g = host.get("guest") or {}
            if field in g:
                out[f"{_lab_tag(i, lab)}guest {role} {field.replace('_', ' ')}"] = g[field]
    return out


def cell_versions(samples: Iterable[SampleRecord]) -> dict[int, dict[str, str]]:
    """cell id → the guest kernel and QEMU versions its samples ran on, keyed as in a run's environment
    ("guest client kernel release"): cells of one run differ in them when the plan has a kernel or QEMU axis."""
    out: dict[int, dict[str, str]] = {}
    for s in samples:
        for role, g in ((s.sample or StoredSample()).guests or {}).items():
            for name in GUEST_VERSIONS:
                if getattr(g, name, None):
                    out.setdefault(s.cell_id, {}).setdefault(f"guest {role} {name.replace('_', ' ')}", getattr(g, name))
    return out


def version_changes(a: dict[str, str], b: dict[str, str]) -> list[Change]:
    """The guest kernel and QEMU versions two cells ran on, where they differ (only fields both recorded)."""
    return _pairs("guest", "", {k: v for k, v in a.items() if k in b}, {k: v for k, v in b.items() if k in a})


def _dpdk(env: dict) -> dict:
    """DPDK's version as testpmd or OVS-DPDK reported it, per lab."""
    out = {}
    for i, lab in enumerate(env.get("labs") or []):
        if (lab.get("testpmd") or {}).get("version"):
            out[f"{_lab_tag(i, lab)}dpdk-testpmd"] = lab["testpmd"]["version"]
        if (lab.get("ovs") or {}).get("dpdk_version"):
            out[f"{_lab_tag(i, lab)}OVS DPDK"] = lab["ovs"]["dpdk_version"]
    return out


def _lab_tag(i: int, lab: dict) -> str:
    return f"lab {i + 1} ({lab.get('topology')}) " if i else ""


def _iface_keys(env: dict) -> dict[str, str]:
    """interface name → "role:to-peer" (or "role:kind#n"), over every lab of the run."""
    out = {}
    for lab in env.get("labs") or []:
        for role, host in (lab.get("hosts") or {}).items():
            for n, iface in enumerate(host.get("interfaces") or []):
                tail = f"to-{iface['peer_host']}" if iface.get("peer_host") else f"{iface.get('kind')}#{n}"
                out[iface["name"]] = f"{role}:{tail}"
    return out


def _table(env: dict) -> dict[str, dict]:
    """"role:to-peer" (after a lab tag beyond the first lab) → the interface as its lab came up."""
    keys, out = _iface_keys(env), {}
    for i, lab in enumerate(env.get("labs") or []):
        for host in (lab.get("hosts") or {}).values():
            for iface in host.get("interfaces") or []:
                out[_lab_tag(i, lab) + keys[iface["name"]]] = iface
    return out


def _interfaces(ea: dict, eb: dict) -> list[Change]:
    """Offload features and MTUs of every lab interface as the run's labs came up."""
    ta, tb = _table(ea), _table(eb)
    out = []
    for name in [n for n in ta if n in tb]:
        a, b = ta[name], tb[name]
        out += _pairs("mtu", f"{name} ", {"mtu": a.get("mtu")}, {"mtu": b.get("mtu")})
        fa, fb = a.get("features") or {}, b.get("features") or {}
        out += _pairs("feature", f"{name} ", {k: fa.get(k) for k in fa if k in fb}, {k: fb[k] for k in fa if k in fb})
    return out


def _in_force(store: Store, ra: dict, rb: dict, ea: dict, eb: dict) -> list[Change]:
    """The settings each cell held during its samples (read back at the end of each window), matched by
    cell key, host role and peer: a feature or sysctl one run's plan set and the other's did not, or set
    otherwise, or that the system would not take. Where a run did not set it, the other run's record of
    the value it found before setting it stands in (`not set by the plan; as run N found it`)."""
    def held(run: dict, env: dict) -> tuple[dict, dict]:
        keys, cells = _iface_keys(env), {c["id"]: c["key"] for c in store.cells(run["id"])}
        # every measured cell, also one that held nothing: against a cell that held a sysctl it is the change
        value: dict[str, dict[tuple[str, str], str]] = {}
        found: dict[str, dict[tuple[str, str], str]] = {}

        def place(where: str) -> str:
            host, _, iface = where.partition(":")
            return keys.get(iface, where) if iface else host

        for s in records(store.samples(run["id"])):
            sample, cell = s.sample or StoredSample(), cells.get(s.cell_id, "?")
            value.setdefault(cell, {})
            for item in sample.in_force or []:
                value.setdefault(cell, {})[(place(item.where or "?"), item.key)] = _text(item.value)
            for o in sample.knobs or []:
                if o.original is not None:
                    found.setdefault(cell, {}).setdefault((place(o.where or "?"), o.key), _text(o.original))
        return value, found

    (ha, fa), (hb, fb) = held(ra, ea), held(rb, eb)

    def unset(found: dict, cell: str, key: tuple[str, str], other: dict) -> str:
        if key in found.get(cell, {}):
            return f"{found[cell][key]} (not set by the plan; as run {other['id']} found it)"
        return "not set by the plan"

    counts: dict[tuple[str, str, str, str], int] = {}
    common = [k for k in ha if k in hb]
    for cell in common:
        for key in set(ha[cell]) | set(hb[cell]):
            a = ha[cell].get(key) or unset(fb, cell, key, rb)
            b = hb[cell].get(key) or unset(fa, cell, key, ra)
            if a != b:
                counts[(*key, a, b)] = counts.get((*key, a, b), 0) + 1
    out = []
    for (place, key, a, b), n in counts.items():
        kind = "sysctl" if "." in key else "mtu" if key == "mtu" else "feature" if ":" in place else "setting"
        out.append(Change(kind, f"{place} {key}", a, b, f"held during the samples of {n} of {len(common)} cells"))
    return out


def _load(store: Store, ra: dict, rb: dict, ea: dict, eb: dict) -> list[Change]:
    """CPU steal during the samples and the load average when each run started, where they differ enough."""
    def steal(run: dict) -> float | None:
        vals = [((s.sample or StoredSample()).probes.cpu.system or Cpu()).steal_pct
                for s in records(store.samples(run["id"]))]
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    out = []
    sa, sb = steal(ra), steal(rb)
    if sa is not None and sb is not None and abs(sa - sb) >= STEAL_POINTS:
        out.append(Change("load", "CPU steal during the samples (mean)", f"{sa:.1f} %", f"{sb:.1f} %"))
    la, lb = ea.get("loadavg"), eb.get("loadavg")
    if la is not None and lb is not None and max(la, lb) >= 1 and max(la, lb) >= LOAD_RATIO * max(min(la, lb), 0.1):
        out.append(Change("load", "load average (1 min) when the run started", f"{la:.2f}", f"{lb:.2f}"))
    return out


def lines(diff: EnvDiff, limit: int = 20) -> list[str]:
    """The diff as lines people read: the view, then each change, most likely cause first."""
    out = [f"environment, run {diff.run_a} → run {diff.run_b} ({diff.view}):"]
    if diff.missing:
        return out
    if not diff.changes:
        return out + ["  no difference in kernel, cmdline, accelerator, interfaces, sysctls, settings held, "
                      "versions, CPU or load"]
    out += [f"  {c.line()}" for c in diff.changes[:limit]]
    if len(diff.changes) > limit:
        out.append(f"  … {len(diff.changes) - limit} more (--json lists every one)")
    return out


def diffs(store: Store, runs: Iterable[int]) -> list[EnvDiff]:
    """Each run after the first against the first, as `compare A B [C …]` compares their cells."""
    runs = list(runs)
    if len(runs) < 2:
        raise BadInput("an environment difference needs two runs: offlab compare RUN_A RUN_B")
    return [env_diff(store, runs[0], other) for other in runs[1:]]
