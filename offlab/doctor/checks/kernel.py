"""Kernel: version (the virtio/vhost features the guide relies on), mitigations, hugepages."""

from __future__ import annotations

from offlab.doctor import parse
from offlab.doctor.model import Outcome
from offlab.doctor.registry import Context, check, no_data

# The guide's reasons to upgrade, with the release that brought each.
GUIDE_FEATURES = (
    ((4, 6), "limited busy polling"),
    ((4, 8), "ptr_ring"),
    ((4, 11), "MSG_MORE in tun_sendmsg"),
    ((4, 12), "batch zeroing"),
    ((4, 13), "batch dequeuing"),
)
RECOMMENDED = (5, 4)  # the guide installs UEK 5.4.17


@check("kernel.version", area="kernel", title="Kernel version (virtio/vhost batching)", tier="aggressive",
       why="busy polling (4.6), ptr_ring (4.8), tun MSG_MORE (4.11), batch zeroing (4.12) and dequeuing (4.13) "
           "make vhost faster; the guide upgrades to 5.4")
def version(ctx: Context) -> Outcome:
    release = ctx.value("/proc/sys/kernel/osrelease")
    ver = parse.kernel_version(release) if release else None
    if ver is None:
        raise no_data("kernel release (/proc/sys/kernel/osrelease; in a sosreport also proc/version, "
                      "sos_commands/kernel/uname_-a, uname)")
    missing = [f"{name} ({a}.{b})" for (a, b), name in GUIDE_FEATURES if ver[:2] < (a, b)]
    evidence = {"release": release, "version": ".".join(map(str, ver)), "missing": missing,
                "recommended": "5.4"}
    if missing:
        return Outcome("warn", f"{release} lacks {', '.join(missing)}", evidence,
                       fix="install a kernel ≥ 5.4 (the guide: yum install kernel-uek, 5.4.17) and reboot into it")
    if ver[:2] < RECOMMENDED:
        return Outcome("warn", f"{release} is older than the guide's 5.4", evidence,
                       fix="install a kernel ≥ 5.4 (the guide: yum install kernel-uek, 5.4.17) and reboot into it")
    return Outcome("ok", f"{release} has every feature the guide relies on", evidence)


@check("kernel.mitigations", area="kernel", title="CPU vulnerability mitigations", tier="aggressive",
       why="Spectre/Meltdown mitigations tax every syscall and VM exit; the guide boots with mitigations=off "
           "(a security trade-off)")
def mitigations(ctx: Context) -> Outcome:
    cmdline = ctx.value("/proc/cmdline")
    if cmdline is None:
        raise no_data("/proc/cmdline")
    params = cmdline.split(" -- ")[0].split()
    vulns = {}
    for name in ctx.src.listdir("/sys/devices/system/cpu/vulnerabilities"):
        v = ctx.value(f"/sys/devices/system/cpu/vulnerabilities/{name}")
        if v is not None:
            vulns[name] = v
    if not vulns and not ctx.present("/sys/devices/system/cpu"):
        vulns = parse.lscpu_vulnerabilities(ctx.lscpu)  # a sosreport without the sysfs copy
    active = sorted(n for n, v in vulns.items() if v.startswith("Mitigation"))
    mitig = [p for p in params if p.startswith("mitigations=")]
    evidence = {"cmdline_mitigations": mitig[-1] if mitig else None,
                "off_switches": [p for p in params if p in ("nopti", "nospectre_v1", "nospectre_v2", "mds=off",
                                                             "l1tf=off", "nospec_store_bypass_disable")],
                "active": active, "vulnerabilities": vulns}
    if mitig and mitig[-1] == "mitigations=off":
        return Outcome("ok", "booted with mitigations=off", evidence)
    if vulns and not active:
        return Outcome("ok", "no mitigation active (CPU not affected)", evidence)
    shown = ", ".join(active[:5]) + (f" and {len(active) - 5} more" if len(active) > 5 else "")
    what = f"{len(active)} mitigations active ({shown})" if active else "mitigations not turned off"
    return Outcome("warn", f"{what}; kernel command line has {mitig[-1] if mitig else 'no mitigations='}",
                   evidence,
                   fix="add mitigations=off to GRUB_CMDLINE_LINUX in /etc/default/grub; "
                       "grub2-mkconfig -o /boot/grub2/grub.cfg (Debian: update-grub); reboot "
                       "— only where the security trade-off is accepted")


@check("kernel.hugepages", area="kernel", title="Hugepages for guest memory", tier="aggressive",
       why="hugepages help memory-heavy guests (redis, databases); the guide finds no clear gain for the network itself")
def hugepages(ctx: Context) -> Outcome:
    text = ctx.read("/proc/meminfo")
    mem = parse.meminfo(text) if text is not None else {}
    if "HugePages_Total" not in mem:
        reserved = ctx.int_value("/proc/sys/vm/nr_hugepages")  # a sosreport's sysctl -a, when meminfo is missing
        if reserved is None:
            raise no_data("/proc/meminfo (HugePages_Total) nor vm.nr_hugepages")
        mem = {**mem, "HugePages_Total": reserved}
    total, size = mem.get("HugePages_Total", 0), mem.get("Hugepagesize", 0)
    evidence = {"total": total, "free": mem.get("HugePages_Free", 0), "size_kb": size}
    if total > 0:
        return Outcome("ok", f"{total} hugepages of {size} kB reserved ({mem.get('HugePages_Free', 0)} free)",
                       evidence)
    return Outcome("info", f"no hugepages reserved (page size {size} kB)", evidence,
                   fix="sysctl -w vm.nr_hugepages=N and <memoryBacking><hugepages/></memoryBacking> in the VM XML")
