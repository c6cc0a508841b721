"""The packet path in the kernel: bridge netfilter, firewall rules, NAPI budgets, softnet drops."""

from __future__ import annotations

import re

from offlab import netdev
from offlab.doctor import parse
from offlab.doctor.model import FixChange, Outcome
from offlab.doctor.registry import Context, Skip, check, no_data

BR_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"

# The guide's 调整 NAPI 参数 values.
NAPI_GUIDE = {
    "net.core.netdev_max_backlog": 100000,
    "net.core.netdev_budget": 50000,
    "net.core.netdev_budget_usecs": 5000,
    "net.core.dev_weight": 6000,
}


def bridges(ctx: Context) -> list[str]:
    if not ctx.links:
        raise no_data("no interface list (ip -d -j link, ip -d address, /sys/class/net)")
    return [l.ifname for l in ctx.links if l.ifname and ctx.is_bridge(l.ifname)]


def sysctls_readable(ctx: Context) -> bool:
    """Whether this source shows /proc/sys at all (a sosreport: its sysctl -a); net.core.somaxconn always exists."""
    return ctx.value("/proc/sys/net/core/somaxconn") is not None


@check("bridge.netfilter", area="bridge", title="Bridge netfilter (bridge-nf-call-iptables)", tier="aggressive",
       why="with br_netfilter every bridged frame also walks iptables; the guide sets bridge-nf-call-iptables=0")
def bridge_netfilter(ctx: Context) -> Outcome:
    brs = bridges(ctx)
    value = ctx.value(BR_NF)
    evidence = {"bridges": brs, "bridge-nf-call-iptables": value,
                "bridge-nf-call-ip6tables": ctx.value("/proc/sys/net/bridge/bridge-nf-call-ip6tables")}
    if not brs:
        return Outcome("ok", "no Linux bridges here" + (f" (bridge-nf-call-iptables={value})" if value else ""),
                       evidence)
    if value is None and not sysctls_readable(ctx):
        raise no_data(f"{BR_NF} (no sysctl values here: sos_commands/kernel/sysctl_-a in a sosreport)")
    if value is None:
        return Outcome("ok", f"br_netfilter not loaded: frames on {', '.join(brs)} skip iptables", evidence)
    if value.strip() == "0":
        return Outcome("ok", f"bridge-nf-call-iptables=0 for {', '.join(brs)}", evidence)
    return Outcome("warn", f"bridge-nf-call-iptables={value}: frames on {', '.join(brs)} walk iptables", evidence,
                   fix="sysctl -w net.bridge.bridge-nf-call-iptables=0",
                   changes=[FixChange("net.bridge.bridge-nf-call-iptables", 0)])


@check("bridge.mtu", area="mtu", title="MTU consistency along each bridge", tier=None,
       why="a bridge drops, without an ICMP, every frame larger than the egress port's MTU: a silent black hole")
def bridge_mtu(ctx: Context) -> Outcome:
    brs = bridges(ctx)
    if not brs:
        return Outcome("ok", "no Linux bridges here", {"bridges": {}})
    table, bad = {}, {}
    for br in brs:
        ports = {l.ifname: l.mtu for l in ctx.links if l.master == br}
        table[br] = {"mtu": ctx.mtu(br), "ports": ports}
        values = [m for m in ports.values() if m is not None]
        if values and len(set(values)) > 1:
            bad[br] = ports
    evidence = {"bridges": table}
    if not bad:
        text = "; ".join(f"{br} {t['mtu']} ({len(t['ports'])} ports)" for br, t in table.items())
        return Outcome("ok", f"ports agree: {text}", evidence)
    fixes, changes, parts = [], [], []
    for br, ports in bad.items():
        values = sorted(ports.values())
        want = max(set(values), key=lambda m: (values.count(m), m))
        odd = {p: m for p, m in ports.items() if m != want}
        parts.append(f"{br}: " + ", ".join(f"{p} {m}" for p, m in odd.items()) + f" vs {want} elsewhere")
        for p in odd:
            fixes.append(f"ip link set {p} mtu {want}")
            changes.append(FixChange("mtu", want, p))
    return Outcome("fail", "port MTUs differ — " + "; ".join(parts), evidence, fix="; ".join(fixes), changes=changes)


def _count(ctx: Context, attempts: list[tuple[list[str], str]]) -> tuple[int | None, str | None]:
    """The first listing that answers, counted with its parser; (None, None) when none does."""
    for argv, style in attempts:
        out = ctx.run(argv)
        if out is None or not out.ok:
            continue
        if style == "save":
            return parse.count_save_rules(out.stdout), " ".join(argv)
        if style == "nft":
            return parse.count_nft_rules(parse.strip_nft_handles(out.stdout)), " ".join(argv)
        return parse.count_list_rules(out.stdout), " ".join(argv)
    return None, None


def _xtables_in_nft(ctx: Context, listed_with: str | None) -> set[str]:
    """Which of iptables/ip6tables/ebtables the nft ruleset already holds (the tables their -nft variants make)."""
    if not listed_with:
        return set()
    out = ctx.run(listed_with.split())
    text = out.stdout if out is not None else ""
    families = {"ip": "iptables", "ip6": "ip6tables", "bridge": "ebtables"}
    found = re.findall(r"^table (ip|ip6|bridge) (?:filter|nat|mangle|raw|security|broute)\b", text, re.M)
    return {families[f] for f in found}


@check("firewall.rules", area="firewall", title="iptables / ebtables / nftables rules", tier="aggressive",
       needs_root=True,
       why="every rule is evaluated per packet; where security groups are not needed the guide flushes "
           "iptables, ebtables and nft and unloads their modules")
def firewall_rules(ctx: Context) -> Outcome:
    counts, sources = {}, {}
    plans = {
        "iptables": [(["iptables-save"], "save"), (["iptables", "-vnxL"], "list")],
        "ip6tables": [(["ip6tables-save"], "save"), (["ip6tables", "-vnxL"], "list")],
        "ebtables": [(["ebtables-save"], "save"), (["ebtables", "-t", "filter", "-L"], "list")],
        "nft": [(["nft", "list", "ruleset"], "nft"), (["nft", "-a", "list", "ruleset"], "nft")],  # sos 4: -a
    }
    for tool, attempts in plans.items():
        n, how = _count(ctx, attempts)
        if n is not None:
            counts[tool], sources[tool] = n, how
    tables = (ctx.value("/proc/net/ip_tables_names") or "").split()
    conntrack = ctx.int_value("/proc/sys/net/netfilter/nf_conntrack_count")
    evidence = {"rules": counts, "listed_with": sources, "legacy_ip_tables": tables, "conntrack_entries": conntrack}
    if not counts:
        if tables:
            return Outcome("warn", f"iptables tables loaded ({', '.join(tables)}) but no tool to list their rules",
                           evidence, fix="apt-get install iptables nftables, then rerun")
        raise no_data("no iptables, ip6tables, ebtables or nft here to list rules (and no legacy tables loaded)")
    # iptables-nft (RHEL 8+, Debian 10+) keeps iptables' rules as nft tables: they are in the nft count already
    nft_backed = sorted(_xtables_in_nft(ctx, sources.get("nft")) & {t for t in counts if t != "nft"})
    evidence["counted_in_nft"] = nft_backed
    total = sum(n for t, n in counts.items() if t not in nft_backed)
    shown = ", ".join(f"{t} {n}" + (" (in nft)" if t in nft_backed else "") for t, n in counts.items())
    if total == 0:
        return Outcome("ok", f"no rules ({shown})", evidence)
    fix = []
    if counts.get("nft"):
        fix.append("nft flush ruleset")
    if counts.get("iptables"):
        fix += ["iptables -w -F", "iptables -w -X", "iptables -w -t nat -F", "iptables -w -t raw -F",
                "iptables -w -t mangle -F"]
    if counts.get("ip6tables"):
        fix += ["ip6tables -w -F", "ip6tables -w -X"]
    if counts.get("ebtables"):
        fix += ["ebtables -F", "ebtables -X"]
    ct = f", {conntrack} conntrack entries" if conntrack else ""
    return Outcome("warn", f"{total} rules ({shown}){ct}", evidence,
                   fix="; ".join(fix) + "   # only where security groups are not needed")


@check("napi.sysctls", area="napi", title="NAPI and backlog sysctls", tier="aggressive",
       why="a larger budget lets NAPI poll longer per softirq and a deeper backlog absorbs bursts "
           "(the guide's values; check /proc/net/softnet_stat first)")
def napi_sysctls(ctx: Context) -> Outcome:
    values = {}
    for key in NAPI_GUIDE:
        values[key] = ctx.int_value("/proc/sys/" + key.replace(".", "/"))
    if all(v is None for v in values.values()):
        raise no_data("net.core NAPI sysctls (/proc/sys/net/core; sos_commands/kernel/sysctl_-a in a sosreport)")
    low = {k: v for k, v in values.items() if v is not None and v < NAPI_GUIDE[k]}
    evidence = {"values": values, "guide": NAPI_GUIDE}
    if not low:
        return Outcome("ok", "at or above the guide's values", evidence)
    shown = ", ".join(f"{k.split('.')[-1]} {v} < {NAPI_GUIDE[k]}" for k, v in low.items())
    return Outcome("warn", shown, evidence,
                   fix="sysctl -w " + " ".join(f"{k}={NAPI_GUIDE[k]}" for k in low),
                   changes=[FixChange(k, NAPI_GUIDE[k]) for k in low])


@check("napi.softnet", area="napi", title="softnet drops and time_squeeze, per second now", tier=None,
       why="'dropped' means a CPU's backlog overflowed (netdev_max_backlog); 'time_squeeze' means NAPI ran out "
           "of budget with work left (netdev_budget / _usecs)")
def softnet(ctx: Context) -> Outcome:
    snaps = ctx.src.sample("/proc/net/softnet_stat", ctx.sample_seconds)
    if not snaps:
        raise no_data("/proc/net/softnet_stat")
    try:
        first = netdev.parse_softnet(snaps[0][1])
    except ValueError:  # not hex rows: a damaged copy
        raise no_data("/proc/net/softnet_stat holds no hex counter rows") from None
    boot = {"processed": sum(r.processed for r in first), "dropped": sum(r.dropped for r in first),
            "time_squeeze": sum(r.time_squeeze for r in first)}
    if len(snaps) < 2:
        raise Skip(f"one snapshot only (since boot: {boot['dropped']} dropped, {boot['time_squeeze']} squeezed); "
                   "rates need two — capture with offlab doctor --capture")
    dt = snaps[-1][0] - snaps[0][0]
    last = {r.cpu: r for r in netdev.parse_softnet(snaps[-1][1])}
    per_cpu = {}
    for r in first:
        b = last.get(r.cpu)
        if b is None or dt <= 0:
            continue
        per_cpu[r.cpu] = {"processed_per_s": round((b.processed - r.processed) / dt, 1),
                          "dropped_per_s": round((b.dropped - r.dropped) / dt, 1),
                          "squeezed_per_s": round((b.time_squeeze - r.time_squeeze) / dt, 1)}
    drops = {c: v["dropped_per_s"] for c, v in per_cpu.items() if v["dropped_per_s"] > 0}
    squeezes = {c: v["squeezed_per_s"] for c, v in per_cpu.items() if v["squeezed_per_s"] > 0}
    pps = sum(v["processed_per_s"] for v in per_cpu.values())
    evidence = {"window_s": round(dt, 3), "per_cpu": per_cpu, "since_boot": boot}
    if drops:
        cpus = ", ".join(f"CPU {c}: {v:g}/s" for c, v in drops.items())
        return Outcome("fail", f"backlog drops over {dt:.1f} s ({cpus})", evidence,
                       fix="sysctl -w net.core.netdev_max_backlog=100000   # and spread rx: RPS or more queues",
                       changes=[FixChange("net.core.netdev_max_backlog", 100000)])
    if squeezes:
        cpus = ", ".join(f"CPU {c}: {v:g}/s" for c, v in squeezes.items())
        return Outcome("warn", f"NAPI budget exhausted over {dt:.1f} s ({cpus})", evidence,
                       fix="sysctl -w net.core.netdev_budget=50000 net.core.netdev_budget_usecs=5000",
                       changes=[FixChange("net.core.netdev_budget", 50000),
                                FixChange("net.core.netdev_budget_usecs", 5000)])
    return Outcome("ok", f"no drops or squeezes in {dt:.1f} s ({pps:,.0f} packets/s processed)", evidence)
