"""The kernel's account (a sample's `kernel_account`, offlab.experiment.kernel_account) as people read it:
one sample's, or a cell's samples' summed, shown beside the counters' in every output."""

from __future__ import annotations

from offlab.stats import agreement, percents

UNSEEN = "no tracepoint saw them"
SOURCES = "skb:kfree_skb, net:net_dev_queue, net:net_dev_start_xmit, net:napi_gro_receive_entry, net:netif_receive_skb"
OFF_LINE = ("kernel account: off by default (seconds to start, a few % of throughput); --trace turns it on")


def merge(accounts: list[dict | None]) -> dict | None:
    """A cell's samples' accounts summed: drops by place, lost and unseen; each hop's skbs, segments and
    super-packets; USO and effect verdicts counted over the samples. Shares still add up to 1: a place
    gets the datagrams each sample gave it (its share × that sample's whole)."""
    got = [a for a in accounts if a]
    if not got:
        return None
    taken = [a for a in got if "unavailable" not in a]
    out: dict = {"samples": len(got), "traced": len(taken)}
    why = sorted({a["unavailable"] for a in got if "unavailable" in a})
    if why:
        out["unavailable"] = why
    if not taken:
        return out
    losses = [a["loss"] for a in taken if a.get("loss")]
    if losses:
        out["loss"] = _merge_loss(losses)
    out["hops"] = _merge_hops([h for a in taken for h in a.get("hops") or []])
    usos = [a["uso"] for a in taken if a.get("uso")]
    if usos:
        out["uso"] = {"samples": len(usos), "exercised": sum(bool(u["exercised"]) for u in usos),
                      "skbs": sum(u.get("skbs") or 0 for u in usos),
                      "super_packets": sum(u["super_packets"] for u in usos),
                      "segments": sum(u["segments"] for u in usos),
                      "segmented_in_software_at": sorted({d for u in usos for d in u.get("segmented_in_software_at") or []}),
                      "disagree": sum(u.get("agree") is False for u in usos),
                      "counters": sorted({str(u["counters"]) for u in usos if u.get("counters")})}
    effects: dict[tuple, dict] = {}
    for a in taken:
        for e in a.get("effects") or []:
            m = effects.setdefault((e["setting"], e["where"]), {"setting": e["setting"], "where": e["where"],
                                                                 "samples": 0, "exercised": 0, "disagree": 0,
                                                                 "detail": e["detail"], "counters": set()})
            m["samples"] += 1
            m["exercised"] += e["kernel"] == "exercised"
            m["disagree"] += e.get("agree") is False
            if e.get("counters"):
                m["counters"].add(e["counters"])
    if effects:
        out["effects"] = [{**m, "counters": sorted(m["counters"])} for m in effects.values()]
    return out


def _merge_loss(losses: list[dict]) -> dict:
    places: dict[tuple, dict] = {}
    lost = dropped = unseen = 0
    whole_sum = rest = 0.0
    compared: dict[str, list[float]] = {}
    not_lost: dict[tuple, dict] = {}
    for lo in losses:
        whole = max(lo.get("lost") or 0, lo["dropped"])
        whole_sum += whole
        rest += lo["unseen_share"] * whole
        lost += lo.get("lost") or 0
        dropped += lo["dropped"]
        unseen += lo["unseen"]
        for p in lo["places"]:
            key = (p["host"], p["device"], p["reason"], p["location"], p.get("unit"))
            q = places.setdefault(key, {"host": p["host"], "device": p["device"], "reason": p["reason"],
                                        "location": p["location"], "datagrams": 0, "given": 0.0,
                                        **({"unit": p["unit"]} if p.get("unit") else {})})
            q["datagrams"] += p["datagrams"]
            q["given"] += p["share"] * whole
        for name in ("vs_lost", "vs_counters"):
            if lo.get(name):
                sums, c = compared.setdefault(name, [0, 0, 0]), lo[name]
                sums[0], sums[1], sums[2] = sums[0] + c["kernel"], sums[1] + c["other"], sums[2] + c.get("known_to", 0)
        for pair in lo.get("by_reason") or []:
            sums = compared.setdefault(f"{pair['counter']}|{','.join(pair['reasons'])}", [0, 0, 0])
            sums[0], sums[1] = sums[0] + pair["kernel"], sums[1] + pair["other"]
        for n in lo.get("not_lost") or []:
            m = not_lost.setdefault((n["host"], n["device"], n["reason"]), {**n, "datagrams": 0})
            m["datagrams"] += n["datagrams"]
    rows = sorted(places.values(), key=lambda q: -q["datagrams"])
    for q in rows:
        q["share"] = q.pop("given") / whole_sum if whole_sum else 0.0
    # None where no sample had a lost count (iperf3 -R: the receiver's count is not offlab's to read)
    known = any(lo.get("lost") is not None for lo in losses)
    out: dict = {"lost": lost if known else None, "dropped": dropped, "unseen": unseen,
                 "unseen_share": rest / whole_sum if whole_sum else 0.0, "places": rows, "samples": len(losses)}
    if not_lost:
        out["not_lost"] = list(not_lost.values())
    unseen_in = [lo for lo in losses if lo["unseen"]]
    if unseen_in and all(lo.get("unseen_at_edges") for lo in unseen_in):  # each sample's own bounds held it
        out["unseen_at_edges"] = True
        out["lost_bounds"] = [sum((lo.get("lost_bounds") or [lo.get("lost") or 0] * 2)[i] for lo in losses)
                              for i in (0, 1)]
    for name, (kernel, other, known_to) in compared.items():
        if name.startswith("vs_"):
            out[name] = agreement(int(kernel), int(other), known_to)
        else:
            counter, reasons = name.split("|")
            out.setdefault("by_reason", []).append({"counter": counter, "reasons": reasons.split(","),
                                                    **agreement(int(kernel), int(other))})
    return out


def _merge_hops(hops: list[dict]) -> list[dict]:
    merged: dict[tuple, dict] = {}
    for h in hops:
        m = merged.setdefault((h["host"], h["device"]), {"host": h["host"], "device": h["device"], "gro_in": 0,
                                                          "software_segmented": 0, "gro_built": 0,
                                                          **{k: _empty() for k in ("queued", "sent", "received")}})
        for k in ("gro_in", "software_segmented", "gro_built"):
            m[k] += h[k]
        for part in ("queued", "sent", "received"):
            a, b = m[part], h[part]
            for k in ("skbs", "segments", "super_packets", "super_segments"):
                a[k] += b[k]
            for t, v in b["by_type"].items():
                x = a["by_type"].setdefault(t, {"super_packets": 0, "segments": 0})
                x["super_packets"] += v["super_packets"]
                x["segments"] += v["segments"]
    return list(merged.values())


def _empty() -> dict:
    return {"skbs": 0, "segments": 0, "super_packets": 0, "super_segments": 0, "by_type": {}}


def _pct(share: float | None) -> str:
    return "" if share is None else f" ({100 * share:+.1f} %)"


def _disagreement(what: str, c: dict) -> str:
    return (f"DISAGREES with {what}: kernel {c['kernel']} vs {c['other']}, {c['difference']:+d} datagrams"
            f"{_pct(c['difference_share'])}")


def loss_percents(lo: dict) -> list[str]:
    """A merged loss's places' shares and then the unseen one, as printed percentages adding up to 100."""
    return percents([p["share"] for p in lo["places"]] + [lo["unseen_share"]])


def loss_lines(m: dict | None) -> list[str]:
    """Where the loss went by the kernel's reason (a merged account, `merge`), its shares adding up to 100 %
    as printed, and every disagreement with the lost count or the counters, by how much."""
    lo = (m or {}).get("loss")
    if not lo:
        return []
    guests = sorted({p["host"] for p in lo["places"] if p.get("unit") == "skbs"})
    of = f"of {lo['lost']} lost" if lo.get("lost") is not None else "(no lost count to set them against)"
    head = (f"kernel drops {lo['dropped']} datagrams {of} (skb:kfree_skb, a super-packet by its segments"
            + (f"; in {', '.join(guests)}'s own kernel by its hist triggers, a super-packet as 1 skb" if guests else "")
            + ")")
    out = [head]
    shown = loss_percents(lo)
    for p, pct in zip(lo["places"], shown[:-1], strict=True):
        where = place_name(p)
        out.append(f"  {where} {p['reason']} at {p['location']} {p['datagrams']}"
                   f"{' skbs' if p.get('unit') == 'skbs' else ''} ({pct} %)")
    if lo["unseen"]:
        edges = (f": lost at the window's edges, where the tool's rows put {lo['lost_bounds'][0]}.."
                 f"{lo['lost_bounds'][1]} in it" if lo.get("unseen_at_edges") else "")
        out.append(f"  {UNSEEN} {lo['unseen']} ({shown[-1]} %){edges}")
    for n in lo.get("not_lost") or []:
        out.append(f"  not loss: {n['host']}:{n['device']} {n['reason']} {n['datagrams']}: {n['what']}")
    for key, what in (("vs_lost", "the lost count"), ("vs_counters", "the counters' attribution")):
        c = lo.get(key)
        if c and not c["agree"]:
            out.append("  " + _disagreement(what, c))
    for pair in lo.get("by_reason") or []:
        if not pair["agree"]:
            out.append(f"  {'|'.join(pair['reasons'])} {pair['kernel']} vs the counters' {pair['counter']} "
                       f"{pair['other']}: {pair['difference']:+d} datagrams{_pct(pair['difference_share'])}")
    return out


def place_name(p: dict) -> str:
    """Where a drop was: `server:veth0`, `server (socket)`, or `client (its own kernel)` for a guest's
    (its hist has no device: probes/hist.py)."""
    if p.get("device"):
        return f"{p['host']}:{p['device']}"
    return p["host"] + (" (its own kernel)" if p.get("unit") == "skbs" else " (socket)")


def _types(part: dict) -> str:
    # "?": a guest's queue's super-packets, of a type its tracepoint does not carry (probes/hist.py)
    return "|".join("type unknown" if t == "?" else t for t in sorted(part["by_type"])) or "no"


def hop_line(h: dict) -> str | None:
    """One device's segmentation and merging by the kernel's account; None where it carried only wire-size skbs."""
    where = f"{h['host']}:{h['device']}"
    q, s, r = h["queued"], h["sent"], h["received"]
    if h["software_segmented"]:
        inferred = ", inferred from its driver's" if "?" in q["by_type"] else ""
        return (f"{where} segmented in software: its queue was handed {q['super_packets']} {_types(q)} super-packets "
                f"({q['super_segments']} segments{inferred}), its driver {s['skbs']} skbs of which {s['super_packets']} "
                f"super-packets")
    parts = []
    if s["super_packets"]:
        parts.append(f"driver handed {s['super_packets']} {_types(s)} super-packets ({s['super_segments']} "
                     f"segments, {s['super_segments'] / s['super_packets']:.1f} each)")
    if r["super_packets"]:
        how = (f"GRO built {h['gro_built']} of them from {h['gro_in']} frames" if h["gro_built"]
               else "as they arrived: GRO built none here")
        parts.append(f"passed up {r['super_packets']} {_types(r)} super-packets ({r['super_segments']} segments), {how}")
    elif h["gro_in"]:
        parts.append(f"GRO was handed {h['gro_in']} frames and merged none")
    return f"{where} " + "; ".join(parts) if parts else None


def segmentation_lines(m: dict | None) -> list[str]:
    """Per hop, what the kernel handed each device and passed up from it; USO's verdict; the kernel's verdict
    beside each counters' witness, a disagreement flagged."""
    if not m or not m.get("traced"):
        return []
    out = [line for h in m.get("hops") or [] if (line := hop_line(h))]
    u = m.get("uso")
    if u:
        n = u["samples"]
        verdict = ("USO exercised" if u["exercised"] == n else "USO not exercised" if not u["exercised"]
                   else f"USO exercised in {u['exercised']} of {n} samples")
        line = (f"{verdict} by the kernel's account: the client's drivers were handed {u['super_packets']} UDP_L4 "
                f"super-packets ({u['segments']} segments) among {u['skbs']} skbs")
        if u["segmented_in_software_at"]:
            line += f"; segmented in software at {', '.join(u['segmented_in_software_at'])}"
        if u["disagree"]:
            line += f"; DISAGREES with the counters' witness ({', '.join(u['counters'])})" + (
                f" in {u['disagree']} of {n} samples" if n > 1 else "")
        out.append(line)
    for e in m.get("effects") or []:
        n = e["samples"]
        kernel = "exercised" if e["exercised"] == n else "not exercised" if not e["exercised"] else \
            f"exercised in {e['exercised']} of {n} samples"
        line = f"{e['setting']} at {e['where']}: {kernel} by the kernel's account ({e['detail']})"
        if e["disagree"]:
            line += f"; DISAGREES with the counters' witness ({', '.join(e['counters'])})" + (
                f" in {e['disagree']} of {n} samples" if n > 1 else "")
        elif e["counters"]:
            line += f"; the counters' witness: {', '.join(e['counters'])}"
        out.append(line)
    return out


def unavailable_lines(m: dict | None) -> list[str]:
    if not m or not m.get("unavailable"):
        return []
    untraced = m["samples"] - m["traced"]
    return [f"kernel account not taken in {untraced} of {m['samples']} sample(s): {why}" for why in m["unavailable"]]
