"""A plan's `HOST[:IFACE]`, judged before any lab exists from the topology records (catalog.py)."""

from __future__ import annotations

from offlab.catalog import TOPOLOGIES, StaticIface
from offlab.lab.model import UPLINK_KINDS

__all__ = ["HOSTS", "StaticIface", "resolve"]

HOSTS: dict[str, dict[str, tuple[StaticIface, ...]]] = {name: t.hosts for name, t in TOPOLOGIES.items()}


def _names(ifaces: tuple[StaticIface, ...]) -> list[str]:
    return [f"to-{i.peer}" if i.peer and not i.name else i.name or "" for i in ifaces]


def resolve(kind: str, role: str, ref: str | None) -> StaticIface:
    """The interface `role:ref` names in a `kind` lab (ref None: the host's only veth); ValueError says why not."""
    hosts = HOSTS[kind]
    if role not in hosts:
        raise ValueError(f"a {kind} lab has no host {role!r}; its hosts are {', '.join(hosts)}")
    ifaces = hosts[role]
    if ref is None:
        veths = [i for i in ifaces if i.kind in UPLINK_KINDS]
        if len(veths) == 1:
            return veths[0]
        raise ValueError(f"host {role!r} of a {kind} lab has several interfaces ({', '.join(_names(ifaces))}): "
                         f"name one, e.g. {role}:{_names(ifaces)[0]}")
    for i in ifaces:
        if ref == i.name or (ref.startswith("to-") and ref[3:] == i.peer):
            return i
    raise ValueError(f"host {role!r} of a {kind} lab has no interface {ref!r}; it has {', '.join(_names(ifaces))}")
