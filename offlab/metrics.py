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
    # testpmd packets out per packet in, data direction: below the no-GRO figure = GRO merged (fewer is
    # "better" only in that sense; GSO/TSO cells read it as how much was split)
    Metric("testpmd_out_per_in", "testpmd packets out per packet in", "ratio", "lower",
           lambda s: (s["probes"].get("testpmd") or {}).get("out_per_in")),
]}

# The metrics a comparison reports by default, in this order.
HEADLINE = ("throughput_bps", "pps", "loss", "cpu_client_busy", "cpu_server_busy", "sd_total_us_per_kib")


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
