"""The environment a run was measured in, stored with it so two runs can be told apart."""

from __future__ import annotations

import os
import platform

from offlab import __version__
from offlab.hosts import LOCAL
from offlab.knobs import pending_changes
from offlab.lab.inspect import describe
from offlab.lab.model import LabState

SYSCTLS = (
    "net.core.netdev_budget", "net.core.netdev_budget_usecs", "net.core.netdev_max_backlog",
    "net.core.dev_weight", "net.core.rmem_max", "net.core.wmem_max", "net.core.rmem_default",
    "net.core.wmem_default", "net.ipv4.udp_mem", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_congestion_control", "net.bridge.bridge-nf-call-iptables",
)
TOOLS = {"iperf3": ["iperf3", "--version"], "ethtool": ["ethtool", "--version"],
         "ip": ["ip", "-V"], "tcpdump": ["tcpdump", "--version"], "ovs-vswitchd": ["ovs-vswitchd", "--version"]}


def environment(plan, labs: list[LabState]) -> dict:
    """Kernel, CPU, versions, plan, offload state and MTU of every lab interface, sysctls."""
    from offlab.errors import ToolMissing
    from offlab.traffic.engine import engine_path

    cpu_model = next((l.split(":", 1)[1].strip() for l in _read("/proc/cpuinfo").splitlines()
                      if l.startswith("model name")), platform.processor())
    versions = {"offlab": __version__, "python": platform.python_version()}
    try:
        engine = [engine_path(), "--version"]
    except ToolMissing:  # an iperf3-only plan runs without the engine; its version is then None
        engine = ["offlab-engine", "--version"]
    for name, argv in {**TOOLS, "offlab-engine": engine}.items():
        res = LOCAL.run(argv, check=False, timeout=10) if _have(argv[0]) else None
        versions[name] = (res.stdout or res.stderr).strip().splitlines()[0] if res and (res.stdout or res.stderr) else None
    sysctls = {}
    for key in SYSCTLS:
        path = "/proc/sys/" + key.replace(".", "/")
        sysctls[key] = _read(path).strip() if os.path.exists(path) else None
    return {
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "cmdline": _read("/proc/cmdline").strip(),
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "governor": _governors(),
        "loadavg": _loadavg(),
        "hostname": platform.node(),
        "versions": versions,
        "sysctls": sysctls,
        "plan_text": plan.text,
        "labs": [{**describe(lab), "changes": pending_changes({e.netns: r for r, e in lab.hosts.items() if e.netns and not e.guest})}
                 for lab in labs],
    }


def _governors() -> str:
    """The CPUs' cpufreq governors ("performance", "powersave ×2, performance ×2"), or why there is none."""
    found: dict[str, int] = {}
    for n in range(os.cpu_count() or 0):
        g = _read(f"/sys/devices/system/cpu/cpu{n}/cpufreq/scaling_governor").strip()
        if g:
            found[g] = found.get(g, 0) + 1
    if not found:
        return "none: no cpufreq here (a guest, or a fixed clock)"
    return next(iter(found)) if len(found) == 1 else ", ".join(f"{g} ×{n}" for g, n in found.items())


def _loadavg() -> float | None:
    """The 1-minute load average as the run starts: how busy the machine was besides the run."""
    try:
        return float(_read("/proc/loadavg").split()[0])
    except (IndexError, ValueError):
        return None


def _have(exe: str) -> bool:
    from offlab.hosts import which

    return os.path.isabs(exe) or which(exe) is not None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
