"""`lab up phys`: two ports of this machine (two NIC ports cabled to each other) lent to a lab.

    [client: IF1] ─ the user's own cable ─ [server: IF2]

Each port is recorded in the lab file before anything changes (name, ifindex, altnames, MAC,
MTU, up/down, addresses, the ethtool features offlab may change, routes through it, its
net.ipv4/6.conf.IF.* sysctls, master, namespace), then moved
into the lab's `client` / `server` namespace under its own name and addressed like every other
lab. `give_back` moves it to this machine's namespace and puts every recorded value back; it runs
before any namespace is removed, on every path (lab down, a failed or killed lab up, restore):
removing a namespace would return a physical port on its own but destroy a veth with its peer.

A port is refused, before anything changes, when it is loopback, not in this namespace, a
bridge/bond member, in another lab, or carries the default route or an established connection
(moving it would cut the user off). eth0 of a machine one works on carries the default route.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
from typing import Iterator

from offlab import netdev
from offlab.addresses import CLIENT4, CLIENT6, SERVER4, SERVER6
from offlab.errors import BadInput, CommandFailed, EnvironmentProblem, OfflabError
from offlab.hosts import LOCAL, Host, NetnsHost, netns_exists, require_tool
from offlab.lab.build import Builder
from offlab.lab.model import Interface, LabState
from offlab.names import check_ifname

# One `lab up phys` at a time checks and moves ports (any state directory): two cannot take one port.
LOCK = "/run/lock/offlab-phys.lock"


# ---- the refusals, before anything changes ------------------------------------------------
def check_ports(ports: object, lab_name: str) -> list[str]:
    """The two port names, or BadInput naming the port and the fix."""
    if not isinstance(ports, (list, tuple)) or len(ports) != 2:
        raise BadInput("lab up phys needs --ports IF1,IF2: two ports of this machine cabled to each other")
    names = [check_ifname(p, "--ports port") for p in ports]
    if names[0] == names[1]:
        raise BadInput(f"--ports names {names[0]} twice: give two different ports (client,server)")
    links = {l.ifname: l for l in netdev.links(LOCAL)}
    busy = _default_route_devs()
    conns = _established()
    for name in names:
        link = links.get(name) or _by_altname(links, name)
        if link is None:
            where = _namespace_holding(name)
            if where:
                raise BadInput(f"port {name} is not in this machine's root network namespace (it is in {where}): "
                               f"choose a port of the root namespace, or move it back first")
            have = ", ".join(n for n in links if n != "lo") or "none"
            raise BadInput(f"port {name} does not exist (ports here: {have})")
        if link.ifname != name:
            raise BadInput(f"port {name} is an altname of {link.ifname}: name it --ports by {link.ifname}")
        if name == "lo" or "LOOPBACK" in link.flags:
            raise BadInput(f"port {name} is the loopback device: choose a network port")
        if name in busy:
            raise BadInput(f"port {name} carries the default route ({busy[name]}): moving it would cut this "
                           f"machine off; choose a port that does not")
        if link.master:
            raise BadInput(f"port {name} is a member of {link.master} (bridge/bond): `ip link set {name} "
                           f"nomaster` first, or choose another port")
        mine = {a.local.split("%")[0] for a in link.addrs}
        for local, remote, ssh in conns:
            if local in mine:
                what = "an SSH session" if ssh else "an established connection"
                raise BadInput(f"port {name} carries {what} ({local} ↔ {remote}): moving it would cut it; "
                               f"choose another port")
    for other in _labs_holding(names, lab_name):
        raise BadInput(other)
    return names


def _by_altname(links: dict[str, netdev.Link], name: str) -> netdev.Link | None:
    return next((l for l in links.values() if name in l.altnames), None)


def _default_route_devs() -> dict[str, str]:
    """Devices of the default routes (v4 and v6, multipath included) → the route, for the message."""
    out: dict[str, str] = {}
    for fam in (4, 6):
        for r in netdev.routes(LOCAL, fam, "default"):
            via = f"default via {r.gateway}" if r.gateway else "default"
            for dev in [r.dev, *r.nexthop_devs]:
                if dev:
                    out.setdefault(dev, f"IPv{fam} {via}")
    return out


def _established() -> list[tuple[str, str, bool]]:
    """(local address, remote, is it SSH) of every established TCP connection of this namespace.

    SSH: the local end is sshd's (port 22 or an sshd process), or SSH_CONNECTION names it."""
    res = LOCAL.run(["ss", "-Htnp", "state", "established"], check=False, timeout=10)
    out = []
    for line in res.stdout.splitlines() if res.ok else []:
        cols = line.split()
        if len(cols) < 4:
            continue
        local, remote = cols[2], cols[3]
        host, _, port = local.rpartition(":")
        ssh = port == "22" or '"sshd' in line
        host = host.strip("[]").split("%")[0]
        if host.startswith("::ffff:") and "." in host:
            host = host[len("::ffff:"):]  # an IPv4 peer on a dual-stack socket
        out.append((host, remote, ssh))
    ssh_conn = os.environ.get("SSH_CONNECTION", "").split()
    if len(ssh_conn) == 4:
        out.append((ssh_conn[2], f"{ssh_conn[0]}:{ssh_conn[1]}", True))
    return out


def _namespace_holding(name: str) -> str | None:
    for ns in netdev.netns_names(LOCAL):
        if LOCAL.run(["ip", "-n", ns, "link", "show", "dev", name], check=False, timeout=10).ok:
            parts = ns.split("-")
            lab = f", offlab lab {parts[1]}'s" if len(parts) == 3 and parts[0] == "ol" else ""
            return f"namespace {ns}{lab}"
    return None


def _labs_holding(names: list[str], lab_name: str) -> Iterator[str]:
    from offlab.lab import list_labs

    for lab in list_labs():  # only a lab that borrows ports records them in its options
        if lab.name != lab_name:
            for name in names:
                if name in (lab.options.get("ports") or []):
                    yield (f"port {name} is already in lab {lab.name}: `offlab lab down {lab.name}` first, "
                           f"or choose another port")


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    fd = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---- what a port is, recorded before it moves -----------------------------------------------
def snapshot(name: str) -> dict:
    """Everything `give_back` puts back (and checks), as the port is now in this namespace."""
    host = LOCAL
    link = netdev.addr_rows(host, name, details=True)[0]
    feats = netdev.features(host, name)
    return {
        "name": link.ifname,
        "ifindex": link.ifindex,
        "altnames": list(link.altnames),
        "mac": link.mac,
        "kind": link.kind or "nic",
        "mtu": link.mtu,
        "up": link.up,
        "master": link.master,
        "netns": "root",
        "addresses": [a.to_json() for a in link.addrs if _ours_to_put_back(a)],
        "dynamic": [a.cidr for a in link.addrs if a.dynamic],
        # Only what ethtool lets change (not [fixed], not a group header): what a knob could have moved.
        "features": {k: f.requested for k, f in feats.items() if f.requested is not None and not f.fixed},
        # A move to another namespace drops these: routes through the port, its net.ipv4/6.conf.IF.*.
        "routes": _routes(LOCAL, name),
        "sysctls": _conf(name),
    }


def _routes(host: Host, name: str) -> list[dict]:
    """Routes of the main table through the port that the kernel does not make again by itself."""
    out = []
    for fam in (4, 6):
        for r in netdev.routes(host, fam, "dev", name):
            if r.protocol in ("kernel", "ra", "redirect") or r.type in ("multicast", "local"):
                continue
            out.append({"family": f"-{fam}", "dst": r.dst,
                        **{k: v for k, v in (("gateway", r.gateway), ("metric", r.metric), ("prefsrc", r.prefsrc),
                                             ("scope", r.scope), ("protocol", r.protocol)) if v is not None}})
    return out


def _route_key(r: dict) -> tuple:
    return r["family"], r["dst"], r.get("gateway"), r.get("metric")


def _conf(name: str) -> dict[str, str]:
    """This namespace's net.ipv4.conf.IF.* and net.ipv6.conf.IF.* that can be read and written
    ("ipv4/arp_ignore": "1")."""
    out = {}
    for fam in ("ipv4", "ipv6"):
        d = f"/proc/sys/net/{fam}/conf/{name}"
        if not os.path.isdir(d):
            continue
        for key in sorted(os.listdir(d)):
            path = os.path.join(d, key)
            if not os.access(path, os.W_OK) or not (os.stat(path).st_mode & 0o200):
                continue  # read-only (mc_forwarding)
            try:
                out[f"{fam}/{key}"] = " ".join(LOCAL.read(path).split())
            except OSError:
                continue  # unreadable until set (ipv6 stable_secret)
    return out


def _ours_to_put_back(a: netdev.Addr) -> bool:
    """An address the kernel or a daemon will not make again by itself: not a v6 link-local, not dynamic."""
    if not a.local or a.dynamic:
        return False
    return not (a.family == "inet6" and a.scope == "link")


def _addr_key(recorded: dict) -> str:
    a = netdev.Addr.from_json(recorded)
    return f"{ipaddress.ip_address(a.local.split('%')[0])}/{a.prefixlen}"


# ---- the topology ------------------------------------------------------------------------------
def phys(b: Builder, mtu: int) -> None:
    """[client: IF1] ─ the user's cable (in tests a veth pair standing in) ─ [server: IF2]"""
    lab = b.lab
    with _lock():
        with b.step("check the ports"):
            names = check_ports(lab.options.get("ports"), lab.name)
        with b.step("record the ports"):
            lab.ports = [snapshot(n) for n in names]
            lab.save()
        b.host("client"), b.host("server")
        for role, rec in zip(("client", "server"), lab.ports, strict=False):
            ns = lab.hosts[role].netns
            with b.step(f"move {rec['name']} into {role}"):
                rec["moved_to"] = ns  # before the move: a kill -9 right after it still knows where to look
                lab.save()
                LOCAL.run(["ip", "link", "set", "dev", rec["name"], "netns", ns])
                peer = "server" if role == "client" else "client"
                lab.hosts[role].interfaces.append(Interface(rec["name"], "nic", peer_host=peer, role="port"))
                lab.save()
    for role, rec, v4, v6 in (("client", lab.ports[0], CLIENT4, CLIENT6), ("server", lab.ports[1], SERVER4, SERVER6)):
        with b.step(f"MTU {mtu} on {role}:{rec['name']}"):
            b.ip(role, "link", "set", "dev", rec["name"], "mtu", str(mtu))
            b.ip(role, "link", "set", "dev", rec["name"], "up")
        b.address(role, rec["name"], v4, v6, reach=True)


# ---- giving the ports back ---------------------------------------------------------------------
def give_back(lab: LabState) -> list[str]:
    """Move every port recorded in `lab` to this namespace and put its recorded state back.

    Idempotent: a port already back is only checked and mended. EnvironmentProblem (the lab file
    kept) when a port could not come back or a value does not read back as recorded."""
    done, failed = [], []
    for rec in lab.ports:
        try:
            done.append(_give_back_one(lab, rec))
        except OfflabError as exc:
            failed.append(f"port {rec['name']}: {exc}")
    if failed:
        raise EnvironmentProblem(f"lab {lab.name}: " + "; ".join(failed)
                                 + f" (the lab file is kept: `offlab lab down {lab.name}` retries)")
    return done


def _give_back_one(lab: LabState, rec: dict) -> str:
    name = rec["name"]
    where = _locate(lab, rec)
    if where is None:
        if rec.get("kind") == "veth":
            return f"port {name}: gone (a veth is destroyed with its namespace; nothing to give back)"
        raise EnvironmentProblem(f"not found in this namespace nor in the lab's; `ip -all netns exec ip link "
                                 f"show {name}` finds it")
    if where != "root":
        # Down first: a port that comes back up would run with the lab's settings for a moment.
        NetnsHost(where).run(["ip", "link", "set", "dev", name, "down"], timeout=10)
        NetnsHost(where).run(["ip", "link", "set", "dev", name, "netns", str(os.getpid())], timeout=10)
    _put_back(rec)
    problems = _differences(rec, snapshot(name))
    if problems:
        raise EnvironmentProblem(f"back in the root namespace but {'; '.join(problems)}")
    return f"port {name} (back in the root namespace: MTU {rec['mtu']}, {'up' if rec['up'] else 'down'}, " \
           f"{len(rec['addresses'])} address(es), {len(rec.get('routes', []))} route(s), features and sysctls as recorded)"


def _locate(lab: LabState, rec: dict) -> str | None:
    """The lab namespace the port is in, "root" if it is here, None if it is nowhere we look."""
    for ns in [rec.get("moved_to"), *lab.namespaces]:
        if ns and netns_exists(ns) and _same_port(NetnsHost(ns), rec):
            return ns
    return "root" if _same_port(LOCAL, rec) else None


def _same_port(host: Host, rec: dict) -> bool:
    link = netdev.find_link(host, rec["name"])
    if link is None:
        return False
    mac = link.mac
    if rec.get("mac") and mac != rec["mac"]:
        raise EnvironmentProblem(f"the link named {rec['name']} in {host.name} has MAC {mac}, not the port's "
                                 f"{rec['mac']}: someone made another link of that name; rename it")
    return True


def _put_back(rec: dict) -> None:
    """MTU, per-interface sysctls, features, addresses, up/down, then routes (a route needs the port up)."""
    name = rec["name"]
    now = snapshot(name)
    if now["mtu"] != rec["mtu"]:
        LOCAL.run(["ip", "link", "set", "dev", name, "mtu", str(rec["mtu"])], timeout=10)
    conf_now = _conf(name)
    for key, value in rec.get("sysctls", {}).items():
        if key in conf_now and conf_now[key] != value:
            fam, leaf = key.split("/", 1)
            try:
                LOCAL.write(f"/proc/sys/net/{fam}/conf/{name}/{leaf}", value)
            except OSError:
                pass  # read back below: what did not take is named there
    wanted = {k: v for k, v in rec["features"].items() if now["features"].get(k) is not None
              and now["features"][k] != v}
    if wanted:
        argv = ["ethtool", "-K", name]
        for k, v in sorted(wanted.items()):
            argv += [k, "on" if v else "off"]
        LOCAL.run(argv, check=False, timeout=10)  # read back below: what did not take is named there
    have = {_addr_key(a) for a in now["addresses"]}
    for a in rec["addresses"]:
        if _addr_key(a) not in have:
            LOCAL.run(["ip", "addr", "add", *_addr_args(a), "dev", name], timeout=10)
    if now["up"] != rec["up"]:
        LOCAL.run(["ip", "link", "set", "dev", name, "up" if rec["up"] else "down"], timeout=10)
    have_routes = {_route_key(r) for r in _routes(LOCAL, name)}
    for r in rec.get("routes", []):
        if _route_key(r) not in have_routes:
            argv = ["ip", r["family"], "route", "add", r["dst"]]
            argv += ["via", r["gateway"]] if r.get("gateway") else []
            argv += ["dev", name]
            for key, word in (("metric", "metric"), ("prefsrc", "src"), ("scope", "scope"), ("protocol", "proto")):
                if r.get(key) is not None:
                    argv += [word, str(r[key])]
            LOCAL.run(argv, check=False, timeout=10)  # read back below


def _addr_args(recorded: dict) -> list[str]:
    a = netdev.Addr.from_json(recorded)
    args = [a.cidr]
    if a.peer and a.peer != a.local:
        args = [a.local, "peer", f"{a.peer}/{a.prefixlen}"]
    if a.broadcast:
        args += ["broadcast", a.broadcast]
    if a.scope and a.scope != "global":
        args += ["scope", a.scope]
    if a.label and a.family == "inet":
        args += ["label", a.label]
    if a.noprefixroute:
        args.append("noprefixroute")
    if a.family == "inet6":
        args.append("nodad")  # it was the port's address already; no need to wait for DAD again
    return args


def _differences(rec: dict, now: dict) -> list[str]:
    out = []
    if now["mtu"] != rec["mtu"]:
        out.append(f"its MTU is {now['mtu']}, not {rec['mtu']}")
    if now["up"] != rec["up"]:
        out.append(f"it is {'up' if now['up'] else 'down'}, it was {'up' if rec['up'] else 'down'}")
    want, have = {_addr_key(a) for a in rec["addresses"]}, {_addr_key(a) for a in now["addresses"]}
    if want != have:
        out.append(f"its addresses are {sorted(have) or 'none'}, were {sorted(want) or 'none'}")
    feats = [k for k, v in rec["features"].items() if now["features"].get(k, v) != v]
    if feats:
        out.append(f"features {', '.join(feats)} differ from the recorded ones")
    want_r, have_r = {_route_key(r) for r in rec.get("routes", [])}, {_route_key(r) for r in now["routes"]}
    if want_r - have_r:
        out.append(f"routes {sorted(str(k[1]) for k in want_r - have_r)} did not come back")
    conf = [k for k, v in rec.get("sysctls", {}).items() if now["sysctls"].get(k, v) != v]
    if conf:
        names = ", ".join("net.{}.conf.{}.{}".format(k.split("/")[0], now["name"], k.split("/", 1)[1]) for k in conf)
        out.append(f"sysctls {names} differ from the recorded ones")
    return out


def ifindex_note(lab: LabState) -> list[str]:
    """The kernel may give a returning port a new ifindex when its old one was taken: say so."""
    notes = []
    for rec in lab.ports:
        link = netdev.find_link(LOCAL, rec["name"])
        if link is not None:
            idx = link.ifindex
            if idx != rec["ifindex"]:
                notes.append(f"port {rec['name']}: ifindex {idx} now, {rec['ifindex']} before (the kernel chose)")
    return notes


def check_request(name: str, mtu: int, options: dict) -> None:
    """`lab up phys` options that can be checked before the lab is claimed (refusals: exit 2)."""
    for tool in ("ip", "ethtool", "ss"):
        require_tool(tool)
    try:
        check_ports(options.get("ports"), name)
    except CommandFailed as exc:
        raise EnvironmentProblem(f"could not read this machine's ports: {exc}") from None
