"""The latency suite and plans of request/response kinds: valid, quick picks the deciding cells,
bad values name file:line and field before any lab is built."""

from __future__ import annotations

import pytest

from offlab.errors import BadInput
from offlab.experiment import suites
from offlab.experiment.plan import load_plan
from offlab.experiment.plan.checks import required_tools

PLAN = """\
name: t
topology: {kind: router}
axes:
  gro:
    "off": {features: {"router:to-client": {gro: off}}}
    "on": {features: {"router:to-client": {gro: on}}, settings: {"router:to-client": {gro_flush_timeout: 20000}}}
workload: {kind: rr-under-load, tool: iperf3, protocol: tcp, duration: 2, warmup: 1, request_size: 64}
baseline: {gro: "off"}
"""


def test_latency_suite_is_the_full_matrix_and_quick_runs_the_deciding_cells():
    [full] = suites.plans("latency")
    assert len(full.cells) == 8 and full.baseline == {"gro": "off", "napi": "off", "busy": "off"}
    assert {c.workload.kind for c in full.cells} == {"rr-under-load"}
    busy = next(c for c in full.cells if c.params["busy"] == "on")
    assert ("machine", "net.core.busy_poll", 50) in busy.changes
    [quick] = suites.plans("latency", quick=True)
    assert sorted(map(str, (c.params for c in quick.cells))) == sorted(map(str, [
        {"gro": "off", "napi": "off", "busy": "off"}, {"gro": "on", "napi": "off", "busy": "off"},
        {"gro": "on", "napi": "off", "busy": "on"}, {"gro": "on", "napi": "on", "busy": "off"}]))
    assert len(quick.headline) == 2 and quick.budget_s  # busy polling, NAPI deferral; GRO alone is shape
    assert "Issue #12" in suites.description("latency") and "seed 002" in suites.description("latency")


def test_a_request_response_plan_needs_the_engine_and_builds_the_probe_from_the_workload():
    p = load_plan(PLAN, "t.yaml")
    assert "offlab-engine" in required_tools(p) and "iperf3" in required_tools(p)
    rw = p.cells[0].workload.rr_workload(ipv6=False)
    assert (rw.protocol, rw.request_size, rw.duration, rw.warmup) == ("udp", 64, 2.0, 1.0)
    only_rr = load_plan(PLAN.replace("kind: rr-under-load", "kind: rr"), "t.yaml")
    assert required_tools(only_rr) == ["ip", "ethtool", "taskset", "offlab-engine"]


@pytest.mark.parametrize("old, new, needle", [
    ("request_size: 64", "request_size: 0", "t.yaml:7: workload.request_size: a udp request/response here is 24..65507"),
    ("request_size: 64", "rr_protocol: sctp", "t.yaml:7: workload.rr_protocol"),
    ("kind: rr-under-load", "kind: ping", "t.yaml:7: workload.kind"),
    ("gro_flush_timeout: 20000", "gro_flush_timeout: -1", "gro_flush_timeout takes an integer 0..1000000000"),
    ("gro_flush_timeout: 20000", "napi_defer_hard_irqs: 2147483648", "napi_defer_hard_irqs takes an integer"),
    ("gro_flush_timeout: 20000", "net.core.busy_poll: 50",
     "net.core.busy_poll is host-wide (no network namespace has it): write it under machine"),
])
def test_bad_latency_plans_name_the_field(old, new, needle):
    assert old in PLAN
    with pytest.raises(BadInput) as e:
        load_plan(PLAN.replace(old, new), "t.yaml")
    assert needle in str(e.value), str(e.value)
