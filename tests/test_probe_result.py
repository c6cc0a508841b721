"""The probe result is a dataclass between `probes` and the sample, and JSON only where it is stored:
a sample stores the same `probes` keys, in the same order, as one stored before the dataclass
(tests/fixtures/samples/veth_iperf3_big_packets.json: `offlab measure LAB --tool iperf3 --duration 1
--big-packets --json` on a veth lab named cav1, at commit 35a0cf7)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from offlab.experiment.measure import measure
from offlab.probes import ProbeResult
from offlab.probes.base import found
from offlab.sample import CpuAccount, LocalSampling, Probes, TestpmdSettings
from offlab.traffic import Workload
from tests.conftest import requires_root

BEFORE = os.path.join(os.path.dirname(__file__), "fixtures", "samples", "veth_iperf3_big_packets.json")
BEFORE_LAB = "cav1"


def stored(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))  # as the store writes a sample


def shape(value: Any, lab: str) -> Any:
    """The keys of `value` at every depth (a lab's name in them made LAB; a list: its elements' shapes)."""
    if isinstance(value, dict):
        return {str(k).replace(lab, "LAB"): shape(v, lab) for k, v in value.items()}
    if isinstance(value, list):
        return sorted({json.dumps(shape(v, lab), sort_keys=True) for v in value})
    return "value"


def stored_by_probe(**values: Any) -> dict[str, tuple[int, Any]]:
    """A probe's key → (its slot, its stored value), as the session gives ProbeResult its probes'."""
    slots = {p.key: p.slot for p in found()}
    return {k: (slots[k], v) for k, v in values.items()}


def test_a_stored_samples_probes_are_the_fields_of_a_probe_result_and_come_back_byte_for_byte():
    with open(BEFORE) as f:
        probes = json.load(f)["probes"]
    keys = {p.key for p in found()}
    # every stored key is a field or a probe's (offlab/probes/edge/), and no field is missing
    read = Probes.from_json(probes)
    result = ProbeResult(**{k: getattr(read, k) for k in probes if k not in keys},
                         found=stored_by_probe(**{k: v for k, v in probes.items() if k in keys}))
    assert stored(result.stored().to_json()) == stored(probes)


def test_keys_that_do_not_apply_are_left_out_and_the_ones_measure_adds_come_last():
    r = ProbeResult(window_s=1.0, t0_mono_s=2.0, reads={}, cpu=CpuAccount(), processes=[], interfaces={}, snmp={},
                    aligned=None, testpmd_settings=TestpmdSettings(fwd="io"),
                    found=stored_by_probe(big_packets={}, qdisc={}, softnet={}, queues=None, testpmd=None))
    assert list(r.stored().to_json()) == ["window_s", "t0_mono_s", "reads", "cpu", "processes", "interfaces",
                                          "snmp", "softnet", "qdisc", "big_packets", "testpmd_settings"]
    r.mtus, r.local_sampling = {"client:eth0": 1500}, LocalSampling(samples=3)
    assert list(r.stored().to_json()) == ["window_s", "t0_mono_s", "reads", "local_sampling", "cpu", "processes",
                                          "interfaces", "snmp", "softnet", "qdisc", "big_packets", "mtus",
                                          "testpmd_settings"]


@requires_root
@pytest.mark.network
def test_a_sample_measured_now_stores_the_probe_keys_a_sample_stored_before(veth_lab):
    with open(BEFORE) as f:
        before = json.load(f)
    w = Workload(tool="iperf3", protocol="tcp", duration=1.0, warmup=1.0, big_packets=True)
    now = json.loads(stored(measure(veth_lab, w).to_json()))
    assert list(now) == list(before)
    # a probe newer than the stored sample (a module of offlab/probes/edge/ with a key it lacks) adds its
    # key after all of these; every key it had comes first, in its order, with its shape
    old = list(now["probes"])[:len(before["probes"])]
    assert old == list(before["probes"])
    assert set(list(now["probes"])[len(old):]) <= {p.key for p in found()} - set(old)
    assert shape({k: now["probes"][k] for k in old}, veth_lab.name) == shape(before["probes"], BEFORE_LAB)


# A window over made-up counters: three local hosts read through their anchors and a server with a kernel
# of its own (its CPUs, its clock, this machine's counters sampled while its reads were under way)
DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0
  eth0: {b} {p} 0 {d} 0 0 0 0 {b2} {p2} 0 0 0 0 0 0
  eth1: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0
"""
SNMP = "Udp: InDatagrams NoPorts InErrors OutDatagrams\nUdp: {a} 0 {e} {o}\nIp: Forwarding InReceives\nIp: 1 {a}\n"
ROLES = ("client", "server", "router")


def _stat(k: int) -> dict[str, dict[str, int]]:
    return {f"cpu{i}": {"user": 100 * k + 10 * i, "nice": 1, "system": 200 * k, "idle": 500 * k, "iowait": 0,
                        "irq": 0, "softirq": 100 * k + i, "steal": i, "guest": 0, "guest_nice": 0} for i in range(3)}


def _snapshot(t: float, k: int, server_clock: float) -> Any:
    from offlab.probes import Snapshot, counters

    return Snapshot(
        t=t, stat=_stat(k), procs={11: ("iperf3", 50 * k), 12: ("ksoftirqd/0", 3 * k), 13: ("idle", 4)},
        netdev={r: counters.parse_net_dev(DEV.format(b=1000 * k, p=10 * k, d=k, b2=64000 * k, p2=k)) for r in ROLES},
        snmp={r: counters.parse_snmp(SNMP.format(a=5 * k, e=k, o=7 * k)) for r in ROLES},
        guest_stat={"server": _stat(k - 1 if k > 1 else 0)},
        reads={"client": (t - 0.002, t - 0.001), "router": (t - 0.0015, t - 0.0012), "server": (t - 0.5, t + 0.7)},
        clocks={"server": server_clock})


def made_up_result(client_cpu: int | None) -> Any:
    """ProbeSession.result over two made-up snapshots, with no lab: what it computes from them alone."""
    from offlab.probes import ProbeSession

    s = ProbeSession.__new__(ProbeSession)
    s.own_kernel, s.pids, s.probes, s.trace, s.hist = {"server": object()}, {"client": 11}, [], None, None
    s.exchanges = {"server": [(0.9, 1000.95, 1.0), (9.5, 1009.6, 9.7)]}
    sampled = lambda k: {r: (SNMP.format(a=5 * k, e=k, o=7 * k), "") for r in ("client", "router")}  # noqa: E731
    s.samples = [(9.5, 9.51, sampled(1)), (10.0, 10.01, sampled(2)), (12.0, 12.01, sampled(5)), (12.4, 12.41, sampled(6))]
    s._sampler, s._sampling, s.sampling_cpu_s = object(), False, 0.01234
    s._stop_sampling = lambda: None  # no sampler thread to stop
    return s.result(_snapshot(10.0, 1, 1010.0), _snapshot(12.5, 3, 1012.5), client_cpu=client_cpu, server_cpu=2)


def roles_sorted(probes: dict) -> dict:
    """`probes` with the maps the session fills in a set's order sorted by role: `reads`, and `aligned`'s."""
    out = dict(probes, reads=dict(sorted(probes["reads"].items())))
    if "aligned" in out:
        out["aligned"] = {k: dict(sorted(v.items())) for k, v in out["aligned"].items()}
    return out


WINDOW_BEFORE = os.path.join(os.path.dirname(__file__), "fixtures", "samples", "made_up_window_probes.json")


@pytest.mark.parametrize("client_cpu", [1, None])
def test_a_sessions_result_stores_what_it_stored_before_its_fields_were_views(client_cpu):
    # the fixture: the same window's `probes`, and its CPU as an rr phase stores it, by offlab at 7fbbe39
    # (ProbeResult.to_dict), before the session made views
    with open(WINDOW_BEFORE) as f:
        before = json.load(f)[str(client_cpu)]
    r = made_up_result(client_cpu)
    assert stored(roles_sorted(r.stored().to_json())) == stored(before["probes"])
    assert stored(r.cpu.without_per_cpu().to_json()) == stored(before["rr_cpu"])
