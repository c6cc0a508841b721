"""What several witnesses ask of a sample: which side sent the data, the next hop of an interface, the
per-queue packets that show an interface's queues."""

from __future__ import annotations

from offlab.experiment.effects import NOT_APPLICABLE, Effect
from offlab.experiment.plan import topology as static
from offlab.probes.edge.qdisc import QdiscProbe
from offlab.probes.edge.queues import Queues
from offlab.sample import Probes, SampleWorkload


def roles(workload: SampleWorkload) -> tuple[str, str]:
    """(sender, receiver) of the data."""
    return ("server", "client") if workload.reverse else ("client", "server")


def next_hop(probes: Probes, where: str, topology: str | None) -> str | None:
    """The interface of the next host on the path (the topology's neighbour of `where`'s host) that
    received most nearly the bytes `where` sent: within 10 %, else none."""
    role, sent = where.partition(":")[0], probes.iface(where).tx_bytes
    peers = {i.peer for i in static.HOSTS.get(topology or "", {}).get(role, ()) if i.peer}
    near = [(abs(v.rx_bytes - sent), n) for n, v in probes.interfaces.items()
            if n.partition(":")[0] != role and (not peers or n.partition(":")[0] in peers)
            and sent and abs(v.rx_bytes - sent) <= 0.1 * sent]
    return min(near)[1] if near else None


def queue_counts(where: str, way: str, probes: Probes, topology: str | None) -> tuple[str | None, dict[str, int]]:
    """The per-queue packets that show `where`'s queues in direction `way` (tx: queues it sent on): its own
    counters, else, for tx, the receive queues of the next hop (a veth hands a packet sent on its queue N
    to its peer's receive queue N)."""
    queues = probes.of(Queues) or {}
    own = queues[where].way(way) if where in queues else {}
    if sum(own.values()):
        return where, own
    if way != "tx":
        return None, own
    qdiscs = probes.of(QdiscProbe)
    sent = qdiscs[where].queues if where in qdiscs else {}
    if sum(sent.values()):  # a multiqueue device's mq children: what each queue sent
        return f"{where} qdisc", sent
    hop = next_hop(probes, where, topology)
    theirs = queues[hop].rx if hop and hop in queues else {}
    return (f"{hop} rx", theirs) if sum(theirs.values()) else (None, own)


def data_way(where: str, probes: Probes) -> str:
    d = probes.iface(where)
    return "tx" if d.tx_bytes >= d.rx_bytes else "rx"


def spread(counts: dict[str, int]) -> str:
    return ", ".join(f"queue {q}: {n}" for q, n in sorted(counts.items(), key=lambda x: int(x[0])))


def cpus(mask: str) -> set[int]:
    bits = int(str(mask).replace(",", ""), 16)
    return {i for i in range(bits.bit_length()) if bits >> i & 1}


def masked(key: str, value: str, where: str) -> tuple[Effect, set[int] | None]:
    """A CPU-mask setting's witness to fill in, and its CPUs (None, said in the witness, if not a mask)."""
    e = Effect(setting=key, where=where, value=str(value), status=NOT_APPLICABLE)
    try:
        return e, cpus(value)
    except ValueError:
        e.cause = f"{value!r} is not a CPU mask"
        return e, None
