"""engine --send zerocopy or io_uring-zc: the kernel's completions (the error queue's, or io_uring's
notification CQEs) say whether any send went without a copy."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, NOT_APPLICABLE, NOT_EXERCISED, Effect
from offlab.sample import StoredSample


def judge_sample(sample: StoredSample) -> list[Effect]:
    z = sample.traffic.zerocopy
    if z is None:
        return []
    e = Effect(setting="workload send (zerocopy)", where="client (socket)", value="zerocopy", status=NOT_APPLICABLE,
               detail=f"{z.completed} {z.via} completions, {z.copied} of them copied ({z.copied_flag})",
               counters={"completed": z.completed, "copied": z.copied})
    if not z.completed:
        e.cause = "no completion was read"
    elif z.copied < z.completed:
        e.status = EXERCISED
    else:
        e.status = NOT_EXERCISED
        e.cause = "the kernel copied every send (a veth or loopback always does): not a zero-copy figure"
    return [e]
