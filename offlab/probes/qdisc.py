"""Queueing discipline counters of every interface of a host (`tc -s -j qdisc show`).

The root qdisc's drops are where a sender's datagrams die before the wire (a full or
rate-limited queue) and where a router drops what it forwards; /proc/net/dev does not count them.
"""

from __future__ import annotations

import json

from offlab.errors import OfflabError

TC_SHOW = ["tc", "-s", "-j", "qdisc", "show"]
KEEP = ("packets", "bytes", "drops", "overlimits", "requeues")


def parse_tc(text: str) -> dict[str, dict]:
    """`tc -s -j qdisc show` → {dev: {kind, packets, bytes, drops, overlimits, requeues}} of each root qdisc."""
    try:
        rows = json.loads(text or "[]")
    except ValueError:
        return {}
    out = {}
    for q in rows if isinstance(rows, list) else []:
        if isinstance(q, dict) and q.get("root") and q.get("dev") and q.get("dev") != "lo":
            out[q["dev"]] = {"kind": q.get("kind"), **{k: int(q.get(k) or 0) for k in KEEP}}
    return out


def read(host) -> dict[str, dict] | None:
    """The host's root qdisc counters; None where `tc` cannot say (absent in a guest, for instance)."""
    try:
        text = host.qdisc_json(timeout=10)
    except OfflabError:
        return None
    return parse_tc(text) if text is not None else None


def delta(before: dict[str, dict] | None, after: dict[str, dict] | None) -> dict[str, dict]:
    """Per interface after − before of the counters, for interfaces whose qdisc did not change kind."""
    out = {}
    for dev, b in (after or {}).items():
        a = (before or {}).get(dev)
        if a is None or a.get("kind") != b.get("kind"):
            continue
        d = {k: b[k] - a[k] for k in KEEP}
        if any(d.values()):
            out[dev] = {"kind": b["kind"], **d}
    return out
