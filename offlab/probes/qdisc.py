"""Queueing discipline counters of every interface of a host (`tc -s -j qdisc show`).

The root qdisc's drops are where a sender's datagrams die before the wire (a full or
rate-limited queue) and where a router drops what it forwards; /proc/net/dev does not count them.
"""

from __future__ import annotations

from offlab.errors import OfflabError
from offlab.hosts.base import TC_QDISC_SHOW as TC_SHOW  # noqa: F401 (the argv probes/remote.py batches)
from offlab.netdev import parse_qdiscs

KEEP = ("packets", "bytes", "drops", "overlimits", "requeues")


def parse_tc(text: str) -> dict[str, dict]:
    """`tc -s -j qdisc show` → {dev: {kind, packets, bytes, drops, overlimits, requeues}} of each root qdisc;
    a multiqueue device's `mq` root adds `queues`: {tx queue: packets} from its children (parent `:N` is
    transmit queue N − 1), the packets each queue sent."""
    out: dict[str, dict] = {}
    children: dict[str, dict[str, int]] = {}
    for q in parse_qdiscs(text):
        if not q.dev or q.dev == "lo":
            continue
        if q.root:
            out[q.dev] = {"kind": q.kind, **{k: getattr(q, k) for k in KEEP}}
        elif q.tx_queue is not None:
            children.setdefault(q.dev, {})[str(q.tx_queue)] = q.packets
    for dev, queues in children.items():
        if dev in out and out[dev]["kind"] == "mq":
            out[dev]["queues"] = queues
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
        d: dict = {k: b[k] - a[k] for k in KEEP}
        if any(d.values()):
            out[dev] = {"kind": b["kind"], **d}
            queues = {q: n - a["queues"][q] for q, n in (b.get("queues") or {}).items() if q in (a.get("queues") or {})}
            if queues:
                out[dev]["queues"] = queues
    return out
