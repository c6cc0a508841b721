"""The `offlab` command: thin wiring of the parts; no logic of its own."""

from __future__ import annotations

import sys

import typer

from offlab import __version__
from offlab.cli.console import command_group
from offlab.errors import OfflabError
from offlab.interrupts import EXIT_INTERRUPTED, Terminated, interrupts, say_interrupted

app = command_group(
    "Network offload, MTU and tuning experiments on Linux and virtualised Linux networking: namespaces, "
    "Open vSwitch, QEMU guests, DPDK testpmd, SSH hosts and two real ports.",
    name="offlab",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"offlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """offlab builds labs, flips offloads/MTUs through a journal, measures with statistics, restores."""


def _register() -> None:
    from offlab.cli import lab as lab_cli

    app.add_typer(lab_cli.app, name="lab")
    for module in ("measure", "experiment", "bisect", "results", "restore", "doctor", "mtu", "hosts", "fleet", "vm"):
        try:
            mod = __import__(f"offlab.cli.{module}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"offlab.cli.{module}":
                raise
            continue
        mod.register(app)


_register()


def fail(exc: OfflabError) -> "typer.Exit":
    typer.echo(f"offlab: error: {exc}", err=True)
    return typer.Exit(exc.exit_code)


def main() -> None:
    # SIGINT, SIGTERM and SIGHUP all unwind as exceptions, so whatever a command changed (a lab
    # half built, settings being set) is put back by its own `finally` before the exit below.
    try:
        with interrupts():
            _main()
    finally:
        # One command, one controller: the leases it took on SSH hosts are released when it ends, as at
        # a process's exit, also when it was called in a longer-lived process (a test, a notebook).
        leases = sys.modules.get("offlab.hosts.lease")
        if leases is not None:
            leases.release_all()


def _main() -> None:
    try:
        # Without standalone mode click returns the code of a `typer.Exit` instead of exiting.
        rc = app(standalone_mode=False)
        if rc == EXIT_INTERRUPTED:
            # typer turns a KeyboardInterrupt that no command caught into a silent 130: say it, as for
            # SIGTERM and SIGHUP (a command's own `finally` has put everything back by now)
            say_interrupted()
        sys.exit(rc if isinstance(rc, int) else 0)
    except OfflabError as exc:
        typer.echo(f"offlab: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt, Terminated):  # click turns a KeyboardInterrupt into Abort
        say_interrupted()
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # usage errors (bad option) arrive here in non-standalone mode
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(exc.exit_code)
        raise
