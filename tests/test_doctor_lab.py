"""doctor inside lab namespaces: the OVS checksum trap live, and --apply put back by `offlab restore`."""

from __future__ import annotations

import json

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from tests.conftest import requires_root
from tests.helpers import run

pytestmark = [requires_root, pytest.mark.network]


def feature(host, iface: str, name: str) -> str:
    out = host.run(["ethtool", "-k", iface]).stdout
    return next(l.split(":")[1].split()[0] for l in out.splitlines() if l.strip().startswith(name + ":"))


def test_ovs_trap_is_found_live_with_the_exact_fix(lab_name, clean_machine):
    lab = labs.up("ovs", lab_name, mtu=9000)
    try:
        switch = lab.entry("switch").netns
        args = ["doctor", "--netns", switch, "--check", "ovs.veth-csum", "--check", "mtu.path", "--json"]
        doc = json.loads(run(*args).stdout)
        assert {c["id"]: c["status"] for c in doc["checks"]} == {"ovs.veth-csum": "ok", "mtu.path": "ok"}
        client_if = lab.resolve_iface("client", "to-switch")
        lab.client.run(["ethtool", "-K", client_if, "tx", "on"])
        doc = json.loads(run(*args).stdout)
        trap = next(c for c in doc["checks"] if c["id"] == "ovs.veth-csum")
        assert trap["status"] == "fail"
        assert trap["fix"] == f"ip netns exec {lab.entry('client').netns} ethtool -K {client_if} tx off"
    finally:
        teardown.down(lab_name)


def test_apply_turns_an_offload_on_and_restore_puts_it_back(lab_name, clean_machine):
    lab = labs.up("bridge", lab_name)
    try:
        ns, iface = lab.entry("client").netns, lab.resolve_iface("client", "to-switch")
        lab.client.run(["ethtool", "-K", iface, "tso", "off"])
        assert feature(lab.client, iface, "tcp-segmentation-offload") == "off"

        res = run("doctor", "--netns", ns, "--check", "nic.offloads", "--apply", "nic.offloads")
        assert res.returncode == 2 and "add --yes" in res.stderr  # no terminal to confirm on: nothing happens
        assert feature(lab.client, iface, "tcp-segmentation-offload") == "off"

        res = run("doctor", "--netns", ns, "--check", "nic.offloads", "--apply", "nic.offloads", "--yes")
        assert res.returncode == 0, res.stderr
        assert f"{iface} tcp-segmentation-offload: off → on" in res.stdout
        assert feature(lab.client, iface, "tcp-segmentation-offload") == "on"
        doc = json.loads(run("doctor", "--netns", ns, "--check", "nic.offloads", "--json").stdout)
        assert doc["checks"][0]["status"] == "ok"

        res = run("restore")
        assert res.returncode == 0, res.stderr
        assert feature(lab.client, iface, "tcp-segmentation-offload") == "off"
    finally:
        teardown.down(lab_name)


def test_apply_refuses_unknown_ids_and_says_what_is_manual(lab_name, clean_machine):
    lab = labs.up("veth", lab_name)
    try:
        ns = lab.entry("client").netns
        res = run("doctor", "--netns", ns, "--check", "nic.offloads", "--apply", "nic.nosuch", "--yes")
        assert res.returncode == 2 and "unknown check id(s) nic.nosuch" in res.stderr
        res = run("doctor", "--netns", ns, "--check", "kernel.mitigations", "--apply", "kernel.mitigations", "--yes")
        assert res.returncode == 0
        assert "kernel.mitigations: not automatable; by hand: add mitigations=off" in res.stdout
    finally:
        teardown.down(lab_name)
