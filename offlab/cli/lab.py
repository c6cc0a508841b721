"""`offlab lab ...`: build, inspect, poke and remove labs."""

from __future__ import annotations

import json
from typing import Optional

from typing import TYPE_CHECKING

import typer
from offlab.cli.console import OnFirstUse, command_group

# What the options and their help need, and no more: each command imports its machinery (labs, knobs,
# teardown) in its body, so `offlab --version` or `offlab mtu calc` does not load every lab builder.
from offlab.addresses import LAB_NET6
from offlab.catalog import (DPDK_TOPOLOGIES, GUEST_TOPOLOGIES, HOSTS, NAMES as TOPOLOGY_NAMES, borrows_ports,
                            taking_option)
from offlab.errors import BadInput, EnvironmentProblem, NotRoot
from offlab.mtu.calc import VXLAN_OVERHEAD
from offlab.names import check_lab_name, check_mtu

if TYPE_CHECKING:
    from offlab.lab import LabState

app = command_group("Build, inspect and remove labs: namespaces, guests, DPDK, OVS, SSH hosts, two ports.")
out = OnFirstUse()


@app.command("up")
def up_cmd(
    topology: str = typer.Argument(..., help=" | ".join([*TOPOLOGY_NAMES, HOSTS])),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Lab name (default: the topology)."),
    mtu: int = typer.Option(1500, "--mtu", help="MTU of every host-facing link (the overlay MTU for vxlan)."),
    ipv6: bool = typer.Option(False, "--ipv6", help=f"Also address hosts from {LAB_NET6}."),
    vni: Optional[int] = typer.Option(None, "--vni", help="vxlan: VXLAN network identifier (default 4242)."),
    port: Optional[int] = typer.Option(None, "--port", help="vxlan: UDP destination port (default 4789)."),
    underlay_mtu: Optional[int] = typer.Option(None, "--underlay-mtu",
                                               help=f"vxlan: underlay MTU (default MTU + {VXLAN_OVERHEAD[4]})."),
    nic: list[str] = typer.Option([], "--nic", metavar="PROP=VALUE", help=(
        f"{', '.join(GUEST_TOPOLOGIES)}: a virtio-net property of every guest NIC as PROP=VALUE (repeatable), "
        "or queues=N (multiqueue).")),
    kernel_version: list[str] = typer.Option([], "--kernel-version", help=(
        f"{', '.join(GUEST_TOPOLOGIES)}: the guest kernel from Debian's archive: a series (6.1, 6.12, 7.2), a "
        "release (6.12.57+deb12) or newest; ROLE=V per guest (repeatable, e.g. client=6.1 server=7.2).")),
    qemu: list[str] = typer.Option([], "--qemu", metavar="VERSION", help=(
        f"{', '.join(GUEST_TOPOLOGIES)}: the QEMU that runs the guests: installed (default), its series (10.0), "
        "or another Debian has for this machine (7.2: fetched once into offlab's cache, run from there, never "
        "installed; `offlab vm qemu --list`); ROLE=V per guest (repeatable).")),
    guest_cpus: Optional[int] = typer.Option(None, "--guest-cpus",
                                             help=f"{', '.join(GUEST_TOPOLOGIES)}: vCPUs per guest (default 1)."),
    pmd: Optional[str] = typer.Option(None, "--pmd", help="dpdk, ovs-dpdk: the DPDK ports, tap (default) or "
                                                          "af_packet (over veths; cannot show GRO/GSO)."),
    testpmd_cpu: Optional[int] = typer.Option(None, "--testpmd-cpu",
                                              help="dpdk, dpdk-vm: the CPU testpmd polls on; ovs-dpdk, ovs-dpdk-vm: the OVS PMD "
                                                   "thread's (default: the last one)."),
    testpmd_idle: Optional[str] = typer.Option(None, "--testpmd-idle", help=(
        "dpdk, dpdk-vm: poll (default): testpmd forwards, busy-polling its CPU, from lab up to lab down; stop: "
        "it forwards only while an offlab command sends through the lab (a sample, lab exec, mtu probe --lab), "
        "its CPU idle otherwise (traffic started outside offlab finds it stopped).")),
    pmd_sleep: Optional[int] = typer.Option(None, "--pmd-sleep", help=(
        "ovs-dpdk, ovs-dpdk-vm: the longest sleep, in µs (0..10000), the OVS PMD thread may take per polling "
        "loop while its ports bring few packets (OVS's pmd-maxsleep); default 0: it busy-polls its CPU.")),
    as_json: bool = typer.Option(False, "--json", help="Print the lab as JSON."),
    inventory: Optional[str] = typer.Option(None, "--inventory", help="hosts: the inventory of the machines."),
    pair: Optional[str] = typer.Option(None, "--pair", metavar="CLIENT:IF,SERVER:IF", help=(
        "hosts: the client and server hosts and their test interfaces (default: the inventory's first pair).")),
    allow_management: bool = typer.Option(False, "--allow-management-traffic",
                                          help="hosts: allow a test address that is the SSH address."),
    ports: Optional[str] = typer.Option(None, "--ports", metavar="IF1,IF2", help=(
        "phys: two ports of this machine cabled to each other, lent to the lab as client and server and given "
        "back on lab down / restore.")),
) -> None:
    """Build a lab of network namespaces (and QEMU guests) and check that client reaches server; `hosts`: a lab over
    existing machines of an inventory (nothing is created there); `phys --ports IF1,IF2`: two ports of this machine
    moved into the lab's namespaces and given back as they were (docs/phys.md)."""
    from offlab import lab as labs

    if topology == HOSTS:
        from offlab.lab import hosts as hosts_lab

        if inventory is None:
            raise BadInput("lab up hosts needs --inventory FILE (docs/remote.md)")
        if ports is not None:
            raise BadInput("--ports is for `lab up phys`; a hosts lab names its ports with --pair A:IF,B:IF")
        check_up_options(name, 1500, False)
        _print_lab(hosts_lab.up(name or HOSTS, inventory, pair, allow_management=allow_management), as_json)
        return
    if inventory is not None or pair is not None or allow_management:
        raise BadInput(f"--inventory, --pair and --allow-management-traffic are for `lab up hosts`, not {topology}")
    check_up_options(name, mtu, ipv6)
    if topology not in taking_option("pmd") and pmd is not None:
        raise BadInput(f"--pmd is an option of the {' and '.join(taking_option('pmd'))} topologies only")
    if topology not in DPDK_TOPOLOGIES and testpmd_cpu is not None:
        raise BadInput(f"--testpmd-cpu is an option of the {', '.join(DPDK_TOPOLOGIES)} topologies only")
    if topology not in taking_option("testpmd_idle") and testpmd_idle is not None:
        raise BadInput(f"--testpmd-idle is an option of the {' and '.join(taking_option('testpmd_idle'))} topologies "
                       f"only")
    if topology not in taking_option("pmd_sleep") and pmd_sleep is not None:
        raise BadInput(f"--pmd-sleep is an option of the {' and '.join(taking_option('pmd_sleep'))} topologies only")
    options = {k: v for k, v in (("vni", vni), ("port", port), ("underlay_mtu", underlay_mtu),
                                 ("pmd", pmd), ("cpu", testpmd_cpu), ("pmd_sleep", pmd_sleep),
                                 ("testpmd_idle", testpmd_idle)) if v is not None}
    if borrows_ports(topology) != (ports is not None):
        raise BadInput(f"lab up {topology} needs --ports IF1,IF2 (docs/phys.md)" if borrows_ports(topology)
                       else f"--ports is for `lab up {' / '.join(taking_option('ports'))}`, not {topology}")
    if ports is not None:
        options["ports"] = [p.strip() for p in ports.split(",")]
    if (nic or guest_cpus is not None) and topology not in GUEST_TOPOLOGIES:
        raise BadInput(f"--nic and --guest-cpus are for guest topologies ({', '.join(GUEST_TOPOLOGIES)}), "
                       f"not {topology}")
    if nic:
        options["nic"] = dict(_nic_option(item) for item in nic)
    if guest_cpus is not None:
        options["guest_cpus"] = guest_cpus
    if kernel_version:
        options["kernel_version"] = _kernel_option(kernel_version, topology)
    if qemu:
        options["qemu"] = _qemu_option(qemu, topology)
    lab = labs.up(topology, name, mtu=mtu, ipv6=ipv6, options=options)
    _print_lab(lab, as_json)


def _kernel_option(items: list[str], topology: str) -> str | dict[str, str]:
    """--kernel-version V (every guest) or ROLE=V per guest, checked against the archive before anything is built."""
    from offlab.lab.vm import check_kernel_version

    per_role = [i for i in items if "=" in i]
    if per_role and len(per_role) != len(items) or not per_role and len(items) > 1:
        raise BadInput("--kernel-version: give one V for every guest, or ROLE=V for each guest (e.g. client=6.1)")
    value: str | dict[str, str] = dict(i.split("=", 1) for i in items) if per_role else items[0]
    check_kernel_version(value, topology, "--kernel-version")
    return value


def _qemu_option(items: list[str], topology: str) -> str | dict[str, str]:
    """--qemu V (every guest) or ROLE=V per guest, checked (one line, nothing fetched) before anything is built."""
    from offlab.lab.vm import check_qemu

    per_role = [i for i in items if "=" in i]
    if per_role and len(per_role) != len(items) or not per_role and len(items) > 1:
        raise BadInput("--qemu: give one V for every guest, or ROLE=V for each guest (e.g. client=7.2)")
    value: str | dict[str, str] = dict(i.split("=", 1) for i in items) if per_role else items[0]
    check_qemu(value, topology, "--qemu", resolve=False)
    return value


def _nic_option(item: str) -> tuple[str, str | int]:
    prop, eq, value = item.partition("=")
    if not eq or not prop or not value:
        raise BadInput(f"--nic {item!r}: write PROP=VALUE, e.g. --nic rx_queue_size=1024 or --nic queues=2")
    return prop, int(value) if value.isdigit() else value


def check_up_options(name: str | None, mtu: int, ipv6: bool) -> None:
    """The options `lab up` can check before any namespace exists; BadInput names the option."""
    from offlab.mtu.calc import MIN_MTU

    if name is not None:
        try:
            check_lab_name(name)
        except BadInput as exc:
            # An empty --name must not fall back to the default: the person asked for a name.
            raise BadInput(f"--name: {exc}") from None
    check_mtu(mtu)
    if ipv6 and mtu < MIN_MTU[6]:
        raise BadInput(f"--mtu {mtu} with --ipv6: IPv6 needs an MTU of at least {MIN_MTU[6]}")


@app.command("down")
def down_cmd(
    name: Optional[str] = typer.Argument(None, help="Lab to remove."),
    all_: bool = typer.Option(False, "--all", help="Remove every lab offlab knows about."),
    force: bool = typer.Option(False, "--force", help="Also a lab a live run holds, or whose state file is "
                                                      "corrupt (never another state directory's)."),
) -> None:
    """Remove a lab: daemons, processes, namespaces and links. Safe to repeat."""
    from offlab.experiment import teardown

    if all_ == (name is not None):
        raise BadInput("give a lab name or --all (not both)")
    removed = teardown.down_all(force=force) if all_ else teardown.down(name, force=force)
    if not removed:
        typer.echo("nothing to remove")
    for item in removed:
        typer.echo(f"removed {item}")


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print the labs as JSON.")) -> None:
    """The labs that exist, with their topology, MTU and status: up, or broken with why and the fix."""
    from rich.table import Table

    from offlab import lab as labs

    rows = []
    for lab, why in labs.survey():
        if lab is None:
            name = why.split(":", 1)[0]
            rows.append({"name": name, "topology": None, "mtu": None, "status": "corrupt", "hosts": [],
                         "why": why.split(": ", 1)[1], "fix": f"offlab lab down --force {name}"})
            continue
        row = {"name": lab.name, "topology": lab.topology, "mtu": lab.mtu,
               "status": "broken" if why else lab.status, "hosts": list(lab.hosts)}
        if why:
            row.update(why=why, fix=f"offlab lab down {lab.name}")
        held = labs.holders(lab.name)
        if held:
            row["held_by"] = [{"pid": h["pid"], "what": h.get("what")} for h in held]
        rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no labs (offlab lab up TOPOLOGY)")
        return
    t = Table("name", "topology", "mtu", "status", "hosts", box=None)
    for r in rows:
        status = r["status"] + (f" (in use by {r['held_by'][0]['what']})" if r.get("held_by") else "")
        t.add_row(r["name"], r["topology"] or "-", str(r["mtu"] or "-"), status, " ".join(r["hosts"]))
    out.print(t)
    for r in rows:
        if r.get("why"):
            out.print(f"{r['name']}: {r['status']} — {r['why']}; fix: {r['fix']}")


@app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="Lab name (offlab lab list)."),
    as_json: bool = typer.Option(False, "--json", help="Print the lab as JSON."),
) -> None:
    """Hosts, interfaces, addresses, MTUs and the offload state of a lab."""
    from offlab import lab as labs

    lab = labs.LabState.load(name)
    why = labs.health(lab)
    if why:
        raise EnvironmentProblem(f"lab {name} is broken: {why}; `offlab lab down {name}` removes what is left")
    _print_lab(lab, as_json)


@app.command("explain")
def explain_cmd(
    name: str = typer.Argument(..., help="Lab name."),
    host: Optional[str] = typer.Argument(None, help="Host of the lab (default: every host)."),
    iface: Optional[str] = typer.Argument(None, help="Interface: a real name or to-<host> (default: every one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
) -> None:
    """Why each offload is what it is: for a guest NIC the chain QEMU property → virtio feature bit offered →
    accepted by the guest → guest ethtool feature, and the tap's flags; for every interface, the features the
    kernel holds off although requested on, and what each needs."""
    from offlab import lab as labs
    from offlab.hosts import is_root
    from offlab.lab.explain import explain

    if not is_root():
        raise NotRoot("lab explain")
    lab = labs.LabState.load(name)
    why = labs.health(lab)
    if why:
        raise EnvironmentProblem(f"lab {name} is broken: {why}; `offlab lab down {name}` removes what is left")
    if iface is not None and host is None:
        raise BadInput("name the host before the interface: offlab lab explain NAME HOST IFACE")
    found = explain(lab, host, iface)
    if as_json:
        typer.echo(json.dumps(found.to_json(), indent=2))
        return
    for line in found.lines():
        typer.echo(line)


@app.command("set")
def set_cmd(
    name: str = typer.Argument(..., help="Lab name."),
    host: str = typer.Argument(..., help="Host of the lab: client, server, switch, hv1 ..."),
    iface: str = typer.Argument(..., help="Interface: a real name, to-<host>, or - for sysctls."),
    settings: list[str] = typer.Argument(..., help="KEY=VALUE ...: gro=off mtu=9000 rps=3 qdisc=pfifo_fast "
                                                     "net.ipv4.tcp_rmem='4096 131072 6291456'"),
    as_json: bool = typer.Option(False, "--json", help="Print requested vs actual as JSON."),
) -> None:
    """Change settings of a lab host by hand, journalled: they stay until `offlab restore` or `lab down`."""
    from offlab import lab as labs
    from offlab.hosts import is_root
    from offlab.knobs import Change, Transaction

    if not is_root():
        raise NotRoot("lab set")
    lab = labs.LabState.load(name)
    target = lab.host(host)
    changes = []
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or not key or not value.strip():
            raise BadInput(f"setting {item!r}: write KEY=VALUE, e.g. gro=off or mtu=9000")
        changes.append(Change(target, key, value, None if iface == "-" else iface, lab))
    with Transaction(label=f"lab set {name}", persist=True, prefix=f"lab-{name}") as tx:
        outcomes = tx.apply(changes)
    if as_json:
        typer.echo(json.dumps([o.to_dict() for o in outcomes], indent=2))
    else:
        for o in outcomes:
            typer.echo(o.line())
            if not o.ok:
                # imported only here: the runner brings the store and the measurement machinery (SQLAlchemy,
                # scipy), ~0.2 CPU-s that a setting made as asked has no use for
                from offlab.experiment.runner import chain_why

                if chain := chain_why(lab, o):  # a guest NIC's feature: why, along its chain
                    typer.echo(f"  why: {chain}")
    if any(o.ok and o.change.key.startswith("testpmd.") for o in outcomes):
        _warn_testpmd_no_ops(lab)
    if tx.impossible:
        kept = sum(1 for o in outcomes if o.ok and o.journalled)
        raise EnvironmentProblem(
            f"{len(tx.impossible)} of {len(outcomes)} setting(s) could not be made (see above)"
            + (f"; the {kept} that were made stay until `offlab restore` or `lab down`" if kept else ""))


def _warn_testpmd_no_ops(lab: LabState) -> None:
    """testpmd settings now in force that do nothing (GRO/GSO outside csum forwarding), on stderr."""
    from offlab.dpdk import Testpmd
    from offlab.knobs.testpmd import no_ops

    tp = Testpmd.for_lab(lab.name)
    if tp is None:
        return
    now = tp.settings()
    values = {"fwd": now["fwd"], **{name: ",".join(f"{n}:{'on' if p[name]['on'] else 'off'}"
                                                   for n, p in sorted(now["ports"].items()))
                                    for name in ("gro", "gso")}}
    for line in no_ops(values):
        typer.echo(f"warning: {line}", err=True)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_cmd(
    name: str = typer.Argument(..., help="Lab name (offlab lab list)."),
    host: str = typer.Argument(..., help="A host of the lab (offlab lab show NAME lists them)."),
    cmd: list[str] = typer.Argument(..., help="Command and arguments (after --)."),
) -> None:
    """Run a command inside one host of a lab: `offlab lab exec demo client -- ping 10.200.1.2`"""
    from offlab import lab as labs
    from offlab.hosts import is_root

    if not is_root():
        raise NotRoot("lab exec")
    from offlab.lab.dpdk import forwarding

    lab = labs.LabState.load(name)
    with forwarding(lab):  # a testpmd that rests while idle forwards while the command runs
        rc = lab.host(host).interactive(cmd)
    raise typer.Exit(rc)


def _leases(lab: LabState) -> dict:
    """Each SSH host's lease (offlab_lease) and what its watchdog restored after a controller fell silent
    (reported here, kept for `offlab restore`)."""
    from offlab.errors import OfflabError
    from offlab.hosts import lease

    out = {}
    for role, entry in lab.hosts.items():
        if entry.ref is None:
            continue
        host = lab.host(role)
        try:
            lapsed = lease.lapses(host, host.remote_dir)
        except OfflabError as exc:
            lapsed = [f"{host.name}: not read ({exc})"]
        out[role] = {"host": host.name, "seconds": host.lease, "lapsed": lapsed}
    return out


def _print_lab(lab: LabState, as_json: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    from offlab.knobs import pending_changes
    from offlab.lab.inspect import SUMMARY_FEATURES, describe

    info = describe(lab)
    info["changes"] = pending_changes({e.netns: role for role, e in lab.hosts.items() if e.netns and not e.guest},
                                      lab.name)
    if lab.topology == HOSTS:
        info["leases"] = _leases(lab)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    out.print(f"[bold]lab {info['name']}[/bold]  topology {info['topology']}  mtu {info['mtu']}  "
              f"status {info['status']}" + (f"  options {info['options']}" if info["options"] else ""))
    t = Table("host", "interface", "mtu", "addresses", "link", *SUMMARY_FEATURES, box=None)
    for role, h in info["hosts"].items():
        for i, iface in enumerate(h["interfaces"]):
            feats = iface.get("features", {})
            fixed = set(iface.get("fixed", []))
            cells = []
            for full in SUMMARY_FEATURES.values():
                if full not in feats:
                    cells.append("-")
                else:
                    cells.append(("on" if feats[full] else "off") + ("*" if full in fixed else ""))
            link = f"→ {iface['peer_host']}" if iface.get("peer_host") else iface["kind"]
            if iface.get("master"):
                link += f" [{iface['master']}]"
            t.add_row(role if i == 0 else "", iface["name"], str(iface["mtu"]),
                      " ".join(iface["addresses"]), link, *cells)
    out.print(t)
    out.print("[dim]* = fixed by the driver; short names: "
              + ", ".join(f"{k}={v}" for k, v in SUMMARY_FEATURES.items() if k != v) + "[/dim]")
    for role, h in info["hosts"].items():
        for nic in (h.get("guest") or {}).get("nics", []):
            eff = nic.get("effective_properties")
            if eff is None:
                out.print(f"guest {role}:{nic['iface']}: QEMU's properties unread — {nic.get('effective_properties_error')}")
                continue
            off = [f"{k} ({'set' if k in nic.get('properties', {}) else 'default'})" for k, v in eff.items() if v == "off"]
            out.print(f"guest {role}:{nic['iface']} virtio-net ({nic['device_id']}): off: {', '.join(off) or 'none'}; "
                      f"the rest on — why each feature is so: offlab lab explain {info['name']} {role}")
    for a in info["adjustments"]:
        out.print(f"note: {a['host']}:{a['iface']} {a['setting']} {a['value']} — {a['why']}")
    for c in info.get("changes", []):
        held = f", held by running pid {c['held_by']}" if c.get("held_by") else ""
        out.print(f"journalled: {c['host']}:{c['iface'] or '-'} {c['key']} = {c['value']} "
                  f"(was {c['original']}; {c['journal']}{held})")
    for role, l in (info.get("leases") or {}).items():
        how = (f"{l['seconds']} s: the host puts itself back {l['seconds']} s after its controller falls silent"
               if l["seconds"] else "none (offlab_lease: 0): only restore.sh, `offlab restore` or `lab down` put it back")
        out.print(escape(f"lease {role} ({l['host']}): {how}"))
        for line in l["lapsed"]:
            out.print(escape(f"lapsed: {line}"))
    for d in info["daemons"]:
        out.print(f"daemon: {d['name']} pid {d['pid']}")
    for role, h in info["hosts"].items():
        g = h.get("guest") or {}
        if g.get("start"):
            on = f"QEMU {g.get('qemu_version')}" + (f" ({g['qemu_suite']}, run from offlab's cache)"
                                                    if g.get("qemu_suite") not in (None, "installed") else "")
            clock = f", its clock {g['clock_rate']:g}x this machine's" if g.get("clock_rate") else ""
            out.print(escape(f"guest {role}: {on}, {g['start']} start, ready in {g.get('ready_seconds')} s{clock} "
                             f"({g.get('start_why', '')})"))
    reach = ", ".join(f"{r} {h['address']}" for r, h in info["hosts"].items() if h.get("address"))
    out.print(f"reach: {reach}")
