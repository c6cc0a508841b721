"""--target-pps: the guide's tiers decide how loud each finding is."""

from __future__ import annotations

from pathlib import Path

import pytest

from offlab.doctor import audit, open_root, tiers
from offlab.errors import BadInput

SOS = Path(__file__).parent / "fixtures" / "doctor" / "sos-centos7-kvm"


@pytest.mark.parametrize("pps, level", [(0, 0), (99_999, 0), (100_000, 1), (499_999, 1), (500_000, 2),
                                        (1_999_999, 2), (2_000_000, 3), (2_999_999, 3), (3_000_000, 4),
                                        (40_000_000, 4)])
def test_tier_boundaries_follow_the_guide(pps, level):
    assert tiers.tier_for(pps).level == level


def test_negative_rate_is_bad_input():
    with pytest.raises(BadInput, match="--target-pps"):
        tiers.tier_for(-1)


@pytest.mark.parametrize("raw, check_tier, level, graded", [
    ("warn", "basic", 0, "info"),        # below 100 kpps nothing needs tuning
    ("warn", "basic", 1, "warn"),        # 100-500 kpps: multiqueue/placement are the items
    ("warn", "basic", 2, "fail"),        # needed long before 500 kpps
    ("warn", "aggressive", 1, "info"),   # iptables off is not for 300 kpps
    ("warn", "aggressive", 2, "warn"),
    ("warn", "aggressive", 4, "fail"),
    ("fail", None, 0, "fail"),           # a black hole is a bug at any rate
    ("ok", "basic", 4, "ok"),
    ("skip", "aggressive", 0, "skip"),
])
def test_grade(raw, check_tier, level, graded):
    assert tiers.grade(raw, check_tier, tiers.TIERS[level]) == graded


def statuses(pps: int | None) -> dict[str, str]:
    report = audit(open_root(SOS), target_pps=pps)
    return {f.id: f.status for f in report.findings}, report


def test_below_100kpps_tuning_becomes_info_but_black_holes_stay():
    s, report = statuses(50_000)
    assert s["platform.tier"] == "ok"
    assert s["nic.queues"] == s["kernel.version"] == s["firewall.rules"] == s["cpu.smt"] == "info"
    assert s["bridge.mtu"] == "fail"
    assert report.tier["name"] == "below 100 kpps"


def test_300kpps_asks_for_multiqueue_not_for_iptables_off():
    s, _ = statuses(300_000)
    assert s["platform.tier"] == "info"
    assert s["nic.queues"] == "warn" and s["irq.balance"] == "warn"
    assert s["firewall.rules"] == s["napi.sysctls"] == s["kernel.mitigations"] == "info"


def test_800kpps_makes_placement_a_failure_and_aggressive_items_warnings():
    s, _ = statuses(800_000)
    assert s["nic.queues"] == "fail" and s["nic.offloads"] == "fail"
    assert s["firewall.rules"] == s["napi.sysctls"] == s["kernel.version"] == "warn"


def test_2_5mpps_is_the_kernels_limit_and_4mpps_needs_sriov():
    report = audit(open_root(SOS), target_pps=2_500_000)
    tier = next(f for f in report.findings if f.id == "platform.tier")
    assert tier.status == "warn" and "kernel's limit" in tier.summary
    report = audit(open_root(SOS), target_pps=4_000_000)
    tier = next(f for f in report.findings if f.id == "platform.tier")
    assert tier.status == "warn" and "SR-IOV or vDPA" in tier.summary and "sriov_numvfs" in tier.fix
    assert {f.id: f.status for f in report.findings}["firewall.rules"] == "fail"


def test_without_a_target_the_raw_status_stands_and_no_tier_finding():
    s, report = statuses(None)
    assert "platform.tier" not in s and report.tier is None
    assert s["nic.queues"] == "warn" and s["firewall.rules"] == "warn"
