"""Readers of the hosts with a kernel of their own (a guest, an SSH host): one request per snapshot.

Such a host cannot be read from here: each snapshot sends it one request for its clock and all its
counter files back to back (a guest's agent answers a `read_many` without forking; an SSH host runs
one `awk` through a reader stream it keeps for the session), on a thread, timed (sent → answered on
this machine's clock), and the snapshot does not wait for the answer (`ProbeSession.settle` does).
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time

from offlab.errors import EnvironmentProblem, OfflabError
from offlab.hosts import Host
from offlab.hosts.base import TC_QDISC_SHOW
from offlab.probes import counters


class RemoteReaders:
    """The channel hosts of one probe session, by role, with the reader stream of each that keeps one."""

    def __init__(self, hosts: dict[str, Host], *, lifetime: float,
                 extra: dict[str, tuple[str, ...]] | None = None, files: tuple[str, ...] = ()) -> None:
        self.hosts = hosts
        # role → more files read in the same request as its counters (its hist triggers: hist.py)
        self.extra = extra or {}
        # the /proc files the session's probes need from every such host (offlab/probes/edge/, `remote_files`)
        self.files = files
        self.streams: dict[str, Stream] = {}
        try:
            for role, host in hosts.items():
                if (proc := host.stream(["sh", "-c", stream_read(self.extra.get(role) or (), files)],
                                        lifetime=lifetime)) is not None:
                    self.streams[role] = Stream(proc, host.name)
        except BaseException:
            self.close()
            raise

    def read_extra(self, role: str, text: str) -> dict[str, str]:
        """The extra files of `role` (its hist files) out of a read's text: read with its counters in the
        same request, by a guest's agent and by an SSH host's reader stream alike."""
        paths = self.extra.get(role) or ()
        return split_files(text, paths) if paths else {}

    def read(self, role: str) -> tuple[str, float, "Async | str"]:
        """One snapshot of a channel host's counters: the files' text as split_counter_files reads it,
        the instant they were answered (this machine's monotonic clock), and its tc text (a string, or
        an Async that gives it). Over an SSH host's stream: one REMOTE_READ answer. Elsewhere (a
        guest): every file in one `read_many`, then its qdiscs (`qdisc_json`), both answered by its
        agent without forking; the qdiscs are not waited for here: the files' read span stays theirs."""
        if role in self.streams:
            files, _, tc_text = self.streams[role].ask().partition(SEP + "\n")
            return files, time.monotonic(), tc_text
        host = self.hosts[role]
        texts = host.read_many(guest_read_order(tuple(self.extra.get(role) or ()), self.files))
        tc = Async(read_tc_text, host)
        answered = time.monotonic()
        if texts.get("/proc/net/dev") is None:
            raise OSError(f"{host.name} did not give its /proc/net/dev")
        text = "".join(f"@@{path}\n{t}" + ("" if t.endswith("\n") else "\n")
                       for path, t in texts.items() if t is not None)
        return text, answered, tc

    def read_clock(self, role: str) -> str:
        """The host's /proc/uptime: over its stream where it has one, else alone (a guest's agent
        reads it without forking)."""
        if role in self.streams:
            return split_counter_files(self.streams[role].ask().partition(SEP + "\n")[0])["uptime"]
        return self.hosts[role].read("/proc/uptime")

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()


SEP = "@@offlab-probe@@"


def remote_read(extra: tuple[str, ...] = (), files: tuple[str, ...] = ()) -> str:
    """One process reads every counter file back to back, its own clock first (/proc/uptime), and sends
    only the lines offlab keeps with single spaces: the answer crosses a guest's channel at a few KB a
    second under TCG (6 KB took ~1.5 s here, a load of 7 on 2 cores). tc, a command, comes after.

    `extra` (an SSH host's hist files) are read whole by the same awk right after /proc/net/snmp, so its
    drops and the socket counters they are compared with are one instant of the host. Read by a command
    of their own after the counters, they came seconds later on a guest busy dropping datagrams (its
    forks starved by its softirq): the whole 1-s window passed between the two.

    `files` (the probes' `remote_files`) are read by the same awk after the counters, before /proc/stat,
    each that exists, their lines with single spaces."""
    probe_files = "".join(f'[ -r {shlex.quote(p)} ] && set -- "$@" {shlex.quote(p)}; ' for p in files)
    counter_files = "set -- /proc/uptime /proc/net/dev /proc/net/snmp /proc/net/netstat; "
    if extra:  # each that exists (awk would stop at one it cannot open), no fork to see
        hists = " ".join(shlex.quote(p) for p in extra)
        counter_files = counter_files.replace(
            " /proc/net/netstat; ",
            f'; for f in {hists}; do [ -r "$f" ] && set -- "$@" "$f"; done; set -- "$@" /proc/net/netstat; ')
    return (
        counter_files +
        '[ -e /proc/net/snmp6 ] && set -- "$@" /proc/net/snmp6; ' + probe_files +
        "awk 'FNR==1{print \"@@\" FILENAME} "
        + ("FILENAME ~ /\\/hist$/ {print; next} " if extra else "")
        + "FILENAME ~ /snmp$/ && !/^(Ip|Tcp|Udp):/ {next} "
        # /proc/net/netstat's TcpExt has ~120 columns: only those offlab keeps (names, then values)
        "FILENAME ~ /netstat$/ {if (!/^TcpExt:/) next; if (!n) for (i = 2; i <= NF; i++) "
        f"if ($i ~ /^({'|'.join(counters.SNMP_KEEP['TcpExt'])})$/) k[++n] = i; "
        "l = $1; for (j = 1; j <= n; j++) l = l \" \" $(k[j]); print l; next} "
        "FILENAME ~ /snmp6$/ && !/^(Ip6|Udp6)[A-Z]/ {next} "
        "FILENAME ~ /\\/stat$/ && !/^cpu/ {next} {$1=$1; print}' \"$@\" /proc/stat; "
        f"echo {SEP}; {' '.join(TC_QDISC_SHOW)} 2>/dev/null")


REMOTE_READ = remote_read()


def split_counter_files(text: str) -> dict[str, str]:
    """The answer of REMOTE_READ before its tc part → {"uptime": ..., "dev": ..., "snmp": ..., "netstat": ...,
    "snmp6": ..., "stat": ...} (a file the host lacks is "")."""
    files = {name: "" for name in ("uptime", "dev", "snmp", "netstat", "snmp6", "stat")}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith("@@/"):  # a file other than /proc's (a hist file) belongs to none of these
            name = line.strip().rsplit("/", 1)[1] if line.startswith("@@/proc/") else None
        elif name in files:
            files[name] += line
    return files


def split_files(text: str, paths) -> dict[str, str]:
    """The named files' text out of a read's "@@PATH" sections."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith("@@/"):
            name = line[2:].rstrip("\n") if line[2:].rstrip("\n") in paths else None
            if name is not None:
                out[name] = ""
        elif name is not None:
            out[name] += line
    return out


# What a guest's agent reads in one request (read_many), in this order: its clock first.
COUNTER_FILES = ("/proc/uptime", "/proc/net/dev", "/proc/net/snmp", "/proc/net/netstat", "/proc/net/snmp6",
                 "/proc/stat")


def guest_read_order(extra: tuple[str, ...], files: tuple[str, ...]) -> tuple[str, ...]:
    """The files of one agent request in the order they are read: the counters with `extra` (the hist
    files) right after /proc/net/snmp, as REMOTE_READ reads an SSH host's, then the probes' files.
    Read after /proc/stat instead, a TCG guest busy dropping datagrams (its softirq starving the agent
    between reads) counted a third more drops in /proc/net/snmp's window than in its hist's."""
    at = COUNTER_FILES.index("/proc/net/snmp") + 1
    return COUNTER_FILES[:at] + extra + COUNTER_FILES[at:] + files


def read_tc_text(host) -> str:
    """`tc -s -j qdisc show`'s JSON of a host (a guest's agent asks rtnetlink, no fork), "" where it
    cannot say."""
    try:
        return host.qdisc_json(timeout=30) or ""
    except OfflabError:
        return ""


# The same read, once per line on stdin, for a host that keeps a reader process (an SSH host's stream).
END = "@@offlab-end@@"


def stream_read(extra: tuple[str, ...] = (), files: tuple[str, ...] = ()) -> str:
    return f"while read -r _; do {remote_read(extra, files)}; echo {END}; done"



class Stream:
    """A reader process on a channel host: a line in, one REMOTE_READ answer out (ends with END)."""

    def __init__(self, proc, name: str) -> None:
        self.proc, self.name, self.lock = proc, name, threading.Lock()

    def ask(self) -> str:
        with self.lock:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
            except OSError:  # its end closed its input first (a broken pipe): why it ended says more
                raise OSError(self._ended()) from None
            lines = []
            while (line := self.proc.stdout.readline()) and line.rstrip("\n") != END:
                lines.append(line)
            if not line:
                raise OSError(self._ended())
            return "".join(lines)

    def _ended(self) -> str:
        """Why the reader's output ended: over SSH, a connection that died (the host crashed or fell off
        the network) says so in ssh's own exit status."""
        try:
            rc = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            rc = None
        if rc == 255:
            return f"ssh host {self.name}: the connection of its counter reader ended (ssh exit 255)"
        return f"the counter reader on {self.name} ended" + (f" (exit {rc})" if rc is not None else "")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own ssh client, by its pid
            self.proc.wait()


class RemoteRead:
    """One snapshot's files of a host with its own kernel, read in one request on a thread, timed."""

    def __init__(self, read, role: str, *, done=None, extra=None) -> None:
        self.read, self.role, self.out, self.tc, self.done = read, role, "", "", done
        self.read_extra = extra  # (role, text) → the extra files: after `done`, off the counters' span
        self.extra: dict[str, str] = {}
        self.error: OfflabError | OSError | None = None
        self.sent = self.answered = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sent = time.monotonic()
            self.out, self.answered, self.tc = self.read(self.role)
        except (OfflabError, OSError) as exc:
            self.error = exc
        finally:
            if self.done is not None:
                self.done()
        if self.read_extra is not None and self.error is None:
            try:
                self.extra = self.read_extra(self.role, self.out)
            except (OfflabError, OSError):
                self.extra = {}

    def result(self, lab: str, role: str) -> tuple[dict[str, str], str]:
        self.thread.join(timeout=35)
        if self.error is not None or not self.out:
            raise EnvironmentProblem(f"lab {lab}: the counters of host {role} cannot be read"
                                     + (f": {self.error}" if self.error else ""))
        tc_text = self.tc.result(timeout=35) if isinstance(self.tc, Async) else self.tc
        return split_counter_files(self.out), tc_text or ""


class Async:
    """fn(*args) on a thread; `result()` waits for it (None if it did not finish in time)."""

    def __init__(self, fn, *args) -> None:
        self.value = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn, *args) -> None:
        self.value = fn(*args)

    def result(self, timeout: float = 15.0):
        self.thread.join(timeout=timeout)
        return self.value
