"""A private sshd in a test namespace, standing in for a remote machine.

Two namespaces joined by a veth pair: `client` (where the ssh client runs, `via_netns`) and
`server` (where sshd listens, only on its veth address). Host and user keys are made at test
time in the test's temp dir; sshd is started with the server namespace's `spawn` and stopped
by pid. `stop()` leaves nothing: no sshd, no ssh master, no namespace.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from offlab.hosts import LOCAL, NetnsHost, netns_exists
from offlab.hosts.ssh import SshHost, close_all

SSHD = "/usr/sbin/sshd"
PORT = 2222


@dataclass
class Sshd:
    dir: Path
    client_ns: str
    server_ns: str
    client_ip: str
    server_ip: str
    port: int = PORT
    proc: subprocess.Popen | None = None

    @property
    def test_client_ip(self) -> str:
        return self.client_ip.rsplit(".", 2)[0] + f".{int(self.client_ip.split('.')[2]) + 1}.1"

    @property
    def test_server_ip(self) -> str:
        return self.test_client_ip[:-1] + "2"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def user_key(self) -> Path:
        return self.dir / "userkey"

    def ssh_args(self) -> list[str]:
        return ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes"]

    def host(self, **kw) -> SshHost:
        """The remote machine as offlab sees it: root@server_ip:port, reached from the client namespace."""
        args = dict(user="root", port=self.port, identity=str(self.user_key), ssh_args=self.ssh_args(),
                    config="/dev/null", via_netns=self.client_ns, connect_timeout=5)
        args.update(kw)
        return SshHost(self.server_ip, **args)

    def sshd_pids(self) -> set[int]:
        """Every sshd in the server namespace: the listener and one per connection."""
        out = LOCAL.run(["ip", "netns", "pids", self.server_ns], check=False).stdout
        pids = set()
        for pid in out.split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    pids.add(int(pid))
            except OSError:
                pass
        return pids


def _veth(a_ns: str, a: str, a_ip: str, b_ns: str, b: str, b_ip: str) -> None:
    # Created inside the namespaces, so nothing ever appears in the root namespace.
    NetnsHost(a_ns).run(["ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns])
    for ns, dev, ip in ((a_ns, a, a_ip), (b_ns, b, b_ip)):
        host = NetnsHost(ns)
        host.run(["ip", "addr", "add", f"{ip}/24", "dev", dev])
        host.run(["ip", "link", "set", dev, "up"])
        host.run(["ip", "link", "set", "lo", "up"])


def start(tmp: Path, prefix: str, subnet: int = 222) -> Sshd:
    """Namespaces `<prefix>-c` / `<prefix>-s`; veth pairs sshc0/sshs0 (10.200.<subnet>.1/.2, ssh) and
    sshc1/sshs1 (10.200.<subnet+1>.1/.2, test traffic); keys; sshd on :2222."""
    d = tmp / "sshd"
    d.mkdir(mode=0o700)
    s = Sshd(d, f"{prefix}-c", f"{prefix}-s", f"10.200.{subnet}.1", f"10.200.{subnet}.2")
    LOCAL.run(["ip", "netns", "add", s.client_ns])
    try:
        LOCAL.run(["ip", "netns", "add", s.server_ns])
        _veth(s.client_ns, "sshc0", s.client_ip, s.server_ns, "sshs0", s.server_ip)
        # A second pair for test traffic, apart from the management (ssh) link.
        _veth(s.client_ns, "sshc1", s.test_client_ip, s.server_ns, "sshs1", s.test_server_ip)
        for key in ("hostkey", "userkey"):
            LOCAL.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"offlab-test-{key}", "-f", str(d / key)])
        (d / "authorized_keys").write_text((d / "userkey.pub").read_text())
        os.chmod(d / "authorized_keys", 0o600)
        host_pub = (d / "hostkey.pub").read_text().split()
        s.known_hosts.write_text(f"[{s.server_ip}]:{s.port} {host_pub[0]} {host_pub[1]}\n")
        conf = d / "sshd_config"
        conf.write_text("\n".join([
            f"ListenAddress {s.server_ip}",
            f"Port {s.port}",
            f"HostKey {d / 'hostkey'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}",
            f"PidFile {d / 'sshd.pid'}",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",  # the keys live under /tmp (mode 1777)
        ]) + "\n")
        # sshd's privilege separation directory; made if absent, never removed (the system's own).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = open(d / "sshd.log", "w")
        s.proc = NetnsHost(s.server_ns).spawn([SSHD, "-D", "-e", "-f", str(conf)], stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 10
        while "Server listening" not in (d / "sshd.log").read_text():
            if s.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
            time.sleep(0.02)
    except BaseException:
        stop(s)
        raise
    return s


def stop(s: Sshd) -> list[str]:
    """Close our masters, stop sshd and its session processes by pid, delete the namespaces.

    Returns what had to be killed beyond the listener (should be empty: the masters closed cleanly).
    """
    close_all()
    if s.proc is not None and s.proc.poll() is None:
        s.proc.terminate()
        try:
            s.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(timeout=5)
    leftovers = []
    deadline = time.monotonic() + 3
    while netns_exists(s.server_ns) and (pids := s.sshd_pids()):
        if time.monotonic() > deadline:
            for pid in pids:
                leftovers.append(f"sshd pid {pid}")
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.05)
    for ns in (s.client_ns, s.server_ns):
        if netns_exists(ns):
            LOCAL.run(["ip", "netns", "del", ns], check=False)
    return leftovers


def mux_processes(s: Sshd) -> list[str]:
    """Live ssh ControlMaster processes of this sshd's clients (any process's), found by the key
    paths in their command line, so a test run in parallel elsewhere is never counted."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [l.strip() for l in out.splitlines()
            if ("[mux]" in l or "ControlMaster=yes" in l) and f"{s.dir}/" in l]
