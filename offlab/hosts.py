"""Where commands run: this machine or a network namespace.

Every system command offlab runs goes through a `Host`: argv lists only (never a
shell), a timeout on every call, and errors that carry the argv and stderr.
`NetnsHost` runs commands with `ip netns exec NS ...`, which also remounts /sys
so that /sys/class/net shows the namespace's own interfaces; files are read and
written through `cat` / `tee` in the namespace for the same reason (/proc/sys/net
and /proc/net are per network namespace).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from offlab.errors import CommandFailed, CommandTimeout, ToolMissing

DEFAULT_TIMEOUT = 30.0

# Debian package that provides each tool offlab calls, for the "how to fix" line.
TOOL_PACKAGES = {
    "ip": "iproute2",
    "tc": "iproute2",
    "ethtool": "ethtool",
    "iperf3": "iperf3",
    "tcpdump": "tcpdump",
    "ovs-vswitchd": "openvswitch-switch",
    "ovsdb-server": "openvswitch-switch",
    "ovs-vsctl": "openvswitch-switch",
    "ovsdb-tool": "openvswitch-switch",
    "ovs-appctl": "openvswitch-switch",
    "ping": "iputils-ping",
    "sysctl": "procps",
    "taskset": "util-linux",
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


class Host:
    """A place where commands run. Subclasses only say how to wrap an argv."""

    name = "local"

    def wrap(self, argv: Sequence[str]) -> list[str]:
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

    def spawn(self, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """Start a long-running process here (a server, a probe); the caller owns its pid."""
        full = self.wrap([str(a) for a in argv])
        exe = which(full[0])
        if exe is None:
            raise ToolMissing(full[0], TOOL_PACKAGES.get(full[0]))
        return subprocess.Popen([exe, *full[1:]], **popen_kwargs)

    def read(self, path: str | Path) -> str:
        return Path(path).read_text()

    def write(self, path: str | Path, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def exists(self, path: str | Path) -> bool:
        return Path(path).exists()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class LocalHost(Host):
    """This machine, in offlab's own network namespace."""

    name = "local"


class NetnsHost(Host):
    """A named network namespace on this machine (`ip netns exec`)."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.name = netns

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def read(self, path: str | Path) -> str:
        return self.run(["cat", str(path)], timeout=10).stdout

    def write(self, path: str | Path, text: str) -> None:
        self.run(["tee", str(path)], input=text, timeout=10)

    def exists(self, path: str | Path) -> bool:
        return self.run(["test", "-e", str(path)], check=False, timeout=10).rc == 0


LOCAL = LocalHost()
