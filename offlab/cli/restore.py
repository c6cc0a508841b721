"""`offlab restore`: put back settings that a dead process (or `lab set`) left changed."""

from __future__ import annotations

import typer

from offlab.errors import EnvironmentProblem, NotRoot


def register(app: typer.Typer) -> None:
    @app.command("restore")
    def restore_cmd(
        list_only: bool = typer.Option(False, "--list", help="Only show what would be put back."),
        force: bool = typer.Option(False, "--force",
                                   help="Also restore journals of processes that are still running."),
    ) -> None:
        """Say what a lease put back by itself (this machine's watchdog, an SSH host's), once; replay the settings
        journals newest first: every original value goes back, then the journal goes;
        then end the processes offlab started on SSH hosts (its labs' and its journals') whose offlab process is gone
        (iperf3, the engine, tcpdump; each by pid checked against its start time); then remove labs whose `lab up`
        was killed before they were up (their QEMU, testpmd, namespaces), and give back the ports of phys labs that
        no live process uses (they are this machine's own); last, remove the temporary directories of offlab
        processes that are gone."""
        from offlab import lab as labs
        from offlab.experiment import teardown
        from offlab.hosts import is_root
        from offlab.knobs import restore_report

        if not list_only and not is_root():
            raise NotRoot("offlab restore")
        # SSH hosts named by the journals, read before restoring removes them: the processes offlab
        # started there (iperf3, the engine, tcpdump) outlive a killed controller.
        from offlab.knobs.journal import all_journals, journal_dir
        from offlab.lab import hosts as hosts_lab

        refs = [e.data.get("host") for v in (all_journals() if journal_dir().exists() else [])
                for e in v.open_entries]
        from offlab.knobs import watchdog

        for line in watchdog.lapses(remove=not list_only):  # what this machine's lease put back, said once
            typer.echo(line)
        report = restore_report(list_only=list_only, force=force)
        for line in report.lines:
            typer.echo(line)
        ended, failed = hosts_lab.end_orphans(hosts_lab.ssh_hosts_known(refs), force=force, list_only=list_only)
        for line in ended + failed:
            typer.echo(line)
        if not list_only:
            report.failed += failed
        for name in labs.abandoned():
            if list_only:
                typer.echo(f"would remove lab {name}: its `lab up` died before the lab was up")
                continue
            for what in teardown.down(name, force=True):
                typer.echo(f"removed (lab {name}, its `lab up` died): {what}")
        for name in labs.phys_in_use_by_nobody(force=force):
            if list_only:
                typer.echo(f"would give back the ports of phys lab {name} (and remove the lab)")
                continue
            for what in teardown.down(name, force=True):
                typer.echo(f"gave back (phys lab {name}): {what}")
        if not list_only:
            # the temporary directories of offlab processes killed outright (a capture's pcap, the engine's
            # ready files): nothing to put back, only to remove
            from offlab.state import sweep_private_tmp

            sweep_private_tmp()
        if report.failed:
            raise EnvironmentProblem(f"{len(report.failed)} setting(s) or host(s) could not be restored; "
                                     f"their journal is kept for the next `offlab restore`")
