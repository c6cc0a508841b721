"""The one interface every place a command can run offers, and its result.

A `Host` runs argv lists (never a shell string) with a timeout, starts long-lived
processes, reads and writes files, and can be named by a JSON `ref()` from which
another process (a restore after kill -9) gets the same host back with `from_ref`.
Subclasses only say how: a namespace wraps the argv, a guest or an SSH machine
carries it over a channel. Nothing above `hosts` asks which kind it is.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, Sequence

from offlab.errors import CommandFailed, CommandTimeout, ToolMissing
from offlab.hosts.memo import Memo, drop, memo_of

DEFAULT_TIMEOUT = 30.0
TC_QDISC_SHOW = ["tc", "-s", "-j", "qdisc", "show"]

# Debian package that provides each tool offlab calls, for the "how to fix" line.
TOOL_PACKAGES = {
    "ip": "iproute2",
    "nft": "nftables",
    "tc": "iproute2",
    "ss": "iproute2",
    "nstat": "iproute2",
    "ethtool": "ethtool",
    "iperf3": "iperf3",
    "tcpdump": "tcpdump",
    "ovs-vswitchd": "openvswitch-switch",
    "ovsdb-server": "openvswitch-switch",
    "ovs-vsctl": "openvswitch-switch",
    "ovsdb-tool": "openvswitch-switch",
    "ovs-appctl": "openvswitch-switch",
    "ovs-vswitchd-dpdk": "openvswitch-switch-dpdk",
    "ping": "iputils-ping",
    "sysctl": "procps",
    "taskset": "util-linux",
    "ssh": "openssh-client",
    "sshd": "openssh-server",
    "qemu-system-x86_64": "qemu-system-x86",
    "dpdk-testpmd": "dpdk-dev",
    "sockperf": "sockperf",
}

_SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"]
)


def which(tool: str) -> str | None:
    """Full path of `tool`, looking in the sbin directories too."""
    return shutil.which(tool, path=_SEARCH_PATH)


def require_tool(tool: str) -> str:
    """Full path of `tool`, or ToolMissing naming the Debian package to install."""
    path = which(tool)
    if path is None:
        raise ToolMissing(tool, TOOL_PACKAGES.get(tool))
    return path


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True)
class Result:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


class Process(Protocol):
    """What `Host.spawn` returns: the subset of `subprocess.Popen` offlab uses.

    A local or namespace process is a real Popen; a process in a guest or on an SSH
    host is a `hosts.process.RemoteProcess` that offers the same verbs.
    """

    pid: int
    returncode: int | None

    # read-only here: a Popen's are IO objects or None, a RemoteProcess's its own stream readers
    @property
    def stdout(self) -> Any: ...
    @property
    def stderr(self) -> Any: ...

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple: ...


class NetReader(Protocol):
    """Reads a host's per-network-namespace /proc/net files (dev, snmp, snmp6, softnet_stat)."""

    def read(self, name: str) -> str: ...
    def close(self) -> None: ...


class _ReadThrough:
    """The plain NetReader: each read goes through the host (one command per file)."""

    def __init__(self, host: "Host") -> None:
        self.host = host

    def read(self, name: str) -> str:
        return self.host.read(f"/proc/net/{name}")

    def close(self) -> None:
        pass


class Host:
    """A place where commands run."""

    kind: ClassVar[str] = "local"
    name = "local"

    # ---- commands -------------------------------------------------------
    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The local argv that runs `argv` here (namespaces); channel hosts override `run`."""
        return list(argv)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Result:
        """Run argv to completion; raise CommandFailed on a non-zero exit when `check`."""
        argv = [str(a) for a in argv]
        full = self.wrap(argv)
        exe = which(full[0])
        if exe is None:
            raise ToolMissing(full[0], TOOL_PACKAGES.get(full[0]))
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [exe, *full[1:]],
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                errors="replace",
                env={**os.environ, **env} if env else None,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(argv, timeout, self.name) from exc
        result = Result(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)
        if check and proc.returncode != 0:
            raise CommandFailed(argv, proc.returncode, proc.stderr, self.name)
        return result

    def stream(self, argv: Sequence[str], *, lifetime: float = 600.0) -> "subprocess.Popen | None":
        """A process with stdin/stdout piped here that answers lines quickly, where this kind of host
        offers one (an SSH host does; a namespace needs none, a guest's channel has none): None."""
        return None

    def spawn(self, argv: Sequence[str], **popen_kwargs) -> Process:
        """Start a long-running process here (a server, a probe); the caller owns it."""
        full = self.wrap([str(a) for a in argv])
        exe = which(full[0])
        if exe is None:
            raise ToolMissing(full[0], TOOL_PACKAGES.get(full[0]))
        return subprocess.Popen([exe, *full[1:]], **popen_kwargs)

    def interactive(self, argv: Sequence[str]) -> int:
        """Run argv with the user's terminal attached (`lab exec`); its exit code."""
        full = self.wrap([str(a) for a in argv])
        exe = which(full[0])
        if exe is None:
            raise ToolMissing(full[0], TOOL_PACKAGES.get(full[0]))
        try:
            return subprocess.call([exe, *full[1:]])
        except KeyboardInterrupt:
            return 130

    # ---- files ----------------------------------------------------------
    def read(self, path: str | Path) -> str:
        return Path(path).read_text()

    def write(self, path: str | Path, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def exists(self, path: str | Path) -> bool:
        return Path(path).exists()

    def read_many(self, paths: Sequence[str | Path], *, timeout: float = 30) -> dict[str, str | None]:
        """path → its text, None for one that cannot be read; read in the given order. A channel
        host (a guest) reads them all in one round trip; here, one `read` each."""
        out: dict[str, str | None] = {}
        for p in paths:
            try:
                out[str(p)] = self.read(p)
            except (OSError, CommandFailed):
                out[str(p)] = None
        return out

    def qdisc_json(self, *, timeout: float = 10) -> str | None:
        """`tc -s -j qdisc show`'s JSON here, None where tc cannot say (a guest's agent asks
        rtnetlink itself, without forking tc)."""
        res = self.run(TC_QDISC_SHOW, check=False, timeout=timeout)
        return res.stdout if res.ok else None

    def wait_for_file(self, path: str | Path, seconds: float) -> bool:
        """Whether `path` exists within `seconds` (looks every 0.2 s in one command; a guest's agent
        looks itself, without forking). The look stops when the file's directory is gone (a host's
        restore.sh removed a process's directory after a crash): nothing will appear there."""
        looks = max(0, math.ceil(seconds / 0.2))
        # a dot at each look: once no one reads it (the client was dropped: `look`), the write ends the loop
        script = ('n=$2; while [ ! -e "$1" ] && [ -d "${1%/*}" ] && [ "$n" -gt 0 ]; do printf .; sleep 0.2; '
                  'n=$((n - 1)); done; [ -e "$1" ]')
        return self.look(["sh", "-c", script, "sh", str(path), str(looks)], timeout=seconds + 15).rc == 0

    def look(self, argv: Sequence[str], *, timeout: float) -> Result:
        """`run(argv, check=False)` for a command that only looks (changes nothing): a host reached over
        a channel drops it at once when a signal interrupts it, where a command that changes something
        is let finish first (hosts/ssh.py)."""
        return self.run(argv, check=False, timeout=timeout)

    def net_reader(self) -> NetReader:
        """A reader of this host's /proc/net files, fast enough to bracket a traffic window."""
        return _ReadThrough(self)

    # ---- identity -------------------------------------------------------
    def ref(self) -> dict:
        """A JSON reference from which `from_ref` rebuilds this host in another process."""
        return {"kind": self.kind}

    def alive(self) -> bool:
        """Whether the host is still there (a namespace not deleted, a guest still running)."""
        return True

    @property
    def key(self) -> str:
        """A stable identity string for caches and journals: equal for equal hosts, in any process."""
        return repr(sorted(self.ref().items()))

    @property
    def memo(self) -> Memo:
        """What this process learned about this host while it lives (hosts/memo.py); ends with `forget`."""
        return memo_of(self.key)

    def forget(self) -> None:
        """Drop what this process keeps for this host (a guest also closes its channel): called when
        the host's lab is removed."""
        drop(self.key)

    @property
    def netns_name(self) -> str | None:
        """The network namespace of this machine the host is, if it is one."""
        return None

    @property
    def is_this_machine(self) -> bool:
        """This machine itself, in offlab's own network namespace (where host-wide settings live)."""
        return False

    def signal(self, pid: int, sig: int) -> bool:
        """Send `sig` to one of this host's processes (a pid offlab started there); False if it is gone."""
        res = self.run(["kill", f"-{int(sig)}", str(int(pid))], check=False, timeout=10)
        return res.ok

    @property
    def settings_die_with_host(self) -> bool:
        """True when a host that is gone took its settings with it (a namespace deleted, a guest
        stopped), so a journal entry for it may be dropped; an SSH machine that does not answer
        still has its settings, and its entries must wait for it."""
        return True

    @property
    def shares_kernel(self) -> bool:
        """True when the host runs on this machine's kernel (so /proc/stat and pids are ours)."""
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Host) and self.ref() == other.ref()

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
