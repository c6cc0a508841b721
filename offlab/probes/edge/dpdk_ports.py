"""testpmd's port counters over the traffic window, and packets out per packet in (the GRO/GSO proof).

GRO merges: fewer packets leave than arrive (ratio < 1, or below the re-segmentation's own factor);
GSO and TSO split: more leave (ratio > 1). The ratio is taken per forwarding direction, port A's RX
into port B's TX; the data direction is the one that received more bytes (the other carries ACKs,
which outnumber the data packets when the data arrives as TSO super-packets from a guest).
Read at every edge of a lab that runs testpmd, at the edge's instant (a request to the daemon).
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.dpdk import Testpmd
from offlab.probes.base import Options, Probe
from offlab.probes.counters import delta
from offlab.sample import JsonView, _view


def read(testpmd: Testpmd) -> dict[int, dict[str, int]]:
    return testpmd.port_stats()


def result(before: dict[int, dict[str, int]], after: dict[int, dict[str, int]]) -> dict:
    """{"ports": {"0": deltas}, "directions": {"0>1": {rx, tx, out_per_in}}, "out_per_in": data direction's}."""
    ports = {p: delta(before[p], after[p]) for p in sorted(after) if p in before}
    directions = {}
    if len(ports) == 2:
        a, b = sorted(ports)
        for src, dst in ((a, b), (b, a)):
            rx, tx = ports[src].get("rx_packets", 0), ports[dst].get("tx_packets", 0)
            directions[f"{src}>{dst}"] = {"rx_packets": rx, "tx_packets": tx, "rx_bytes": ports[src].get("rx_bytes", 0),
                                          "out_per_in": tx / rx if rx else None}
    data = max(directions.values(), key=lambda d: (d["rx_bytes"], d["rx_packets"]), default=None)
    return {"ports": {str(p): d for p, d in ports.items()}, "directions": directions,
            "data_direction": next((k for k, v in directions.items() if v is data), None),
            "out_per_in": data["out_per_in"] if data else None}


@dataclass
class PortCounters(JsonView):
    """One dpdk-testpmd port's counters over the window."""

    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_errors: int = 0
    tx_errors: int = 0
    rx_missed: int = 0
    fwd_tx_dropped: int = 0

    @property
    def lost(self) -> int:
        """Errors, misses and forwarding drops, both ways."""
        return self.tx_errors + self.rx_errors + self.rx_missed + self.fwd_tx_dropped


@dataclass
class Direction(JsonView):
    """Packets into one testpmd port and out of the other ("0>1")."""

    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0
    out_per_in: float | None = None


@dataclass
class TestpmdCounters(JsonView):
    """dpdk-testpmd's port counters over the window (`probes.of(TestpmdPorts)`)."""

    __test__ = False  # not a pytest class, whatever its name

    ports: dict[str, PortCounters] = _view(PortCounters, map=True, default_factory=dict)
    directions: dict[str, Direction] = _view(Direction, map=True, default_factory=dict)
    data_direction: str = ""
    out_per_in: float | None = None

    @property
    def data(self) -> Direction:
        return self.directions.get(self.data_direction) or Direction()


class TestpmdPorts(Probe):
    """A dpdk lab's testpmd port counters; stored as `result`'s dict, absent where the lab has no testpmd
    or a port could not be read at both edges."""

    __test__ = False  # not a pytest class, whatever its name

    key, slot = "testpmd", 50
    stored = _view(TestpmdCounters)

    def __init__(self, session, options: Options) -> None:
        super().__init__(session, options)
        self.testpmd = Testpmd.for_lab(self.lab.name)

    @classmethod
    def wanted(cls, session, options: Options) -> bool:
        return bool(session.lab.has_testpmd)

    def read(self, started) -> dict[int, dict[str, int]] | None:
        return read(self.testpmd) if self.testpmd is not None else None

    def delta(self, a, b) -> dict | None:
        return result(a, b) if a is not None and b is not None else None
