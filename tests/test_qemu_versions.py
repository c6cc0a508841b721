"""QEMU as an experiment axis (offlab.vm.qemus): Debian's 7.2 beside the installed QEMU.

The resolution runs on real captured text (tests/fixtures/qemu: the archive's Packages stanzas of
qemu-system-x86, -common, -data and three libraries from every suite offlab's apt state lists, and
`dpkg-query -W` of this machine for every package their Depends name). The guest tests fetch 7.2
into offlab's own cache once (the first test or `offlab` command that needs it) and boot real TCG
guests on 7.2 and on the installed QEMU.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, offlab_cli
from tests.helpers import GUEST_MARKS

FIXTURES = Path(REPO) / "tests" / "fixtures" / "qemu"
SUITES = ("bookworm", "bookworm-security", "bookworm-backports", "trixie", "trixie-backports", "sid")
INSTALLED = "10.0.2"  # what `qemu-system-x86_64 --version` said when the fixtures were captured


def _lists() -> dict[str, list[dict[str, str]]]:
    from offlab.vm import qemus

    return {s: qemus.stanzas((FIXTURES / f"Packages-{s}").read_text()) for s in SUITES}


def _machine(drop: tuple[str, ...] = (), libc: str | None = None):
    from offlab.vm import qemus

    lines = [line for line in (FIXTURES / "dpkg-query.txt").read_text().splitlines()
             if line.split("\t")[0] not in drop]
    if libc is not None:
        lines = [f"libc6\t{libc}\tii \t" if line.startswith("libc6\t") else line for line in lines]
    return qemus.Machine.parse("\n".join(lines) + "\n")


def test_72_is_bookworms_newest_build_and_needs_only_qemus_own_packages_here():
    from offlab.vm import qemus

    found, m = qemus.candidates(_lists()), _machine()
    pick = qemus.choose("7.2", INSTALLED, found, m)
    assert (pick.version, pick.suite) == ("1:7.2+dfsg-7+deb12u18+b3", "bookworm")  # newer than bookworm-security's
    debs, not_fetched = qemus.closure(pick, _lists(), m)
    assert [(d.name, d.version) for d in debs] == [
        ("qemu-system-x86", "1:7.2+dfsg-7+deb12u18+b3"),
        ("qemu-system-common", "1:7.2+dfsg-7+deb12u18+b3"),  # the installed 10.0's is another version
        ("qemu-system-data", "1:7.2+dfsg-7+deb12u18")]  # arch: all, not binNMU'd: the source's version
    # qemu-system-common's Depends the machine lacks serve modules loaded on demand (audio, SPICE)
    assert not_fetched == ["libsndio7.0 (>= 1.8.1)", "libspice-server1 (>= 0.14.2)"]


def test_a_library_the_machine_lacks_is_fetched_from_qemus_suite_with_why():
    from offlab.vm import qemus

    m = _machine(drop=("libslirp0",))
    pick = qemus.choose("7.2", INSTALLED, qemus.candidates(_lists()), m)
    debs, _ = qemus.closure(pick, _lists(), m)
    slirp = next(d for d in debs if d.name == "libslirp0")
    assert (slirp.version, slirp.suite, slirp.why) == ("4.7.0-1", "bookworm", "qemu-system-x86: libslirp0 (>= 4.7.0)")


def test_the_installed_series_and_installed_need_nothing_fetched():
    from offlab.vm import qemus

    found, m = qemus.candidates(_lists()), _machine()
    assert qemus.choose("10.0", INSTALLED, found, m) is None
    assert qemus.choose("installed", INSTALLED, found, m) is None


def test_a_version_this_machine_cannot_have_is_one_line_naming_what_it_can_and_the_glibc_the_rest_need():
    from offlab.errors import BadInput
    from offlab.vm import qemus

    found, m = qemus.candidates(_lists()), _machine()
    with pytest.raises(BadInput) as exc:
        qemus.choose("11.1", INSTALLED, found, m, "--qemu")
    assert str(exc.value) == (
        "--qemu 11.1: Debian has no qemu-system-x86 11.1 for this machine; available: 7.2 (bookworm, "
        "bookworm-security), 10.0 (installed); newer builds need a newer glibc than this machine's 2.36: "
        "10.0 in trixie (glibc >= 2.38), 11.1 in trixie-backports (glibc >= 2.38), 11.1 in sid (glibc >= 2.43)")
    assert exc.value.exit_code == 2
    with pytest.raises(BadInput, match=r"qemu 8\.2: Debian has no qemu-system-x86 8\.2"):
        qemus.choose("8.2", INSTALLED, found, m)
    with pytest.raises(BadInput, match=r"qemu '7.2; rm -rf /': write a QEMU series as a string"):
        qemus.check_spec("7.2; rm -rf /")
    # the same lists on a machine with a newer C library: trixie-backports' 11.1 runs, sid's does not
    assert qemus.choose("11.1", "7.2.22", found, _machine(libc="2.41-12")).suite == "trixie-backports"


def test_relations_agree_with_dpkg():
    from offlab.vm import qemus

    (alts,) = qemus.depends("libfoo1:any (>= 1:2.0~rc1) | libbar2")
    assert [str(a) for a in alts] == ["libfoo1 (>= 1:2.0~rc1)", "libbar2"]
    pairs = [("1:7.2+dfsg-7+deb12u18+b3", "1:7.2+dfsg-7+deb12u18~"), ("1:10.0.2+ds-2+deb13u1~bpo12+1", "1:10.0.2+ds-2"),
             ("2.36-9+deb12u14", "2.38"), ("1:7.2+dfsg-7+deb12u15", "1:7.2+dfsg-7+deb12u18+b3")]
    for a, b in pairs:
        for op in ("<<", "<=", "=", ">=", ">>"):
            dpkg = {"<<": "lt", "<=": "le", "=": "eq", ">=": "ge", ">>": "gt"}[op]
            want = subprocess.run(["dpkg", "--compare-versions", a, dpkg, b]).returncode == 0
            assert qemus.Relation("x", op, b).satisfied_by(a) is want, (a, op, b)


def _chain(case: str):
    import json

    from offlab.netdev import parse_features
    from offlab.vm import virtio

    d = Path(REPO) / "tests" / "fixtures" / "virtio" / case
    status = json.loads((d / "x-query-virtio-status.json").read_text())
    props = json.loads((d / "qom-get.json").read_text())
    nic = json.loads((d / "nic.json").read_text())
    tap = (d / "tap-ethtool-k.txt")
    return virtio.build(
        role="client", iface="eth0", device_id="nic0", effective=props, set_props=nic["set_properties"],
        offered=virtio.parse_status_features(status["host-features"]),
        accepted=virtio.parse_sysfs_features((d / "guest-features").read_text()),
        guest_feats=parse_features((d / "guest-ethtool-k.txt").read_text()),
        tap_feats=parse_features(tap.read_text()) if tap.exists() else None, tap="olq0" if tap.exists() else None,
        tap_host="server", vhost_user=None if tap.exists() else "/run/x/vhost0.sock",
        absent={link.prop for link in virtio.LINKS if link.prop not in props}, qemu_version=nic["qemu"])


def test_the_chain_of_a_72_guest_says_qemu_has_no_uso_property_and_which_side_lacks_each_bit():
    chain = _chain("qemu72_default")
    uso = chain.row("host_uso")
    assert (uso.source, uso.offered, uso.lacking) == ("absent", False, "QEMU")
    assert uso.why == ("tx-udp-segmentation off [fixed]: QEMU 7.2.22 has no property host_uso: VIRTIO_NET_F_HOST_USO "
                       "(bit 56) not offered (QEMU does not offer it)")
    assert chain.row("guest_uso4").why.startswith("tx-udp-segmentation off: QEMU 7.2.22 has no property guest_uso4")
    assert {r.prop: r.lacking for r in chain.rows if r.lacking} == {
        "host_uso": "QEMU", "guest_uso4": "QEMU", "guest_uso6": "QEMU", "mq": "QEMU setting"}
    row = next(line for line in chain.lines() if line.lstrip().startswith("host_uso"))
    assert row.split()[:7] == ["host_uso", "-", "absent", "56", "no", "no", "QEMU"]
    # the other sides, on QEMU 10.0 captures: a property set off, a backend that cannot, all negotiated
    assert _chain("host_uso_off").row("host_uso").lacking == "QEMU setting"
    assert _chain("dpdk_vhost_user").row("host_uso").lacking == "backend"
    assert not [r.prop for r in _chain("default").rows if r.lacking and r.prop != "mq"]


# ---- real guests ---------------------------------------------------------------------------------
def _dpkg_l() -> str:
    return subprocess.run(["dpkg", "-l", "qemu-system-*", "seabios", "ipxe-qemu"], capture_output=True,
                          text=True).stdout


def _system_files() -> dict[str, tuple[int, int]]:
    """Size and mtime of every file the installed QEMU packages own."""
    names = subprocess.run(["dpkg-query", "-L", "qemu-system-x86", "qemu-system-common", "qemu-system-data"],
                           capture_output=True, text=True).stdout.split()
    out = {}
    for n in names:
        p = Path(n)
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[n] = (st.st_size, st.st_mtime_ns)
    return out


PLAN = {
    "name": "qemu-axis",
    "topology": {"kind": "vm"},
    "axes": {
        "qemu": {
            "7.2": {"topology": {"qemu": "7.2"}},
            "10.0": {"topology": {"qemu": "10.0"}},
            # asks 7.2 for a property it does not have: skipped before any guest boots for it
            "7.2-no-host-uso": {"topology": {"qemu": "7.2", "nic": {"host_uso": False}}},
        },
        "tx": {
            "plain": {"features": {"client": {"tx-udp-segmentation": "off"}}, "workload": {"gso": False}},
            "uso": {"features": {"client": {"tx-udp-segmentation": "on"}}, "workload": {"gso": True}},
        },
    },
    "exclude": [{"qemu": "7.2-no-host-uso", "tx": "uso"}],
    # the checks read which QEMU ran each cell and that traffic flowed, not its rate: short and paced
    "workload": {"tool": "engine", "protocol": "udp", "duration": 0.5, "warmup": 0.2, "rate": "20M"},
    "repeat": {"min": 1, "max": 1, "level": 95, "width": 200},
    "seed": 7,
}


class TestGuests:
    pytestmark = [*GUEST_MARKS, pytest.mark.usefixtures("clean_machine")]

    @pytest.mark.timeout(1800)
    def test_a_plan_over_qemu_72_and_100_skips_what_72_lacks_with_the_chains_reason_and_measures_the_rest(
            self, tmp_path):
        before, files = _dpkg_l(), _system_files()
        plan = tmp_path / "qemu.yaml"
        plan.write_text(yaml.safe_dump(PLAN, sort_keys=False))
        db = tmp_path / "r.db"
        res = offlab_cli("run", str(plan), "--db", str(db), timeout=1700)
        assert res.returncode == 0, res.stderr[-2000:]

        from offlab.store import Store

        store = Store.open(db)
        (run,) = store.list_runs()
        cells = {c["key"]: c for c in store.cells(run["id"])}
        samples = {s["cell_id"]: s["sample"] for s in store.samples(run["id"])}
        store.close()
        by = lambda q, tx: cells[f"qemu={q},tx={tx}"]  # noqa: E731
        # the chain says why: QEMU 7.2 has no host_uso, so the guest's tx-udp-segmentation stays [fixed] off
        uso72 = by("7.2", "uso")
        assert uso72["status"] == "skipped", uso72
        assert "QEMU 7.2.22 has no property host_uso: VIRTIO_NET_F_HOST_USO (bit 56) not offered" in uso72["reason"]
        assert uso72["id"] not in samples
        nic72 = by("7.2-no-host-uso", "plain")
        assert nic72["status"] == "skipped" and "QEMU 7.2.22 has no property host_uso" in nic72["reason"], nic72
        for q, tx, version, suite in (("7.2", "plain", "7.2.22", "bookworm"), ("10.0", "plain", "10.0.2", "installed"),
                                      ("10.0", "uso", "10.0.2", "installed")):
            cell = by(q, tx)
            assert cell["status"] in ("done", "confidence_not_reached"), (q, tx, cell["reason"])
            guest = samples[cell["id"]]["guests"]["client"]
            assert (guest["qemu_version"], guest["qemu_suite"]) == (version, suite)
            assert samples[cell["id"]]["traffic"]["throughput_bps"] > 0
        # the installed QEMU package and its files are untouched
        assert _dpkg_l() == before
        assert _system_files() == files

    def test_bad_qemu_versions_are_one_line_exit_2_and_fetch_nothing(self, tmp_path):
        from offlab.vm import qemus

        have = sorted(Path(c.dir).name for c in qemus.cached())
        res = offlab_cli("lab", "up", "vm", "--name", "qbad", "--qemu", "11.1")
        assert res.returncode == 2, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("offlab: error: --qemu 11.1: Debian has no qemu-system-x86 11.1 for this machine; "
                               "available: 7.2 (bookworm")
        assert "newer builds need a newer glibc than this machine's" in line and "Traceback" not in res.stderr
        plan = tmp_path / "p.yaml"
        plan.write_text("name: p\ntopology: {kind: vm, qemu: '9.9'}\nworkload: {tool: iperf3}\n")
        res = offlab_cli("run", str(plan), "--validate")
        assert res.returncode == 2 and "qemu 9.9: Debian has no qemu-system-x86 9.9" in res.stderr, res.stderr
        res = offlab_cli("lab", "up", "veth", "--name", "qbad", "--qemu", "7.2")
        assert res.returncode == 2 and "--qemu is for topologies with guests" in res.stderr, res.stderr
        assert sorted(Path(c.dir).name for c in qemus.cached()) == have

    def test_a_qemu_and_kernel_seen_not_to_boot_together_are_refused_in_one_line_before_anything_is_built(self):
        res = offlab_cli("lab", "up", "vm", "--name", "qpanic", "--qemu", "7.2", "--kernel-version", "6.12.95+deb12")
        assert res.returncode == 3, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("offlab: error: QEMU 7.2.22 cannot boot guest kernel 6.12.95+deb12: Debian's QEMU 7.2 "
                               "(TCG) panics this kernel early in boot")
        assert not any(n.startswith("ol-qpanic-") for n in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


@pytest.mark.network
def test_a_library_the_machine_lacks_is_fetched_unpacked_and_found_through_ld_library_path(tmp_path, monkeypatch):
    """A cache of its own (offlab's archive lists copied in), on a machine said to lack libslirp0:
    7.2 comes with bookworm's libslirp0, and the unpacked binary runs with that copy."""
    import shutil

    from offlab.vm import image, kernels, qemus

    shutil.copytree(kernels.state_dir(), tmp_path / "vm" / "archive")
    monkeypatch.setenv("OFFLAB_CACHE_DIR", str(tmp_path))
    assert image.cache_root() == tmp_path / "vm"
    real = qemus.machine()
    lacking = qemus.Machine({k: v for k, v in real.installed.items() if k != "libslirp0"}, real.provides)
    monkeypatch.setattr(qemus, "machine", lambda: lacking)
    q = qemus.resolve("7.2")
    (libdir,) = dict(q.env)["LD_LIBRARY_PATH"].split(":")
    assert libdir.startswith(str(tmp_path)) and (Path(libdir) / "libslirp.so.0").exists()
    ldd = subprocess.run(["env", *(f"{k}={v}" for k, v in q.env), "ldd", q.binary], capture_output=True,
                         text=True).stdout
    assert f"libslirp.so.0 => {libdir}/libslirp.so.0" in ldd and "not found" not in ldd
    out = subprocess.run(q.argv() + ["--version"], capture_output=True, text=True).stdout
    assert out.startswith(f"QEMU emulator version {q.version}")
    assert [d.split("_")[0] for d in sorted(p.name for p in (tmp_path / "vm" / "debs").iterdir())] == [
        "libslirp0", "qemu-system-common", "qemu-system-data", "qemu-system-x86"]


def test_vm_qemu_lists_the_installed_and_cached_versions_and_removes_one(tmp_path, monkeypatch):
    """A cache of its own: an unpacked QEMU (its tree and .deb files) is listed with its disk use and removed."""
    import json

    from offlab.vm import qemus

    cache = tmp_path / "cache"
    target = cache / "vm" / "qemu" / "1%3a7.2+dfsg-7+deb12u18+b3"
    (target / "root").mkdir(parents=True)
    (target / "root" / "blob").write_bytes(b"x" * 300_000)
    deb = cache / "vm" / "debs" / "qemu-system-x86_7.2+dfsg-7+deb12u18+b3_amd64.deb"
    deb.parent.mkdir(parents=True)
    deb.write_bytes(b"y" * 200_000)
    q = qemus.Qemu("7.2.22", "1:7.2+dfsg-7+deb12u18+b3", "bookworm", str(target / "root/usr/bin/qemu-system-x86_64"),
                   (("QEMU_MODULE_DIR", str(target / "root/usr/lib/x86_64-linux-gnu/qemu")),),
                   (str(target / "root/usr/share/qemu"), "/usr/share/seabios", "/usr/lib/ipxe/qemu"))
    (target / "qemu.json").write_text(json.dumps({"qemu": q.to_json(), "files": [str(deb)],
                                                  "modules_that_cannot_load": []}))
    env = {"OFFLAB_CACHE_DIR": str(cache)}
    res = offlab_cli("vm", "qemu", "--list", env=env)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("7.2.22"))
    assert "bookworm" in row and row.split()[-2:] == ["0", "MiB"]  # 0.5 MB rounds to 0 MiB
    listed = json.loads(offlab_cli("vm", "qemu", "--list", "--json", env=env).stdout)
    assert listed[0]["suite"] == "installed" and listed[1]["bytes"] >= 500_000
    bad = offlab_cli("vm", "qemu", "--remove", "8.0", env=env)
    assert bad.returncode == 2 and "--remove 8.0: is not in the cache (cached: 7.2.22 (bookworm)" in bad.stderr
    res = offlab_cli("vm", "qemu", "--remove", "7.2", env=env)
    assert res.returncode == 0 and res.stdout.startswith("removed QEMU 7.2.22"), res.stderr
    assert not target.exists() and not deb.exists()
