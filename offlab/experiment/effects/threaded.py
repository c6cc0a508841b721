"""threaded NAPI: the interface's NAPI kernel thread (napi/IF-ID) used CPU in the window."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, NOT_APPLICABLE, NOT_EXERCISED, OFF, Effect, on, parts
from offlab.sample import Held, StoredSample


def covers(key: str) -> bool:
    return key == "threaded"


def judge(setting: Held, sample: StoredSample) -> Effect:
    _, value, where = parts(setting)
    probes = sample.probes
    role, _, iface = where.partition(":")
    prefix = f"napi/{iface}-"[:15]  # a thread's comm is cut at 15 characters
    threads = [p for p in probes.processes if str(p.comm).startswith(prefix)]
    busy = round(sum(p.cpu_pct or 0 for p in threads), 2)
    e = Effect(setting="threaded", where=where, value=value, status=NOT_APPLICABLE,
               detail=f"{len(threads)} napi/{iface} thread(s) used {busy} % of a CPU",
               counters={"napi_threads_cpu_pct": busy})
    if not on(value):
        e.status = OFF
    elif role in probes.own_kernel():
        e.cause = f"{role} has a kernel of its own, whose threads the probes do not read"
    elif busy > 0:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = (f"no NAPI thread of {iface} ran: its packets were not received through NAPI (a veth has NAPI "
                   f"only with GRO on and the sending peer's TSO off, or XDP)")
    return e
