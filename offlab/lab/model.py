"""What a lab is, as written to its state file."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from offlab.catalog import TOPOLOGIES
from offlab.errors import BadInput
from offlab.hosts import Host, NetnsHost, from_ref
from offlab.names import check_lab_name
from offlab.state import read_state_json, state_dir, write_json_atomic

# The kinds of interface that join a host to a neighbour: with one of them a host needs no interface named.
UPLINK_KINDS = ("veth", "virtio-net", "tap", "nic")  # nic: an existing machine's test port (`hosts` labs)


@dataclass
class Interface:
    name: str
    kind: str  # veth | bridge | vxlan | ovs-internal
    peer_host: str | None = None  # the host at the other end of a veth
    role: str = ""  # e.g. "underlay", "overlay", "port"


@dataclass
class HostEntry:
    netns: str | None  # None for a host that is not a namespace of this machine (a guest, an SSH host)
    address: str | None = None  # the address the other end uses to reach this host
    address6: str | None = None
    interfaces: list[Interface] = field(default_factory=list)
    ref: dict | None = None  # `Host.ref()` of a guest or SSH host; None for a namespace
    # A QEMU guest: its GuestHost ref plus how it runs (accel, QEMU version, kernel, NIC properties);
    # `netns` is then the namespace its QEMU runs in.
    guest: dict | None = None

    def iface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)


@dataclass
class Daemon:
    name: str
    pid: int
    netns: str | None
    start_time: int | None = None  # clock ticks since boot (/proc/PID/stat): a reused pid is not ours
    runtime_dir: str | None = None  # dpdk-testpmd: its /var/run/dpdk/<prefix>, removed after it stops if ours


@dataclass
class Adjustment:
    """A setting the lab itself chose for an interface it made, and why."""

    host: str
    iface: str
    setting: str
    value: str
    why: str


@dataclass
class LabState:
    name: str
    topology: str
    mtu: int
    ipv6: bool = False
    options: dict = field(default_factory=dict)
    status: str = "building"  # building | up | failed
    created_at: float = field(default_factory=time.time)
    step: str = ""
    namespaces: list[str] = field(default_factory=list)
    hosts: dict[str, HostEntry] = field(default_factory=dict)
    daemons: list[Daemon] = field(default_factory=list)
    rundir: str | None = None
    adjustments: list[Adjustment] = field(default_factory=list)
    owner: str = ""  # the state directory that made it (see lab/owner.py)
    netns_inodes: dict[str, int] = field(default_factory=dict)  # namespace → its nsfs inode, once made
    builder: dict = field(default_factory=dict)  # {"pid", "start_time"} of the `lab up` that builds it
    # `phys`: each port as it was before the lab took it (lab/phys.py), recorded before it moves.
    ports: list[dict] = field(default_factory=list)

    # ---- persistence -------------------------------------------------
    @staticmethod
    def path_for(name: str) -> Path:
        return state_dir() / "labs" / f"{name}.json"

    @property
    def path(self) -> Path:
        return self.path_for(self.name)

    def save(self) -> None:
        write_json_atomic(self.path, asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> "LabState":
        hosts = {
            role: HostEntry(
                netns=h["netns"],
                address=h.get("address"),
                address6=h.get("address6"),
                interfaces=[Interface(**i) for i in h.get("interfaces", [])],
                ref=h.get("ref"),
                guest=h.get("guest"),
            )
            for role, h in d.get("hosts", {}).items()
        }
        return cls(
            name=d["name"],
            topology=d["topology"],
            mtu=d["mtu"],
            ipv6=d.get("ipv6", False),
            options=d.get("options", {}),
            status=d.get("status", "up"),
            created_at=d.get("created_at", 0.0),
            step=d.get("step", ""),
            namespaces=list(d.get("namespaces", [])),
            hosts=hosts,
            daemons=[Daemon(**p) for p in d.get("daemons", [])],
            rundir=d.get("rundir"),
            adjustments=[Adjustment(**a) for a in d.get("adjustments", [])],
            owner=d.get("owner", ""),
            netns_inodes={str(k): int(v) for k, v in d.get("netns_inodes", {}).items()},
            builder=dict(d.get("builder") or {}),
            ports=[dict(p) for p in d.get("ports", [])],
        )

    @classmethod
    def load(cls, name: str) -> "LabState":
        check_lab_name(name)
        path = cls.path_for(name)
        if not path.exists():
            raise BadInput(f"no lab named {name!r}: `offlab lab list` shows the labs that exist")
        repair = f"offlab lab down --force {name}"
        data = read_state_json(path, repair)
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadInput(f"state file {path} is incomplete ({type(exc).__name__}: {exc}): "
                           f"`{repair}` repairs it") from None

    # ---- lookups -----------------------------------------------------
    def host(self, role: str) -> Host:
        entry = self.entry(role)
        ref = entry.ref or (entry.guest or {}).get("ref")
        if ref is not None:
            return from_ref(ref)
        return NetnsHost(entry.netns)  # type: ignore[arg-type]

    def entry(self, role: str) -> HostEntry:
        if role not in self.hosts:
            known = ", ".join(self.hosts)
            raise BadInput(f"lab {self.name!r} has no host {role!r}; its hosts are: {known}")
        return self.hosts[role]

    @property
    def has_ovs(self) -> bool:
        """Whether the lab runs an Open vSwitch of its own, whose switch settings go through ovs-vsctl."""
        record = TOPOLOGIES.get(self.topology)
        return bool(record and record.ovs)

    @property
    def has_testpmd(self) -> bool:
        """Whether the lab's switch is a dpdk-testpmd (its port counters are probes, `testpmd.*` knobs)."""
        record = TOPOLOGIES.get(self.topology)
        return bool(record and record.testpmd)

    def resolve_iface(self, role: str, ref: str | None = None) -> str:
        """Interface of `role` named by `ref`: a real name, `to-<host>`, or None for the only uplink.

        `to-server` names the veth that faces the server, so plans read the same whatever
        the lab is called.
        """
        entry = self.entry(role)
        if ref is None:
            veths = [i for i in entry.interfaces if i.kind in UPLINK_KINDS]
            if len(veths) == 1:
                return veths[0].name
            names = ", ".join(i.name for i in entry.interfaces)
            faces = ", ".join(f"to-{i.peer_host}" for i in veths if i.peer_host)
            raise BadInput(
                f"host {role!r} of lab {self.name!r} has several interfaces ({names}): "
                f"name one, e.g. {role}:{faces.split(', ')[0] if faces else names.split(', ')[0]}"
            )
        if ref.startswith("to-"):
            peer = ref[3:]
            for i in entry.interfaces:
                if i.peer_host == peer:
                    return i.name
        elif entry.iface(ref):
            return ref
        names = ", ".join(i.name for i in entry.interfaces)
        faces = ", ".join(f"to-{i.peer_host}" for i in entry.interfaces if i.peer_host)
        raise BadInput(
            f"host {role!r} of lab {self.name!r} has no interface {ref!r}; "
            f"it has {names}" + (f" (also reachable as {faces})" if faces else "")
        )

    @property
    def client(self) -> Host:
        return self.host("client")

    @property
    def server(self) -> Host:
        return self.host("server")
