"""net.core.busy_poll / busy_read: the packets the receiver's sockets took by busy polling a NAPI context
(TcpExt BusyPollRxPackets, counted for every protocol)."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, NOT_APPLICABLE, NOT_EXERCISED, OFF, Effect, parts
from offlab.experiment.effects._paths import roles
from offlab.sample import Held, StoredSample

BUSY_POLL = ("net.core.busy_poll", "net.core.busy_read")


def covers(key: str) -> bool:
    return key in BUSY_POLL


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    receiver = roles(sample.workload)[1]
    polled = sample.probes.counter(receiver, "TcpExt", "BusyPollRxPackets", None)
    e = Effect(setting=key, where=where, value=value, status=NOT_APPLICABLE,
               detail=f"{receiver} TcpExt BusyPollRxPackets {polled}",
               counters={f"{receiver}_BusyPollRxPackets": polled})
    if value.strip() in ("0", ""):
        e.status = OFF
    elif polled is None:
        e.cause = f"no BusyPollRxPackets count for {receiver} (a sample measured before it was kept)"
    elif polled > 0:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = ("no packet was busy-polled: a socket polls only a device with NAPI (a veth only with GRO "
                   "or XDP on; a tap has none) and only while it waits in poll/select/read")
    return e
