"""Effect witnesses on real labs: each says `exercised` with its setting on, and the same witness over the
counters measured with the setting off says `set but not exercised` (so the test fails if the setting
did nothing). testpmd's no-op (GRO in io forwarding) is warned at `lab set` and `--validate`, flagged in
the sample and marked in results show, compare, the headline verdicts and the report."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest

from conftest import module_lab
from offlab.experiment.effects import EXERCISED
from offlab.metrics import NOT_EXERCISED
from tests.helpers import judge_effects, run, run_with_env

HAVE_TESTPMD = shutil.which("dpdk-testpmd") is not None
ROOT = os.geteuid() == 0


def _cli(env: dict, *args: str):
    """`offlab ARGS` in this process with the lab's state directory (a Python start-up saved per call):
    these tests are about what the witnesses say, not the process edge."""
    return run_with_env(env, *args)


def _set(lab: dict, host: str, iface: str, *settings: str):
    res = _cli(lab["env"], "lab", "set", lab["name"], host, iface, *settings)
    assert res.returncode == 0, res.stderr
    return res


def _measure(lab: dict, *args: str) -> dict:
    # 1 s, no warm-up: each witness reads counts (super-packets, merges, steered packets), which one
    # second of traffic holds at any load (iperf3 takes a warm-up in whole seconds: 0.3 was a second
    # more of traffic, none of it counted)
    res = _cli(lab["env"], "measure", lab["name"], "--duration", "1", "--warmup", "0", "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _restore(lab: dict) -> None:
    res = _cli(lab["env"], "restore")
    assert res.returncode == 0, res.stderr


def _effect(sample: dict, setting: str, where: str | None = None) -> dict:
    found = [e for e in sample["effects"] if e["setting"] == setting and (where is None or e["where"] == where)]
    assert len(found) == 1, sample["effects"]
    return found[0]


def _judged_on(sample: dict, where: str, key: str) -> dict:
    """The witness of `key`=on over a sample measured with it off: what it says when the setting did nothing."""
    [e] = [e for e in judge_effects(sample, [{"where": where, "key": key, "value": "on"}]) if e["setting"] == key]
    return e


# ---- kernel segmentation, merging, MTU on a bridge lab ----------------------------------------

@pytest.fixture(scope="module")
def bridge_lab(tmp_path_factory):
    if not ROOT:
        pytest.skip("needs root")
    yield from module_lab(tmp_path_factory, "bridge", "eb")


def _iface(sample: dict, role: str, busiest: str) -> str:
    """`role`'s interface that carried the most packets in direction `busiest` (rx/tx)."""
    names = [n for n in sample["probes"]["interfaces"] if n.startswith(f"{role}:")]
    assert names, (f"no interface of {role} moved in the sample", sample["traffic"], sample["probes"]["interfaces"],
                   sample["probes"].get("reads"), sample.get("notes"))
    return max(names, key=lambda n: sample["probes"]["interfaces"][n][f"{busiest}_packets"])


def test_tso_is_exercised_on_and_not_off(bridge_lab):
    try:
        _set(bridge_lab, "client", "to-switch", "tso=off")
        off = _measure(bridge_lab)
        _set(bridge_lab, "client", "to-switch", "tso=on")
        on = _measure(bridge_lab)
    finally:
        _restore(bridge_lab)
    where = _iface(on, "client", "tx")
    e = _effect(on, "tso", where)
    assert e["status"] == EXERCISED and e["counters"]["next_hop"].startswith("switch:")
    assert _judged_on(off, where, "tso")["status"] == NOT_EXERCISED


def test_gro_on_the_switch_merges_wire_size_packets_and_not_when_off(bridge_lab):
    try:
        _set(bridge_lab, "client", "to-switch", "tso=off")
        _set(bridge_lab, "switch", "to-client", "gro=off")
        off = _measure(bridge_lab)
        _set(bridge_lab, "switch", "to-client", "gro=on")
        on = _measure(bridge_lab)
    finally:
        _restore(bridge_lab)
    where = _iface(on, "switch", "rx")
    e = _effect(on, "gro", where)
    assert e["status"] == EXERCISED and e["counters"]["after_per_received"] < 0.5
    assert _judged_on(off, where, "gro")["status"] == NOT_EXERCISED


def test_uso_with_udp_segment_is_exercised_and_not_when_off(bridge_lab):
    try:
        _set(bridge_lab, "client", "to-switch", "uso=off")
        off = _measure(bridge_lab, "--tool", "engine", "--size", "1472", "--gso")
        _set(bridge_lab, "client", "to-switch", "uso=on")
        on = _measure(bridge_lab, "--tool", "engine", "--size", "1472", "--gso")
    finally:
        _restore(bridge_lab)
    where = _iface(on, "client", "tx")
    assert _effect(on, "uso", where)["status"] == EXERCISED
    assert _effect(off, "uso", where)["status"] == "off"
    assert _judged_on(off, where, "uso")["status"] == NOT_EXERCISED
    assert _effect(on, "workload gso (UDP_SEGMENT)")["status"] == EXERCISED


def test_jumbo_mtu_is_exercised_on_every_hop_and_not_on_one(bridge_lab):
    hops = [("client", "to-switch"), ("switch", "to-client"), ("switch", "to-server"), ("switch", "br0"),
            ("server", "to-switch")]
    try:
        _set(bridge_lab, "client", "to-switch", "tso=off")
        _set(bridge_lab, "client", "to-switch", "mtu=9000")
        one = _measure(bridge_lab)
        for host, iface in hops[1:]:
            _set(bridge_lab, host, iface, "mtu=9000")
        every = _measure(bridge_lab)
    finally:
        _restore(bridge_lab)
    where = _iface(one, "client", "tx")
    e = _effect(one, "mtu", where)
    assert e["status"] == NOT_EXERCISED and e["counters"]["path_smallest_mtu"] == 1500
    e = _effect(every, "mtu", where)
    assert e["status"] == EXERCISED and e["counters"]["largest_frame_at_least"] > 1514


def test_rps_to_another_cpu_is_exercised_and_not_when_off(bridge_lab):
    """The sender runs on CPU 0 (the veth's packets arrive there); RPS to CPU 1 needs an interrupt per batch."""
    try:
        _set(bridge_lab, "server", "to-switch", "rps=0")
        off = _measure(bridge_lab)
        _set(bridge_lab, "server", "to-switch", "rps=2")
        on = _measure(bridge_lab)
    finally:
        _restore(bridge_lab)
    where = _iface(on, "server", "rx")
    e = _effect(on, "rps", where)
    assert e["status"] == EXERCISED and e["counters"]["received_rps"]["1"] > 0
    [judged] = [x for x in judge_effects(off, [{"where": where, "key": "rps", "value": "2"}]) if x["setting"] == "rps"]
    assert judged["status"] == NOT_EXERCISED


# ---- --validate without a lab ----------------------------------------------------------------

@pytest.mark.parametrize("body, fragment", [
    ("topology: {kind: dpdk}\naxes: {g: {on: {testpmd: {gro: maybe}}}}",
     "axes.g.on.testpmd.gro: testpmd.gro: expected on or off, got 'maybe'"),
    ("topology: {kind: dpdk}\naxes: {g: {on: {testpmd: {gso_segsz: 9000}}}}", "9000 is out of range 64..1514"),
    ("topology: {kind: dpdk}\naxes: {g: {on: {testpmd: {csum: {tcp: 0:hw:x}}}}}", "expected hw or sw"),
])
def test_validate_refuses_a_testpmd_value_lab_set_would_refuse(tmp_path, body, fragment):
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: p\nworkload: {{tool: iperf3}}\n{body}\n")
    res = run("run", str(plan), "--validate")
    assert res.returncode == 2 and fragment in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_validate_refuses_a_nic_property_lab_up_refuses(tmp_path, state_dir):
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\ntopology: {kind: vm, nic: {nosuch: 1}}\nworkload: {tool: iperf3}\n")
    res = run("run", str(plan), "--validate")
    assert res.returncode == 2, res.stderr
    assert "topology.nic: QEMU " in res.stderr and "has no property nosuch" in res.stderr
    up = run("lab", "up", "vm", "--name", "efnic", "--nic", "nosuch=1")  # refused before anything is built
    assert up.returncode == 2 and "has no property nosuch" in up.stderr


def test_validate_warns_of_tso_and_uso_with_nothing_to_segment(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(textwrap.dedent("""\
        name: p
        topology: {kind: veth}
        workload: {tool: engine, protocol: udp, size: 1472}
        axes:
          seg:
            tso: {features: {client: {tso: on}}}
            uso: {features: {client: {uso: on}}}
            uso-gso: {features: {client: {uso: on}}, workload: {gso: true}}
        """))
    res = run("run", str(plan), "--validate")
    assert res.returncode == 0, res.stderr
    warned = [l for l in res.stderr.splitlines() if l.startswith("warning:")]
    assert warned == ["warning: cell seg=tso: client tso=on does nothing for a UDP workload (TSO segments TCP)",
                      "warning: cell seg=uso: client uso=on has nothing to segment: UDP datagrams are sent one by "
                      "one unless the workload sets gso (UDP_SEGMENT, the engine's)"]


# ---- testpmd ---------------------------------------------------------------------------------

PLAN_GRO_IO = """\
name: gro-io
topology: {kind: dpdk, testpmd_idle: stop}
workload: {tool: iperf3, duration: 1, warmup: 0}
baseline: {gro: off}
repeat: {min: 2, max: 2}
axes:
  gro:
    on: {testpmd: {gro: on}}
    off: {testpmd: {gro: off}}
"""


@pytest.mark.skipif(not ROOT or not HAVE_TESTPMD, reason="needs root and dpdk-testpmd")
def test_a_run_with_testpmd_gro_in_io_forwarding_marks_the_cell_everywhere(tmp_path, clean_machine):
    plan, db = tmp_path / "gro-io.yaml", tmp_path / "r.db"
    plan.write_text(PLAN_GRO_IO)
    res = run("run", str(plan), "--validate")
    assert res.returncode == 0, res.stderr
    assert "warning: cell gro=on: testpmd.gro=on does nothing with testpmd.fwd=io" in res.stderr
    res = run("run", str(plan), "--db", str(db))
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert f"⚠ {NOT_EXERCISED} in the cell gro=on: testpmd.gro=on at switch (testpmd port 0, rx) in 2 of 2" in text
    shown = run("results", "show", "1", "--db", str(db))
    assert f"{NOT_EXERCISED}: gro=on: testpmd.gro=on" in " ".join(shown.stdout.split())
    cells = {c["key"]: c for c in json.loads(run("results", "show", "1", "--db", str(db), "--json").stdout)["cells"]}
    assert "fwd is io" in cells["gro=on"]["not_exercised"] and cells["gro=off"]["not_exercised"] is None
    compared = run("compare", "1", "--db", str(db))
    assert f"{NOT_EXERCISED} (cell gro=on)" in " ".join(compared.stdout.split())
    rep = tmp_path / "r.html"
    assert run("report", "1", "--db", str(db), "-o", str(rep)).returncode == 0
    assert f"<b>{NOT_EXERCISED}</b>: gro=on: testpmd.gro=on" in rep.read_text()


@pytest.fixture(scope="module")
def dpdk_lab(tmp_path_factory):
    if not ROOT or not HAVE_TESTPMD:
        pytest.skip("needs root and dpdk-testpmd")
    yield from module_lab(tmp_path_factory, "dpdk", "ef", "--testpmd-idle", "stop", timeout=180)


def test_testpmd_gro_in_io_forwarding_is_warned_at_lab_set_and_flagged_in_the_sample(dpdk_lab):
    try:
        res = _set(dpdk_lab, "switch", "-", "testpmd.gro=on")
        assert "warning: testpmd.gro=on does nothing with testpmd.fwd=io" in res.stderr
        sample = _measure(dpdk_lab)
        e = _effect(sample, "testpmd.gro")
        assert e["status"] == NOT_EXERCISED
        assert e["cause"] == "testpmd GRO runs only in its csum forwarding engine; fwd is io"
        assert e["counters"]["out_per_in"] > 0.9
        shown = _cli(dpdk_lab["env"], "measure", dpdk_lab["name"], "--duration", "1", "--warmup", "0")
        assert shown.returncode == 0, shown.stderr
        assert "set but not exercised testpmd.gro=on" in " ".join(shown.stdout.split())
        res = _set(dpdk_lab, "switch", "-", "testpmd.fwd=csum")
        assert "warning" not in res.stderr  # csum forwarding: GRO runs
    finally:
        _restore(dpdk_lab)


def test_testpmd_gro_and_gso_are_exercised_in_csum_forwarding_and_not_when_off(dpdk_lab):
    """GSO at 1414 B cuts each 1514 B frame in two (2 out per in); GRO merges first (fewer)."""
    base = ("testpmd.fwd=csum", "testpmd.csum.ip=hw", "testpmd.csum.tcp=hw", "testpmd.gso=on",
            "testpmd.gso_segsz=1414")
    try:
        _set(dpdk_lab, "switch", "-", *base, "testpmd.gro=on")
        on = _measure(dpdk_lab)
        _set(dpdk_lab, "switch", "-", "testpmd.gro=off")
        off = _measure(dpdk_lab)
        _set(dpdk_lab, "switch", "-", "testpmd.gso=off")
        neither = _measure(dpdk_lab)
    finally:
        _restore(dpdk_lab)
    assert _effect(on, "testpmd.gro")["status"] == EXERCISED
    assert _effect(off, "testpmd.gso")["status"] == EXERCISED
    # the same witnesses over the counters with GRO off / GSO off: nothing to show
    off["probes"]["testpmd_settings"]["ports"]["0"]["gro"]["on"] = True
    assert _effect({**off, "effects": judge_effects(off, [])}, "testpmd.gro")["status"] == NOT_EXERCISED
    neither["probes"]["testpmd_settings"]["ports"]["1"]["gso"].update(on=True, segsz=1414)
    assert _effect({**neither, "effects": judge_effects(neither, [])}, "testpmd.gso")["status"] == NOT_EXERCISED
