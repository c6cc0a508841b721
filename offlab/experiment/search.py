"""Zero-loss search (seed 002, RFC 2544's throughput test): the highest offered rate at which
loss stays at or under a threshold, searched on the rate the generator *achieved*.

Each trial is one full measurement. A trial passes only when its loss was measured and is
≤ the threshold (loss unknown = fail). A trial whose generator sent less than its target
(by more than `GENERATOR_SHORTFALL`) is "generator-limited": its achieved rate is what counts,
and a limited trial that passed means the device under test was not the bottleneck — the
result then says "no loss up to the generator's ceiling", never a rate that was not sent.
The search bisects (geometrically) between the highest achieved rate that passed and the
lowest that failed, then repeats the best rate `confirm` times; the reported rate is one at
which every confirmation met the criterion. Every trial is kept in the trace.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from offlab.errors import BadInput
from offlab.sample import KernelAccount, KernelLoss, SearchTrial, StoredSample, TrialKernelLoss, ZeroLossSearch
from offlab.traffic.rate import parse_pps

__all__ = ["parse_pps", "zero_loss_search"]

GENERATOR_SHORTFALL = 0.02  # a trial that sent < 98 % of its target is generator-limited
RESOLUTION = 0.02  # stop bisecting when the failing rate is within 2 % of the passing one


def _trial(sample: StoredSample, phase: str, target: float, max_loss: float) -> SearchTrial:
    t = sample.traffic
    achieved = t.sent_pps  # without the sender's own rate there is no achieved rate to claim
    loss = t.loss
    limited = achieved is not None and achieved < target * (1 - GENERATOR_SHORTFALL)
    # every key stored, null too, in this order (what a search has always stored)
    return SearchTrial.keyed(phase=phase, target_pps=int(target), achieved_pps=achieved, received_pps=t.pps,
                             sent=t.datagrams_sent, received=t.datagrams_received, loss=loss,
                             passed=loss is not None and loss <= max_loss and achieved is not None,
                             generator_limited=limited, kernel_loss=kernel_loss(sample.kernel_account))


def kernel_loss(ka: KernelAccount | None) -> TrialKernelLoss | None:
    """A trial's kernel account in brief: its lost datagrams by place and reason, and what no tracepoint saw."""
    if ka is None:
        return None
    if ka.unavailable is not None:
        return TrialKernelLoss.keyed(unavailable=ka.unavailable)
    lo = ka.loss if ka.loss is not None else KernelLoss()
    places: dict[str, int] = {}
    for p in lo.places:
        key = (f"{p.host}:{p.device}" if p.device else str(p.host)) + f" {p.reason}"
        places[key] = places.get(key, 0) + int(p.datagrams)
    return TrialKernelLoss.keyed(lost=lo.lost or 0, places=places, unseen=int(lo.unseen or 0))


def zero_loss_search(lab, w, max_loss: float, low: float, high: float, steps: int, capture=None, *,
                     confirm: int = 1, trial: Callable[..., StoredSample] | None = None,
                     trace: bool = False) -> StoredSample:
    """Search; return the sample of the confirmed best trial (or of the last trial, flagged). `trace`:
    every trial takes the kernel's account (measure's --trace), in brief in its row of `search.trials`."""
    from offlab.experiment.measure import measure

    take: Callable[..., StoredSample] = trial or measure
    if not 0 < low < high:
        raise BadInput(f"search bounds: need 0 < low ({low:g} pps) < high ({high:g} pps)")
    trials: list[SearchTrial] = []
    samples: list[StoredSample] = []  # the measured sample of each trial, in the same order

    def run(rate: float, phase: str) -> SearchTrial:
        s = take(lab, dataclasses.replace(w, rate=f"{int(rate)}pps"), capture, **({"trace": True} if trace else {}))
        trials.append(_trial(s, phase, rate, max_loss))
        samples.append(s)
        return trials[-1]

    best: SearchTrial | None = None  # highest achieved rate that passed
    fail_at: float | None = None  # lowest achieved rate that failed
    ceiling: float | None = None  # the generator's highest achieved rate when it fell short
    rate = high
    for _ in range(steps):
        tr = run(rate, "search")
        offered = tr.achieved_pps if tr.achieved_pps is not None else rate
        if tr.generator_limited:
            ceiling = max(ceiling or 0.0, offered)
        if tr.passed:
            if best is None or offered > (best.achieved_pps or 0):
                best = tr
            if fail_at is None:
                break  # the highest rate asked passed (if its sender fell short, asking more cannot offer more)
        else:
            fail_at = offered if fail_at is None else min(fail_at, offered)
        if best is None:
            if rate <= low:
                break  # even the lowest rate allowed fails
            rate = low  # establish a passing lower bound before bisecting
            continue
        lo = best.achieved_pps or low
        if fail_at <= lo * (1 + RESOLUTION):  # type: ignore[operator]
            break
        rate = math.sqrt(lo * fail_at)  # type: ignore[operator]
    chosen, confirmed = _confirm(best, trials, run, confirm, max_loss)
    for t in trials:  # confirmations may also have fallen short of their target
        if t.generator_limited and t.achieved_pps is not None:
            ceiling = max(ceiling or 0.0, t.achieved_pps)
    index = trials.index(chosen) if chosen is not None else len(trials) - 1
    sample = samples[index]
    found = chosen.achieved_pps if chosen is not None and confirmed else None
    # "The device under test was not the bottleneck" only when no trial showed the DUT losing: a
    # trial that failed at an offered rate (whether or not its sender fell short too) is loss on the
    # path, and a sender that fell short at the low bound says nothing about the DUT's ceiling.
    limited = bool(chosen is not None and fail_at is None
                   and (chosen.generator_limited or ceiling and found and found >= ceiling * 0.98))
    verdict = _verdict(found, limited, ceiling, fail_at, max_loss, low)
    sample.search = ZeroLossSearch.keyed(
        max_loss=max_loss, low_pps=low, high_pps=high, confirm=confirm, trials=trials,
        found_pps=int(found) if found is not None else None,
        received_pps=chosen.received_pps if found is not None else None,
        generator_limited=limited if found is not None else bool(ceiling and fail_at is None),
        generator_ceiling_pps=int(ceiling) if ceiling else None,
        lowest_failing_pps=int(fail_at) if fail_at is not None else None,
        verdict=verdict)
    sample.notes.append(verdict)
    return sample


def _confirm(best: SearchTrial | None, trials: list[SearchTrial], run, confirm: int, max_loss: float):
    """Repeat the best rate; if a repeat fails, fall back to the next lower passing rate once."""
    candidates = sorted((t for t in trials if t.passed), key=lambda t: -(t.achieved_pps or 0))[:2]
    for cand in candidates:
        ok, last = True, cand
        for _ in range(confirm):
            last = run(cand.target_pps, "confirm")
            if not last.passed:
                ok = False
                break
        if ok:
            return last, True
    return (trials[-1] if trials else None), False


def _verdict(found, limited, ceiling, fail_at, max_loss, low) -> str:
    crit = f"≤ {100 * max_loss:g} % loss"
    if found is None:
        if fail_at is not None:
            return (f"no rate met {crit}: loss above the threshold from {int(fail_at)} pps offered "
                    f"(the lowest tried, {int(low)} pps target, or a confirmation failed)")
        return f"no rate could be confirmed at {crit}"
    if limited:
        return (f"no loss above the threshold up to the generator's ceiling of {int(ceiling or found)} pps "
                f"offered: the device under test was not the bottleneck ({crit} at {int(found)} pps, confirmed)")
    tail = f"; loss exceeded the threshold at {int(fail_at)} pps" if fail_at else ""
    return f"{found / 1e3:.1f} kpps offered at {crit} (confirmed){tail}"
