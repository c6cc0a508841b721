"""The figures an experiment compares, named once: unit, which direction is better, and how
each is taken from a measured sample (offlab.experiment.measure.Sample.to_dict())."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    better: str  # "higher" | "lower"
    get: Callable[[dict], float | None]


def _cpu(side: str, part: str) -> Callable[[dict], float | None]:
    return lambda s: (s["probes"]["cpu"].get(side) or {}).get(part)


def _sd(side: str) -> Callable[[dict], float | None]:
    return lambda s: s["service_demand_us_per_kib"].get(side)


def _rr(phase: str, field: str) -> Callable[[dict], float | None]:
    """A figure of the request/response probe: phase "idle" (alone) or "loaded" (beside the stream)."""
    return lambda s: ((s.get("rr") or {}).get(phase) or {}).get(field)


# Whole round trips (sockperf prints half), lower is better: rtt_p50_us ... (the probe alone) and
# loaded_rtt_p50_us ... (beside the stream), from sample["rr"]["idle"] / ["loaded"].
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
    Metric("throughput_bps", "throughput", "bit/s", "higher", lambda s: s["traffic"]["throughput_bps"]),
    Metric("pps", "datagrams received per second", "pps", "higher", lambda s: s["traffic"].get("pps")),
    Metric("loss", "loss", "fraction", "lower", lambda s: s["traffic"].get("loss")),
    Metric("retransmits", "TCP retransmits", "segments", "lower", lambda s: s["traffic"].get("retransmits")),
    Metric("jitter_us", "jitter", "µs", "lower", lambda s: s["traffic"].get("jitter_us")),
    Metric("cpu_client_busy", "client CPU busy", "%", "lower", _cpu("client", "busy")),
    Metric("cpu_client_user", "client CPU user", "%", "lower", _cpu("client", "user")),
    Metric("cpu_client_system", "client CPU system", "%", "lower", _cpu("client", "system")),
    Metric("cpu_client_softirq", "client CPU softirq", "%", "lower", _cpu("client", "softirq")),
    Metric("cpu_server_busy", "server CPU busy", "%", "lower", _cpu("server", "busy")),
    Metric("cpu_server_user", "server CPU user", "%", "lower", _cpu("server", "user")),
    Metric("cpu_server_system", "server CPU system", "%", "lower", _cpu("server", "system")),
    Metric("cpu_server_softirq", "server CPU softirq", "%", "lower", _cpu("server", "softirq")),
    Metric("sd_client_us_per_kib", "client service demand", "µs/KiB", "lower", _sd("client")),
    Metric("sd_server_us_per_kib", "server service demand", "µs/KiB", "lower", _sd("server")),
    Metric("sd_total_us_per_kib", "service demand (whole system)", "µs/KiB", "lower", _sd("total")),
    *RR_METRICS,
]}

# The metrics a comparison reports by default, in this order.
HEADLINE = ("throughput_bps", "pps", "loss", "cpu_client_busy", "cpu_server_busy", "sd_total_us_per_kib",
            "rtt_p50_us", "rtt_p99_us", "loaded_rtt_p50_us", "loaded_rtt_p99_us", "transactions_per_s")


def metrics_of(sample: dict) -> dict[str, float]:
    """Every metric the sample has a value for."""
    out = {}
    for name, m in METRICS.items():
        try:
            v = m.get(sample)
        except (KeyError, TypeError):
            v = None
        if v is not None:
            out[name] = float(v)
    return out
