"""Queueing discipline counters of every interface of a host (`tc -s -j qdisc show`): a probe.

The root qdisc's drops are where a sender's datagrams die before the wire (a full or
rate-limited queue) and where a router drops what it forwards; /proc/net/dev does not count them.
Read at every edge on every lab host: a namespace's by a `tc` started beside the counter files, a host
with its own kernel's in its one read per edge (remote.py runs its `tc` after the files).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offlab.errors import OfflabError
from offlab.netdev import parse_qdiscs
from offlab.probes.base import Probe
from offlab.probes.remote import Async
from offlab.sample import JsonView, _view

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


@dataclass
class Qdisc(JsonView):
    """One lab interface's root qdisc over the window (`probes.of(QdiscProbe)["host:iface"]`)."""

    kind: str | None = None
    drops: int = 0
    queues: dict[str, int] = field(default_factory=dict)  # a multiqueue root's children: queue → packets sent


class QdiscProbe(Probe):
    """Every lab host's root qdiscs; stored (always, {} when none moved) as {"role:dev": delta}."""

    key, slot = "qdisc", 20
    stored = _view(Qdisc, map=True, default_factory=dict)

    def start(self) -> dict[str, Async]:
        # tc is a command, not a file: one per namespace, all at once, while the files are read
        return {role: Async(read, self.lab.host(role)) for role in self.session.readers}

    def read(self, started: dict[str, Async]) -> dict[str, dict | None]:
        return {role: a.result() for role, a in started.items()}

    def remote(self, reading: dict, role: str, files: dict[str, str], tc_text: str) -> None:
        reading[role] = parse_tc(tc_text) if tc_text.strip() else None

    def delta(self, a: dict, b: dict) -> dict[str, dict]:
        return {f"{role}:{dev}": d for role in b for dev, d in delta(a.get(role), b[role]).items()}
