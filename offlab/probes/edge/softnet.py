"""This machine's /proc/net/softnet_stat per CPU over the window: a probe.

The backlog's drops (`dropped`: a CPU's input queue, netdev_max_backlog, was full), NET_RX runs cut short
(`time_squeeze`), packets steered here by RPS (`received_rps`) and packets processed: deltas over the window.
And how many packets waited in that CPU's input queues at each edge (`backlog_start`, `backlog_end`):
sent, not yet received, when the counters were read — on a loaded machine, whose NET_RX work waits for its
ksoftirqd, hundreds. Read at the edge's instant, after /proc/stat; this machine only (a guest's softirqs
are its own kernel's and not read).
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.netdev import parse_softnet
from offlab.probes import counters
from offlab.probes.base import Probe
from offlab.sample import JsonView, _view

PATH = "/proc/net/softnet_stat"


@dataclass
class Softnet(JsonView):
    """One CPU's /proc/net/softnet_stat deltas (`probes.of(SoftnetStat)["N"]`)."""

    dropped: int = 0
    time_squeeze: int = 0
    received_rps: int | None = None  # None: a sample measured before it was kept
    processed: int | None = None
    backlog_start: int | None = None  # None: a sample measured before it was kept, or a kernel before 5.10
    backlog_end: int | None = None


class SoftnetStat(Probe):
    """Every CPU of this machine, every sample; stored as {CPU: deltas}."""

    key, slot = "softnet", 10
    stored = _view(Softnet, map=True, default_factory=dict)

    def read(self, started) -> dict[int, dict[str, int]]:
        with open(PATH) as f:
            text = f.read()
        return {r.cpu: {"processed": r.processed, "dropped": r.dropped, "time_squeeze": r.time_squeeze,
                        "received_rps": r.received_rps, "backlog": r.backlog} for r in parse_softnet(text)}

    def delta(self, a: dict, b: dict) -> dict:
        return {c: {**counters.delta(_counts(a[c]), _counts(v)),
                    **({"backlog_start": a[c]["backlog"], "backlog_end": v["backlog"]}
                       if a[c].get("backlog") is not None and v.get("backlog") is not None else {})}
                for c, v in b.items() if c in a}


def _counts(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "backlog"}


def in_flight(soft: dict) -> int | None:
    """Packets that waited in this machine's input backlogs at the window's edge that held more (the
    stored {CPU: Softnet}); None when not read."""
    ends = [[getattr(s, k) for s in soft.values()] for k in ("backlog_start", "backlog_end")]
    if not soft or any(v is None for e in ends for v in e):
        return None
    return max(sum(e) for e in ends)
