"""The kernel's account of a sample beside the counters': loss by drop reason, segmentation by gso_type.

Pure functions over a sample's stored figures: `probes.trace` (offlab.probes.trace) against its
`loss_attribution` (counters) and its `effects` (the USO witness). docs/results.md defines each figure.
"""

from __future__ import annotations

UNSEEN = "no tracepoint saw them"
# The kernel's and the counters' totals are read at the same edges but not the same instants (the
# counters in microseconds, bpftrace's printout within ~0.1 s): a difference under both of these is
# agreement.
AGREE_SHARE = 0.01
AGREE_DATAGRAMS = 10
USO_SETTINGS = ("uso", "tx-udp-segmentation")
UDP_L4 = "UDP_L4"


def loss(trace: dict, lost: int | None, counted: float | None) -> dict | None:
    """Lost datagrams by the kernel's reason: per (host, device, reason, location) the datagrams and their
    share, and `unseen` what no tracepoint saw; shares are of max(lost, dropped) and add up to 100 %.
    `agreement` compares the kernel's total with the counters' (`counted`: explained datagrams)."""
    drops = trace.get("drops") or []
    dropped = sum(d["datagrams"] for d in drops)
    if not dropped and not lost:
        return None
    whole = max(lost or 0, dropped)
    places = [{**d, "share": d["datagrams"] / whole} for d in drops]
    unseen = max(0, (lost or 0) - dropped)
    out: dict = {"dropped": dropped, "lost": lost, "places": places, "unseen": unseen,
                 "unseen_share": unseen / whole if whole else 0.0}
    if lost is not None:
        out["vs_lost"] = _compare(dropped, lost)
    if counted is not None:
        out["vs_counters"] = _compare(dropped, round(counted))
    return out


def _compare(kernel: int, other: int) -> dict:
    diff = kernel - other
    agree = abs(diff) <= max(AGREE_DATAGRAMS, AGREE_SHARE * max(kernel, other))
    return {"kernel": kernel, "other": other, "difference": diff,
            "difference_share": diff / other if other else None, "agree": agree}


def uso(trace: dict, effects: list[dict] | None) -> dict | None:
    """Was USO exercised by the kernel's account: the client's devices handed UDP_L4 super-packets
    (segments > skbs); beside the counters' USO witness (effects), a disagreement flagged."""
    rows = [r for r in trace.get("xmit") or [] if r["host"] == "client" and UDP_L4 in r["gso_type"].split("|")]
    supers = sum(r["skbs"] for r in rows if r["segments"] > r["skbs"])
    segments = sum(r["segments"] for r in rows if r["segments"] > r["skbs"])
    exercised = supers > 0
    witness = next((e for e in effects or [] if e.get("setting") in USO_SETTINGS
                    and str(e.get("where") or "").startswith("client")), None)
    out: dict = {"exercised": exercised, "super_packets": supers, "segments": segments,
                 "devices": sorted({r["device"] for r in rows})}
    if witness is None and not exercised:
        return out if rows else None
    if witness is not None:
        other = witness.get("status")
        out["counters"] = other
        if other in ("exercised", "not exercised"):
            out["agree"] = (other == "exercised") == exercised
    return out


def judge(sample: dict) -> dict | None:
    """The sample's `kernel_account`: its trace's loss by reason and USO verdict beside the counters'."""
    trace = (sample.get("probes") or {}).get("trace")
    if not trace:
        return None
    if "unavailable" in trace:
        return {"unavailable": trace["unavailable"]}
    la = sample.get("loss_attribution") or {}
    out: dict = {}
    if (sample.get("workload") or {}).get("protocol") == "udp":
        found = loss(trace, la.get("lost"), la.get("explained") if la else None)
        if found is not None:
            out["loss"] = found
    u = uso(trace, sample.get("effects"))
    if u is not None:
        out["uso"] = u
    out["segmentation"] = [r for r in trace.get("xmit") or [] if r["segments"] > r["skbs"]]
    out["merged"] = [r for r in trace.get("rx") or [] if r["segments"] > r["skbs"]]
    return out


def lines(ka: dict | None) -> list[str]:
    """The kernel's account as lines people read (offlab measure)."""
    if not ka:
        return []
    if "unavailable" in ka:
        return []  # the sample's note says why, in one line
    out = []
    lo = ka.get("loss")
    if lo:
        head = f"kernel drops {lo['dropped']} datagrams" + (f" of {lo['lost']} lost" if lo["lost"] is not None else "")
        out.append(head + " (skb:kfree_skb, a super-packet counted by its segments)")
        for p in lo["places"]:
            where = p["host"] + (f":{p['device']}" if p["device"] else "")
            out.append(f"  {where} {p['reason']} at {p['location']} {p['datagrams']} ({100 * p['share']:.1f} %)")
        if lo["unseen"]:
            out.append(f"  {UNSEEN} {lo['unseen']} ({100 * lo['unseen_share']:.1f} %)")
        for key, what in (("vs_lost", "the lost count"), ("vs_counters", "the counters' attribution")):
            c = lo.get(key)
            if c and not c["agree"]:
                pct = f" ({100 * c['difference_share']:+.1f} %)" if c["difference_share"] is not None else ""
                out.append(f"  disagrees with {what}: kernel {c['kernel']} vs {c['other']}, "
                           f"{c['difference']:+d} datagrams{pct}")
    for r in ka.get("segmentation") or []:
        out.append(f"kernel xmit {r['host']}:{r['device']} {r['skbs']} {r['gso_type']} super-packets "
                   f"→ {r['segments']} segments ({r['segments'] / r['skbs']:.1f} each)")
    for r in ka.get("merged") or []:
        out.append(f"kernel rx   {r['host']}:{r['device']} {r['skbs']} {r['gso_type']} super-packets passed up "
                   f"← {r['segments']} segments ({r['segments'] / r['skbs']:.1f} each)")
    u = ka.get("uso")
    if u:
        verdict = "USO exercised" if u["exercised"] else "USO not exercised"
        line = (f"{verdict} by the kernel's account: client {', '.join(u['devices']) or 'devices'} handed "
                f"{u['super_packets']} UDP_L4 super-packets ({u['segments']} segments)")
        if u.get("agree") is False:
            line += f"; DISAGREES with the counters' witness ({u['counters']})"
        out.append(line)
    return out


# Off by default: bpftrace's start (BTF, compile) adds seconds to a sample, and its throughput cost on
# the USO case was 2–18 % in four runs on this shared machine (docs/results.md, benchmarks/trace_cost).
OFF_LINE = "kernel account: off by default (seconds to start, a few % of throughput); --trace turns it on"
