"""The kernel's account (a sample's `kernel_account`, offlab.experiment.kernel_account) as people read it:
one sample's, or a cell's samples' summed, shown beside the counters' in every output. A cell's account
(`merge`) is built as a dict and read as its view before it is returned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from offlab.sample import Agreement, GsoTally, Hop, JsonView, KernelAccount, KernelLoss, Tally, TraceDrop, _view
from offlab.stats import agreement, percents

UNSEEN = "no tracepoint saw them"
SOURCES = "skb:kfree_skb, net:net_dev_queue, net:net_dev_start_xmit, net:napi_gro_receive_entry, net:netif_receive_skb"
OFF_LINE = ("kernel account: off by default (seconds to start, a few % of throughput); --trace turns it on")


@dataclass
class CellUso(JsonView):
    """USO's verdicts over a cell's samples: how many said exercised or disagreed, the figures summed."""

    samples: int = 0
    exercised: int = 0
    skbs: int = 0
    super_packets: int = 0
    segments: int = 0
    segmented_in_software_at: list[str] = field(default_factory=list)
    disagree: int = 0
    counters: list[str] = field(default_factory=list)  # the counters' witness's statuses


@dataclass
class CellEffect(JsonView):
    """The kernel's verdicts on one setting over a cell's samples."""

    setting: str = ""
    where: str = ""
    samples: int = 0
    exercised: int = 0
    disagree: int = 0
    detail: str = ""  # the first sample's
    counters: list[str] = field(default_factory=list)


@dataclass
class CellKernelAccount(JsonView):
    """A cell's samples' kernel accounts summed (`merge`): how many took it and why others did not, loss by
    place, each hop, USO's and each setting's verdicts."""

    samples: int = 0
    traced: int = 0
    unavailable: list[str] = field(default_factory=list)
    loss: KernelLoss | None = _view(KernelLoss)
    hops: list[Hop] = _view(Hop, list=True, default_factory=list)
    uso: CellUso | None = _view(CellUso)
    effects: list[CellEffect] = _view(CellEffect, list=True, default_factory=list)


def merge(accounts: Sequence[KernelAccount | None]) -> CellKernelAccount | None:
    """A cell's samples' accounts summed: drops by place, lost and unseen; each hop's skbs, segments and
    super-packets; USO and effect verdicts counted over the samples. Shares still add up to 1: a place
    gets the datagrams each sample gave it (its share × that sample's whole)."""
    got = [a for a in accounts if a is not None and not a.empty]
    if not got:
        return None
    taken = [a for a in got if a.unavailable is None]
    out: dict = {"samples": len(got), "traced": len(taken)}
    why = sorted({a.unavailable for a in got if a.unavailable is not None})
    if why:
        out["unavailable"] = why
    if not taken:
        return CellKernelAccount.keyed(**out)
    losses = [a.loss for a in taken if a.loss is not None and not a.loss.empty]
    if losses:
        out["loss"] = _merge_loss(losses)
    out["hops"] = _merge_hops([h for a in taken for h in a.hops])
    usos = [a.uso for a in taken if a.uso is not None and not a.uso.empty]
    if usos:
        out["uso"] = CellUso.keyed(
            samples=len(usos), exercised=sum(bool(u.exercised) for u in usos), skbs=sum(u.skbs or 0 for u in usos),
            super_packets=sum(u.super_packets for u in usos), segments=sum(u.segments for u in usos),
            segmented_in_software_at=sorted({d for u in usos for d in u.segmented_in_software_at}),
            disagree=sum(u.agree is False for u in usos), counters=sorted({str(u.counters) for u in usos if u.counters}))
    effects: dict[tuple, dict] = {}
    for a in taken:
        for e in a.effects:
            m = effects.setdefault((e.setting, e.where), {"setting": e.setting, "where": e.where, "samples": 0,
                                                          "exercised": 0, "disagree": 0, "detail": e.detail,
                                                          "counters": set()})
            m["samples"] += 1
            m["exercised"] += e.kernel == "exercised"
            m["disagree"] += e.agree is False
            if e.counters:
                m["counters"].add(e.counters)
    if effects:
        out["effects"] = [CellEffect.keyed(**{**m, "counters": sorted(m["counters"])}) for m in effects.values()]
    return CellKernelAccount.keyed(**out)


def _merge_loss(losses: list[KernelLoss]) -> KernelLoss:
    places: dict[tuple, dict] = {}
    lost = dropped = unseen = 0
    whole_sum = rest = 0.0
    compared: dict[str, list[float]] = {}
    not_lost: dict[tuple, TraceDrop] = {}
    for lo in losses:
        whole = max(lo.lost or 0, lo.dropped)
        whole_sum += whole
        rest += lo.unseen_share * whole
        lost += lo.lost or 0
        dropped += lo.dropped
        unseen += lo.unseen
        for p in lo.places:
            key = (p.host, p.device, p.reason, p.location, p.unit)
            q = places.setdefault(key, {"host": p.host, "device": p.device, "reason": p.reason,
                                        "location": p.location, "datagrams": 0, "given": 0.0,
                                        **({"unit": p.unit} if p.unit else {})})
            q["datagrams"] += p.datagrams
            q["given"] += (p.share or 0) * whole
        for name, c in (("vs_lost", lo.vs_lost), ("vs_counters", lo.vs_counters)):
            if c is not None and not c.empty:
                sums = compared.setdefault(name, [0, 0, 0])
                sums[0], sums[1], sums[2] = sums[0] + c.kernel, sums[1] + c.other, sums[2] + c.known_to
        for pair in lo.by_reason:
            sums = compared.setdefault(f"{pair.counter}|{','.join(pair.reasons)}", [0, 0, 0])
            sums[0], sums[1] = sums[0] + pair.kernel, sums[1] + pair.other
        for n in lo.not_lost:
            m = not_lost.setdefault((n.host, n.device, n.reason), n.plus(datagrams=0))
            m.datagrams += n.datagrams
    rows = sorted(places.values(), key=lambda q: -q["datagrams"])
    for q in rows:
        q["share"] = q.pop("given") / whole_sum if whole_sum else 0.0
    # None where no sample had a lost count (iperf3 -R: the receiver's count is not offlab's to read)
    known = any(lo.lost is not None for lo in losses)
    out: dict = {"lost": lost if known else None, "dropped": dropped, "unseen": unseen,
                 "unseen_share": rest / whole_sum if whole_sum else 0.0, "places": rows, "samples": len(losses)}
    if not_lost:
        out["not_lost"] = list(not_lost.values())
    unseen_in = [lo for lo in losses if lo.unseen]
    if unseen_in and all(lo.unseen_at_edges for lo in unseen_in):  # each sample's own bounds held it
        out["unseen_at_edges"] = True
        out["lost_bounds"] = [sum((lo.lost_bounds or [lo.lost or 0] * 2)[i] for lo in losses) for i in (0, 1)]
    for name, (kernel, other, known_to) in compared.items():
        if name.startswith("vs_"):
            out[name] = agreement(int(kernel), int(other), known_to)
        else:
            counter, reasons = name.split("|")
            out.setdefault("by_reason", []).append({"counter": counter, "reasons": reasons.split(","),
                                                    **agreement(int(kernel), int(other))})
    return KernelLoss.from_json(out)


def _merge_hops(hops: list[Hop]) -> list[Hop]:
    merged: dict[tuple, Hop] = {}
    for h in hops:
        m = merged.setdefault((h.host, h.device), Hop.keyed(host=h.host, device=h.device, gro_in=0,
                                                            software_segmented=0, gro_built=0, queued=_empty(),
                                                            sent=_empty(), received=_empty()))
        m.gro_in += h.gro_in
        m.software_segmented += h.software_segmented
        m.gro_built += h.gro_built
        for a, b in ((m.queued, h.queued), (m.sent, h.sent), (m.received, h.received)):
            a.skbs += b.skbs
            a.segments += b.segments
            a.super_packets += b.super_packets
            a.super_segments += b.super_segments
            for t, v in b.by_type.items():
                x = a.by_type.setdefault(t, GsoTally.keyed(super_packets=0, segments=0))
                x.super_packets += v.super_packets
                x.segments += v.segments
    return list(merged.values())


def _empty() -> Tally:
    return Tally.keyed(skbs=0, segments=0, super_packets=0, super_segments=0, by_type={})


def _pct(share: float | None) -> str:
    return "" if share is None else f" ({100 * share:+.1f} %)"


def _disagreement(what: str, c: Agreement) -> str:
    return (f"DISAGREES with {what}: kernel {c.kernel} vs {c.other}, {c.difference:+d} datagrams"
            f"{_pct(c.difference_share)}")


def loss_percents(lo: KernelLoss) -> list[str]:
    """A merged loss's places' shares and then the unseen one, as printed percentages adding up to 100."""
    return percents([p.share or 0.0 for p in lo.places] + [lo.unseen_share])


def loss_lines(m: CellKernelAccount | None) -> list[str]:
    """Where the loss went by the kernel's reason (a merged account, `merge`), its shares adding up to 100 %
    as printed, and every disagreement with the lost count or the counters, by how much."""
    lo = m.loss if m is not None else None
    if lo is None or lo.empty:
        return []
    guests = sorted({p.host for p in lo.places if p.unit == "skbs"})
    of = f"of {lo.lost} lost" if lo.lost is not None else "(no lost count to set them against)"
    head = (f"kernel drops {lo.dropped} datagrams {of} (skb:kfree_skb, a super-packet by its segments"
            + (f"; in {', '.join(guests)}'s own kernel by its hist triggers, a super-packet as 1 skb" if guests else "")
            + ")")
    out = [head]
    shown = loss_percents(lo)
    for p, pct in zip(lo.places, shown[:-1], strict=True):
        where = place_name(p)
        out.append(f"  {where} {p.reason} at {p.location} {p.datagrams}"
                   f"{' skbs' if p.unit == 'skbs' else ''} ({pct} %)")
    if lo.unseen:
        edges = (f": lost at the window's edges, where the tool's rows put {lo.lost_bounds[0]}.."
                 f"{lo.lost_bounds[1]} in it" if lo.unseen_at_edges and lo.lost_bounds else "")
        out.append(f"  {UNSEEN} {lo.unseen} ({shown[-1]} %){edges}")
    for n in lo.not_lost:
        out.append(f"  not loss: {n.host}:{n.device} {n.reason} {n.datagrams}: {n.what}")
    for c, what in ((lo.vs_lost, "the lost count"), (lo.vs_counters, "the counters' attribution")):
        if c is not None and not c.empty and not c.agree:
            out.append("  " + _disagreement(what, c))
    for pair in lo.by_reason:
        if not pair.agree:
            out.append(f"  {'|'.join(pair.reasons)} {pair.kernel} vs the counters' {pair.counter} "
                       f"{pair.other}: {pair.difference:+d} datagrams{_pct(pair.difference_share)}")
    return out


def place_name(p: TraceDrop) -> str:
    """Where a drop was: `server:veth0`, `server (socket)`, or `client (its own kernel)` for a guest's
    (its hist has no device: probes/hist.py)."""
    if p.device:
        return f"{p.host}:{p.device}"
    return f"{p.host}" + (" (its own kernel)" if p.unit == "skbs" else " (socket)")


def _types(part: Tally) -> str:
    # "?": a guest's queue's super-packets, of a type its tracepoint does not carry (probes/hist.py)
    return "|".join("type unknown" if t == "?" else t for t in sorted(part.by_type)) or "no"


def hop_line(h: Hop) -> str | None:
    """One device's segmentation and merging by the kernel's account; None where it carried only wire-size skbs."""
    where = f"{h.host}:{h.device}"
    q, s, r = h.queued, h.sent, h.received
    if h.software_segmented:
        inferred = ", inferred from its driver's" if "?" in q.by_type else ""
        return (f"{where} segmented in software: its queue was handed {q.super_packets} {_types(q)} super-packets "
                f"({q.super_segments} segments{inferred}), its driver {s.skbs} skbs of which {s.super_packets} "
                f"super-packets")
    parts = []
    if s.super_packets:
        parts.append(f"driver handed {s.super_packets} {_types(s)} super-packets ({s.super_segments} "
                     f"segments, {s.super_segments / s.super_packets:.1f} each)")
    if r.super_packets:
        how = (f"GRO built {h.gro_built} of them from {h.gro_in} frames" if h.gro_built
               else "as they arrived: GRO built none here")
        parts.append(f"passed up {r.super_packets} {_types(r)} super-packets ({r.super_segments} segments), {how}")
    elif h.gro_in:
        parts.append(f"GRO was handed {h.gro_in} frames and merged none")
    return f"{where} " + "; ".join(parts) if parts else None


def segmentation_lines(m: CellKernelAccount | None) -> list[str]:
    """Per hop, what the kernel handed each device and passed up from it; USO's verdict; the kernel's verdict
    beside each counters' witness, a disagreement flagged."""
    if m is None or not m.traced:
        return []
    out = [line for h in m.hops if (line := hop_line(h))]
    u = m.uso
    if u is not None and not u.empty:
        n = u.samples
        verdict = ("USO exercised" if u.exercised == n else "USO not exercised" if not u.exercised
                   else f"USO exercised in {u.exercised} of {n} samples")
        line = (f"{verdict} by the kernel's account: the client's drivers were handed {u.super_packets} UDP_L4 "
                f"super-packets ({u.segments} segments) among {u.skbs} skbs")
        if u.segmented_in_software_at:
            line += f"; segmented in software at {', '.join(u.segmented_in_software_at)}"
        if u.disagree:
            line += f"; DISAGREES with the counters' witness ({', '.join(u.counters)})" + (
                f" in {u.disagree} of {n} samples" if n > 1 else "")
        out.append(line)
    for e in m.effects:
        n = e.samples
        kernel = "exercised" if e.exercised == n else "not exercised" if not e.exercised else \
            f"exercised in {e.exercised} of {n} samples"
        line = f"{e.setting} at {e.where}: {kernel} by the kernel's account ({e.detail})"
        if e.disagree:
            line += f"; DISAGREES with the counters' witness ({', '.join(e.counters)})" + (
                f" in {e.disagree} of {n} samples" if n > 1 else "")
        elif e.counters:
            line += f"; the counters' witness: {', '.join(e.counters)}"
        out.append(line)
    return out


def unavailable_lines(m: CellKernelAccount | None) -> list[str]:
    if m is None or not m.unavailable:
        return []
    untraced = m.samples - m.traced
    return [f"kernel account not taken in {untraced} of {m.samples} sample(s): {why}" for why in m.unavailable]
