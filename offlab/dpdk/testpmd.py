"""dpdk-testpmd as a lab daemon, driven through its interactive command line.

testpmd runs with `-i` and reads its commands from a FIFO in its run directory, opened read-write
as its stdin: it never sees end-of-file, and any offlab process (a later `lab set`, a probe, a
restore after kill -9) can write to it. Its output goes line-buffered (stdbuf) to a log; an answer
is the text between the echoed command and the next `testpmd> ` prompt. Every command has a
timeout: no answer → TestpmdNoAnswer (exit 3) with testpmd's last lines.

Ports are vdev specs (net_tap, net_af_packet, net_vhost ...), so the dpdk-vm and ovs-dpdk labs can
reuse this class. A tap port's kernel interface is created in testpmd's namespace and lives in a
"home" namespace while forwarding; the tap PMD configures it by name, so every port stop/start
moves it back first and home again afterwards, with its addresses (see `reconfigure`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from offlab import netdev
from offlab.dpdk import parse
from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts import LOCAL, TOOL_PACKAGES, Memo, NetnsHost, require_tool
from offlab.hosts.process import process_start_time, signal_pid, wait_gone
from offlab.interrupts import shielded
from offlab.state import read_json, state_dir, write_json_atomic
from offlab.wire import ETH_HEADER

DAEMON = "dpdk-testpmd"  # also its /proc/PID/comm
PROMPT = "testpmd> "
RUNTIME_ROOT = Path("/var/run/dpdk")
OWNER_FILE = "offlab-owner"
STATE_FILE = "testpmd.json"
FORWARDING_LOCK = "forwarding.lock"  # held (shared) by each process that needs forwarding now
IDLE_MODES = ("poll", "stop")  # the lab option testpmd_idle
INSTALL = f"apt-get install {TOOL_PACKAGES['dpdk-testpmd']}"
START_TIMEOUT = 90.0
COMMAND_TIMEOUT = 20.0
# RTE_ETHER_MAX_LEN - RTE_ETHER_CRC_LEN: testpmd's default GSO segment size, and the largest it takes
GSO_SEGSZ_MAX = 1500 + ETH_HEADER
DESCRIPTORS = 512
DESCRIPTORS_MAX = 4096  # the most rx (and tx) descriptors a port may be given (the rxd/txd settings)
# testpmd's default mbuf pool is sized for 32 ports at 2048 descriptors each (155456 mbufs, 338 MB), and
# --no-huge memory is touched whole at start (-m 1024: 0.9 CPU-s a start). Its pool here: every port's
# rings at their largest, plus room for the lcores' caches, a burst and GSO's segments in flight.
MBUFS_SPARE = 8192
MBUF_BYTES = 2176  # testpmd's mbuf size (2048 of data and the headroom)


def pool_size(ports: int) -> tuple[int, int]:
    """(mbufs, memory in MB) for a testpmd with `ports` ports: (24576, 256) for two."""
    mbufs = ports * 2 * DESCRIPTORS_MAX + MBUFS_SPARE
    return mbufs, max(256, -(-2 * mbufs * MBUF_BYTES // (1 << 20)) + 64)


class TestpmdNoAnswer(EnvironmentProblem):
    """testpmd did not answer a command in time, or is gone."""


class TestpmdRefused(BadInput):
    """testpmd answered a command with a refusal (a setting this DPDK or PMD lacks)."""


@dataclass
class Port:
    index: int
    vdev: str  # the --vdev argument, e.g. net_tap0,iface=oldemo0
    pmd: str  # tap | af_packet | vhost
    iface: str | None = None  # the kernel interface behind the port (a tap, or the veth af_packet binds)
    home: str | None = None  # namespace the tap lives in while forwarding; None: testpmd's own


@dataclass
class Info:
    """What `testpmd.json` in the run directory records: enough for any process to find testpmd again."""

    netns: str
    prefix: str  # --file-prefix: /var/run/dpdk/<prefix>
    cpu: int
    memory_mb: int
    version: str
    ports: list[Port]
    pid: int = 0
    start_time: int = 0
    # What testpmd shows only while in use: the values offlab last set (testpmd's defaults until then).
    tso_segsz: dict[str, int] = field(default_factory=dict)  # per port; 0: TSO off
    gro_flush: int = 1  # GRO_DEFAULT_FLUSH_CYCLES
    gso_segsz: int = GSO_SEGSZ_MAX
    # `poll`: forwarding runs (and busy-polls its CPU) from lab up to lab down; `stop`: only while an
    # offlab command that sends through the lab holds it (`forwarding`), its CPU idle otherwise (the lab
    # option testpmd_idle)
    idle: str = "poll"

    @classmethod
    def from_dict(cls, d: dict) -> "Info":
        return cls(**{**d, "ports": [Port(**p) for p in d["ports"]]})


def version() -> str:
    """DPDK's version, from the package (testpmd has no --version)."""
    res = LOCAL.run(["dpkg-query", "-W", "-f", "${Version}", "dpdk-dev"], check=False, timeout=10)
    return res.stdout.strip().split("-")[0] if res.ok and res.stdout.strip() else "unknown"


def runtime_dir(prefix: str) -> Path:
    return RUNTIME_ROOT / prefix


def owner_mark(lab: str) -> str:
    return f"offlab {state_dir()} lab {lab}\n"


def remove_runtime(path: str | Path) -> bool:
    """Remove a DPDK runtime directory, but only one offlab marked as its own (never another's)."""
    path = Path(path)
    if path.parent != RUNTIME_ROOT or not path.name:
        return False
    try:
        mark = (path / OWNER_FILE).read_text()
    except OSError:
        return False
    if not mark.startswith(f"offlab {state_dir()} "):
        return False
    for child in sorted(path.rglob("*"), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
    with contextlib.suppress(OSError):
        path.rmdir()
    return not path.exists()


def rundir_for(lab: str) -> Path:
    return state_dir() / "dpdk" / lab


class Testpmd:
    """One running testpmd, found through its run directory."""

    def __init__(self, rundir: Path, info: Info) -> None:
        self.rundir = Path(rundir)
        self.info = info
        self._depth = 0
        self._lock_fd: int | None = None

    # ---- files -----------------------------------------------------------
    @property
    def fifo(self) -> Path:
        return self.rundir / "cmd.fifo"

    @property
    def log(self) -> Path:
        return self.rundir / "testpmd.log"

    def save(self) -> None:
        write_json_atomic(self.rundir / STATE_FILE, asdict(self.info))

    @classmethod
    def load(cls, rundir: Path) -> "Testpmd | None":
        path = Path(rundir) / STATE_FILE
        if not path.exists():
            return None
        try:
            return cls(Path(rundir), Info.from_dict(read_json(path)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"testpmd state {path} is unreadable ({exc}): `offlab lab down --force` removes it") from None

    @classmethod
    def for_lab(cls, lab: str) -> "Testpmd | None":
        return cls.load(rundir_for(lab))

    # ---- life --------------------------------------------------------------
    @classmethod
    def start(cls, netns: str, rundir: Path, *, lab: str, ports: list[Port], cpu: int, memory_mb: int | None = None,
              on_started: Callable[[int, int, str], None] | None = None, timeout: float = START_TIMEOUT,
              idle: str = "poll") -> "Testpmd":
        """Start testpmd in `netns` with `ports`, both its lcores on `cpu`; return once it prompts.

        `on_started(pid, start_time, runtime_dir)` runs as soon as the process exists (a lab records it
        before the wait). Its DPDK runtime directory is made and marked by offlab first; one that is
        already there belongs to someone else and is refused, never reused or deleted.
        """
        require_tool(DAEMON)
        require_tool("stdbuf")
        prefix = f"offlab-{lab}-{secrets.token_hex(3)}"
        mbufs, least_mb = pool_size(len(ports))
        memory_mb = memory_mb or least_mb
        runtime = runtime_dir(prefix)
        made = proc = None
        try:
            # Shielded from the runtime directory to testpmd recorded (by the lab, `on_started`): a signal in
            # between left the directory, or testpmd itself, with nothing that knew of them.
            with shielded():
                try:
                    runtime.mkdir(parents=True, exist_ok=False)
                except FileExistsError:
                    raise EnvironmentProblem(f"DPDK runtime directory {runtime} exists and is not offlab's: left "
                                             f"alone; start again (a new prefix is drawn)") from None
                (runtime / OWNER_FILE).write_text(owner_mark(lab))
                rundir.mkdir(parents=True, exist_ok=True)
                info = Info(netns=netns, prefix=prefix, cpu=cpu, memory_mb=memory_mb, version=version(), ports=ports,
                            tso_segsz={str(p.index): 0 for p in ports}, idle=idle)
                made = self = cls(rundir, info)
                self.fifo.unlink(missing_ok=True)
                os.mkfifo(self.fifo, 0o600)
                argv = ["stdbuf", "-oL", "-eL", DAEMON, f"--lcores=0@{cpu},1@{cpu}", "--no-huge", "-m",
                        str(memory_mb), "--no-pci", f"--file-prefix={prefix}", *[f"--vdev={p.vdev}" for p in ports],
                        "--", "-i",
                        # explicit ring sizes (DPDK's fallback), so a changed descriptor count can be put back exactly
                        f"--rxd={DESCRIPTORS}", f"--txd={DESCRIPTORS}", f"--total-num-mbufs={mbufs}"]
                # Read-write: testpmd itself holds a writer, so it never reads end-of-file between commands.
                stdin = os.open(self.fifo, os.O_RDWR)
                try:
                    with open(self.log, "w") as log:
                        proc = NetnsHost(netns).spawn(argv, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                                                      start_new_session=True)
                finally:
                    os.close(stdin)
                info.pid = proc.pid
                info.start_time = process_start_time(proc.pid) or 0
                self.save()
                if on_started is not None:
                    on_started(proc.pid, info.start_time, str(runtime))
            deadline = time.monotonic() + timeout
            while PROMPT not in self._read_from(0):
                if proc.poll() is not None:
                    raise EnvironmentProblem(f"dpdk-testpmd exited (rc {proc.returncode}) before it was ready: "
                                             f"{self.last_lines()}")
                if time.monotonic() > deadline:
                    raise TestpmdNoAnswer(f"dpdk-testpmd did not prompt within {timeout:g} s: {self.last_lines()}")
                time.sleep(0.1)
        except BaseException:
            if made is not None:
                made.stop()  # testpmd by pid if it started, then the runtime directory (only one marked ours)
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
            else:
                remove_runtime(runtime)
            raise
        return self

    def alive(self) -> bool:
        return self.info.pid > 0 and process_start_time(self.info.pid) == self.info.start_time

    def stop(self, timeout: float = 10.0) -> None:
        """`quit` (ports closed, taps removed), then SIGTERM/SIGKILL by pid; the runtime directory goes."""
        if self.alive():
            with contextlib.suppress(OSError):
                self._write("quit")
            # Gone means its last thread too: the leader turns zombie ~2 s before its other threads let
            # go of the ports (hosts.process.running). A signal goes only to the process we started.
            for sig, wait in ((None, timeout), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
                if sig is not None:
                    signal_pid(self.info.pid, sig, self.info.start_time)
                if wait_gone(self.info.pid, wait):
                    break
        remove_runtime(runtime_dir(self.info.prefix))

    # ---- the command line ----------------------------------------------------
    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Hold testpmd's command line (across processes) for a sequence of commands."""
        if self._depth == 0:
            self._lock_fd = os.open(self.rundir / "cli.lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def command(self, line: str, timeout: float = COMMAND_TIMEOUT) -> str:
        """Send one command and return its answer (without echo and prompt)."""
        if "\n" in line or "\r" in line:
            raise BadInput(f"a testpmd command is one line: {line!r}")
        with self.session():
            if not self.alive():
                raise TestpmdNoAnswer(f"dpdk-testpmd (pid {self.info.pid}) is not running: {self.last_lines()}")
            # A late answer (to a command that timed out) may still be arriving: let it end first.
            start, idle_by = self._size(), time.monotonic() + min(timeout, 3.0)
            while not self._read_from(max(0, start - len(PROMPT))).endswith(PROMPT) and time.monotonic() < idle_by:
                time.sleep(0.02)
                start = self._size()
            self._write(line)
            deadline = time.monotonic() + timeout
            while True:
                text = self._read_from(start)
                echo = text.find(line)
                if echo >= 0:
                    end = text.find(PROMPT, echo + len(line))
                    if end >= 0:
                        return text[echo + len(line):end].strip("\r\n")
                if not self.alive():
                    raise TestpmdNoAnswer(f"dpdk-testpmd died on `{line}`: {self.last_lines()}")
                if time.monotonic() > deadline:
                    raise TestpmdNoAnswer(f"dpdk-testpmd did not answer `{line}` within {timeout:g} s: "
                                          f"{self.last_lines()}")
                time.sleep(0.01)

    def checked(self, line: str, timeout: float = COMMAND_TIMEOUT) -> str:
        """`command`, with a refusal (e.g. `TCP checksum offload is not supported by port 0`) raised."""
        answer = self.command(line, timeout)
        why = parse.refusal(answer)
        if why:
            raise TestpmdRefused(f"testpmd (DPDK {self.info.version}) refused `{line}`: {why}")
        return answer

    def _write(self, line: str) -> None:
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def _read_from(self, offset: int) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def last_lines(self, n: int = 4) -> str:
        # testpmd pads its tables with runs of blanks and frames them with "++++" banners: one line each
        lines = [" ".join(l.split()).strip("+-= ") for l in
                 self._read_from(max(0, self._size() - 4096)).replace(PROMPT, "\n").splitlines()]
        lines = [l for l in lines if l]
        return " | ".join(lines[-n:]) or "(its log is empty)"

    def _size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    # ---- forwarding on demand -------------------------------------------------
    # With `idle: stop`, forwarding runs while at least one offlab process holds it: each holder keeps a
    # shared flock on FORWARDING_LOCK for as long as it measures; the last one to leave (it alone can then
    # take the lock exclusively) stops forwarding. A holder killed outright leaves it running (as `poll`
    # does) until the next holder leaves.
    @contextlib.contextmanager
    def forwarding(self) -> Iterator[None]:
        """Forwarding runs for the block (started if this lab's testpmd rests while idle)."""
        if self.info.idle != "stop":
            yield
            return
        fd = os.open(self.rundir / FORWARDING_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            self.command("start")  # "Packet forwarding already started" when another holder started it
            try:
                yield
            finally:
                try:  # the last holder gets it exclusively, and stops forwarding before anyone else holds it
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # another process measures: it stops forwarding when it leaves
                else:
                    if self.alive():
                        self.command("stop")
        finally:
            os.close(fd)

    def rest(self) -> None:
        """With `idle: stop`: forwarding stops unless some process holds it (see `forwarding`)."""
        if self._resting() and self.alive():
            self.command("stop")

    def _resting(self) -> bool:
        """Whether forwarding should be stopped now: `idle: stop` and no process (this one included) holds it."""
        if self.info.idle != "stop":
            return False
        fd = os.open(self.rundir / FORWARDING_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # the exclusive lock, if taken, goes with it
        return True

    # ---- reconfiguring -------------------------------------------------------
    def reconfigure(self, commands: list[str], *, port_stop: bool | Iterable[int]) -> list[str]:
        """Run `commands` with forwarding stopped, and the ports `port_stop` names stopped (True: all,
        an empty list: none); their answers.

        The tap PMD configures its kernel interface by name in testpmd's namespace, so before a stop
        of its port a tap comes back there, and afterwards goes home again with its addresses and link
        up; ports not named keep running (and their taps stay home). Forwarding is started again
        whatever happened, unless testpmd rests while idle and no process holds it (`forwarding`).
        """
        every = [p.index for p in self.info.ports]
        stop = every if port_stop is True else sorted({int(n) for n in (port_stop or ())} & set(every))
        which = "all" if stop == every else None
        answers = []
        with self.session():
            self.command("stop")
            moved: list[tuple[Port, list[list[str]]]] = []
            try:
                if stop:
                    moved = self._taps_back(stop)
                    for n in ([which] if which else stop):
                        self.checked(f"port stop {n}")
                for line in commands:
                    answers.append(self.checked(line))
            finally:
                try:
                    for n in ([which] if which else stop):
                        self.checked(f"port start {n}", timeout=60)
                    self._taps_home(moved)
                finally:
                    if not self._resting():  # a resting testpmd stays at rest
                        self.command("start")
        return answers

    def _taps_back(self, ports: Iterable[int]) -> list[tuple[Port, list[list[str]]]]:
        moved = []
        for p in self.info.ports:
            if p.index not in ports or p.pmd != "tap" or not p.home or p.home == self.info.netns:
                continue
            addrs = [[a.cidr, *(["nodad"] if a.family == "inet6" else [])]
                     for a in netdev.find_addrs(LOCAL, p.iface, netns=p.home) or () if a.scope == "global"]
            LOCAL.run(["ip", "-n", p.home, "link", "set", p.iface, "netns", self.info.netns], timeout=10)
            moved.append((p, addrs))
        return moved

    def _taps_home(self, moved: list[tuple[Port, list[list[str]]]]) -> None:
        for p, addrs in moved:
            LOCAL.run(["ip", "-n", self.info.netns, "link", "set", p.iface, "netns", p.home], timeout=10)
            for addr in addrs:
                LOCAL.run(["ip", "-n", p.home, "addr", "add", addr[0], "dev", p.iface, *addr[1:]], timeout=10)
            LOCAL.run(["ip", "-n", p.home, "link", "set", p.iface, "up"], timeout=10)

    def remember(self, name: str, per_port: dict[str, object]) -> None:
        """Record a value testpmd will not show back while unused (see Info)."""
        if name == "tso_segsz":
            self.info.tso_segsz.update({k: int(v) for k, v in per_port.items()})
        elif name in ("gro_flush", "gso_segsz"):
            setattr(self.info, name, int(next(iter(per_port.values()))))
        self.save()

    def send_taps_home(self) -> None:
        """After start: each tap goes to its home namespace, link up (addresses are the lab's job)."""
        with self.session():
            self._taps_home([(p, []) for p in self.info.ports if p.pmd == "tap" and p.home and p.home != self.info.netns])

    # ---- reading -------------------------------------------------------------
    def port_stats(self) -> dict[int, dict[str, int]]:
        """Per port: rx/tx packets, bytes, errors, missed, nombuf, and forwarding drops."""
        with self.session():
            stats = parse.port_stats(self.command("show port stats all"))
            for port, drops in parse.fwd_drops(self.command("show fwd stats all")).items():
                stats.setdefault(port, {}).update(drops)
        return stats

    def settings(self) -> dict:
        """What testpmd says is in force: fwd mode, burst, descriptors; GRO, GSO, checksum, TSO per port.

        Its answers are read again unless nothing at all was written to testpmd's log since they were
        read: every command (from any process) is echoed there, and only a command changes a setting,
        so an unchanged log means unchanged answers (a read-back after any change always asks)."""
        with self.session():
            answers = self._answers()
        rxtx = parse.rxtx(answers["rxtx"])
        ports = {}
        for p in self.info.ports:
            n = p.index
            tx = parse.offloads(answers[f"tx {n}"])
            ports[n] = {
                "gro": parse.gro(answers[f"gro {n}"]), "gso": parse.gso(answers[f"gso {n}"]),
                "csum": {proto: ("hw" if flag in tx else "sw") for proto, flag in CSUM_FLAGS.items()},
                "tso_segsz": self.info.tso_segsz.get(str(n), 0) if "TCP_TSO" in tx else 0,
                "rxd": rxtx["ports"].get(n, {}).get("rxd"), "txd": rxtx["ports"].get(n, {}).get("txd"),
            }
        return {"fwd": rxtx["fwd"], "burst": rxtx["burst"], "ports": ports}

    def _answers(self) -> dict[str, str]:
        """The answers of the `show` commands `settings` reads; the last ones if the log has not grown."""
        ident = ("testpmd answers", str(self.rundir), self.info.pid, self.info.start_time)
        last = self._memo.get(ident)
        if last is not None and last[0] == self._size() and self.alive():
            return last[1]
        answers = {"rxtx": self.command("show config rxtx")}
        for p in self.info.ports:
            answers[f"gro {p.index}"] = self.command(f"show port {p.index} gro")
            answers[f"gso {p.index}"] = self.command(f"show port {p.index} gso")
            answers[f"tx {p.index}"] = self.command(f"show port {p.index} tx_offload configuration")
        self._memo.put(ident, (self._size(), answers))
        return answers

    def capabilities(self, port: int) -> set[str]:
        """The port's TX offload capabilities: fixed for the life of the port, so asked once per testpmd."""
        ident = ("testpmd capabilities", str(self.rundir), self.info.pid, self.info.start_time, port)
        caps = self._memo.get(ident)
        if caps is None:
            caps = parse.offloads(self.command(f"show port {port} tx_offload capabilities"))
            self._memo.put(ident, caps)
        return set(caps)

    @property
    def _memo(self) -> Memo:
        """Where its answers are kept between `Testpmd` objects (one per call of for_lab): the memo of
        the namespace it runs in, which ends with its lab (lab.remove); the keys carry its pid and
        start time, so a testpmd started again in the same namespace is asked anew."""
        return NetnsHost(self.info.netns).memo

    def port_info(self, port: int) -> dict:
        return parse.port_info(self.command(f"show port info {port}"))

    def describe(self) -> dict:
        """What `lab show --json` says about testpmd."""
        out = {"pid": self.info.pid, "running": self.alive(), "version": self.info.version,
               "file_prefix": self.info.prefix, "runtime_dir": str(runtime_dir(self.info.prefix)),
               "cpu": self.info.cpu, "memory_mb": self.info.memory_mb, "rundir": str(self.rundir),
               "ports": [asdict(p) for p in self.info.ports], "idle": self.info.idle}
        if out["running"]:
            out["settings"] = self.settings()
        return out


# `show port N tx_offload configuration` names → the protocol `csum set PROTO hw N` offloads.
CSUM_FLAGS = {"ip": "IPV4_CKSUM", "udp": "UDP_CKSUM", "tcp": "TCP_CKSUM", "sctp": "SCTP_CKSUM"}
