"""Plans: the suites are valid; bad plans get the right message (file:line: field) and exit 2."""

from __future__ import annotations

import os
import textwrap

import pytest

from offlab.errors import BadInput
from offlab.experiment import suites
from offlab.experiment.plan import load_plan
from tests.conftest import offlab_cli, requires_root

GOOD = textwrap.dedent("""\
    name: t
    topology: {kind: bridge}
    axes:
      payload:
        - {udp_payload: 1472, mtu: 1500}
        - {udp_payload: 8972, mtu: 9000}
      offload:
        off: {features: {client: {tx-udp-segmentation: off}}, workload: {gso: false}}
        on:  {features: {client: {uso: on}}, workload: {gso: true}}
    workload: {tool: engine, protocol: udp, duration: 1}
    repeat: {min: 2, max: 4, level: 99, width: 5}
    baseline: {offload: off}
    capture: {on: server, frames: 100}
    """)


def test_a_good_plan_expands_to_the_cartesian_product_with_yaml_12_booleans():
    p = load_plan(GOOD, "t.yaml")
    assert [c.key for c in p.cells] == [
        "payload=1472@1500,offload=off", "payload=1472@1500,offload=on",
        "payload=8972@9000,offload=off", "payload=8972@9000,offload=on"]
    cell = p.cells[3]
    assert cell.topology.mtu == 9000 and cell.workload.size == 8972 and cell.workload.gso is True
    assert cell.changes == (("client", "uso", "on"),)  # `on` stayed a name, not True
    assert p.baseline == {"offload": "off"} and p.capture.host == "server"
    assert len({c.lab_key for c in p.cells}) == 2  # one lab per MTU


def test_only_and_exclude_filter_cells():
    p = load_plan(GOOD + "only: [{payload: 1472@1500}]\n", "t.yaml")
    assert [c.key for c in p.cells] == ["payload=1472@1500,offload=off", "payload=1472@1500,offload=on"]
    with pytest.raises(BadInput, match="baseline .* matches no cell"):
        load_plan(GOOD + "exclude: [{offload: off}]\n", "t.yaml")


@pytest.mark.parametrize("name, seeds", [
    ("uso", ["Seed 000"]), ("gro-gso", ["Seed 001"]), ("vxlan", ["Seed 003"]), ("jumbo", ["Seed 004"]),
    ("pps", ["Seed 002"]), ("quick", ["seed 000", "seed 001", "seed 004"]),
    ("uso-vm", ["Seed 000"]), ("gro-gso-vm", ["Seed 001"]), ("kernels", ["Seed 000", "VIRTIO_NET_F_HOST_USO"]),
    ("big-tcp", ["Issue 29", "185000-byte", "net/big_tcp.sh"]),
    ("send-paths", ["Issue 29", "SO_EE_CODE_ZEROCOPY_COPIED"]),
    ("dpdk-gro", ["Seed 001", "+49 %", "+63 %"]), ("dpdk-gso", ["Seed 001", "+33 %", "+55 %"]),
])
def test_every_builtin_suite_is_valid_and_names_its_seed(name, seeds):
    plans = suites.plans(name)
    assert plans and all(p.cells for p in plans)
    description = suites.description(name)
    for seed in seeds:
        assert seed in description, description[:200]


def test_every_builtin_suite_validates_in_full_and_quick():
    for name in suites.names():
        for quick in (False, True):
            assert all(p.cells for p in suites.plans(name, quick=quick)), name


def test_dpdk_suites_carry_the_settings_a_cell_needs_and_quick_boots_one_guest():
    gro = suites.plans("dpdk-gro", quick=True)[0]
    assert {c.topology.kind for c in gro.cells} == {"dpdk-vm"} and len({c.lab_key for c in gro.cells}) == 1
    for c in gro.cells:  # every cell: csum forwarding, vhost-port TCP checksum hw, the guest's tcp_rmem set
        assert {("switch", "testpmd.fwd", "csum"), ("switch", "testpmd.csum.tcp", "hw")} <= set(c.changes), c.key
        assert any(k == "net.ipv4.tcp_rmem" for _, k, _ in c.changes), c.key
    dpdk = next(c for c in gro.cells if c.params["gro"] == "dpdk-gro")
    assert {("switch", "testpmd.gro", "on"), ("server", "gro", "off")} <= set(dpdk.changes)
    gso = suites.plans("dpdk-gso", quick=True)[0]
    assert {c.workload.reverse for c in gso.cells} == {True}  # the guest sends
    # --quick: one guest (host_tso4 on); the guest segments when its TSO is off, as with host_tso4 off
    assert {str(c.topology.nic.get("host_tso4")) for c in gso.cells} == {"on"} and len({c.lab_key for c in gso.cells}) == 1
    dpdk = next(c for c in gso.cells if c.params["gso"] == "dpdk-gso")
    assert {("switch", "testpmd.gso", "0:on"), ("switch", "testpmd.csum.ip", "0:hw")} <= set(dpdk.changes)
    kernel = next(c for c in gso.cells if c.params["gso"] == "kernel-gso")
    assert {("server", "tso", "off"), ("server", "gso", "on")} <= set(kernel.changes)
    full = suites.plans("dpdk-gso")[0]  # the full run adds the seed's own host_tso4=off guest
    assert sorted({str(c.topology.nic.get("host_tso4")) for c in full.cells}) == ["off", "on"]


def test_gro_gso_vm_boots_one_guest_per_nic_and_compares_each_direction_with_tso():
    p = suites.plans("gro-gso-vm")[0]
    nics = {c.lab_key: c.topology.nic for c in p.cells}
    assert sorted(map(str, nics.values())) == sorted(map(str, [
        {"host_tso4": "on", "guest_tso4": "on"}, {"host_tso4": "off", "guest_tso4": "off"},
        {"csum": "off", "guest_csum": "off"}]))  # three guests, however many cells
    assert {c.workload.reverse for c in p.cells} == {False, True}
    assert p.baseline == {"placement": "tso", "tap": "negotiated"}
    # --quick: TSO vs the guest's kernel GSO guest→host, switched in the guest tso boots
    q = suites.plans("gro-gso-vm", quick=True)[0]
    assert [c.topology.nic for c in q.cells if c.lab_key != q.cells[0].lab_key] == []
    off = next(c for c in q.cells if c.params["placement"] == "tso-off")
    assert ("client", "tso", "off") in off.changes and off.workload.reverse is False


def test_quick_mode_decides_the_headline_within_a_budget_and_shortens_the_width_rule():
    p = suites.plans("uso", quick=True)[0]
    assert p.budget_s == 120 and p.shape_rounds == 2 and p.headline
    w = load_plan(suites.text("uso").replace("width: 10}", "width: 10, until: width}"), "uso", quick=True)
    assert (w.repeat.min, w.repeat.max, w.repeat.width) == (1, 2, 20) and w.budget_s is None


BAD = [
    ("unknown top-level key", GOOD + "repaet: {min: 3}\n", "t.yaml:14: ", "unknown field 'repaet'; did you mean 'repeat'?"),
    ("unknown topology", GOOD.replace("kind: bridge", "kind: mesh"), "t.yaml:2", "topology.kind"),
    ("mtu out of range", GOOD.replace("mtu: 9000", "mtu: 99999"), "t.yaml:6: axes.payload.1.mtu: ",
     "less than or equal to 65535 (got 99999)"),
    ("unknown feature", GOOD.replace("tx-udp-segmentation: off", "tx-udp-segmentaton: off"), "t.yaml:8",
     "did you mean tx-udp-segmentation"),
    ("feature value", GOOD.replace("uso: on", "uso: maybe"), "t.yaml:9", "must be on or off"),
    ("wrong type", GOOD.replace("duration: 1", "duration: fast"), "t.yaml:10", "workload.duration"),
    ("unknown workload key", GOOD.replace("duration: 1", "duraton: 1"), "t.yaml:10", "did you mean 'duration'"),
    ("baseline no cell", GOOD.replace("baseline: {offload: off}", "baseline: {offload: maybe}"), "t.yaml:12",
     "unknown value of axis 'offload' 'maybe'"),
    ("baseline unknown axis", GOOD.replace("baseline: {offload: off}", "baseline: {offlaod: off}"), "t.yaml:12",
     "did you mean 'offload'"),
    ("repeat max < min", GOOD.replace("min: 2, max: 4", "min: 5, max: 4"), "t.yaml:11", "max (4) must be ≥ min (5)"),
    ("confidence level", GOOD.replace("level: 99", "level: 100"), "t.yaml:11", "repeat.level"),
    ("unknown metric", GOOD.replace("width: 5}", "width: 5, metric: speed}"), "t.yaml:11", "unknown metric"),
    ("bad host", GOOD.replace("{client: {uso: on}}", "{'client;rm': {uso: on}}"), "t.yaml:9", "is not a host"),
    ("axis not a list", GOOD.replace("  payload:\n    - {udp_payload: 1472, mtu: 1500}\n    - {udp_payload: 8972, mtu: 9000}\n",
                                     "  payload: 1472\n"), "t.yaml:4", "must be a list or a mapping"),
    ("unknown axis key", GOOD.replace("{udp_payload: 1472, mtu: 1500}", "{udp_paylod: 1472, mtu: 1500}"), "t.yaml:5",
     "did you mean 'udp_payload'"),
    ("two axes set one knob", GOOD.replace("{udp_payload: 8972, mtu: 9000}", "{udp_payload: 8972, mtu: 9000, gso: true}"),
     "t.yaml:7: axes.offload: ", "axes 'payload' and 'offload' both set gso"),
    ("not yaml", "name: [unclosed\n", "t.yaml:2", "not valid YAML"),
    ("missing workload", "name: t\ntopology: {kind: veth}\n", "t.yaml:1", "missing required field 'workload'"),
    ("budget", GOOD + "budget: soon\n", "t.yaml:14", "budget is seconds"),
    ("search needs engine", GOOD.replace("tool: engine", "tool: iperf3, search_max_loss: 0.001").replace("gso: false", "rate: 1G")
     .replace("gso: true", "rate: 2G"), "t.yaml:10", "zero-loss search needs tool: engine"),
]


@pytest.mark.parametrize("case, text, where, needle", BAD, ids=[b[0] for b in BAD])
def test_bad_plans_name_file_line_and_field(case, text, where, needle):
    with pytest.raises(BadInput) as err:
        load_plan(text, "t.yaml")
    msg = str(err.value)
    assert msg.startswith(where), msg
    assert needle in msg, msg
    assert "\n" not in msg


KNOB_PLACES = [
    ("ovs-dpdk", "{switch:dpdk0: {gro: off}}", "gro: switch:dpdk0 is an OVS-DPDK port, "
     "not a kernel interface; its one setting is mtu (its mtu_request)"),
    ("ovs-dpdk", "{switch:dpdk0: {mtu: 40}}", "mtu 40 is out of range: an MTU is 68..65535"),
    ("veth", "{client: {gso_max_size: 600000}}", "client gso_max_size=600000: more than "
     "a veth's tso_max_size, 524280; use at most 524280"),
    ("bridge", "{switch:br0: {gro_flush_timeout: -1}}", "gro_flush_timeout takes an integer 0..1000000000, got -1"),
    ("veth", "{client: {mtu: 9000}, machine: {net.core.busy_poll: 2147483648}}",
     "net.core.busy_poll takes an integer 0..2147483647, got 2147483648"),
    ("veth", "{machine: {grp: on}}", "unknown feature 'grp'"),  # a feature's name is judged before its place
    ("veth", "{machine: {tso: on}}", "'machine' takes host-wide sysctls only (net.*, kernel.*, vm.*), not 'tso'"),
    ("dpdk", "{client: {testpmd.gro: on}}", "testpmd.gro is a setting of the testpmd on host switch, not of client"),
    ("dpdk", "{switch: {testpmd.burst: 0}}", "testpmd.burst"),
    ("veth", "{client: {nf_call_iptables: 0}}", "nf_call_iptables is a per-bridge setting; client is not a bridge "
     "(a veth lab's bridges: )"),
    ("bridge", "{switch: {mtu: 1500}}", "mtu is a setting of an interface: host 'switch' of a bridge lab has several "
     "interfaces"),
]


@pytest.mark.parametrize("kind, settings, needle", KNOB_PLACES, ids=[f"{k}-{s}" for k, s, _ in KNOB_PLACES])
def test_each_knob_judges_its_value_and_place_in_a_plan(kind, settings, needle):
    text = (f"name: t\ntopology: {{kind: {kind}}}\naxes:\n  x:\n    a: {{settings: {settings}}}\n"
            "workload: {tool: engine, duration: 1}\n")
    with pytest.raises(BadInput) as err:
        load_plan(text, "t.yaml")
    assert needle in str(err.value), str(err.value)


def test_bad_plan_on_the_cli_exits_2_without_running(tmp_path, state_dir):
    plan = tmp_path / "bad.yaml"
    plan.write_text(BAD[3][1])
    res = offlab_cli("run", str(plan), "--db", str(tmp_path / "x.db"))
    assert res.returncode == 2, res.stderr
    assert "bad.yaml:8" in res.stderr and "Traceback" not in res.stderr
    assert list((state_dir / "labs").glob("*")) == []  # no lab was even begun


def test_validate_lists_cells_without_running(tmp_path):
    plan = tmp_path / "good.yaml"
    plan.write_text(GOOD)
    res = offlab_cli("run", str(plan), "--validate")
    assert res.returncode == 0, res.stderr
    assert "4 cells" in res.stdout and "offload=on" in res.stdout


# ---- loading: YAML 1.2 core types, anchors within bounds ------------------------------------------

def test_dates_and_on_off_stay_strings_and_a_small_alias_is_welcome():
    text = GOOD.replace("name: t", "name: t\ndescription: 2024-01-01") + textwrap.dedent("""\
        only:
          - &small {payload: 1472@1500}
          - *small
        """)
    p = load_plan(text, "t.yaml")
    assert p.description == "2024-01-01"  # YAML 1.1 would make it a date
    assert p.only == [{"payload": "1472@1500"}, {"payload": "1472@1500"}]
    assert [c.key for c in p.cells] == ["payload=1472@1500,offload=off", "payload=1472@1500,offload=on"]


def test_a_cell_error_names_the_axis_value_that_set_the_key():
    text = GOOD.replace("{udp_payload: 8972, mtu: 9000}", "{udp_payload: 70000, mtu: 9000}")
    with pytest.raises(BadInput) as err:
        load_plan(text, "t.yaml")
    assert str(err.value) == ("t.yaml:6: axes.payload.1.size: a UDP payload for engine is 24..65507 bytes "
                              "(got 70000)")


def test_plan_models_defer_value_ranges_to_the_one_workload_check():
    # The same rule, one source: WorkloadSpec takes the type, Workload.check the range.
    from offlab.traffic import BadWorkload, Workload

    with pytest.raises(BadWorkload) as cli:
        Workload(tool="engine", protocol="udp", batch=2000).check()
    with pytest.raises(BadInput) as plan:
        load_plan(GOOD.replace("duration: 1", "duration: 1, batch: 2000"), "t.yaml")
    assert cli.value.why in str(plan.value)
    assert str(cli.value).startswith("--batch 2000: ") and "workload.batch: " in str(plan.value)


# ---- tools: only those the cells use ----------------------------------------------------------

def test_an_iperf3_only_plan_needs_iperf3_and_not_the_engine():
    from offlab.experiment.plan import required_tools

    iperf = load_plan("name: t\ntopology: {kind: veth}\nworkload: {tool: iperf3}\n", "t.yaml")
    engine = load_plan(GOOD, "t.yaml")
    assert "offlab-engine" not in required_tools(iperf) and "iperf3" in required_tools(iperf)
    assert "iperf3" not in required_tools(engine) and "offlab-engine" in required_tools(engine)
    assert "tcpdump" in required_tools(engine) and "tcpdump" not in required_tools(iperf)  # GOOD captures
    ovs = load_plan("name: t\ntopology: {kind: ovs}\nworkload: {tool: iperf3}\n", "t.yaml")
    assert {"ovs-vswitchd", "ovsdb-server"} <= set(required_tools(ovs))


def test_a_missing_tool_is_exit_3_with_the_install_command(monkeypatch):
    from offlab.errors import ToolMissing
    from offlab.experiment.plan import check_tools
    from offlab.hosts import base

    plan = load_plan("name: t\ntopology: {kind: veth}\nworkload: {tool: iperf3}\n", "t.yaml")
    monkeypatch.setattr(base, "which", lambda tool: None if tool == "iperf3" else f"/usr/bin/{tool}")
    with pytest.raises(ToolMissing) as err:
        check_tools(plan)
    assert err.value.exit_code == 3 and "apt-get install iperf3" in str(err.value)


def test_the_environment_of_an_iperf3_run_does_not_need_the_engine(monkeypatch):
    from offlab.errors import ToolMissing
    from offlab.experiment.env import environment
    from offlab.traffic import engine

    def absent() -> str:
        raise ToolMissing("offlab-engine")

    monkeypatch.setattr(engine, "engine_path", absent)
    env = environment(load_plan("name: t\ntopology: {kind: veth}\nworkload: {tool: iperf3}\n", "t.yaml"), [])
    assert env["versions"]["offlab-engine"] is None and env["versions"]["offlab"]


# ---- the docs: every plan example loads --------------------------------------------------------

def _doc_examples() -> list[tuple[str, str]]:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for i, m in enumerate(re.finditer(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            if re.search(r"^topology:", m.group(1), re.M):  # a plan (docs/remote.md's inventories have their test)
                out.append((f"{doc.name}#{i + 1}", m.group(1)))
    return out


@pytest.mark.parametrize("where, text", _doc_examples(), ids=[w for w, _ in _doc_examples()])
def test_every_yaml_example_in_the_docs_is_a_valid_plan(where, text):
    assert load_plan(text, where).cells


# ---- the static picture of each topology matches the lab that is built ---------------------------

@requires_root
@pytest.mark.network
@pytest.mark.parametrize("kind", ["veth", "bridge", "router", "vxlan", "ovs", "dpdk", pytest.param(
    "ovs-dpdk", marks=pytest.mark.skipif(not os.access("/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk", os.X_OK),
                                         reason="needs openvswitch-switch-dpdk"))])
def test_static_hosts_and_interfaces_match_the_built_lab(kind, lab_name, clean_machine):
    from offlab import lab as labs
    from offlab.experiment import teardown
    from offlab.experiment.plan import topology as static

    lab = labs.up(kind, lab_name)
    try:
        built = {role: sorted(((i.kind, i.name if not i.name.startswith("ol") else None, i.peer_host)
                               for i in h.interfaces), key=repr) for role, h in lab.hosts.items()}
        known = {role: sorted(((i.kind, i.name, i.peer) for i in ifaces), key=repr)
                 for role, ifaces in static.HOSTS[kind].items()}
        assert built == known
        for role, ifaces in static.HOSTS[kind].items():  # every name a plan may use resolves the same way
            for i in ifaces:
                ref = i.name or f"to-{i.peer}"
                assert lab.resolve_iface(role, ref)
    finally:
        teardown.down(lab.name)


def test_the_engine_named_without_a_protocol_means_udp_even_when_an_axis_names_it():
    text = "name: t\ntopology: {kind: veth}\nworkload: {duration: 1}\naxes:\n  tool: {e: {tool: engine}, i: {tool: iperf3}}\n"
    cells = {c.key: c.workload for c in load_plan(text, "t.yaml").cells}
    assert (cells["tool=e"].protocol, cells["tool=i"].protocol) == ("udp", "tcp")
