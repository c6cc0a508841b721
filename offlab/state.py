"""The state directory: lab files, settings journals, OVS run directories; and the small
primitives every writer of state shares (atomic JSON, process identity, flock files, temporary
directories named by their owner)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from offlab.errors import BadInput, EnvironmentProblem

DEFAULT_STATE_DIR = "/run/offlab"


def state_dir() -> Path:
    return Path(os.environ.get("OFFLAB_STATE_DIR", DEFAULT_STATE_DIR))


def ensure_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as exc:
        raise write_failed(path, exc) from exc
    return path


def write_failed(path: Path, exc: OSError) -> EnvironmentProblem:
    """One line for a write the machine refused (disk full, read-only, permissions)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space on the file system of {path.parent}"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = "run as root, or set OFFLAB_STATE_DIR to a writable directory"
    else:
        fix = "check the directory, or set OFFLAB_STATE_DIR to another one"
    return EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc} ({fix}); nothing was changed")


def write_json_atomic(path: Path, data: object) -> None:
    """Write, fsync, rename: a crash or a full disk leaves either the old or the new file, never half."""
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise write_failed(path, exc) from exc
    except BaseException:  # a signal's interrupt mid-write: the half file is not left beside the state
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def read_json(path: Path) -> object:
    with open(path) as f:
        return json.load(f)


def read_state_json(path: Path, repair: str) -> dict:
    """A state file as a dict, or BadInput naming the file and the command that repairs it."""
    try:
        data = read_json(path)
    except (ValueError, UnicodeDecodeError) as exc:
        why = "empty (a write was interrupted)" if path.exists() and path.stat().st_size == 0 else \
            f"not valid JSON ({exc})"
        raise BadInput(f"state file {path} is {why}: `{repair}` repairs it") from None
    if not isinstance(data, dict):
        raise BadInput(f"state file {path} does not hold an object: `{repair}` repairs it")
    return data


# ---- process identity ------------------------------------------------------------------

def proc_start(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat); None once it is
    gone or a zombie (dead, only not reaped yet: a killed runner whose parent was killed too stays one
    until init reaps it, and must not be taken for a live owner meanwhile)."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def me() -> dict:
    """This process, named so that a reused pid is never mistaken for it."""
    return {"pid": os.getpid(), "start": proc_start(os.getpid())}


def owner_alive(owner: object) -> bool:
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    return proc_start(owner["pid"]) == owner.get("start")


# ---- temporary directories named by their owner --------------------------------------------------

_PRIVATE_TMP = re.compile(r"offlab-([a-z]+)\.(\d+)\.(\d+)\.[A-Za-z0-9_]+")


@contextlib.contextmanager
def private_tmp(what: str) -> Iterator[Path]:
    """A temporary directory of this process (`/tmp/offlab-WHAT.PID.START.xxxx`), removed when the block
    ends; one that a process killed outright left behind is known by its dead owner, and `offlab restore`
    removes it (sweep_private_tmp)."""
    path = make_private_tmp(what)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_private_tmp(what: str) -> Path:
    """As private_tmp, for a directory that lives as long as its process (the caller removes it)."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"offlab-{what}.{pid}.{proc_start(pid)}."))


def sweep_private_tmp(*, list_only: bool = False) -> list[str]:
    """Remove the private temporary directories (private_tmp) of processes that are gone; what was
    (or, with `list_only`, would be) removed."""
    out = []
    for path in sorted(Path(tempfile.gettempdir()).glob("offlab-*")):
        m = _PRIVATE_TMP.fullmatch(path.name)
        if m is None or not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.geteuid():
            continue
        if owner_alive({"pid": int(m[2]), "start": int(m[3])}):
            continue
        if not list_only:
            shutil.rmtree(path, ignore_errors=True)
        out.append(str(path))
    return out


# ---- flock files ------------------------------------------------------------------------

class FlockFile:
    """An exclusive flock on a file that also holds who has it (JSON).

    The kernel drops the lock when the holder dies, however it dies, so a lock is never
    stale; the JSON inside only names the holder for messages. The file is not deleted on
    release (unlinking a flocked file lets two processes lock two different inodes).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self, info: dict, wait: float = 0.0) -> dict | None:
        """Take the lock within `wait` seconds and write `info`; None on success, else the holder's info."""
        ensure_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_failed(self.path, exc) from exc
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._read(fd)
                    os.close(fd)
                    return holder
                time.sleep(0.1)
        self.fd = fd
        self.previous = self._read(fd)
        self.write(info)
        return None

    def write(self, info: dict) -> None:
        assert self.fd is not None
        data = json.dumps(info, sort_keys=True).encode()
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
            os.fsync(self.fd)
        except OSError as exc:
            raise write_failed(self.path, exc) from exc

    def release(self, keep: dict | None = None) -> None:
        """Unlock; the file then holds `keep` (default: nothing, meaning free)."""
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
            if keep is not None:
                os.pwrite(self.fd, json.dumps(keep, sort_keys=True).encode(), 0)
        except OSError:
            pass  # a full disk must not keep the lock: closing releases it anyway
        os.close(self.fd)
        self.fd = None

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            data = json.loads(os.pread(fd, 65536, 0) or b"{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
