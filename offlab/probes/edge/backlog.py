"""Packets waiting in this machine's per-CPU input backlogs at each edge of the window: a probe.

A packet a veth (or a tap, a bridge port) hands up is queued on the sending CPU's backlog and taken off
it by NET_RX: within the sending call on a quiet machine, but on a loaded one that work waits for the
CPU's ksoftirqd and hundreds of packets can wait. At an edge they were sent and not yet received, so a
lost count made of the client's and the server's counters is off by up to that many (`in_flight`, in
loss attribution's `lost_in_flight`). A gauge, not a counter: /proc/net/softnet_stat's backlog column
(since 5.10) read at both edges, stored as {CPU: {start, end}}; this machine only.
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.netdev import parse_softnet
from offlab.probes.base import Probe
from offlab.sample import JsonView, _view

PATH = "/proc/net/softnet_stat"


@dataclass
class Backlog(JsonView):
    """One CPU's input backlog at the window's edges (`probes.of(BacklogProbe)["N"]`), in packets."""

    start: int = 0
    end: int = 0


class BacklogProbe(Probe):
    """Every CPU of this machine, every sample; left out where the kernel does not show the backlog."""

    key, slot = "backlog", 80
    stored = _view(Backlog, map=True, default_factory=dict)

    def read(self, started) -> dict[int, int | None]:
        with open(PATH) as f:
            return {r.cpu: r.backlog for r in parse_softnet(f.read())}

    def delta(self, a: dict, b: dict) -> dict | None:
        if any(v is None for v in (*a.values(), *b.values())):
            return None
        return {c: {"start": a[c], "end": v} for c, v in b.items() if c in a}


def in_flight(backlog: dict[int, Backlog]) -> int | None:
    """Packets waiting in every CPU's backlog at the edge that held more; None when not read."""
    if not backlog:
        return None
    return max(sum(b.start for b in backlog.values()), sum(b.end for b in backlog.values()))
