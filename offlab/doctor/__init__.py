"""`offlab doctor`: audit a host against seed 002's KVM + Linux bridge + virtio tuning guide.

    report = audit(LiveSource())                       # this machine
    report = audit(open_root("sosreport-host-123/"))   # a customer's sosreport

Each check (offlab/doctor/checks/) reads through a Source and returns an
Outcome; `audit` adds what never changes (id, area, title, why, needs_root),
grades it for --target-pps and returns one Report that text and JSON both use.
"""

from __future__ import annotations

import time

from offlab.doctor.checks import all_checks
from offlab.doctor import tiers
from offlab.doctor.model import Finding, Outcome, Report
from offlab.doctor.registry import CheckSpec, Context, NotApplicable, Skip
from offlab.doctor.source import CapturedTree, Denied, LiveSource, Source, SosReport, open_root
from offlab.errors import BadInput
from offlab.names import check_ifname

__all__ = ["audit", "open_root", "LiveSource", "Report", "Finding", "all_checks"]

NEEDS_ROOT = "needs root to observe: run as root (sudo offlab doctor)"
READ_FROM_MAX = 16


def _call(spec: CheckSpec, ctx: Context, iface: str | None) -> Outcome | None:
    """One check's outcome; a Skip, a denied read or a crash becomes a skip, NotApplicable None."""
    try:
        return spec.func(ctx, iface) if spec.per_iface else spec.func(ctx)
    except NotApplicable:
        return None
    except Skip as exc:
        return Outcome("skip", str(exc))
    except Denied as exc:
        return Outcome("skip", f"{exc.path} is readable only by root: run as root (sudo offlab doctor)")
    except Exception as exc:  # one broken check (odd customer data) must not hide the others
        return Outcome("skip", f"check crashed: {type(exc).__name__}: {exc}",
                       {"error": f"{type(exc).__name__}: {exc}"})


def default_ifaces(ctx: Context) -> list[str]:
    """The NICs (links with a device behind them); in a namespace without any, its veths."""
    names = [l.ifname for l in ctx.links if l.ifname and l.ifname != "lo"]
    devices = [n for n in names if ctx.has_device(n)]
    if devices:
        return devices
    return [l.ifname for l in ctx.links if l.kind == "veth" and l.ifname]


def audit(src: Source, *, ifaces: list[str] | None = None, target_pps: int | None = None,
          sample_seconds: float = 1.0, netns: str | None = None, only: set[str] | None = None) -> Report:
    """Run every registered check (or those in `only`) against `src`."""
    start = time.monotonic()
    target = tiers.tier_for(target_pps) if target_pps is not None else None
    if not 0 < sample_seconds <= 60:
        raise BadInput(f"--sample {sample_seconds:g} is out of range: use 0 < seconds ≤ 60")
    netns = netns or src.netns
    ctx = Context(src, netns=netns, sample_seconds=sample_seconds, target_pps=target_pps)
    known = [l.ifname for l in ctx.links]
    if ifaces:
        for name in ifaces:
            check_ifname(name)
            if name not in known:
                raise BadInput(f"no interface {name!r} in {src.label}: it has {', '.join(n for n in known if n)}")
        ctx.ifaces = list(dict.fromkeys(ifaces))
    else:
        ctx.ifaces = default_ifaces(ctx)
    if only:
        unknown = only - {s.id for s in all_checks()}
        if unknown:
            raise BadInput(f"unknown check id(s) {', '.join(sorted(unknown))}: see `offlab doctor --list`")
    findings: list[Finding] = []
    for spec in all_checks():
        if only and spec.id not in only:
            continue
        targets = ctx.ifaces if spec.per_iface else [None]
        for target_iface in targets:
            f = _run_one(spec, ctx, target_iface, target)
            if f is not None:
                findings.append(f)
    host = {
        "name": ctx.value("/proc/sys/kernel/hostname"),
        "kernel": ctx.value("/proc/sys/kernel/osrelease"),
        "source": src.kind,
        "root": str(src.root) if isinstance(src, (CapturedTree, SosReport)) else None,
        "netns": netns,
        "privileged": src.privileged,
        "cpus": len(ctx.cpus_online),
        "interfaces": ctx.ifaces,
    }
    if src.kind == "sosreport":
        host["collected"] = src.collected  # a sosreport's facts are as of then, not now
    return Report(host=host, target_pps=target_pps, tier=target.to_json() if target else None,
                  sample_seconds=sample_seconds if src.kind == "live" else None,
                  findings=findings, duration_s=time.monotonic() - start)


def _run_one(spec: CheckSpec, ctx: Context, iface: str | None, target: tiers.Tier | None) -> Finding | None:
    if spec.needs_root and not ctx.src.privileged:
        outcome = Outcome("skip", NEEDS_ROOT)
    else:
        with ctx.src.recording() as read_from:
            outcome = _call(spec, ctx, iface)
        if outcome is None:
            return None
        if read_from and ctx.src.kind == "sosreport":
            # which files of the report this finding stands on, relative to its root
            shown = read_from[:READ_FROM_MAX] + ([f"... and {len(read_from) - READ_FROM_MAX} more"]
                                                 if len(read_from) > READ_FROM_MAX else [])
            outcome.evidence = {**outcome.evidence, "read_from": shown}
    status = tiers.grade(outcome.status, spec.tier, target)
    return Finding(
        id=spec.id, area=spec.area, title=spec.title, target=iface, status=status,
        raw_status=outcome.status, tier=spec.tier, summary=outcome.summary, evidence=outcome.evidence,
        why=spec.why, fix=outcome.fix if outcome.status not in ("ok", "skip") else None,
        changes=outcome.changes if outcome.status not in ("ok", "skip") else [],
        needs_root=spec.needs_root,
    )
