"""What a check returns, and the report that text and JSON are both made from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA = "offlab-doctor/1"

STATUSES = ("ok", "info", "skip", "warn", "fail")
# Order for --fail-on and for "worst of": skip and info never fail a run.
SEVERITY = {"ok": 0, "skip": 0, "info": 1, "warn": 2, "fail": 3}


@dataclass(frozen=True)
class FixChange:
    """One setting a fix changes, in the terms of the knobs package (key, value, iface)."""

    key: str
    value: str | int
    iface: str | None = None
    netns: str | None = None  # None: the host or namespace being audited


@dataclass
class Outcome:
    """What a check function observed; the runner turns it into a Finding."""

    status: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None
    changes: list[FixChange] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")


@dataclass
class Finding:
    id: str
    area: str
    title: str
    target: str | None
    status: str
    raw_status: str
    tier: str | None
    summary: str
    evidence: dict[str, Any]
    why: str
    fix: str | None
    changes: list[FixChange]
    needs_root: bool

    @property
    def automatable(self) -> bool:
        return bool(self.changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "area": self.area,
            "title": self.title,
            "target": self.target,
            "status": self.status,
            "raw_status": self.raw_status,
            "tier": self.tier,
            "summary": self.summary,
            "evidence": self.evidence,
            "why": self.why,
            "fix": self.fix,
            "automatable": self.automatable,
            "changes": [
                {"key": c.key, "value": c.value, "iface": c.iface, "netns": c.netns}
                for c in self.changes
            ],
            "needs_root": self.needs_root,
        }


@dataclass
class Report:
    host: dict[str, Any]
    target_pps: int | None
    tier: dict[str, Any] | None
    sample_seconds: float | None
    findings: list[Finding]
    duration_s: float = 0.0

    def summary(self) -> dict[str, int]:
        counts = {s: 0 for s in ("ok", "info", "warn", "fail", "skip")}
        for f in self.findings:
            counts[f.status] += 1
        counts["total"] = len(self.findings)
        return counts

    def worst(self) -> str:
        return max((f.status for f in self.findings), key=SEVERITY.__getitem__, default="ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "host": self.host,
            "target_pps": self.target_pps,
            "tier": self.tier,
            "sample_seconds": self.sample_seconds,
            "duration_s": round(self.duration_s, 3),
            "summary": self.summary(),
            "checks": [f.to_json() for f in self.findings],
        }
