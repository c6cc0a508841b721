"""Whether offlab's DPDK labs can run here: testpmd, OVS-DPDK and the PMDs installed; hugepages or --no-huge.

offlab's `dpdk`, `ovs-dpdk` and `ovs-dpdk-vm` labs need no NIC and no hugepages: they run DPDK with
`--no-huge` (and `--legacy-mem` for OVS) over the tap, af_packet and vhost-user PMDs. The facts are
Debian's package database (one `dpkg-query`, so a capture replays it) and /proc/meminfo. A sosreport
describes another machine, not the one offlab builds its labs on: no finding there.
"""

from __future__ import annotations

from offlab.doctor import parse
from offlab.doctor.model import Outcome
from offlab.doctor.registry import Context, NotApplicable, check, no_data
from offlab.hosts import TOOL_PACKAGES

# what each lab needs → the Debian package that brings it (PMD packages carry the DPDK ABI: a glob)
PACKAGES = {tool: TOOL_PACKAGES[tool] for tool in ("dpdk-testpmd", "ovs-vswitchd-dpdk")} | {
    "the tap PMD": "librte-net-tap*", "the af_packet PMD": "librte-net-af-packet*", "the vhost PMD": "librte-net-vhost*"}
QUERY = ["dpkg-query", "-W", "-f", "${db:Status-Abbrev}${Package} ${Version}\\n", *PACKAGES.values()]


def installed(text: str) -> dict[str, str]:
    """`dpkg-query -W -f '${db:Status-Abbrev}${Package} ${Version}\\n'` → {package: version} of installed ones."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ii":
            out[parts[1]] = parts[2]
    return out


def _has(pkgs: dict[str, str], wanted: str) -> str | None:
    """The installed package matching `wanted` (a name, or a prefix glob)."""
    if wanted.endswith("*"):
        return next((p for p in sorted(pkgs) if p.startswith(wanted[:-1])), None)
    return wanted if wanted in pkgs else None


@check("dpdk.runnable", area="dpdk", title="DPDK labs (testpmd, OVS-DPDK) can run here", tier=None,
       why="offlab's dpdk labs need dpdk-testpmd or ovs-vswitchd-dpdk and the tap, af_packet and vhost PMDs; "
           "without hugepages they run with --no-huge (OVS also --legacy-mem)")
def runnable(ctx: Context) -> Outcome:
    if ctx.src.kind == "sosreport":
        raise NotApplicable("a sosreport's host is not where offlab builds its DPDK labs")
    out = ctx.run(QUERY, "dpkg-query_dpdk")
    if out is None:
        raise no_data("no dpkg-query: not a Debian system, whose packages offlab's DPDK labs use")
    pkgs = installed(out.stdout)
    text = ctx.read("/proc/meminfo")
    huge = parse.meminfo(text).get("HugePages_Total") if text is not None else None
    found = {what: _has(pkgs, pkg) for what, pkg in PACKAGES.items()}
    evidence = {"packages": {p: pkgs[p] for p in found.values() if p}, "hugepages_total": huge}
    memory = ("no hugepages reserved: offlab runs DPDK with --no-huge (OVS: --no-huge --legacy-mem)"
              if not huge else f"{huge} hugepages reserved (offlab still runs DPDK with --no-huge)")
    missing = [what for what, pkg in found.items() if pkg is None]
    if not missing:
        return Outcome("ok", f"dpdk-testpmd, ovs-vswitchd-dpdk and the tap, af_packet and vhost PMDs are "
                             f"installed (DPDK {pkgs.get('dpdk-dev', '?')}); {memory}", evidence)
    fix = sorted({PACKAGES[w].rstrip("*") if not PACKAGES[w].endswith("*") else "dpdk" for w in missing})
    status = "fail" if "dpdk-testpmd" in missing and "ovs-vswitchd-dpdk" in missing else "warn"
    return Outcome(status, f"missing {', '.join(missing)}; {memory}", evidence, fix=f"apt-get install {' '.join(fix)}")
