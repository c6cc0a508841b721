"""KVM: AVIC on AMD, EPT/NPT, and where the vhost worker threads may run."""

from __future__ import annotations

import re

from offlab.doctor import parse
from offlab.doctor.model import Outcome
from offlab.doctor.registry import Context, Skip, check, no_data

MODULE = "/sys/module"
_TRUE = ("1", "Y", "y")


def _param(ctx: Context, module: str, name: str) -> str | None:
    return ctx.value(f"{MODULE}/{module}/parameters/{name}")


def _loaded(ctx: Context, module: str) -> bool:
    """Whether `module` is loaded; a sosreport without /sys/module answers from lsmod or /proc/modules."""
    if ctx.present(MODULE):
        return ctx.src.exists(f"{MODULE}/{module}/parameters")
    out = ctx.run(["lsmod"])
    text = out.stdout if out is not None and out.ok else ctx.read("/proc/modules")
    if not text:
        raise no_data(f"{MODULE} nor lsmod nor /proc/modules: which KVM module is loaded is unknown")
    loaded = {line.split()[0] for line in text.splitlines() if line.split()}
    if module in loaded:
        raise no_data(f"{module} is loaded (lsmod) but {MODULE}/{module}/parameters is not in this source")
    return False


@check("kvm.avic", area="kvm", title="kvm_amd AVIC (virtual interrupt controller)", tier="basic",
       why="AVIC delivers guest interrupts without a VM exit: fewer exits per packet on AMD (the guide: avic=1)")
def avic(ctx: Context) -> Outcome:
    if not _loaded(ctx, "kvm_amd"):
        vendor = ctx.cpu_vendor or "unknown CPU"
        return Outcome("ok", "kvm_amd not loaded" + ("" if "AMD" in vendor else f" ({vendor}: not an AMD host)"),
                       {"kvm_amd": False, "vendor": vendor})
    value = _param(ctx, "kvm_amd", "avic")
    evidence = {"kvm_amd": True, "avic": value}
    if value in _TRUE:
        return Outcome("ok", f"kvm_amd avic={value}", evidence)
    return Outcome("warn", f"kvm_amd avic={value}", evidence,
                   fix='echo "options kvm_amd avic=1" > /etc/modprobe.d/kvm.conf; '
                       "with every VM shut down: modprobe -r kvm_amd && modprobe kvm_amd")


@check("kvm.ept", area="kvm", title="Two-dimensional paging (kvm_intel ept / kvm_amd npt)", tier="basic",
       why="without EPT/NPT every guest page-table change exits to the host (shadow paging)")
def ept(ctx: Context) -> Outcome:
    for module, name in (("kvm_intel", "ept"), ("kvm_amd", "npt")):
        if not _loaded(ctx, module):
            continue
        value = _param(ctx, module, name)
        evidence = {"module": module, name: value}
        if value in _TRUE:
            return Outcome("ok", f"{module} {name}={value}", evidence)
        return Outcome("fail", f"{module} {name}={value}: guests run on shadow page tables", evidence,
                       fix=f'echo "options {module} {name}=1" > /etc/modprobe.d/kvm.conf; '
                           f"with every VM shut down: modprobe -r {module} && modprobe {module}")
    return Outcome("ok", "kvm_intel/kvm_amd not loaded: not a KVM host", {"module": None})


def _vhost_from_ps(ctx: Context) -> list[tuple[int, str]]:
    """vhost kthreads (`[vhost-PID]`, kernels before 6.4) from a sosreport's ps; threads since 6.4 are not listed."""
    for argv in (["ps", "auxwwwm"], ["ps", "auxwww"]):
        ps = ctx.run(argv)
        procs = parse.ps_processes(ps.stdout) if ps is not None and ps.ok else []
        if not procs:
            continue
        kthreads = [(pid, cmd.strip("[]")) for pid, cmd in procs if re.fullmatch(r"\[vhost-\d+\]", cmd.strip())]
        vhost_vms = [pid for pid, cmd in procs
                     if "qemu" in cmd.split()[0] and re.search(r'vhost"?[=:] ?"?(on|true)', cmd)]
        if vhost_vms and not kthreads:
            # since Linux 6.4 (and distribution backports) the workers are QEMU's own threads, unnamed in ps
            raise no_data(f"QEMU (pid {vhost_vms[0]}) uses vhost but ps lists no [vhost-PID] kthread: "
                          "its workers are threads, which ps auxwwwm does not name")
        return kthreads
    raise no_data("no thread list (pgrep, or ps auxwwwm / ps auxwww in a sosreport)")


@check("kvm.vhost", area="kvm", title="vhost worker threads and their CPUs", tier="basic",
       why="a vhost thread per queue moves the VM's packets; left floating it competes with vCPUs and crosses NUMA nodes")
def vhost(ctx: Context) -> Outcome:
    out = ctx.run(["pgrep", "-w", "-l", "^vhost-"])
    if out is None:
        listed = _vhost_from_ps(ctx)
    elif out.rc not in (0, 1):
        raise Skip(f"pgrep failed: {out.stderr.strip() or out.rc}")
    else:
        listed = parse.pgrep_list(out.stdout)
    threads = []
    for tid, name in listed[:64]:
        status = parse.key_values(ctx.read(f"/proc/{tid}/status") or "")
        owner = name.partition("-")[2]
        kthread = status.get("Kthread") == "1" or status.get("PPid") == "2"
        threads.append({
            "tid": tid, "name": name, "owner_pid": int(owner) if owner.isdigit() else None,
            "owner": ctx.value(f"/proc/{owner}/comm") if owner.isdigit() else None,
            "model": None if not status else "kthread" if kthread else "thread of the VM process",
            "cpus": status.get("Cpus_allowed_list"),
        })
    if not threads:
        return Outcome("ok", "no vhost workers: no VM with vhost-net runs here", {"threads": []})
    if not any(t["cpus"] for t in threads):
        raise no_data(f"{len(threads)} vhost workers listed, but none's /proc/TID/status (Cpus_allowed_list)")
    online = ctx.cpus_online
    floating = [t for t in threads if t["cpus"] and parse.cpulist(t["cpus"]) >= online and len(online) > 1]
    evidence = {"threads": threads, "online_cpus": parse.format_cpus(online), "floating": len(floating)}
    model = next((t["model"] for t in threads if t["model"]), "model unknown")
    if not floating:
        return Outcome("ok", f"{len(threads)} vhost workers ({model}) pinned", evidence)
    return Outcome("warn", f"{len(floating)} of {len(threads)} vhost workers ({model}) may run on any CPU "
                           f"({parse.format_cpus(online)})", evidence,
                   fix="virsh emulatorpin DOMAIN CPULIST --live   # vhost follows the emulator pin; "
                       f"or taskset -pc CPULIST {floating[0]['tid']} — CPUs on the NIC's NUMA node, apart from the vCPUs")
