"""A QEMU guest as a `Host`: argv runs over the guest's virtio-serial command channel.

QEMU listens on a unix socket (`-chardev socket,server=on,wait=off`) for the port named `ctl`;
the agent in the guest (offlab-agent, protocol in offlab/vm/guestfs.py) runs each command as
`sh -c "$cmd"` where `cmd` is `shlex.join(argv)`, so the guest's shell sees exactly the argv given
here; file reads, writes and existence checks (`read`, `read_many`, `write`, `exists`,
`wait_for_file`) it answers in its own process, without a fork. Requests carry ids;
one reader thread per connection hands each answer to the caller waiting for that id, so threads
share one connection and run concurrently in the guest. A call that times out asks the agent to
kill its process group and leaves; its late answer is dropped by id, so the channel never wedges.

QEMU accepts one client at a time, so a connection is closed after it has been idle for
`IDLE_CLOSE` seconds: another process (`lab exec`, a restore) then gets its turn.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from offlab.errors import BadInput, CommandFailed, CommandTimeout, EnvironmentProblem
from offlab.hosts.base import DEFAULT_TIMEOUT, TC_QDISC_SHOW, Host, Result
from offlab.hosts.process import RemoteProcess, process_start_time

IDLE_CLOSE = 2.0
CONNECT_TIMEOUT = 10.0
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class GuestGone(EnvironmentProblem):
    """The guest's QEMU is not running any more (or its channel closed)."""


class _Pending:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.rc: int | None = None
        self.results: list[tuple[int, bytes]] = []  # an F request's: (errno or 0, data) per op
        self.error: str | None = None
        self.done = threading.Event()


class _Channel:
    """One connection to a guest's agent, shared by the threads of this process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()  # guards sock, pending, the reader's life
        self.wlock = threading.Lock()  # one writer at a time: requests are whole lines
        self.sock: socket.socket | None = None
        self.pending: dict[str, _Pending] = {}
        self.prefix = secrets.token_hex(4)
        self.counter = 0
        self.last_used = time.monotonic()

    def _connect(self, deadline: float) -> socket.socket:
        last: OSError | None = None
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(max(0.1, min(CONNECT_TIMEOUT, deadline - time.monotonic())))
            try:
                s.connect(self.path)
                s.settimeout(0.5)
                return s
            except OSError as exc:
                s.close()
                last = exc
            if time.monotonic() >= deadline:
                raise GuestGone(f"cannot reach the guest's channel {self.path}: {last}")
            time.sleep(0.05)

    def call(self, cmd: str | None, stdin: bytes | None, timeout: float, *,
             ops: Sequence[str] | None = None) -> _Pending:
        """One request: a command (`Q`), file operations (`F`, `ops`), or an echo (`P`) when
        cmd and ops are None."""
        deadline = time.monotonic() + timeout
        with self.lock:
            if self.sock is None:
                self.sock = self._connect(deadline)
                threading.Thread(target=self._reader, args=(self.sock,), daemon=True,
                                 name=f"guest-channel {self.path}").start()
            self.counter += 1
            cid = f"{self.prefix}{self.counter:x}"
            pending = self.pending[cid] = _Pending()
            sock = self.sock
        if ops is not None:
            line = f"F {cid} {' '.join(ops)}\n"
        elif cmd is None:
            line = f"P {cid}\n"
        else:
            body = base64.b64encode(cmd.encode()).decode()
            data = base64.b64encode(stdin).decode() if stdin else "-"
            line = f"Q {cid} {body} {data}\n"
        try:
            with self.wlock:
                sock.sendall(line.encode())
        except OSError as exc:
            self._drop(cid)
            raise GuestGone(f"the guest's channel {self.path} closed: {exc}") from exc
        if not pending.done.wait(max(0.0, deadline - time.monotonic())):
            self._drop(cid)
            try:  # the agent kills the command's process group; its answer is dropped by id
                with self.wlock:
                    sock.sendall(f"K {cid}\n".encode())
            except OSError:
                pass
            raise TimeoutError
        self._drop(cid)
        return pending

    def close(self) -> None:
        """Close the connection: its reader fails what is still pending (the guest's lab is gone)."""
        with self.lock:
            sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _drop(self, cid: str) -> None:
        with self.lock:
            self.pending.pop(cid, None)
            self.last_used = time.monotonic()

    def _reader(self, sock: socket.socket) -> None:
        partial: list[bytes] = []  # the chunks of a line not ended yet (an answer of MBs is one line)
        error = "the guest closed its channel"
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                with self.lock:
                    if not self.pending and time.monotonic() - self.last_used > IDLE_CLOSE:
                        self.sock = None
                        break
                continue
            except OSError as exc:
                error = f"the guest's channel failed: {exc}"
                chunk = b""
            if not chunk:
                with self.lock:
                    if self.sock is sock:
                        self.sock = None
                    for p in self.pending.values():
                        p.error = error
                        p.done.set()
                    self.pending.clear()
                break
            *ended, rest = chunk.split(b"\n")
            if ended:
                ended[0] = b"".join([*partial, ended[0]])
                partial = []
                for line in ended:
                    self._dispatch(line)
            if rest:
                partial.append(rest)
        sock.close()

    def _dispatch(self, line: bytes) -> None:
        parts = line.split(b" ")
        if len(parts) < 2 or parts[0] not in (b"O", b"E", b"R", b"A"):
            return  # a partial line left from a connection that closed mid-answer
        with self.lock:
            pending = self.pending.get(parts[1].decode(errors="replace"))
        if pending is None:
            return
        payload = parts[2] if len(parts) > 2 else b""
        try:
            if parts[0] == b"O":
                pending.out.append(base64.b64decode(payload))
            elif parts[0] == b"E":
                pending.err.append(base64.b64decode(payload))
            elif parts[0] == b"A":
                for res in parts[2:]:
                    code, _, data = res.partition(b":")
                    pending.results.append((int(code), base64.b64decode(data)))
                pending.rc = 0
                pending.done.set()
            else:
                pending.rc = int(payload)
                pending.done.set()
        except ValueError:
            pending.error = f"garbled answer from the guest: {line[:80]!r}"
            pending.done.set()


class _Channels:
    """This process's channels, one per guest socket, each from its first use until its guest's lab is
    removed (`GuestHost.forget`, from lab.remove). Keyed by the socket, not by `Host.key`: QEMU's
    chardev takes one connection at a time, and the hosts of one guest are rebuilt from refs that
    differ (with or without its lab and role), so they must all share its one connection. An idle
    channel's socket closes by itself (IDLE_CLOSE) and opens again on the next call."""

    def __init__(self) -> None:
        self._open: dict[str, _Channel] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> _Channel:
        with self._lock:
            ch = self._open.get(path)
            if ch is None:
                ch = self._open[path] = _Channel(path)
            return ch

    def close(self, path: str) -> None:
        with self._lock:
            ch = self._open.pop(path, None)
        if ch is not None:
            ch.close()

    def __contains__(self, path: str) -> bool:
        with self._lock:
            return path in self._open


_CHANNELS = _Channels()


def _channel(path: str) -> _Channel:
    return _CHANNELS.get(path)


class GuestHost(Host):
    """A QEMU guest reached through its virtio-serial agent."""

    kind = "guest"

    def __init__(self, socket: str, pid: int, start_time: int, *, lab: str | None = None,
                 role: str | None = None, console: str | None = None) -> None:
        if not isinstance(socket, str) or not socket.startswith("/"):
            raise BadInput(f"invalid guest channel socket {socket!r}")
        self.socket = socket
        self.pid = int(pid)
        self.start_time = int(start_time)
        self.lab = lab
        self.role = role
        self.console = console
        self.name = f"{lab}:{role}" if lab and role else f"guest(pid {self.pid})"

    # ---- commands -------------------------------------------------------
    def run_bytes(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                  input: bytes | str | None = None, env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
        """Run argv in the guest: (exit code, stdout bytes, stderr bytes), exactly."""
        argv = [str(a) for a in argv]
        if not argv:
            raise BadInput("empty command for the guest")
        if env:
            for k in env:
                if not _ENV_KEY.fullmatch(k):
                    raise BadInput(f"invalid environment variable name {k!r}")
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        stdin = input.encode() if isinstance(input, str) else input
        if not self.alive():
            raise GuestGone(f"guest {self.name} is not running (QEMU pid {self.pid} is gone)"
                            + self._console_tail())
        try:
            pending = _channel(self.socket).call(shlex.join(argv), stdin, timeout)
        except TimeoutError:
            raise CommandTimeout(argv, timeout, self.name) from None
        if pending.error is not None:
            raise GuestGone(f"{pending.error} (guest {self.name})" + self._console_tail())
        return pending.rc, b"".join(pending.out), b"".join(pending.err)  # type: ignore[return-value]

    def echo(self, timeout: float = 30.0) -> float:
        """One echo through the channel (the agent answers it without running anything): seconds."""
        start = time.monotonic()
        try:
            pending = _channel(self.socket).call(None, None, timeout)
        except TimeoutError:
            self._check_agent()
            raise CommandTimeout(["(echo)"], timeout, self.name) from None
        if pending.error is not None:
            raise GuestGone(f"{pending.error} (guest {self.name})" + self._console_tail())
        return time.monotonic() - start

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
            input: str | None = None, env: dict[str, str] | None = None) -> Result:
        argv = [str(a) for a in argv]
        start = time.monotonic()
        rc, out, err = self.run_bytes(argv, timeout=timeout, input=input, env=env)
        result = Result(argv, rc, out.decode(errors="replace"), err.decode(errors="replace"),
                        time.monotonic() - start)
        if check and rc != 0:
            raise CommandFailed(argv, rc, result.stderr, self.name)
        return result

    def spawn(self, argv: Sequence[str], **popen_kwargs) -> RemoteProcess:
        """A detached process in the guest (stdin/stdout/stderr kwargs do not apply: output goes
        to files in the guest, read with `proc.stdout.read()` or `communicate()`)."""
        return RemoteProcess(self, argv, text=popen_kwargs.get("text", True))

    def interactive(self, argv: Sequence[str]) -> int:
        """Run argv and print its output (no terminal: the channel carries no tty); its exit code."""
        try:
            rc, out, err = self.run_bytes(argv, timeout=24 * 3600)
        except KeyboardInterrupt:
            return 130
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
        sys.stderr.buffer.write(err)
        sys.stderr.flush()
        return rc

    # ---- files: answered in the agent's own process (no fork in the guest) ------------------
    def _files(self, ops: Sequence[str], what: Sequence[str], timeout: float) -> list[tuple[int, bytes]]:
        """One `F` request: (errno or 0, data) per op, in order; `what` names the request in errors."""
        if not self.alive():
            raise GuestGone(f"guest {self.name} is not running (QEMU pid {self.pid} is gone)"
                            + self._console_tail())
        try:
            pending = _channel(self.socket).call(None, None, timeout, ops=ops)
        except TimeoutError:
            self._check_agent()
            raise CommandTimeout(list(what), timeout, self.name) from None
        if pending.error is not None:
            raise GuestGone(f"{pending.error} (guest {self.name})" + self._console_tail())
        if len(pending.results) != len(ops):
            raise GuestGone(f"the agent of guest {self.name} answered {len(pending.results)} of "
                            f"{len(ops)} file operations: is its offlab-agent older than this offlab?")
        return pending.results

    def _check_agent(self) -> None:
        """After a request that got no answer: a guest booted by an older offlab runs the shell agent,
        which ignores requests it does not know (F, P) instead of answering them; say so."""
        try:
            rc, _, _ = self.run_bytes(["test", "-x", "/usr/bin/offlab-agent"], timeout=10)
        except (CommandTimeout, GuestGone):
            return
        if rc != 0:
            raise EnvironmentProblem(f"guest {self.name} runs the command agent of an older offlab, which does "
                                     f"not answer file requests: take the lab down and up again (`offlab lab down`)")

    def _failed(self, argv: list[str], code: int) -> CommandFailed:
        return CommandFailed(argv, 1, f"{argv[0]}: {argv[-1]}: {os.strerror(code)}", self.name)

    def read_bytes(self, path: str | Path) -> bytes:
        [(code, data)] = self._files([f"r:{_b64(path)}"], ["cat", str(path)], 60)
        if code:
            raise self._failed(["cat", str(path)], code)
        return data

    def read(self, path: str | Path) -> str:
        return self.read_bytes(path).decode(errors="replace")

    def read_many(self, paths: Sequence[str | Path], *, timeout: float = 30) -> dict[str, str | None]:
        """Every file in one round trip, read in the given order by one guest process."""
        results = self._files([f"r:{_b64(p)}" for p in paths], ["cat", *map(str, paths)], timeout)
        return {str(p): None if code else data.decode(errors="replace") for p, (code, data) in zip(paths, results, strict=True)}

    def write(self, path: str | Path, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else bytes(text)
        [(code, _)] = self._files([f"w:{_b64(path)}:{base64.b64encode(data).decode()}"], ["write", str(path)], 30)
        if code:
            raise self._failed(["write", str(path)], code)

    def exists(self, path: str | Path) -> bool:
        [(code, _)] = self._files([f"e:{_b64(path)}"], ["test", "-e", str(path)], 30)
        return code == 0

    def qdisc_json(self, *, timeout: float = 10) -> str | None:
        """The qdiscs' counters as `tc -s -j qdisc show` prints them, from the agent's own rtnetlink
        dump (no tc forked in the guest)."""
        [(code, data)] = self._files(["q:"], TC_QDISC_SHOW, timeout)
        return None if code else data.decode(errors="replace")

    def wait_for_file(self, path: str | Path, seconds: float) -> bool:
        """Whether `path` exists within `seconds`: the agent waits on inotify (no fork, no polling)."""
        ms = max(0, int(seconds * 1000))
        [(code, _)] = self._files([f"t:{_b64(path)}:{ms}"], ["wait", str(path)], seconds + 30)
        return code == 0

    # ---- identity -------------------------------------------------------
    def ref(self) -> dict:
        return {"kind": self.kind, "name": self.name, "socket": self.socket, "pid": self.pid,
                "start_time": self.start_time, "lab": self.lab, "role": self.role, "console": self.console}

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time and os.path.exists(self.socket)

    def forget(self) -> None:
        super().forget()
        _CHANNELS.close(self.socket)

    @property
    def shares_kernel(self) -> bool:
        return False

    def _console_tail(self, lines: int = 8) -> str:
        return console_tail(self.console, lines)


def _b64(path: str | Path) -> str:
    return base64.b64encode(str(path).encode()).decode()


def console_tail(path: str | None, lines: int = 8) -> str:
    """'; console: <last lines>' of a guest's console log, or '' when there is none."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    tail = [l.strip() for l in text.replace("\r", "\n").splitlines() if l.strip()][-lines:]
    return "; console: " + " | ".join(tail) if tail else ""


def from_ref(ref: dict) -> GuestHost:
    """The guest a `ref()` names (hosts/refs.py)."""
    try:
        return GuestHost(ref["socket"], ref["pid"], ref["start_time"], lab=ref.get("lab"),
                         role=ref.get("role"), console=ref.get("console"))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"invalid guest reference {ref!r}: {exc}") from None


__all__ = ["GuestHost", "GuestGone", "console_tail", "process_start_time"]
