"""Queues and CPU placement: multiqueue, RPS/XPS, the NIC's NUMA node, irqbalance."""

from __future__ import annotations

from offlab.doctor import parse
from offlab import netdev
from offlab.doctor.checks.nic import hardware
from offlab.doctor.model import FixChange, Outcome
from offlab.doctor.registry import Context, Skip, check, no_data


@check("nic.queues", area="nic", title="Queue count vs CPUs (multiqueue)", tier="basic", per_iface=True,
       why="each queue has its own interrupt and vhost thread; one queue puts all of a NIC's packets on one CPU")
def queues(ctx: Context, iface: str) -> Outcome:
    hardware(ctx, iface)
    ncpu = len(ctx.cpus_online) or 1
    out = ctx.ethtool("-l", iface)
    cur = mx = None
    if out is not None and out.ok:
        combined, rx = (netdev.parse_limits(out.stdout)[n] for n in ("combined", "rx"))
        cur = max(combined.current or 0, rx.current or 0) or None
        mx = max(combined.maximum or 0, rx.maximum or 0) or None
    if cur is None:
        cur = len([q for q in ctx.src.listdir(f"/sys/class/net/{iface}/queues") if q.startswith("rx-")]) or None
    if cur is None:
        raise Skip(f"{iface}: neither ethtool -l nor /sys/class/net/{iface}/queues tells the queue count")
    driver = ctx.driver(iface).driver or None
    evidence = {"queues": cur, "max": mx, "cpus": ncpu, "driver": driver}
    want = min(mx or cur, ncpu)
    if cur >= want and not (mx == 1 and ncpu > 1):
        return Outcome("ok", f"{cur} queue(s) for {ncpu} CPU(s) (max {mx})", evidence)
    if cur < want:
        return Outcome("warn", f"{cur} of {mx} queues in use on {ncpu} CPUs", evidence,
                       fix=f"ethtool -L {iface} combined {want}",
                       changes=[FixChange("channels.combined", want, iface)])
    hint = ("<driver name='vhost' queues='N'/> on the VM's interface (libvirt), N up to its vCPUs"
            if driver == "virtio_net" else "a NIC or VF with more queues")
    return Outcome("warn", f"{iface} offers a single queue to {ncpu} CPUs ({driver})", evidence,
                   fix=f"give the device more queues: {hint}; then ethtool -L {iface} combined N")


def _queue_masks(ctx: Context, iface: str, prefix: str, attr: str) -> dict[str, set[int] | None]:
    out: dict[str, set[int] | None] = {}
    for q in ctx.src.listdir(f"/sys/class/net/{iface}/queues"):
        if q.startswith(prefix):
            text = ctx.value(f"/sys/class/net/{iface}/queues/{q}/{attr}")
            out[q] = parse.cpumask(text) if text else None
    return out


@check("nic.rps-xps", area="nic", title="RPS / XPS CPU masks", tier="basic", per_iface=True,
       why="with one rx queue RPS spreads receive work over CPUs; with several tx queues XPS keeps each CPU on "
           "its own queue (the guide sets XPS in the guest from kernel 4.18)")
def rps_xps(ctx: Context, iface: str) -> Outcome:
    hardware(ctx, iface)
    online = ctx.cpus_online
    rps = _queue_masks(ctx, iface, "rx-", "rps_cpus")
    xps = _queue_masks(ctx, iface, "tx-", "xps_cpus")
    if not rps and not xps:
        raise no_data(f"/sys/class/net/{iface}/queues (sosreports do not copy it)")
    evidence = {"cpus": len(online),
                "rps": {q: parse.format_cpus(m) if m is not None else None for q, m in rps.items()},
                "xps": {q: parse.format_cpus(m) if m is not None else None for q, m in xps.items()}}
    if len(online) <= 1:
        return Outcome("ok", "one CPU: nothing to spread", evidence)
    problems, fixes, changes = [], [], []
    if len(rps) == 1 and not next(iter(rps.values())):
        q = next(iter(rps))
        mask = parse.mask_of(online)
        problems.append(f"one rx queue and RPS off ({q})")
        fixes.append(f"echo {mask} > /sys/class/net/{iface}/queues/{q}/rps_cpus")
        changes.append(FixChange(f"rps.{q.split('-')[1]}", mask, iface))
    readable_xps = {q: m for q, m in xps.items() if m is not None}
    if len(xps) > 1 and readable_xps and not any(readable_xps.values()):
        problems.append(f"XPS unset on {len(xps)} tx queues")
        ordered = sorted(xps, key=lambda q: int(q.split("-")[1]))
        cpu_order = sorted(online)
        for i, q in enumerate(ordered):
            cpus = {c for j, c in enumerate(cpu_order) if j % len(ordered) == i}
            mask = parse.mask_of(cpus)
            fixes.append(f"echo {mask} > /sys/class/net/{iface}/queues/{q}/xps_cpus")
            changes.append(FixChange(f"xps.{q.split('-')[1]}", mask, iface))
    if not problems:
        what = "RPS on" if len(rps) == 1 else f"{len(rps)} rx queues"
        return Outcome("ok", f"{what}; XPS {'set' if any(readable_xps.values()) else 'not needed'}", evidence)
    return Outcome("warn", "; ".join(problems), evidence, fix="; ".join(fixes), changes=changes)


def nic_irqs(ctx: Context, iface: str, bus: str | None) -> list[str]:
    """The NIC's interrupts: its PCI function's MSI vectors, else /proc/interrupts lines naming it."""
    if bus:
        irqs = ctx.src.listdir(f"/sys/bus/pci/devices/{bus}/msi_irqs")
        if irqs:
            return sorted(irqs, key=int)
    text = ctx.read("/proc/interrupts") or ""
    names = [iface] + ([bus] if bus else [])
    return [irq for irq, v in parse.interrupts(text).items() if any(n in v["name"] for n in names)]


@check("nic.numa", area="nic", title="NUMA node of the NIC vs the CPUs serving it", tier="basic", per_iface=True,
       why="vCPUs, vhost threads and the NIC's interrupts should sit on the NIC's NUMA node "
           "(cat /sys/class/net/IF/device/numa_node); crossing nodes costs every packet")
def numa(ctx: Context, iface: str) -> Outcome:
    hardware(ctx, iface)
    bus = ctx.driver(iface).bus_info or None
    if bus and not bus.count(":") >= 2:
        bus = None  # not a PCI address (e.g. a platform or virtio-mmio device)
    node_text = ctx.value(f"/sys/bus/pci/devices/{bus}/numa_node") if bus else None
    if node_text is None:
        node_text = ctx.value(f"/sys/class/net/{iface}/device/numa_node")
    node = int(node_text) if node_text and node_text.lstrip("-").isdigit() else None
    nodes = ctx.numa_nodes
    if node_text is None and len(nodes) > 1 and not ctx.present(f"/sys/class/net/{iface}/device"):
        raise no_data(f"the NUMA node of {iface}: /sys/class/net/{iface}/device/numa_node is not in this source")
    evidence = {"pci": bus, "numa_node": node, "nodes": {str(n): parse.format_cpus(c) for n, c in nodes.items()}}
    if len(nodes) <= 1:
        return Outcome("ok", f"one NUMA node: nothing to place (pci {bus or '?'})", evidence)
    if node is None or node < 0:
        guest = ctx.guest
        fix = ("libvirt: put the NIC on a PCIe expander bus bound to a guest node "
               "(<controller model='pcie-expander-bus'><target><node>0</node></target>), or give the VM one node"
               if guest else "enable NUMA/SRAT reporting in the BIOS; meanwhile read the slot's socket from lspci -vv")
        return Outcome("warn", f"{iface} (pci {bus}) has no NUMA node in sysfs (numa_node {node}) "
                               f"on a {len(nodes)}-node {'guest' if guest else 'host'}", evidence, fix=fix)
    local = nodes.get(node, set())
    used: dict[str, set[int]] = {}
    for irq in nic_irqs(ctx, iface, bus):
        text = ctx.value(f"/proc/irq/{irq}/effective_affinity_list") or ctx.value(f"/proc/irq/{irq}/smp_affinity_list")
        if text:
            used[irq] = parse.cpulist(text)
    remote = {irq: cpus for irq, cpus in used.items() if cpus - local}
    evidence.update({"irqs": {irq: parse.format_cpus(c) for irq, c in used.items()},
                     "remote_irqs": sorted(remote, key=int)})
    if not used:
        return Outcome("ok", f"{iface} on node {node} (CPUs {parse.format_cpus(local)}); no IRQs found to compare",
                       evidence)
    if not remote:
        return Outcome("ok", f"{iface} on node {node}: its {len(used)} IRQs stay on node {node} CPUs", evidence)
    cpus = parse.format_cpus(local)
    fix = "; ".join(f"echo {cpus} > /proc/irq/{irq}/smp_affinity_list" for irq in sorted(remote, key=int)[:8])
    return Outcome("warn", f"{iface} is on node {node} but {len(remote)} of its {len(used)} IRQs may run on "
                           f"other nodes' CPUs", evidence,
                   fix=fix + "; and pin the VM's vCPUs/emulator to the same node")


@check("irq.balance", area="irq", title="irqbalance", tier="basic",
       why="irqbalance re-spreads interrupts every 10 s and undoes IRQ pinning to the NIC's node")
def irqbalance(ctx: Context) -> Outcome:
    out = ctx.run(["pgrep", "-x", "irqbalance"])
    if out is not None and out.rc in (0, 1):
        pids = [p for p, _ in parse.pgrep_list(out.stdout)]
        running = bool(pids)
    else:
        # a sosreport has ps output, not pgrep: `ps auxwwwm` since sos 4.0, `ps auxwww` before
        procs = []
        for argv in (["ps", "auxwwwm"], ["ps", "auxwww"]):
            ps = ctx.run(argv)
            procs = parse.ps_processes(ps.stdout) if ps is not None and ps.ok else []
            if procs:
                break
        if not procs:
            raise no_data("no process list (pgrep, or ps auxwwwm / ps auxwww in a sosreport)")
        pids = [pid for pid, cmd in procs if cmd.split()[0].rsplit("/", 1)[-1] == "irqbalance"]
        running = bool(pids)
    evidence = {"running": running, "pids": pids}
    if not running:
        return Outcome("ok", "irqbalance not running: IRQ affinity stays where it is set", evidence)
    return Outcome("warn", "irqbalance running: it will move NIC interrupts you pin", evidence,
                   fix="systemctl stop irqbalance   # or keep it off the pinned CPUs: "
                       "IRQBALANCE_BANNED_CPULIST=... in /etc/sysconfig/irqbalance")
