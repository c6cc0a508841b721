"""Warm starts: a guest restored from a saved one instead of booted.

The first guest of a kind is booted cold; once it is ready (agent answering, NICs checked, no
address yet) it is paused, its whole state is written to a file with QEMU's `migrate` (the
`mapped-ram` capability: RAM pages at fixed offsets of a sparse file, ~100 MB written of 512 MB)
and it goes on. A later guest of the same kind starts QEMU with the same command line plus
`-incoming defer` and loads that file instead of booting.

What a saved guest keys on (`key`): the full `--version` line of the QEMU that runs it (the installed
one or another version offlab unpacked, offlab.vm.qemus), and the QEMU command line with
the parts that differ between labs replaced by placeholders (socket, console and monitor paths,
tap names, MACs): so the image (its key is in the kernel path), machine, firmware, kernel command
line, CPUs, memory, accelerator and every NIC's device, properties and queue count are in it.
MACs stay in the key when the guest cannot change its NIC's MAC (`ctrl_vq` or `ctrl_mac_addr` off).

A restored guest is not "up" until it is re-checked: its clock set from the host's, each NIC's
MAC set to this lab's (the saved one carries the MAC of the lab that saved it), then the NICs by
MAC, the virtio features each NIC's driver accepted (must equal the saved ones), and no address on
any NIC. QEMU creates the taps (name, vnet_hdr, queues) from the command line before it loads the
state, and the loaded device state sets the taps' offloads as the saved guest negotiated them.

The file is offlab's, under the cache (`$OFFLAB_CACHE_DIR/vm/saved/<key>/`, or
`$OFFLAB_VM_SAVED_DIR`): `state` (the migration stream) and `saved.json` (what it was made from,
its size and a SHA-256 of its data). It is written into `.save-<key>-<pid>` and renamed into
place only when whole; a temporary directory whose writer is gone is removed. A saved guest that
does not match its manifest (size, checksum, key) or fails to restore is deleted and the guest is
booted cold (and saved again); why is recorded in the lab (`start_why`) and printed. Labs started
at once share a saved guest: one is deleted only when no other offlab is restoring from it (a
`.lock-<key>` flock, below), so one restore's failure cannot make another's QEMU lose its file.

Not restored: guests with vhost-user NICs (dpdk-vm, ovs-dpdk-vm). Their backend (testpmd, OVS) is
a new process in every lab; a restored virtio-net device would hand it rings whose indices the new
backend never saw. They keep the fast cold boot. Nor guests of a QEMU older than 9.0 (Debian's 7.2):
it has no `mapped-ram`. `OFFLAB_VM_WARM=0` turns warm starts off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from offlab import netdev
from offlab.errors import EnvironmentProblem, OfflabError
from offlab.hosts import Host
from offlab.vm import qemu
from offlab.vm.image import Image, cache_root
from offlab.vm.qmp import Qmp, QmpError, QmpRefused

SAVED_VERSION = "1"
STATE, MANIFEST = "state", "saved.json"
RESTORE_TIMEOUT = 60.0
KEEP = 16  # saved guests kept (the least recently used go first): ~100 MB on disk each
_CAPS = [{"capability": "mapped-ram", "state": True}]
MAPPED_RAM_SINCE = (9, 0)


@dataclass
class Start:
    """How a guest came up: `warm` (restored from saved guest `key`) or `cold`, and why."""

    how: str
    why: str
    key: str = ""


def saved_root() -> Path:
    return Path(os.environ.get("OFFLAB_VM_SAVED_DIR") or cache_root() / "saved")


def key(image: Image, nics: list, memory: int, smp: int, accel: str, q: qemu.Qemu | None = None) -> str:
    """The saved guest's key: the full `--version` line of the QEMU that runs it (`q`, default the
    installed one) and the command line with the per-lab parts as placeholders."""
    general = []
    for i, nic in enumerate(nics):
        fixed_mac = nic.properties.get("ctrl_vq") == "off" or nic.properties.get("ctrl_mac_addr") == "off"
        general.append(qemu.Nic(f"tap{i}", nic.mac if fixed_mac else "52:54:00:00:00:00", nic.properties, nic.queues))
    argv = qemu.command(image, socket="@channel", console="@console", qmp="@qmp", nics=general,
                        memory=memory, smp=smp, accel=accel, name="@name", qemu=q)
    parts = {"saved": SAVED_VERSION, "qemu": qemu.version_line(q), "argv": argv[len((q or qemu.installed()).argv()):]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def why_not_warm(nics: list, q: qemu.Qemu | None = None) -> str | None:
    """Why this guest cannot start warm at all, or None."""
    if os.environ.get("OFFLAB_VM_WARM", "1") == "0":
        return "OFFLAB_VM_WARM=0"
    version = (q or qemu.installed()).version
    if tuple(int(x) for x in version.split(".")[:2]) < MAPPED_RAM_SINCE:
        return (f"QEMU {version} cannot save a guest to a file with mapped-ram "
                f"(QEMU {'.'.join(map(str, MAPPED_RAM_SINCE))} and later can)")
    if any(isinstance(n, qemu.VhostUserNic) for n in nics):
        return ("vhost-user NICs are not restored: their backend is a new process in every lab and "
                "never saw the saved rings")
    return None


# ---- the file ----------------------------------------------------------------------
def digest(path: Path) -> str:
    """SHA-256 of a sparse file's data regions and their offsets (holes are not read)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        fd, size, pos = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            h.update(f"{start}:{end};".encode())
            f.seek(start)
            left = end - start
            while left:
                chunk = f.read(min(left, 1 << 22))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            pos = end
    h.update(str(size).encode())
    return h.hexdigest()


def load(k: str, lock=None) -> tuple[Path | None, dict | None, str]:
    """(state file, manifest, "") for a usable saved guest; (None, None, why) otherwise. A saved
    guest that does not match its manifest is deleted here (unless another offlab is restoring
    from it: `lock` is this one's, see `_in_use`), never used."""
    d = saved_root() / k
    if not d.exists():
        return None, None, "no saved guest of this kind yet"
    try:
        manifest = json.loads((d / MANIFEST).read_text())
        state = d / STATE
        if manifest.get("key") != k:
            why = f"its manifest names key {manifest.get('key')!r}"
        elif state.stat().st_size != manifest.get("size"):
            why = f"its state file is {state.stat().st_size} bytes, not {manifest.get('size')}"
        elif digest(state) != manifest.get("sha256"):
            why = "its state file's checksum does not match"
        else:
            os.utime(d / MANIFEST)  # used: the last to be pruned
            return state, manifest, ""
    except (OSError, ValueError, AttributeError) as exc:
        why = f"it is unreadable ({exc.__class__.__name__}: {exc})"
    why = f"saved guest {k} was unusable ({why})"
    return None, None, f"{why}: {_discard(k, lock, why)}"


# Who may delete a saved guest: each offlab that restores from one holds a shared flock on its
# `.lock-<key>` from the load to the end of the restore; deleting (a failed restore, a mismatch,
# pruning) and saving take it exclusively, without waiting. So a restore that fails for its own
# reasons (its QEMU killed, a loaded machine's timeout) cannot pull the file from under another
# offlab's QEMU while that one loads it: the saved guest is kept, and the last user to fail on it
# deletes it.
def _lock_file(root: Path, k: str):
    return open(root / f".lock-{k}", "a")  # "a": opening it changes nothing in it


@contextlib.contextmanager
def _in_use(k: str) -> Iterator[Any]:
    """The shared lock of a restorer on saved guest `k` (None where the cache is not writable)."""
    try:
        saved_root().mkdir(parents=True, exist_ok=True)
        lock = _lock_file(saved_root(), k)
    except OSError:
        yield None
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # a save in progress (seconds) finishes first
        yield lock


def _discard(k: str, lock=None, why: str = "") -> str:
    """Delete saved guest `k` unless another offlab is restoring from it; what was done, in words, also
    appended with `why` to the saved guests' `discarded.log`. `lock` is the caller's own (shared) lock
    on it, turned exclusive here."""
    mine = lock is None
    try:
        lock = _lock_file(saved_root(), k) if mine else lock
    except OSError:
        discard(k)  # nobody can lock in a cache that is not writable, and nothing is deleted in it either
        return "deleted"
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            done = "deleted"
            discard(k)  # the lock held: no restorer can load it meanwhile
        except BlockingIOError:
            done = "kept: another offlab is restoring from it"
        _log(f"{done}: {why}")
        return done
    finally:
        if mine:
            lock.close()


LOG, LOG_KEEP = "discarded.log", 1 << 16


def _log(line: str) -> None:
    """One line of discarded.log (when, which offlab, what and why): why warm starts went cold, for
    whoever asks later. Over 64 KiB, its older half goes."""
    path = saved_root() / LOG
    try:
        with open(path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} {' '.join(sys.argv[1:4])}: {line}\n")
        if path.stat().st_size > LOG_KEEP:
            text = path.read_text(errors="replace")
            path.write_text(text[len(text) // 2:].partition("\n")[2])
    except OSError:
        pass  # a cache it cannot write: the lab's start_why still says it


def discard(k: str) -> None:
    shutil.rmtree(saved_root() / k, ignore_errors=True)


def _prune(root: Path, keep: int = KEEP) -> None:
    """Keep the `keep` most recently used saved guests (a restore touches its manifest); one being
    restored from is not deleted."""
    def used(d: Path) -> float:
        try:
            return (d / MANIFEST).stat().st_mtime
        except OSError:
            return 0.0

    kept = sorted((d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")), key=used, reverse=True)
    for d in kept[keep:]:
        with _lock_file(root, d.name) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(d, ignore_errors=True)


def _remove_stale_temps(root: Path) -> None:
    for p in root.glob(".save-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and os.path.exists(f"/proc/{pid}")):
            shutil.rmtree(p, ignore_errors=True)


def save(guest: qemu.Guest, k: str, nics: list, q: qemu.Qemu | None = None) -> str:
    """Save a ready guest as `k` (pause, migrate to a file, go on); "" or why it was not saved."""
    root = saved_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = _lock_file(root, k)
    except OSError as exc:
        return f"cannot write {root}: {exc.strerror or exc}"
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "another offlab is saving or restoring a guest of this kind"
        if (root / k / MANIFEST).exists():
            return ""
        _remove_stale_temps(root)
        features = _features(guest.host(), len(nics))
        tmp = root / f".save-{k}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            start = time.monotonic()
            _migrate_out(guest, tmp / STATE)
            seconds = round(time.monotonic() - start, 2)
            manifest = {"key": k, "qemu": qemu.version_line(q), "argv": guest.argv, "macs": [n.mac for n in nics],
                        "features": features, "size": (tmp / STATE).stat().st_size, "sha256": digest(tmp / STATE),
                        "saved_at": time.time(), "save_seconds": seconds}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            os.rename(tmp, root / k)
            _prune(root)
        except (OfflabError, OSError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return f"saving failed: {exc}"
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return ""


def _migrate_out(guest: qemu.Guest, path: Path) -> None:
    with Qmp(guest.qmp, timeout=30) as q:
        q.execute("stop")
        try:
            q.execute("migrate-set-capabilities", capabilities=_CAPS)
            q.execute("migrate", uri=f"file:{path}")
            status = _wait_migration(q, time.monotonic() + RESTORE_TIMEOUT)
            if not status.startswith("completed"):
                q.execute("migrate_cancel")  # it stops writing before the temporary file is removed
        finally:
            q.execute("cont")
    if not status.startswith("completed"):
        raise EnvironmentProblem(f"QEMU's migration to {path} ended {status}")


def _wait_migration(q: Qmp, deadline: float) -> str:
    while True:
        info = q.execute("query-migrate")
        status = info.get("status", "none")
        if status in ("completed", "failed", "cancelled"):
            return status + (f" ({info['error-desc']})" if info.get("error-desc") else "")
        if time.monotonic() > deadline:
            return f"{status} (still, after {RESTORE_TIMEOUT:g} s)"
        time.sleep(0.02)


def _features(host: Host, count: int) -> list[str]:
    """The virtio feature bits each NIC's driver accepted (sysfs), eth0 first."""
    paths = [f"/sys/class/net/eth{i}/device/features" for i in range(count)]
    return host.run(["cat", *paths]).stdout.split() if paths else []


# ---- restore -------------------------------------------------------------------------
def restore(image: Image, where: Host, rundir: Path, state: Path, manifest: dict, *, name: str, nics: list,
            memory: int, smp: int, accel: str, lab: str | None, role: str | None,
            on_started: Callable[[int, int], None] | None, q: qemu.Qemu | None = None) -> qemu.Guest:
    """A guest loaded from `state`, re-checked; EnvironmentProblem (QEMU stopped) if it cannot be."""

    def until_ready(guest: qemu.Guest, proc, qemu_log: Path, start: float) -> None:
        deadline = start + RESTORE_TIMEOUT
        _migrate_in(guest, proc, state, qemu_log, deadline)
        _recheck(guest.host(), nics, manifest, deadline)

    return qemu.launch(image, where, rundir, name=name, nics=nics, memory=memory, smp=smp, accel=accel, lab=lab,
                       role=role, on_started=on_started, until_ready=until_ready, extra=["-incoming", "defer"],
                       qemu=q)


def _monitor(guest: qemu.Guest, proc, qemu_log: Path, deadline: float) -> Qmp:
    """QEMU's monitor, open, once it listens. Its socket file appears at bind(), a moment before
    listen(): a connect in between is refused, and a loaded machine made that moment long enough (a
    restore failed so in a whole suite, 2026-11-30, and its saved guest was deleted)."""
    q = Qmp(guest.qmp, timeout=30)
    while True:
        if proc.poll() is not None:
            raise EnvironmentProblem(f"QEMU exited (rc {proc.returncode}): {_tail(qemu_log)}")
        try:
            return q.open()
        except QmpRefused as exc:
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"{exc}; QEMU still runs: {_tail(qemu_log)}") from None
        time.sleep(0.01)


def _migrate_in(guest: qemu.Guest, proc, state: Path, qemu_log: Path, deadline: float) -> None:
    try:
        q = _monitor(guest, proc, qemu_log, deadline)
        try:
            q.execute("migrate-set-capabilities", capabilities=_CAPS)
            q.execute("migrate-incoming", uri=f"file:{state}")
            status = _wait_migration(q, deadline)
            if not status.startswith("completed"):
                raise EnvironmentProblem(f"loading the saved guest ended {status}: {_tail(qemu_log)}")
            q.execute("cont")  # it was saved paused
        finally:
            q.close()
    except QmpError as exc:
        raise EnvironmentProblem(f"{exc}: {_tail(qemu_log)}") from None


# One round trip (each costs the guest forks under TCG): the clock, this lab's MACs, then what the
# checks read. Arguments: the UTC time, the NIC count, then pairs of NIC name and MAC to set.
_RECHECK = """date -u -s "$1" >/dev/null || exit 1
n=$2; shift 2
while [ $# -ge 2 ]; do ip link set "$1" address "$2" || exit 1; shift 2; done
ip -j addr show
i=0; while [ $i -lt $n ]; do cat /sys/class/net/eth$i/device/features || exit 1; i=$((i + 1)); done
"""


def _recheck(host: Host, nics: list, manifest: dict, deadline: float) -> None:
    """Clock and MACs set, then what must hold before the guest is up: NICs by MAC, the virtio
    features each driver accepted equal to the saved ones, no addresses. The clock is set to the
    nearest second: as exact as a cold boot's, which reads the RTC's whole seconds."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(round(time.time() + 0.05)))
    pairs = [x for i, (nic, old) in enumerate(zip(nics, manifest.get("macs", []), strict=False))
             if nic.mac != old for x in (f"eth{i}", nic.mac)]
    out = host.run(["sh", "-c", _RECHECK, "recheck", stamp, str(len(nics)), *pairs],
                   timeout=max(1.0, deadline - time.monotonic())).stdout
    links_json, _, features = out.partition("\n")
    by_mac = {l.address: l for l in netdev.parse_links(links_json)}
    for i, nic in enumerate(nics):
        link = by_mac.get(nic.mac)
        if link is None or link.ifname != f"eth{i}":
            raise EnvironmentProblem(f"after the restore, MAC {nic.mac} is on "
                                     f"{link.ifname if link else 'no NIC'}, not eth{i}")
        if link.addrs:
            raise EnvironmentProblem(f"after the restore, eth{i} has addresses: "
                                     f"{[a.local for a in link.addrs]}")
    if features.split() != manifest.get("features"):
        raise EnvironmentProblem(f"after the restore, the NICs' virtio features are {features.split()}, "
                                 f"not the saved {manifest.get('features')}")


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no QEMU log"
    return lines[-1] if lines else "QEMU printed nothing"


# ---- a guest, warm or cold -------------------------------------------------------------
def start(image: Image, where: Host, rundir: str | Path, *, name: str, nics: list, memory: int = 512,
          smp: int = 1, accel: str = "auto", timeout: float = 60.0, lab: str | None = None,
          role: str | None = None, on_started: Callable[[int, int], None] | None = None,
          after_cold: Callable[[qemu.Guest], None] | None = None,
          q: qemu.Qemu | None = None) -> tuple[qemu.Guest, Start]:
    """A ready guest: restored from a saved one when there is a usable one, else booted cold and
    then saved (`after_cold(guest)` runs between the boot and the save: the caller's checks)."""
    rundir = Path(rundir)
    if accel == "auto":
        accel = qemu.accelerator(image, q)
    why = why_not_warm(nics, q)
    k = ""
    if why is None:
        k = key(image, nics, memory, smp, accel, q)
        with _in_use(k) as lock:
            state, manifest, why = load(k, lock)
            if state is not None:
                try:
                    guest = restore(image, where, rundir, state, manifest, name=name, nics=nics, memory=memory,
                                    smp=smp, accel=accel, lab=lab, role=role, on_started=on_started, q=q)
                    _say(f"guest {name}: warm start from saved guest {k} in {guest.ready_seconds:g} s")
                    return guest, Start("warm", f"restored from saved guest {k}", k)
                except OfflabError as exc:
                    why = f"saved guest {k} did not restore ({exc})"
                    why += f": {_discard(k, lock, why)}"
    guest = qemu.boot(image, where, rundir, name=name, nics=nics, memory=memory, smp=smp, accel=accel,
                      timeout=timeout, lab=lab, role=role, on_started=on_started, qemu=q)
    if after_cold is not None:
        after_cold(guest)
    if k:
        not_saved = save(guest, k, nics, q)
        why += f"; saved as {k}" if not not_saved else f"; not saved: {not_saved}"
    entry = "" if image.pvh else f"; bzImage boot, not PVH: {image.pvh_why or 'no PVH entry'}"
    _say(f"guest {name}: cold boot in {guest.ready_seconds:g} s ({why}{entry})")
    return guest, Start("cold", why, k)


def _say(line: str) -> None:
    print(f"offlab: {line}", file=sys.stderr)


__all__ = ["Start", "digest", "discard", "key", "load", "restore", "save", "saved_root", "start"]
