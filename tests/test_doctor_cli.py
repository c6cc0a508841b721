"""`offlab doctor` as people run it: live as root and as nobody, JSON schema, captures, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offlab.doctor.schema import load_schema, validate
from tests.conftest import REPO, offlab_cli
from tests.helpers import one_line_error, run

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs the doctor as root and as nobody")


def as_nobody(*args: str, cwd: str = "/") -> subprocess.CompletedProcess:
    code = f"import sys; sys.path.insert(0, {REPO!r}); from offlab.cli import main; main()"
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code,
                           *args], capture_output=True, text=True, cwd=cwd, env={"PATH": "/usr/bin:/bin"},
                          timeout=60)


@needs_root
def test_live_as_root_json_validates(veth_lab):
    # how long doctor takes is benchmarks/report_speed's (a ratio side by side), not a test's
    netns = veth_lab.entry("client").netns
    res = offlab_cli("doctor", "--netns", netns, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert validate(doc) == []
    assert doc["host"]["privileged"] is True and doc["host"]["source"] == "live"
    assert doc["host"]["netns"] == netns
    assert doc["sample_seconds"] == 1.0
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["napi.softnet"]["evidence"]["window_s"] >= 1.0  # a rate over a window, not since boot
    assert doc["host"]["interfaces"] == [i.name for i in veth_lab.hosts["client"].interfaces]


@needs_root
def test_live_as_nobody_skips_only_what_needs_root():
    from offlab.doctor.checks import all_checks

    res = as_nobody("doctor", "--json", "--sample", "0.2")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert validate(doc) == []
    assert doc["host"]["privileged"] is False
    needs_root = {s.id for s in all_checks() if s.needs_root}
    assert needs_root == {"firewall.rules", "ovs.veth-csum"}
    ran = {c["id"] for c in doc["checks"]}
    skipped = {c["id"] for c in doc["checks"] if c["summary"].startswith("needs root")}
    assert skipped == needs_root & ran
    assert all(c["status"] == "skip" for c in doc["checks"] if c["id"] in skipped)
    assert {"cpu.governor", "napi.sysctls", "nic.queues"} <= ran - skipped  # the rest still runs


def test_text_report_groups_by_area_and_prints_the_fix():
    res = run("doctor", "--root", str(FIXTURES / "sos-centos7-kvm"))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for area in ("CPU", "Kernel", "NIC", "Bridge", "Firewall", "MTU"):
        assert f"\n{area}" in out
    assert "WARN  nic.queues ens1f0" in out and ">>> ethtool -L ens1f0 combined 8" in out
    assert "FAIL  bridge.mtu" in out
    assert "summary: 7 ok, 1 info, 13 warn, 1 fail, 4 skip" in out  # ovs.veth-csum: ps shows no ovs-vswitchd


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_every_fixture_report_validates_against_the_schema(fixture):
    res = run("doctor", "--root", str(FIXTURES / fixture), "--json", "--target-pps", "800000")
    assert res.returncode == 0, res.stderr
    assert validate(json.loads(res.stdout)) == []


def test_schema_validator_rejects_what_the_schema_forbids():
    doc = json.loads(run("doctor", "--root", str(FIXTURES / "tuned-host"), "--json").stdout)
    doc["checks"][0]["status"] = "maybe"
    del doc["summary"]["ok"]
    doc["checks"][1]["changes"] = [{"key": "gro"}]
    errors = validate(doc, load_schema())
    assert any("checks[0].status" in e for e in errors)
    assert any("missing required key 'ok'" in e for e in errors)
    assert any("checks[1].changes[0]: missing required key 'value'" in e for e in errors)


@pytest.mark.parametrize("fixture, level, code", [
    ("sos-centos7-kvm", "fail", 1),
    ("sos-centos7-kvm", "warn", 1),
    ("amd-avic0", "fail", 0),
    ("amd-avic0", "warn", 1),
    ("tuned-host", "warn", 0),
])
def test_fail_on_exits_1_only_at_or_above_the_level(fixture, level, code):
    res = run("doctor", "--root", str(FIXTURES / fixture), "--fail-on", level, "--json")
    assert res.returncode == code, res.stderr
    assert json.loads(res.stdout)["schema"] == "offlab-doctor/1"


@needs_root
def test_capture_then_root_replays_the_same_findings(tmp_path):
    dest = tmp_path / "cap"
    res = run("doctor", "--capture", str(dest), "--sample", "0.2", "--json")
    assert res.returncode == 0, res.stderr
    captured = json.loads(res.stdout)
    assert captured["capture"]["samples"] == 1
    replay = json.loads(run("doctor", "--root", str(dest), "--json").stdout)
    seen = [(c["id"], c["target"], c["status"], c["summary"]) for c in captured["checks"]]
    again = [(c["id"], c["target"], c["status"], c["summary"]) for c in replay["checks"]]
    assert again == seen, [(a, b) for a, b in zip(again, seen, strict=False) if a != b]
    assert replay["host"]["source"] == "capture"
    # the tree holds only proc/sys fragments, command outputs, samples and the manifest
    assert {p.name for p in dest.iterdir()} <= {"offlab-capture.json", "proc", "sys", "commands", "samples"}
    res = run("doctor", "--capture", str(dest))
    one_line_error(res, 2, "not an empty directory")


def test_committed_capture_holds_nothing_but_what_checks_read():
    root = FIXTURES / "this-machine"
    assert {p.name for p in root.iterdir()} <= {"offlab-capture.json", "proc", "sys", "commands", "samples"}
    files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    assert not [f for f in files if f.endswith(("environ", "cmdline")) and f != "proc/cmdline"]
    assert " -- " not in (root / "proc" / "cmdline").read_text()
    manifest = json.loads((root / "offlab-capture.json").read_text())
    assert manifest["format"] == "offlab-capture/1" and "/proc/cmdline" in manifest["redacted"]


def test_sosreport_ethtool_text_and_sysctl_a_are_read():
    doc = json.loads(run("doctor", "--root", str(FIXTURES / "sos-centos7-kvm"), "--json").stdout)
    assert doc["host"] == {"name": "kvm-host-07", "kernel": "3.10.0-1160.el7.x86_64", "source": "sosreport",
                           "root": str(FIXTURES / "sos-centos7-kvm"), "netns": None, "privileged": True,
                           "cpus": 8, "interfaces": ["ens1f0"], "collected": None}
    napi = next(c for c in doc["checks"] if c["id"] == "napi.sysctls")
    assert napi["evidence"]["values"]["net.core.netdev_budget"] == 300  # from sos_commands/kernel/sysctl_-a


def _sosreport_without_proc(tmp_path: Path) -> Path:
    (tmp_path / "sos_commands" / "networking").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("make, args, code, needle", [
    (None, ["--iface", "nosuch0"], 2, "no interface 'nosuch0'"),
    (None, ["--iface", "eth0;reboot"], 2, "invalid interface name"),
    (None, ["--root", "/nonexistent/offlab"], 2, "no such directory"),
    (None, ["--fail-on", "sometimes"], 2, "--fail-on 'sometimes'"),
    (None, ["--target-pps", "-5"], 2, "--target-pps must be a non-negative integer"),
    (None, ["--check", "cpu.nosuch"], 2, "unknown check id(s) cpu.nosuch"),
    (None, ["--netns", "ol-nosuch-x"], 2, "no network namespace 'ol-nosuch-x'"),
    (None, ["--sample", "0"], 2, "--sample 0 is out of range"),
    ("sos", [], 2, "malformed sosreport"),
    ("badjson", [], 2, "offlab-capture.json is not valid JSON"),
    ("empty", [], 2, "neither an offlab capture"),
])
def test_bad_input_is_one_line_and_exit_2(make, args, code, needle, tmp_path):
    if make == "sos":
        args = ["--root", str(_sosreport_without_proc(tmp_path))]
    elif make == "badjson":
        (tmp_path / "offlab-capture.json").write_text("{not json")
        args = ["--root", str(tmp_path)]
    elif make == "empty":
        args = ["--root", str(tmp_path)]
    root_needed = any(a in ("--netns",) for a in args)
    if root_needed and os.geteuid() != 0:
        pytest.skip("--netns checks need root")
    res = run("doctor", *args)
    one_line_error(res, code, needle)


def test_apply_with_root_dir_is_refused():
    res = run("doctor", "--root", str(FIXTURES / "tuned-host"), "--apply", "nic.offloads")
    one_line_error(res, 2, "--root reads a captured tree")


@needs_root
def test_unreadable_root_and_netns_as_nobody_exit_3():
    import shutil
    import tempfile

    outer = Path(tempfile.mkdtemp(prefix="offlab-doctor-"))  # pytest's tmp_path is not traversable by nobody
    try:
        outer.chmod(0o755)
        private = outer / "private"
        private.mkdir(mode=0o700)
        (private / "offlab-capture.json").write_text("{}")
        res = as_nobody("doctor", "--root", str(private))
        one_line_error(res, 3, "not readable by this user")
        res = as_nobody("doctor", "--netns", "ol-any-client")
        one_line_error(res, 3, "needs root")
    finally:
        shutil.rmtree(outer)
