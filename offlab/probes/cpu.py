"""CPU during the traffic window: per-CPU /proc/stat deltas and per-process /proc/PID/stat."""

from __future__ import annotations

import os

from offlab.sample import Cpu

# /proc/stat cpuN columns (man 5 proc), in USER_HZ ticks.
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")


def parse_proc_stat(text: str) -> dict[str, dict[str, int]]:
    """{"cpu0": {"user": .., ...}, ...} — only the per-CPU lines, not the "cpu" total."""
    cpus = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu") and parts[0] != "cpu":
            cpus[parts[0]] = dict(zip(STAT_FIELDS, (int(x) for x in parts[1:]), strict=False))
    return cpus


# A share of stolen time above this makes a sample noisy on a virtual machine: flagged.
NOTABLE_STEAL_PCT = 2.0


def cpu_split(before: dict[str, int], after: dict[str, int]) -> Cpu:
    """Percent of one CPU's time in user/system/softirq/irq/idle/steal over the window.

    Busy is user + nice + system + irq + softirq: time this CPU worked for us. Steal (the
    hypervisor ran someone else) is neither busy nor idle; it is reported on its own.
    """
    d = {k: after.get(k, 0) - before.get(k, 0) for k in STAT_FIELDS}
    # guest time is already counted in user; keep the buckets disjoint.
    total = sum(d[k] for k in STAT_FIELDS if k not in ("guest", "guest_nice"))
    if total <= 0:
        return Cpu.keyed(**{k: 0.0 for k in ("user", "system", "softirq", "irq", "idle", "steal", "busy")})
    pct = lambda *ks: 100.0 * sum(d[k] for k in ks) / total  # noqa: E731
    user, system, softirq, irq = pct("user", "nice"), pct("system"), pct("softirq"), pct("irq")
    return Cpu.keyed(user=user, system=system, softirq=softirq, irq=irq, idle=pct("idle", "iowait"),
                     steal=pct("steal"), busy=user + system + softirq + irq)


def parse_pid_stat(text: str) -> tuple[str, int, int]:
    """(comm, utime, stime) in ticks from /proc/PID/stat; comm may contain spaces and parens."""
    lpar, rpar = text.index("("), text.rindex(")")
    comm = text[lpar + 1 : rpar]
    rest = text[rpar + 2 :].split()
    # fields after comm start at field 3 (state); utime is field 14, stime field 15.
    return comm, int(rest[11]), int(rest[12])


def process_ticks(pid: int) -> tuple[str, int] | None:
    """(comm, utime+stime) of pid and all its threads (the process total), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            comm, ut, st = parse_pid_stat(f.read())
    except (OSError, ValueError):
        return None
    return comm, ut + st


def kernel_threads(prefixes: tuple[str, ...]) -> dict[int, str]:
    """pid → comm for threads such as ksoftirqd/N or ovs-vswitchd, found by name."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm.startswith(prefixes):
            found[int(entry)] = comm
    return found


def ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


def system_time(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], hz: int) -> Cpu:
    """CPU seconds the whole system was busy (and stolen) between two /proc/stat readings.

    netperf's service demand divides this — utilisation × number of CPUs × time — by the
    data moved; summing per-CPU ticks is the same quantity without rounding a percentage.
    """
    busy = steal = total = 0
    for name, a in before.items():
        b = after.get(name)
        if b is None:
            continue
        busy += sum(b.get(k, 0) - a.get(k, 0) for k in BUSY_FIELDS)
        steal += b.get("steal", 0) - a.get("steal", 0)
        total += sum(b.get(k, 0) - a.get(k, 0) for k in STAT_FIELDS if k not in ("guest", "guest_nice"))
    cpus = len([n for n in before if n in after])
    return Cpu.keyed(cpus=cpus, busy_s=busy / hz, steal_s=steal / hz,
                     busy_pct=100.0 * busy / total if total > 0 else 0.0,
                     steal_pct=100.0 * steal / total if total > 0 else 0.0)
