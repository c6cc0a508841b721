"""`offlab mtu probe`: finds a hop lowered at run time, tells a router's ICMP from a black hole."""

from __future__ import annotations

import json

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from offlab.hosts import LOCAL
from offlab.mtu.probe import probe
from tests.conftest import requires_root
from tests.helpers import one_line_error, run


@pytest.mark.parametrize("dest", ["8.8.8.8", "192.168.1.1", "10.201.0.1", "2001:db8::1", "fd00:201::1",
                                  "example.com", "10.200.1.2; reboot"])
def test_destinations_outside_the_lab_ranges_are_refused(dest):
    one_line_error(run("mtu", "probe", dest), 2, "DEST")


def test_lab_addresses_are_probed_only_from_a_namespace():
    # from the machine's own namespace 10.200.0.0/16 follows the default route out of eth0
    one_line_error(run("mtu", "probe", "10.200.1.2"), 2, "probed from a lab namespace")


def test_loopback_carries_the_largest_packet():
    r = probe(LOCAL, "127.0.0.1", timeout=0.3)
    assert r.path_mtu == 65535 and not r.black_hole and len(r.probes) == 1


@pytest.mark.network
@requires_root
def test_router_hop_lowered_to_6000_is_reported_by_frag_needed(lab_name, clean_machine):
    """Seed 004's run-time change to 6000, on the router's server-side link."""
    lab = labs.up("router", lab_name, mtu=9000, ipv6=True)
    try:
        iface = lab.resolve_iface("router", "to-server")
        lab.host("router").run(["ip", "link", "set", iface, "mtu", "6000"])
        res = run("mtu", "probe", "10.200.2.2", "--lab", lab_name, "--host", "client", "--timeout", "0.5", "--json")
        assert res.returncode == 0, res.stderr
        r = json.loads(res.stdout)
        assert (r["path_mtu"], r["frag_needed"], r["frag_from"], r["black_hole"]) == (6000, 6000, "10.200.1.254", False)
        assert len(r["probes"]) <= 3
        # a second probe finds the path MTU the kernel learnt from that ICMP: refused locally, not by the router
        again = probe(lab.client, "10.200.2.2", timeout=0.5)
        assert (again.path_mtu, again.local_limit, again.frag_needed) == (6000, 6000, None)
        assert "learnt from an earlier ICMP" in again.verdict
        v6 = probe(lab.client, lab.entry("server").address6, timeout=0.5)
        assert (v6.path_mtu, v6.frag_needed, v6.black_hole) == (6000, 6000, False)  # "Packet too big"
    finally:
        teardown.down(lab_name)


@pytest.mark.network
@requires_root
def test_bridge_port_lowered_to_6000_is_a_black_hole(lab_name, clean_machine):
    lab = labs.up("bridge", lab_name, mtu=9000)
    try:
        port = lab.resolve_iface("switch", "to-server")
        lab.host("switch").run(["ip", "link", "set", port, "mtu", "6000"])
        res = run("mtu", "probe", "10.200.1.2", "--netns", lab.entry("client").netns, "--timeout", "0.3")
        assert res.returncode == 0, res.stderr
        assert "path MTU 6000" in res.stdout and "BLACK HOLE" in res.stdout
        r = probe(lab.client, "10.200.1.2", timeout=0.3)
        assert (r.path_mtu, r.black_hole, r.frag_needed, r.iface_mtu) == (6000, True, None, 9000)
        assert len(r.probes) <= 20 and all(p.result in ("ok", "silent") for p in r.probes)
        doc = json.loads(run("doctor", "--netns", lab.entry("switch").netns, "--check", "bridge.mtu", "--json").stdout)
        assert doc["checks"][0]["status"] == "fail" and f"{port} 6000" in doc["checks"][0]["summary"]
    finally:
        teardown.down(lab_name)
