"""A gso/gro max size above 64 KiB (BIG TCP): the packets over 64 KiB the interface sent (gso) or received
after GRO (gro), counted by the sample's nftables length match (workload big_packets)."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, NOT_APPLICABLE, NOT_EXERCISED, OFF, Effect, parts
from offlab.probes.edge.bigpackets import BigPackets
from offlab.sample import Held, StoredSample

BIG_SIZES = {"gso_max_size": "tx", "gso_ipv4_max_size": "tx", "gro_max_size": "rx", "gro_ipv4_max_size": "rx"}
LEGACY_MAX = 65536


def covers(key: str) -> bool:
    return key in BIG_SIZES


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    way = BIG_SIZES[key]
    counts = sample.probes.of(BigPackets)
    n = None if counts is None else (getattr(counts[where], way) if where in counts else 0)
    e = Effect(setting=key, where=where, value=value, status=NOT_APPLICABLE,
               detail=f"{where} {way} packets > 64 KiB: {n}", counters={f"{way}_over_64k": n})
    if int(value) <= LEGACY_MAX:
        e.status = OFF
    elif n is None:
        e.cause = "the sample did not count packets over 64 KiB (workload big_packets: true counts them)"
    elif n > 0:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = ("no packet over 64 KiB: the sender's own size, a hop's tso_max_size (a tap's is 65536) or "
                   "an IPv6 router answering Packet Too Big keeps them at 64 KiB")
    return e
