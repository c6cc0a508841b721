"""Traffic rates, parsed in one place: `100kpps`, `10Mpps`, `250M`, `1G`, `1Gbit`, `0` (unlimited).

The grammar is offlab-engine's `--rate` (engine/src/args.rs `parse_rate`), so a rate
that passes here is one the engine accepts; iperf3 gets the bit rate as a plain number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from offlab.errors import BadInput

_RATE_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([kmg]?)(pps|bit/s|bps|bit)?")
_MULT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
MAX_PPS = 1e9  # the engine's limits
MAX_BPS = 1e13
RATE_HELP = "0 (unlimited), packets per second (500pps, 100kpps, 10Mpps) or bit/s (250M, 1G, 1Gbit)"


@dataclass(frozen=True)
class Rate:
    """A parsed rate: packets per second or bit/s; both None means unlimited."""

    text: str
    pps: float | None = None
    bps: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.pps is None and self.bps is None


def parse_rate(text: object, what: str = "--rate") -> Rate:
    """`text` as a Rate, or BadInput naming `what` and the accepted forms."""
    s = str(text).strip() if isinstance(text, (str, int, float)) and not isinstance(text, bool) else ""
    m = _RATE_RE.fullmatch(s.lower())
    if not m:
        raise BadInput(f"{what} {text!r}: a rate is {RATE_HELP}")
    value = float(m.group(1)) * _MULT[m.group(2)]
    if value == 0:
        return Rate(s)
    if m.group(3) == "pps":
        if value > MAX_PPS:
            raise BadInput(f"{what} {text!r}: at most {MAX_PPS:.0e} pps")
        return Rate(s, pps=value)
    if value > MAX_BPS:
        raise BadInput(f"{what} {text!r}: at most {MAX_BPS:.0e} bit/s")
    return Rate(s, bps=value)


def parse_pps(text: object, what: str = "rate") -> float:
    """A packet rate (`10kpps`, `2Mpps`) in packets per second; BadInput for a bit rate or 0."""
    rate = parse_rate(text, what)
    if rate.pps is None:
        raise BadInput(f"{what} {text!r}: a packet rate like 10kpps or 2Mpps (not 0, not bit/s)")
    return rate.pps
