"""`offlab hosts check INVENTORY`: reach each host of an inventory, report what it has and lacks."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from offlab.cli.console import command_group
from offlab.errors import EnvironmentProblem

app = command_group("Existing machines reached over SSH (inventories).")


@app.command("check")
def check_cmd(
    inventory: str = typer.Argument(..., help="offlab or Ansible YAML inventory."),
    host: Optional[List[str]] = typer.Option(None, "--host", help="Check only this host (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (schema offlab-hosts-check/1)."),
    local: bool = typer.Option(False, "--local", help="Check this machine itself as the inventory's host "
                                                      "(what `offlab fleet run` runs on each host)."),
) -> None:
    """Connect to each host: kernel, drivers, features, MTU, addresses, tools, and what is missing."""
    from offlab import hostcheck
    from offlab.inventory import load

    inv = load(inventory)
    reports = hostcheck.check_inventory(inv, host or None, local=local)
    if as_json:
        typer.echo(json.dumps(hostcheck.to_json(inv, reports), indent=2))
    else:
        for line in hostcheck.render_text(reports):
            typer.echo(line)
    unreachable = [r.name for r in reports if not r.reachable]
    failing = [r.name for r in reports if r.reachable and r.failed]
    if unreachable or failing:
        what = []
        if unreachable:
            what.append(f"unreachable: {', '.join(unreachable)}")
        if failing:
            what.append(f"missing something: {', '.join(failing)}")
        raise EnvironmentProblem("hosts check: " + "; ".join(what))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="hosts")
