"""offlab's hist triggers in each lab host with a kernel of its own (a guest, an SSH host) for one
sample (`--trace`): set, then put back.

The guest and the SSH host differ only by how a command reaches them (the agent, the SSH channel):
the triggers are the same journalled setting (knobs/trace_hist.py) in a transaction of their own, put
back when the sample ends, on Ctrl-C/SIGTERM/SIGHUP, and by `offlab restore` after a kill -9 (an SSH
host's own restore.sh too). What they count is read with the host's counters by the probe session
(probes/hist.py).

Hosts on one kernel (SSH stand-ins: sshd in namespaces of one machine; found by their boot id) get the
triggers once, on the first of them: a hist counts the whole kernel, so triggers on each would count
the same skbs once per host. Where a kernel cannot be traced (no tracefs, no hist triggers), one line
naming the host says why and the sample goes on without that host's account: a note, not an error
(`--trace` adds a witness; the sample's own figures do not depend on it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from offlab.errors import OfflabError
from offlab.knobs.trace_hist import KEY
from offlab.knobs.transaction import Change, Transaction

BOOT_ID = "/proc/sys/kernel/random/boot_id"
TRACED_KINDS = ("guest", "ssh")


def kernels(hosts: dict) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({first role: the roles whose kernel it is, itself first}, {role: why its kernel is unknown}):
    hosts are grouped by their boot id; one whose boot id cannot be read is a group of its own."""
    groups: dict[str, list[str]] = {}
    by_boot: dict[str, str] = {}
    unread: dict[str, str] = {}
    for role in sorted(hosts):
        try:
            boot = hosts[role].read(BOOT_ID).strip()
        except (OfflabError, OSError) as exc:
            unread[role] = str(exc)
            boot = ""
        first = by_boot.setdefault(boot, role) if boot else role
        groups.setdefault(first, []).append(role)
    return groups, unread


@contextlib.contextmanager
def triggers(lab, asked: bool) -> Iterator[dict[str, str | None] | None]:
    """role → None where the triggers are set in that host's kernel, else why not (one line); None when
    not asked or the lab has no host with a kernel of its own that offlab can trace."""
    hosts = {role: lab.host(role) for role in lab.hosts} if asked else {}
    hosts = {role: h for role, h in hosts.items() if not h.shares_kernel and h.kind in TRACED_KINDS}
    if not hosts:
        yield None
        return
    groups, _ = kernels(hosts)
    out: dict[str, str | None] = {}
    with Transaction("trace") as tx:
        for first, roles in groups.items():
            host = hosts[first]
            try:
                done = tx.apply([Change(host, KEY, "on")])[0]
                why = None if done.ok else f"{host.name}: hist triggers could not be set ({done.reason})"
            except OfflabError as exc:
                why = f"{host.name}: hist triggers could not be set: {exc}"
            out[first] = why
            for other in roles[1:]:
                one = f"one kernel with {first} ({host.name} and {hosts[other].name} have one boot id)"
                out[other] = f"{one}: not traced either" if why else f"{one}: its drops and skbs are counted under {first}"
        yield out
