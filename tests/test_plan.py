"""Plans: the suites are valid; bad plans get the right message (file:line: field) and exit 2."""

from __future__ import annotations

import textwrap

import pytest

from offlab.errors import BadInput
from offlab.experiment import suites
from offlab.experiment.plan import load_plan
from tests.conftest import offlab_cli

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


@pytest.mark.parametrize("name", ["uso", "gro-gso", "vxlan", "jumbo", "pps", "quick"])
def test_every_builtin_suite_is_valid_and_names_its_seed(name):
    plans = suites.plans(name)
    assert plans and all(p.cells for p in plans)
    assert "Seed" in suites.description(name) or name == "quick"


def test_quick_mode_shortens_repetitions():
    p = suites.plans("uso", quick=True)[0]
    assert (p.repeat.min, p.repeat.max) == (1, 2)


BAD = [
    ("unknown top-level key", GOOD + "repaet: {min: 3}\n", "t.yaml:14: ", "unknown field 'repaet'; did you mean 'repeat'?"),
    ("unknown topology", GOOD.replace("kind: bridge", "kind: mesh"), "t.yaml:2", "topology.kind"),
    ("mtu out of range", GOOD.replace("mtu: 9000", "mtu: 99999"), "t.yaml:6", "mtu"),
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
     "t.yaml:", "both set"),
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


def test_bad_plan_on_the_cli_exits_2_without_running(tmp_path, state_dir):
    plan = tmp_path / "bad.yaml"
    plan.write_text(BAD[3][1])
    res = offlab_cli("run", str(plan), "--db", str(tmp_path / "x.db"))
    assert res.returncode == 2, res.stderr
    assert "bad.yaml:8" in res.stderr and "Traceback" not in res.stderr
    assert not (state_dir / "labs").exists() or not any((state_dir / "labs").iterdir())


def test_validate_lists_cells_without_running(tmp_path):
    plan = tmp_path / "good.yaml"
    plan.write_text(GOOD)
    res = offlab_cli("run", str(plan), "--validate")
    assert res.returncode == 0, res.stderr
    assert "4 cells" in res.stdout and "offload=on" in res.stdout
