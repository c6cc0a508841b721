"""Zero-loss search (seed 002): the highest offered pps whose loss stays at or under a threshold."""

from __future__ import annotations

import dataclasses
import math

from offlab.lab.model import LabState
from offlab.measure import CaptureRequest, Sample, measure
from offlab.traffic import Workload
from offlab.traffic.rate import parse_pps

__all__ = ["parse_pps", "zero_loss_search"]


def zero_loss_search(lab: LabState, w: Workload, max_loss: float, low: float, high: float, steps: int,
                     capture: CaptureRequest | None = None) -> Sample:
    """Bisect (geometrically) between low and high; return the best passing sample, with every step.

    Each step is a full measurement; the sample kept is the one at the highest offered
    rate whose loss was ≤ max_loss (or the lowest rate tried, flagged, if none passed).
    """
    lo, hi = low, high
    best: Sample | None = None
    fallback: Sample | None = None
    log = []
    for _ in range(steps):
        rate = math.sqrt(lo * hi)
        s = measure(lab, dataclasses.replace(w, rate=f"{int(rate)}pps"), capture)
        loss = s.traffic["loss"] or 0.0
        passed = loss <= max_loss
        log.append({"offered_pps": int(rate), "received_pps": s.traffic.get("pps"), "loss": loss, "pass": passed})
        if passed:
            best, lo = s, rate
        else:
            fallback = fallback or s
            hi = rate
    chosen = best or fallback
    assert chosen is not None
    chosen.search = {"max_loss": max_loss, "low_pps": low, "high_pps": high, "steps": log,  # type: ignore[attr-defined]
                     "found_pps": int(lo) if best else None}
    if best is None:
        chosen.notes.append(f"no offered rate ≥ {int(low)} pps kept loss ≤ {100 * max_loss:g} %")
    else:
        chosen.notes.append(f"{best.traffic['pps'] / 1e3:.1f} kpps received at ≤ {100 * max_loss:g} % loss "
                            f"(offered {int(lo)} pps)")
    return chosen
