"""A private sshd in a test namespace, standing in for a remote machine.

Two namespaces joined by a veth pair: `client` (where the ssh client runs, `via_netns`) and
`server` (where sshd listens, only on its veth address). Host and user keys are made at test
time in the test's temp dir; sshd is started with the server namespace's `spawn` and stopped
by pid. `stop()` leaves nothing: no sshd, no ssh master, no namespace.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from offlab.hosts import LOCAL, NetnsHost, netns_exists
from offlab.hosts.ssh import SshHost, close_all

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # openssh-server's, where Debian's sshd_config names it
PORT = 2222
# What a login user's shell reads before a command that came over ssh (Debian's bash sources ~/.bashrc
# for one). Root's on this machine loads pyenv: a quarter of a second a command, several times that
# under load, and no machine a test stands in for would have it. Each stand-in reads these as empty
# files (`_without_startup_files`); this machine's own are never touched.
STARTUP_FILES = (".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshenv")


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
        return sshd_pids(self.server_ns)


def _table(ns: str) -> dict[int, tuple[int, str, str]]:
    """pid → (parent pid, program name, state) of every process in namespace `ns`, one read of each's stat."""
    out = {}
    for pid in LOCAL.run(["ip", "netns", "pids", ns], check=False).stdout.split():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            out[int(pid)] = (int(ppid), stat[stat.index("(") + 1:stat.rindex(")")], state)
        except (OSError, IndexError, ValueError):
            pass
    return out


def sshd_pids(ns: str) -> set[int]:
    """Every sshd in namespace `ns`: the listener and one per connection."""
    return {pid for pid, (_, comm, _) in _table(ns).items() if comm == "sshd"}


def processes_in(ns: str) -> dict[int, str]:
    """pid → command line of every live process in namespace `ns` but its sshd (listener and sessions);
    a zombie is not counted (this machine's PID 1 reaps orphans about a second late)."""
    out = {}
    for pid, (_, _, state) in _table(ns).items():
        if state == "Z":
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if cmd and not cmd.startswith(("sshd", "/usr/sbin/sshd")):
            out[pid] = cmd
    return out


@contextlib.contextmanager
def frozen(ns: str):
    """Every process in namespace `ns` stopped (SIGSTOP) while the block runs and resumed after, so
    nothing there acts meanwhile: a test reads a machine's state and acts on it as one step."""
    stopped: list[int] = []
    # Until no new one appears: a process forked while the list was being stopped is stopped too.
    while new := [int(p) for p in LOCAL.run(["ip", "netns", "pids", ns], check=False).stdout.split()
                  if int(p) not in stopped]:
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped += new
    try:
        yield
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _veth(a_ns: str, a: str, a_ip: str, b_ns: str, b: str, b_ip: str) -> None:
    # Created inside the namespaces, so nothing ever appears in the root namespace.
    NetnsHost(a_ns).run(["ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns])
    for ns, dev, ip in ((a_ns, a, a_ip), (b_ns, b, b_ip)):
        host = NetnsHost(ns)
        host.run(["ip", "addr", "add", f"{ip}/24", "dev", dev])
        host.run(["ip", "link", "set", dev, "up"])
        host.run(["ip", "link", "set", "lo", "up"])


def start(tmp: Path, prefix: str, subnet: int = 222, *, startup_files: bool = False) -> Sshd:
    """Namespaces `<prefix>-c` / `<prefix>-s`; veth pairs sshc0/sshs0 (10.200.<subnet>.1/.2, ssh) and
    sshc1/sshs1 (10.200.<subnet+1>.1/.2, test traffic); keys; sshd on :2222 (its sessions reading root's
    shell start-up files only with `startup_files`)."""
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
        conf = _sshd_config(d / "sshd_config", s.server_ip, s.port, d / "hostkey", d / "authorized_keys", d / "sshd.pid")
        # sshd's privilege separation directory; made if absent, never removed (the system's own).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        s.proc = _start_sshd(s.server_ns, conf, d / "sshd.log", startup_files=startup_files)
    except BaseException:
        stop(s)
        raise
    return s


def _sshd_config(path: Path, listen: str, port: int, host_key: Path, authorized_keys: Path, pid_file: Path, *,
                 client_alive: bool = False) -> Path:
    """One stand-in machine's sshd_config: root by key only, on `listen`:`port`; with `client_alive`, a
    session whose client vanished (a test cuts a machine off) ends within ~6 s."""
    lines = [f"ListenAddress {listen}", f"Port {port}", f"HostKey {host_key}", f"AuthorizedKeysFile {authorized_keys}",
             f"PidFile {pid_file}", "PermitRootLogin prohibit-password", "UsePAM no",
             "StrictModes no",  # the keys live under /tmp (mode 1777)
             "PermitUserRC no",  # ~/.ssh/rc: a start-up file of this machine's user, not the stand-in's
             # As Debian's own sshd_config: without an sftp subsystem, each file Ansible copies or fetches
             # tries sftp, then scp (sftp too, since OpenSSH 9), both failing, before its piped fallback.
             f"Subsystem sftp {SFTP_SERVER}"]
    if client_alive:
        lines += ["ClientAliveInterval 2", "ClientAliveCountMax 3"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _start_sshd(ns: str, conf: Path, log_path: Path, *, startup_files: bool = False) -> subprocess.Popen:
    """sshd in `ns` with the namespace's spawn (stopped later by pid), once it says it listens; its sessions
    read the login user's shell start-up files only with `startup_files` (benchmarks/ssh_per_command)."""
    argv = [SSHD, "-D", "-e", "-f", str(conf)]
    if not startup_files:
        argv = _without_startup_files(conf.parent, argv)
    with open(log_path, "w") as log:
        proc = NetnsHost(ns).spawn(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while "Server listening" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
            raise RuntimeError(f"sshd did not start: {log_path.read_text()}")
        time.sleep(0.02)
    return proc


# Run by unshare in a mount namespace of its own: the empty file ($1) bound over each start-up file up
# to `--`, then the command after it, exec'd (the pid spawn returns stays sshd's).
_BIND_EMPTY = 'e=$1; shift; while [ "$1" != -- ]; do mount --bind "$e" "$1" || exit 1; shift; done; shift; exec "$@"'


def _without_startup_files(d: Path, argv: list[str]) -> list[str]:
    """`argv` in its own mount namespace (a slave: this machine's mounts still reach it, its own never
    leave it) where root's shell start-up files read empty."""
    empty = d / "empty-startup-file"
    empty.touch(mode=0o444)
    home = Path(pwd.getpwuid(0).pw_dir)
    files = [str(home / n) for n in STARTUP_FILES if (home / n).is_file()]
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", _BIND_EMPTY, "sh", str(empty), *files, "--",
            *argv]


def stop(s: Sshd) -> list[str]:
    """Close our masters, stop sshd and its session processes by pid, delete the namespaces.

    Returns what had to be killed beyond the listener (should be empty: the masters closed cleanly).
    """
    close_all()
    leftovers = _end_sshd(s.proc, s.server_ns)
    for ns in (s.client_ns, s.server_ns):
        if netns_exists(ns):
            LOCAL.run(["ip", "netns", "del", ns], check=False)
    return leftovers


def _end_sshd(proc: subprocess.Popen | None, ns: str, grace: float = 3) -> list[str]:
    """Stop the listener by pid, wait `grace` s for its sessions to end; kill (and name) those that do not."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    leftovers = []
    deadline = time.monotonic() + grace
    while netns_exists(ns) and (pids := sshd_pids(ns)):
        if time.monotonic() >= deadline:
            for pid in pids:
                leftovers.append(f"sshd pid {pid}")
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.05)
    return leftovers


def mux_processes(s: Sshd) -> list[str]:
    """Live ssh ControlMaster processes of this sshd's clients (any process's), found by the key
    paths in their command line, so a test run in parallel elsewhere is never counted."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [l.strip() for l in out.splitlines()
            if ("[mux]" in l or "ControlMaster=yes" in l) and f"{s.dir}/" in l]


@dataclass
class Machine:
    """One stand-in remote machine of a pair: a namespace with its own sshd on its management address."""

    ns: str
    ssh_ip: str
    proc: subprocess.Popen | None = None


@dataclass
class SshdPair:
    """Two stand-in machines `a` and `b` reached from a controller namespace `c`, and test links between them.

    c:mgta ─ a:mgmt (10.200.S.1/.2) and c:mgtb ─ b:mgmt (10.200.S+1.1/.2) carry ssh only; a:tN ─ b:tN
    (10.200.S+1+N.1/.2, N = 1..links) are the test links, like NIC ports cabled to each other.
    Each machine keeps offlab's remote files in its own directory (`remote_dir`): the two "machines"
    share this machine's filesystem, a real pair would not.
    """

    dir: Path
    controller: str
    a: Machine
    b: Machine
    subnet: int
    links: int
    port: int = PORT

    @property
    def machines(self) -> dict[str, Machine]:
        return {"a": self.a, "b": self.b}

    def test_ip(self, side: str, n: int) -> str:
        return f"10.200.{self.subnet + 1 + n}.{1 if side == 'a' else 2}"

    def remote_dir(self, side: str) -> str:
        return str(self.dir / f"remote-{side}")

    def inventory(self, **host_extra) -> dict:
        """An offlab inventory of both machines, every test link declared and paired a:tN,b:tN."""
        hosts = {}
        for side, m in (("a", self.a), ("b", self.b)):
            hosts[side] = {"ssh": m.ssh_ip, "user": "root", "port": self.port, "identity_file": str(self.dir / "userkey"),
                           "ssh_args": ["-o", f"UserKnownHostsFile={self.dir / 'known_hosts'}",
                                        "-o", "StrictHostKeyChecking=yes"],
                           "ssh_config": "/dev/null", "via_netns": self.controller, "connect_timeout": 5,
                           "remote_dir": self.remote_dir(side),
                           "interfaces": [{"name": f"t{n}", "addresses": [f"{self.test_ip(side, n)}/24"]}
                                          for n in range(1, self.links + 1)]}
            hosts[side].update(host_extra.get(side, {}))
        return {"hosts": hosts, "pairs": [f"a:t{n},b:t{n}" for n in range(1, self.links + 1)]}


def ansible_inventory(p: "SshdPair") -> str:
    """The same two machines as an Ansible inventory (YAML), as a team keeps it for its playbooks,
    offlab's own settings as offlab_* host vars."""
    lines = ["all:", "  vars:", "    ansible_user: root", f"    ansible_port: {p.port}",
             f"    ansible_ssh_private_key_file: {p.dir / 'userkey'}",
             f"    ansible_ssh_common_args: \"-o UserKnownHostsFile={p.dir / 'known_hosts'} -o StrictHostKeyChecking=yes\"",
             "    offlab_ssh_config: /dev/null", f"    offlab_via_netns: {p.controller}", "    offlab_connect_timeout: 5",
             "  children:", "    pairs:", "      hosts:"]
    for side, m in (("a", p.a), ("b", p.b)):
        lines += [f"        {side}:", f"          ansible_host: {m.ssh_ip}", f"          offlab_remote_dir: {p.remote_dir(side)}",
                  "          offlab_interfaces:"]
        lines += [f"            - {{name: t{n}, addresses: [{p.test_ip(side, n)}/24]}}" for n in range(1, p.links + 1)]
    return "\n".join(lines) + "\n"


def start_pair(tmp: Path, prefix: str, subnet: int = 230, links: int = 1) -> SshdPair:
    """Namespaces `<prefix>-c`, `-a`, `-b`; an sshd in `a` and in `b` (one key pair for both); `links` test links."""
    d = tmp / "sshd-pair"
    d.mkdir(mode=0o700)
    p = SshdPair(d, f"{prefix}-c", Machine(f"{prefix}-a", f"10.200.{subnet}.2"),
                 Machine(f"{prefix}-b", f"10.200.{subnet + 1}.2"), subnet, links)
    made: list[str] = []
    try:
        for ns in (p.controller, p.a.ns, p.b.ns):
            LOCAL.run(["ip", "netns", "add", ns])
            made.append(ns)
        _veth(p.controller, "mgta", f"10.200.{subnet}.1", p.a.ns, "mgmt", p.a.ssh_ip)
        _veth(p.controller, "mgtb", f"10.200.{subnet + 1}.1", p.b.ns, "mgmt", p.b.ssh_ip)
        for n in range(1, links + 1):
            _veth(p.a.ns, f"t{n}", p.test_ip("a", n), p.b.ns, f"t{n}", p.test_ip("b", n))
        for key in ("hostkey", "userkey"):
            LOCAL.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"offlab-test-{key}", "-f", str(d / key)])
        (d / "authorized_keys").write_text((d / "userkey.pub").read_text())
        os.chmod(d / "authorized_keys", 0o600)
        host_pub = (d / "hostkey.pub").read_text().split()
        (d / "known_hosts").write_text("".join(f"[{m.ssh_ip}]:{p.port} {host_pub[0]} {host_pub[1]}\n"
                                               for m in (p.a, p.b)))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        for side, m in (("a", p.a), ("b", p.b)):
            conf = _sshd_config(d / f"sshd_config-{side}", m.ssh_ip, p.port, d / "hostkey", d / "authorized_keys",
                                d / f"sshd-{side}.pid")
            m.proc = _start_sshd(m.ns, conf, d / f"sshd-{side}.log")
    except BaseException:
        stop_machines(p)
        raise
    return p


@dataclass
class Fleet:
    """`pairs` pairs of stand-in machines (a1 b1, a2 b2, ...) behind one controller namespace `c`, as a team's
    rack behind its Ansible controller: each machine a namespace with its own sshd on its management
    address (10.200.<mgmt+i>.2, reached from `c` at .1; the management block is `span` /24s, 8 up to 4 pairs,
    16 for 5 to 8), each pair's machines cabled by a test link `t1` (10.200.<mgmt+span+k>.1/.2). `c` forwards between the management links, so a client machine reaches its
    server's sshd as it would over a management network. Each machine keeps its own prefix, remote_dir
    and authorized_keys file under `dir` (the stand-ins share this machine's file system)."""

    dir: Path
    controller: str
    machines: dict[str, Machine]
    mgmt: int
    span: int = 8
    port: int = PORT

    def names(self) -> list[str]:
        return list(self.machines)

    def gateway(self, name: str) -> str:
        """The controller's end of machine `name`'s management link."""
        return f"10.200.{self.mgmt + self.names().index(name)}.1"

    def test_ip(self, name: str) -> str:
        k = int(name[1:])
        return f"10.200.{self.mgmt + self.span + k}.{1 if name[0] == 'a' else 2}"

    def path(self, what: str, name: str) -> Path:
        return self.dir / f"{what}-{name}"

    def ansible_inventory(self, extra: dict[str, dict] | None = None, only: list[str] | None = None) -> str:
        """The fleet (or the machines `only` names) as the team's Ansible inventory, each in group `rack`."""
        lines = ["all:", "  vars:", "    ansible_user: root", f"    ansible_port: {self.port}",
                 f"    ansible_ssh_private_key_file: {self.dir / 'userkey'}",
                 f"    ansible_ssh_common_args: \"-o UserKnownHostsFile={self.dir / 'known_hosts'} -o StrictHostKeyChecking=yes\"",
                 "    ansible_python_interpreter: /usr/bin/python3", "    offlab_connect_timeout: 5",
                 "  children:", "    rack:", "      hosts:"]
        for name, m in self.machines.items():
            if only is not None and name not in only:
                continue
            lines += [f"        {name}:", f"          ansible_host: {m.ssh_ip}",
                      f"          offlab_remote_dir: {self.path('remote', name)}",
                      f"          offlab_prefix: {self.path('prefix', name)}",
                      f"          offlab_authorized_keys: {self.path('authorized_keys', name)}",
                      f"          offlab_interfaces: [{{name: t1, addresses: [{self.test_ip(name)}/24]}}]"]
            lines += [f"          {k}: {v}" for k, v in (extra or {}).get(name, {}).items()]
        return "\n".join(lines) + "\n"


def start_fleet(tmp: Path, prefix: str, pairs: int = 2, mgmt: int | None = None) -> Fleet:
    """`pairs` pairs (1 to 8); the management block starts at 10.200.`mgmt`.0 (default 240 up to 4 pairs,
    224 beyond, so the test links after it stay below 10.200.255)."""
    names = [f"{side}{k}" for k in range(1, pairs + 1) for side in ("a", "b")]
    span = max(8, 1 << (len(names) - 1).bit_length())
    mgmt = (240 if span == 8 else 256 - 2 * span) if mgmt is None else mgmt
    if not 1 <= pairs <= 8 or mgmt % span or mgmt + span + pairs > 254:
        raise ValueError(f"start_fleet: {pairs} pairs from 10.200.{mgmt}.0 do not fit (1 to 8 pairs, the "
                         f"management block aligned to {span} /24s, the test links below 10.200.255)")
    d = tmp / "sshd-fleet"
    d.mkdir(mode=0o700)
    f = Fleet(d, f"{prefix}-c", {n: Machine(f"{prefix}-{n}", f"10.200.{mgmt + i}.2") for i, n in enumerate(names)},
              mgmt, span)
    made: list[str] = []
    try:
        for ns in [f.controller] + [m.ns for m in f.machines.values()]:
            LOCAL.run(["ip", "netns", "add", ns])
            made.append(ns)
        NetnsHost(f.controller).run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        for name, m in f.machines.items():
            _veth(f.controller, f"m{name}", f.gateway(name), m.ns, "mgmt", m.ssh_ip)
            _route_mgmt(f, name)
        for k in range(1, pairs + 1):
            _veth(f.machines[f"a{k}"].ns, "t1", f.test_ip(f"a{k}"), f.machines[f"b{k}"].ns, "t1", f.test_ip(f"b{k}"))
        for key in ("hostkey", "userkey"):
            LOCAL.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"offlab-test-{key}", "-f", str(d / key)])
        host_pub = (d / "hostkey.pub").read_text().split()
        (d / "known_hosts").write_text("".join(f"[{m.ssh_ip}]:{f.port} {host_pub[0]} {host_pub[1]}\n"
                                               for m in f.machines.values()))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        for name, m in f.machines.items():
            keys = f.path("authorized_keys", name)
            keys.write_text((d / "userkey.pub").read_text())
            os.chmod(keys, 0o600)
            conf = _sshd_config(d / f"sshd_config-{name}", m.ssh_ip, f.port, d / "hostkey", keys, d / f"sshd-{name}.pid",
                                client_alive=True)
            m.proc = _start_sshd(m.ns, conf, d / f"sshd-{name}.log")
    except BaseException:
        stop_machines(f)
        raise
    return f


def stop_machines(group: "SshdPair | Fleet") -> list[str]:
    """Close our masters, stop every machine's sshd and its sessions by pid, delete the namespaces (the
    controller's too); what had to be killed beyond the listeners (should be empty)."""
    close_all()
    leftovers = []
    for m in group.machines.values():
        leftovers += _end_sshd(m.proc, m.ns)
    for ns in [group.controller] + [m.ns for m in group.machines.values()]:
        if netns_exists(ns):
            LOCAL.run(["ip", "netns", "del", ns], check=False)
    return leftovers


def _route_mgmt(f: Fleet, name: str) -> None:
    """Machine `name` reaches the whole management block through the controller (a route the kernel
    drops when the machine's mgmt link goes down, and does not bring back with it)."""
    NetnsHost(f.machines[name].ns).run(["ip", "route", "replace", f"10.200.{f.mgmt}.0/{24 - (f.span - 1).bit_length()}",
                                        "via", f.gateway(name), "dev", "mgmt"])


def cut(f: Fleet, name: str) -> None:
    """Machine `name` drops off the management network (its link down: connections time out)."""
    NetnsHost(f.machines[name].ns).run(["ip", "link", "set", "mgmt", "down"])


def reconnect(f: Fleet, name: str) -> None:
    """Machine `name` back on the management network, its route too."""
    NetnsHost(f.machines[name].ns).run(["ip", "link", "set", "mgmt", "up"])
    _route_mgmt(f, name)


def lose(f: Fleet, name: str) -> None:
    """Machine `name` drops off the network mid-command, as a crashed machine would: its listener, every
    session (the clients' masters with it) and the commands those sessions were running, killed by pid,
    so none of them finishes afterwards (a command caught mid-way, such as a setting being put back,
    would otherwise still act once resumed from `frozen`); what its sessions started apart from
    themselves (a daemon, the lease's watchdog) keeps running."""
    m = f.machines[name]
    table = _table(m.ns)  # one look: the sessions and what they run, as they were at the freeze
    sessions = {p for p, (_, comm, _) in table.items() if comm == "sshd"} - ({m.proc.pid} if m.proc is not None else set())
    running: set[int] = set()
    while more := {p for p, (pp, _, _) in table.items() if pp in sessions | running} - running:
        running |= more
    for pid in running - sessions:
        try:
            os.kill(pid, signal.SIGKILL)  # also ends a stopped one (`frozen`)
        except ProcessLookupError:
            pass
    if m.proc is not None:
        m.proc.kill()  # SIGKILL, as a crash: it also ends a listener that is stopped (`frozen`)
        m.proc.wait(timeout=10)
    _end_sshd(m.proc, m.ns, grace=0)
    m.proc = None


def bring_back(f: Fleet, name: str) -> None:
    """Machine `name`'s sshd started again with its own config, as after a reboot of the daemon."""
    m = f.machines[name]
    m.proc = _start_sshd(m.ns, f.dir / f"sshd_config-{name}", f.dir / f"sshd-{name}.log")
