"""A private Open vSwitch (ovsdb-server + ovs-vswitchd) for one lab.

Both daemons run inside the lab's switch namespace with their own database,
sockets, pid and log files under the lab's run directory; the OVS_* variables
point every default path there, so a system OVS is never read or touched.
Bridges use the userspace datapath (`datapath_type=netdev`): no kernel module.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from offlab import netdev
from offlab.errors import BadInput
from offlab.hosts import NetnsHost, require_tool
from offlab.hosts.process import process_start_time, running, signal_pid, wait_gone
from offlab.lab.model import Daemon, Interface
from offlab.state import ensure_dir, state_dir

SCHEMA_CANDIDATES = ("/usr/share/openvswitch/vswitch.ovsschema", "/usr/local/share/openvswitch/vswitch.ovsschema")


class Ovs:
    def __init__(self, builder, rundir: Path) -> None:
        self.b = builder
        self.rundir = rundir
        self.host: NetnsHost = builder.lab.host("switch")

    @property
    def db(self) -> str:
        return f"unix:{self.rundir}/db.sock"

    @classmethod
    def start(cls, b, *, vswitchd: bool = True) -> "Ovs":
        """The private ovsdb-server and (unless `vswitchd` is False: ovs-dpdk starts its own) ovs-vswitchd."""
        for tool in ("ovsdb-tool", "ovsdb-server", "ovs-vsctl", *(("ovs-vswitchd",) if vswitchd else ())):
            require_tool(tool)
        schema = next((p for p in SCHEMA_CANDIDATES if os.path.exists(p)), None)
        if schema is None:
            raise BadInput("vswitch.ovsschema not found: run `apt-get install openvswitch-switch`")
        rundir = ensure_dir(state_dir() / "ovs" / b.lab.name)
        b.lab.rundir = str(rundir)
        b.lab.save()
        self = cls(b, rundir)
        with b.step("start private ovsdb-server"):
            self._ovs_env_run(["ovsdb-tool", "create", f"{rundir}/conf.db", schema])
            self._daemon("ovsdb-server", [
                f"{rundir}/conf.db", f"--remote=punix:{rundir}/db.sock",
            ])
            self.vsctl("--no-wait", "init")
        if not vswitchd:
            return self
        with b.step("start private ovs-vswitchd"):
            self._daemon("ovs-vswitchd", [self.db, "--disable-system-route"])
        return self

    def _ovs_env_run(self, argv: list[str]):
        return self.host.run(argv, env=netdev.ovs_env(self.rundir), timeout=20)

    def _daemon(self, name: str, args: list[str]) -> None:
        pidfile = self.rundir / f"{name}.pid"
        self._ovs_env_run([
            name, *args, f"--pidfile={pidfile}", f"--unixctl={self.rundir}/{name}.ctl",
            f"--log-file={self.rundir}/{name}.log", "--detach", "--no-chdir",
        ])
        pid = int(pidfile.read_text().strip())
        # with its start time, so a pid reused after a crash is never taken for it
        self.b.lab.daemons.append(Daemon(name=name, pid=pid, netns=self.host.netns,
                                         start_time=process_start_time(pid)))
        self.b.lab.save()

    def vsctl(self, *args: str, wait: int = 10) -> str:
        return netdev.vsctl(self.host, self.rundir, *args, wait=wait)

    def add_bridge(self, name: str) -> None:
        with self.b.step(f"OVS bridge {name} (datapath_type=netdev)"):
            self.vsctl("add-br", name, "--", "set", "Bridge", name, "datapath_type=netdev",
                       "fail-mode=standalone")
            self.b.lab.hosts["switch"].interfaces.append(Interface(name, "ovs-internal", role="bridge"))
            self.b.ip("switch", "link", "set", name, "up")
            self.b.lab.save()

    def add_port(self, bridge: str, port: str, *, mtu: int) -> None:
        with self.b.step(f"OVS port {port} on {bridge} (mtu_request={mtu})"):
            self.vsctl("add-port", bridge, port, "--", "set", "Interface", port, f"mtu_request={mtu}")
            self.vsctl("set", "Interface", bridge, f"mtu_request={mtu}")


def vsctl_for(lab, *args: str) -> str:
    """ovs-vsctl against a running lab's private database."""
    return netdev.vsctl(lab.host("switch"), lab.rundir, *args)


def alive(pid: int) -> bool:
    """True while pid runs (hosts.process.running: a zombie whose threads still run counts)."""
    return running(pid)


def stop_daemon(d: Daemon, timeout: float = 5.0, *, netns_inode: int | None = None) -> None:
    """Stop one daemon by pid, but only if that pid is still the daemon we started (and, given
    `netns_inode`, still runs in the lab's own namespace: its owner mark, see lab/owner.py)."""
    try:
        comm = Path(f"/proc/{d.pid}/comm").read_text().strip()
    except OSError:
        return
    if comm != d.name[:15]:
        return  # the pid was reused by something that is not ours
    if d.start_time is not None and process_start_time(d.pid) != d.start_time:
        return
    if netns_inode is not None:
        try:
            if os.stat(f"/proc/{d.pid}/ns/net").st_ino != netns_inode:
                return  # same name, another namespace: not the daemon of this lab
        except OSError:
            # Its name and start time are ours but its namespace is unreadable: it is exiting (a zombie
            # leader whose threads, testpmd's, still hold its ports and memory). Wait for them to go:
            # the caller removes what they hold next.
            wait_gone(d.pid, timeout * 2)
            return
    if not signal_pid(d.pid, signal.SIGTERM):
        return
    if not wait_gone(d.pid, timeout):
        # and wait again: under load a killed daemon's threads (testpmd's, holding its ports and
        # memory) take a moment to go, and the caller removes what they hold next
        signal_pid(d.pid, signal.SIGKILL)
        wait_gone(d.pid, timeout)
