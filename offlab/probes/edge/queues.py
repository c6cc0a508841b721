"""Packets per queue of a host's uplinks (`ethtool -S`): which queues did a sample's work.

Read at the window's edges only for a sample that sets something about queues (`channels.*`, `xps`,
`xps.N`): one `ethtool -S` per uplink is a command per host at each edge, which the other samples do
not pay. What each device counts per queue differs:

- a veth counts only what it receives through NAPI (`rx_queue_N_xdp_packets`: GRO on with the
  sending peer's TSO off, or an XDP program); its `tx_queue_N_xdp_xmit` counts XDP only (not read);
- virtio-net counts every queue both ways (`rx_queue_N_packets`, `tx_queue_N_packets`), as do most
  NIC drivers under the same or a close name (`rx-N.packets`, `rxN_packets`);
- a tap and a bridge count none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offlab.errors import OfflabError
from offlab.netdev import QueueStats, parse_queue_stats
from offlab.probes.base import Options, Probe
from offlab.probes.remote import Async
from offlab.sample import JsonView, _view

# A host's interfaces, one `ethtool -S` each, in one command; a name is passed as an argument, never parsed.
SCRIPT = 'for i; do echo "== $i"; ethtool -S "$i" 2>/dev/null; done'


def parse_script(text: str) -> dict[str, QueueStats]:
    """SCRIPT's output → {iface: netdev.parse_queue_stats(its part)}, for interfaces with a queue counter."""
    out: dict[str, QueueStats] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines() + ["== "]:
        if line.startswith("== "):
            if name:
                stats = parse_queue_stats("\n".join(lines))
                if stats.rx or stats.tx:
                    out[name] = stats
            name, lines = line[3:].strip(), []
        else:
            lines.append(line)
    return out


def read(host, ifaces: list[str]) -> dict[str, QueueStats] | None:
    """The per-queue packets of `ifaces` on `host`; None where they cannot be read (no ethtool, a host gone)."""
    if not ifaces:
        return {}
    try:
        res = host.run(["sh", "-c", SCRIPT, "sh", *ifaces], check=False, timeout=15)
    except OfflabError:
        return None
    return parse_script(res.stdout) if res.ok else None


def delta(before: dict[str, QueueStats] | None,
          after: dict[str, QueueStats] | None) -> dict[str, dict[str, dict[str, int]]]:
    """iface → way → queue → packets over the window, for queues counted at both edges: the stored JSON."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for iface, stats in (after or {}).items():
        was = (before or {}).get(iface)
        for way, queues in stats.as_json().items():
            old = was.way(way) if was else {}
            d = {q: n - old[q] for q, n in queues.items() if q in old}
            if d:
                out.setdefault(iface, {})[way] = d
    return out


@dataclass
class QueueCounts(JsonView):
    """One interface's packets per queue over the window (`probes.of(Queues)["host:iface"]`)."""

    rx: dict[str, int] = field(default_factory=dict)
    tx: dict[str, int] = field(default_factory=dict)

    def way(self, way: str) -> dict[str, int]:
        return (self.rx if way == "rx" else self.tx) or {}


class Queues(Probe):
    """The asked interfaces' per-queue packets (`Options.queue_ifaces`); stored as {"role:iface": {way:
    {queue: packets}}}, absent (None: not read) where no setting asked."""

    key, slot = "queues", 40
    stored = _view(QueueCounts, map=True)

    @classmethod
    def wanted(cls, session, options: Options) -> bool:
        return bool(options.queue_ifaces)

    def start(self) -> dict[str, Async]:
        return {role: Async(read, self.lab.host(role), ifaces) for role, ifaces in self.options.queue_ifaces.items()}

    def read(self, started: dict[str, Async]) -> dict[str, dict[str, QueueStats] | None]:
        return {role: a.result() for role, a in started.items()}

    def delta(self, a: dict, b: dict) -> dict:
        return {f"{role}:{iface}": d for role in self.options.queue_ifaces
                for iface, d in delta(a.get(role), b.get(role)).items()}
