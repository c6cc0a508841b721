"""Processes offlab starts: pinning, readiness, stopping by pid, and processes on channel hosts.

A namespace process is a local `subprocess.Popen`. On a host reached over a channel (a
guest's agent, SSH) a long-lived process cannot be a local child, so `RemoteProcess`
starts it detached in a private directory on that host, records its pid and, when it
ends, its exit code, and offers Popen's verbs over `host.run`.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shlex
import signal
import subprocess
import time
from typing import Sequence

from offlab.hosts.base import Host, Process
from offlab.errors import OfflabError
from offlab.interrupts import ending, protected, shielded

# Runs "$@" with stdout/stderr to files in $D, records its pid, then its exit code; each file
# appears whole (written to a temp name, then renamed), so a reader never sees half a number.
# A job a non-interactive shell puts in the background starts with SIGINT and SIGQUIT ignored,
# and no shell can undo that for its children (POSIX), so `stop`'s SIGINT would do nothing:
# coreutils' `env --default-signal` (8.31+) resets them, else perl (Debian's perl-base is essential).
_DEFAULT_SIGNALS = ('if env --default-signal=INT,QUIT true 2>/dev/null; then set -- env --default-signal=INT,QUIT "$@"; '
                    'elif command -v perl >/dev/null 2>&1; then '
                    'set -- perl -e \'$SIG{INT}=$SIG{QUIT}="DEFAULT"; exec {$ARGV[0]} @ARGV or exit 127\' "$@"; fi; ')
_INNER = ('D=$1; shift; ' + _DEFAULT_SIGNALS + '"$@" >"$D/out" 2>"$D/err" </dev/null & '
          'echo $! >"$D/pid.t"; mv "$D/pid.t" "$D/pid"; wait $!; echo $? >"$D/rc.t"; mv "$D/rc.t" "$D/rc"')
# Detaches the runner from the command channel (setsid, all fds away) and waits for the pid file.
_OUTER = ('D=$1; setsid sh -c ' + shlex.quote(_INNER) + ' sh "$@" >/dev/null 2>&1 </dev/null & '
          'n=0; while [ ! -s "$D/pid" ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done; cat "$D/pid"')
# Makes the private directory and starts the command in it, in one command (a guest's round trip is
# 0.2-3 s under load here): prints the directory, then the pid.
_START = 'D=$(mktemp -d /tmp/offlab-proc.XXXXXX) || exit 1; echo "$D"; set -- "$D" "$@"; ' + _OUTER
# The same on a host that keeps offlab's journal (SSH): the runner also writes "$D/ids", each line
# "PID START" (start = field 22 of /proc/PID/stat) of the command and of itself, before "$D/pid",
# so the undo script recorded before the start ends exactly these processes, never a reused pid.
# `st PID`: the process's start time (field 22 of /proc/PID/stat, after the command's parenthesis);
# nothing once it is gone or a zombie. Also used by the undo scripts (offlab.hosts.remote_journal).
START_TIME_SH = ('st() { s=$(cat /proc/$1/stat 2>/dev/null) || return 0; s=${s##*) }; set -- $s; '
                 '[ "$1" = Z ] || echo "${20}"; }; ')
_INNER_IDS = ('D=$1; shift; ' + _DEFAULT_SIGNALS + START_TIME_SH + '"$@" >"$D/out" 2>"$D/err" </dev/null & p=$!; '
              'printf "%s %s\n%s %s\n" "$p" "$(st $p)" "$$" "$(st $$)" >"$D/ids.t"; mv "$D/ids.t" "$D/ids"; '
              'echo $p >"$D/pid.t"; mv "$D/pid.t" "$D/pid"; wait $p; echo $? >"$D/rc.t"; mv "$D/rc.t" "$D/rc"')
_OUTER_IDS = _OUTER.replace(shlex.quote(_INNER), shlex.quote(_INNER_IDS))


def pinned(argv: list[str], cpu: int | None) -> list[str]:
    """argv run under `taskset -c CPU`, so each side has its own CPU."""
    return ["taskset", "-c", str(cpu), *argv] if cpu is not None else list(argv)


def cpu_on(host: Host, cpu: int | None) -> int | None:
    """The CPU to pin to on `host`: this machine's CPUs are offlab's to place; a guest's or an SSH
    host's are their own (a 1-vCPU guest has no CPU 1), so nothing is pinned there."""
    return cpu if host.shares_kernel else None


class _RemoteStream:
    """A finished-or-not remote output file, read whole on demand (`proc.stderr.read()`)."""

    def __init__(self, proc: "RemoteProcess", name: str) -> None:
        self.proc, self.name = proc, name

    def read(self) -> str:
        return self.proc._read(self.name)

    def close(self) -> None:
        pass


# Waits in the remote host until "$1/rc" exists, at most $2 looks 0.2 s apart (0 after
# `wait_for_file` said it is there), stopping once the directory is gone (the host's restore.sh ended
# the process after a crash); once it ended: its code, stdout, stderr, each after a line only this
# call knows ($3), the directory removed and its undo script ($4) too - the end of a process in one command.
_WAIT_LOOP = 'n=$2; while [ -d "$1" ] && [ ! -e "$1/rc" ] && [ "$n" -gt 0 ]; do sleep 0.2; n=$((n - 1)); done'
_WAIT_COLLECT = (_WAIT_LOOP + '; [ -e "$1/rc" ] || exit 0; printf \'%s\\n\' "$3"; cat "$1/rc"; '
                 'printf \'%s\\n\' "$3"; cat "$1/out"; printf \'\\n%s\\n\' "$3"; cat "$1/err"; rm -rf "$1"; '
                 '[ -z "$4" ] || rm -f "$4"')
WAIT_CHUNK_S = 10


class RemoteProcess:
    """A detached process on a channel host, with the verbs of `subprocess.Popen` offlab uses."""

    def __init__(self, host: Host, argv: Sequence[str], *, text: bool = True, remote_dir: str | None = None) -> None:
        """Start argv detached on `host`. With `remote_dir` (a host that keeps offlab's journal, SSH) the
        process is recorded there before it starts (offlab.hosts.remote_journal): its directory is
        `<remote_dir>/proc/<stamp>`, and the host's restore.sh, `offlab restore` and `lab down` end it."""
        self.host = host
        self.args = [str(a) for a in argv]
        self.text = text
        self.returncode: int | None = None
        self.undo = ""  # the host's undo script for this process, when recorded
        # Shielded: a signal during the start waits for its answer, so a process it began is recorded (and
        # is ended by the lab's teardown) before anything unwinds; the start takes well under its 15 s.
        with shielded():
            self._start(host, remote_dir)

    def _start(self, host: Host, remote_dir: str | None) -> None:
        if remote_dir is None:
            res = host.run(["sh", "-c", _START, "sh", *self.args], check=False, timeout=15)
            want = "/tmp/offlab-proc."
        else:
            from offlab.hosts import remote_journal

            stamp, undo_text, start = remote_journal.process_record(remote_dir, self.args,
                                                                    lease=remote_journal.lease_of(host, remote_dir))
            want = f"{remote_dir}/proc/{stamp}"
            self.undo = f"{remote_dir}/undo/{stamp}.sh"
            res = host.run(["sh", "-c", start + _OUTER_IDS, "sh", remote_dir, stamp, *self.args], check=False,
                           timeout=15, input=undo_text)
        lines = res.stdout.strip().splitlines()
        self.dir = lines[0] if lines and lines[0].startswith(want) else ""
        if not self.dir:
            if self.undo:
                host.run(["sh", "-c", self._forget_sh(), "sh", want, self.undo], check=False, timeout=15)
            raise OSError(f"could not start {self.args[0]} on {host.name}: no private directory "
                          f"({res.stderr.strip()[:200]})")
        try:
            self.pid = int(lines[-1])
        except ValueError:
            # Not started, or its pid not seen in 5 s: the recorded undo ends it if it did start.
            if self.undo:
                host.run(["sh", self.undo], check=False, timeout=15)
            host.run(["sh", "-c", self._forget_sh(), "sh", self.dir, self.undo], check=False, timeout=15)
            raise OSError(f"could not start {self.args[0]} on {host.name}: no pid "
                          f"({res.stderr.strip()[:200]})") from None
        self.stdout = _RemoteStream(self, "out")
        self.stderr = _RemoteStream(self, "err")
        self._cleaned = False

    def _read(self, name: str) -> str:
        if self._cleaned:
            return ""
        return self.host.run(["cat", f"{self.dir}/{name}"], check=False, timeout=30).stdout

    def poll(self) -> int | None:
        if self.returncode is None and not self._cleaned:
            res = self.host.run(["cat", f"{self.dir}/rc"], check=False, timeout=15)
            if res.ok and res.stdout.strip():
                self.returncode = int(res.stdout.strip())
        return self.returncode

    def _ended_within(self, left: float | None) -> bool:
        """Whether its exit code appeared within `left` seconds (at most WAIT_CHUNK_S; None: that):
        the host looks itself (a guest's agent with a stat every 20 ms, no fork), not a command every
        50 ms: each command is a round trip, and in a 1-vCPU TCG guest the forks of 20 a second took
        the CPU from the traffic being measured (docs/vm.md, the guest TCP gap)."""
        chunk = WAIT_CHUNK_S if left is None else max(0.0, min(WAIT_CHUNK_S, left))
        return self.host.wait_for_file(f"{self.dir}/rc", chunk)

    def _check_not_ended_by_restore(self) -> None:
        """A process whose directory is gone was ended by the host's own restore (restore.sh after the
        controller's crash): waiting longer would wait for ever."""
        if self.undo and not self.host.exists(self.dir):
            self._cleaned = True
            raise OSError(f"{self.args[0]} on {self.host.name} was ended by the host's restore (its directory "
                          f"{self.dir} is gone)")

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if self._ended_within(left):
                res = self.host.run(["cat", f"{self.dir}/rc"], check=False, timeout=15)
                if res.stdout.strip().lstrip("-").isdigit():
                    self.returncode = int(res.stdout.strip())
                    continue
            self._check_not_ended_by_restore()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.host.run(["kill", f"-{int(sig)}", str(self.pid)], check=False, timeout=15)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple:
        """Wait for the end and take its code, stdout and stderr, and remove its directory: a wait
        for its exit code (see `_ended_within`), then one command."""
        if self._cleaned:  # ended and collected (or stopped) before: nothing left to read
            return "", ""
        deadline = None if timeout is None else time.monotonic() + timeout
        mark = f"@@offlab-{secrets.token_hex(8)}@@"
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if self._ended_within(left):
                # ended: its code, stdout and stderr, the directory and its undo removed, in one command
                res = self.host.run(["sh", "-c", _WAIT_COLLECT, "sh", self.dir, "0", mark, self.undo], check=False,
                                    timeout=30)
                if res.stdout.startswith(mark + "\n"):
                    break
            self._check_not_ended_by_restore()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        rc, found, rest = res.stdout[len(mark) + 1:].partition(f"\n{mark}\n")
        out, found_err, err = rest.partition(f"\n{mark}\n")
        self._cleaned = True
        if not (found and found_err and rc.strip().lstrip("-").isdigit()):
            raise OSError(f"could not read the end of {self.args[0]} on {self.host.name} "
                          f"({res.stderr.strip()[:200]})")
        self.returncode = int(rc.strip())
        return out, err

    def cleanup(self) -> None:
        """Remove the process's private directory on the host (after it ended)."""
        if not self._cleaned:
            self.host.run(["sh", "-c", self._forget_sh(), "sh", self.dir, self.undo], check=False, timeout=15)
            self._cleaned = True

    @staticmethod
    def _forget_sh() -> str:
        """Its directory, then its undo script (so a crash in between leaves a harmless script, not a directory)."""
        return 'rm -rf -- "$1"; [ -z "$2" ] || rm -f -- "$2"'


def listen_timeout(host: Host) -> float:
    """How long `wait_listening` waits by default: 20 s on this machine's kernel (an iperf3 server alive and
    not yet listening after 5 s was seen twice in one full test suite, the machine 88 % busy) and 30 s on a
    host reached over a channel (SSH, a guest), where one `ss` round trip alone took over 5 s with 16
    stand-in hosts on 2 CPUs (load 22). A server that died is seen at once, not waited for."""
    return 20.0 if host.shares_kernel else 30.0


def wait_listening(host: Host, port: int, proto: str, proc: Process, timeout: float | None = None) -> bool:
    """True once something listens on `port` in `host`; False if `proc` died or time ran out (by
    default `listen_timeout(host)`)."""
    if timeout is None:
        timeout = listen_timeout(host)
    flag = "-Hltn" if proto == "tcp" else "-Hlun"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if host.run(["ss", flag, f"sport = :{port}"], check=False, timeout=max(5.0, left)).stdout.strip():
            return True
        time.sleep(0.02)


KILLED_WAIT_S = 10.0  # how long a process is waited for after SIGKILL before it is left to its host's clean-up
# ...and while offlab is ending on a signal, when nothing it would print is wanted any more and the exit
# is bounded (a TCG guest under load took 12.6 s to show a killed sender gone: the harness's guest seed 63)
ENDING_GRACE_S, ENDING_KILLED_WAIT_S = 0.5, 2.0


@protected  # called from `finally` blocks: a signal as it begins waits too
def stop(proc: Process, grace: float = 2.0) -> None:
    """End a process we started: SIGINT, then SIGKILL; reaped. A second Ctrl-C while it ends (the first
    one is often why it is stopped) waits: cut short, it would leave it running. One still not seen gone
    KILLED_WAIT_S after SIGKILL (a guest too loaded to answer in time, a process stuck in the kernel) is
    left to what ends everything there (a guest's QEMU with its lab; an SSH host's record, ended at this
    process's exit or by `offlab restore`). While offlab is ending on a signal, the waits are
    ENDING_GRACE_S and ENDING_KILLED_WAIT_S. It never raises: stop runs in `finally` blocks, where an
    error of its own (also a host that no longer answers) would hide the one, or the interrupt, that is
    unwinding."""
    quick = ending()
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=min(grace, ENDING_GRACE_S) if quick else grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=ENDING_KILLED_WAIT_S if quick else KILLED_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
        if isinstance(proc, RemoteProcess) and proc.returncode is not None:
            proc.cleanup()  # its directory (and record) go only once it has ended
    except (OfflabError, OSError):
        pass  # its host does not answer: its own clean-up (QEMU's end, the host's record) ends it
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


def running(pid: int) -> bool:
    """True while a process of this machine runs. A zombie (exited, not yet reaped: a detached daemon's
    parent here may be a PID 1 that does not reap) counts as gone once its last thread has exited too:
    dpdk-testpmd's leader turns zombie ~2 s before its other threads let go of their ports and memory."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] != "Z" or _threads_left(pid)
    except OSError:
        return False


def exited(pid: int) -> bool:
    """True once a process of this machine has exited: gone, or a zombie (its leader has exited even
    while its other threads still let go, see `running`): a daemon in that state has died."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] == "Z"
    except OSError:
        return True


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """`preexec_fn` for a helper process that must not outlive the offlab that started it, even one
    killed with SIGKILL: the kernel sends it SIGTERM when the starting thread ends (prctl
    PR_SET_PDEATHSIG). ansible-playbook ends its workers and their commands on SIGTERM."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until a process of this machine no longer `running` (its last thread too); True if gone."""
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def signal_pid(pid: int, sig: int, start_time: int | None = None) -> bool:
    """Send `sig` to a process of this machine offlab started, only if it still is that process (its
    start time, when given, matches: a reused pid is never hit); False if it is gone or not ours."""
    if start_time is not None and process_start_time(pid) != start_time:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def process_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat); None once it is
    gone as `running` says: a zombie is gone, but a zombie leader whose other threads still run (a
    killed dpdk-testpmd letting go of its ports) is still that process, to be waited out."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X") and not _threads_left(pid):
        return None
    return int(fields[19])


def _threads_left(pid: int) -> bool:
    """Whether an exited leader's other threads still run."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False
