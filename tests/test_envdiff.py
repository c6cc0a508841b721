"""What changed between two runs (issue 25 item 4): `offlab compare A B` lists the differences of their stored
environments and of the settings held during their samples, most likely cause first; a run without an
environment or an unknown run is one line and exit 2, with the rest of the comparison printed."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import offlab_cli
from offlab.report import envdiff
from offlab.store import Store
from tests.conftest import requires_root
from tests.helpers import ENV, store_two, run as offlab_in_process


def test_differences_come_most_likely_cause_first_with_interfaces_matched_by_role_and_peer(tmp_path):
    b = copy.deepcopy(ENV)
    b["versions"]["iperf3"] = "iperf 3.16"
    b["sysctls"]["net.core.netdev_max_backlog"] = "5000"
    b["kernel"] = "6.12.0-1-amd64"
    b["labs"][0]["testpmd"] = {"version": "DPDK 23.11.2"}  # a lab with testpmd in one run only: unknown → version
    b["loadavg"] = 9.5
    for host, name in (("client", "oltb0"), ("server", "oltb1")):  # another lab's names for the same interfaces
        b["labs"][0]["hosts"][host]["interfaces"][0]["name"] = name
    b["labs"][0]["hosts"]["server"]["interfaces"][0]["features"]["generic-receive-offload"] = True
    db, ra, rb = store_two(tmp_path, ENV, b)
    with Store.open(db, create=False) as s:
        d = envdiff.env_diff(s, ra, rb)
    got = [(c.kind, c.what, c.a, c.b) for c in d.changes]
    assert got == [("kernel", "kernel", "6.1.0-18-amd64", "6.12.0-1-amd64"),
                   ("feature", "server:to-client generic-receive-offload", "off", "on"),
                   ("sysctl", "sysctl net.core.netdev_max_backlog", "1000", "5000"),
                   ("version", "dpdk-testpmd", "unknown", "DPDK 23.11.2"),
                   ("version", "iperf3", "iperf 3.12", "iperf 3.16"),
                   ("load", "load average (1 min) when the run started", "0.40", "9.50")]
    assert d.view.startswith("same machine (lab1), runs started") and d.view.endswith(", the same plan")


def test_two_machines_are_named_as_such(tmp_path):
    b = {**copy.deepcopy(ENV), "hostname": "lab2", "cpu_model": "AMD EPYC 7B13", "cpus": 8}
    db, ra, rb = store_two(tmp_path, ENV, b)
    with Store.open(db, create=False) as s:
        d = envdiff.env_diff(s, ra, rb)
    assert d.view.startswith("different machines: lab1 (Intel(R) Xeon(R) CPU @ 2.20GHz, 2 CPUs) vs lab2 (AMD EPYC 7B13, 8 CPUs)")
    assert [c.what for c in d.changes] == ["cpu_model", "cpus"]


def test_a_run_without_an_environment_is_one_line_exit_2_and_the_comparison_is_still_printed(tmp_path):
    db, ra, rb = store_two(tmp_path, ENV, None)
    res = offlab_in_process("compare", str(ra), str(rb), "--db", db, env={"COLUMNS": "200"})
    assert res.returncode == 2, res.stderr
    assert "throughput" in res.stdout and f"run {rb} vs run {ra}" in res.stdout  # the rows are there
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"offlab: run {rb} (p) has no stored environment") and "Traceback" not in res.stderr


def test_an_unknown_run_is_one_line_exit_2_and_the_other_runs_are_compared(tmp_path):
    db, ra, rb = store_two(tmp_path, ENV, ENV)
    res = offlab_in_process("compare", str(ra), str(rb), "99", "--db", db, env={"COLUMNS": "200"})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"offlab: no run 99 in DB {db} (offlab results list)"]
    assert f"run {rb} vs run {ra}" in res.stdout and f"environment, run {ra} → run {rb}" in res.stdout
    alone = offlab_in_process("compare", str(ra), "99", "--db", db)
    assert alone.returncode == 2 and len(alone.stderr.strip().splitlines()) == 1 and "no run 99" in alone.stderr


def test_fail_if_slower_says_what_changed_when_it_fails(tmp_path):
    b = copy.deepcopy(ENV)
    b["sysctls"]["net.core.rmem_max"] = "212992"
    db, ra, rb = store_two(tmp_path, ENV, b, slower=0.5)
    res = offlab_in_process("compare", str(ra), str(rb), "--fail-if-slower", "10", "--db", db)
    assert res.returncode == 1, res.stderr
    err = res.stderr.splitlines()
    assert any("slower by more than 10 %" in l for l in err)
    assert "offlab:   sysctl net.core.rmem_max: 4194304 → 212992" in err, err
    js = json.loads(offlab_in_process("compare", str(ra), str(rb), "--json", "--db", db).stdout)
    assert js["environment"][0]["changes"][0]["what"] == "sysctl net.core.rmem_max"


PLAN = """\
name: envdiff
topology: {kind: veth}
axes:
  gro:
    "on": {features: {server: {gro: "on"}%s}%s}
    "off": {features: {server: {gro: "off"}%s}%s}
workload: {tool: engine, protocol: udp, size: 1472, duration: 0.5, warmup: 0.2}
baseline: {gro: "off"}
repeat: {min: 1, max: 1, level: 95}
"""


@requires_root
@pytest.mark.network
def test_two_real_runs_where_one_flips_a_sysctl_and_a_feature_name_both_first(tmp_path, clean_machine):
    same = PLAN % ("", "", "", "")
    feature, sysctl = ', client: {uso: "off"}', ', settings: {server: {net.ipv4.tcp_rmem: "4096 65536 1048576"}}'
    flipped = PLAN % (feature, sysctl, feature, sysctl)
    db = str(tmp_path / "offlab.db")
    for i, text in enumerate((same, flipped)):
        (tmp_path / f"p{i}.yaml").write_text(text)
        res = offlab_cli("run", str(tmp_path / f"p{i}.yaml"), "--db", db, timeout=300)
        assert res.returncode == 0, res.stderr
    res = offlab_in_process("compare", "1", "2", "--db", db, env={"COLUMNS": "250"})
    assert res.returncode == 0, res.stderr
    head, *rest = res.stdout.split("environment, run 1 → run 2")[1].splitlines()
    assert "same machine" in head and "plans differ in 4 lines" in head, head
    env = rest[:2]
    assert env[0].strip().startswith("client:to-server uso: on (not set by the plan; as run 2 found it) → off"), env
    assert env[1].strip().startswith("server net.ipv4.tcp_rmem: 4096") and "(not set by the plan; as run 2 found it) → 4096 65536 1048576" in env[1], env
