"""CPU: SMT, frequency governor, idle states, NUMA nodes per socket (seed 002, 物理机配置)."""

from __future__ import annotations

from collections import Counter

from offlab.doctor import parse
from offlab.doctor.model import Outcome
from offlab.doctor.registry import Context, check, no_data

CPU = "/sys/devices/system/cpu"
DEEP_IDLE_US = 50  # exit latency above which an idle state costs a wake-up at high pps (C6 ~ 100 µs)


@check("cpu.smt", area="cpu", title="SMT (hyper-threading) and sibling threads", tier="aggressive",
       why="siblings share one core's caches: IO-bound vCPUs on two threads of a core evict each other")
def smt(ctx: Context) -> Outcome:
    control = ctx.value(f"{CPU}/smt/control")
    active = ctx.value(f"{CPU}/smt/active")
    groups = []
    for cpu in sorted(ctx.cpus_online):
        sib = ctx.value(f"{CPU}/cpu{cpu}/topology/thread_siblings_list")
        if sib and len(parse.cpulist(sib)) > 1 and sib not in groups:
            groups.append(sib)
    if control is None and not groups and active is None:
        threads = ctx.lscpu.get("Thread(s) per core", "")
        if not threads.isdigit():
            raise no_data(f"neither {CPU}/smt, topology/thread_siblings_list nor lscpu's 'Thread(s) per core'")
        evidence = {"threads_per_core": int(threads), "sockets": ctx.lscpu.get("Socket(s)"),
                    "cores_per_socket": ctx.lscpu.get("Core(s) per socket")}
        if int(threads) <= 1:
            return Outcome("ok", "SMT off: 1 thread per core (lscpu)", evidence)
        return Outcome("warn", f"SMT on: {threads} threads per core (lscpu)", evidence,
                       fix="echo off > /sys/devices/system/cpu/smt/control   # or disable Hyper-Threading/SMT in the "
                           "BIOS; if SMT stays on, never pin two vCPUs of one VM to siblings")
    on = active == "1" or bool(groups)
    evidence = {"control": control, "active": active, "sibling_groups": len(groups),
                "siblings": groups[:16]}
    if not on:
        what = {"notsupported": "not supported by this CPU", "notimplemented": "not implemented",
                "forceoff": "forced off", "off": "off"}.get(control or "", "no sibling threads")
        return Outcome("ok", f"SMT {what}", evidence)
    example = groups[0] if groups else "?"
    return Outcome(
        "warn",
        f"SMT on: {len(groups)} cores with sibling threads (e.g. CPUs {example} share a core)",
        evidence,
        fix="echo off > /sys/devices/system/cpu/smt/control   # or disable Hyper-Threading/SMT in the BIOS; "
            "if SMT stays on, never pin two vCPUs of one VM to siblings",
    )


@check("cpu.governor", area="cpu", title="CPU frequency governor", tier="aggressive",
       why="the guide sets Energy Performance to Performance: a ramping clock adds latency and jitter per packet")
def governor(ctx: Context) -> Outcome:
    policies = [p for p in ctx.src.listdir(f"{CPU}/cpufreq") if p.startswith("policy")]
    if not policies and not ctx.present(CPU):
        return _governor_from_cpupower(ctx)
    if not policies:
        return Outcome("ok", "no cpufreq driver: the clock is set by firmware or the hypervisor",
                       {"cpufreq": False})
    govs: Counter[str] = Counter()
    epp: Counter[str] = Counter()
    for p in policies:
        g = ctx.value(f"{CPU}/cpufreq/{p}/scaling_governor")
        if g:
            govs[g] += 1
        e = ctx.value(f"{CPU}/cpufreq/{p}/energy_performance_preference")
        if e:
            epp[e] += 1
    evidence = {"cpufreq": True, "governors": dict(govs), "energy_performance_preference": dict(epp),
                "driver": ctx.value(f"{CPU}/cpufreq/{policies[0]}/scaling_driver")}
    slow = {g: n for g, n in govs.items() if g != "performance"}
    slow_epp = {e: n for e, n in epp.items() if e != "performance"}
    if not slow and not slow_epp:
        return Outcome("ok", f"governor performance on {sum(govs.values())} policies", evidence)
    what = ", ".join(f"{g} on {n}" for g, n in {**slow, **slow_epp}.items())
    return Outcome("warn", f"not running at performance: {what}", evidence,
                   fix="cpupower frequency-set -g performance   # and BIOS Energy Performance = Performance")


def _governor_from_cpupower(ctx: Context) -> Outcome:
    """A sosreport without /sys/devices/system/cpu: what `cpupower frequency-info` said of CPU 0."""
    out = ctx.run(["cpupower", "frequency-info"])
    info = parse.cpupower_frequency(out.stdout) if out is not None and out.ok else {}
    if not info.get("governor"):
        raise no_data(f"{CPU}/cpufreq not in this source, nor a governor in `cpupower frequency-info`")
    evidence = {"cpufreq": True, "governors": {info["governor"]: None}, "driver": info.get("driver"),
                "cpu": 0}
    if info["governor"] == "performance":
        return Outcome("ok", "governor performance on CPU 0 (cpupower)", evidence)
    return Outcome("warn", f"not running at performance: {info['governor']} on CPU 0 (cpupower)", evidence,
                   fix="cpupower frequency-set -g performance   # and BIOS Energy Performance = Performance")


@check("cpu.idle", area="cpu", title="CPU idle states (C-states)", tier="aggressive",
       why="deep C-states (C6) take ~100 µs to wake; when every core is busy with packets the guide turns them off")
def idle(ctx: Context) -> Outcome:
    driver = ctx.value(f"{CPU}/cpuidle/current_driver")
    gov = ctx.value(f"{CPU}/cpuidle/current_governor_ro") or ctx.value(f"{CPU}/cpuidle/current_governor")
    first = min(ctx.cpus_online) if ctx.cpus_online else 0
    states = []
    for s in ctx.src.listdir(f"{CPU}/cpu{first}/cpuidle"):
        if not s.startswith("state"):
            continue
        base = f"{CPU}/cpu{first}/cpuidle/{s}"
        states.append({"state": s, "name": ctx.value(f"{base}/name"),
                       "latency_us": ctx.int_value(f"{base}/latency"),
                       "disabled": ctx.value(f"{base}/disable") == "1"})
    evidence = {"driver": driver, "governor": gov, "cpu": first, "states": states}
    if driver is None and not states and not ctx.present(CPU):
        out = ctx.run(["cpupower", "idle-info"])  # a sosreport without the sysfs copy
        info = parse.cpupower_idle(out.stdout) if out is not None and out.ok else {}
        if not info.get("driver") and not info.get("states"):
            raise no_data(f"{CPU}/cpuidle not in this source, nor states in `cpupower idle-info`")
        driver, gov, first, states = info["driver"], info["governor"], 0, info["states"]
        evidence = {"driver": driver, "governor": gov, "cpu": 0, "states": states, "from": "cpupower idle-info"}
    if driver in (None, "none") and not states:
        return Outcome("ok", "no cpuidle driver: idle is a plain HLT/poll", evidence)
    deep = [s for s in states if (s["latency_us"] or 0) >= DEEP_IDLE_US and not s["disabled"]]
    if not deep:
        names = ", ".join(f"{s['name']} ({s['latency_us']} µs)" for s in states if not s["disabled"])
        return Outcome("ok", f"{driver}: no enabled state wakes slower than {DEEP_IDLE_US} µs ({names})", evidence)
    names = ", ".join(f"{s['name']} {s['latency_us']} µs" for s in deep)
    return Outcome("warn", f"{driver}: deep idle states enabled: {names}", evidence,
                   fix=f"cpupower idle-set -D {DEEP_IDLE_US}   # or BIOS: C6 Report off, Package C State limit C0")


@check("cpu.numa-nodes", area="cpu", title="NUMA nodes per socket (AMD: NPS=4)", tier="basic",
       why="AMD sockets have several memory controllers; exposing them (NPS=4) lets vCPUs, memory and the NIC stay close")
def numa_nodes(ctx: Context) -> Outcome:
    procs = ctx.cpus_info
    if procs:
        vendor, model = procs[0].get("vendor_id", ""), procs[0].get("model name")
        sockets = len({p.get("physical id") for p in procs if p.get("physical id") is not None}) or 1
    elif ctx.lscpu.get("Vendor ID"):  # a sosreport without /proc/cpuinfo
        vendor, model = ctx.lscpu["Vendor ID"], ctx.lscpu.get("Model name")
        sockets = int(ctx.lscpu["Socket(s)"]) if ctx.lscpu.get("Socket(s)", "").isdigit() else 1
    else:
        raise no_data("neither /proc/cpuinfo nor lscpu")
    sockets = max(sockets, 1)
    nodes = len(ctx.numa_nodes) or 1
    guest = ctx.guest
    evidence = {"vendor": vendor, "model": model, "sockets": sockets, "numa_nodes": nodes, "guest": guest}
    if vendor not in ("AuthenticAMD", "HygonGenuine"):
        return Outcome("ok", f"{vendor or 'this CPU'}: one NUMA node per socket is the norm ({nodes} node(s))",
                       evidence)
    if guest:
        return Outcome("ok", f"AMD guest with {nodes} NUMA node(s): NPS is the host's BIOS setting", evidence)
    if nodes / sockets >= 2:
        return Outcome("ok", f"AMD with {nodes} NUMA nodes on {sockets} socket(s)", evidence)
    return Outcome("warn", f"AMD with {nodes} NUMA node(s) on {sockets} socket(s) (NPS1)", evidence,
                   fix="BIOS: NUMA nodes per socket (NPS) = 4, then pin each VM inside one node")
