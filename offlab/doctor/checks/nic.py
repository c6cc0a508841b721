"""NIC settings from the guide's 调整物理网卡参数: rings, UDP flow hash, coalescing, offloads."""

from __future__ import annotations

from offlab import netdev
from offlab.doctor.model import FixChange, Outcome
from offlab.doctor.registry import Context, NotApplicable, Skip, check, last_line, no_data

NOT_HERE = "ethtool missing, or not in this capture"
GUIDE_RING = 256  # the guide: ethtool -G IF rx 256 tx 256 for most cases

# Offloads the guide wants on when they can be (ethtool's own names, as -k prints them).
OFFLOADS = (
    "rx-checksumming",
    "tx-checksumming",
    "scatter-gather",
    "tcp-segmentation-offload",
    "generic-segmentation-offload",
    "generic-receive-offload",
)


# On a veth, tx checksumming is off on purpose when its peer is an OVS userspace port
# (see ovs.veth-csum), and GRO switches the veth to NAPI mode: both are experiments' choices.
VETH_LEFT_ALONE = ("tx-checksumming", "generic-receive-offload")


def hardware(ctx: Context, iface: str) -> None:
    """Rings, queues and coalescing belong to a device; a veth or bridge has none, so no finding."""
    if not ctx.has_device(iface):
        raise NotApplicable(iface)


@check("nic.rings", area="nic", title="Ring sizes vs maximum", tier="basic", per_iface=True,
       why="too short a ring drops bursts before NAPI runs; the guide uses 256 for most cases, the maximum if rx drops show")
def rings(ctx: Context, iface: str) -> Outcome:
    hardware(ctx, iface)
    out = ctx.ethtool("-g", iface)
    if out is None or not out.ok:
        raise Skip(f"{iface} reports no ring sizes ({last_line(out) if out else NOT_HERE})")
    ring = netdev.parse_limits(out.stdout)
    rx, tx = ring["rx"], ring["tx"]
    if rx.current is None and tx.current is None:
        raise no_data(f"ethtool -g {iface} output has no current rx/tx ring size ({last_line(out)})")
    evidence = {"rx": rx.current, "rx_max": rx.maximum, "tx": tx.current, "tx_max": tx.maximum}
    short = {}
    for d, lim in (("rx", rx), ("tx", tx)):
        if lim.current is None or lim.maximum is None:
            continue
        want = min(GUIDE_RING, lim.maximum)
        if lim.current < want:
            short[d] = want
    text = ", ".join(f"{d} {lim.current}/{lim.maximum}" for d, lim in (("rx", rx), ("tx", tx))
                     if lim.current is not None)
    if not short:
        return Outcome("ok", f"{text} (current/max)", evidence)
    args = " ".join(f"{d} {v}" for d, v in short.items())
    return Outcome("warn", f"{text} (current/max): below the guide's {GUIDE_RING}", evidence,
                   fix=f"ethtool -G {iface} {args}",
                   changes=[FixChange(f"ring.{d}", v, iface) for d, v in short.items()])


def rx_queues(ctx: Context, iface: str) -> int:
    out = ctx.ethtool("-l", iface)
    if out is not None and out.ok:
        channels = netdev.parse_limits(out.stdout)
        n = max(channels["combined"].current or 0, channels["rx"].current or 0)
        if n:
            return n
    return len([q for q in ctx.src.listdir(f"/sys/class/net/{iface}/queues") if q.startswith("rx-")]) or 1


@check("nic.flow-hash", area="nic", title="UDP flow hash includes ports (rx-flow-hash udp4)", tier="basic",
       per_iface=True,
       why="hashing UDP on addresses only puts every flow between two hosts on one queue and one CPU "
           "(the guide: ethtool -N IF rx-flow-hash udp4 sdfn)")
def flow_hash(ctx: Context, iface: str) -> Outcome:
    hardware(ctx, iface)
    out = ctx.ethtool("-n", iface, "rx-flow-hash", "udp4")
    if out is None:
        # sos (4.x included) never runs `ethtool -n IF rx-flow-hash udp4`
        raise no_data(f"ethtool -n {iface} rx-flow-hash udp4 "
                      "(ethtool missing, or not in this tree: sos never collects it)")
    if not out.ok:
        raise Skip(f"{iface} does not report its RSS hash ({last_line(out)})")
    hashed = netdev.parse_flow_hash(out.stdout)
    if hashed is None:
        raise no_data(f"unrecognised ethtool -n output for {iface}")
    letters = hashed.letters
    queues = rx_queues(ctx, iface)
    evidence = {"udp4": letters or "none", "rx_queues": queues}
    if hashed.ports:
        return Outcome("ok", f"udp4 hashed on {letters} (ports included)", evidence)
    fix = f"ethtool -N {iface} rx-flow-hash udp4 sdfn"
    if queues <= 1:
        return Outcome("info", f"udp4 hash is '{letters or 'none'}' (no ports); one rx queue, so nothing to spread yet",
                       evidence, fix=fix)
    return Outcome("warn", f"udp4 hashed on '{letters or 'none'}' only: UDP flows between two hosts share a queue",
                   evidence, fix=fix)


@check("nic.coalesce", area="nic", title="Interrupt coalescing", tier="aggressive", per_iface=True,
       why="adaptive coalescing moves the interrupt rate under load; the guide turns it off and sets it by hand "
           "when the IRQ rate is high")
def coalesce(ctx: Context, iface: str) -> Outcome:
    hardware(ctx, iface)
    out = ctx.ethtool("-c", iface)
    if out is None or not out.ok:
        raise Skip(f"{iface} does not report coalescing ({last_line(out) if out else NOT_HERE})")
    c = netdev.parse_coalesce(out.stdout)
    modes, values = c.modes, c.values
    if "adaptive-rx" not in modes and "rx-usecs" not in values:
        raise no_data(f"ethtool -c {iface} output has neither Adaptive RX nor rx-usecs ({last_line(out)})")
    # the evidence's JSON: the modes as ethtool prints them (n/a included), the numbers None for n/a
    evidence = {"adaptive-rx": modes.get("adaptive-rx"), "adaptive-tx": modes.get("adaptive-tx"),
                **{k: values.get(k) for k in ("rx-usecs", "rx-frames", "tx-usecs", "tx-frames")}}
    if modes.get("adaptive-rx") == "on":
        return Outcome("warn", f"adaptive RX coalescing on (rx-usecs {values.get('rx-usecs')})", evidence,
                       fix=f"ethtool -C {iface} adaptive-rx off rx-usecs 50 rx-frames 32")
    if values.get("rx-usecs") in (0, None) and values.get("rx-frames") in (0, 1, None):
        return Outcome("info", "an interrupt per received packet (rx-usecs 0, rx-frames ≤ 1)", evidence,
                       fix=f"ethtool -C {iface} rx-frames 32   # the guide's VM XML: <coalesce><rx><frames max='32'/>")
    shown = ", ".join(f"{k} {'n/a' if evidence[k] is None else evidence[k]}"
                      for k in ("adaptive-rx", "rx-usecs", "rx-frames"))
    return Outcome("ok", shown, evidence)


@check("nic.offloads", area="nic", title="Offloads that are off but could be on", tier="basic", per_iface=True,
       why="offloads move per-packet work (checksums, segmentation, GRO) out of the CPU path; "
           "the guide keeps them on unless a driver bug says otherwise")
def offloads(ctx: Context, iface: str) -> Outcome:
    feats = ctx.features(iface)
    link = ctx.link(iface)
    kind = link.kind if link else None
    off, kept = [], []
    for name in OFFLOADS:
        f = feats.get(name)
        if f is None or f.active or f.fixed:
            continue
        if kind == "veth" and name in VETH_LEFT_ALONE:
            kept.append(name)
            continue
        off.append(name)
    unreported = [n for n in OFFLOADS if n not in feats]
    if len(unreported) == len(OFFLOADS):
        raise no_data(f"ethtool -k {iface} shows none of {', '.join(OFFLOADS)} (output cut short?)")
    evidence = {"off_changeable": off, "fixed_off": sorted(n for n in OFFLOADS if n in feats
                                                           and not feats[n].active and feats[n].fixed),
                "kept_off": kept, "not_reported": unreported}
    if not off:
        note = f" ({', '.join(kept)} off on a veth left alone)" if kept else ""
        if unreported:
            note += f"; not reported: {', '.join(unreported)}"
        checked = len(OFFLOADS) - len(unreported)
        return Outcome("ok", f"every changeable offload of the {checked} checked is on{note}", evidence)
    return Outcome("warn", f"off but changeable: {', '.join(off)}", evidence,
                   fix=f"ethtool -K {iface} " + " ".join(f"{n} on" for n in off),
                   changes=[FixChange(n, "on", iface) for n in off])


@check("nic.nocache-copy", area="nic", title="tx-nocache-copy", tier="aggressive", per_iface=True,
       why="copying transmit data around the cache costs more than it saves on most CPUs (Mellanox advises off)")
def nocache_copy(ctx: Context, iface: str) -> Outcome:
    f = ctx.features(iface).get("tx-nocache-copy")
    if f is None:
        return Outcome("ok", "tx-nocache-copy not offered", {"tx-nocache-copy": None})
    evidence = {"tx-nocache-copy": "on" if f.active else "off", "fixed": f.fixed}
    if not f.active or f.fixed:
        return Outcome("ok", f"tx-nocache-copy {'on' if f.active else 'off'}{' [fixed]' if f.fixed else ''}",
                       evidence)
    return Outcome("warn", "tx-nocache-copy on", evidence, fix=f"ethtool -K {iface} tx-nocache-copy off",
                   changes=[FixChange("tx-nocache-copy", "off", iface)])
