"""`offlab hosts check`: reach each inventory host and say what it has and what it lacks.

One result shape per check (id, title, status, evidence, why, fix), text and JSON from the same
objects. Hosts are checked in parallel; an unreachable host is reported as such and the others
still are.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from offlab import netdev
from offlab.errors import BadInput, CommandFailed, EnvironmentProblem
from offlab.feature_names import shown_name
from offlab.hosts import LOCAL, TOOL_PACKAGES
from offlab.hosts.ssh import HostUnreachable, SshHost
from offlab.inventory import Inventory, InventoryHost

SCHEMA = "offlab-hosts-check/1"
TOOLS = {t: TOOL_PACKAGES[t] for t in ("ip", "ethtool", "iperf3", "tcpdump")}
ENGINE = "offlab-engine"
# Features shown on the text line (the ones offlab's experiments flip); JSON has them all.
SHOWN_FEATURES = {shown_name(short): short for short in ("gro", "gso", "tso", "uso", "gro-list", "udp-gro-fwd",
                                                         "tx-csum", "rx-csum", "tnl-seg")}
# Finds each tool on PATH or in the sbin directories a non-root PATH lacks; a constant script,
# the tool names arrive as its arguments.
_WHO = 'uname -r; id -u; id -un; printf "%s\\n" "$SSH_CONNECTION"'
_FIND_TOOLS = ('for t; do p=$(command -v "$t" 2>/dev/null) || p=; '
               'if [ -z "$p" ]; then for d in /usr/local/sbin /usr/sbin /sbin; do '
               '[ -x "$d/$t" ] && p=$d/$t && break; done; fi; echo "$t ${p:--}"; done')


@dataclass
class Check:
    id: str
    title: str
    status: str  # ok | info | warn | fail
    evidence: str = ""
    why: str = ""
    fix: str = ""


@dataclass
class HostReport:
    name: str
    target: str
    reachable: bool = False
    error: str | None = None
    kernel: str | None = None
    user: str | None = None
    management_address: str | None = None
    tools: dict[str, str | None] = field(default_factory=dict)
    interfaces: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return not self.reachable or any(c.status == "fail" for c in self.checks)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ok"] = not self.failed
        return d


def check_inventory(inv: Inventory, names: list[str] | None = None, workers: int = 8,
                    local: bool = False) -> list[HostReport]:
    hosts = [inv.host(n) for n in names] if names else list(inv.hosts.values())
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(hosts)))) as pool:
        return list(pool.map(lambda ih: check_host(ih, local), hosts))


def check_host(ih: InventoryHost, local: bool = False) -> HostReport:
    """`local`: this machine itself (`hosts check --local`, what a fleet run checks on each host)."""
    rep = HostReport(ih.name, "this machine" if local else _target_text(ih))
    # Reads need no root; sudo is checked on its own, so a missing sudo cannot hide the rest.
    plain = LOCAL if local else ih.ssh_host()
    if not local and plain.become:
        plain = SshHost(**{**_kwargs(ih), "become": False})
    try:
        # One round trip for who and where: kernel, uid, user name, and the address we came in on
        # (SSH_CONNECTION = "client_ip client_port server_ip server_port").
        lines = plain.run(["sh", "-c", _WHO], timeout=20).stdout.splitlines() + ["", "", "", ""]
        rep.reachable = True
        rep.kernel, uid, rep.user = lines[0].strip(), lines[1].strip(), lines[2].strip()
        conn = lines[3].split()
        rep.management_address = conn[2] if len(conn) == 4 else None
        _user(plain, ih, rep, uid)
        _tools(plain, ih, rep)
        for iface in ih.interfaces:
            rep.interfaces.append(_interface(plain, ih, iface.name, list(iface.addresses), rep))
        _lease(LOCAL if local else (ih.ssh_host() if ih.become else plain), ih, rep)
        if not ih.interfaces:
            rep.checks.append(Check("interfaces", "test interfaces", "info", "none declared",
                                    "hosts check needs none; a lab on this host does",
                                    "declare `interfaces:` (offlab_interfaces) or use --pair HOST:IFACE"))
    except HostUnreachable as exc:
        rep.reachable = False  # unreachable, or lost while being checked
        rep.error = str(exc)
    except EnvironmentProblem as exc:  # a command timed out or failed in a way we did not expect
        rep.error = str(exc)
        if rep.reachable:
            rep.checks.append(Check("host", "host", "fail", str(exc)))
    finally:
        if not local:
            plain.close()
    return rep


def _lease(host, ih: InventoryHost, rep: HostReport) -> None:
    """The host's lease (offlab_lease), and what its watchdogs restored after a controller fell silent."""
    from offlab.hosts import lease

    if ih.lease:
        rep.checks.append(Check("lease", "lease", "info", f"{ih.lease} s: offlab's changes here are put back by the "
                                f"host itself {ih.lease} s after its controller falls silent (offlab_lease)"))
    else:
        rep.checks.append(Check("lease", "lease", "info", "none (offlab_lease: 0): a controller that dies leaves its "
                                "changes here until restore.sh, `offlab restore` or `lab down`"))
    try:
        lapsed = lease.lapses(host, ih.remote_dir)
    except (EnvironmentProblem, CommandFailed) as exc:
        lapsed = [f"not read: {exc}"]
    if lapsed:
        rep.checks.append(Check("lapsed", "lease lapsed", "warn", "; ".join(l.removeprefix(f"{host.name}: ").strip()
                                                                          for l in lapsed),
                                "a controller fell silent and this host put back what it had changed",
                                "`offlab restore` on the controller reports it once and clears the record"))


def _kwargs(ih: InventoryHost) -> dict:
    return dict(target=ih.target, user=ih.user, port=ih.port, identity=ih.identity, ssh_args=list(ih.ssh_args),
                become=ih.become, config=ih.ssh_config, via_netns=ih.via_netns,
                connect_timeout=ih.connect_timeout, name=ih.name, remote_dir=ih.remote_dir, lease=ih.lease)


def _target_text(ih: InventoryHost) -> str:
    return (f"{ih.user}@" if ih.user else "") + ih.target + (f":{ih.port}" if ih.port else "")


def _user(host: SshHost, ih: InventoryHost, rep: HostReport, uid: str) -> None:
    out = rep.user
    if ih.become:
        res = host.run(["sudo", "-n", "true"], check=False, timeout=20)
        if res.ok:
            rep.checks.append(Check("sudo", "sudo without a password", "ok", f"{out}: sudo -n true works"))
        elif res.rc == 127 or "not found" in res.stderr:
            rep.checks.append(Check("sudo", "sudo without a password", "fail", "sudo is not installed",
                                    "the inventory asks for sudo (become)",
                                    f"on {ih.name}, as root: apt-get install sudo"
                                    + (" (or set sudo: false: you log in as root)" if uid == "0" else "")))
        else:
            rep.checks.append(Check("sudo", "sudo without a password", "fail",
                                    (res.stderr.strip().splitlines() or ["sudo -n true failed"])[-1],
                                    "offlab never types a password",
                                    f"on {ih.name}: echo '{out} ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/offlab"))
    elif uid != "0":
        rep.checks.append(Check("root", "root or sudo", "fail", f"logged in as {out} (uid {uid}), no sudo",
                                "offlab changes interface settings, which needs root",
                                "log in as root, or set `sudo: true` (ansible_become: true)"))
    else:
        rep.checks.append(Check("root", "root or sudo", "ok", f"logged in as {out}"))


def _tools(host: SshHost, ih: InventoryHost, rep: HostReport) -> None:
    names = [*TOOLS, ENGINE]
    out = host.run(["sh", "-c", _FIND_TOOLS, "sh", *names], timeout=20).stdout
    found = {}
    for line in out.splitlines():
        tool, _, path = line.partition(" ")
        if tool in names:
            found[tool] = None if path in ("-", "") else path
    rep.tools = {t: found.get(t) for t in names}
    missing = [t for t in TOOLS if rep.tools[t] is None]
    sudo = "sudo " if (rep.user != "root") else ""
    if missing:
        pkgs = " ".join(sorted({TOOLS[t] for t in missing}))
        rep.checks.append(Check("tools", "tools", "fail", "missing: " + ", ".join(missing),
                                "offlab runs these on the host", f"on {ih.name}: {sudo}apt-get install {pkgs}"))
    else:
        rep.checks.append(Check("tools", "tools", "ok", ", ".join(f"{t}" for t in TOOLS)))
    if rep.tools[ENGINE] is None:
        rep.checks.append(Check("engine", ENGINE, "info", "not installed",
                                "offlab copies its engine to a private directory when a lab needs it "
                                "(same architecture), and removes it"))
    else:
        rep.checks.append(Check("engine", ENGINE, "ok", rep.tools[ENGINE] or ""))


def _interface(host: SshHost, ih: InventoryHost, name: str, declared: list[str], rep: HostReport) -> dict:
    info: dict[str, Any] = {"name": name, "declared_addresses": declared}
    try:
        link = netdev.link(host, name)
    except BadInput:
        rep.checks.append(Check(f"iface:{name}", name, "fail", f"no interface {name} on {ih.name}",
                                "the inventory names it as a test interface",
                                f"see `ip link` on {ih.name} and correct the inventory"))
        info["present"] = False
        return info
    info["present"] = True
    info["mtu"] = link.mtu
    info["state"] = link.operstate
    addr = netdev.addr_rows(host, name, timeout=20)
    info["addresses"] = [a.cidr for entry in addr for a in entry.addrs if a.scope != "link"]
    drv = netdev.driver(host, name, timeout=20)
    info["driver"] = drv.driver or None
    info["driver_version"] = drv.version or None
    info["firmware"] = drv.firmware or None
    info["bus_info"] = drv.bus_info or None
    try:
        feats = netdev.features(host, name)
    except (CommandFailed, BadInput, ValueError):
        feats = {}
    info["features"] = {k: {"active": f.active, "fixed": f.fixed} for k, f in feats.items()}
    shown = ", ".join(f"{short} {'on' if feats[k].active else 'off'}{' [fixed]' if feats[k].fixed else ''}"
                      for k, short in SHOWN_FEATURES.items() if k in feats)
    have = {a.split("/")[0] for a in info["addresses"]}
    problems = []
    status = "ok"
    absent = [a for a in declared if a.split("/")[0] not in have]
    if absent:
        status = "warn"
        problems.append(f"declared but not configured: {', '.join(absent)}")
    if rep.management_address and rep.management_address in have and not ih.allow_management_traffic:
        status = "fail"
        problems.append(f"carries the SSH address {rep.management_address}")
    if info["state"] not in ("UP", "UNKNOWN"):
        status = "fail" if status == "fail" else "warn"
        problems.append(f"link is {info['state']}")
    evidence = (f"driver {info['driver'] or '?'}"
                + (f" {info['driver_version']}" if info.get("driver_version") else "")
                + f", mtu {info['mtu']}, {info['state']}, "
                + (", ".join(info["addresses"]) or "no address") + (f"; {shown}" if shown else ""))
    fix = ""
    if "carries the SSH address" in " ".join(problems):
        fix = "use another interface for traffic, or set allow_management_traffic: true if you mean it"
    elif absent:
        fix = f"on {ih.name}: ip addr add ADDRESS dev {name}, or correct the inventory"
    rep.checks.append(Check(f"iface:{name}", name, status, evidence, "; ".join(problems), fix))
    return info


def render_text(reports: list[HostReport]) -> list[str]:
    lines = []
    for rep in reports:
        if not rep.reachable:
            lines.append(f"{rep.name}  {rep.target}  UNREACHABLE")
            lines.append(f"  fail  {rep.error}")
            continue
        lines.append(f"{rep.name}  {rep.target}  kernel {rep.kernel}  user {rep.user}"
                     + (f"  (ssh address {rep.management_address})" if rep.management_address else ""))
        for c in rep.checks:
            lines.append(f"  {c.status:<4}  {c.title}: {c.evidence}" + (f" — {c.why}" if c.why and c.status != "ok" else ""))
            if c.fix and c.status in ("warn", "fail"):
                lines.append(f"        fix: {c.fix}")
    bad = [r.name for r in reports if not r.reachable]
    failing = [r.name for r in reports if r.reachable and r.failed]
    summary = f"{len(reports)} host(s): {len(reports) - len(bad) - len(failing)} ready"
    if failing:
        summary += f", {len(failing)} missing something ({', '.join(failing)})"
    if bad:
        summary += f", {len(bad)} unreachable ({', '.join(bad)})"
    lines.append(summary)
    return lines


def to_json(inv: Inventory, reports: list[HostReport]) -> dict:
    return {"schema": SCHEMA, "inventory": inv.source, "format": inv.format,
            "hosts": [r.to_json() for r in reports],
            "summary": {"hosts": len(reports), "unreachable": sum(not r.reachable for r in reports),
                        "failing": sum(r.reachable and r.failed for r in reports)}}
