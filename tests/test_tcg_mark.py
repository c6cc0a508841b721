"""Figures from an emulated (TCG) guest are marked wherever they are shown (issue 10 item 4).

On stored results: a run whose environment lists a guest that ran under TCG (as `lab show`
describes it, the way every run stores its labs) and one without any guest.
"""

from __future__ import annotations

import json

import pytest

from offlab import report
from offlab.metrics import TCG_MARK
from offlab.report import compare
from offlab.store import Store
from tests.helpers import run as offlab_in_process

REPEAT = {"min": 2, "max": 4, "level": 95, "width": 20}
GUEST = {"accel": "tcg", "qemu_version": "10.0.2", "kernel_release": "6.12.117+deb12-cloud-amd64", "vhost": False}


def _run(store: Store, *, accel: str | None) -> int:
    hosts = {"server": {"netns": "ol-g-server", "interfaces": []}}
    if accel:
        hosts["client"] = {"netns": "ol-g-server", "interfaces": [], "guest": {**GUEST, "accel": accel}}
    env = {"kernel": "6.18", "labs": [{"name": "g", "topology": "vm", "hosts": hosts}]}
    run = store.create_run("t", "name: t\n", {"axes": {"tap": ["on", "off"]}}, 1, env, {"tap": "on"}, REPEAT)
    for tap, bps in (("on", 3.0e9), ("off", 1.0e9)):
        key = f"tap={tap}"
        cid = store.add_cells(run, [{"key": key, "params": {"tap": tap}, "settings": {}}])[key]
        for i, f in enumerate((0.98, 1.0, 1.02)):
            store.add_sample(run, cid, i, {"lab": "g"}, {"throughput_bps": bps * f})
        store.set_cell_status(cid, "done", None)
    return run


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "offlab.db"
    s = Store.open(path)
    runs = {"tcg": _run(s, accel="tcg"), "kvm": _run(s, accel="kvm"), "ns": _run(s, accel=None)}
    s.close()
    return path, runs


def test_compare_rows_of_an_emulated_run_carry_the_mark_and_others_do_not(db):
    path, runs = db
    with Store.open(path) as s:
        tcg = compare.compare_run(s, runs["tcg"], metrics=("throughput_bps",))
        kvm = compare.compare_run(s, runs["kvm"], metrics=("throughput_bps",))
        ns = compare.compare_run(s, runs["ns"], metrics=("throughput_bps",))
        across = compare.compare_runs(s, runs["ns"], runs["tcg"], metrics=("throughput_bps",))
        assert compare.emulated(s.get_run(runs["tcg"])) == ["g:client (tcg, QEMU 10.0.2)"]
    assert tcg and all(TCG_MARK in r.flags for r in tcg)
    assert not any(TCG_MARK in r.flags for r in kvm + ns)
    assert all(TCG_MARK in r.flags for r in across)  # one side emulated is enough


def test_a_sample_that_records_its_tcg_guest_marks_a_run_without_that_environment():
    from offlab.sample import records

    samples = records([{"sample": {"lab": "v", "guests": {"client": GUEST}}}])
    assert compare.emulated({"env": {}}, samples) == ["v:client (tcg, QEMU 10.0.2)"]
    assert compare.emulated({"env": {}}, records([{"sample": {"lab": "v"}}])) == []


def test_results_show_and_compare_print_the_mark_once(db):
    path, runs = db
    show = offlab_in_process("results", "show", str(runs["tcg"]), "--db", str(path), env={"COLUMNS": "200"})
    assert show.returncode == 0, show.stderr
    assert show.stdout.count(TCG_MARK) == 1 and "g:client (tcg, QEMU 10.0.2)" in show.stdout
    plain = offlab_in_process("results", "show", str(runs["ns"]), "--db", str(path), env={"COLUMNS": "200"})
    assert plain.returncode == 0 and "TCG" not in plain.stdout
    cmp = offlab_in_process("compare", str(runs["tcg"]), "--db", str(path), env={"COLUMNS": "200"})
    assert cmp.returncode == 0, cmp.stderr
    assert cmp.stdout.count(TCG_MARK) == 1, cmp.stdout
    js = offlab_in_process("compare", str(runs["tcg"]), "--db", str(path), "--json")
    assert all(TCG_MARK in r["flags"] for r in json.loads(js.stdout)["rows"])


def test_the_html_report_shows_the_mark_as_a_banner(db):
    path, runs = db
    with Store.open(path) as s:
        html = report.build_report(s, runs["tcg"])
        plain = report.build_report(s, runs["ns"])
    assert 'class="warn tcg"' in html and TCG_MARK in html and "g:client (tcg, QEMU 10.0.2)" in html
    assert html.count(TCG_MARK) == 1  # a banner, not a flag on every comparison row
    assert TCG_MARK not in plain
