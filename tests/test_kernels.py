"""Guest kernels from the whole Debian archive (offlab.vm.kernels): choosing, fetching, caching, booting.

Parsers run on real captured text (tests/fixtures/kernels: excerpts of the archive's Packages lists,
`apt-get update` against an unreachable archive). The tests that need the archive's index or a kernel
package use offlab's own cache (/var/cache/offlab/vm or $OFFLAB_CACHE_DIR): the lists and each package
are fetched once, by whichever test or `offlab` command needs them first, and reused after that. One
module-shared vm-pair lab boots a 6.1 and a 7.2 guest (trixie-backports) side by side.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, module_lab, netns_names, offlab_cli
from tests.helpers import GUEST_MARKS, requires_root, run as offlab_in_process

FIXTURES = Path(REPO) / "tests" / "fixtures" / "kernels"
OLD, NEW = "6.1", "7.2.12+deb13"  # bookworm-security's newest 6.1 (LZ4, plain .ko) and a split 7.x package (.ko.xz)


def _releases(suite: str):
    from offlab.vm import kernels

    return kernels.releases_in((FIXTURES / f"{suite}.Packages").read_text(), suite, "http://deb.debian.org/debian")


def test_packages_lists_give_one_release_per_kernel_and_split_kernels_their_parts():
    tb = {r.abi: r for r in _releases("trixie-backports")}
    assert sorted(tb) == ["6.18.15+deb13", "7.2.11+deb13", "7.2.12+deb13"]
    # up to 6.18 the image package holds the kernel; from 6.19 it is empty and its parts hold it
    assert [d.name for d in tb["6.18.15+deb13"].debs] == ["linux-image-6.18.15+deb13-cloud-amd64"]
    assert sorted(d.name.split("-")[1] for d in tb["7.2.12+deb13"].debs) == ["base", "binary", "modules"]
    binary = next(d for d in tb["7.2.12+deb13"].debs if d.name.startswith("linux-binary-"))
    assert binary.version == "7.2.12-1~bpo13+1" and binary.size == 13389360 and len(binary.sha256) == 64
    assert binary.url == ("http://deb.debian.org/debian/pool/main/l/linux-signed-amd64/"
                          "linux-binary-7.2.12+deb13-cloud-amd64_7.2.12-1~bpo13+1_amd64.deb")
    # the -unsigned twin and the linux-image-cloud-amd64 metapackage are no releases
    assert sorted(r.abi for r in _releases("bookworm-backports")) == ["6.12.43+deb12", "6.12.57+deb12", "6.12.69+deb12"]


def test_a_series_release_upstream_version_or_newest_names_one_release():
    from offlab.vm import kernels

    known = sorted(_releases("bookworm-security") + _releases("bookworm-backports") + _releases("trixie-backports"),
                   key=lambda r: kernels.debian_key(r.version))
    pick = lambda spec: kernels.choose(spec, known).abi  # noqa: E731
    assert (pick("6.1"), pick("6.12"), pick("7.2"), pick("newest")) == \
        ("6.1.0-56", "6.12.69+deb12", "7.2.12+deb13", "7.2.12+deb13")
    assert (pick("6.12.57+deb12"), pick("6.1.0-55"), pick("6.1.192")) == ("6.12.57+deb12", "6.1.0-55", "6.1.0-56")
    assert kernels.choose("6.1", known).suite == "bookworm-security"


def test_an_unknown_release_names_the_field_and_the_nearest_that_exist():
    from offlab.errors import BadInput
    from offlab.vm import kernels

    known = _releases("bookworm-backports") + _releases("trixie-backports")
    with pytest.raises(BadInput) as exc:
        kernels.choose("6.12.58+deb12", known, "--kernel-version")
    assert str(exc.value) == ("--kernel-version 6.12.58+deb12: Debian's archive has no cloud kernel 6.12.58+deb12; "
                              "nearest: 6.12.43+deb12, 6.12.57+deb12, 6.12.69+deb12, 6.18.15+deb13")
    assert exc.value.exit_code == 2
    with pytest.raises(BadInput, match=r"kernel_version 9\.9: .*series: 6\.12, 6\.18, 7\.2$"):
        kernels.choose("9.9", known)
    with pytest.raises(BadInput, match="kernel_version '6.1; rm -rf /': write a series"):
        kernels.check_spec("6.1; rm -rf /")


def test_debian_version_order_agrees_with_dpkg():
    from offlab.vm import kernels

    versions = ["6.12.57-1~bpo12+1", "6.12.57-1", "6.12.57-1+deb12u1", "6.1.192-2", "6.12.117-1~deb12u1",
                "7.2.12-1~bpo13+1", "7.2.13-1", "1:6.1-1", "6.12~rc3-1~exp1", "6.12-1", "6.12a-1", "6.12.0-1"]
    ours = sorted(versions, key=kernels.debian_key)
    for a, b in zip(ours, ours[1:], strict=False):
        assert subprocess.run(["dpkg", "--compare-versions", a, "le", b]).returncode == 0, (a, b)


def test_the_default_kernel_and_the_series_asked_for_by_name_remember_their_images_apart(tmp_path, monkeypatch):
    """The default guest (the machine's apt's newest 6.12, 6.12.117+deb12) and `kernel_version: "6.12"` (the
    archive's newest, trixie's 6.12.117+deb13) once shared vm/inputs-6.12.json: a kernels-suite run's 6.12 cells
    booted trixie's kernel in round 1 and bookworm's after another session's default guest rewrote the file."""
    from offlab.vm import image

    monkeypatch.setenv("OFFLAB_CACHE_DIR", str(tmp_path))
    assert image._remembered(None) != image._remembered("6.12")
    assert image._fingerprint(None, []) != image._fingerprint("6.12", [])


def test_apt_get_update_output_names_the_suites_that_could_not_be_reached():
    from offlab.vm import kernels

    suites = list(kernels.SUITES)
    for fixture in ("apt-get-update-refused.txt", "apt-get-update-file-missing.txt"):
        assert kernels.unreachable_suites((FIXTURES / fixture).read_text(), suites) == suites, fixture
    assert kernels.unreachable_suites((FIXTURES / "apt-get-update-ok.txt").read_text(), suites) == []
    one = "\n".join(l for l in (FIXTURES / "apt-get-update-refused.txt").read_text().splitlines()
                    if "trixie-backports" in l or not l.startswith(("Err", "W:")))
    assert kernels.unreachable_suites(one, suites) == ["trixie-backports"]


def test_the_archive_is_the_one_the_machines_sources_name(tmp_path, monkeypatch):
    from offlab.vm import kernels

    monkeypatch.delenv("OFFLAB_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\n"
        "URIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n")
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/x bullseye main\n")
    uris = kernels.archive_uris(tmp_path)
    assert uris == {"debian": "http://mirror.example/debian", "security": "http://mirror.example/debian-security"}
    text, suites = kernels.sources_list(uris)
    assert suites == list(kernels.SUITES)
    assert text.splitlines()[1] == ("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                                    "http://mirror.example/debian-security bookworm-security main")


def test_plan_kernel_version_for_every_guest_or_per_role():
    from offlab.experiment.plan import load_plan
    from offlab.errors import BadInput

    base = "name: k\nworkload: {tool: iperf3}\n"
    plan = load_plan(base + "topology: {kind: vm-pair, kernel_version: {client: '6.1', server: '7.2'}}\n")
    assert plan.topology.kernel_version == {"client": "6.1", "server": "7.2"}
    for topo, words in (("{kind: vm-pair, kernel_version: {router: '6.1'}}", "vm-pair's guests are client, server"),
                        ("{kind: veth, kernel_version: '6.1'}", "topologies with guests"),
                        ("{kind: vm, kernel_version: '6.1;x'}", "write a series")):
        with pytest.raises(BadInput, match=re.escape(words)):
            load_plan(base + f"topology: {topo}\n")


def test_compare_names_a_guest_kernel_or_qemu_change_first(tmp_path):
    """Two stored runs whose vm guests ran other kernels and QEMUs (and a sysctl changed): those come first."""
    import copy

    from offlab.report import envdiff
    from offlab.store import Store
    from tests.helpers import ENV, store_two

    def guest_env(release: str, version: str, suite: str, qemu: str) -> dict:
        env = copy.deepcopy(ENV)
        env["labs"][0]["topology"] = "vm"
        env["labs"][0]["hosts"]["client"]["guest"] = {
            "accel": "tcg", "qemu_version": qemu, "kernel_release": f"{release}-cloud-amd64",
            "kernel_package": f"linux-image-{release}-cloud-amd64", "kernel_package_version": version,
            "kernel_suite": suite}
        return env

    a = guest_env("6.1.0-56", "6.1.192-2", "bookworm-security", "10.0.2")
    b = guest_env("7.2.12+deb13", "7.2.12-1~bpo13+1", "trixie-backports", "7.2.22")
    b["sysctls"]["net.core.rmem_max"] = "8388608"
    db, ra, rb = store_two(tmp_path, a, b)
    with Store.open(db, create=False) as s:
        d = envdiff.env_diff(s, ra, rb)
    assert [(c.kind, c.what, c.a, c.b) for c in d.changes] == [
        ("guest", "guest client kernel package version", "6.1.192-2", "7.2.12-1~bpo13+1"),
        ("guest", "guest client kernel release", "6.1.0-56-cloud-amd64", "7.2.12+deb13-cloud-amd64"),
        ("guest", "guest client kernel suite", "bookworm-security", "trixie-backports"),
        ("guest", "guest client qemu version", "10.0.2", "7.2.22"),
        ("sysctl", "sysctl net.core.rmem_max", "4194304", "8388608")]
    del a["labs"][0]["hosts"]["client"]["guest"]["kernel_suite"]  # stored by an older offlab: not a change
    db, ra, rb = store_two(tmp_path / "old", a, guest_env("6.1.0-56", "6.1.192-2", "bookworm-security", "10.0.2"))
    with Store.open(db, create=False) as s:
        assert [c.what for c in envdiff.env_diff(s, ra, rb).changes] == []


# ---- the archive itself: offlab's cache, fetched once ---------------------------------------------
def _machine_apt() -> str:
    """Checksums of /etc/apt and /var/lib/apt/lists and `dpkg -l 'linux-image*'`: what must not change."""
    h = hashlib.sha256()
    for root in ("/etc/apt", "/var/lib/apt/lists"):
        for dirpath, _, files in sorted(os.walk(root)):
            for f in sorted(files):
                p = os.path.join(dirpath, f)
                if f != "lock" and os.path.isfile(p):
                    h.update(p.encode() + hashlib.sha256(Path(p).read_bytes()).digest())
    h.update(subprocess.run(["dpkg", "-l", "linux-image*"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()


@requires_root
@pytest.mark.network
def test_the_archive_lists_and_a_kernel_come_through_offlabs_apt_state_once():
    """Refreshes offlab's lists (their InRelease files only, when unchanged) and fetches the 6.1 kernel
    into offlab's cache if no earlier run did; the machine's apt state and kernels stay as they were."""
    from offlab.vm import kernels

    before = _machine_apt()
    data = kernels.index(refresh=True)
    assert data["suites"] == list(kernels.SUITES)
    release = kernels.choose(OLD, kernels.releases(data))
    paths = kernels.fetch(release)
    stamps = [p.stat().st_mtime_ns for p in paths]
    # nothing downloaded again: a fetch writes a new file and renames it into place, a new mtime
    assert kernels.fetch(release) == paths and [p.stat().st_mtime_ns for p in paths] == stamps
    assert _machine_apt() == before
    assert (kernels.state_dir() / "sources.list").read_text().count("signed-by=") == len(kernels.SUITES)


@requires_root
@pytest.mark.network
def test_bad_kernel_versions_are_one_line_exit_2_and_fetch_nothing():
    from offlab.vm import kernels

    debs = set(os.listdir(kernels.debs_dir())) if kernels.debs_dir().exists() else set()
    for args, words in ((("vm", "image", "--kernel-version", "6.12.58+deb12"), "nearest: 6.12.43+deb12, 6.12.57+deb12"),
                        (("lab", "up", "vm", "--name", "tkbad", "--kernel-version", "9.9"), "series: 6.1, 6.12"),
                        (("lab", "up", "vm-pair", "--name", "tkbad", "--kernel-version", "router=6.1"),
                         "vm-pair's guests are client, server"),
                        (("lab", "up", "veth", "--name", "tkbad", "--kernel-version", "6.1"), "topologies with guests")):
        res = offlab_in_process(*args)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and "--kernel-version" in res.stderr and words in res.stderr, res.stderr
    assert (set(os.listdir(kernels.debs_dir())) if kernels.debs_dir().exists() else set()) == debs
    assert not any(n.startswith("ol-tkbad-") for n in netns_names())  # no lab was begun


def test_an_archive_suite_that_cannot_be_reached_is_exit_3_naming_it(tmp_path):
    res = offlab_cli("vm", "image", "--kernel-version", "6.12", timeout=300,
                     env={"OFFLAB_CACHE_DIR": str(tmp_path), "OFFLAB_DEBIAN_MIRROR": "file:///nonexistent/debian"})
    assert res.returncode == 3, res.stderr
    assert res.stderr.startswith("offlab: error: Debian archive suites bookworm, bookworm-security, bookworm-backports, "
                                 "trixie, trixie-backports, sid could not be reached or verified")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "vm" / "debs").exists()


@requires_root
def test_vm_image_list_shows_cached_kernels_and_remove_deletes_one(tmp_path, monkeypatch):
    """A cache of its own: offlab's 6.1 package hard-linked in (fetched by the test above or a run)."""
    from offlab.errors import BadInput
    from offlab.vm import kernels

    have = sorted(kernels.debs_dir().glob("linux-image-6.1.0-*-cloud-amd64_*.deb"))
    if not have:
        pytest.skip("no 6.1 kernel package in offlab's cache yet")
    deb = have[-1]
    abi = deb.name.split("_")[0][len("linux-image-"):-len("-cloud-amd64")]
    monkeypatch.setenv("OFFLAB_CACHE_DIR", str(tmp_path))
    kernels.debs_dir().mkdir(parents=True)
    os.link(deb, kernels.debs_dir() / deb.name)
    listed = kernels.cached()
    assert [(c.abi, c.deb_bytes, c.images) for c in listed] == [(abi, deb.stat().st_size, [])]
    res = offlab_in_process("vm", "image", "--list")
    assert res.returncode == 0, res.stderr
    row = next(l for l in res.stdout.splitlines() if l.startswith(abi))
    assert f"{deb.stat().st_size / 2**20:.0f} MiB" in row and "--remove RELEASE" in res.stdout
    with pytest.raises(BadInput, match=f"--remove 7.2: is not in the cache \\(cached: {re.escape(abi)}\\)"):
        kernels.remove("7.2")
    res = offlab_in_process("vm", "image", "--remove", abi)
    assert res.returncode == 0 and res.stdout.startswith(f"removed {abi}"), res.stderr
    assert kernels.cached() == [] and deb.exists()  # offlab's own cache keeps its copy


# ---- real guests: 6.1 and 7.2 side by side ----------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    yield from module_lab(tmp_path_factory, "vm-pair", "kp", "--kernel-version", f"client={OLD}",
                          "--kernel-version", f"server={NEW}", timeout=600)


class TestGuests:
    pytestmark = GUEST_MARKS

    @pytest.mark.parametrize("role, release", [("client", "6.1.0-"), ("server", "7.2.12+deb13-cloud-amd64")])
    def test_each_guest_runs_the_kernel_asked_for(self, pair, role, release):
        res = offlab_cli("lab", "exec", pair["name"], role, "--", "uname", "-r", env=pair["env"])
        assert res.returncode == 0 and res.stdout.startswith(release), res.stderr
        guest = pair["shown"]["hosts"][role]["guest"]
        assert guest["kernel_release"] == res.stdout.strip()
        assert guest["kernel_entry"] == "pvh" and guest["kernel_suite"] in ("bookworm-security", "trixie-backports")

    def test_a_sample_stores_each_guests_kernel_package_and_qemu(self, pair):
        # paced: what is checked is what the sample stores of each guest, not the two TCG guests' rate
        res = offlab_cli("measure", pair["name"], "--tool", "iperf3", "--duration", "1", "--warmup", "0", "--rate", "50M",
                         "--json", env=pair["env"], timeout=300)
        assert res.returncode == 0, res.stderr
        guests = json.loads(res.stdout)["guests"]
        for role, shown in pair["shown"]["hosts"].items():
            if shown.get("guest"):
                stored = {k: guests[role][k] for k in ("kernel_release", "kernel_package", "kernel_package_version",
                                                       "kernel_suite", "qemu_version")}
                assert stored == {k: shown["guest"][k] for k in stored}
        assert guests["server"]["kernel_package_version"] == "7.2.12-1~bpo13+1"


def test_compare_between_cells_of_one_run_names_their_guest_kernels_first(tmp_path):
    """A kernel axis: two cells of one run whose guests ran other kernels (a real guest sample, its kernel
    release as a 6.1 guest reports it in one cell): compare names the versions before any figure."""
    import copy

    from offlab.store import Store

    real = json.loads((Path(REPO) / "tests" / "fixtures" / "effects" / "vm-xps-udp.json").read_text())
    old = copy.deepcopy(real)
    old["guests"]["client"]["kernel_release"] = "6.1.0-56-cloud-amd64"
    db = tmp_path / "k.db"
    with Store.open(db) as s:
        run = s.create_run("k", "name: k", {}, 1, {}, {"kernel": "6.1"}, {"level": 95, "until": "width"})
        cells = s.add_cells(run, [{"key": f"kernel={k}", "params": {"kernel": k}, "settings": {}} for k in ("6.1", "6.12")])
        for key, sample, factor in (("kernel=6.1", old, 1.0), ("kernel=6.12", real, 0.5)):
            for rnd, v in enumerate((1.0e9, 1.02e9, 0.98e9)):
                s.add_sample(run, cells[key], rnd, sample, {"throughput_bps": v * factor})
            s.set_cell_status(cells[key], "done")
        s.set_run_status(run, "done")
    res = offlab_in_process("compare", str(run), "--db", str(db), "--metric", "throughput_bps")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    at = next(i for i, l in enumerate(lines) if "on other versions" in l)
    assert lines[at].strip() == ("on other versions: guest client kernel release: 6.1.0-56-cloud-amd64 → "
                                 "6.12.117+deb12-cloud-amd64")
    assert at < next(i for i, l in enumerate(lines) if l.lstrip().startswith("throughput"))
    [row] = json.loads(offlab_in_process("compare", str(run), "--db", str(db), "--metric", "throughput_bps", "--json").stdout)["rows"]
    assert row["versions"] == ["guest client kernel release: 6.1.0-56-cloud-amd64 → 6.12.117+deb12-cloud-amd64"]
    res = offlab_in_process("compare", str(run), "--db", str(db), "--metric", "throughput_bps", "--fail-if-slower", "10")
    assert res.returncode == 1 and res.stderr.startswith("offlab: kernel=6.12: throughput -50.0 % vs kernel=6.1 ")
    assert res.stderr.rstrip().endswith("; on other versions: guest client kernel release: 6.1.0-56-cloud-amd64 → "
                                        "6.12.117+deb12-cloud-amd64"), res.stderr
