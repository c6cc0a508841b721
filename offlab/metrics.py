"""The figures an experiment compares, named once: unit, which direction is better, and how
each is taken from a sample (offlab.sample's StoredSample, as measured or read back from the store)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # read at every CLI start (`results`'s metric names): the record's module only where used
    from offlab.sample import Effect, SampleRecord, StoredSample

Getter = Callable[["StoredSample"], "float | None"]


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    better: str  # "higher" | "lower"
    get: Getter
    low: float = 0.0  # the possible range: a value outside it is impossible, never a figure
    high: float | None = None

    def possible(self, v: float) -> bool:
        # 1e-9: a share computed as 100 − idle may come out as 100.00000000000001
        return math.isfinite(v) and v >= self.low - 1e-9 and (self.high is None or v <= self.high * (1 + 1e-9))


def _cpu(side: str, part: str) -> Getter:
    """A side's CPU figure; no figure where that side's CPU, or that part of it, was not read."""
    def get(s: StoredSample) -> float | None:
        cpu = s.probes.cpu.side(side)
        return getattr(cpu, part) if cpu is not None and cpu.has(part) else None
    return get


# Beyond any path offlab measures (a 400 Gbit/s link carries ≤ 0.6 Gpps of minimum frames): a figure
# above these is a counter that wrapped or went negative, like iperf3 3.12's "9223109178 Gpps".
MAX_BPS = 1e13
MAX_PPS = 1e10


def _sd(side: str) -> Getter:
    return lambda s: s.service_demand_us_per_kib.get(side)


def _rr(phase: str, field: str) -> Getter:
    """A figure of the request/response probe: phase "idle" (alone) or "loaded" (beside the stream); no
    figure where the sample has no such phase (a stream's)."""
    def get(s: StoredSample) -> float | None:
        measured = getattr(s.rr, phase) if s.rr is not None else None
        return getattr(measured, field) if measured is not None and measured.has(field) else None
    return get


# Whole round trips (sockperf prints half), lower is better: rtt_p50_us ... (the probe alone) and
# loaded_rtt_p50_us ... (beside the stream), from sample.rr.idle / .loaded.
RR_PHASES = (("idle", "", "idle"), ("loaded", "loaded_", "under load"))
RR_QUANTITIES = (("p50", "p50"), ("p99", "p99"), ("p99_9", "p99.9"), ("mean", "mean"))
RR_METRICS = [
    *(Metric(f"{prefix}rtt_{q}_us", f"rtt {label} {when}", "µs", "lower", _rr(phase, f"rtt_{q}_us"))
      for phase, prefix, when in RR_PHASES for q, label in RR_QUANTITIES),
    *(Metric(f"{prefix}transactions_per_s", f"transactions/s {when}", "tps", "higher",
             _rr(phase, "transactions_per_s")) for phase, prefix, when in RR_PHASES),
    Metric("cpu_us_per_transaction", "CPU per transaction idle", "µs", "lower",
           _rr("idle", "cpu_us_per_transaction")),
]

METRICS: dict[str, Metric] = {m.name: m for m in [
    Metric("throughput_bps", "throughput", "bit/s", "higher", lambda s: s.traffic.throughput_bps, high=MAX_BPS),
    Metric("pps", "datagrams received per second", "pps", "higher", lambda s: s.traffic.pps, high=MAX_PPS),
    Metric("loss", "loss", "fraction", "lower", lambda s: s.traffic.loss, high=1.0),
    Metric("retransmits", "TCP retransmits", "segments", "lower", lambda s: s.traffic.retransmits),
    Metric("jitter_us", "jitter", "µs", "lower", lambda s: s.traffic.jitter_us),
    Metric("cpu_client_busy", "client CPU busy", "%", "lower", _cpu("client", "busy"), high=100.0),
    Metric("cpu_client_user", "client CPU user", "%", "lower", _cpu("client", "user"), high=100.0),
    Metric("cpu_client_system", "client CPU system", "%", "lower", _cpu("client", "system"), high=100.0),
    Metric("cpu_client_softirq", "client CPU softirq", "%", "lower", _cpu("client", "softirq"), high=100.0),
    Metric("cpu_server_busy", "server CPU busy", "%", "lower", _cpu("server", "busy"), high=100.0),
    Metric("cpu_server_user", "server CPU user", "%", "lower", _cpu("server", "user"), high=100.0),
    Metric("cpu_server_system", "server CPU system", "%", "lower", _cpu("server", "system"), high=100.0),
    Metric("cpu_server_softirq", "server CPU softirq", "%", "lower", _cpu("server", "softirq"), high=100.0),
    Metric("sd_client_us_per_kib", "client service demand", "µs/KiB", "lower", _sd("client")),
    Metric("sd_server_us_per_kib", "server service demand", "µs/KiB", "lower", _sd("server")),
    Metric("sd_total_us_per_kib", "service demand (whole system)", "µs/KiB", "lower", _sd("total")),
    *RR_METRICS,
    # testpmd packets out per packet in, data direction: below the no-GRO figure = GRO merged (fewer is
    # "better" only in that sense; GSO/TSO cells read it as how much was split)
    Metric("testpmd_out_per_in", "testpmd packets out per packet in", "ratio", "lower",
           # the testpmd probe's record, read here without its view (offlab.probes lies above this module)
           lambda s: (s.probes.extra.get("testpmd") or {}).get("out_per_in")),
]}

# The metrics a comparison reports by default, in this order.
HEADLINE = ("throughput_bps", "pps", "loss", "cpu_client_busy", "cpu_server_busy", "sd_total_us_per_kib",
            "rtt_p50_us", "rtt_p99_us", "loaded_rtt_p50_us", "loaded_rtt_p99_us", "transactions_per_s")


def _values(sample: StoredSample) -> dict[str, float]:
    out = {}
    for name, m in METRICS.items():
        try:
            v = m.get(sample)
        except (AttributeError, TypeError):  # a part an older offlab stored in another shape: no figure
            v = None
        if v is not None and not isinstance(v, bool):
            out[name] = float(v)
    return out


def metrics_of(sample: StoredSample) -> dict[str, float]:
    """Every metric the sample has a possible value for; an impossible one is no figure
    (offlab.experiment.witnesses notes it on the sample)."""
    return {name: v for name, v in _values(sample).items() if METRICS[name].possible(v)}


def impossible(sample: StoredSample) -> dict[str, float]:
    """The metrics whose value lies outside their possible range (negative, loss > 100 %, ...)."""
    return {name: v for name, v in _values(sample).items() if not METRICS[name].possible(v)}


# Shown wherever a figure from an emulated guest appears (issue 10): TCG emulates the guest's CPU, so
# ratios between cells of one run keep their direction, but no figure says anything about real hardware.
TCG_MARK = "TCG: directions only, not absolute figures"

# A setting read back as set whose effect the sample's counters do not show (offlab.experiment.effects).
NOT_EXERCISED = "set but not exercised"


def not_exercised(sample: StoredSample | None) -> list[Effect]:
    """The effect witnesses of a stored sample that found its setting set but not exercised."""
    return [e for e in (sample.effects if sample else None) or [] if e.status == NOT_EXERCISED]


def not_exercised_by_cell(samples: list[SampleRecord]) -> dict[int, str]:
    """cell id → one line: each setting set but not exercised in its samples, where, in how many of
    them, the likely cause and the first such sample's counters (`samples`: the store's rows, read)."""
    seen: dict[int, dict[tuple, list[Effect]]] = {}
    total: dict[int, int] = {}
    for row in samples:
        total[row.cell_id] = total.get(row.cell_id, 0) + 1
        for e in not_exercised(row.sample):
            seen.setdefault(row.cell_id, {}).setdefault((e.setting, e.value, e.where, e.cause), []).append(e)
    return {cid: "; ".join(f"{k[0]}={k[1]} at {k[2]} in {len(v)} of {total[cid]} samples ({v[0].detail}"
                           + (f" — {k[3]}" if k[3] else "") + ")" for k, v in found.items())
            for cid, found in seen.items()}
