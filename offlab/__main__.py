"""`offlab` and `python -m offlab` start here. offlab's signal handlers go in before anything heavy is
imported (the CLI's imports take a good part of a second), so a Ctrl-C, SIGTERM or SIGHUP that arrives
while offlab is still starting ends it like any other: one line, exit 130, no traceback. Nothing has
been changed at that point, so there is nothing to put back. (Python's own start, before this file
runs, is out of offlab's reach: a signal then ends Python as its default handler does.)"""

import faulthandler
import os
import signal
import sys

_STARTING = "offlab: interrupted while starting; nothing was changed\n"


def _starting(signum, frame) -> None:  # noqa: ARG001
    os.write(2, _STARTING.encode())
    os._exit(130)  # offlab.interrupts.EXIT_INTERRUPTED, not imported yet


def main() -> None:
    # `kill -USR2 PID`: where each of its threads is, printed on its stderr; the command goes on. For an
    # offlab that seems stuck: what it waits on, before it is interrupted or killed.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) != signal.SIG_IGN or s != signal.SIGHUP:  # nohup stays nohup
            signal.signal(s, _starting)
    from offlab.interrupts import (EXIT_INTERRUPTED, final_exit, interrupts, is_interrupt, keep_for_life,
                                   say_interrupted, shielded)

    code: object = 0
    try:
        with interrupts():
            try:
                # Shielded: a signal is raised once the import is done, never inside importlib's own
                # callbacks, where Python would print it as ignored and go on.
                with shielded():
                    from offlab.cli import main as cli
            except BaseException as exc:
                if not is_interrupt(exc):
                    raise
                sys.stderr.write(_STARTING)
                sys.exit(EXIT_INTERRUPTED)
            keep_for_life()
            try:
                cli()
            finally:
                keep_for_life()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        # one that came after the command's own handling (its leases' release, the handlers' return):
        # everything was put back by then
        say_interrupted()
        code = EXIT_INTERRUPTED
    # From here to the process's end a signal can no longer cut anything short: exit 130 if one came
    final_exit(code)


if __name__ == "__main__":
    main()
