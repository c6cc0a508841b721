"""Where lost datagrams died, from counters before and after on every hop, in real labs (issue 15).

Each test makes datagrams die in one known place and checks that the attribution names that
place with (nearly) the whole loss, in the sample's JSON and in the lines the terminal prints.
"""

from __future__ import annotations

import json
import os

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.experiment import witnesses
from offlab.sample import StoredSample
from offlab.experiment.measure import measure
from offlab.probes import ProbeSession
from offlab.probes.edge import qdisc
from offlab.probes.edge.qdisc import QdiscProbe
from offlab.probes.counters import parse_snmp
from offlab.report import format as fmt
from offlab.traffic import Workload
from offlab.traffic.engine import engine_path
from tests.conftest import offlab_cli, requires_root

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "probes")


def test_tc_json_gives_root_qdisc_drops_per_device():
    # `tc -s -j qdisc show` in a namespace whose veth had `tbf rate 100mbit burst 32kb limit 10000`
    with open(os.path.join(FIX, "tc_qdisc_tbf_drops.json")) as f:
        got = qdisc.parse_tc(f.read())
    assert set(got) == {"oltrq0"}  # lo is not a lab interface
    assert got["oltrq0"]["kind"] == "tbf" and got["oltrq0"]["drops"] == 27410
    before = {"oltrq0": {**got["oltrq0"], "drops": 27000, "packets": 2800}}
    assert qdisc.delta(before, got)["oltrq0"]["drops"] == 410
    assert qdisc.delta({"oltrq0": {**got["oltrq0"], "kind": "pfifo"}}, got) == {}  # replaced mid-window: no claim
    assert qdisc.parse_tc("not json") == {}


def test_router_snmp_keeps_the_forwarding_drop_counters():
    with open(os.path.join(FIX, "snmp_router.txt")) as f:
        ip = parse_snmp(f.read())["Ip"]
    assert {"ForwDatagrams", "InAddrErrors", "OutNoRoutes", "OutDiscards", "InDiscards"} <= set(ip)


@requires_root
@pytest.mark.network
def test_datagrams_to_a_port_nobody_listens_on_are_attributed_to_noports(veth_lab):
    server = veth_lab.entry("server").address
    with ProbeSession(veth_lab) as probes:
        a = probes.snapshot()
        res = veth_lab.client.run([engine_path(), "tx", "--dest", server, "--port", "5399", "--size", "512",
                                   "--duration", "0.5", "--rate", "20kpps", "--no-end"], timeout=30)
        b = probes.snapshot()
        probe = probes.result(a, b, client_cpu=None, server_cpu=None).stored().to_json()
    sent = json.loads(res.stdout)["datagrams"]
    sample = {"traffic": {"tool": "engine", "datagrams_sent": sent, "datagrams_received": 0, "loss": 1.0},
              "probes": probe, "workload": {"protocol": "udp", "gso": False, "gro": False}}
    la = witnesses.attribute_loss(StoredSample.from_json(sample))
    assert la is not None and la.lost == sent > 5000
    top = la.places[0]
    assert top.where == "server Udp NoPorts" and top.count == sent and top.share == pytest.approx(1.0)
    assert la.unexplained == 0
    lines = fmt.loss_lines(la)
    assert lines[0] == f"lost {sent} of {sent} datagrams (client Udp OutDatagrams − server Udp InDatagrams)"
    assert f"  server Udp NoPorts {sent} (100 %): no socket on the port" in lines


@requires_root
@pytest.mark.network
def test_a_router_queue_that_overflows_is_attributed_with_its_share(lab_name, clean_machine):
    lab = labs.up("router", lab_name)
    try:
        # A tiny rate-limited queue on the router's port towards the server, set like a user would (journalled).
        res = offlab_cli("lab", "set", lab_name, "router", "to-server", "qdisc=tbf rate 20mbit burst 8kb limit 6000")
        assert res.returncode == 0, res.stderr
        lab = labs.LabState.load(lab_name)
        s = measure(lab, Workload(tool="engine", protocol="udp", size=1200, duration=1.0, warmup=0.3,
                                  rate="20kpps"))
        port = f"router:{lab.resolve_iface('router', 'to-server')}"
        queue = s.probes.of(QdiscProbe)[port]
        assert queue.kind == "tbf" and queue.drops > 0
        la = s.loss_attribution
        assert la is not None and la.lost > 1000 and s.traffic.loss > 0.5  # 20 kpps × 1200 B offered into 20 Mbit/s
        top = la.places[0] if la.places[0].host == "router" else None
        assert top and top.where == f"{port} qdisc (tbf) drops", la.places
        # the queue saw the whole window, the engine counts the whole run: the window's share is most of it
        assert 0.5 < top.share <= 1.05, top
        assert any(line.startswith(f"  {port} qdisc (tbf) drops") for line in fmt.loss_lines(la))
    finally:
        teardown.down(lab_name)
