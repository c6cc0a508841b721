"""Per-interval series in one shape for every tool: rows over time, `t_s` counted from the start of the
measured window (negative = warm-up), so offlab-engine tx/rx/rr and iperf3 read alike.

A series is a dict: `source` (which tool and side counted it), `interval_s` (asked for; iperf3's
own interval lengths are in each row's `dur_s`), `columns` (names from COLUMNS) and `rows` (one list
per interval, in that order), `intervals_dropped` (rows the engine did not keep for its bound), and for
the engine `t0_mono_s` (the instant of `t_s` = 0 on the counting host's CLOCK_MONOTONIC).
"""

from __future__ import annotations

import math

# Every column a series may have; a series carries those its tool measures.
COLUMNS = ("t_s", "dur_s", "warmup", "bytes", "bps", "datagrams", "pps", "lost", "reordered", "retransmits",
           "transactions", "tps", "rtt_p50_us", "rtt_p99_us", "rtt_max_us")
DEFAULT_INTERVAL_MS = 100
# Rows a measurement keeps at most: a run longer than this many default intervals gets longer ones.
MAX_ROWS = 6000
SPARK = "▁▂▃▄▅▆▇█"


def interval_ms(seconds: float) -> int:
    """The interval for a run of `seconds`: 100 ms, longer when that would give over MAX_ROWS rows."""
    return max(DEFAULT_INTERVAL_MS, math.ceil(seconds * 1000 / MAX_ROWS))


def from_engine(doc: dict, source: str, warmup_s: float = 0.0) -> dict | None:
    """An engine report's `series` (tx, rx or rr) → the common shape; None without one.

    tx/rx count from their own start (tx: first send, rx: first arrival) and know nothing of a warm-up:
    the driver ran them `warmup_s` longer, so their rows move back by it. rr's rows already count from
    the window and mark the warm-up.
    """
    s = doc.get("series")
    if not s or not s.get("columns"):
        return None
    cols = list(s["columns"])
    idx = {c: i for i, c in enumerate(cols)}
    keep = [c for c in cols if c in COLUMNS]
    shift = warmup_s if s.get("t_from") != "window_start" else 0.0
    rows = []
    for r in s["rows"]:
        out = [r[idx[c]] for c in keep]
        if shift:
            out[0] = round(out[0] - shift, 9)
        rows.append(out)
    if "warmup" not in idx:
        keep.insert(2, "warmup")
        # A row that starts before the window is warm-up (it may straddle the window's start).
        rows = [row[:2] + [row[0] < -1e-9] + row[2:] for row in rows]
    out = {"source": source, "interval_s": s.get("interval_s"), "columns": keep, "rows": rows,
           "intervals_dropped": s.get("intervals_dropped", 0)}
    if s.get("t0_mono_ns") is not None:
        # t_s = 0 on the counting host's CLOCK_MONOTONIC: what lines the rows up with the probes' window.
        out["t0_mono_s"] = round(s["t0_mono_ns"] / 1e9 + shift, 9)
    return out


def from_iperf3(doc: dict, interval_s: float) -> dict | None:
    """iperf3 -J `intervals` (their `sum`) → the common shape. The client reports the sender's side
    (the receiver's with -R); omitted (-O) intervals are the warm-up, before the window's start."""
    intervals = doc.get("intervals") or []
    if not intervals:
        return None
    omitted = [iv["sum"] for iv in intervals if iv.get("sum", {}).get("omitted")]
    omit_end = max((float(s.get("end", 0.0)) for s in omitted), default=0.0)
    udp = (doc.get("start", {}).get("test_start", {}).get("protocol") or "").upper() == "UDP"
    cols = ["t_s", "dur_s", "warmup", "bytes", "bps"] + (["datagrams", "pps", "lost"] if udp else ["retransmits"])
    rows = []
    side = "sender"
    for iv in intervals:
        s = iv.get("sum") or {}
        side = "sender" if s.get("sender", True) else "receiver"
        warm = bool(s.get("omitted"))
        t = float(s.get("start", 0.0)) - (omit_end if warm else 0.0)
        dur = float(s.get("seconds", 0.0))
        row = [round(t, 6), round(dur, 6), warm, int(s.get("bytes", 0)), float(s.get("bits_per_second", 0.0))]
        if udp:
            packets = s.get("packets")
            row += [packets, packets / dur if packets is not None and dur > 0 else None, s.get("lost_packets")]
        else:
            row.append(s.get("retransmits"))
        rows.append(row)
    return {"source": f"iperf3 {side}", "interval_s": interval_s, "columns": cols, "rows": rows,
            "intervals_dropped": 0}


def as_dicts(series: dict) -> list[dict]:
    """The rows as {column: value} dicts."""
    cols = series["columns"]
    return [dict(zip(cols, r, strict=False)) for r in series["rows"]]


RATES = ("bps", "pps", "tps")


def short(series: dict, row: dict) -> bool:
    """A row under half an interval long (the clipped first or last): its rates are noise."""
    iv = series.get("interval_s")
    return bool(iv) and row.get("dur_s") is not None and row["dur_s"] < iv / 2


def column(series: dict, name: str, *, window_only: bool = True) -> list[tuple[float, float | None]]:
    """(t_s, value) of one column; warm-up rows left out unless `window_only` is False, and for a
    rate, the rows under half an interval long (a few datagrams over a sliver of time)."""
    return [(d["t_s"], d.get(name)) for d in as_dicts(series)
            if name in d and not (window_only and d.get("warmup")) and not (name in RATES and short(series, d))]


def sparkline(values: list[float | None], width: int = 40) -> str:
    """Eight-level bars, one per interval (or per group of intervals beyond `width`); ' ' for no value."""
    if len(values) > width:
        step = len(values) / width
        groups = [values[int(i * step):int((i + 1) * step)] for i in range(width)]
        values = [(sum(g2) / len(g2)) if (g2 := [v for v in g if v is not None]) else None for g in groups]
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = hi - lo
    return "".join(" " if v is None else SPARK[0 if span == 0 else min(7, int((v - lo) / span * 8))]
                   for v in values)


def summary(series: dict, name: str, fmt) -> str:
    """One line: the column over the window as a sparkline, with min and max per interval."""
    vals = [v for _, v in column(series, name)]
    known = [v for v in vals if v is not None]
    if not known:
        return f"{series['source']}: no {name} per interval"
    dur = series.get("interval_s")
    every = f"per {dur * 1000:g} ms" if dur else "per interval"
    return (f"{sparkline(vals)}  {every}, {len(vals)} intervals of the window: min {fmt(min(known))}, max {fmt(max(known))} "
            f"({series['source']})")
