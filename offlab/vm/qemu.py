"""QEMU for offlab guests: the command line, the accelerator probe, boot and stop (by pid).

A guest is `qemu-system-x86_64 -machine q35` slimmed (no SATA, SMBus, PS/2, USB, VGA), with qboot
as firmware (SeaBIOS took ~2.4 s under TCG before the kernel printed), the image's decompressed
kernel entered through PVH and a quiet kernel command line (`KERNEL_ARGS`; printing the boot log
on the emulated UART was seconds under TCG); no default devices, its console in a log
file, the virtio-serial command channel (`offlab.hosts.guest`) and virtio-net NICs on taps
(`vhost=off`: this kind of machine has no /dev/vhost-net) or on vhost-user sockets (`VhostUserNic`,
a DPDK port as backend, guest RAM then shared memfd memory). virtio-net properties are checked
against what this QEMU has (`-device virtio-net-pci,help`). KVM is used only when a guest really
boots with it within a bounded time (probed once, cached); otherwise TCG.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from offlab.state import private_tmp
from offlab.errors import BadInput, CommandTimeout, EnvironmentProblem
from offlab.hosts import LOCAL, Host, which
from offlab.names import IFNAME_RE
from offlab.hosts.guest import GuestGone, GuestHost, console_tail, process_start_time
from offlab.hosts.process import signal_pid
from offlab.vm.image import INSTALL_HINT, Image, cache_root
from offlab.vm import clock
from offlab.vm.qemus import Qemu

QEMU = "qemu-system-x86_64"
KVM_PROBE_TIMEOUT = 20.0
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_VALUE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
SOCKET_PATH_MAX = 107
# The fast boot (docs/vm.md "Cold and warm starts"): why each part is there.
# hpet=off: the guest keeps the TSC as its clock and the local APIC as its timer, and QEMU's main
# loop no longer wakes every 4 ms for the emulated HPET while the guest idles (docs/vm.md).
MACHINE = "q35,sata=off,smbus=off,i8042=off,vmport=off,usb=off,graphics=off,hpet=off"
FIRMWARE = "qboot.rom"  # in QEMU's data directory; SeaBIOS (QEMU's default) when absent
# The image's boot script is PID 1 and hands over to busybox init (offlab.vm.guestfs): every boot needs it.
INIT_ARG = "rdinit=/etc/offlab/rc"
KERNEL_ARGS = ("console=ttyS0 panic=-1"
               " quiet"  # the boot log on the serial port cost seconds; errors and panics still print
               " tsc=reliable no_timer_check"  # no clocksource watchdog or timer check under TCG
               " cryptomgr.notests"  # no self-tests of the crypto algorithms at boot
               " 8250.nr_uarts=1"  # probe one UART, not four
               # The slowest initcalls a network guest has no use for (initcall_debug under TCG:
               # ~115, ~60 and ~50 ms of ~1.9 s): the crypto API's jitter entropy RNG (only the
               # DRBG seeds from it; /dev/random and getrandom() do not), the SP800-108 KDF's
               # boot self-test, and the enum names of trace event formats.
               " initcall_blacklist=jent_mod_init,crypto_kdf108_init,trace_eval_init"
               f" {INIT_ARG}")
CLASSIC_ARGS = f"console=ttyS0 panic=-1 {INIT_ARG}"  # the boot before the fast one (benchmarks/vm_path's "before")


def kernel_args(accel: str) -> str:
    """KERNEL_ARGS, and under TCG the TSC's rate (offlab.vm.clock: the guest's own measurement of it
    can be far off on a loaded machine)."""
    khz = clock.tsc_khz(cache_root() / "tsc.json") if accel == "tcg" else None
    return f"{KERNEL_ARGS} tsc_early_khz={khz}" if khz else KERNEL_ARGS


def qemu_binary() -> str:
    path = which(QEMU)
    if path is None:
        raise EnvironmentProblem(f"{QEMU} is not installed: {INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=None)
def qemu_version() -> str:
    """'10.0.2' for the installed qemu-system-x86_64."""
    out = LOCAL.run([qemu_binary(), "--version"], timeout=30).stdout
    m = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out)
    if not m:
        raise EnvironmentProblem(f"cannot read the QEMU version from `{QEMU} --version`: {out[:80]!r}")
    return m.group(1)


@functools.lru_cache(maxsize=None)
def installed() -> Qemu:
    """The machine's own QEMU (the one on PATH), as offlab runs it."""
    res = LOCAL.run(["dpkg-query", "-W", "-f", "${Version}", "qemu-system-x86"], check=False, timeout=30)
    return Qemu(qemu_version(), res.stdout.strip() if res.ok else "", "installed", qemu_binary())


def _or_installed(q: Qemu | None) -> Qemu:
    return installed() if q is None else q


@functools.lru_cache(maxsize=None)
def version_line(q: Qemu | None = None) -> str:
    """QEMU's full `--version` line: what a saved guest and the accelerator probe key on."""
    return LOCAL.run([*_or_installed(q).argv(), "--version"], timeout=30).stdout.splitlines()[0].strip()


@functools.lru_cache(maxsize=None)
def nic_properties(q: Qemu | None = None) -> dict[str, str]:
    """virtio-net-pci property → its type and default, as this QEMU prints them."""
    return dict(_nic_properties(_or_installed(q)))


@functools.lru_cache(maxsize=None)
def _nic_properties(q: Qemu) -> tuple[tuple[str, str], ...]:
    """Asked once per QEMU and process: every NIC of a lab checks its properties against it."""
    out = LOCAL.run([*q.argv(), "-device", "virtio-net-pci,help"], timeout=30).stdout
    props = []
    for line in out.splitlines():
        m = re.match(r"^\s+([A-Za-z0-9_.-]+)=(.*)$", line)
        if m:
            props.append((m.group(1), m.group(2).strip()))
    return tuple(props)


class PropertyMissing(BadInput):
    """A virtio-net property the QEMU a guest runs on does not have (7.2 has no host_uso): a run
    skips the cell that asks for it, with this reason."""

    def __init__(self, prop: str, q: Qemu) -> None:
        self.prop, self.qemu = prop, q
        super().__init__(f"QEMU {q.version} has no property {prop} "
                         f"(`{QEMU} -device virtio-net-pci,help` lists what it has)")


def check_nic_properties(props: dict[str, object], q: Qemu | None = None) -> dict[str, str]:
    """The properties as QEMU strings; BadInput for one this QEMU lacks or a malformed value."""
    q = _or_installed(q)
    have = nic_properties(q)
    out = {}
    for name, value in props.items():
        if name not in have:
            raise PropertyMissing(name, q)
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        if not _VALUE_RE.fullmatch(text):
            raise BadInput(f"virtio-net-pci property {name}={text!r}: not a valid value")
        out[name] = text
    return out


MAX_QUEUES = 8
# A vhost-user socket path goes into `-chardev socket,path=...`, where a comma ends the value.
_SOCKET_PATH_RE = re.compile(r"^/[A-Za-z0-9_./+@-]+$")


class _VirtioNet:
    """What every virtio-net NIC is, whatever its backend: a MAC, virtio-net-pci properties and a
    queue count, and one argv builder; a NIC kind says only how its backend is named and written
    (`check_backend`, `backend`). `queues` > 1 is a multiqueue NIC: the backend's `queues=N` and the
    device's `mq=on,vectors=2N+2` (one vector per rx and tx queue, one for config, one for control)."""

    mac: str
    properties: dict[str, str]
    queues: int

    def __post_init__(self) -> None:
        self.check_backend()
        if not MAC_RE.fullmatch(self.mac):
            raise BadInput(f"invalid MAC address {self.mac!r}")
        if isinstance(self.queues, bool) or not isinstance(self.queues, int) or not 1 <= self.queues <= MAX_QUEUES:
            raise BadInput(f"virtio-net queues={self.queues!r}: a whole number from 1 to {MAX_QUEUES}")

    @classmethod
    def from_options(cls, backend: str, mac: str, options: dict[str, object], q: Qemu | None = None):
        """A NIC on `backend` (a tap name, a socket path) from a topology's `nic` options:
        virtio-net-pci properties plus `queues`, checked against QEMU `q` (default: the installed)."""
        props, queues = _split_queues(options)
        nic = cls(backend, mac, {}, queues)  # queues checked before it shapes the properties
        nic.properties = _with_mq(props, nic.queues, q)
        return nic

    def check_backend(self) -> None:
        raise NotImplementedError

    def backend(self, i: int) -> tuple[list[str], str]:
        """(arguments the backend needs before its -netdev, the -netdev value) for NIC number `i`."""
        raise NotImplementedError

    def argv(self, i: int, q: Qemu | None = None) -> list[str]:
        before, netdev = self.backend(i)
        if self.queues > 1:
            netdev += f",queues={self.queues}"
        return [*before, "-netdev", netdev, "-device", _device(i, self.mac, self.properties, q)]


@dataclass
class Nic(_VirtioNet):
    """A virtio-net NIC on a tap in the namespace QEMU runs in (QEMU creates the tap if absent)."""

    tap: str
    mac: str
    properties: dict[str, str] = field(default_factory=dict)
    queues: int = 1

    def check_backend(self) -> None:
        if not IFNAME_RE.fullmatch(self.tap):
            raise BadInput(f"invalid tap name {self.tap!r}")

    def backend(self, i: int) -> tuple[list[str], str]:
        return [], f"tap,id=n{i},ifname={self.tap},script=no,downscript=no,vhost=off"


@dataclass
class VhostUserNic(_VirtioNet):
    """A virtio-net NIC whose backend is a vhost-user server on a unix socket (DPDK's net_vhost,
    OVS-DPDK's dpdkvhostuser port); QEMU is the client and the server must exist before boot.

    QEMU args: `-chardev socket,id=vuI,path=SOCKET -netdev vhost-user,id=nI,chardev=vuI
    -device virtio-net-pci,id=nicI,netdev=nI,mac=MAC,PROP=VALUE...`. Any vhost-user NIC makes `command()`
    back guest RAM with shared memfd memory (`-object memory-backend-memfd,id=mem,size=<memory>M,
    share=on -numa node,memdev=mem`), which the backend maps; no hugepages needed.
    `properties` are the tap NIC's (`host_tso4`, `guest_tso4`, `csum`, `guest_csum`, `mrg_rxbuf`,
    ...), checked against this QEMU. Build one with
    `VhostUserNic.from_options(socket, mac, {"host_tso4": False, ...})`.
    """

    socket: str
    mac: str
    properties: dict[str, str] = field(default_factory=dict)
    queues: int = 1

    def check_backend(self) -> None:
        if not _SOCKET_PATH_RE.fullmatch(self.socket) or len(self.socket) > SOCKET_PATH_MAX:
            raise BadInput(f"vhost-user socket {self.socket!r}: an absolute path of at most "
                           f"{SOCKET_PATH_MAX} characters from [A-Za-z0-9_./+@-] (no commas)")

    def backend(self, i: int) -> tuple[list[str], str]:
        return ["-chardev", f"socket,id=vu{i},path={self.socket}"], f"vhost-user,id=n{i},chardev=vu{i}"


def _split_queues(options: dict[str, object]) -> tuple[dict[str, object], object]:
    props = dict(options)
    queues = props.pop("queues", 1)
    if isinstance(queues, str) and queues.isdigit():
        queues = int(queues)
    return props, queues


def _with_mq(props: dict[str, object], queues: int, q: Qemu | None) -> dict[str, str]:
    if queues > 1:
        props.setdefault("mq", True)
        props.setdefault("vectors", 2 * queues + 2)
    return check_nic_properties(props, q)


def device_id(i: int) -> str:
    """The QEMU `id=` of NIC number `i`: QMP finds the device by it (/machine/peripheral/nicI),
    whatever bus or machine type carries it."""
    return f"nic{i}"


def _device(i: int, mac: str, properties: dict[str, str], q: Qemu | None) -> str:
    props = check_nic_properties(properties, q)
    return ",".join([f"virtio-net-pci,id={device_id(i)},netdev=n{i},mac={mac}",
                     *(f"{k}={v}" for k, v in props.items())])


def shared_memory_argv(nics: list, memory: int) -> list[str]:
    """The memfd-backed guest RAM a vhost-user backend maps, if any NIC is vhost-user; else []."""
    if not any(isinstance(n, VhostUserNic) for n in nics):
        return []
    return ["-object", f"memory-backend-memfd,id=mem,size={int(memory)}M,share=on",
            "-numa", "node,memdev=mem"]


def mac_for(*parts: str) -> str:
    """A stable locally administered MAC (QEMU's 52:54:00 prefix) for a lab, host and NIC."""
    h = hashlib.sha256("/".join(parts).encode()).digest()
    return "52:54:00:%02x:%02x:%02x" % (h[0], h[1], h[2])


@dataclass
class Guest:
    """A running guest: what another process needs to reach it or stop it."""

    name: str
    pid: int
    start_time: int
    socket: str
    console: str
    accel: str
    qemu_version: str  # the version that really runs: `--version` of the QEMU started
    kernel_release: str
    argv: list[str]
    ready_seconds: float = 0.0
    lab: str | None = None
    role: str | None = None
    qmp: str | None = None  # QEMU's monitor socket (offlab.vm.qmp): what the devices really are
    # a cold-booted TCG guest's clock against this machine's (offlab.vm.clock.check), e.g. 1.001
    clock_rate: float | None = None

    @property
    def tsc_khz(self) -> int | None:
        """The TSC rate its kernel was told on its command line (`tsc_early_khz=`, under TCG), or None."""
        line = self.argv[self.argv.index("-append") + 1] if "-append" in self.argv else ""
        return next((int(w.split("=", 1)[1]) for w in line.split() if w.startswith("tsc_early_khz=")), None)

    def host(self) -> GuestHost:
        return GuestHost(self.socket, self.pid, self.start_time, lab=self.lab, role=self.role,
                         console=self.console)

    def to_json(self) -> dict:
        return asdict(self)


def firmware(q: Qemu | None = None) -> list[str]:
    """`-bios qboot.rom` when this QEMU ships qboot, else [] (SeaBIOS); an unpacked QEMU's own data
    directory first (`-L`)."""
    q = _or_installed(q)
    share = Path(q.binary).resolve().parent.parent / "share" / "qemu"
    for d in (share, *([] if q.data_dirs else [Path("/usr/share/qemu")])):
        if (d / FIRMWARE).is_file():
            return ["-bios", FIRMWARE]
    return []


def command(image: Image, *, socket: str, console: str, nics: list[Nic | VhostUserNic] = (),
            memory: int = 512, smp: int = 1, accel: str = "tcg", name: str = "guest",
            qmp: str | None = None, classic: bool = False, qemu: Qemu | None = None) -> list[str]:
    """The QEMU argv for one guest (memory in MiB; shared memfd RAM when a NIC is vhost-user;
    a QMP monitor on the unix socket `qmp` if given) on `qemu` (default: the installed one).
    `classic`: the boot offlab had before the fast one (plain q35, SeaBIOS, the compressed kernel,
    the full boot log), for comparisons."""
    q = _or_installed(qemu)
    if accel not in ("tcg", "kvm"):
        raise BadInput(f"accelerator {accel!r}: choose tcg or kvm")
    for what, path in (("guest channel", socket), ("QMP socket", qmp or "")):
        if len(path) > SOCKET_PATH_MAX:
            raise BadInput(f"the {what} path is too long for a unix socket ({len(path)} > "
                           f"{SOCKET_PATH_MAX}): {path}")
    machine, boot = ("q35", []) if classic else (MACHINE, firmware(q))
    argv = [*q.argv(), *q.data_args(), "-name", f"offlab-{name}", "-machine", machine, *boot, "-accel", accel,
            "-m", str(int(memory)), "-smp", str(int(smp)),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-serial", f"file:{console}",
            "-kernel", image.bzimage if classic else image.kernel, "-initrd", image.initrd,
            "-append", CLASSIC_ARGS if classic else kernel_args(accel),
            "-device", "virtio-serial",
            "-chardev", f"socket,path={socket},server=on,wait=off,id=c0",
            "-device", "virtserialport,chardev=c0,name=ctl",
            *shared_memory_argv(list(nics), memory)]
    if qmp:
        argv += ["-qmp", f"unix:{qmp},server=on,wait=off"]
    for i, nic in enumerate(nics):
        argv += nic.argv(i, q)
    return argv


# ---- accelerator -------------------------------------------------------------------
def accelerator(image: Image, qemu: Qemu | None = None) -> str:
    """'kvm' if a guest really boots with KVM here within KVM_PROBE_TIMEOUT, else 'tcg'.

    $OFFLAB_VM_ACCEL=tcg|kvm forces one. The answer is cached per QEMU version, host kernel and
    guest kernel, every combination kept (a run over two kernels or two QEMUs probes each once, not
    at every switch), since a KVM that fails here may hang rather than error (a nested paravirtual
    /dev/kvm).
    """
    forced = os.environ.get("OFFLAB_VM_ACCEL", "auto")
    if forced in ("tcg", "kvm"):
        return forced
    if forced != "auto":
        raise BadInput(f"OFFLAB_VM_ACCEL={forced!r}: choose tcg, kvm or auto")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    q = _or_installed(qemu)
    key = f"{q.version}|{os.uname().release}|{image.kernel_release}"
    cache = cache_root() / "accel-answers.json"
    known = {**_accel_answers(cache.with_name("accel.json")), **_accel_answers(cache)}
    if known.get(key, {}).get("accel") in ("kvm", "tcg"):
        return known[key]["accel"]
    accel, why = _probe_kvm(image, q)
    known = _accel_answers(cache)  # another offlab may have probed another combination meanwhile
    known[key] = {"accel": accel, "why": why, "at": time.time()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".accel.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"answers": known}, indent=1) + "\n")
    os.replace(tmp, cache)
    return accel


def _accel_answers(cache: Path) -> dict[str, dict]:
    """Key → {accel, why, at} from vm/accel-answers.json, or the one answer of vm/accel.json (an
    earlier offlab's file, which kept only the last combination probed; read, never written)."""
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "key" in data:  # the one-answer form offlab wrote before
        return {str(data["key"]): {k: v for k, v in data.items() if k != "key"}}
    answers = data.get("answers")
    return {str(k): v for k, v in answers.items() if isinstance(v, dict)} if isinstance(answers, dict) else {}


def _probe_kvm(image: Image, q: Qemu) -> tuple[str, str]:
    with private_tmp("kvm") as d:
        console = os.path.join(d, "console.log")
        argv = command(image, socket=os.path.join(d, "ctl.sock"), console=console, accel="kvm",
                       name="kvm-probe", qemu=q)
        with open(os.path.join(d, "qemu.log"), "w") as log:
            proc = LOCAL.spawn(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + KVM_PROBE_TIMEOUT
        try:
            while time.monotonic() < deadline:
                if "READY" in _read(console):
                    return "kvm", "a guest booted with KVM"
                if proc.poll() is not None:
                    return "tcg", f"QEMU with KVM exited: {_read(os.path.join(d, 'qemu.log')).strip()[-200:]}"
                time.sleep(0.2)
            return "tcg", f"a guest did not boot with KVM within {KVM_PROBE_TIMEOUT:g} s"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---- boot and stop -------------------------------------------------------------------
def boot(image: Image, where: Host, rundir: str | Path, *, name: str, nics: list[Nic | VhostUserNic] = (),
         memory: int = 512, smp: int = 1, accel: str = "auto", timeout: float = 60.0,
         lab: str | None = None, role: str | None = None,
         on_started: Callable[[int, int], None] | None = None, qemu: Qemu | None = None) -> Guest:
    """Start QEMU in `where` (a namespace host), wait until the guest's agent answers.

    `on_started(pid, start_time)` runs as soon as QEMU exists, so a lab can record it before the
    wait. A guest that does not answer within `timeout` → EnvironmentProblem with its console
    tail, QEMU stopped by pid.
    """
    if accel == "auto":
        accel = accelerator(image, qemu)

    def until_ready(guest: Guest, proc, qemu_log: Path, start: float) -> None:
        _wait_ready(guest, proc, qemu_log, start + timeout, timeout)
        if accel == "tcg":
            host = guest.host()
            guest.clock_rate = clock.check(name, lambda: _uptime(host), guest.tsc_khz).rate

    return launch(image, where, Path(rundir), name=name, nics=list(nics), memory=memory, smp=smp, accel=accel,
                  lab=lab, role=role, on_started=on_started, until_ready=until_ready, qemu=qemu)


def launch(image: Image, where: Host, rundir: Path, *, name: str, nics: list, memory: int, smp: int, accel: str,
           lab: str | None, role: str | None, on_started: Callable[[int, int], None] | None,
           until_ready: Callable[[Guest, Any, Path, float], None], extra: Sequence[str] = (),
           qemu: Qemu | None = None) -> Guest:
    """Start QEMU (`command` + `extra`) in `where` with its files in `rundir`; `on_started(pid,
    start_time)` as soon as it exists, then `until_ready(guest, proc, qemu_log, start)` (a cold
    boot's agent wait, a restore's migration). On any failure QEMU is stopped by pid and its agent
    socket removed; `ready_seconds` is the time from start to ready."""
    rundir.mkdir(parents=True, exist_ok=True)
    socket, console = str(rundir / f"{name}.sock"), str(rundir / f"{name}.console.log")
    qmp = str(rundir / f"{name}.qmp")
    qemu_log = rundir / f"{name}.qemu.log"
    for stale in (socket, console, qmp):
        Path(stale).unlink(missing_ok=True)
    q = _or_installed(qemu)
    argv = command(image, socket=socket, console=console, nics=nics, memory=memory, smp=smp,
                   accel=accel, name=name, qmp=qmp, qemu=q) + list(extra)
    start = time.monotonic()
    with open(qemu_log, "w") as log:
        proc = where.spawn(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    started = process_start_time(proc.pid)
    guest = Guest(name=name, pid=proc.pid, start_time=started or 0, socket=socket, console=console,
                  accel=accel, qemu_version=q.version, kernel_release=image.kernel_release,
                  argv=argv, lab=lab, role=role, qmp=qmp)
    try:
        if started is None:
            raise EnvironmentProblem(f"QEMU for guest {name} exited at once: {_read(str(qemu_log)).strip()[-300:]}")
        if on_started is not None:
            on_started(proc.pid, started)
        until_ready(guest, proc, qemu_log, start)
    except BaseException:
        stop(guest.pid, guest.start_time, None)
        _reap(proc)
        Path(socket).unlink(missing_ok=True)
        raise
    guest.ready_seconds = round(time.monotonic() - start, 2)
    return guest


def _uptime(host: GuestHost) -> float:
    return float(host.run(["cat", "/proc/uptime"], timeout=10).stdout.split()[0])


def _wait_ready(guest: Guest, proc, qemu_log: Path, deadline: float, timeout: float) -> None:
    host = guest.host()
    while True:
        left = deadline - time.monotonic()
        if proc.poll() is not None:
            qlog = _read(str(qemu_log)).strip().splitlines()
            raise EnvironmentProblem(
                f"QEMU for guest {guest.name} exited (rc {proc.returncode}) before it was ready"
                + (f": {qlog[-1]}" if qlog else "") + console_tail(guest.console))
        if left <= 0:
            raise EnvironmentProblem(
                f"guest {guest.name} did not boot within {timeout:g} s (QEMU {guest.qemu_version}, "
                f"{guest.accel})" + (console_tail(guest.console) or "; its console is empty"))
        if not os.path.exists(guest.socket):
            time.sleep(0.05)
            continue
        try:
            host.run(["true"], timeout=min(5.0, left))
            return
        except (CommandTimeout, GuestGone):
            continue


def stop(pid: int, start_time: int, socket: str | None, grace: float = 5.0) -> bool:
    """Power the guest off through its agent, then SIGTERM / SIGKILL QEMU by pid; True if it ran."""
    if process_start_time(pid) != start_time:
        if socket:
            Path(socket).unlink(missing_ok=True)
        return False
    steps: list[tuple[int | None, float]] = [(signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)]
    if socket and os.path.exists(socket):
        steps.insert(0, (None, grace))  # first give the poweroff below its time
        try:
            GuestHost(socket, pid, start_time).run(["poweroff", "-f"], timeout=2, check=False)
        except (CommandTimeout, EnvironmentProblem):
            pass  # it powered off mid-answer, or the agent is gone: the signals below still work
    for sig, wait in steps:
        if sig is not None:
            signal_pid(pid, sig, start_time)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap_pid(pid)
            if process_start_time(pid) != start_time:
                break
            time.sleep(0.05)
        else:
            continue
        break
    if socket:
        Path(socket).unlink(missing_ok=True)
        Path(socket).with_suffix(".qmp").unlink(missing_ok=True)
    return True


def _reap_pid(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it


def _reap(proc) -> None:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


__all__ = ["Guest", "Nic", "PropertyMissing", "Qemu", "VhostUserNic", "accelerator", "boot", "check_nic_properties",
           "command", "device_id", "installed", "launch", "mac_for", "nic_properties", "qemu_version",
           "shared_memory_argv", "stop", "version_line"]
