"""xps.N (a CPU mask on transmit queue N): the sender's packets went out on queue N, seen by that queue's
counters (or the next hop's receive queue N). `xps` sets one mask on every queue, which leaves the choice
among them to the flow hash, as without XPS: not applicable."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, MIN_PACKETS, NOT_EXERCISED, OFF, Effect, parts
from offlab.experiment.effects._paths import masked, queue_counts, roles, spread
from offlab.experiment.effects.channels import BUSY_QUEUE_SHARE, VETH_QUEUES
from offlab.probes.edge.queues import Queues
from offlab.sample import Held, StoredSample

NEEDS_QUEUES = True  # the probes read per-queue packets for this witness


def covers(key: str) -> bool:
    return key == "xps" or key.startswith("xps.")


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    probes, workload = sample.probes, sample.workload
    e, cpus = masked(key, value, where)
    if cpus is None:
        return e
    if not cpus:
        e.status, e.detail = OFF, "mask 0"
        return e
    if key == "xps":
        e.cause = "one mask on every queue leaves the choice among them to the flow hash, as without XPS"
        return e
    if probes.of(Queues) is None:
        e.cause = "this sample did not read per-queue counters (measured before they were kept)"
        return e
    queue = key.split(".", 1)[1]
    seen, counts = queue_counts(where, "tx", probes, sample.topology)
    total = sum(counts.values())
    e.counters = {"queues": counts, "counted_at": seen, "cpus": sorted(cpus)}
    if seen is None or total < MIN_PACKETS:
        e.detail = f"{where} tx: no per-queue packet counts"
        e.cause = VETH_QUEUES if seen is None else f"fewer than {MIN_PACKETS} packets counted per queue"
        return e
    mine = counts.get(queue, 0)
    e.detail = f"{seen}: {spread(counts)}; queue {queue} carried {mine} of {total}"
    sender = roles(workload)[0]
    # offlab pins the sender only on a host that shares this machine's kernel (a guest's is not pinned)
    cpu = None if sender in probes.own_kernel() else (workload.server_cpu if sender == "server" else workload.client_cpu)
    if mine >= BUSY_QUEUE_SHARE * total:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = (f"the {sender} sent from CPU {cpu}, which the mask does not name: XPS picks the queue by the "
                   f"sending CPU" if cpu is not None and where.startswith(f"{sender}:") and cpu not in cpus else
                   f"no packet left on queue {queue}: the sending CPU is in another queue's mask, or the "
                   f"packets were sent from softirq on another CPU")
    return e
