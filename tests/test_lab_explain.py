"""`offlab lab explain` on a real TCG guest started with `--nic host_uso=off` (one boot for the module):
the chain from QEMU's property to the guest's fixed feature, the effective properties in `lab show`,
the chain stored with a sample, and a guest-side change that moves the tap's flags."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import module_lab, offlab_cli, requires_root

pytestmark = [
    requires_root,
    pytest.mark.network,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                       reason="QEMU is not installed (scripts/install-deps installs it)"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from module_lab(tmp_path_factory, "vm", "ex", "--nic", "host_uso=off", timeout=300)


def cli(lab, *args, timeout=120):
    return offlab_cli(*args, env=lab["env"], timeout=timeout)


def rows(nic: dict) -> dict:
    return {r["prop"]: r for r in nic["rows"]}


def test_lab_set_of_a_feature_the_chain_fixes_off_says_why_and_changes_nothing(lab):
    res = cli(lab, "lab", "set", lab["name"], "client", "eth0", "tx-udp-segmentation=on")
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert any(l.startswith("client:eth0 tx-udp-segmentation: ") for l in lines), res.stdout
    assert "  why: tx-udp-segmentation off [fixed]: host_uso=off, VIRTIO_NET_F_HOST_USO (bit 56) not offered" in lines, \
        res.stdout
    assert "1 of 1 setting(s) could not be made" in res.stderr, res.stderr
    assert cli(lab, "restore").returncode == 0


def test_explain_says_udp_segmentation_is_fixed_because_host_uso_is_off(lab):
    res = cli(lab, "lab", "explain", lab["name"], "client", "eth0", "--json")
    assert res.returncode == 0, res.stderr
    (nic,) = json.loads(res.stdout)["nics"]
    assert (nic["iface"], nic["device_id"], nic["problems"]) == ("eth0", "nic0", [])
    uso = rows(nic)["host_uso"]
    assert (uso["value"], uso["source"], uso["offered"], uso["accepted"]) == ("off", "set", False, False)
    assert uso["guest"] == {"tx-udp-segmentation": "off [fixed]"}
    text = cli(lab, "lab", "explain", lab["name"], "client").stdout
    assert "why: tx-udp-segmentation off [fixed]: host_uso=off, VIRTIO_NET_F_HOST_USO (bit 56) not offered" in text
    # the other direction still has USO: the guest accepted USO4/6, so the tap has it
    assert rows(nic)["guest_uso4"]["tap"] == {"tx-udp-segmentation": "on"}
    assert rows(nic)["csum"]["source"] == "default" and rows(nic)["csum"]["value"] == "on"


def test_explain_from_the_hypervisor_side_shows_the_chain_of_the_tap_it_holds(lab):
    tap = lab["shown"]["hosts"]["client"]["guest"]["tap"]
    res = cli(lab, "lab", "explain", lab["name"], "server", tap, "--json")
    assert res.returncode == 0, res.stderr
    (nic,) = json.loads(res.stdout)["nics"]
    assert (nic["role"], nic["tap"], nic["tap_host"]) == ("client", tap, "server")


def test_lab_show_gives_every_effective_property_defaults_included(lab):
    shown = json.loads(cli(lab, "lab", "show", lab["name"], "--json").stdout)
    (nic,) = shown["hosts"]["client"]["guest"]["nics"]
    assert nic["properties"] == {"host_uso": "off"}  # what was asked
    eff = nic["effective_properties"]  # what QEMU has
    assert eff["host_uso"] == "off" and eff["guest_uso4"] == "on" and eff["mq"] == "off" and eff["csum"] == "on"
    text = cli(lab, "lab", "show", lab["name"]).stdout
    assert "host_uso (set)" in text and "mq (default)" in text


SHORT = ("--tool", "engine", "--proto", "udp", "--duration", "0.5", "--warmup", "0.2", "--rate", "20M")


def test_a_guest_sample_stores_the_chain_at_sample_time(lab):
    # a short paced sample: what is checked is the chain stored with it, not the guest's rate (with two
    # unpaced 2 s floods this module took 14.0 CPU-s, with these 8.9: benchmarks/suite_cpu side by side)
    res = cli(lab, "measure", lab["name"], *SHORT, "--json", timeout=180)
    assert res.returncode == 0, res.stderr
    (nic,) = json.loads(res.stdout)["guests"]["client"]["nics"]
    uso = rows(nic)["host_uso"]
    assert (uso["value"], uso["offered"], uso["guest"]) == ("off", False, {"tx-udp-segmentation": "off [fixed]"})
    text = cli(lab, "measure", lab["name"], *SHORT, timeout=180)
    assert text.returncode == 0, text.stderr
    assert ("guest       client:eth0 tx-udp-segmentation off [fixed]: host_uso=off, VIRTIO_NET_F_HOST_USO (bit 56) "
            "not offered") in text.stdout


def test_guest_rx_gro_hw_off_takes_the_taps_tso_back_and_explain_says_why(lab):
    res = cli(lab, "lab", "set", lab["name"], "client", "eth0", "rx-gro-hw=off")
    assert res.returncode == 0, res.stderr
    try:
        (nic,) = json.loads(cli(lab, "lab", "explain", lab["name"], "client", "--json").stdout)["nics"]
        tso = rows(nic)["guest_tso4"]
        assert tso["guest"] == {"rx-gro-hw": "off"} and tso["tap"] == {"tx-tcp-segmentation": "off"}
        assert "the guest switched its rx-gro-hw off" in tso["why"]
    finally:
        assert cli(lab, "restore").returncode == 0
    (nic,) = json.loads(cli(lab, "lab", "explain", lab["name"], "client", "--json").stdout)["nics"]
    assert rows(nic)["guest_tso4"]["tap"] == {"tx-tcp-segmentation": "on"}


def test_explain_refuses_an_unknown_host_in_one_line(lab):
    res = cli(lab, "lab", "explain", lab["name"], "hv9")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"offlab: error: lab {lab['name']!r} has no host 'hv9'; "
                                               f"its hosts are: client, server"]
