"""`lab up hosts`: a lab over two machines that already exist, one test interface each.

    client (SSH host A, port IF) ─ the user's own cable or switch ─ server (SSH host B, port IF)

Nothing is created: the lab records the two hosts (their SSH reference), their test interfaces and
addresses, and refuses a port it must not touch — the one carrying the default route or the SSH
session (changing its offloads or MTU could cut the user off), a test address that is the SSH
address (unless the inventory allows management traffic), a port that does not exist, two ends with
one address. Knobs change through the journal as in any lab (and on the host too, see
knobs/undo.py); `lab down` removes nothing of the hosts, only what offlab copied there (its engine).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import platform
import sys
from dataclasses import dataclass

from offlab import inventory as inv_mod
from offlab import netdev
from offlab.catalog import HOSTS
from offlab.errors import BadInput, CommandFailed, EnvironmentProblem, OfflabError
from offlab.hosts import remote_journal, which
from offlab.hosts.ssh import SshHost, at_once
from offlab.lab.model import HostEntry, Interface, LabState

ENGINE = "offlab-engine"

# One round trip per host: what the refusal rules and the lab need to know.
_PROBE = ('echo @arch; uname -m; echo @uid; id -u; echo @ssh; echo "$SSH_CONNECTION"; '
          'echo @engine; command -v offlab-engine || true; '
          'echo @addr; ip -j addr show; echo; echo @route4; ip -j -4 route show default; echo; '
          'echo @route6; ip -j -6 route show default; echo; echo @end')  # `ip -j` ends without a newline


@dataclass
class Facts:
    arch: str
    uid: int
    ssh_server_ip: str | None  # the host's own end of this SSH session (SSH_CONNECTION), if known
    engine: str | None
    links: dict[str, netdev.Link]  # ifname → its link and addresses
    default_devs: set[str]


def _sections(text: str) -> dict[str, str]:
    """A batch's output cut at its `@name` lines → {name: what the commands after it printed}."""
    parts: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("@") and line[1:].isalnum():
            key = line[1:]
            parts[key] = ""
        elif key is not None:
            parts[key] += line + "\n"
    return parts


def probe(host: SshHost) -> Facts:
    """What the host says about itself; EnvironmentProblem naming the host when it cannot say."""
    res = host.run(["sh", "-c", _PROBE], timeout=30)
    parts = _sections(res.stdout)
    if "end" not in parts:
        raise EnvironmentProblem(f"host {host.name}: could not read its interfaces and routes "
                                 f"(is iproute2 installed there?): {res.stderr.strip()[:200]}")
    try:
        links = {l.ifname: l for l in netdev.parse_links(parts["addr"])}
        routes = [*netdev.parse_routes(parts["route4"]), *netdev.parse_routes(parts["route6"])]
    except ValueError:
        raise EnvironmentProblem(f"host {host.name}: `ip -j` gave no JSON: iproute2 there is too old "
                                 f"(needs 4.14+)") from None
    ssh = parts.get("ssh", "").split()
    return Facts(arch=parts.get("arch", "").strip(), uid=int(parts.get("uid", "").strip() or -1),
                 ssh_server_ip=ssh[2] if len(ssh) >= 3 else None,
                 engine=parts.get("engine", "").strip() or None, links=links,
                 default_devs={r.dev for r in routes if r.dev})


def _global_addresses(link: netdev.Link) -> list[str]:
    return [a.cidr for a in link.addrs if a.scope == "global"]


def _ip(text: str | None) -> str | None:
    try:
        return str(ipaddress.ip_address((text or "").split("%")[0]))
    except ValueError:
        return None


def check_end(role: str, ih: inv_mod.InventoryHost, iface: str, facts: Facts, allow_management: bool) -> list[str]:
    """The test addresses of one end, or the one-line refusal (BadInput: the request; EnvironmentProblem: the host)."""
    where = f"host {ih.name} ({role})"
    if facts.uid != 0 and not ih.become:
        raise EnvironmentProblem(f"{where}: logged in as uid {facts.uid} without sudo: offlab changes settings "
                                 f"as root; set `sudo: true` (ansible_become) or log in as root")
    if iface not in facts.links:
        names = ", ".join(n for n in facts.links if n != "lo") or "none"
        raise BadInput(f"{where}: no interface {iface!r} (it has: {names})")
    link = facts.links[iface]
    if iface in facts.default_devs:
        raise BadInput(f"{where}: {iface} carries the default route: changing its offloads or MTU could cut "
                       f"you off from {ih.name}; choose a test port that does not")
    configured = _global_addresses(link)
    configured_ips = {str(ipaddress.ip_interface(a).ip) for a in configured}
    mgmt = {ip for ip in (_ip(facts.ssh_server_ip), _ip(ih.target)) if ip}
    if mgmt & configured_ips and not (allow_management or ih.allow_management_traffic):
        raise BadInput(f"{where}: {iface} carries the SSH session ({', '.join(sorted(mgmt & configured_ips))}): "
                       f"tests on it could cut you off; choose another port, or set allow_management_traffic: "
                       f"true (--allow-management-traffic) if you mean it")
    declared = ih.interface(iface)
    if declared is not None and declared.addresses:
        missing = [a for a in declared.ips() if a not in configured_ips]
        if missing:
            raise EnvironmentProblem(f"{where}: {iface}: declared address {missing[0]} is not configured there "
                                     f"(it has {', '.join(configured) or 'none'}): `ip addr add "
                                     f"{missing[0]}/PREFIX dev {iface}` on {ih.name}, or fix the inventory")
        ips = declared.ips()
    else:
        ips = [str(ipaddress.ip_interface(a).ip) for a in configured]
    if not ips:
        raise EnvironmentProblem(f"{where}: {iface} has no IP address: add one (`ip addr add ADDR/24 dev {iface}` "
                                 f"on {ih.name}) or declare it in the inventory")
    if mgmt & set(ips) and not (allow_management or ih.allow_management_traffic):
        raise BadInput(f"{where}: {iface}: test address {sorted(mgmt & set(ips))[0]} is the SSH address: "
                       f"traffic would share the management link; set allow_management_traffic: true "
                       f"(--allow-management-traffic) if you mean it")
    return ips


def plan_ends(inv: inv_mod.Inventory, pair: str | None) -> list[tuple[inv_mod.InventoryHost, str]]:
    """The (host, port) of client and server: --pair, else the inventory's first pair."""
    text = pair if pair is not None else inv_mod.pairs_of(inv)[0]
    return inv_mod.parse_pair(text, inv)


def build(lab: LabState, inv: inv_mod.Inventory, pair: str | None, allow_management: bool = False) -> None:
    """Fill `lab` (already claimed) from the hosts; copy the engine where it is missing."""
    ends = plan_ends(inv, pair)
    lab.options.update({"inventory": os.path.abspath(inv.source), "pair": ",".join(f"{h.name}:{i}" for h, i in ends)})
    found: dict[str, tuple[inv_mod.InventoryHost, SshHost, str, Facts, list[str]]] = {}
    for role, (ih, iface) in zip(("client", "server"), ends, strict=True):
        lab.step = f"probe {ih.name}"
        host = ih.ssh_host()
        facts = probe(host)
        ips = check_end(role, ih, iface, facts, allow_management)
        found[role] = (ih, host, iface, facts, ips)
    shared = set(found["client"][4]) & set(found["server"][4])
    if shared:
        raise BadInput(f"both ends have address {sorted(shared)[0]}: client {found['client'][0].name}:"
                       f"{found['client'][2]} and server {found['server'][0].name}:{found['server'][2]}")
    for role, (ih, host, iface, facts, ips) in found.items():
        peer = "server" if role == "client" else "client"
        v4 = next((a for a in ips if ipaddress.ip_address(a).version == 4), None)
        v6 = next((a for a in ips if ipaddress.ip_address(a).version == 6), None)
        # In the lab before anything is put on the host: a `lab up` that fails or is interrupted from
        # here on has its teardown reach this host too.
        lab.hosts[role] = HostEntry(netns=None, address=v4 or v6, address6=v6,
                                    interfaces=[Interface(iface, "nic", peer_host=peer, role="test")],
                                    ref=host.ref())
        lab.save()
        lab.step = f"engine on {ih.name}"
        if facts.engine is None:
            lab.hosts[role].ref = copy_engine(lab, role, host, facts).ref()
            lab.save()


def copy_engine(lab: LabState, role: str, host: SshHost, facts: Facts) -> SshHost:
    """Copy our offlab-engine into the host's private directory (journalled there first); the host
    from then on runs that copy. Same architecture only; else the host keeps what it has (nothing)."""
    if facts.arch != platform.machine():
        return host  # a measurement with the engine then says it is missing there; iperf3 still works
    local = _local_engine()
    if local is None:
        return host
    bindir = f"{host.remote_dir}/engine-{lab.name}"
    target = f"{bindir}/{ENGINE}"
    # In the lab's state before the host's journal has it (a signal between the two would leave a record
    # that `lab down` does not know to remove: its removal is harmless when the record never came), and
    # journalled on the host before it is copied, so the host's restore.sh removes it after a crash.
    lab.options.setdefault("copied", {})[role] = bindir
    lab.save()
    remote_journal.record(host, host.remote_dir, f"lab-{lab.name}-{role}-engine", f"remove {bindir}",
                          [["rm", "-rf", "--", bindir]])
    with open(local, "rb") as f:
        data = f.read()
    host.run(["mkdir", "-p", "-m", "0700", bindir], timeout=30)
    host.write(target, data)
    host.run(["chmod", "0700", target], timeout=30)
    return SshHost(**{**{k: v for k, v in host.ref().items() if k != "kind"}, "tools": {ENGINE: target}})


def _local_engine() -> str | None:
    # traffic/engine.py finds it the same way (lab may not import traffic): the checkout's build, venv, PATH.
    built = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "engine", "target", "release", ENGINE)
    for cand in (built, os.path.join(os.path.dirname(sys.executable), ENGINE), which(ENGINE)):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.realpath(cand)
    return None


def teardown(lab: LabState, also: frozenset[int] | set[int] = frozenset()) -> list[str]:
    """`lab down` of a hosts lab: nothing of the hosts is removed; only what offlab put there: the
    processes it started that outlived their offlab process (and those of `also`, the lab's holders
    with --force), then the engine it copied. The hosts are done at once, each on a thread."""
    roles = [role for role, entry in lab.hosts.items() if entry.ref is not None]
    done: dict[str, tuple[list[str], list[str]]] = {}
    at_once([functools.partial(_teardown_host, lab, role, also, done) for role in roles])
    removed = [line for role in roles for line in done[role][0]]
    failed = [line for role in roles for line in done[role][1]]
    if failed:  # the lab's state file stays, so a later `lab down` still knows what to remove
        raise EnvironmentProblem(f"lab down {lab.name}: " + "; ".join(failed))
    return removed


def _teardown_host(lab: LabState, role: str, also: frozenset[int] | set[int],
                   done: dict[str, tuple[list[str], list[str]]]) -> None:
    """One host's part of `teardown`, into done[role]: (lines removed, failures)."""
    from offlab.hosts import lease

    removed: list[str] = []
    failed: list[str] = []
    done[role] = (removed, failed)
    host = lab.host(role)
    try:
        removed += lease.lapses(host, host.remote_dir, remove=True)
        # this process's own too: its samples on the lab are over, and a start a signal cut short left a
        # process that nothing in it holds (RemoteProcess: the start itself is shielded, so it is recorded)
        ended = remote_journal.end_processes(host, host.remote_dir, also={*also, os.getpid()})
        removed += [f"{host.name}: {what}" for what in ended]
    except (EnvironmentProblem, CommandFailed) as exc:
        failed.append(f"processes offlab started on {host.name} may still run ({exc}): `offlab lab down "
                      f"{lab.name}` again once it answers, or `sh {host.remote_dir}/restore.sh` there")
    bindir = (lab.options.get("copied") or {}).get(role)
    if bindir:
        try:
            host.run(["rm", "-rf", "--", bindir], timeout=30)
            remote_journal.forget(host, host.remote_dir, f"lab-{lab.name}-{role}-engine")
            removed.append(f"{host.name}:{bindir} (the engine offlab copied there)")
        except (EnvironmentProblem, CommandFailed) as exc:
            failed.append(f"{bindir} is still on {host.name} ({exc}): `offlab lab down {lab.name}` again once it "
                          f"answers, or `sh {host.remote_dir}/restore.sh` there")
    try:
        remote_journal.tidy(host, host.remote_dir)
    except (EnvironmentProblem, CommandFailed):
        pass  # unreachable: its journal stays there, as it should


def up(name: str, inventory: str, pair: str | None = None, *, allow_management: bool = False) -> LabState:
    """A `hosts` lab named `name` over the inventory's hosts (checked before the lab is claimed)."""
    from offlab.lab import _claim
    from offlab.lab import owner

    inv = inv_mod.load(inventory)
    plan_ends(inv, pair)  # a bad --pair is refused before anything connects
    lab = LabState(name=name, topology=HOSTS, mtu=0, owner=owner.owner_tag()[len(owner.PREFIX):])
    _claim(lab)
    try:
        build(lab, inv, pair, allow_management)
        lab.mtu = _server_mtu(lab)
        lab.status, lab.step = "up", ""
        lab.save()
    except BaseException:
        try:
            teardown(lab)
        except OfflabError:
            pass
        lab.path.unlink(missing_ok=True)
        raise
    return lab


def _server_mtu(lab: LabState) -> int:
    iface = lab.hosts["server"].interfaces[0].name
    return int(netdev.link(lab.host("server"), iface).mtu or 0)


def ssh_hosts_known(extra_refs: list[dict] = ()) -> list[SshHost]:
    """Every SSH host this state directory knows of: those of its `hosts` labs, and `extra_refs` (the
    host references of journal entries), once each."""
    from offlab.hosts import from_ref
    from offlab.lab import list_labs

    refs = [e.ref for lab in list_labs() if lab.topology == HOSTS for e in lab.hosts.values() if e.ref]
    out: dict[tuple, SshHost] = {}
    for ref in [*refs, *extra_refs]:
        if not isinstance(ref, dict) or ref.get("kind") != "ssh":
            continue
        try:
            host = from_ref(ref)
        except OfflabError:
            continue
        out.setdefault((host._key, host.remote_dir), host)
    return list(out.values())


def end_orphans(hosts: list[SshHost], *, force: bool = False, list_only: bool = False) -> tuple[list[str], list[str]]:
    """`offlab restore`: end on each host the processes offlab started there whose offlab process is
    gone (every one of this machine's, with `force`); (lines, failures). `list_only`: only say which."""
    from offlab.hosts import lease

    lines, failed = [], []
    for host in hosts:
        try:
            lines += lease.lapses(host, host.remote_dir, remove=not list_only)
            found = remote_journal.end_processes(host, host.remote_dir, force=force, list_only=list_only)
            lines += [f"{'would end' if list_only else 'ended'} on {host.name}: {what}" for what in found]
            if not list_only:
                remote_journal.tidy(host, host.remote_dir)
        except (EnvironmentProblem, CommandFailed) as exc:
            failed.append(f"could not end the processes offlab started on {host.name}: {exc}")
    return lines, failed
