"""Queue and NAPI witnesses on a real veth lab: XPS, channels and threaded NAPI each say `exercised` with
the setting on, and `set but not exercised` over counters measured with it off or pointed elsewhere.

The server's veth receives through NAPI (its GRO on, the client's TSO off), which is when a veth counts
packets per receive queue; a packet sent on the client's transmit queue N arrives on receive queue N."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import module_lab, offlab_cli
from offlab.experiment.effects import EXERCISED, OFF
from offlab.metrics import NOT_EXERCISED
from tests.helpers import judge_effects


@pytest.fixture(scope="module")
def veth_lab(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    yield from module_lab(tmp_path_factory, "veth", "eq")


def _ifaces(lab: dict) -> tuple[str, str]:
    res = offlab_cli("lab", "show", lab["name"], "--json", env=lab["env"])
    assert res.returncode == 0, res.stderr
    hosts = json.loads(res.stdout)["hosts"]
    return hosts["client"]["interfaces"][0]["name"], hosts["server"]["interfaces"][0]["name"]


def _set(lab: dict, role: str, iface: str, *settings: str) -> None:
    res = offlab_cli("lab", "set", lab["name"], role, iface, *settings, env=lab["env"])
    assert res.returncode == 0, res.stderr


def _measure(lab: dict, *args: str) -> dict:
    # two seconds of traffic, all of it in the window: iperf3 takes its warm-up in whole seconds (0.5 was
    # a second more of traffic, none of it counted), and each witness here reads counts, not a steady rate
    res = offlab_cli("measure", lab["name"], "--duration", "2", "--warmup", "0", "--json", *args,
                     env=lab["env"], timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# XPS is witnessed by the queue each packet left on, not by a rate: the engine paced at 20 Mbit/s, not a flood
# taking both CPUs (this module 33.4 -> 25.6 CPU-s, benchmarks/suite_cpu side by side)
PACED = ("--tool", "engine", "--rate", "20M")


def _effect(sample: dict, setting: str, where: str) -> dict:
    [e] = [e for e in sample["effects"] if e["setting"] == setting and e["where"] == where]
    return e


@pytest.fixture
def napi_veth(veth_lab):
    """Two queues each way on both ends, the server receiving through NAPI; put back after the test."""
    c, s = _ifaces(veth_lab)
    _set(veth_lab, "client", c, "tso=off", "channels.tx=2", "channels.rx=2")
    _set(veth_lab, "server", s, "gro=on", "channels.rx=2", "channels.tx=2")
    try:
        yield veth_lab, c, s
    finally:
        res = offlab_cli("restore", env=veth_lab["env"])
        assert res.returncode == 0, res.stderr


def test_xps_steers_the_sender_to_the_mapped_queue_and_the_other_mask_is_not_exercised(napi_veth):
    lab, c, s = napi_veth
    _set(lab, "client", c, "xps.0=2", "xps.1=1")  # the engine's client runs on CPU 0
    to_1 = _measure(lab, *PACED)
    _set(lab, "client", c, "xps.0=1", "xps.1=2")
    to_0 = _measure(lab, *PACED)
    on, off = _effect(to_1, "xps.1", f"client:{c}"), _effect(to_1, "xps.0", f"client:{c}")
    assert on["status"] == EXERCISED and on["counters"]["counted_at"] == f"server:{s} rx"
    assert off["status"] == NOT_EXERCISED and "CPU 0" in off["cause"]
    assert on["counters"]["queues"]["0"] < 0.01 * on["counters"]["queues"]["1"]  # an ARP may take queue 0
    # the masks swapped: every packet now leaves on queue 0
    assert _effect(to_0, "xps.0", f"client:{c}")["status"] == EXERCISED
    assert _effect(to_0, "xps.1", f"client:{c}")["status"] == NOT_EXERCISED
    queues = _effect(to_0, "xps.0", f"client:{c}")["counters"]["queues"]
    assert queues["1"] < 0.01 * queues["0"]


def test_two_receive_queues_carry_parallel_streams_and_one_does_not(napi_veth):
    lab, c, s = napi_veth
    two = _measure(lab, "--streams", "12")
    e = _effect(two, "channels.rx", f"server:{s}")
    assert e["status"] == EXERCISED and len([n for n in e["counters"]["queues"].values() if n > 0]) == 2, e
    _set(lab, "server", s, "channels.rx=1")
    one = _measure(lab, "--streams", "12")
    assert _effect(one, "channels.rx", f"server:{s}")["status"] == OFF
    e = _effect(one, "channels.tx", f"client:{c}")
    assert e["status"] == NOT_EXERCISED and f"server:{s} has 1 receive queue(s)" in e["cause"], (e, one["probes"])


def test_threaded_napi_is_exercised_by_its_kernel_thread_and_not_when_off(napi_veth):
    lab, c, s = napi_veth
    _set(lab, "server", s, "threaded=on")
    on = _measure(lab)
    _set(lab, "server", s, "threaded=off")
    off = _measure(lab)
    e = _effect(on, "threaded", f"server:{s}")
    assert e["status"] == EXERCISED and e["counters"]["napi_threads_cpu_pct"] > 0
    assert _effect(off, "threaded", f"server:{s}")["status"] == OFF
    [judged] = [x for x in judge_effects(off, [{"where": f"server:{s}", "key": "threaded", "value": "on"}])
                if x["setting"] == "threaded"]
    assert judged["status"] == NOT_EXERCISED


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_xps_in_a_multiqueue_guest_is_witnessed_by_its_transmit_queues(tmp_path_factory):
    """A guest with 2 vCPUs and 2 queue pairs (its sender is not pinned: a guest's CPUs are its own): both
    vCPUs mapped to one queue send everything there, which its mq qdisc's child counts (virtio-net's own
    per-queue counters count only XDP)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    for lab in module_lab(tmp_path_factory, "vm", "eg", "--nic", "queues=2", "--guest-cpus", "2", timeout=240):
        _set(lab, "client", "eth0", "xps.0=0", "xps.1=3")
        to_1 = _measure(lab, *PACED)
        _set(lab, "client", "eth0", "xps.1=0", "xps.0=3")
        to_0 = _measure(lab, *PACED)
        on = _effect(to_1, "xps.1", "client:eth0")
        assert on["status"] == EXERCISED and on["counters"]["counted_at"] == "client:eth0 qdisc", on["detail"]
        assert on["counters"]["queues"]["0"] < 0.01 * on["counters"]["queues"]["1"]
        assert _effect(to_0, "xps.0", "client:eth0")["status"] == EXERCISED
        [judged] = [x for x in judge_effects(to_0, [{"where": "client:eth0", "key": "xps.1", "value": "0x3"}])
                    if x["setting"] == "xps.1"]
        assert judged["status"] == NOT_EXERCISED and "sent from CPU" not in judged["cause"], judged  # not pinned
