"""gro_flush_timeout / napi_defer_hard_irqs: not judged. They lower a device's interrupts per packet; a
veth or tap raises none (its NAPI is scheduled by the sender) and a guest's or NIC's interrupt counts are
not read, so the sample records the setting and says why it cannot show it."""

from __future__ import annotations

from offlab.experiment.effects import NOT_APPLICABLE, OFF, Effect, parts
from offlab.sample import Held, StoredSample

NAPI_DEFERRAL = ("gro_flush_timeout", "napi_defer_hard_irqs")


def covers(key: str) -> bool:
    return key in NAPI_DEFERRAL


def judge(setting: Held, sample: StoredSample) -> Effect:
    key, value, where = parts(setting)
    role = where.partition(":")[0]
    e = Effect(setting=key, where=where, value=value, status=NOT_APPLICABLE)
    if value.strip() in ("0", ""):
        e.status = OFF
    elif role in sample.probes.own_kernel():
        e.cause = "the device's interrupt counts in a host with its own kernel are not read: not witnessed"
    else:
        e.cause = ("a veth's or tap's NAPI is scheduled by its sender, not by an interrupt: there is no "
                   "interrupt count for deferral to lower, and its timer's interrupts are not told apart "
                   "from the others'")
    return e
