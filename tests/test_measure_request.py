"""`offlab measure`'s options → a MeasureRequest → checked workloads: pure, no lab, no network."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main

from offlab.cli import app
from offlab.cli.measure import request_from_options
from offlab.errors import BadInput
from offlab.experiment.request import MeasureRequest, check


def parsed(*argv: str) -> MeasureRequest:
    """The request `offlab measure ARGV` maps to, parsed by the real command (nothing run)."""
    cmd = typer.main.get_command(app).commands["measure"]  # type: ignore[attr-defined]
    ctx = cmd.make_context("measure", list(argv))
    options = dict(ctx.params)
    options.pop("as_json")
    return request_from_options(options)


def test_every_option_lands_in_its_field_of_the_request():
    req = parsed("lab1", "--tool", "engine", "--proto", "udp", "--size", "1472", "--gso", "--gro", "--batch", "8",
                 "--send", "sendmmsg", "--rate", "100kpps", "--streams", "3", "--duration", "4", "--warmup", "1",
                 "--ipv6", "--big-packets", "--capture", "switch:to-server", "--frames", "50",
                 "--workload", "rr-under-load", "--request-size", "100", "--response-size", "200", "--flows", "4",
                 "--timeout", "2.5", "--rr-proto", "tcp", "--rr-rate", "10k")
    assert req == MeasureRequest(lab="lab1", tool="engine", proto="udp", size=1472, gso=True, gro=True, batch=8,
                                 send="sendmmsg", rate="100kpps", streams=3, duration=4.0, warmup=1.0, ipv6=True,
                                 big_packets=True, capture="switch:to-server", frames=50, workload="rr-under-load",
                                 request_size=100, response_size=200, flows=4, rr_timeout=2.5, rr_proto="tcp",
                                 rr_rate="10k")


def test_no_option_gives_the_requests_defaults():
    assert parsed("lab1") == MeasureRequest(lab="lab1")


def test_a_stream_request_becomes_the_tools_default_protocol():
    job = check(MeasureRequest(lab="l", tool="engine", size=1200, rate="250M"))
    assert (job.kind, job.rr, job.capture) == ("stream", None, None)
    assert (job.stream.tool, job.stream.protocol, job.stream.size, job.stream.rate) == ("engine", "udp", 1200, "250M")
    assert check(MeasureRequest(lab="l")).stream.protocol == "tcp"  # iperf3's


def test_an_rr_request_reads_rate_as_transactions_and_proto_as_the_probes():
    job = check(MeasureRequest(lab="l", workload="rr", proto="tcp-crr", rate="10k", flows=2, rr_timeout=0.5))
    assert job.stream is None
    assert (job.rr.protocol, job.rr.rate, job.rr.flows, job.rr.timeout) == ("tcp-crr", 10_000.0, 2, 0.5)
    assert check(MeasureRequest(lab="l", workload="rr")).rr.protocol == "udp"


def test_rr_under_load_gives_the_stream_and_the_probe_their_own_protocol_and_rate():
    job = check(MeasureRequest(lab="l", workload="rr-under-load", tool="engine", rate="1G", rr_proto="tcp",
                               rr_rate="5k", capture="server", frames=10))
    assert (job.stream.protocol, job.stream.rate) == ("udp", "1G")
    assert (job.rr.protocol, job.rr.rate) == ("tcp", 5_000.0)
    assert (job.capture.role, job.capture.iface, job.capture.frames) == ("server", None, 10)


@pytest.mark.parametrize("change, message", [
    ({"workload": "ping"}, "--workload 'ping': choose stream, rr or rr-under-load"),
    ({"workload": "rr-under-load", "rr_proto": "icmp"}, "--rr-proto 'icmp': the probe is udp, tcp or tcp-crr"),
    ({"workload": "rr-under-load", "tool": "engine", "duration": 0.3}, "--duration 0.3: rr-under-load needs more than 0.4 s"),
    ({"workload": "rr", "rate": "fast"}, "--rate 'fast': transactions per second for --workload rr"),
    ({"frames": 0}, "--frames 0: 1..1000000"),
    ({"capture": "server;rm"}, "--capture 'server;rm': write HOST[:IFACE]"),
    ({"capture": "server:bad name"}, "--capture 'server:bad name': write HOST[:IFACE]"),
    ({"capture": ""}, "--capture '': write HOST[:IFACE]"),
    ({"tool": "ncat"}, "--tool 'ncat': choose iperf3 or engine"),
    ({"streams": 0}, "--streams 0: 1..128"),
])
def test_a_bad_value_is_refused_naming_its_option(change, message):
    with pytest.raises(BadInput) as err:
        check(dataclasses.replace(MeasureRequest(lab="l"), **change))
    assert message in str(err.value)


def test_the_frames_bound_is_checked_only_after_the_workload():
    # The order the options were checked in before the request existed: the workload's error comes first.
    with pytest.raises(BadInput, match="--streams 0"):
        check(MeasureRequest(lab="l", streams=0, frames=0))


def test_run_overrides_share_the_budget_over_a_suites_plans_and_set_the_stopping_rule():
    from offlab.experiment import suites
    from offlab.experiment.request import PlanOverrides, override

    plans = suites.plans("quick")
    assert len(plans) >= 2
    override(plans, PlanOverrides(budget="10m", until="width"))
    assert [p.budget_s for p in plans] == [600 / len(plans)] * len(plans)
    assert {p.repeat.until for p in plans} == {"width"}
    untouched = suites.plans("quick")
    assert override(untouched, PlanOverrides()) == untouched  # nothing asked, nothing changed
    assert [p.repeat.until for p in untouched] == [p.repeat.until for p in suites.plans("quick")]


@pytest.mark.parametrize("o, message", [
    ({"until": "forever"}, "--until 'forever': choose decided or width"),
    ({"budget": "soon"}, "--budget is seconds (600) or a duration like 90s, 10m, 2h, not 'soon'"),
])
def test_a_bad_run_override_is_refused_before_any_plan_changes(o, message):
    from offlab.experiment import suites
    from offlab.experiment.request import PlanOverrides, override

    plans = suites.plans("quick")
    before = [(p.budget_s, p.repeat.until) for p in plans]
    with pytest.raises(BadInput) as err:
        override(plans, PlanOverrides(**o))
    assert message in str(err.value)
    assert [(p.budget_s, p.repeat.until) for p in plans] == before
