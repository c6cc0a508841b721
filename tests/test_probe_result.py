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
from offlab.sample import CpuAccount, Probes, TestpmdSettings
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
    r.mtus, r.local_sampling = {"client:eth0": 1500}, {"samples": 3}
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
