"""The guide's packet-rate tiers (seed 002, 方法论) and how they grade a finding.

below 100 kpps       nothing needs tuning
100–500 kpps         multiqueue, CPU placement            (checks with tier "basic")
500 kpps–2 Mpps      the aggressive items: iptables off,   (tier "aggressive")
                     NAPI sysctls, mitigations, kernel
2–3 Mpps             the kernel's limit in a VM (1.8 Mpps with no loss)
above 3 Mpps         SR-IOV or vDPA

A finding's raw status is what it would be for the tier its item belongs to.
Below that tier it becomes info (not needed yet); above it a warn becomes fail
(needed long before this rate). Checks with no tier are correctness (a black
hole, drops happening now) and keep their status at every rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.errors import BadInput


@dataclass(frozen=True)
class Tier:
    level: int
    name: str
    low: int
    high: int | None
    advice: str

    def to_json(self) -> dict:
        return {"level": self.level, "name": self.name, "range_pps": [self.low, self.high], "advice": self.advice}


TIERS = (
    Tier(0, "below 100 kpps", 0, 100_000, "nothing needs tuning: the platform carries this untouched"),
    Tier(1, "100-500 kpps", 100_000, 500_000, "simple tuning: NIC multiqueue and CPU placement (NUMA, vhost, XPS)"),
    Tier(2, "500 kpps-2 Mpps", 500_000, 2_000_000,
         "aggressive tuning: newer kernel, iptables/ebtables off, NAPI sysctls, mitigations off"),
    Tier(3, "2-3 Mpps", 2_000_000, 3_000_000,
         "the kernel's limit: the guide's tuned VM routes 1.8 Mpps with no loss, 2 Mpps with 0.07 % loss"),
    Tier(4, "above 3 Mpps", 3_000_000, None,
         "use SR-IOV or vDPA: a software path costs too much CPU and varies too much at this rate"),
)
CHECK_TIER_LEVEL = {"basic": 1, "aggressive": 2}


def tier_for(pps: int) -> Tier:
    if isinstance(pps, bool) or not isinstance(pps, int) or pps < 0:
        raise BadInput(f"--target-pps must be a non-negative integer, got {pps!r}")
    for t in TIERS:
        if t.high is None or pps < t.high:
            return t
    return TIERS[-1]


def grade(raw: str, check_tier: str | None, target: Tier | None) -> str:
    """The status of a finding at the target rate."""
    if target is None or check_tier is None or raw not in ("warn", "fail", "info"):
        return raw
    level = CHECK_TIER_LEVEL[check_tier]
    if target.level < level:
        return "info"
    if target.level > level and raw == "warn":
        return "fail"
    return raw
