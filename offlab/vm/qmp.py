"""QEMU's monitor (QMP) on a guest's unix socket: what a running device really is.

One short connection per question: greeting, `qmp_capabilities`, the commands, close. Events
that arrive in between are skipped. Used to read a NIC's effective properties (`qom-get`, its
defaults included) and the virtio feature bits offered and accepted (`x-query-virtio-status`).
"""

from __future__ import annotations

import json
import socket
import time

from offlab.errors import EnvironmentProblem

TIMEOUT_S = 5.0


class QmpError(EnvironmentProblem):
    """QEMU answered a command with an error, or could not be reached on its monitor socket."""


class QmpRefused(QmpError):
    """Nothing listens on the monitor's socket (yet): QEMU makes the socket file at bind(), a moment
    before listen(), and a connect in between is refused; or QEMU is gone."""


class Qmp:
    """A QMP session: `with Qmp(path) as q: q.execute("query-status")` (or `open()` … `close()`)."""

    def __init__(self, path: str, timeout: float = TIMEOUT_S) -> None:
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""

    def __enter__(self) -> "Qmp":
        return self.open()

    def open(self) -> "Qmp":
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(self.timeout)
            self._sock.connect(self.path)
        except OSError as exc:
            self.close()
            kind = QmpRefused if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)) else QmpError
            raise kind(f"QEMU's monitor {self.path} does not answer ({exc.strerror or exc}): is the guest "
                       f"running? (`offlab lab list`)") from None
        greeting = self._message()
        if "QMP" not in greeting:
            raise QmpError(f"{self.path} is not a QMP monitor (it said {str(greeting)[:80]})")
        self.execute("qmp_capabilities")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def execute(self, command: str, **arguments) -> object:
        """The `return` of one command; QmpError naming the command and QEMU's error text."""
        assert self._sock is not None, "use `with Qmp(path) as q:`"
        msg = {"execute": command, **({"arguments": arguments} if arguments else {})}
        try:
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as exc:
            raise QmpError(f"QMP {command} on {self.path}: {exc.strerror or exc}") from None
        while True:
            reply = self._message()
            if "event" in reply:
                continue
            if "error" in reply:
                err = reply["error"]
                raise QmpError(f"QMP {command} {arguments or ''}: {err.get('class')}: {err.get('desc')}")
            if "return" in reply:
                return reply["return"]

    def _message(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            if time.monotonic() > deadline:
                raise QmpError(f"QEMU's monitor {self.path} did not answer within {self.timeout:g} s")
            try:
                chunk = self._sock.recv(65536) if self._sock else b""
            except OSError as exc:
                raise QmpError(f"QEMU's monitor {self.path}: {exc.strerror or exc}") from None
            if not chunk:
                raise QmpError(f"QEMU's monitor {self.path} closed the connection (QEMU exited?)")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise QmpError(f"QEMU's monitor {self.path} sent something that is not JSON: {line[:80]!r}") from None
