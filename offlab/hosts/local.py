"""This machine and its network namespaces."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Sequence

from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts.base import Host
from offlab.hosts.process import signal_pid

NETNS_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
NETNS_DIR = "/run/netns"


def check_netns(name: object) -> str:
    if not isinstance(name, str) or not NETNS_RE.fullmatch(name):
        raise BadInput(f"invalid network namespace name {name!r}")
    return name


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, check_netns(name)))


class LocalHost(Host):
    """This machine, in offlab's own network namespace."""

    kind = "local"
    name = "local"

    @property
    def is_this_machine(self) -> bool:
        return True

    def signal(self, pid: int, sig: int) -> bool:
        return signal_pid(pid, sig)


class NetnsHost(Host):
    """A named network namespace on this machine (`ip netns exec`).

    `ip netns exec` also remounts /sys, so /sys/class/net shows the namespace's own
    interfaces; files are read and written through `cat` / `tee` in the namespace for
    the same reason (/proc/sys/net and /proc/net are per network namespace).
    """

    kind = "netns"

    def __init__(self, netns: str) -> None:
        self.netns = check_netns(netns)
        self.name = netns

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def read(self, path: str | Path) -> str:
        return self.run(["cat", str(path)], timeout=10).stdout

    def write(self, path: str | Path, text: str) -> None:
        self.run(["tee", str(path)], input=text, timeout=10)

    def exists(self, path: str | Path) -> bool:
        return self.run(["test", "-e", str(path)], check=False, timeout=10).rc == 0

    def net_reader(self) -> "_AnchorReader":
        return _AnchorReader(self)

    def ref(self) -> dict:
        return {"kind": self.kind, "netns": self.netns}

    def alive(self) -> bool:
        return netns_exists(self.netns)

    @property
    def netns_name(self) -> str | None:
        return self.netns

    def signal(self, pid: int, sig: int) -> bool:
        return signal_pid(pid, sig)  # pids are this machine's, whatever the namespace


class _AnchorReader:
    """An idle process inside the namespace, so /proc/PID/net/* is read from here without
    spawning `ip netns exec` at the edges of a traffic window (keeps snapshots close to the
    instants they claim)."""

    def __init__(self, host: NetnsHost, lifetime: float = 600.0, enter_timeout: float = 10.0) -> None:
        self.proc = host.spawn(["sleep", str(int(lifetime))], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        self._wait_inside(host, enter_timeout)

    def _wait_inside(self, host: NetnsHost, timeout: float) -> None:
        """Until `ip netns exec` has entered the namespace, /proc/PID/net is this machine's root
        namespace: a first snapshot read then (a loaded machine makes that likely) would take every
        other lab's traffic for this host's."""
        want = os.stat(os.path.join(NETNS_DIR, host.netns)).st_ino
        deadline = time.monotonic() + timeout
        while True:
            try:
                if os.stat(f"/proc/{self.proc.pid}/ns/net").st_ino == want:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise EnvironmentProblem(f"could not read counters in namespace {host.netns}: a process "
                                         f"started there was not inside it within {timeout:g} s")
            time.sleep(0.002)

    def read(self, name: str) -> str:
        with open(f"/proc/{self.proc.pid}/net/{name}") as f:
            return f.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


LOCAL = LocalHost()


def from_ref(ref: dict) -> Host:
    """This machine, or one of its namespaces, as a `ref()` names it (hosts/refs.py)."""
    if ref["kind"] == "local":
        return LOCAL
    return NetnsHost(str(ref.get("netns") or ""))  # "" is refused by check_netns
