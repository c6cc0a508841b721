"""channels.rx/tx/combined N > 1: the data went through more than one queue of the interface (its own
per-queue counters, or for a veth's transmit queues its peer's receive queues)."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, MIN_PACKETS, NOT_APPLICABLE, NOT_EXERCISED, OFF, Effect, parts
from offlab.experiment.effects._paths import data_way, queue_counts, spread
from offlab.probes.edge.queues import Queues
from offlab.sample import Held, StoredSample

QUEUE_KEYS = ("channels.rx", "channels.tx", "channels.combined")
NEEDS_QUEUES = True  # the probes read per-queue packets for this witness
# a queue "did work" when it carried at least this share of the interface's packets in that direction
BUSY_QUEUE_SHARE = 0.01
VETH_QUEUES = ("no per-queue count moved here or on the next hop: a veth counts per queue only what it receives "
               "through NAPI (GRO on at the receiving end with the sender's TSO off, or XDP), virtio-net's receive "
               "queues count only XDP, and a tap or bridge counts none; a multiqueue device's transmit queues are "
               "counted by its mq qdisc's children")


def covers(key: str) -> bool:
    return key in QUEUE_KEYS


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    probes = sample.probes
    e = Effect(setting=key, where=where, value=value, status=NOT_APPLICABLE)
    try:
        n = int(value)
    except ValueError:
        e.cause = f"{value!r} is not a queue count"
        return e
    if probes.of(Queues) is None:
        e.cause = "this sample did not read per-queue counters (measured before they were kept)"
        return e
    data = data_way(where, probes)
    way = key.split(".")[1] if key in ("channels.rx", "channels.tx") else data
    seen, counts = queue_counts(where, way, probes, sample.topology)
    total = sum(counts.values())
    e.counters = {"queues": counts, "counted_at": seen}
    if n <= 1:
        e.status, e.detail = OFF, f"{n} queue(s)"
        return e
    if way != data:
        e.detail = (f"{where}: the data {'left' if data == 'tx' else 'arrived'} through it; its {way} queues "
                    f"carried only the other direction's packets (acknowledgements)")
        e.cause = f"the data did not go through {where}'s {way} queues"
        return e
    if seen is None or total < MIN_PACKETS:
        e.detail = f"{where} {way}: no per-queue packet counts"
        e.cause = VETH_QUEUES if seen is None else f"fewer than {MIN_PACKETS} packets counted per queue"
        return e
    busy = [q for q, c in counts.items() if c >= BUSY_QUEUE_SHARE * total]
    e.detail = f"{seen}: {spread(counts)} ({len(busy)} of {len(counts)} queues carried the data)"
    streams = int(sample.workload.streams or 1)
    if len(busy) > 1:
        e.status = EXERCISED
    elif len(counts) < n:
        e.status = NOT_EXERCISED
        e.cause = (f"{seen.split()[0]} has {len(counts)} {'receive ' if seen != where else ''}queue(s), fewer than "
                   f"the {n} set: a veth hands what its transmit queue N sends to its peer's receive queue N only "
                   f"where the peer has one")
    elif streams <= 1:
        e.cause = "one flow goes through one queue: more queues show only with parallel streams"
    else:
        e.status = NOT_EXERCISED
        e.cause = (f"all {streams} streams went through queue {busy[0] if busy else '?'}: the flow hash put them "
                   f"on one queue, or an XPS mask maps the sending CPU to it")
    return e
