"""Warm starts: a guest restored from a saved one (offlab.vm.saved), and what happens when the
saved guest is missing, corrupt, or its writer or reader is killed with -9. Real QEMU (TCG):
the boots are few and each test says how many it costs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, kill_9_once_daemon_is_recorded, netns_names, offlab_cli, requires_root, running

needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (scripts/install-deps installs it)")


@pytest.fixture
def saved_dir(tmp_path, monkeypatch):
    d = tmp_path / "saved"
    monkeypatch.setenv("OFFLAB_VM_SAVED_DIR", str(d))
    return d


# ---- no boot -------------------------------------------------------------------------
def test_digest_reads_data_and_where_it_is_not_the_holes(tmp_path):
    from offlab.vm.saved import digest

    a = tmp_path / "a"
    with open(a, "wb") as f:
        f.truncate(64 << 20)
        f.seek(8 << 20)
        f.write(b"guest page")
    first = digest(a)
    assert digest(a) == first
    with open(a, "r+b") as f:  # the same bytes one page further: another saved guest
        f.seek(8 << 20)
        f.write(b"\0" * 10)
        f.seek((8 << 20) + 4096)
        f.write(b"guest page")
    assert digest(a) != first
    with open(a, "r+b") as f:
        f.seek((8 << 20) + 4096)
        f.write(b"guest pagE")
    assert digest(a) not in (first, "")


def test_a_saved_guest_that_does_not_match_its_manifest_is_deleted_not_used(saved_dir):
    from offlab.vm import saved

    d = saved_dir / "00000000000000aa"
    d.mkdir(parents=True)
    (d / "state").write_bytes(b"x" * 100)
    (d / "saved.json").write_text(json.dumps({"key": d.name, "size": 100, "sha256": "0" * 64}))
    state, manifest, why = saved.load(d.name)
    assert (state, manifest) == (None, None)
    assert "checksum does not match" in why and not d.exists()

    d.mkdir()
    (d / "state").write_bytes(b"x" * 100)
    (d / "saved.json").write_text(json.dumps({"key": d.name, "size": 100, "sha256": saved.digest(d / "state")}))
    state, manifest, why = saved.load(d.name)
    assert state == d / "state" and why == ""
    (d / "state").write_bytes(b"x" * 50)  # half-written
    state, manifest, why = saved.load(d.name)
    assert state is None and "its state file is 50 bytes, not 100" in why and not d.exists()
    assert saved.load(d.name)[2] == "no saved guest of this kind yet"


@contextlib.contextmanager
def restoring_from(key: str):
    """Another offlab restoring from saved guest `key` (a process holding what a restore holds)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys\nfrom offlab.vm import saved\n"
                             f"with saved._in_use({key!r}):\n    print('held', flush=True)\n    sys.stdin.read()"],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_saved_guest_another_offlab_restores_from_is_kept_then_deleted_by_the_last_user(saved_dir):
    # Labs started at once share a saved guest: one lab's failure (here a mismatch; a QEMU killed mid-restore
    # or a timeout too) must not delete the file another lab's QEMU is loading, which would then exit mid-load.
    from offlab.vm import saved

    d = saved_dir / "00000000000000bb"
    d.mkdir(parents=True)
    (d / "state").write_bytes(b"x" * 100)
    (d / "saved.json").write_text(json.dumps({"key": d.name, "size": 100, "sha256": "0" * 64}))
    with restoring_from(d.name):
        with saved._in_use(d.name) as lock:
            state, _, why = saved.load(d.name, lock)
        assert state is None and why.endswith("checksum does not match): kept: another offlab is restoring from it")
        assert d.exists()
        saved._prune(saved_dir, keep=0)  # nor is it pruned meanwhile
        assert d.exists()
    with saved._in_use(d.name) as lock:
        state, _, why = saved.load(d.name, lock)
    assert why.endswith("checksum does not match): deleted") and not d.exists()
    log = (saved_dir / "discarded.log").read_text().splitlines()  # why warm starts went cold, kept
    assert [l.split(": ", 1)[1] for l in log] == [
        f"kept: another offlab is restoring from it: saved guest {d.name} was unusable (its state file's checksum does not match)",
        f"deleted: saved guest {d.name} was unusable (its state file's checksum does not match)"], log


def test_a_restore_waits_for_the_monitor_to_listen_not_only_for_its_socket_file(tmp_path):
    # QEMU makes its monitor's socket file at bind(), a moment before listen(): a connect in between is
    # refused. Here a socket bound but not yet listening, which listens 0.3 s later and then answers QMP.
    import socket
    import threading
    from types import SimpleNamespace

    from offlab.vm import saved

    path = str(tmp_path / "m.qmp")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)

    def qemu_monitor():
        time.sleep(0.3)
        server.listen(1)
        conn, _ = server.accept()
        conn.sendall(b'{"QMP": {"version": {}}}\n')
        conn.recv(4096)  # qmp_capabilities
        conn.sendall(b'{"return": {}}\n')
        conn.recv(4096)
        conn.close()

    threading.Thread(target=qemu_monitor, daemon=True).start()
    alive = subprocess.Popen(["sleep", "30"])  # the QEMU process stand-in: alive meanwhile
    try:
        q = saved._monitor(SimpleNamespace(qmp=path), alive, tmp_path / "none.log", time.monotonic() + 20)
        q.close()
    finally:
        alive.kill()
        alive.wait()
        server.close()
    # a QEMU that is gone is said at once, not waited for until the deadline
    with pytest.raises(saved.EnvironmentProblem, match=r"QEMU exited \(rc -9\)"):
        saved._monitor(SimpleNamespace(qmp=path), alive, tmp_path / "none.log", time.monotonic() + 20)


@needs_qemu
def test_saved_guest_key_follows_the_device_not_the_lab():
    from offlab.vm import image, qemu, saved

    img = image.show()
    if img is None:
        pytest.skip("no guest image (`offlab vm image` builds it)")

    def k(*nics, memory=512, smp=1):
        return saved.key(img, list(nics), memory, smp, "tcg")

    base = k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {}))
    assert k(qemu.Nic.from_options("ol-b-7", "52:54:00:0a:0b:0c", {})) == base  # another lab's tap and MAC
    assert k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {"guest_uso4": False})) != base
    assert k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {"queues": 2})) != base
    assert k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {}), smp=2) != base
    assert k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {}), memory=1024) != base
    assert k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {}),
             qemu.Nic.from_options("ol-a-1", "52:54:00:01:02:04", {})) != base
    # a guest that cannot change its MAC keeps it in the key
    fixed = k(qemu.Nic.from_options("ol-a-0", "52:54:00:01:02:03", {"ctrl_mac_addr": False}))
    assert fixed != k(qemu.Nic.from_options("ol-a-0", "52:54:00:0a:0b:0c", {"ctrl_mac_addr": False}))


def test_vhost_user_guests_are_never_restored(monkeypatch):
    from offlab.vm import qemu, saved

    monkeypatch.setattr(qemu, "check_nic_properties", lambda props, q=None: {k: str(v) for k, v in props.items()})
    vu = qemu.VhostUserNic.from_options("/run/x/vhost.sock", "52:54:00:01:02:03", {})
    assert "vhost-user" in saved.why_not_warm([vu])
    monkeypatch.setenv("OFFLAB_VM_WARM", "0")
    assert saved.why_not_warm([qemu.Nic.from_options("t0", "52:54:00:01:02:03", {})]) == "OFFLAB_VM_WARM=0"


# ---- real guests -------------------------------------------------------------------------
def _guest(name: str) -> dict:
    res = offlab_cli("lab", "show", name, "--json")
    assert res.returncode == 0, f"lab show {name}: exit {res.returncode}: {res.stderr}"  # (a whole run once saw it fail)
    return json.loads(res.stdout)["hosts"]["client"]["guest"]


def _up(name: str) -> dict:
    res = offlab_cli("lab", "up", "vm", "--name", name, timeout=300)
    assert res.returncode == 0, res.stderr
    return _guest(name)


def _down(name: str) -> None:
    res = offlab_cli("lab", "down", name)
    assert res.returncode == 0, res.stderr
    assert not any(n.startswith(f"ol-{name}-") for n in netns_names())


@requires_root
@needs_qemu
@pytest.mark.network
@pytest.mark.timeout(900)  # a hang guard only: six TCG boots or restores on a loaded machine
def test_a_save_killed_is_swept_a_warm_start_is_the_lab_s_own_guest_and_a_killed_restore_or_corrupt_save_is_not_trusted(
        lab_name, clean_machine, state_dir, saved_dir):
    """One saved guest through its life: four cold boots (the first killed while saving) and three
    restores (the second killed with -9, the third fails to load)."""
    from offlab.vm import saved

    err = state_dir.parent / "lab-up.err"
    with open(err, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "offlab", "lab", "up", "vm", "--name", lab_name],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 240  # a hang guard: a TCG cold boot before the save starts
    while not list(saved_dir.glob(".save-*")):
        assert proc.poll() is None and time.monotonic() < deadline, f"the save never started: {err.read_text()}"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (qemu_pid,) = [d["pid"] for d in json.loads((state_dir / "labs" / f"{lab_name}.json").read_text())["daemons"]]
    _down(lab_name)
    assert not running(qemu_pid)
    assert [p.name.startswith(".save-") for p in saved_dir.iterdir() if not p.name.startswith(".lock")] == [True]

    first = _up(lab_name)  # the half-written save is not used, and is swept
    _down(lab_name)
    assert first["start"] == "cold" and "no saved guest of this kind yet" in first["start_why"]
    assert not list(saved_dir.glob(".save-*"))
    (key,) = [p.name for p in saved_dir.iterdir() if not p.name.startswith(".")]
    assert f"saved as {key}" in first["start_why"]

    name = lab_name[:-1] + "w"
    warm = _up(name)
    try:
        assert (warm["start"], warm["start_why"]) == ("warm", f"restored from saved guest {key}"), warm["start_why"]
        mac = warm["nics"][0]["mac"]
        res = offlab_cli("lab", "exec", name, "client", "--", "cat", "/sys/class/net/eth0/address")
        assert res.stdout.strip() == mac  # this lab's MAC, not the saving lab's
        assert mac != first["nics"][0]["mac"]
        asked = int(time.time())
        res = offlab_cli("lab", "exec", name, "client", "--", "date", "+%s")
        # the guest's clock reads now, not the time it was saved at (a second either side for rounding)
        assert asked - 1 <= int(res.stdout) <= time.time() + 1, res.stdout
        res = offlab_cli("lab", "exec", name, "client", "--", "ping", "-c", "1", "-W", "5", "10.200.1.2")
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        _down(name)

    daemon = kill_9_once_daemon_is_recorded("vm", lab_name, state_dir, "QEMU")  # a restore killed
    _down(lab_name)
    assert not running(daemon["pid"])
    state, manifest, why = saved.load(key)
    assert state is not None and why == ""  # a restore writes nothing to the saved guest

    # a saved guest that matches its manifest but QEMU cannot load: the restore's QEMU is stopped and
    # no longer listed, the guest boots cold, and the lab lists (and checks) only the QEMU that runs
    state.write_bytes(b"not a migration stream" * 1000)
    (saved_dir / key / "saved.json").write_text(json.dumps({**manifest, "size": state.stat().st_size,
                                                            "sha256": saved.digest(state)}))
    cold = _up(lab_name)
    try:
        assert cold["start"] == "cold" and f"saved guest {key} did not restore" in cold["start_why"], cold
        (qemu_daemon,) = json.loads((state_dir / "labs" / f"{lab_name}.json").read_text())["daemons"]
        assert running(qemu_daemon["pid"])
        res = offlab_cli("lab", "exec", lab_name, "client", "--", "true")
        assert res.returncode == 0, res.stderr
    finally:
        _down(lab_name)
    assert saved.load(key)[1]["sha256"] != manifest["sha256"]  # saved anew from this boot

    state = saved_dir / key / "state"
    with open(state, "r+b") as f:  # one byte of guest memory changed
        at = os.lseek(f.fileno(), state.stat().st_size // 2, os.SEEK_DATA)
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    again = _up(lab_name)
    _down(lab_name)
    assert again["start"] == "cold"
    assert f"saved guest {key} was unusable (its state file's checksum does not match)" in again["start_why"]
    assert saved.load(key)[0] is not None  # saved anew from this boot


def test_only_the_most_recently_used_saved_guests_are_kept(saved_dir):
    from offlab.vm import saved

    saved_dir.mkdir()
    for i in range(saved.KEEP + 2):
        d = saved_dir / f"{i:016x}"
        d.mkdir()
        (d / "saved.json").write_text("{}")
        os.utime(d / "saved.json", (1000 + i, 1000 + i))
    os.utime(saved_dir / f"{0:016x}" / "saved.json")  # the oldest, just used
    saved._prune(saved_dir)
    left = sorted(p.name for p in saved_dir.iterdir() if not p.name.startswith("."))  # not the .lock-<key> files
    assert len(left) == saved.KEEP
    assert f"{0:016x}" in left and f"{1:016x}" not in left and f"{2:016x}" not in left
