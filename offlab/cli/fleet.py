"""`offlab fleet run|clean`: plans across an Ansible inventory, driven by ansible-playbook (docs/remote.md)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from offlab.cli.console import command_group
from offlab.cli.options import db_option
from offlab.errors import EnvironmentProblem

app = command_group("Fleet runs driven by Ansible: offlab installed on each host, each pair run from its "
                       "client host, results imported here.")


@app.command("run")
def run_cmd(
    plan: Path = typer.Argument(..., help="A plan for host pairs (kind: veth, the same topology in every cell)."),
    inventory: Path = typer.Option(..., "--inventory", help="An Ansible YAML inventory."),
    pair: List[str] = typer.Option([], "--pair", metavar="CLIENT:IF,SERVER:IF", help=(
        "A client and a server host and their test interfaces, repeatable (default: the inventory's "
        "offlab_pairs, else --group's hosts in order).")),
    group: Optional[str] = typer.Option(None, "--group", help="Pair this group's hosts in order: 1st with 2nd, "
                                                              "3rd with 4th... (each on its first offlab_interfaces)."),
    forks: int = typer.Option(5, "--forks", metavar="N", help="Ansible's forks: hosts worked on at once."),
    serial: Optional[int] = typer.Option(None, "--serial", metavar="N", help="Pairs per Ansible batch (default: all at once)."),
    db: Optional[str] = db_option(),
    bundle: Optional[Path] = typer.Option(None, "--bundle", metavar="FILE", help=(
        "The offline bundle (`make bundle`; default $OFFLAB_BUNDLE, then dist/offlab-bundle.tar).")),
) -> None:
    """Install the bundle on every host, run PLAN from each pair's client host, import the results here."""
    from offlab import fleet
    from offlab.store import default_db_path

    db_path = str(db or default_db_path())
    results = fleet.run(str(plan), str(inventory), db_path, list(pair) or None, group=group, forks=forks,
                        serial=serial, bundle=str(bundle) if bundle else None, on_line=typer.echo)
    for r in results:
        typer.echo(r.line())
    done = [str(r.run_id) for r in results if r.run_id is not None]
    if len(done) > 1:
        typer.echo(f"side by side: offlab compare {' '.join(done)}" + (f" --db {db}" if db else ""))
    failed = [r for r in results if not r.ok]
    if failed:
        raise EnvironmentProblem(f"{len(failed)} of {len(results)} pair(s) failed: "
                                 + "; ".join(f"{r.pair}: {r.why}" for r in failed))


@app.command("clean")
def clean_cmd(
    inventory: Path = typer.Option(..., "--inventory", help="The Ansible YAML inventory of the fleet run."),
    host: Optional[List[str]] = typer.Option(None, "--host", help="Only this host (repeatable)."),
) -> None:
    """Say what each host's lease put back, put back what a crashed run left (each host's own restore.sh:
    settings, offlab's processes), then remove offlab from the hosts (offlab_prefix: venv, bundle, state)
    and any fleet key."""
    from offlab import fleet

    rc = fleet.clean(str(inventory), host or None, on_line=typer.echo)
    if rc != 0:
        raise EnvironmentProblem(f"fleet clean: ansible-playbook exit {rc} (its output above names the host)")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="fleet")
