"""A probe read at a window's edges: the interface every file in `offlab/probes/edge/` implements.

A probe is one module of `offlab.probes.edge` defining one `Probe` subclass, which holds everything
about it: whether a session wants it, what it reads at each edge (started beside this machine's
counter files when it is a command), the `/proc` files it needs from a host with its own kernel (added
to that host's one read per edge, remote.py) and how it folds them in, its delta over the window, the
key and place it is stored under in a sample's `probes` JSON, and how a reader takes that JSON back as a
typed view (`stored`, read by `offlab.sample.Probes.of`). `found()` lists the probes when a session
starts, by the modules of the package: nothing registers itself as it is imported, and there is no list
of probes to add a line to.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Any, ClassVar

# A probe's place among the keys of the stored `probes` JSON when it does not say: after every key a
# sample had before probes were files of their own (result.py's slots)
LAST = 1000


@dataclass(frozen=True)
class Options:
    """What a session was asked to read beyond its core counters; each probe says from these whether it
    is wanted."""

    big_packets: bool = False  # packets over 64 KiB (the workload's `big_packets`)
    # role → the interfaces whose per-queue packets are read (a sample whose settings are about queues)
    queue_ifaces: dict[str, list[str]] = field(default_factory=dict)


class Probe:
    """One probe of one session. The session calls, in this order: `open()` once; per edge `start()`
    before this machine's counter files are read, `read(started)` at the edge's instant (after
    /proc/stat) and, for each host with its own kernel once its answer came, `remote(...)`; then
    `delta(a, b)` once; `close()` at the end (also after a failed `open`)."""

    key: ClassVar[str] = ""  # its key in a sample's stored `probes` JSON
    slot: ClassVar[int] = LAST  # its key's place among them (result.ProbeResult.stored)
    # /proc files it needs from each host with its own kernel (a guest, an SSH host): read in that host's
    # one request per edge, with its counters (remote.py), and given to `remote` by path
    remote_files: ClassVar[tuple[str, ...]] = ()
    # how a reader takes its stored value back (offlab.sample.Probes.of): a dataclass field as
    # offlab.sample's `_view` makes one (the view type, and the value an absent key reads as)
    stored: ClassVar[dataclasses.Field]

    def __init__(self, session, options: Options) -> None:
        self.session, self.options = session, options
        self.lab = session.lab

    @classmethod
    def wanted(cls, session, options: Options) -> bool:
        """Whether this session reads it (e.g. only where the workload asked, or the lab has testpmd)."""
        return True

    def open(self) -> None:
        """Before the first edge: what the probe sets up (and `close` takes away)."""

    def close(self) -> None:
        """At the session's end, whatever happened."""

    def start(self) -> Any:
        """At an edge, before this machine's counter files are read: a read that is a command is started
        here on a thread (remote.Async), so it runs beside them; what it returns goes to `read`."""
        return None

    def read(self, started: Any) -> Any:
        """At the edge: this edge's reading (`started`: what `start` returned). The probes that started
        nothing are read first, right at the edge's instant; then those that wait for what they started."""
        raise NotImplementedError

    def remote(self, reading: Any, role: str, files: dict[str, str], tc_text: str) -> None:
        """A host with its own kernel answered this edge's read: fold its part into `reading` (`files`:
        `remote_files` by path, `tc_text`: its `tc -s -j qdisc show`)."""

    def delta(self, a: Any, b: Any) -> Any:
        """The window's result from the two edges' readings, as stored; None leaves the key out."""
        raise NotImplementedError


def found(package: str = "offlab.probes.edge") -> list[type[Probe]]:
    """The probes of `package`, one per module, in their stored order: its modules are imported here,
    when a session starts (or a test asks), never as offlab is imported."""
    pkg = importlib.import_module(package)
    out = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package}.{info.name}")
        classes = [c for _, c in inspect.getmembers(module, inspect.isclass)
                   if issubclass(c, Probe) and c is not Probe and c.__module__ == module.__name__]
        if len(classes) != 1:
            raise TypeError(f"{module.__name__}: a probe's module defines one Probe subclass "
                            f"({len(classes)} found)")
        out.append(classes[0])
    return sorted(out, key=lambda c: (c.slot, c.key))
