"""`offlab mtu calc` (the arithmetic) and `offlab mtu probe` (path MTU inside a lab)."""

from __future__ import annotations

import contextlib
import json
from typing import Optional

import typer
from offlab.cli.console import command_group, console

from offlab.addresses import RANGES
from offlab.errors import BadInput
from offlab.wire import IPV6_HEADER

app = command_group("MTU arithmetic and path-MTU probing inside labs.")


@app.command("calc")
def calc_cmd(
    mtu: int = typer.Option(..., "--mtu", help="IP MTU of the link (what `ip link set mtu` sets)."),
    ipv6: bool = typer.Option(False, "--ipv6", help=f"Packets are IPv6 ({IPV6_HEADER}-byte header)."),
    encap: str = typer.Option("none", "--encap", help="none | vlan | vxlan | gre: inner MTU through it."),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON."),
) -> None:
    """UDP payload, TCP MSS, frame sizes, tunnel MTUs and fragment counts for one MTU."""
    from rich.table import Table

    from offlab.mtu.calc import table

    rows = table(mtu, ipv6=ipv6, encap=encap)
    if as_json:
        typer.echo(json.dumps({"mtu": mtu, "ip": 6 if ipv6 else 4, "encap": encap,
                               "values": {r.key: r.value for r in rows},
                               "rows": [{"key": r.key, "label": r.label, "value": r.value, "how": r.how}
                                        for r in rows]}, indent=2))
        return
    t = Table(title=f"MTU {mtu}, IPv{6 if ipv6 else 4}" + (f", {encap}" if encap != "none" else ""),
              title_justify="left", box=None)
    t.add_column("bytes", justify="right")
    t.add_column("what")
    t.add_column("how", style="dim")
    for r in rows:
        t.add_row(str(r.value), r.label, r.how)
    console().print(t)


@app.command("probe")
def probe_cmd(
    dest: str = typer.Argument(..., help=f"Address in {RANGES} or loopback."),
    netns: Optional[str] = typer.Option(None, "--netns", help="Probe from this network namespace."),
    lab: Optional[str] = typer.Option(None, "--lab", help="Probe from a host of this lab (with --host)."),
    host: Optional[str] = typer.Option(None, "--host", help="The lab host to probe from (default client)."),
    timeout: float = typer.Option(1.0, "--timeout", help="Seconds to wait for each reply (≤ 1)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Path MTU to DEST by DF pings; says whether a router answered or a black hole swallowed them."""
    from offlab.mtu.probe import check_dest, probe

    check_dest(dest)  # refuse a foreign address before anything else
    if netns and lab:
        raise BadInput("give --netns or --lab, not both")
    if host and not lab:
        raise BadInput("--host names a host of a lab: add --lab NAME")
    where = _where(netns, lab, host)
    with _forwarding(lab):
        result = probe(where, dest, timeout=timeout)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    typer.echo(f"{where.name} → {result.dest}: {result.verdict}")
    for p in result.probes:
        extra = f" (mtu {p.reported_mtu}{' from ' + p.reported_by if p.reported_by else ''})" \
            if p.reported_mtu else ""
        typer.echo(f"  {p.mtu:>6} bytes DF: {p.result}{extra}")


def _forwarding(lab: str | None) -> contextlib.AbstractContextManager:
    """A lab's testpmd that rests while idle forwards while the probe runs."""
    if not lab:
        return contextlib.nullcontext()
    from offlab import lab as labs
    from offlab.lab.dpdk import forwarding

    return forwarding(labs.LabState.load(lab))


def _where(netns: str | None, lab: str | None, host: str | None):
    from offlab.hosts import LOCAL

    if lab:
        from offlab import lab as labs

        return labs.LabState.load(lab).host(host or "client")
    if netns:
        from offlab.cli.doctor import _host_for

        return _host_for(netns)
    return LOCAL


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="mtu")
