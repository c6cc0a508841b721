"""The engine's report envelope, read by the one function that checks it (offlab.traffic.engine.report),
on reports a real offlab-engine wrote (tx and rx over loopback, tests/fixtures/engine/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.hosts import LOCAL
from offlab.traffic import Workload
from offlab.traffic.engine import SCHEMA, parse, report
from offlab.traffic.iperf3 import TrafficFailed

FIX = Path(__file__).parent / "fixtures" / "engine"


def test_real_reports_pass_and_add_up():
    tx = report((FIX / "tx-loopback.json").read_text(), "tx", LOCAL)
    rx = report((FIX / "rx-loopback.json").read_text(), "rx", LOCAL)
    assert tx["schema"] == rx["schema"] == SCHEMA and tx["options"]["rate"] == "1000pps"
    result = parse(rx, tx, Workload(tool="engine", protocol="udp", size=1472))
    assert result.datagrams_sent == tx["datagrams"] > 0 and result.datagrams_received == rx["unique_datagrams"]


@pytest.mark.parametrize("change, needle", [
    ({"schema": "offlab-engine/2"}, "reports schema 'offlab-engine/2'; this offlab reads 'offlab-engine/1': install"),
    ({"schema": None}, "reports schema None"),
    ({"role": "rx"}, "reported role 'rx' for tx"),
])
def test_a_report_of_another_schema_or_role_is_refused_naming_both(change, needle):
    doc = {**json.loads((FIX / "tx-loopback.json").read_text()), **change}
    with pytest.raises(TrafficFailed, match="offlab-engine") as err:
        report(json.dumps(doc), "tx", LOCAL)
    assert needle in str(err.value) and err.value.exit_code == 3


def test_no_json_at_all_is_refused_with_what_was_printed():
    with pytest.raises(TrafficFailed, match="printed no JSON report: 'Segmentation fault'"):
        report("Segmentation fault\n", "rx", LOCAL)
