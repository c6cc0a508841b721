"""Service demand: CPU time per KiB transferred (netperf's figure), from a probe result's CPU shares."""

from __future__ import annotations


def service_demand(busy_pct: float | None, window_s: float, kib: float) -> float | None:
    """CPU µs per KiB transferred for one CPU's busy share (the per-side split); None where nothing
    moved or its CPU was not read."""
    if busy_pct is None or kib <= 0 or window_s <= 0:
        return None
    return busy_pct / 100.0 * window_s * 1e6 / kib


def system_service_demand(busy_s: float | None, kib: float) -> float | None:
    """netperf's service demand: CPU µs of the whole system (utilisation × CPUs × time) per KiB; None
    where nothing moved or its CPU was not read."""
    if busy_s is None or kib <= 0:
        return None
    return busy_s * 1e6 / kib
