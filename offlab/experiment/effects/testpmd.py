"""testpmd's GRO on the data's input port and GSO on its output port, from that direction's packets out
per packet in (testpmd's own read of what was in force, `probes.testpmd_settings`, says which are on)."""

from __future__ import annotations

import math

from offlab.experiment.effects import (EXERCISED, MERGED_BELOW, MIN_PACKETS, NOT_APPLICABLE, NOT_EXERCISED,
                                       SPLIT_ABOVE, Effect)
from offlab.probes.edge.dpdk_ports import TestpmdPorts
from offlab.sample import StoredSample
from offlab.wire import TCP_FRAME_OVERHEAD


def judge_sample(sample: StoredSample) -> list[Effect]:
    tp, settings = sample.probes.of(TestpmdPorts), sample.probes.testpmd_settings
    if tp is None or settings is None or not tp.data_direction:
        return []
    src, dst = tp.data_direction.split(">")
    d = tp.directions[tp.data_direction]
    pin, pout = settings.port(src), settings.port(dst)
    fwd = settings.fwd
    # what the engine handed the output port, sent or dropped: a port that drops (a vhost-user guest that
    # cannot keep up: 40353 sent + 3495 dropped of 43848) must not pass for a merge
    out_port = tp.ports.get(dst)
    dropped, errors = (out_port.fwd_tx_dropped, out_port.tx_errors) if out_port is not None else (0, 0)
    rx, tx = d.rx_packets, d.tx_packets
    ratio = (tx + dropped) / rx if rx else None
    avg_in = d.rx_bytes / rx if rx else 0.0
    sent_per_in = tx / rx if rx else None
    counters = {"fwd": fwd, "rx_packets": rx, "tx_packets": tx, "tx_dropped": dropped, "tx_errors": errors,
                "out_per_in": ratio, "sent_per_in": sent_per_in,
                "rx_avg_bytes": round(avg_in, 1), "direction": f"port {src} → port {dst}"}
    seen = (f"port {src} received {rx} packets (avg {avg_in:.0f} B), port {dst} sent {tx}"
            + (f" and dropped {dropped}" if dropped else "") + (f" ({errors} tx errors)" if errors else "")
            + f": {ratio:.3f} out per in" if ratio is not None else f"port {src} received {rx} packets")
    gro_on, gso_on, segsz, tso = pin.gro.on, pout.gso.on, pout.gso.segsz or 0, pout.tso_segsz or 0
    out = []
    gro_where, gso_where = f"switch (testpmd port {src}, rx)", f"switch (testpmd port {dst}, tx)"
    if gro_on:
        out.append(_gro(gro_where, fwd, rx, ratio, avg_in, gso_on, segsz, tso, dst, seen, counters,
                        errors, sent_per_in))
    if gso_on:
        out.append(_gso(gso_where, fwd, rx, ratio, avg_in, segsz, gro_on, src, seen, counters))
    return out


def resegment_factor(avg_in: float, gso_segsz: int, tso_segsz: int) -> int:
    """Packets out per packet in that GSO (segsz: whole frame) or TSO (segsz: payload) on the output
    port make of unmerged input frames of `avg_in` bytes: 1 when they fit."""
    payload = avg_in - TCP_FRAME_OVERHEAD
    if payload <= 0:
        return 1
    per = [gso_segsz - TCP_FRAME_OVERHEAD] if gso_segsz else []
    per += [tso_segsz] if tso_segsz else []
    return max([math.ceil(payload / p) for p in per if p > 0] or [1])


def _gro(where, fwd, rx, ratio, avg_in, gso_on, segsz, tso, dst, seen, counters, errors, sent_per_in) -> Effect:
    e = Effect(setting="testpmd.gro", where=where, value="on", status=NOT_APPLICABLE, detail=seen, counters=counters)
    if rx < MIN_PACKETS or ratio is None:
        e.cause = f"fewer than {MIN_PACKETS} packets in the data direction: nothing to judge"
        return e
    factor = resegment_factor(avg_in, segsz if gso_on else 0, tso)
    e.counters = {**counters, "unmerged_out_per_in": factor}
    # A port that refuses merged frames (the tap PMD: any non-TSO frame over MTU + 22 B is a tx error)
    # also shows the merge: fewer sent per packet in, with errors.
    refused = errors > 0 and sent_per_in < MERGED_BELOW * factor
    if ratio < MERGED_BELOW * factor or refused:
        e.status = EXERCISED
        e.detail = seen + (f" (without a merge {factor} would leave per packet in)" if factor > 1 else "") + (
            f"; port {dst} refused merged frames ({errors} tx errors)" if refused else "")
        return e
    if fwd != "csum":
        e.status, e.cause = NOT_EXERCISED, f"testpmd GRO runs only in its csum forwarding engine; fwd is {fwd}"
        return e
    if factor == 1 and (gso_on or tso):
        e.cause = (f"{'GSO (segsz ' + str(segsz) if gso_on else 'TSO (segsz ' + str(tso)} B) on port {dst} cuts "
                   f"merged packets back to the input's size (avg {avg_in:.0f} B): packets out per packet in "
                   f"cannot show a merge")
        return e
    e.status = NOT_EXERCISED
    e.cause = ("GRO merged nothing: the PMD sets no packet type, or the flow's packets do not arrive within "
               "one burst (gro_flush)")
    return e


def _gso(where, fwd, rx, ratio, avg_in, segsz, gro_on, src, seen, counters) -> Effect:
    e = Effect(setting="testpmd.gso", where=where, value="on", status=NOT_APPLICABLE, detail=seen,
               counters={**counters, "gso_segsz": segsz})
    if rx < MIN_PACKETS or ratio is None:
        e.cause = f"fewer than {MIN_PACKETS} packets in the data direction: nothing to judge"
        return e
    if ratio > SPLIT_ABOVE:
        e.status = EXERCISED
        return e
    if fwd != "csum":
        e.status, e.cause = NOT_EXERCISED, f"testpmd GSO runs only in its csum forwarding engine; fwd is {fwd}"
        return e
    if avg_in <= segsz and not gro_on:
        e.status = NOT_EXERCISED
        e.cause = (f"nothing to segment: the input frames averaged {avg_in:.0f} B, at most gso_segsz {segsz} B, "
                   f"and GRO is off on port {src} (a kernel tap hands testpmd wire-size frames)")
        return e
    if gro_on and avg_in <= segsz:
        e.cause = (f"GRO on port {src} merges and GSO cuts back to {segsz} B, the input's own size: "
                   f"packets out per packet in cannot show the split")
        return e
    e.status, e.cause = NOT_EXERCISED, f"frames above gso_segsz {segsz} B arrived and left whole"
    return e
