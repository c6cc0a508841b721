"""RPS on a receive queue: the packets the mask's CPUs were sent to process by inter-processor interrupt
(softnet `received_rps`) and what each CPU's backlog processed. A mask of only the CPU where the packets
arrive steers without an interrupt: not applicable."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, NOT_EXERCISED, OFF, Effect, parts
from offlab.experiment.effects._paths import masked
from offlab.probes.edge.softnet import SoftnetStat
from offlab.sample import Held, StoredSample


def covers(key: str) -> bool:
    return key == "rps" or key.startswith("rps.")


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    e, cpus = masked(key, value, where)
    if cpus is None:
        return e
    soft = {int(c): d for c, d in sample.probes.of(SoftnetStat).items()}
    steered = sum((soft[c].received_rps or 0) if c in soft else 0 for c in cpus)
    e.counters = {"cpus": sorted(cpus), "received_rps": {str(c): d.received_rps for c, d in soft.items()},
                  "processed": {str(c): d.processed for c, d in soft.items()}}
    e.detail = (f"softnet received_rps on CPU {', '.join(map(str, sorted(cpus)))}: {steered}; processed per CPU "
                + ", ".join(f"{c}: {d.processed}" for c, d in sorted(soft.items())))
    if not cpus:
        e.status = OFF
        return e
    if all(d.received_rps is None for d in soft.values()):
        e.cause = "this sample has no softnet received_rps counts (measured before they were kept)"
        return e
    w = sample.workload
    arrive = w.server_cpu if w.reverse else w.client_cpu
    if steered > 0:
        e.status = EXERCISED
    elif arrive is not None and cpus == {arrive}:
        e.cause = (f"the mask is CPU {arrive}, where a veth's packets arrive (the sender's CPU): steering "
                   f"there needs no interrupt, so no counter shows it")
    else:
        e.status = NOT_EXERCISED
        e.cause = ("no packet was steered to the mask's CPUs: the traffic did not arrive on this receive "
                   "queue, or RFS/another mask decided first")
    return e
