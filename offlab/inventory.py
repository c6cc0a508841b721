"""Inventories of existing machines: offlab's own YAML, or an Ansible YAML inventory as it is.

offlab's format (docs/remote.md):

    defaults: {user: root, ssh_args: ["-o", "UserKnownHostsFile=~/.ssh/lab_known_hosts"]}
    hosts:
      hv1:
        ssh: 192.0.2.10          # target: a name or an address
        port: 22
        identity_file: ~/.ssh/lab
        sudo: false
        interfaces:
          - {name: ens1f0, addresses: [198.51.100.1/24]}

Ansible's YAML inventory is read with its own rules: groups, nested `children`, `vars` inherited
from `all` down to the host (a child group's vars win over its parent's, host vars over both),
`ansible_host`, `ansible_user`, `ansible_port`, `ansible_ssh_private_key_file`,
`ansible_ssh_common_args`, `ansible_become`; offlab's own settings are `offlab_*` host vars.
Every error names the file, the host and the field.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import yaml

from offlab.errors import BadInput
from offlab.hosts.ssh import (DEFAULT_CONNECT_TIMEOUT, DEFAULT_LEASE, DEFAULT_REMOTE_DIR, REMOTE_PATH_RE, TARGET_RE, USER_RE,
                              SshHost, check_lease, check_ssh_args)
from offlab.names import check_ifname

MAX_BYTES = 1 << 20  # an inventory of thousands of hosts fits; a runaway file does not
MAX_NODES = 200_000  # nodes after expanding aliases: refuses "billion laughs"
HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")
GROUP_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_RANGE_RE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::([0-9]+))?\]")
_MAX_RANGE = 4096


# ---- safe YAML ---------------------------------------------------------------------------------
class _Vault:
    """An `!vault` value: kept only to say offlab cannot read it."""


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!vault", lambda loader, node: _Vault())
_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def load_yaml(path: str | Path) -> object:
    """Safe YAML from a file: SafeLoader, size cap, aliases counted as what they expand to,
    duplicate keys refused (YAML keeps the last silently; a doubled host is a mistake)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"cannot read inventory {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise BadInput(f"{path}: larger than {MAX_BYTES // 1024} KiB: not an inventory")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise BadInput(f"{path}: the inventory is empty")
        _check_nodes(node, str(path))
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BadInput(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node, source: str) -> None:
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else (
            list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_NODES:
                raise BadInput(f"{source}: more than {MAX_NODES} values once aliases are expanded")
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise BadInput(f"{source}:{node.start_mark.line + 1}: an alias refers to its own ancestor")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for k, _ in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in seen:
                        raise BadInput(f"{source}:{k.start_mark.line + 1}: key {k.value!r} appears twice")
                    seen.add(k.value)


# ---- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TestInterface:
    name: str
    addresses: tuple[str, ...] = ()  # "ip/prefix" (or a bare ip): where traffic may go

    def ips(self) -> list[str]:
        return [str(ipaddress.ip_interface(a).ip) for a in self.addresses]


@dataclass(frozen=True)
class InventoryHost:
    name: str
    target: str
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    become: bool = False
    ssh_args: tuple[str, ...] = ()
    ssh_config: str | None = None
    via_netns: str | None = None
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    interfaces: tuple[TestInterface, ...] = ()
    allow_management_traffic: bool = False
    groups: tuple[str, ...] = ()
    remote_dir: str = DEFAULT_REMOTE_DIR
    lease: int = DEFAULT_LEASE

    def ssh_host(self) -> SshHost:
        return SshHost(self.target, user=self.user, port=self.port, identity=self.identity,
                       ssh_args=list(self.ssh_args), become=self.become, config=self.ssh_config,
                       via_netns=self.via_netns, connect_timeout=self.connect_timeout, name=self.name,
                       remote_dir=self.remote_dir, lease=self.lease)

    def interface(self, name: str) -> TestInterface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def to_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "user": self.user, "port": self.port,
                "identity": self.identity, "become": self.become, "ssh_args": list(self.ssh_args),
                "ssh_config": self.ssh_config, "via_netns": self.via_netns,
                "allow_management_traffic": self.allow_management_traffic, "groups": list(self.groups),
                "remote_dir": self.remote_dir, "lease": self.lease,
                "interfaces": [{"name": i.name, "addresses": list(i.addresses)} for i in self.interfaces]}


@dataclass
class Inventory:
    source: str
    format: str  # "offlab" | "ansible"
    hosts: dict[str, InventoryHost] = field(default_factory=dict)
    pairs: list[str] = field(default_factory=list)  # "A:IF,B:IF": the client and server ends `run --inventory` uses

    def host(self, name: str) -> InventoryHost:
        if name not in self.hosts:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise BadInput(f"{self.source}: no host {name!r} in the inventory (hosts: {known})")
        return self.hosts[name]

    def require_interfaces(self, names: Iterable[str] | None = None) -> None:
        """BadInput for the first host (of `names`, or all) that declares no test interface."""
        for name in names if names is not None else self.hosts:
            if not self.host(name).interfaces:
                raise BadInput(f"{self.source}: host {name!r}: no test interface: declare `interfaces:` "
                               f"(offlab_interfaces in an Ansible inventory) or name one with --pair {name}:IFACE")


def load(path: str | Path) -> Inventory:
    """An inventory file, offlab's format or Ansible's (told apart by its shape)."""
    return parse(load_yaml(path), str(path))


def parse(data: object, source: str) -> Inventory:
    if not isinstance(data, dict) or not data:
        raise BadInput(f"{source}: an inventory is a mapping (offlab: `hosts:`; Ansible: groups such as `all:`)")
    if _is_offlab(data):
        inv = _parse_offlab(data, source)
    else:
        inv = _parse_ansible(data, source)
    if not inv.hosts:
        raise BadInput(f"{source}: no hosts in the inventory")
    _check_addresses(inv)
    for n, pair in enumerate(inv.pairs):
        try:
            parse_pair(pair, inv)
        except BadInput as exc:
            raise BadInput(f"{source}: pairs[{n}]: {str(exc).removeprefix('--pair ').replace(source + ': ', '')}") from None
    return inv


def _is_offlab(data: dict) -> bool:
    hosts = data.get("hosts")
    if not set(data) <= {"version", "defaults", "hosts", "pairs"} or not isinstance(hosts, dict):
        return False
    # An Ansible group that happens to be called "hosts" has only hosts/children/vars in it.
    return not (hosts and set(hosts) <= {"hosts", "children", "vars"})


# ---- offlab's format ------------------------------------------------------------------------
_OFFLAB_KEYS = {"ssh", "user", "port", "identity_file", "sudo", "ssh_args", "ssh_config", "via_netns",
                "connect_timeout", "interfaces", "allow_management_traffic", "remote_dir", "lease"}


def _parse_offlab(data: dict, source: str) -> Inventory:
    if data.get("version", 1) != 1:
        raise BadInput(f"{source}: version: {data.get('version')!r} is not one this offlab reads (1)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise BadInput(f"{source}: defaults: must be a mapping")
    bad = set(defaults) - (_OFFLAB_KEYS - {"ssh", "interfaces"})
    if bad:
        raise BadInput(f"{source}: defaults: unknown key {sorted(bad)[0]!r} "
                       f"(known: {', '.join(sorted(_OFFLAB_KEYS - {'ssh', 'interfaces'}))})")
    inv = Inventory(source, "offlab", pairs=_pairs(data.get("pairs"), f"{source}: pairs"))
    for name, entry in data["hosts"].items():
        where = f"{source}: host {name!r}"
        _check_host_name(name, source)
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            raise BadInput(f"{where}: must be a mapping of settings")
        unknown = set(entry) - _OFFLAB_KEYS
        if unknown:
            raise BadInput(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_OFFLAB_KEYS))})")
        v = {**defaults, **entry}
        ssh_args = v.get("ssh_args") or []
        if isinstance(ssh_args, str):
            ssh_args = _split_args(ssh_args, f"{where}: ssh_args")
        inv.hosts[name] = _host(
            name, where, target=v.get("ssh", name), user=v.get("user"), port=v.get("port"),
            identity=v.get("identity_file"), become=_bool(v.get("sudo", False), f"{where}: sudo"),
            ssh_args=ssh_args, ssh_config=v.get("ssh_config"), via_netns=v.get("via_netns"),
            connect_timeout=v.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
            interfaces=_interfaces(v.get("interfaces"), f"{where}: interfaces"),
            allow=_bool(v.get("allow_management_traffic", False), f"{where}: allow_management_traffic"),
            groups=(), remote_dir=v.get("remote_dir", DEFAULT_REMOTE_DIR), lease=v.get("lease", DEFAULT_LEASE))
    return inv


# ---- Ansible's format -------------------------------------------------------------------------
_GROUP_KEYS = {"hosts", "children", "vars"}
_OFFLAB_VARS = {"offlab_interfaces", "offlab_allow_management_traffic", "offlab_ssh_config",
                "offlab_via_netns", "offlab_connect_timeout", "offlab_remote_dir", "offlab_pairs", "offlab_lease",
                # read by the fleet playbook (offlab/fleet/ansible/fleet.yml), not by offlab itself
                "offlab_prefix", "offlab_authorized_keys", "offlab_python"}


@dataclass
class _Group:
    name: str
    vars: dict = field(default_factory=dict)
    hosts: dict[str, list[dict]] = field(default_factory=dict)
    children: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)


def _parse_ansible(data: dict, source: str) -> Inventory:
    groups: dict[str, _Group] = {"all": _Group("all")}
    order: list[str] = []  # hosts in the order first seen, as Ansible lists them

    def group(name: object, body: object, parent: str | None, trail: tuple[str, ...]) -> None:
        if not isinstance(name, str) or not GROUP_RE.fullmatch(name):
            raise BadInput(f"{source}: invalid group name {name!r}")
        if name in trail:
            raise BadInput(f"{source}: group {name!r} is its own descendant ({' → '.join(trail + (name,))})")
        g = groups.setdefault(name, _Group(name))
        if parent is not None and name != "all":
            groups[parent].children.add(name)
            g.parents.add(parent)
        if body is None:
            return
        if not isinstance(body, dict):
            raise BadInput(f"{source}: group {name!r}: must be a mapping with hosts, children or vars")
        unknown = set(body) - _GROUP_KEYS
        if unknown:
            raise BadInput(f"{source}: group {name!r}: unknown key {sorted(unknown)[0]!r} "
                           f"(an Ansible group has hosts, children, vars)")
        gvars = body.get("vars") or {}
        if not isinstance(gvars, dict):
            raise BadInput(f"{source}: group {name!r}: vars: must be a mapping")
        g.vars.update(gvars)
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise BadInput(f"{source}: group {name!r}: hosts: must be a mapping of host names")
        for pattern, hvars in hosts.items():
            if hvars is not None and not isinstance(hvars, dict):
                raise BadInput(f"{source}: host {pattern!r}: its vars must be a mapping")
            for host in _expand(pattern, source):
                g.hosts.setdefault(host, []).append(hvars or {})
                if host not in order:
                    order.append(host)
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise BadInput(f"{source}: group {name!r}: children: must be a mapping of groups")
        for child, child_body in children.items():
            group(child, child_body, name, trail + (name,))

    for name, body in data.items():
        group(name, body, None if name == "all" else "all", ())

    depth = _depths(groups)
    inv = Inventory(source, "ansible", pairs=_pairs(groups["all"].vars.get("offlab_pairs"), f"{source}: all: vars: offlab_pairs"))
    for host in order:
        direct = [g for g in groups.values() if host in g.hosts]
        member: set[str] = set()
        todo = [g.name for g in direct]
        while todo:
            n = todo.pop()
            if n not in member:
                member.add(n)
                todo.extend(groups[n].parents)
        member.add("all")

        def rank(n: str) -> tuple:
            prio = groups[n].vars.get("ansible_group_priority", 1)
            return depth[n], prio if isinstance(prio, int) else 1, n

        merged: dict = {}
        for n in sorted(member, key=rank):
            merged.update(groups[n].vars)
        for g in direct:
            for hvars in g.hosts[host]:
                merged.update(hvars)
        inv.hosts[host] = _ansible_host(host, merged, sorted(member - {"all"}), source)
    return inv


def _depths(groups: dict[str, _Group]) -> dict[str, int]:
    """A group's depth below `all` (its longest path), as Ansible orders variable precedence."""
    depth: dict[str, int] = {}

    def d(n: str, seen: tuple = ()) -> int:
        if n in depth:
            return depth[n]
        parents = groups[n].parents - {n}
        depth[n] = 0 if n == "all" else 1 + max((d(p, seen + (n,)) for p in parents if p not in seen), default=0)
        return depth[n]

    for n in groups:
        d(n)
    return depth


def _expand(pattern: object, source: str) -> list[str]:
    """Ansible host ranges: `web[01:03]` → web01 web02 web03; `db-[a:c]` → db-a db-b db-c."""
    if not isinstance(pattern, str):
        raise BadInput(f"{source}: invalid host name {pattern!r}")
    m = _RANGE_RE.search(pattern)
    if not m:
        _check_host_name(pattern, source)
        return [pattern]
    start, end, stride = m.group(1), m.group(2), int(m.group(3) or 1)
    head, tail = pattern[:m.start()], pattern[m.end():]
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(start), int(end) + 1, max(stride, 1))]
    elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        items = [chr(c) for c in range(ord(start), ord(end) + 1, max(stride, 1))]
    else:
        raise BadInput(f"{source}: host range {pattern!r}: use [01:10] or [a:f]")
    if not items or len(items) > _MAX_RANGE:
        raise BadInput(f"{source}: host range {pattern!r} gives {len(items)} hosts (1..{_MAX_RANGE})")
    out = []
    for item in items:
        out.extend(_expand(head + item + tail, source))
    return out


def _ansible_host(name: str, v: dict, groups: list[str], source: str) -> InventoryHost:
    where = f"{source}: host {name!r}"
    unknown = sorted(k for k in v if isinstance(k, str) and k.startswith("offlab_") and k not in _OFFLAB_VARS)
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r} (offlab reads: {', '.join(sorted(_OFFLAB_VARS))})")

    def get(*keys: str) -> object:
        for k in keys:
            if k in v:
                val = v[k]
                if isinstance(val, _Vault):
                    raise BadInput(f"{where}: {k}: encrypted with ansible-vault: offlab cannot read it")
                if isinstance(val, str) and ("{{" in val or "{%" in val):
                    raise BadInput(f"{where}: {k}: {val!r} is a Jinja template: offlab does not evaluate "
                                   f"templates; give the value itself")
                return val
        return None

    conn = get("ansible_connection")
    if conn not in (None, "ssh", "smart"):
        raise BadInput(f"{where}: ansible_connection: {conn!r}: offlab reaches hosts over ssh only")
    method = get("ansible_become_method")
    if method not in (None, "sudo"):
        raise BadInput(f"{where}: ansible_become_method: {method!r}: offlab uses sudo only")
    become_user = get("ansible_become_user")
    if become_user not in (None, "root"):
        raise BadInput(f"{where}: ansible_become_user: {become_user!r}: offlab needs root")
    port = get("ansible_port", "ansible_ssh_port")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    ssh_args: list[str] = []
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        val = get(key)
        if val is not None:
            if not isinstance(val, str):
                raise BadInput(f"{where}: {key}: must be a string of ssh options")
            ssh_args += _split_args(val, f"{where}: {key}")
    return _host(
        name, where, target=get("ansible_host", "ansible_ssh_host") or name,
        user=get("ansible_user", "ansible_ssh_user"), port=port,
        identity=get("ansible_ssh_private_key_file", "ansible_private_key_file"),
        become=_bool(get("ansible_become") or False, f"{where}: ansible_become"),
        ssh_args=ssh_args, ssh_config=get("offlab_ssh_config"), via_netns=get("offlab_via_netns"),
        connect_timeout=get("offlab_connect_timeout") or DEFAULT_CONNECT_TIMEOUT,
        interfaces=_interfaces(get("offlab_interfaces"), f"{where}: offlab_interfaces"),
        allow=_bool(get("offlab_allow_management_traffic") or False, f"{where}: offlab_allow_management_traffic"),
        groups=tuple(groups), remote_dir=get("offlab_remote_dir") or DEFAULT_REMOTE_DIR,
        lease=_lease_var(get("offlab_lease")))


def _lease_var(value: object) -> object:
    """offlab_lease as Ansible users write it: an int, or digits in a string (what `-e` gives)."""
    if value is None:
        return DEFAULT_LEASE
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


# ---- shared checks ----------------------------------------------------------------------------------
def _host(name: str, where: str, *, target: object, user: object, port: object, identity: object,
          become: bool, ssh_args: object, ssh_config: object, via_netns: object, connect_timeout: object,
          interfaces: tuple[TestInterface, ...], allow: bool, groups: tuple[str, ...],
          remote_dir: object = DEFAULT_REMOTE_DIR, lease: object = DEFAULT_LEASE) -> InventoryHost:
    if not isinstance(target, str) or not TARGET_RE.fullmatch(target):
        raise BadInput(f"{where}: ssh target {target!r} is not a host name or an address")
    if user is not None and (not isinstance(user, str) or not USER_RE.fullmatch(user)):
        raise BadInput(f"{where}: user {user!r} is not a user name")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise BadInput(f"{where}: port {port!r}: must be 1..65535")
    for what, val in (("identity file", identity), ("ssh_config", ssh_config)):
        if val is not None and (not isinstance(val, str) or not val or "\n" in val):
            raise BadInput(f"{where}: {what} {val!r} is not a path")
    if via_netns is not None and (not isinstance(via_netns, str) or not GROUP_RE.fullmatch(via_netns)):
        raise BadInput(f"{where}: via_netns {via_netns!r} is not a namespace name")
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int) or not 1 <= connect_timeout <= 600:
        raise BadInput(f"{where}: connect_timeout {connect_timeout!r}: seconds, 1..600")
    if not isinstance(ssh_args, list) or not all(isinstance(a, str) for a in ssh_args):
        raise BadInput(f"{where}: ssh_args: a list of strings (or one string of options)")
    check_ssh_args(ssh_args, f"{where}: ssh_args")
    if not isinstance(remote_dir, str) or not REMOTE_PATH_RE.fullmatch(remote_dir) or "/../" in remote_dir + "/":
        raise BadInput(f"{where}: remote_dir {remote_dir!r}: an absolute path (default {DEFAULT_REMOTE_DIR})")
    check_lease(lease, f"{where}: lease")
    if allow is False:
        mgmt = _ip(target)
        for iface in interfaces:
            if mgmt is not None and mgmt in iface.ips():
                raise BadInput(f"{where}: interface {iface.name!r}: test address {mgmt} is the SSH address: "
                               f"traffic would share the management link; set allow_management_traffic: true "
                               f"if you mean it")
    return InventoryHost(name, target, user, port, identity, become, tuple(ssh_args), ssh_config, via_netns,
                         connect_timeout, interfaces, allow, groups, remote_dir, lease)


def _pairs(value: object, where: str) -> list[str]:
    """`pairs:`: a list of "CLIENT:IF,SERVER:IF" (checked against the hosts once they are read)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise BadInput(f"{where}: a list such as [\"left:ens1f0,right:ens1f0\"]")
    if len(set(value)) != len(value):
        raise BadInput(f"{where}: a pair is listed twice")
    return list(value)


def _interfaces(value: object, where: str) -> tuple[TestInterface, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadInput(f"{where}: a list of {{name, addresses}}")
    out = []
    for n, item in enumerate(value):
        here = f"{where}[{n}]"
        if not isinstance(item, dict):
            raise BadInput(f"{here}: a mapping with name and addresses")
        unknown = set(item) - {"name", "addresses"}
        if unknown:
            raise BadInput(f"{here}: unknown key {sorted(unknown)[0]!r} (known: addresses, name)")
        try:
            name = check_ifname(item.get("name"))
        except BadInput as exc:
            raise BadInput(f"{here}: name: {exc}") from None
        addrs = item.get("addresses") or []
        if isinstance(addrs, str):
            addrs = [addrs]
        if not isinstance(addrs, list):
            raise BadInput(f"{here}: addresses: a list such as [198.51.100.1/24]")
        for a in addrs:
            try:
                ipaddress.ip_interface(a)
            except (ValueError, TypeError):
                raise BadInput(f"{here}: addresses: {a!r} is not an IP address (e.g. 198.51.100.1/24)") from None
        if any(i.name == name for i in out):
            raise BadInput(f"{here}: interface {name!r} is listed twice")
        out.append(TestInterface(name, tuple(str(a) for a in addrs)))
    return tuple(out)


def _check_addresses(inv: Inventory) -> None:
    seen: dict[str, str] = {}
    for host in inv.hosts.values():
        for iface in host.interfaces:
            for ip in iface.ips():
                here = f"{host.name}:{iface.name}"
                if ip in seen:
                    raise BadInput(f"{inv.source}: host {host.name!r}: interface {iface.name!r}: address {ip} "
                                   f"is also declared by {seen[ip]}: each test address must be unique")
                seen[ip] = here


def _ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text.split("%")[0]))
    except ValueError:
        return None


def _bool(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("yes", "true", "on", "1", "no", "false", "off", "0"):
        return value.lower() in ("yes", "true", "on", "1")
    if value in (0, 1):
        return bool(value)
    raise BadInput(f"{where}: {value!r} is not true or false")


def _split_args(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"{where}: {exc}") from None


def _check_host_name(name: object, source: str) -> None:
    if not isinstance(name, str) or not HOST_RE.fullmatch(name):
        raise BadInput(f"{source}: invalid host name {name!r}: letters, digits and _ . : - only")


# ---- --pair HOST:IF,HOST:IF ------------------------------------------------------------------------------
def parse_pair(text: str, inv: Inventory) -> list[tuple[InventoryHost, str]]:
    """`--pair A:IF,B:IF` → [(host A, IF), (host B, IF)], checked before anything connects."""
    if not isinstance(text, str):
        raise BadInput("--pair: expected HOST:IFACE,HOST:IFACE")
    parts = text.split(",")
    if len(parts) != 2:
        raise BadInput(f"--pair {text!r}: expected two ends, HOST:IFACE,HOST:IFACE")
    out = []
    for part in parts:
        host, sep, iface = part.rpartition(":")
        if not sep or not host:
            raise BadInput(f"--pair {text!r}: {part!r} is not HOST:IFACE")
        try:
            check_ifname(iface)
        except BadInput as exc:
            raise BadInput(f"--pair: {exc}") from None
        out.append((inv.host(host), iface))
    if out[0][0].name == out[1][0].name and out[0][1] == out[1][1]:
        raise BadInput(f"--pair {text!r}: both ends are the same interface")
    return out


def pairs_of(inv: Inventory) -> list[str]:
    """The host pairs of an inventory: its `pairs:`, else its two hosts when each has one test interface."""
    if inv.pairs:
        return list(inv.pairs)
    hosts = list(inv.hosts.values())
    if len(hosts) == 2 and all(len(h.interfaces) == 1 for h in hosts):
        return [f"{hosts[0].name}:{hosts[0].interfaces[0].name},{hosts[1].name}:{hosts[1].interfaces[0].name}"]
    raise BadInput(f"{inv.source}: which hosts face each other? declare `pairs: [\"A:IF,B:IF\"]` "
                   f"(offlab_pairs in an Ansible inventory's all: vars) or give --pair A:IF,B:IF")
