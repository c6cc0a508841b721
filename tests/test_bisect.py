"""`offlab bisect` (offlab.experiment.bisect): which releases, in which order, the search, the changelog, the store.

Ordering and search run on a real index of the archive (tests/fixtures/bisect/index.json) and real
changelog excerpts (tests/fixtures/bisect/README.md says where each came from). The live tests bisect
real guests (TCG) over a few releases of offlab's cache: each kernel package is fetched once, by
whichever test or command needs it first.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import OUR_NAMESPACES, REPO, netns_names, offlab_cli
from tests.helpers import GUEST_MARKS, ended, journals, requires_root

FIXTURES = Path(REPO) / "tests" / "fixtures" / "bisect"


def _known():
    from offlab.vm import kernels

    return kernels.releases(json.loads((FIXTURES / "index.json").read_text()))


# ---- which releases ---------------------------------------------------------------------------------------
def test_the_list_runs_from_good_to_bad_across_suites_in_debians_version_order():
    from offlab.experiment import bisect
    from offlab.vm import kernels

    rel = bisect.release_list(_known(), "6.1", "7.2.12+deb13")
    assert (rel[0].abi, rel[0].suite, rel[-1].abi) == ("6.1.0-56", "bookworm-security", "7.2.12+deb13")
    versions = [r.version for r in rel]
    for a, b in zip(versions, versions[1:], strict=False):
        assert subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0, (a, b)
    suites = list(dict.fromkeys(r.suite for r in rel))
    assert suites == ["bookworm-security", "bookworm-backports", "trixie", "trixie-backports"], suites
    # one release per package version: bookworm-security's ABI-less linux-image-6.12-cloud-amd64 (the
    # version of 6.12.117+deb12) is no kernel of its own
    assert "6.12" not in [r.abi for r in rel] and len(set(versions)) == len(versions)
    assert [r.abi for r in rel if r.series == "6.12"][:3] == ["6.12.43+deb12", "6.12.57+deb12", "6.12.69+deb12"]
    assert [r.abi for r in rel if kernels.debian_key(r.version) > kernels.debian_key("7.2~")] == \
        ["7.2.6+deb13", "7.2.9+deb13", "7.2.11+deb13", "7.2.12+deb13"]
    # a good end newer than the bad end: the same releases, from good to bad
    assert [r.abi for r in bisect.release_list(_known(), "7.2.12+deb13", "6.1")] == [r.abi for r in rel][::-1]


def test_among_keeps_only_the_named_releases_between_the_ends():
    from offlab.experiment import bisect

    rel = bisect.release_list(_known(), "6.1", "7.2.12+deb13", ["6.12.117+deb13", "6.12.117+deb12", "6.18"])
    assert [r.abi for r in rel] == ["6.1.0-56", "6.12.117+deb12", "6.12.117+deb13", "6.18.15+deb13", "7.2.12+deb13"]


@pytest.mark.parametrize("good, bad, among, words", [
    ("6.1", "6.1.0-56", None, "--good 6.1 and --bad 6.1.0-56 are the same release (6.1.0-56, 6.1.192-2)"),
    ("6.12.58+deb12", "7.2", None, "--good 6.12.58+deb12: Debian's archive has no cloud kernel 6.12.58+deb12; "
                                   "nearest: 6.12.43+deb12, 6.12.57+deb12, 6.12.69+deb12, 6.12.73+deb12"),
    ("6.1", "9.9", None, "--bad 9.9: Debian's archive has no cloud kernel 9.9; series: 6.1, 6.12, 6.16"),
    ("6.1.0-55", "6.1.0-56", None, "nothing between --good 6.1.0-55 and --bad 6.1.0-56"),
    ("6.1", "7.2", ["7.3"], "--among 7.3: 7.3.4+deb13 is not between --good 6.1.0-56 and --bad 7.2.13+deb14"),
    ("6.1", "7.2", ["6.13"], "--among 6.13: Debian's archive has no cloud kernel 6.13; series: 6.1, 6.12, 6.16"),
])
def test_bad_ends_are_one_line_naming_the_option(good, bad, among, words):
    from offlab.errors import BadInput
    from offlab.experiment import bisect

    with pytest.raises(BadInput) as exc:
        bisect.release_list(_known(), good, bad, among)
    assert str(exc.value).startswith(words) and "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_the_kernels_suite_gives_each_kernel_its_guest_and_decides_uso_on_against_off():
    from offlab.experiment import suites

    plan = suites.plans("kernels")[0]
    kernels_of = {c.params["kernel"]: c.topology.kernel_version for c in plan.cells}
    assert kernels_of == {"6.1": "6.1", "6.12": "6.12", "newest": "newest"}
    assert len({c.lab_key for c in plan.cells}) == 3 and plan.baseline == {"uso": "off"}
    on = [c for c in plan.cells if c.params["uso"] == "on"]
    assert all(("client", "tx-udp-segmentation", True) in c.changes or ("client", "tx-udp-segmentation", "on")
               in c.changes for c in on) and all(c.workload.gso for c in plan.cells)


# ---- the search ---------------------------------------------------------------------------------------------
def _bisect(n: int, verdict_at) -> tuple[object, list[int]]:
    from offlab.experiment import bisect

    seen: dict[int, str] = {}
    order = []
    while not isinstance(nxt := bisect.search(n, seen), bisect.Outcome):
        assert nxt not in seen, "a decided step measured again"
        seen[nxt] = verdict_at(nxt)
        order.append(nxt)
    return nxt, order


def test_the_search_finds_every_change_within_log2_n_plus_one_measured_releases():
    """Every list length of the real archive's 6.1 → 7.x range and shorter ones, every place of the change."""
    n_real = len(__import__("offlab.experiment.bisect", fromlist=["x"]).release_list(_known(), "6.1", "7.3"))
    for n in [*range(3, 40), n_real]:
        bound = math.ceil(math.log2(n)) + 1
        for first in range(1, n):
            out, order = _bisect(n, lambda p, f=first: "faster" if p >= f else "cannot test")
            assert (out.kind, out.lo, out.hi) == ("found", first - 1, first), (n, first, out)
            assert len(order) <= bound, (n, first, order)
        out, order = _bisect(n, lambda p: "faster")
        assert out.kind == "same" and len(order) <= bound, (n, order)


def test_the_bad_end_is_measured_first_and_the_good_end_only_when_the_change_lies_next_to_it():
    out, order = _bisect(4, lambda p: "faster" if p >= 2 else "cannot test")
    assert order[0] == 3 and 0 not in order and (out.lo, out.hi) == (1, 2)
    out, order = _bisect(4, lambda p: "faster" if p >= 1 else "cannot test")
    assert order == [3, 1, 0] and (out.kind, out.hi) == ("found", 1)


def test_an_undecided_step_stops_the_search_with_the_range_it_narrowed():
    from offlab.experiment import bisect

    out, order = _bisect(9, lambda p: "faster" if p == 8 else ("undecided" if p == 4 else "cannot test"))
    assert out.kind == "narrowed" and (out.lo, out.hi) == (0, 8) and "undecided" in out.why
    out, order = _bisect(9, lambda p: "faster" if p >= 6 else ("undecided" if p == 5 else "cannot test"))
    assert out.kind == "narrowed" and out.lo < 5 < out.hi and order[-1] == 5
    out, _ = _bisect(9, lambda p: "undecided" if p == 8 else "faster")
    assert out.kind == "bad-end" and "undecided" in out.why
    assert bisect.search(9, {8: "faster", 4: "cannot test", 6: "faster", 5: "equivalent"}) == \
        bisect.Outcome("found", 5, 6)


def test_releases_that_cannot_be_measured_are_stepped_around():
    """6.19 to 7.1 in the archive's lists have no linux-modules package: no guest has a virtio_net there."""
    from offlab.experiment import bisect

    skip = {3, 4, 5}
    out, order = _bisect(9, lambda p: bisect.UNMEASURABLE if p in skip else ("faster" if p >= 6 else "equivalent"))
    assert out.kind == "narrowed" and (out.lo, out.hi) == (2, 6) and "could be measured" in out.why
    out, order = _bisect(9, lambda p: bisect.UNMEASURABLE if p in skip else ("faster" if p >= 7 else "equivalent"))
    assert (out.kind, out.lo, out.hi) == ("found", 6, 7)


# ---- the changelog ------------------------------------------------------------------------------------------
def test_changelog_entries_between_two_releases_in_version_order():
    from offlab.experiment import bisect

    entries = bisect.parse_changelog((FIXTURES / "changelog-7.2.12+deb13.txt").read_text())
    assert entries[0].header() == "linux (7.2.12-1~bpo13+1) trixie-backports"
    assert entries[0].trailer == "Ben Hutchings <benh@debian.org>  Wed, 04 Nov 2026 18:06:01 +0100"
    between = bisect.entries_between(entries, "7.2.9-1~bpo13+1", "7.2.12-1~bpo13+1")
    # a backport is its unstable version's code: 7.2.12-1's entry belongs to 7.2.12-1~bpo13+1, 7.2.9-1's to the older end
    assert [e.version for e in between] == ["7.2.12-1~bpo13+1", "7.2.12-1", "7.2.11-1~bpo13+1", "7.2.11-1",
                                            "7.2.10-1"]
    assert between[1].lines[1].strip() == "https://www.kernel.org/pub/linux/kernel/v7.x/ChangeLog-7.2.12"


def test_a_signed_image_packages_changelog_leaves_out_the_signing_entries():
    from offlab.experiment import bisect

    entries = bisect.parse_changelog((FIXTURES / "changelog-6.12.117+deb12.txt").read_text())
    assert entries[0].source == "linux-signed-6.12-amd64" and entries[3].source == "linux-6.12"
    between = bisect.entries_between(entries, "6.12.115-2~deb12u1", "6.12.117-1~deb12u1")
    assert [(e.source, e.version) for e in between] == [("linux", "6.12.117-1"), ("linux", "6.12.116-1")]


@requires_root
@pytest.mark.network
def test_changelogs_are_read_from_the_packages_themselves_also_through_a_doc_dir_symlink():
    """7.2's linux-binary doc directory is a symlink to linux-base's; 6.12's signed image names it changelog.gz."""
    from offlab.experiment import bisect
    from offlab.vm import kernels

    known = kernels.releases(kernels.index())
    for spec, first in (("7.2.12+deb13", "linux (7.2.12-1~bpo13+1) trixie-backports"),
                        ("6.12.117+deb12", "linux-signed-6.12-amd64 (6.12.117+1~deb12u1) bookworm-security")):
        r = kernels.choose(spec, known)
        entries = bisect.parse_changelog(bisect.changelog_text(r, kernels.fetch(r)))
        assert entries[0].header() == first and len(entries) > 100


@requires_root
@pytest.mark.network
def test_a_release_whose_modules_the_archive_does_not_list_cannot_be_measured():
    """trixie-backports' 7.0.13: only linux-binary-… in the lists (13 MB, fetched once), no virtio_net module."""
    from offlab.experiment import bisect
    from offlab.vm import kernels

    r = kernels.choose("7.0.13+deb13", kernels.releases(kernels.index()))
    if [d.name.split("-")[1] for d in r.debs] != ["binary"]:
        pytest.skip(f"the archive's lists now carry 7.0.13's parts: {[d.name for d in r.debs]}")
    why = bisect.Bisect._unmeasurable(r)
    assert why is not None and "not its linux-modules and linux-base parts" in why


# ---- stored like runs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_bisect_and_its_steps_are_stored_and_listed(tmp_path, backend, request):
    from offlab.state import me
    from offlab.store import Store

    if backend == "postgresql":
        url = request.getfixturevalue("pg").database()
    else:
        url = str(tmp_path / "b.db")
    with Store.open(url) as s:
        bid = s.create_bisect("uso-bisect", "name: x\n", {"good": "6.1", "bad": "7.2", "releases": []}, me())
        run = s.create_run("uso-bisect", "name: x\n", {}, 1, {}, None, {"min": 3})
        s.put_bisect_step(bid, 3, "7.2.12+deb13", "7.2.12-1~bpo13+1", "trixie-backports", run)
        s.put_bisect_step(bid, 3, "7.2.12+deb13", "7.2.12-1~bpo13+1", "trixie-backports", None, "faster",
                          {"ratio": 2.7})
        b = s.get_bisect(bid)
        assert b["status"] == "running" and [(x["position"], x["run_id"], x["verdict"], x["detail"])
                                             for x in b["steps"]] == [(3, run, "faster", {"ratio": 2.7})]
        s.set_bisect_status(bid, "done", "first 7.2.12+deb13", {"first": "7.2.12+deb13"})
        assert s.list_bisects() == [{"id": bid, "plan": "uso-bisect", "good": "6.1", "bad": "7.2", "status": "done",
                                     "note": "first 7.2.12+deb13", "started": b["started_at"], "steps": 1,
                                     "step_runs": [{"run_id": run, "release": "7.2.12+deb13"}],
                                     "first": "7.2.12+deb13"}]


def test_a_bisect_whose_process_died_reads_as_interrupted(tmp_path):
    from offlab.store import Store

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with Store.open(tmp_path / "b.db") as s:
        bid = s.create_bisect("p", "name: p\n", {"good": "6.1", "bad": "7.2"}, {"pid": int(dead.stdout), "start": 1})
        b = s.get_bisect(bid)
    assert b["status"] == "interrupted" and f"offlab bisect --resume {bid}" in b["note"]


def test_the_same_bisect_asked_again_carries_on_and_fresh_or_another_question_starts_anew(tmp_path, monkeypatch):
    from offlab.experiment import bisect
    from offlab.experiment.plan import load_plan
    from offlab.store import Store
    from offlab.vm import kernels

    monkeypatch.setattr(kernels, "index", lambda: json.loads((FIXTURES / "index.json").read_text()))
    plan = load_plan(USO_PLAN, "p.yaml")
    events: list[tuple[str, dict]] = []
    with Store.open(tmp_path / "b.db") as s:
        first = bisect.Bisect.start(s, plan, "6.1", "7.2.12+deb13", among=["6.12.117+deb12"])
        s.put_bisect_step(first.id, 2, "7.2.12+deb13", "7.2.12-1~bpo13+1", "trixie-backports", None, "faster", {})
        # its process is gone (a SIGKILL leaves the status "running" with a dead owner)
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        s.set_bisect_status(first.id, "running", owner={"pid": int(dead.stdout), "start": 1})
        again = bisect.Bisect.start(s, plan, "6.1", "7.2.12+deb13", among=["6.12.117+deb12"],
                                    on_event=lambda kind, info: events.append((kind, info)))
        assert again.id == first.id and again.seen() == {2: "faster"}
        assert events == [("again", {"bisect_id": first.id})]
        assert s.get_bisect(first.id)["status"] == "running"  # now this process's
        # a live owner: the same command refuses rather than racing it
        with pytest.raises(Exception, match=f"bisect {first.id} is running in another process"):
            bisect.Bisect.start(s, plan, "6.1", "7.2.12+deb13", among=["6.12.117+deb12"])
        s.set_bisect_status(first.id, "interrupted", "interrupted")
        assert bisect.Bisect.start(s, plan, "6.1", "7.2.12+deb13", among=["6.12.117+deb12"], fresh=True).id != first.id
        s.set_bisect_status(first.id + 1, "interrupted", "interrupted")
        other = bisect.Bisect.start(s, plan, "6.1", "7.2.12+deb13")  # another question: no --among
        assert other.id not in (first.id, first.id + 1)
        s.set_bisect_status(first.id, "done", "first 7.2.12+deb13", {"first": "7.2.12+deb13"})
        s.set_bisect_status(first.id + 1, "done", "first 7.2.12+deb13", {"first": "7.2.12+deb13"})
        s.set_bisect_status(other.id, "done", "no change", {"kind": "same"})
        # finished ones are never carried on: a new bisect
        assert bisect.Bisect.start(s, plan, "6.1", "7.2.12+deb13").id > other.id


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_results_import_carries_bisects_with_their_steps_pointing_at_the_imported_runs(tmp_path, backend, request):
    from offlab.store import Store

    src = tmp_path / "host.db"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with Store.open(src) as s:
        s.create_run("other", "name: o\n", {}, 1, {}, None, {"min": 3})  # ids differ between the databases
        done = s.create_bisect("uso-bisect", "name: x\n", {"good": "6.1", "bad": "7.2", "releases": []}, {"pid": 1})
        run = s.create_run("uso-bisect", "name: x\n", {}, 1, {}, None, {"min": 3})
        s.put_bisect_step(done, 3, "7.2.12+deb13", "7.2.12-1~bpo13+1", "trixie-backports", run, "faster",
                          {"ratio": 2.7})
        s.put_bisect_step(done, 0, "6.1.0-56", "6.1.158-1", "bookworm-security", None, "cannot test",
                          {"reason": "r"})
        s.set_bisect_status(done, "done", "first 7.2.12+deb13", {"first": "7.2.12+deb13"})
        cut = s.create_bisect("uso-bisect", "name: x\n", {"good": "6.1", "bad": "7.3", "releases": []},
                              {"pid": int(dead.stdout), "start": 1})
        source_done = s.get_bisect(done)
    url = request.getfixturevalue("pg").database() if backend == "postgresql" else str(tmp_path / "lab.db")
    lines: list[str] = []
    with Store.open(url) as target, Store.open_read_only(src) as source:
        target.create_run("mine", "name: m\n", {}, 1, {}, None, {"min": 3})
        target.import_from(source, lines.append)
        listed = target.list_bisects()
        assert [(b["good"], b["bad"], b["status"], b["first"]) for b in listed] == [
            ("6.1", "7.2", "done", "7.2.12+deb13"), ("6.1", "7.3", "interrupted", None)]
        got = target.get_bisect(listed[0]["id"])
        runs = {r["name"]: r["id"] for r in target.list_runs()}
        step = next(x for x in got["steps"] if x["position"] == 3)
        assert target.get_run(step["run_id"])["uid"] == Store.open_read_only(src).get_run(run)["uid"]
        assert step["run_id"] == max(runs.values()) and (step["verdict"], step["detail"]) == ("faster", {"ratio": 2.7})
        assert [(x["position"], x["verdict"]) for x in got["steps"]] == [(x["position"], x["verdict"])
                                                                        for x in source_done["steps"]]
        assert got["result"] == source_done["result"] and got["uid"] == source_done["uid"]
        assert target.bisect_of_run(step["run_id"])["id"] == got["id"]
        assert f"bisect {cut} (uso-bisect): imported as bisect {listed[1]['id']}, 0 steps" in lines
        again: list[str] = []
        target.import_from(source, again.append)  # twice: nothing more
        assert len(target.list_bisects()) == 2 and f"bisect {done} (uso-bisect): already here as bisect " \
            f"{listed[0]['id']}" in again


# ---- the command's bad input ---------------------------------------------------------------------------
USO_PLAN = """\
name: uso-bisect
topology: {kind: vm}
axes:
  tx:
    gso-sw: {features: {client: {tx-udp-segmentation: off}}}
    uso: {features: {client: {tx-udp-segmentation: on}}}
workload: {tool: engine, protocol: udp, size: 1472, gso: true, duration: 1, warmup: 0.5, rate: 1G}
repeat: {min: 3, max: 8, level: 95}
baseline: {tx: gso-sw}
budget: 6m
"""


@requires_root
@pytest.mark.network
def test_bad_bisect_input_is_one_line_exit_2_and_fetches_nothing(tmp_path):
    from offlab.vm import kernels

    plan = tmp_path / "p.yaml"
    plan.write_text(USO_PLAN)
    veth = tmp_path / "veth.yaml"
    veth.write_text(USO_PLAN.replace("kind: vm", "kind: veth").replace("tx-udp-segmentation", "gso"))
    kernels.index()  # the lists (not packages) may be fetched once, by this or any other command
    debs = set(os.listdir(kernels.debs_dir()))
    db = tmp_path / "b.db"
    for args, words in (
            ((str(plan), "--good", "6.1", "--bad", "6.1"), "are the same release"),
            ((str(plan), "--good", "6.1", "--bad", "6.12.58+deb12"), "nearest: 6.12.43+deb12, 6.12.57+deb12"),
            ((str(plan), "--good", "6.1.0-55", "--bad", "6.1.0-56"), "nothing between"),
            ((str(veth), "--good", "6.1", "--bad", "7.2"), "topology veth has no guests"),
            ((str(plan), "--good", "6.1", "--bad", "7.2", "--cell", "tx=gso-sw"), "names 0 compared cells"),
            ((str(plan), "--good", "6.1"), "--bad is missing")):
        res = offlab_cli("bisect", *args, "--db", str(db))
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert set(os.listdir(kernels.debs_dir())) == debs
    res = offlab_cli("results", "list", "--db", str(db))
    assert "bisect" not in res.stdout  # no bisect was stored


def test_an_archive_that_cannot_be_reached_is_exit_3_naming_the_suites(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(USO_PLAN)
    res = offlab_cli("bisect", str(plan), "--good", "6.1", "--bad", "7.2", "--db", str(tmp_path / "b.db"),
                     timeout=300, env={"OFFLAB_CACHE_DIR": str(tmp_path), "OFFLAB_DEBIAN_MIRROR": "file:///nonexistent/debian"})
    assert res.returncode == 3, res.stderr
    assert res.stderr.startswith("offlab: error: Debian archive suites bookworm, bookworm-security")
    assert res.stderr.count("\n") == 1


# ---- real guests (TCG): 6.1 → 7.2 over a few releases, killed and resumed ---------------------------------
LIVE_PLAN = """\
name: uso-bisect
topology: {kind: vm}
axes:
  tx:
    plain: {features: {client: {tx-udp-segmentation: off}}, workload: {gso: false}}
    uso: {features: {client: {tx-udp-segmentation: on}}, workload: {gso: true}}
workload: {tool: engine, protocol: udp, size: 1472, duration: 1, warmup: 0.5}
repeat: {min: 3, max: 8, level: 95}
baseline: {tx: plain}
budget: 6m
"""
AMONG = "6.12.117+deb12,6.12.117+deb13"  # cached by test_kernels and the guests' default: 4 releases, 3 measured at most


def _wait_for(db: Path, proc: subprocess.Popen, ready, what: str, timeout: float = 1200) -> dict:
    from offlab.store import Store

    deadline = time.monotonic() + timeout  # a hang guard: a step boots a TCG guest and decides in rounds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"bisect ended before {what}"
        if db.exists():
            with Store.open(db, create=False) as s:
                if s.schema_version() >= 4 and s.list_bisects():
                    b = s.get_bisect(s.list_bisects()[0]["id"])
                    if ready(s, b):
                        return b
        time.sleep(2)
    raise AssertionError(f"no {what} within {timeout} s")


class TestLive:
    pytestmark = GUEST_MARKS

    @pytest.mark.timeout(1800)  # a hang guard only, as _wait_for's: pytest's 300 s cut it short on a loaded machine
    def test_bisect_finds_the_first_release_whose_uso_is_exercised_and_resumes_after_sigkill_and_sighup(
            self, tmp_path, state_dir, clean_machine):
        from offlab.store import Store

        plan = tmp_path / "p.yaml"
        plan.write_text(LIVE_PLAN)
        db = tmp_path / "b.db"
        env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir)}
        log = (tmp_path / "first.err").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "offlab", "bisect", str(plan), "--good", "6.1", "--bad",
                                 "7.2.12+deb13", "--among", AMONG, "--db", str(db)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=log)
        try:
            # killed once the bad end is decided and the next step's run has a sample
            def mid_step(s, b):
                running = [x for x in b["steps"] if x["verdict"] is None and x["run_id"] is not None]
                return any(x["verdict"] for x in b["steps"]) and running and s.samples(running[0]["run_id"])

            before = _wait_for(db, proc, mid_step, "a second step under way")
        finally:
            proc.kill()  # SIGKILL: nothing of the bisect's own runs
            proc.wait(timeout=60)
            log.close()
        for args in (("restore",), ("lab", "down", "--all")):  # what a user does after kill -9 (README)
            res = offlab_cli(*args, env={"OFFLAB_STATE_DIR": str(state_dir)}, timeout=300)
            assert res.returncode == 0, res.stderr
        with Store.open(db, create=False) as s:
            bid = s.list_bisects()[0]["id"]
            assert s.get_bisect(bid)["status"] == "interrupted"
            decided = {x["run_id"]: [r["id"] for r in s.samples(x["run_id"])] for x in before["steps"] if x["verdict"]}
            killed = next(x["run_id"] for x in before["steps"] if x["verdict"] is None)
            killed_samples = {(r["cell_id"], r["round"]) for r in s.samples(killed)}
        # the same command again carries on with it (as `--resume ID` does); a dropped terminal (SIGHUP) once its
        # step has measured again ends it at once, everything put back without a restore, and it carries on again
        argv = [sys.executable, "-m", "offlab", "bisect", str(plan), "--good", "6.1", "--bad", "7.2.12+deb13",
                "--among", AMONG, "--db", str(db)]
        namespaces = netns_names()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(db, proc, lambda s, b: len(s.samples(killed)) > len(killed_samples), "the step measuring again")
            proc.send_signal(signal.SIGHUP)
            _, err = ended(proc, 120)  # a hang guard: the signal harness holds runs to 5 s
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert journals(state_dir) == [] and not {n for n in netns_names() - namespaces if n.startswith(OUR_NAMESPACES)}, err
        with Store.open(db, create=False) as s:
            assert s.get_bisect(bid)["status"] == "interrupted"
            hup_samples = {(r["cell_id"], r["round"]) for r in s.samples(killed)}
        res = offlab_cli(*argv[3:], env={"OFFLAB_STATE_DIR": str(state_dir)}, timeout=2400)
        assert res.returncode == 0, res.stderr
        assert f"bisect {bid} asked this of this plan and did not finish: carrying on with it" in res.stderr
        with Store.open(db, create=False) as s:
            assert [x["id"] for x in s.list_bisects()] == [bid]
            b = s.get_bisect(bid)
            runs = [r["id"] for r in s.list_runs()]
            for run_id, sample_ids in decided.items():  # a decided step is not measured again
                assert [r["id"] for r in s.samples(run_id)] == sample_ids
            after = [(r["cell_id"], r["round"]) for r in s.samples(killed)]
            # its run went on after each interruption, nothing measured twice
            assert killed_samples <= hup_samples <= set(after) and len(after) == len(set(after))
        measured = [x for x in b["steps"] if x["run_id"] is not None]
        assert sorted(runs) == sorted(x["run_id"] for x in measured), "a step measured in a second run"
        assert len(measured) <= math.ceil(math.log2(4)) + 1
        result = b["result"]
        # 6.1's virtio_net does not accept VIRTIO_NET_F_HOST_USO: the USO cell is skipped with the chain's reason
        # the newest 6.1 in bookworm, whichever the archive has today (it published 6.1.0-57 on 2026-11-29)
        assert (result["kind"], result["first"]) == ("found", "6.12.117+deb12") and \
            result["lo"]["abi"].startswith("6.1.0-"), result
        assert result["lo"]["verdict"] == "cannot test" and result["hi"]["verdict"] == "faster"
        six_one = next(x for x in b["steps"] if x["release"] == result["lo"]["abi"])
        assert "VIRTIO_NET_F_HOST_USO (bit 56) offered by QEMU, not accepted by the guest's driver" in six_one["detail"]["reason"]
        for x in measured:
            assert f"{x['release']} ({x['suite']}): {x['verdict']}" in res.stdout
        assert "first release where the verdict changes: 6.12.117+deb12 (faster)" in res.stdout
        assert result["changelog"]["entries"] and "linux (6.12.117-1) trixie-security" in res.stdout
        # the runs are plain runs: the report of one names its bisect
        rep = offlab_cli("report", str(measured[0]["run_id"]), "--db", str(db), "-o", str(tmp_path / "r.html"))
        assert rep.returncode == 0 and f"Bisect {bid}" in (tmp_path / "r.html").read_text(), rep.stderr
