"""This machine's /proc/net/softnet_stat per CPU over the window: a probe.

The backlog's drops (`dropped`: a CPU's input queue, netdev_max_backlog, was full), NET_RX runs cut short
(`time_squeeze`), packets steered here by RPS (`received_rps`) and packets processed. Read at the edge's
instant, after /proc/stat; this machine only (a guest's softirqs are its own kernel's and not read).
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


class SoftnetStat(Probe):
    """Every CPU of this machine, every sample; stored as {CPU: deltas}."""

    key, slot = "softnet", 10
    stored = _view(Softnet, map=True, default_factory=dict)

    def read(self, started) -> dict[int, dict[str, int]]:
        with open(PATH) as f:
            text = f.read()
        return {r.cpu: {"processed": r.processed, "dropped": r.dropped, "time_squeeze": r.time_squeeze,
                        "received_rps": r.received_rps} for r in parse_softnet(text)}

    def delta(self, a: dict, b: dict) -> dict:
        return {c: counters.delta(a[c], v) for c, v in b.items() if c in a}
