"""sockperf 3.7 ping-pong output → round-trip figures in offlab's terms (`rtt_*`, whole round trips).

sockperf prints "latency" as HALF the round trip unless run with `--full-rtt`, its "Summary" is the
mean, and its lines carry ANSI colour escapes. Round trips counted are the `[Valid Duration]`
ones (the 400 ms warm-up excluded); `[Total Run]` counts include it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from offlab.errors import EnvironmentProblem

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RUN = re.compile(r"\[(Total Run|Valid Duration)\] RunTime=([\d.]+) sec;.*?SentMessages=(\d+); ReceivedMessages=(\d+)")
_AVG = re.compile(r"====> avg-(latency|rtt)=([\d.]+)")
_PCT = re.compile(r"---> percentile ([\d.]+) =\s*([\d.]+)")
_MINMAX = re.compile(r"---> <(MIN|MAX)> observation =\s*([\d.]+)")


@dataclass
class SockperfResult:
    full_rtt: bool  # sockperf ran with --full-rtt (else its figures were halves, doubled here)
    valid_s: float
    round_trips: int  # [Valid Duration] ReceivedMessages
    total_sent: int  # [Total Run] messages, warm-up included: what the interface carried
    total_received: int
    transactions_per_s: float
    rtt_mean_us: float
    rtt_min_us: float | None
    rtt_p50_us: float | None
    rtt_p90_us: float | None
    rtt_p99_us: float | None
    rtt_p99_9_us: float | None
    rtt_max_us: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_ping_pong(text: str) -> SockperfResult:
    """Parses one `sockperf ping-pong` client output (stdout and stderr together)."""
    text = _ANSI.sub("", text)
    runs = {m.group(1): (float(m.group(2)), int(m.group(3)), int(m.group(4))) for m in _RUN.finditer(text)}
    avg = _AVG.search(text)
    if "Valid Duration" not in runs or "Total Run" not in runs or avg is None:
        tail = " ".join(text.strip().splitlines()[-3:])[:300]
        raise EnvironmentProblem(f"sockperf printed no ping-pong summary: {tail or 'no output'}")
    full = avg.group(1) == "rtt"
    k = 1.0 if full else 2.0  # sockperf's "latency" is half the round trip
    pct = {float(m.group(1)): float(m.group(2)) * k for m in _PCT.finditer(text)}
    mm = {m.group(1): float(m.group(2)) * k for m in _MINMAX.finditer(text)}
    valid_s, _, received = runs["Valid Duration"]
    _, total_sent, total_received = runs["Total Run"]
    return SockperfResult(
        full_rtt=full, valid_s=valid_s, round_trips=received, total_sent=total_sent,
        total_received=total_received, transactions_per_s=received / valid_s if valid_s else 0.0,
        rtt_mean_us=float(avg.group(2)) * k, rtt_min_us=mm.get("MIN"), rtt_p50_us=pct.get(50.0),
        rtt_p90_us=pct.get(90.0), rtt_p99_us=pct.get(99.0), rtt_p99_9_us=pct.get(99.9), rtt_max_us=mm.get("MAX"),
    )
