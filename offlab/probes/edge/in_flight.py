"""What was sent and not yet received at each edge of the window, on this machine: a probe.

A lost count made of the client's and the server's counters (OutDatagrams − InDatagrams) takes for lost
whatever was still on its way when they were read, and for received what was on its way at the start.
Two places on this machine hold such datagrams:

- the per-CPU input backlogs: a veth (or a tap, a bridge port) queues what it hands up on the sending
  CPU's backlog, taken off by NET_RX — within the sending call on a quiet machine, but on a loaded one
  that work waits for the CPU's ksoftirqd. /proc/net/softnet_stat's backlog column (since 5.10), in
  packets; every namespace's traffic shares them.
- the receiving sockets: UDP counts a datagram in InDatagrams when the application reads it
  (udp_recvmsg), not when it is queued, so a receiver that is behind holds datagrams already past every
  place they could be dropped. /proc/net/udp and udp6's rx_queue in each host's namespace, in bytes of
  the datagrams' truesize (2304 for a 1200-byte datagram on a veth here): datagrams ≤ bytes / payload.

Both are read in `start()`, right before the counter files (not at the edge's instant, after /proc/stat,
ms later on a loaded machine). Stored as {"backlog:cpuN" | "rcvq:ROLE": {start, end}}; hosts in this
machine's namespaces only (a guest's or an SSH host's kernel is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.netdev import parse_softnet
from offlab.probes.base import Probe
from offlab.probes.edge.softnet import PATH
from offlab.sample import JsonView, _view


def receive_queue_bytes(text: str) -> int:
    """/proc/net/udp or udp6: the bytes waiting in every socket's receive queue (tx_queue:rx_queue, hex)."""
    total = 0
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 4 and ":" in cols[4]:
            total += int(cols[4].split(":")[1], 16)
    return total


@dataclass
class Edges(JsonView):
    """One place's gauge at the window's edges (`probes.of(InFlightProbe)["backlog:cpu1"]`)."""

    start: int = 0
    end: int = 0


class InFlightProbe(Probe):
    """This machine's backlogs and the receive queues of the lab's hosts in its namespaces, every sample."""

    key, slot = "in_flight", 80
    stored = _view(Edges, map=True, default_factory=dict)

    def start(self) -> dict[str, int | None]:
        with open(PATH) as f:
            out: dict[str, int | None] = {f"backlog:cpu{r.cpu}": r.backlog for r in parse_softnet(f.read())}
        for role, reader in self.session.readers.items():
            try:
                out[f"rcvq:{role}"] = sum(receive_queue_bytes(reader.read(name)) for name in ("udp", "udp6"))
            except OSError:
                out[f"rcvq:{role}"] = None
        return out

    def read(self, started: dict[str, int | None]) -> dict[str, int | None]:
        return started

    def delta(self, a: dict, b: dict) -> dict | None:
        out = {k: {"start": a[k], "end": v} for k, v in b.items() if a.get(k) is not None and v is not None}
        return out or None


def in_flight(gauges: dict[str, Edges], receiver: str, payload: int) -> int | None:
    """Datagrams at most on their way to `receiver` at the edge that held more: every CPU's backlog
    (packets: other traffic shares them) and its receive queues' bytes / `payload` (each datagram's
    truesize is more than its payload or its frame); None when not read."""
    if not gauges:
        return None
    queued = gauges.get(f"rcvq:{receiver}") if payload > 0 else None  # no payload size: not counted
    backlogs = [g for k, g in gauges.items() if k.startswith("backlog:")]
    return max(sum(g.start for g in backlogs) + (queued.start // payload if queued else 0),
               sum(g.end for g in backlogs) + (queued.end // payload if queued else 0))
