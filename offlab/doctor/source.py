"""Where doctor checks read from: the live host (or a namespace), an offlab capture, a sosreport.

A check reads only through a `Source`: `read(path)`, `exists(path)`, `listdir(path)`,
`command(name, argv)` and `sample(path, seconds)`. The live source reads files and
runs commands through `hosts`; a captured tree answers the same calls from files
written earlier, so a check cannot tell the two apart. `Recorder` wraps a live
source and keeps every answer, which is how `doctor --capture` writes a tree that
holds exactly what the checks read and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from offlab.errors import BadInput, CommandTimeout, EnvironmentProblem, ToolMissing
from offlab.hosts import Host, LocalHost, is_root

MANIFEST = "offlab-capture.json"
CAPTURE_FORMAT = "offlab-capture/1"
COMMAND_TIMEOUT = 15.0
NAME_MAX = 255  # sos cuts a command's file name to the archive's PC_NAME_MAX (255 on every Linux fs)
SOS_MANIFEST = "sos_reports/manifest.json"
SYSCTL_A = "sos_commands/kernel/sysctl_-a"

# Paths the kernel shows per network namespace; everything else (CPUs, modules,
# PCI devices, the NAPI sysctls that exist only in the initial namespace) is the
# same from any namespace and is read directly.
_NETNS_PREFIXES = ("/proc/sys/net/", "/proc/net/", "/sys/class/net/", "/sys/devices/virtual/net/")
_GLOBAL_NET = frozenset({
    "/proc/sys/net/core/netdev_budget",
    "/proc/sys/net/core/netdev_budget_usecs",
    "/proc/sys/net/core/netdev_max_backlog",
    "/proc/sys/net/core/dev_weight",
    "/proc/net/softnet_stat",
})


@dataclass(frozen=True)
class Output:
    """A command's result as a check sees it, live or stored."""

    stdout: str
    rc: int = 0
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0


class Denied(Exception):
    """The path exists but this user may not read it (live, not root)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def command_name(argv: Sequence[str]) -> str:
    """The file name sosreport gives a command's output (`ethtool -k eth0` → `ethtool_-k_eth0`)."""
    name = " ".join(argv)
    name = re.sub(r"^/(usr/|)(bin|sbin)/", "", name)
    name = re.sub(r"[^\w\-./]+", "_", name)
    return name.replace("/", ".").strip(" ._-")[:NAME_MAX]


class Source:
    """The interface every check reads through."""

    kind = "live"  # live | capture | sosreport
    label = "local"
    netns: str | None = None  # the network namespace it shows, by name; None: a host's own
    _logs: list[list[str]] | None = None

    @contextmanager
    def recording(self) -> Iterator[list[str]]:
        """Collect the files (relative to a tree's root) read inside the block; nests."""
        files: list[str] = []
        if self._logs is None:
            self._logs = []
        self._logs.append(files)
        try:
            yield files
        finally:
            # by identity: two empty logs are equal, and blocks close in reverse order
            self._logs[:] = [log for log in self._logs if log is not files]

    def note(self, *paths: str) -> None:
        """Tell every open recording that these files were read (trees call this; live never does)."""
        for log in self._logs or ():
            log.extend(p for p in paths if p not in log)

    def read(self, path: str) -> str | None:
        """File content, None if absent; raises Denied if present but unreadable."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        """Sorted entries of a directory, [] if absent."""
        raise NotImplementedError

    def command(self, name: str, argv: Sequence[str]) -> Output | None:
        """A command's output; None if the tool is missing (live) or was not captured."""
        raise NotImplementedError

    def sample(self, path: str, seconds: float) -> list[tuple[float, str]]:
        """Snapshots of a counter file with their times in seconds; one if only one exists."""
        raise NotImplementedError

    @property
    def privileged(self) -> bool:
        """Whether this source sees what root sees (a capture is judged by what it holds)."""
        return True

    def covers(self, path: str) -> bool:
        """Whether the absence of `path` here means it is absent on the host (a sosreport leaves much out)."""
        return True

    @property
    def collected(self) -> str | None:
        """When a stored source's facts were taken, as it states it; None live."""
        return None


class LiveSource(Source):
    """This machine, or one network namespace on it."""

    kind = "live"

    def __init__(self, host: Host | None = None) -> None:
        self.host = host or LocalHost()
        self.netns = self.host.netns_name
        # A host on another kernel (SSH) is read entirely through it: its files are not ours.
        self.remote = not self.host.shares_kernel
        self.label = self.netns or (self.host.name if self.remote else "local")

    @property
    def privileged(self) -> bool:
        return is_root()

    def _in_netns(self, path: str) -> bool:
        if self.remote:
            return True
        return bool(self.netns) and path.startswith(_NETNS_PREFIXES) and path not in _GLOBAL_NET

    def read(self, path: str) -> str | None:
        if self._in_netns(path):
            res = self.host.run(["cat", path], check=False, timeout=COMMAND_TIMEOUT)
            if res.ok:
                return res.stdout
            if "Permission denied" in res.stderr:
                raise Denied(path)
            return None
        try:
            return Path(path).read_text(errors="replace")
        except PermissionError:
            raise Denied(path) from None
        except OSError:  # absent, a directory, or a sysfs attribute the driver refuses
            return None

    def exists(self, path: str) -> bool:
        if self._in_netns(path):
            return self.host.exists(path)
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        if self._in_netns(path):
            res = self.host.run(["ls", "-1", "-A", path], check=False, timeout=COMMAND_TIMEOUT)
            return sorted(res.stdout.split()) if res.ok else []
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def command(self, name: str, argv: Sequence[str]) -> Output | None:
        try:
            res = self.host.run(list(argv), check=False, timeout=COMMAND_TIMEOUT)
        except ToolMissing:
            return None
        except CommandTimeout:
            return Output("", 124, f"timed out after {COMMAND_TIMEOUT:g} s")
        return Output(res.stdout, res.rc, res.stderr)

    def sample(self, path: str, seconds: float) -> list[tuple[float, str]]:
        start = time.monotonic()
        first = self.read(path)
        if first is None:
            return []
        time.sleep(seconds)
        second = self.read(path)
        elapsed = time.monotonic() - start
        return [(0.0, first)] + ([(elapsed, second)] if second is not None else [])


class Recorder(Source):
    """A live source that remembers every answer, for `doctor --capture`."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.kind, self.label, self.netns = inner.kind, inner.label, inner.netns
        self.files: dict[str, str | None] = {}
        self.denied: set[str] = set()
        self.listings: dict[str, list[str]] = {}
        self.existence: dict[str, bool] = {}
        self.commands: dict[str, tuple[list[str], Output | None]] = {}
        self.samples: dict[str, list[tuple[float, str]]] = {}

    @property
    def privileged(self) -> bool:
        return self.inner.privileged

    def read(self, path: str) -> str | None:
        try:
            text = self.inner.read(path)
        except Denied:
            self.denied.add(path)
            raise
        self.files[path] = text
        return text

    def exists(self, path: str) -> bool:
        found = self.inner.exists(path)
        self.existence[path] = found
        return found

    def listdir(self, path: str) -> list[str]:
        entries = self.inner.listdir(path)
        self.listings[path] = entries
        return entries

    def command(self, name: str, argv: Sequence[str]) -> Output | None:
        out = self.inner.command(name, argv)
        self.commands[name] = (list(argv), out)
        return out

    def sample(self, path: str, seconds: float) -> list[tuple[float, str]]:
        snaps = self.inner.sample(path, seconds)
        self.samples[path] = snaps
        if snaps:
            self.files.setdefault(path, snaps[0][1])
        return snaps


def _tree_path(root: Path, path: str) -> Path:
    rel = os.path.normpath(path).lstrip("/")
    if rel.startswith(".."):
        raise BadInput(f"path {path!r} leaves the captured tree")
    return root / rel


class CapturedTree(Source):
    """A tree written by `offlab doctor --capture` (see docs/doctor.md for the layout)."""

    kind = "capture"

    def __init__(self, root: Path, manifest: dict) -> None:
        self.root = root
        self.manifest = manifest
        self.label = str(manifest.get("host", {}).get("name") or root.name)
        self.netns = manifest.get("host", {}).get("netns")
        self._commands = manifest.get("commands", {})
        self._denied = set(manifest.get("denied", []))

    @property
    def privileged(self) -> bool:
        """As the capture was taken: a capture by a non-root user lacks what only root sees."""
        return bool(self.manifest.get("privileged", True))

    def read(self, path: str) -> str | None:
        if path in self._denied:
            raise Denied(path)
        p = _tree_path(self.root, path)
        try:
            return p.read_text(errors="replace") if p.is_file() else None
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return _tree_path(self.root, path).exists()

    def listdir(self, path: str) -> list[str]:
        p = _tree_path(self.root, path)
        return sorted(os.listdir(p)) if p.is_dir() else []

    def command(self, name: str, argv: Sequence[str]) -> Output | None:
        entry = self._commands.get(name, {})
        path = self.root / "commands" / name
        if entry.get("missing") or (not entry and not path.is_file()):
            return None
        stdout = path.read_text(errors="replace") if path.is_file() else ""
        return Output(stdout, int(entry.get("rc", 0)), entry.get("stderr", ""))

    def sample(self, path: str, seconds: float) -> list[tuple[float, str]]:
        entry = self.manifest.get("samples", {}).get(path)
        if entry:
            snaps = []
            for t, rel in zip(entry["times"], entry["files"], strict=True):
                snaps.append((float(t), (self.root / rel).read_text()))
            return snaps
        text = self.read(path)
        return [(0.0, text)] if text is not None else []


class SosReport(Source):
    """A sosreport as sos writes it: proc/ and sys/ copies, `sos_commands/<plugin>/<command>`, top symlinks.

    Much of /proc and /sys is not collected; the facts are then read from command
    outputs: /proc/sys values from `kernel/sysctl_-a`, the kernel release from
    `proc/version` or `kernel/uname_-a`, the host name from `hostname`. Every file
    answered from is `note`d, relative to the root, so a finding can name it.
    """

    kind = "sosreport"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sysctl: dict[str, str] | None = None
        self._codes = self._manifest_codes()
        self.label = self._hostname() or root.name

    def _text(self, rel: str) -> str | None:
        p = self.root / rel
        try:
            if not p.is_file():
                return None
            text = p.read_text(errors="replace")
        except OSError:
            return None
        self.note(rel)
        return text

    def _manifest_codes(self) -> dict[str, int]:
        """{"sos_commands/plugin/name": exit code} from sos 4's manifest; {} without one."""
        try:
            data = json.loads((self.root / SOS_MANIFEST).read_text(errors="replace"))
        except (OSError, ValueError):
            return {}  # sos 3 writes none, and without it only failed commands' exit codes are unknown
        codes: dict[str, int] = {}
        stack = [data]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                path, rc = node.get("filepath"), node.get("return_code")
                if isinstance(path, str) and isinstance(rc, int):
                    codes[path] = rc
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return codes

    def _hostname(self) -> str | None:
        for rel in ("hostname", "sos_commands/host/hostname"):
            text = self._text(rel)
            words = text.split() if text else []
            if words and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}", words[0]):
                return words[0]
        return None

    def _release(self) -> str | None:
        """The kernel release: proc/version (sos copies it on ppc only), else `uname -a`."""
        # "Linux version RELEASE (builder) ..." and "Linux HOSTNAME RELEASE #1 SMP ...": the third word
        for rel, second in (("proc/version", "version"), ("sos_commands/kernel/uname_-a", None), ("uname", None)):
            text = self._text(rel)
            words = text.split() if text else []
            if (len(words) > 2 and words[0] == "Linux" and (second is None or words[1] == second)
                    and re.match(r"\d+\.\d+", words[2])):
                return words[2]
        return None

    def _sysctls(self) -> dict[str, str]:
        if self._sysctl is None:
            self._sysctl = {}
            for line in (self._text(SYSCTL_A) or "").splitlines():
                key, sep, value = line.partition(" = ")
                if sep:
                    self._sysctl[key.strip()] = value.strip()
        elif self._sysctl:
            self.note(SYSCTL_A)
        return self._sysctl

    def read(self, path: str) -> str | None:
        text = self._text(str(_tree_path(self.root, path).relative_to(self.root)))
        if text is not None:
            return text
        if path == "/proc/sys/kernel/osrelease":
            release = self._release()
            if release:
                return release + "\n"
        if path == "/proc/sys/kernel/hostname":
            name = self._hostname()
            if name:
                return name + "\n"
        if path.startswith("/proc/sys/"):
            # sysctl prints a '.' inside a name (vlan ifaces: eth0.100) as '/'
            key = ".".join(part.replace(".", "/") for part in path[len("/proc/sys/"):].split("/"))
            value = self._sysctls().get(key)
            if value is not None:
                return value + "\n"
        return None

    def exists(self, path: str) -> bool:
        return _tree_path(self.root, path).exists() or self.read(path) is not None

    def covers(self, path: str) -> bool:
        return self.exists(path)

    @property
    def collected(self) -> str | None:
        """`date` as sos ran it (date plugin), else timedatectl's local time (the top `date` symlink)."""
        for rel in ("sos_commands/date/date", "date", "sos_commands/systemd/timedatectl"):
            for line in (self._text(rel) or "").splitlines():
                line = line.strip()
                if line.startswith("Local time:"):
                    return line.partition(":")[2].strip()
                if re.match(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d ", line):
                    return line
        return None

    def listdir(self, path: str) -> list[str]:
        p = _tree_path(self.root, path)
        try:
            return sorted(os.listdir(p)) if p.is_dir() else []
        except OSError:
            return []

    def command(self, name: str, argv: Sequence[str]) -> Output | None:
        """`sos_commands/*/NAME`; its exit code from sos's manifest (sos keeps a failed command's output)."""
        for p in sorted(self.root.glob(f"sos_commands/*/{glob_escape(name)}")):
            rel = str(p.relative_to(self.root))
            text = self._text(rel)
            if text is not None:
                return Output(text, self._codes.get(rel, 0))
        return None

    def sample(self, path: str, seconds: float) -> list[tuple[float, str]]:
        text = self.read(path)
        return [(0.0, text)] if text is not None else []


def glob_escape(name: str) -> str:
    """A file name made literal for Path.glob."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def open_root(directory: str | Path) -> Source:
    """An offlab capture or a sosreport at `directory`; a clear error for anything else."""
    root = Path(directory)
    unreadable = EnvironmentProblem(f"--root {root}: not readable by this user (run as its owner or root)")
    try:
        if not root.exists():
            raise BadInput(f"--root {root}: no such directory")
        if not root.is_dir():
            raise BadInput(f"--root {root}: not a directory")
        if not os.access(root, os.R_OK | os.X_OK):
            raise unreadable
        manifest_path = root / MANIFEST
        has_manifest = manifest_path.is_file()
    except PermissionError:
        raise unreadable from None
    if has_manifest:
        try:
            manifest = json.loads(manifest_path.read_text())
        except PermissionError:
            raise unreadable from None
        except (OSError, ValueError) as exc:
            raise BadInput(f"--root {root}: {MANIFEST} is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != CAPTURE_FORMAT:
            raise BadInput(f"--root {root}: {MANIFEST} is not an {CAPTURE_FORMAT} manifest")
        return CapturedTree(root, manifest)
    if (root / "sos_commands").is_dir() or (root / "sos_reports").is_dir():
        # A partial sosreport is normal (plugins skipped, sysfs left out); one with nothing to read is not.
        if not (root / "proc").is_dir() and not any(p.is_file() for p in root.glob("sos_commands/*/*")):
            raise BadInput(
                f"--root {root}: malformed sosreport (neither proc/ nor any sos_commands/PLUGIN/ output; "
                "extract the whole tarball: tar xf sosreport-*.tar.xz)"
            )
        return SosReport(root)
    raise BadInput(
        f"--root {root}: neither an offlab capture ({MANIFEST}) nor a sosreport (sos_commands/)"
    )
