"""The kernel's account of a sample beside the counters': loss by drop reason, segmentation and merging per hop.

Pure functions over a sample (offlab.sample's record): `probes.trace` (a TraceAccount) against its
`loss_attribution` (counters) and its `effects` (the counters' witnesses), giving a KernelAccount. The
lines people read are offlab.report.kernel's. docs/results.md defines each figure. Where a function
builds a dict, it is its own output, read as its view before it is returned.
"""

from __future__ import annotations

import dataclasses

from offlab.experiment.effects import EXERCISED, MIN_PACKETS
from offlab.experiment.effects.merging import MERGING
from offlab.experiment.effects.segmentation import SEGMENTATION
from offlab.feature_names import names_for
from offlab.metrics import NOT_EXERCISED
from offlab.sample import (Agreement, Effect, EffectVerdict, GsoTally, Hop, KernelAccount, KernelLoss, LossAttribution,
                           LossPlace, SampleWorkload, StoredSample, Tally, TraceAccount, TraceDrop, TraceSkbs, UsoVerdict)
from offlab.stats import AGREE_COUNT, agreement, partition

SOFTWARE_MIN = AGREE_COUNT  # fewer super-packets than this cut in software is noise at the edges
USO_SETTINGS = names_for("tx-udp-segmentation")  # uso, tx-udp-segmentation
UDP_L4 = "UDP_L4"
# gso_type names (offlab.probes.trace.GSO_TYPES) that carry each protocol's super-packets
KINDS = {"tcp": ("TCPV4", "TCPV6"), "udp": (UDP_L4,), "any": ()}
# A device whose queue was handed super-packets that its driver was not (cut in software between the
# two, validate_xmit_skb) by at least this share of them: segmented in software there.
SOFTWARE_SHARE = 0.5
# The counters' loss places and the kernel's drop reasons that count the same datagrams: compared one
# by one where both saw some.
QUEUE_REASONS = ("QDISC_DROP", "QDISC_OVERLIMIT")
SAME_DROPS = (("RcvbufErrors", ("SOCKET_RCVBUFF",)), ("NoPorts", ("NO_SOCKET",)),
              ("InCsumErrors", ("UDP_CSUM", "SKB_CSUM")), ("qdisc", QUEUE_REASONS),
              ("softnet backlog", ("CPU_BACKLOG",)))


def loss(trace: TraceAccount, lost: int | None, counted: float | None,
         counter_places: list[LossPlace] | None = None, *, refused: int = 0, lost_known_to: float = 0,
         lost_bounds: tuple[int, int] | None = None) -> KernelLoss | None:
    """Lost datagrams by the kernel's reason: per (host, device, reason, location) the datagrams and their
    share, and `unseen` what no tracepoint saw; shares are of max(lost, dropped) and add up to 1.
    `refused`: sends the engine saw refused (ENOBUFS) and sent again: that many of the client's queue
    drops are not loss (`not_lost`). `vs_lost` compares the kernel's total with the lost count (known to ±
    `lost_known_to`), `vs_counters` with the counters' estimate (`counted`), and `by_reason` each counter
    place with the drop reasons that count the same datagrams. `lost_bounds`: the tool's rows put the lost
    in the window between these (rows at its edges count in part); a kernel count inside them agrees, and
    what it leaves unseen is named as the edge rows' (`unseen_at_edges`), not as drops no tracepoint saw."""
    drops, not_lost = _not_lost(trace.drops, refused)
    dropped = sum(d.datagrams for d in drops)
    if not dropped and not lost:
        return None
    shares, rest = partition([d.datagrams for d in drops], lost or 0)
    places = [d.plus(share=s) for d, s in zip(drops, shares, strict=True)]
    unseen = max(0, (lost or 0) - dropped)
    out: dict = {"dropped": dropped, "lost": lost, "places": places, "unseen": unseen, "unseen_share": rest}
    if not_lost:
        out["not_lost"] = not_lost
    if lost_bounds is not None and lost is not None:
        low, high = lost_bounds
        out["lost_bounds"] = [low, high]
        lost_known_to = max(lost_known_to, lost - low, high - lost)
        if unseen and dropped >= low:
            out["unseen_at_edges"] = True
    if lost is not None:
        out["vs_lost"] = Agreement.from_json(agreement(dropped, lost, lost_known_to))
    if counted is not None:
        out["vs_counters"] = Agreement.from_json(agreement(dropped, round(counted), lost_known_to))
    pairs = []
    for counter, reasons in SAME_DROPS:
        theirs = [p for p in counter_places or [] if counter in p.where]
        ours = sum(d.datagrams for d in drops if d.reason in reasons)
        if theirs or ours:
            pairs.append(Agreement.keyed(counter=counter, reasons=list(reasons),
                                         **agreement(ours, round(sum(float(p.datagrams or 0) for p in theirs)))))
    if pairs:
        out["by_reason"] = pairs
    return KernelLoss.keyed(**out)


def _not_lost(drops: list[TraceDrop], refused: int) -> tuple[list[TraceDrop], list[TraceDrop]]:
    """Drops that are not loss, as `not_lost`: the client's queue drops up to the sends the engine was
    refused and sent again, and a switch's own stack dropping its copy of a frame for another host."""
    kept, out = [], []
    for d in drops:
        if d.host == "switch" and d.reason == "OTHERHOST":
            # A userspace switch (OVS's netdev datapath) reads its ports with packet sockets, which get a
            # clone of each frame; the original still goes up the switch namespace's IP stack, which
            # drops it as addressed to another host. A kernel bridge takes the frame before that stack.
            out.append(d.plus(what="the switch's own IP stack dropped its copy of a frame for another host; "
                                   "its datapath took the frame from a packet socket"))
            d = d.plus(datagrams=0)
        elif refused and d.host == "client" and d.reason in QUEUE_REASONS:
            n = min(refused, d.datagrams)
            refused -= n
            out.append(d.plus(datagrams=n, what="sends the queue refused (ENOBUFS), sent again by the engine"))
            d = d.plus(datagrams=d.datagrams - n)
        kept.append(d)
    return [d for d in kept if d.datagrams > 0], out


def _tally(rows: list[TraceSkbs]) -> Tally:
    """skbs and segments, and the super-packets among them (more than one segment) by gso_type."""
    supers: dict[str, list[int]] = {}
    for r in rows:
        if r.segments > r.skbs:
            got = supers.setdefault(r.gso_type, [0, 0])
            got[0], got[1] = got[0] + r.skbs, got[1] + r.segments
    return Tally.keyed(skbs=sum(r.skbs for r in rows), segments=sum(r.segments for r in rows),
                       super_packets=sum(n for n, _ in supers.values()),
                       super_segments=sum(m for _, m in supers.values()),
                       by_type={t: GsoTally.keyed(super_packets=n, segments=m) for t, (n, m) in sorted(supers.items())})


def hops(trace: TraceAccount) -> list[Hop]:
    """Per device of the lab: what its queue was handed (net_dev_queue), what its driver was handed
    (net_dev_start_xmit), what it passed up (netif_receive_skb), the frames it gave GRO, and where the
    kernel cut super-packets in software (`software_segmented`: queued as super-packets, not handed so)."""
    # the sender first, the receiver last, the hops between by name: the order data crosses them
    parts = {"queue": trace.queue, "xmit": trace.xmit, "rx": trace.rx}
    seen = {(r.host, r.device) for rows in parts.values() for r in rows} | {(r.host, r.device) for r in trace.gro_in}
    devices = sorted(seen, key=lambda hd: ({"client": 0, "server": 2}.get(hd[0], 1), hd))
    out = []
    for host, dev in devices:
        def at(key: str, host: str = host, dev: str = dev) -> list[TraceSkbs]:
            return [r for r in parts[key] if r.host == host and r.device == dev]

        queued, sent, passed = _tally(at("queue")), _tally(at("xmit")), _tally(at("rx"))
        gro_in = sum(r.frames for r in trace.gro_in if r.host == host and r.device == dev)
        cut = max(0, queued.super_packets - sent.super_packets)
        out.append(Hop.keyed(
            host=host, device=dev, queued=queued, sent=sent, received=passed, gro_in=gro_in,
            software_segmented=cut if cut >= SOFTWARE_MIN and cut >= SOFTWARE_SHARE * queued.super_packets else 0,
            # GRO merged here: super-packets passed up, built from the frames its NAPI handed GRO
            gro_built=passed.super_packets if gro_in > passed.skbs and passed.super_packets else 0))
    return out


def _where(effect: Effect) -> tuple[str, str]:
    host, _, dev = effect.where.partition(":")
    return host, dev


def second_source(hop_list: list[Hop], effects: list[Effect] | None) -> list[EffectVerdict]:
    """The kernel's verdict on each segmentation and merging setting the counters' witnesses judged (and on
    the engine's UDP_SEGMENT), beside theirs; `agree` False where both judged and differ."""
    by_dev = {(h.host, h.device): h for h in hop_list}
    out = []
    for e in effects or []:
        key, value = e.setting, e.value
        if str(value).lower() not in ("on", "true", "1", "yes"):
            continue
        found = None
        if key in SEGMENTATION or key in MERGING:
            hop = by_dev.get(_where(e))
            if hop is not None:
                found = (_segmented(hop, KINDS[SEGMENTATION[key]]) if key in SEGMENTATION
                         else _merged(hop, KINDS[MERGING[key]]))
        elif key.startswith("workload gso") or key.startswith("workload gro"):
            role = e.where.split(" ", 1)[0]
            mine = [h for h in hop_list if h.host == role]
            found = _socket_gso(mine) if key.startswith("workload gso") else _socket_gro(mine)
        if found is None:
            continue
        status, detail = found
        row: dict = {"setting": key, "where": e.where, "kernel": status, "detail": detail, "counters": e.status}
        if e.status in (EXERCISED, NOT_EXERCISED) and status in (EXERCISED, NOT_EXERCISED):
            row["agree"] = e.status == status
        out.append(EffectVerdict.keyed(**row))
    return out


def _segmented(hop: Hop, types: tuple[str, ...]) -> tuple[str, str] | None:
    where = f"{hop.host}:{hop.device}"
    sent, queued = _tally_of(hop.sent, types), _tally_of(hop.queued, types)
    if sent.skbs < MIN_PACKETS:
        return None
    if sent.super_packets:
        return EXERCISED, (f"{where}'s driver was handed {sent.super_packets} {'|'.join(sorted(sent.by_type))} "
                           f"super-packets ({sent.super_segments} segments)")
    if queued.super_packets:
        return NOT_EXERCISED, (f"segmented in software at {where}: its queue was handed {queued.super_packets} "
                               f"super-packets ({queued.super_segments} segments), its driver wire-size skbs only")
    return NOT_EXERCISED, f"{where}'s driver was handed {sent.skbs} skbs, none a super-packet"


def _tally_of(t: Tally, types: tuple[str, ...]) -> Tally:
    """A hop's part with only the super-packets of the given gso types (all when none), in `by_type`."""
    # "?": a guest's queue's super-packets, whose type its tracepoint does not carry (probes/hist.py)
    ok = {n: v for n, v in t.by_type.items() if not types or n == "?" or set(n.split("|")) & set(types)}
    return dataclasses.replace(t, super_packets=sum(v.super_packets for v in ok.values()),
                               super_segments=sum(v.segments for v in ok.values()), by_type=ok)


def _merged(hop: Hop, types: tuple[str, ...]) -> tuple[str, str] | None:
    where = f"{hop.host}:{hop.device}"
    got = _tally_of(hop.received, types)
    if got.skbs < MIN_PACKETS and hop.gro_in < MIN_PACKETS:
        return None
    if hop.gro_built and got.super_packets:
        return EXERCISED, (f"GRO at {where} built {got.super_packets} super-packets of {got.super_segments} "
                           f"frames ({hop.gro_in} frames handed to GRO)")
    if got.super_packets:
        return None  # they arrived merged (a veth passes its peer's super-packets): nothing to say of GRO
    if hop.gro_in:
        return NOT_EXERCISED, f"GRO at {where} was handed {hop.gro_in} frames and passed them up unmerged"
    return NOT_EXERCISED, f"{where} passed up {got.skbs} skbs, none merged, and handed GRO none"


def _socket_gso(sender_hops: list[Hop]) -> tuple[str, str] | None:
    queued = [_tally_of(h.queued, KINDS["udp"]) for h in sender_hops]
    supers = sum(t.super_packets for t in queued)
    total = sum(t.skbs for t in queued)
    if total < MIN_PACKETS:
        return None
    if supers:
        return EXERCISED, (f"the sender's devices were handed {supers} UDP_L4 super-packets "
                           f"({sum(t.super_segments for t in queued)} segments)")
    return NOT_EXERCISED, f"the sender's devices were handed {total} skbs, none a UDP_L4 super-packet"


def _socket_gro(receiver_hops: list[Hop]) -> tuple[str, str] | None:
    """UDP_GRO on the receiving socket takes merged buffers only if its devices passed UDP super-packets up."""
    got = [_tally_of(h.received, KINDS["udp"]) for h in receiver_hops]
    supers = sum(t.super_packets for t in got)
    total = sum(t.skbs for t in got)
    if total < MIN_PACKETS:
        return None
    if supers:
        return EXERCISED, (f"the receiver's devices passed up {supers} UDP_L4 super-packets "
                           f"({sum(t.super_segments for t in got)} segments)")
    return NOT_EXERCISED, (f"the receiver's devices passed up {total} skbs, none a UDP super-packet "
                           f"(GRO was handed {sum(h.gro_in for h in receiver_hops)} frames)")


def uso(trace: TraceAccount, effects: list[Effect] | None, hop_list: list[Hop] | None = None,
        workload: SampleWorkload | None = None) -> UsoVerdict | None:
    """Was USO exercised by the kernel's account: the client's devices' drivers handed UDP_L4
    super-packets; where its queue had them and its driver did not, where they were cut in software;
    beside the counters' USO witness (effects), a disagreement flagged. None where the client sent no UDP
    through a device and no USO setting was judged."""
    rows = [r for r in trace.xmit if r.host == "client" and UDP_L4 in r.gso_type.split("|")]
    supers = sum(r.skbs for r in rows if r.segments > r.skbs)
    segments = sum(r.segments for r in rows if r.segments > r.skbs)
    exercised = supers > 0
    witness = next((e for e in effects or [] if e.setting in USO_SETTINGS and e.where.startswith("client")), None)
    client = [h for h in hop_list or hops(trace) if h.host == "client"]
    cut = [f"client:{h.device}" for h in client
           if h.software_segmented and _tally_of(h.queued, KINDS["udp"]).super_packets]
    sent = sum(h.sent.skbs for h in client)
    udp = workload is not None and workload.protocol == "udp" and sent >= MIN_PACKETS
    if not (udp or exercised or cut or witness is not None):
        return None
    out: dict = {"exercised": exercised, "super_packets": supers, "segments": segments,
                 "devices": sorted({r.device for r in rows}), "skbs": sent}
    if cut:
        out["segmented_in_software_at"] = cut
    if witness is not None:
        other = witness.status
        out["counters"] = other
        if other in (EXERCISED, NOT_EXERCISED):
            out["agree"] = (other == EXERCISED) == exercised
    return UsoVerdict.keyed(**out)


def judge(sample: StoredSample) -> KernelAccount | None:
    """The sample's `kernel_account`: its trace's loss by reason, its hops, the USO verdict and the second
    source for the counters' effect witnesses."""
    trace = sample.probes.trace
    if trace is None or trace.empty:
        return None
    if trace.unavailable is not None:
        return KernelAccount.keyed(unavailable=trace.unavailable)
    out: dict = {}
    if sample.workload.protocol == "udp":
        found = _loss_of(trace, sample)
        if found is not None:
            out["loss"] = found
    hop_list = hops(trace)
    out["hops"] = hop_list
    u = uso(trace, sample.effects, hop_list, sample.workload)
    if u is not None:
        out["uso"] = u
    second = second_source(hop_list, sample.effects)
    if second:
        out["effects"] = second
    if trace.not_traced:
        out["not_traced"] = trace.not_traced
    return KernelAccount.keyed(**out)


def windows_apart(la: LossAttribution, trace: TraceAccount, window_s: float | None) -> float:
    """How many datagrams the counters' lost and the kernel's drops may differ by because their windows
    differ, from what the sample measured of its own edges; the parts add. The lost count itself is known
    to ± `lost_uncertainty` (the client's and the server's counters read up to skew_s apart, and what was
    on its way at an edge: `lost_in_flight`, queued on the receiving socket or in a backlog). The kernel's
    edges came `edge_lag_s` after each edge's last counters' read, which came up to skew_s after the first:
    the two windows' lengths differ by up to |lag at the end − lag at the start| + skew_s, that long a
    stretch of the window's loss rate (a loaded machine preempts offlab between the reads and the signal)."""
    known = float(la.lost_uncertainty or 0)
    lags = [x or 0.0 for x in (trace.edge_lag_s or [])]
    if la.lost and window_s and len(lags) == 2:
        known += la.lost / window_s * (abs(lags[1] - lags[0]) + (la.skew_s or 0))
    return known


def _loss_of(trace: TraceAccount, sample: StoredSample) -> KernelLoss | None:
    """A UDP sample's lost datagrams by the kernel's reason, beside its counters' attribution."""
    la, traffic = sample.loss_attribution, sample.traffic
    if la is None:
        return loss(trace, None, None, refused=traffic.error("ENOBUFS") if traffic.tool == "engine" else 0)
    # the counters' estimate before it was capped at the lost count (attribute_loss's overshoot)
    counted = (la.explained or 0) + (la.overshoot or 0)
    return loss(trace, la.lost, counted, la.places,
                refused=traffic.error("ENOBUFS") if traffic.tool == "engine" else 0,
                lost_known_to=windows_apart(la, trace, sample.probes.window_s),
                lost_bounds=(la.lost_low, la.lost_high) if la.lost_low is not None and la.lost_high is not None
                else None)


def disagreements(ka: KernelAccount | None) -> list[str]:
    """Where the kernel's account and the counters' differ, one note each, with by how much."""
    if ka is None or ka.empty or ka.unavailable is not None:
        return []
    out = []
    lo = ka.loss if ka.loss is not None else KernelLoss()
    for c, what in ((lo.vs_lost, "the lost count"), (lo.vs_counters, "the counters' attribution")):
        if c is not None and not c.empty and not c.agree:
            share = f" ({100 * c.difference_share:+.1f} %)" if c.difference_share is not None else ""
            out.append(f"kernel account disagrees with {what}: kernel {c.kernel} vs {c.other} datagrams, "
                       f"{c.difference:+d}{share}")
    for e in ka.effects:
        if e.agree is False:
            out.append(f"kernel account disagrees with the {e.setting} witness at {e.where}: kernel "
                       f"{e.kernel}, counters {e.counters} ({e.detail})")
    u = ka.uso
    if u is not None and u.agree is False:
        out.append(f"kernel account disagrees with the USO witness: kernel {'exercised' if u.exercised else 'not exercised'}, "
                   f"counters {u.counters}")
    return out
