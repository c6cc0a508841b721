"""A machine reached with the OpenSSH client: one ControlMaster per host, argv quoted exactly.

The remote side always gets ONE command string, made only of `shlex.quote` of each argv
element, so its shell splits it back into exactly that argv. The user's ssh config and
known_hosts are respected (host keys are checked as OpenSSH checks them; offlab never turns
that off); `BatchMode=yes` makes a missing key or an unknown host fail at once instead of
prompting. An unreachable host is an `EnvironmentProblem` naming the host and ssh's own error.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from offlab.errors import BadInput, CommandFailed, CommandTimeout, EnvironmentProblem, ToolMissing
from offlab.hosts.base import DEFAULT_TIMEOUT, TOOL_PACKAGES, Host, Result, which
from offlab.hosts.local import check_netns, netns_exists
from offlab.hosts.process import RemoteProcess, process_start_time
from offlab.interrupts import protected, shielded

SSH_ERROR = 255  # ssh's own exit code for "could not connect / authenticate / lost the connection"
CONTROL_PERSIST = 60  # seconds an idle master outlives its last client (bounds a leftover after kill -9)
DEFAULT_CONNECT_TIMEOUT = 10
MASTER_EXIT_S = 3.0  # how long a closed master is waited for to be gone
# Where offlab keeps its files on an SSH host: the remote journal of settings and a copied engine.
# /run is a tmpfs: a reboot resets every setting offlab changed, and clears their journal with them.
DEFAULT_REMOTE_DIR = "/run/offlab-remote"
# Seconds a host waits for the controller's renewal before its watchdog puts it back (offlab.hosts.lease);
# 0: no lease (the host is put back only by restore.sh, `offlab restore`, `lab down` or `fleet clean`).
DEFAULT_LEASE = 60
LEASE_MIN, LEASE_MAX = 2, 86400
REMOTE_GRACE = 2  # seconds the remote `timeout` waits past the local one, then again before SIGKILL
# Seconds an interrupted command is given to finish before its ssh client is killed: the host goes on
# with a command whatever becomes of our client, so one that records a process or a lease there would
# otherwise land after this process had put the host back (a leftover nobody ends). Bounded, so a
# signal still ends offlab within seconds when the host is slow or silent.
INTERRUPTED_GRACE = 2.0

TARGET_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:%-]{0,252}$")  # a host name or an IP literal
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@%-]{0,200}$")  # an inventory name or user@target:port
REMOTE_PATH_RE = re.compile(r"^/[A-Za-z0-9_.+/-]{1,200}$")
USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# ssh options that take a value (ssh(1) SYNOPSIS); anything else in ssh_args must be a flag.
_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")
# What offlab decides itself: no prompt, its own control socket, one non-interactive session.
_OWNED_FLAGS = set("fGMNnOSsTtVW")
_OWNED_OPTIONS = {"batchmode", "controlmaster", "controlpath", "controlpersist", "requesttty", "sessiontype",
                  "forkafterauthentication", "stdinnull", "remotecommand", "permitlocalcommand", "localcommand"}


class HostUnreachable(EnvironmentProblem):
    """ssh itself failed (rc 255): the host is down, unreachable, or refused the key or host key."""

    def __init__(self, host: str, what: str, stderr: str) -> None:
        lines = [l.strip() for l in stderr.strip().splitlines() if l.strip()]
        detail = lines[-1] if lines else "no message from ssh"
        self.detail = detail
        super().__init__(f"ssh host {host}: {what} failed (ssh exit 255): {detail}")


def check_lease(value: object, where: str) -> int:
    """A lease in whole seconds: 0 (none) or LEASE_MIN..LEASE_MAX; BadInput naming `where` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not (value == 0 or LEASE_MIN <= value <= LEASE_MAX):
        raise BadInput(f"{where} {value!r}: whole seconds, {LEASE_MIN}..{LEASE_MAX} (the default is {DEFAULT_LEASE}), "
                       f"or 0 for no lease")
    return value


def check_ssh_args(args: Sequence[str], where: str = "ssh_args") -> list[str]:
    """Extra ssh client options: only options and their values, never a destination or a command,
    and none of those offlab itself decides (batch mode, the control socket, the session's shape)."""
    out = list(args)
    for a in out:
        if not isinstance(a, str) or "\n" in a or "\0" in a:
            raise BadInput(f"{where}: invalid argument {a!r}")
    i = 0
    while i < len(out):
        a = out[i]
        if not a.startswith("-") or a in ("-", "--") or a.startswith("--"):
            raise BadInput(f"{where}: {a!r} is not an ssh option (only -o KEY=VALUE style options belong here)")
        for j, c in enumerate(a[1:], start=1):  # getopt: -vT is -v -T; -oX=1 is -o X=1
            if c in _OWNED_FLAGS:
                raise BadInput(f"{where}: {a!r}: offlab sets -{c} itself")
            if c in _WITH_VALUE:
                value = a[j + 1:]
                if not value:
                    if i + 1 >= len(out):
                        raise BadInput(f"{where}: option -{c} needs a value")
                    i += 1
                    value = out[i]
                if c == "o":
                    name = re.split(r"[=\s]", value.strip(), maxsplit=1)[0].lower()
                    if name in _OWNED_OPTIONS:
                        raise BadInput(f"{where}: -o {value}: offlab sets {name} itself")
                break
        i += 1
    return out


def remote_command(argv: Sequence[str]) -> str:
    """The one string the remote shell splits back into exactly `argv`."""
    return " ".join(shlex.quote(str(a)) for a in argv)


class _ControlDir:
    """This process's private directory of master sockets, removed at exit.

    Per process, so one process closing its masters at exit never cuts another's; under the
    state dir when its path is short enough for a unix socket (108 bytes), else under /tmp.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.pid = 0
        self.lock = threading.Lock()

    def get(self) -> Path:
        with self.lock:
            if self.path is None or self.pid != os.getpid():
                from offlab.state import make_private_tmp, state_dir

                base = state_dir() / "ssh"
                # ssh binds "<path>.<16 random chars>" first: keep that under a socket's 108 bytes.
                if len(str(base)) <= 50:
                    base.mkdir(parents=True, exist_ok=True, mode=0o700)
                    _sweep(base)
                    path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}.", dir=base))
                else:  # named by its owner, so `offlab restore` removes it once its process is gone
                    path = make_private_tmp("ssh")
                os.chmod(path, 0o700)
                self.path, self.pid = path, os.getpid()
                close_at_exit()  # the directory goes at exit even if no master is ever opened in it
            return self.path

    def remove(self) -> None:
        with self.lock:
            if self.path is not None and self.pid == os.getpid():
                shutil.rmtree(self.path, ignore_errors=True)
                self.path = None


def _sweep(base: Path) -> None:
    """Remove the control directories of processes that died without closing (kill -9); their
    masters, if any, exit by themselves after ControlPersist seconds idle."""
    for d in base.iterdir():
        pid = d.name.split(".", 1)[0]
        if d.is_dir() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)


_CONTROL = _ControlDir()
_OPEN: dict[str, "SshHost"] = {}  # master key → a host whose master this process started
_OPEN_LOCK = threading.Lock()
_KEY_LOCKS: dict[str, threading.Lock] = {}


def _key_lock(key: str) -> threading.Lock:
    """One lock per connection, shared by equal hosts, so two threads never race to open one master."""
    with _OPEN_LOCK:
        return _KEY_LOCKS.setdefault(key, threading.Lock())


def at_once(calls: Sequence[Callable[[], object]]) -> None:
    """Run each call on a thread of its own and wait for all: one step on several hosts (a lease's
    release, a master's close) costs one host's round trip, not the sum. The first exception a call
    raised is raised here, once all have ended."""
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller below)
            errors.append(exc)

    if len(calls) <= 1:
        for call in calls:
            call()
        return
    threads = [threading.Thread(target=run, args=(call,), name="ssh at once", daemon=True) for call in calls]
    # Shielded: a signal waits until every call has ended (each is bounded by its own timeout). Raised while
    # they run, it left them running on their threads: a master still connecting detached once authenticated,
    # after the unwinding that closes masters had passed, and stayed with its session on the host.
    with shielded():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def close_all() -> None:
    """Close every master this process opened (`ssh -O exit`, all at once); at exit once one is opened
    (_opened)."""
    with _OPEN_LOCK:
        hosts = list(_OPEN.values())
    at_once([host.close for host in hosts])
    with _OPEN_LOCK:
        empty = not _OPEN
    if empty:
        _CONTROL.remove()


_AT_EXIT = threading.Event()  # close_all is registered to run at exit
_AT_EXIT_LOCK = threading.Lock()


def close_at_exit() -> None:
    """Have close_all run at exit (once; what registers later, a lease's release, runs before it)."""
    with _AT_EXIT_LOCK:
        if not _AT_EXIT.is_set():
            atexit.register(close_all)
            _AT_EXIT.set()


def _opened(host: "SshHost") -> None:
    """Keep `host`'s master to close at exit (under _OPEN_LOCK)."""
    close_at_exit()
    _OPEN[host._key] = host


_CUT_SHORT: set[str] = set()  # the hosts (their master keys) of commands an interrupt cut short


def cut_short(host: "SshHost") -> bool:
    """Whether an interrupt cut a command to `host` short in this process: the host may hold something
    of this process's that it never heard back about (offlab.hosts.lease looks at its exit)."""
    return host._key in _CUT_SHORT


def _finish(local: list[str], input: bytes | None, timeout: float, argv: list[str], host: "SshHost", *,
            changes: bool = True) -> tuple[int, bytes, bytes]:
    """Run one ssh client to its end: (exit code, stdout, stderr). An interrupt (a signal's exception)
    while it runs lets it finish for INTERRUPTED_GRACE seconds before it is killed, then goes on up:
    what the host was doing is done by the time this process puts the host back. A command that only
    looks (not `changes`) is dropped at once: nothing of it needs putting back, and its wait would only
    delay the exit (a wait for a process's end, cut short, took 1.3 s of a 2.3-s exit)."""
    proc = subprocess.Popen(local, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        raise CommandTimeout(argv, timeout, host.name) from exc
    except BaseException:
        if changes:
            _let_finish(proc, host)
        else:
            _drop(proc)
        raise
    return proc.returncode, out, err


@protected  # a second signal waits: the client is ours to end
def _drop(proc: subprocess.Popen) -> None:
    """An interrupted ssh client of a command that only looks: killed. Its command on the host ends at
    its next write (no one reads it) or by the host's `timeout` around it."""
    proc.kill()
    proc.wait()


@protected  # a second signal, or one as the first is caught, waits: the client is ours to end
def _let_finish(proc: subprocess.Popen, host: "SshHost") -> None:
    """An interrupted ssh client: INTERRUPTED_GRACE seconds to finish, then killed; its host marked as having
    had a command cut short."""
    _CUT_SHORT.add(host._key)
    try:
        proc.communicate(timeout=INTERRUPTED_GRACE)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        proc.kill()
        proc.wait()


class SshHost(Host):
    """A machine offlab reaches over ssh; everything above `hosts` uses it like any other Host."""

    kind = "ssh"

    def __init__(
        self,
        target: str,
        *,
        user: str | None = None,
        port: int | None = None,
        identity: str | None = None,
        ssh_args: Sequence[str] = (),
        become: bool = False,
        config: str | None = None,
        via_netns: str | None = None,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        name: str | None = None,
        remote_dir: str = DEFAULT_REMOTE_DIR,
        tools: dict[str, str] | None = None,
        lease: int = DEFAULT_LEASE,
    ) -> None:
        if not isinstance(target, str) or not TARGET_RE.fullmatch(target):
            raise BadInput(f"invalid ssh target {target!r}: a host name or an IP address")
        if user is not None and (not isinstance(user, str) or not USER_RE.fullmatch(user)):
            raise BadInput(f"invalid ssh user {user!r}")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
            raise BadInput(f"invalid ssh port {port!r}: 1..65535")
        for what, path in (("identity file", identity), ("ssh config", config)):
            if path is not None and (not isinstance(path, str) or not path or "\n" in path or "\0" in path):
                raise BadInput(f"invalid {what} {path!r}")
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int) or not 1 <= connect_timeout <= 600:
            raise BadInput(f"invalid connect timeout {connect_timeout!r}: 1..600 seconds")
        if not isinstance(remote_dir, str) or not REMOTE_PATH_RE.fullmatch(remote_dir) or "/../" in remote_dir + "/":
            raise BadInput(f"invalid remote directory {remote_dir!r}: an absolute path of letters, digits and _ . - /")
        check_lease(lease, "lease")
        tools = dict(tools or {})
        for tool, path in tools.items():
            if not isinstance(tool, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", tool) \
                    or not isinstance(path, str) or not REMOTE_PATH_RE.fullmatch(path):
                raise BadInput(f"invalid remote tool path {tool!r}: {path!r}")
        self.remote_dir = remote_dir
        self.lease = lease
        self.tools = tools  # tool name → its path on the host (an engine offlab copied there)
        self.target = target
        self.user = user
        self.port = port
        self.identity = identity
        self.ssh_args = check_ssh_args(list(ssh_args))
        self.become = bool(become)
        self.config = config
        self.via_netns = check_netns(via_netns) if via_netns is not None else None
        self.connect_timeout = connect_timeout
        self.name = name or (f"{user}@{target}" if user else target) + (f":{port}" if port else "")
        if not NAME_RE.fullmatch(self.name):
            raise BadInput(f"invalid host name {name!r}")

    # ---- the ssh command line ---------------------------------------------
    @property
    def _key(self) -> str:
        """One master per distinct connection (what ssh's %C hashes, plus our own options)."""
        r = self.ref()
        for k in ("name", "become", "remote_dir", "tools", "lease"):
            r.pop(k, None)
        return hashlib.sha1(json.dumps(r, sort_keys=True).encode()).hexdigest()[:16]

    def _control_path(self) -> Path:
        return _CONTROL.get() / f"cm-{self._key}"

    def _base(self, *, master: bool = False) -> list[str]:
        argv = ["ssh"]
        if self.config is not None:
            argv += ["-F", self.config]
        # First value wins in ssh: ours come before the user's, so BatchMode and the control
        # socket cannot be overridden, while host-key options are left entirely to the user.
        argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                 "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                 "-o", f"ControlPath={self._control_path()}"]
        if master:
            argv += ["-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST}"]
        else:
            argv += ["-o", "ControlMaster=no"]
        if self.identity is not None:
            argv += ["-i", os.path.expanduser(self.identity)]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.user is not None:
            argv += ["-l", self.user]
        return argv + self.ssh_args

    def _local(self, argv: list[str], *, netns: bool = True) -> list[str]:
        """The local argv: ssh, in `via_netns` when the client must run inside a namespace.

        Control commands (-O check/exit) need no namespace: the master's socket is a file.
        """
        full = ["ip", "netns", "exec", self.via_netns, *argv] if self.via_netns and netns else argv
        exe = which(full[0])
        if exe is None:
            raise ToolMissing(full[0], TOOL_PACKAGES.get(full[0]))
        return [exe, *full[1:]]

    def _remote_argv(self, argv: Sequence[str], env: dict[str, str] | None,
                     timeout: float | None = None) -> list[str]:
        argv = [str(a) for a in argv]
        if not argv:
            raise BadInput("empty command")
        argv = self.with_tool(argv)
        if env:
            bad = [k for k in env if not ENV_RE.fullmatch(k)]
            if bad:
                raise BadInput(f"invalid environment variable name {bad[0]!r}")
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        if timeout is not None:
            # The local timeout ends only our ssh client; the remote command would run on. The
            # host's own `timeout` ends it (and its process group) just after ours fired.
            argv = ["timeout", "-k", str(REMOTE_GRACE), f"{timeout + REMOTE_GRACE:g}", *argv]
        if self.become:
            argv = ["sudo", "-n", "--", *argv]
        return argv

    def with_tool(self, argv: list[str]) -> list[str]:
        """argv with its program replaced by the host's own path for it, when offlab put it there."""
        return [self.tools[argv[0]], *argv[1:]] if argv and argv[0] in self.tools else list(argv)

    # ---- the master connection ---------------------------------------------
    def connect(self) -> None:
        """Open (or check) this process's master connection; HostUnreachable if ssh cannot."""
        sock = self._control_path()
        if self._key in _OPEN and sock.exists():
            return  # ours and there; if it died meanwhile, ssh falls back to a direct connection
        with _key_lock(self._key):
            if sock.exists() and self._check_master():
                with _OPEN_LOCK:
                    _opened(self)
                return
            sock.unlink(missing_ok=True)
            if self.via_netns is not None and not netns_exists(self.via_netns):
                raise EnvironmentProblem(f"ssh host {self.name}: network namespace {self.via_netns!r} is gone")
            # -N -f: authenticate, then the master goes to the background and this call returns.
            # Its output goes to a file, not a pipe: the detached master keeps its fds, and a
            # pipe it holds would make this call wait for it.
            log = sock.with_name(sock.name + ".log")
            argv = self._local([*self._base(master=True), "-N", "-f", "--", self.target])
            # Shielded: a Ctrl-C here would leave a master that detaches once authenticated, unknown to
            # close_all, and its session on the host for ControlPersist seconds; it waits until the
            # master is registered (at most the connect timeout), then is raised.
            with shielded():
                with open(log, "w+b") as err:
                    try:
                        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=err, timeout=self.connect_timeout + 15)
                        rc = proc.returncode
                    except subprocess.TimeoutExpired:
                        rc = None
                    err.seek(0)
                    text = err.read().decode(errors="replace")
                log.unlink(missing_ok=True)
                if rc is None:
                    raise EnvironmentProblem(f"ssh host {self.name}: connecting did not finish within "
                                             f"{self.connect_timeout + 15} s")
                if rc != 0 or not sock.exists():
                    raise HostUnreachable(self.name, "connecting", text or f"exit code {rc}")
                with _OPEN_LOCK:
                    _opened(self)

    def _master_pid(self) -> int | None:
        """The pid of this host's master, as it says itself (`ssh -O check`), or None."""
        argv = self._local([*self._base(), "-O", "check", "--", self.target], netns=False)
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return None
        found = re.search(r"\(pid=(\d+)\)", res.stderr + res.stdout)
        return int(found.group(1)) if found else None

    def _check_master(self) -> bool:
        argv = self._local([*self._base(), "-O", "check", "--", self.target], netns=False)
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _answers(self) -> bool:
        """The host runs a command through the master within the connect timeout."""
        argv = self._local([*self._base(), "-T", "--", self.target, "true"])
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=self.connect_timeout + 5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> None:
        """Close this host's master (`ssh -O exit`); the next command opens a new one."""
        with _key_lock(self._key):
            sock = self._control_path()
            if sock.exists():
                pid = self._master_pid()
                argv = self._local([*self._base(), "-O", "exit", "--", self.target], netns=False)
                try:
                    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                sock.unlink(missing_ok=True)
                # The master exits a moment after it answered (it removes its socket first): closed is gone,
                # so a check for leftovers right after (a test's, a harness's) never finds it still there.
                deadline = time.monotonic() + MASTER_EXIT_S
                while pid and process_start_time(pid) is not None and time.monotonic() < deadline:
                    time.sleep(0.02)
            with _OPEN_LOCK:
                _OPEN.pop(self._key, None)

    # ---- commands -----------------------------------------------------------
    def _exec(self, argv: Sequence[str], *, timeout: float, input: bytes | None,
              env: dict[str, str] | None, changes: bool = True) -> tuple[list[str], int, bytes, bytes, float]:
        remote = self._remote_argv(argv, env, timeout)
        self.connect()
        local = self._local([*self._base(), "-T", "--", self.target, remote_command(remote)])
        start = time.monotonic()
        rc, out, err = _finish(local, input, timeout, [str(a) for a in argv], self, changes=changes)
        duration = time.monotonic() - start
        if rc == SSH_ERROR:
            stderr = err.decode(errors="replace")
            # 255 is also a possible exit code of the remote command. A master that is gone, or one still up
            # (it has not noticed yet) through which the host no longer answers, says it was ssh's own.
            if not self._check_master() or not self._answers():
                with _OPEN_LOCK:
                    _OPEN.pop(self._key, None)
                raise HostUnreachable(self.name, f"running {argv[0]}", stderr)
        return remote, rc, out, err, duration

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        check: bool = True,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Result:
        result = self._result(argv, timeout=timeout, input=input, env=env)
        if check and result.rc != 0:
            raise CommandFailed(result.argv, result.rc, result.stderr, self.name)
        return result

    def look(self, argv: Sequence[str], *, timeout: float) -> Result:
        return self._result(argv, timeout=timeout, changes=False)

    def _result(self, argv: Sequence[str], *, timeout: float, input: str | None = None,
                env: dict[str, str] | None = None, changes: bool = True) -> Result:
        argv = [str(a) for a in argv]
        data = input.encode() if isinstance(input, str) else input
        _, rc, out, err, duration = self._exec(argv, timeout=timeout, input=data, env=env, changes=changes)
        return Result(argv, rc, out.decode(errors="replace"), err.decode(errors="replace"), duration)

    def stream(self, argv: Sequence[str], *, lifetime: float = 600.0) -> subprocess.Popen:
        """argv on the host with its stdin and stdout piped to this process (text, line-buffered), over
        the master connection: a reader that answers a line in one network round trip, not one ssh
        session per read. It ends when its stdin closes, and on the host after `lifetime` at most."""
        remote = self._remote_argv(argv, None, lifetime)
        self.connect()
        local = self._local([*self._base(), "-T", "--", self.target, remote_command(remote)])
        return subprocess.Popen(local, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1)

    def spawn(self, argv: Sequence[str], **popen_kwargs) -> RemoteProcess:
        """A detached process on the host, recorded in its journal before it starts (so the host's
        restore.sh ends it after a crash); its output goes to files there (`popen_kwargs` are ignored)."""
        return RemoteProcess(self, self.with_tool([str(a) for a in argv]), text=popen_kwargs.get("text", True),
                             remote_dir=self.remote_dir)

    def interactive(self, argv: Sequence[str]) -> int:
        remote = self._remote_argv(argv, None)
        self.connect()
        tty = ["-t"] if sys.stdin.isatty() else ["-T"]
        try:
            return subprocess.call(self._local([*self._base(), *tty, "--", self.target, remote_command(remote)]))
        except KeyboardInterrupt:
            return 130

    # ---- files ------------------------------------------------------------------
    def read_bytes(self, path: str | Path) -> bytes:
        _, rc, out, err, _ = self._exec(["cat", "--", str(path)], timeout=60, input=None, env=None)
        if rc != 0:
            raise CommandFailed(["cat", str(path)], rc, err.decode(errors="replace"), self.name)
        return out

    def read(self, path: str | Path) -> str:
        return self.read_bytes(path).decode(errors="replace")

    def read_many(self, paths: Sequence[str | Path], *, timeout: float = 30) -> dict[str, str | None]:
        """Every file in one ssh command: each after a line only this call knows, with 0 or 1."""
        mark = f"@@offlab-{secrets.token_hex(8)}@@"
        script = ('m=$1; shift; for f; do if [ -r "$f" ]; then printf \'\\n%s 0\\n\' "$m"; cat -- "$f"; '
                  'else printf \'\\n%s 1\\n\' "$m"; fi; done; exit 0')
        _, rc, out, err, _ = self._exec(["sh", "-c", script, "sh", mark, *map(str, paths)], timeout=timeout,
                                        input=None, env=None)
        chunks = out.decode(errors="replace").split(f"\n{mark} ")[1:]
        if rc != 0 or len(chunks) != len(paths):
            raise CommandFailed(["cat", *map(str, paths)], rc, err.decode(errors="replace"), self.name)
        return {str(p): c[2:] if c.startswith("0\n") else None for p, c in zip(paths, chunks, strict=True)}

    def write(self, path: str | Path, text: str | bytes) -> None:
        """Write a file on the host exactly (bytes as given, text as UTF-8)."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        # A constant script; the path arrives as $1, so no part of it is ever parsed by a shell.
        argv = ["sh", "-c", 'cat >"$1"', "sh", str(path)]
        _, rc, _, err, _ = self._exec(argv, timeout=max(60.0, len(data) / 1e6), input=data, env=None)
        if rc != 0:
            raise CommandFailed(argv, rc, err.decode(errors="replace"), self.name)

    def exists(self, path: str | Path) -> bool:
        return self.run(["test", "-e", str(path)], check=False, timeout=15).rc == 0

    # ---- identity -----------------------------------------------------------------
    def ref(self) -> dict:
        return {"kind": self.kind, "name": self.name, "target": self.target, "user": self.user,
                "port": self.port, "identity": self.identity, "ssh_args": list(self.ssh_args),
                "become": self.become, "config": self.config, "via_netns": self.via_netns,
                "connect_timeout": self.connect_timeout, "remote_dir": self.remote_dir, "tools": dict(self.tools),
                "lease": self.lease}

    def alive(self) -> bool:
        try:
            return self.run(["true"], check=False, timeout=self.connect_timeout + 5).ok
        except EnvironmentProblem:
            return False

    @property
    def shares_kernel(self) -> bool:
        return False

    @property
    def settings_die_with_host(self) -> bool:
        return False  # unreachable is not gone: a restore must wait for the machine, not forget it

    def __repr__(self) -> str:
        return f"<SshHost {self.name}>"


def from_ref(ref: dict) -> SshHost:
    """The SSH host a `ref()` names (hosts/refs.py)."""
    known = {"kind", "name", "target", "user", "port", "identity", "ssh_args", "become", "config",
             "via_netns", "connect_timeout", "remote_dir", "tools", "lease"}
    extra = set(ref) - known
    if extra:
        raise BadInput(f"unknown field(s) {sorted(extra)} in an ssh host reference")
    ssh_args = ref.get("ssh_args") or []
    if not isinstance(ssh_args, list):
        raise BadInput("invalid ssh_args in an ssh host reference")
    return SshHost(str(ref.get("target") or ""), user=ref.get("user"), port=ref.get("port"), identity=ref.get("identity"),
                   ssh_args=ssh_args, become=bool(ref.get("become")), config=ref.get("config"),
                   via_netns=ref.get("via_netns"), name=ref.get("name"),
                   connect_timeout=ref.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                   remote_dir=ref.get("remote_dir", DEFAULT_REMOTE_DIR), tools=ref.get("tools") or {},
                   lease=ref.get("lease", DEFAULT_LEASE))

