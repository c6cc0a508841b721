"""`from_ref`: the host a JSON `ref()` names, rebuilt in another process (a restore after kill -9);
`remote_machine`: which remote machine it lives on, without rebuilding it.

One table of the kinds of host, each kind's module imported only when a reference of that kind is
followed (a restore of namespaces never loads the SSH or guest code).
"""

from __future__ import annotations

import importlib
from typing import Callable, cast

from offlab.errors import BadInput
from offlab.hosts.base import Host

# kind → the module whose `from_ref(ref)` rebuilds it
KINDS = {
    "local": "offlab.hosts.local",
    "netns": "offlab.hosts.local",
    "ssh": "offlab.hosts.ssh",
    "guest": "offlab.hosts.guest",
}


def from_ref(ref: object) -> Host:
    """The host a `ref()` names; BadInput for a reference this offlab cannot follow."""
    if not isinstance(ref, dict) or not isinstance(ref.get("kind"), str):
        raise BadInput(f"invalid host reference {ref!r}")
    module = KINDS.get(ref["kind"])
    if module is None:
        raise BadInput(f"unknown kind of host {ref['kind']!r} in a reference (known: {', '.join(sorted(KINDS))})")
    build = cast(Callable[[dict], Host], importlib.import_module(module).from_ref)
    return build(ref)


def remote_machine(ref: object) -> tuple[str, str] | None:
    """The remote machine a `ref()` lives on, by its address (two inventory names of one machine are one
    machine), or None for this machine's own hosts (namespaces, guests it runs)."""
    if isinstance(ref, dict) and ref.get("kind") == "ssh":
        return ("ssh", str(ref.get("target")))
    return None
