"""The text view of a doctor report: one table per area, mlnx_tune's 'finding >>> fix' style."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from offlab.doctor.model import Report
from offlab.doctor.checks import all_checks
from offlab.doctor.registry import AREAS

STYLE = {"ok": "green", "info": "cyan", "skip": "dim", "warn": "yellow", "fail": "bold red"}
AREA_TITLES = {
    "platform": "Target rate", "cpu": "CPU", "kernel": "Kernel", "kvm": "KVM / vhost", "nic": "NIC",
    "irq": "Interrupts", "napi": "NAPI / softnet", "bridge": "Bridge", "firewall": "Firewall",
    "mtu": "MTU", "ovs": "Open vSwitch", "dpdk": "DPDK (testpmd, OVS-DPDK)",
}


def render(report: Report, console: Console, *, verbose: bool = False) -> None:
    h = report.host
    where = h.get("netns") or h.get("root") or "this host"
    who = "as root" if h.get("privileged") else "not as root: root-only checks skipped"
    console.print(Text.assemble(("offlab doctor", "bold"), f" — {h.get('name') or '?'} "
                                f"(kernel {h.get('kernel') or '?'}, {h.get('source')}: {where}, {who})"))
    if h.get("source") == "sosreport":
        console.print(f"facts as of {h.get('collected') or 'an unknown date (no sos_commands/date/date)'}")
    if report.tier:
        console.print(f"target {report.target_pps:,} pps → {report.tier['name']}: {report.tier['advice']}")
    else:
        console.print("no --target-pps: every finding graded as the guide states it")
    for area in AREAS:
        rows = [f for f in report.findings if f.area == area]
        if not rows:
            continue
        table = Table(title=AREA_TITLES[area], title_justify="left", title_style="bold", box=None,
                      show_header=False, pad_edge=False, expand=False)
        table.add_column("status", width=4, no_wrap=True)
        table.add_column("check", no_wrap=True)
        table.add_column("finding", overflow="fold")
        for f in rows:
            name = f.id + (f" {f.target}" if f.target else "")
            table.add_row(Text(f.status.upper() if f.status in ("warn", "fail") else f.status,
                               style=STYLE[f.status]), name, f.summary)
            if f.status in ("warn", "fail", "info") or verbose:
                table.add_row("", "", Text(f"why: {f.why}", style="dim"))
                if f.fix:
                    table.add_row("", "", Text(f">>> {f.fix}", style="bold"))
            if verbose and f.evidence.get("read_from"):
                table.add_row("", "", Text("read: " + ", ".join(f.evidence["read_from"]), style="dim"))
        console.print()
        console.print(table)
    s = report.summary()
    console.print()
    console.print(f"summary: {s['ok']} ok, {s['info']} info, {s['warn']} warn, {s['fail']} fail, "
                  f"{s['skip']} skip ({s['total']} findings, {report.duration_s:.1f} s)")
    fixable = sorted({f.id for f in report.findings if f.automatable and f.status in ("warn", "fail")})
    if fixable:
        console.print(f"automatable: offlab doctor --apply {' --apply '.join(fixable)}")


def render_list(console: Console) -> None:
    table = Table("id", "area", "tier", "root", "title", box=None)
    for spec in all_checks():
        table.add_row(spec.id, spec.area, spec.tier or "-", "yes" if spec.needs_root else "",
                      spec.title + (" (per interface)" if spec.per_iface else ""))
    console.print(table)
