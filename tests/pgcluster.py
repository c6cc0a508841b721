"""A private PostgreSQL cluster for the tests: its own data directory,
socket directory and port, run by an unprivileged user (postgres as root, else the user running the
tests), on its Unix socket only, stopped (by its postmaster's pid) and removed afterwards. Never the
machine's own service.

    def test_x(pg):                   # the session fixture (tests/conftest.py imports it)
    url = pg.database()               # a fresh database in it, as a postgresql:// URL
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from offlab.hosts.process import die_with_parent


def pg_bin() -> Path | None:
    """The newest Debian PostgreSQL's bin directory (initdb, pg_ctl, postgres), if installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


@dataclass
class Cluster:
    root: Path
    bin: Path
    user: str
    port: int
    made: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def sock(self) -> Path:
        return self.root / "sock"

    def url(self, db: str = "postgres", user: str | None = None) -> str:
        return f"postgresql://{user or self.user}@/{db}?host={self.sock}&port={self.port}"

    def psql(self, sql: str, db: str = "postgres") -> str:
        res = subprocess.run([str(self.bin / "psql"), "-X", "-Atq", "-h", str(self.sock), "-p", str(self.port),
                              "-U", self.user, "-d", db, "-c", sql], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def database(self) -> str:
        """A new, empty database; its URL."""
        name = f"t{len(self.made)}_{os.getpid()}"
        self.psql(f"CREATE DATABASE {name}")
        self.made.append(name)
        return self.url(name)


def _as(user: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    if os.geteuid() == 0 and user != "root":
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def start_cluster() -> Cluster:
    bindir = pg_bin()
    if bindir is None:
        pytest.fail("PostgreSQL is not installed: `make install` (scripts/install-deps) installs Debian's postgresql")
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    root = Path(tempfile.mkdtemp(prefix="offlab-pg-"))
    os.chmod(root, 0o755)
    (root / "sock").mkdir()
    if os.geteuid() == 0:
        shutil.chown(root / "sock", user)
        os.makedirs(root / "data", mode=0o700)
        shutil.chown(root / "data", user)
    c = Cluster(root, bindir, user, 20000 + os.getpid() % 20000)
    res = _as(user, [str(bindir / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", user, "-E", "UTF8",
                     "--no-sync", "--no-instructions"])
    if res.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"initdb failed: {res.stderr.strip()[-300:]}")
    # The postmaster is our child (not pg_ctl's daemon): its pid is known, and it is stopped by it.
    argv = [str(bindir / "postgres"), "-D", str(root / "data"), "-k", str(root / "sock"), "-p", str(c.port),
            "-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=100"]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", user, "--", "setpriv", "--pdeathsig", "TERM", "--", *argv]
    log = open(root / "postgres.log", "w")
    # runuser must go with the test process too: a pytest worker killed outright (an interrupted
    # `make test`) left runuser to PID 1, and the postmaster, whose own pdeathsig watches runuser, ran on.
    # On SIGTERM runuser passes the signal to postgres and reaps it.
    c.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              preexec_fn=die_with_parent)
    deadline = time.monotonic() + 30
    while not (root / "sock" / f".s.PGSQL.{c.port}").exists():
        if c.proc.poll() is not None or time.monotonic() > deadline:
            stop_cluster(c)
            pytest.fail(f"postgres did not start: {(root / 'postgres.log').read_text()[-500:]}")
        time.sleep(0.05)
    for _ in range(100):
        if _as(user, [str(bindir / "pg_isready"), "-h", str(root / "sock"), "-p", str(c.port)]).returncode == 0:
            break
        time.sleep(0.05)
    return c


def stop_cluster(c: Cluster) -> None:
    """SIGINT to the postmaster, by the pid in its postmaster.pid (PostgreSQL's "fast" shutdown: clients
    cut off, all its processes end), then the runuser that started it is reaped; the directory goes."""
    if c.proc is not None and c.proc.poll() is None:
        try:
            pid = int((c.root / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = c.proc.pid
        try:
            os.kill(pid, 2)
        except ProcessLookupError:
            pass
        try:
            c.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(pid, 9)
            c.proc.wait(timeout=10)
    shutil.rmtree(c.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg():
    c = start_cluster()
    try:
        yield c
    finally:
        stop_cluster(c)
