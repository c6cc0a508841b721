"""SIGINT, SIGTERM and SIGHUP end offlab the same way: an exception that unwinds through every
`finally`, so settings go back, labs come down and processes end before the process exits 130.

    with interrupts():          # installs the handlers (main thread), puts the previous ones back
        ...
        with shielded():        # a restore, a teardown: a signal here waits until the block ends,
            ...                 # then is raised at once
        ...

SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP raise `Terminated`. A SIGHUP ignored when
offlab started (`nohup`, a terminal multiplexer) stays ignored: that is the user's choice. An
ignored SIGINT is not: a non-interactive shell starts every background job (`offlab run … &`) with
SIGINT ignored (POSIX), and Python then installs no KeyboardInterrupt at all, so `kill -INT PID`
would do nothing. Signals inherited blocked are unblocked for the same reason.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field
from typing import Iterator

EXIT_INTERRUPTED = 130  # one exit code for SIGINT, SIGTERM and SIGHUP (README, docs/knobs.md)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived: raised so that every `finally` (and `Transaction.__exit__`) runs."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(EXIT_INTERRUPTED)
        self.signum = signum


@dataclass
class _Shield:
    """The main thread's shielded sections: how deep, and the signals that arrived meanwhile.
    Process-wide because signal handlers are: one record for the one main thread."""

    depth: int = 0
    pending: list[int] = field(default_factory=list)


_SHIELD = _Shield()


def interrupt_for(signum: int) -> BaseException:
    """The exception a signal becomes."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def is_interrupt(exc: BaseException | None) -> bool:
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def _handler(signum: int, frame) -> None:  # noqa: ARG001
    if _SHIELD.depth > 0:
        _SHIELD.pending.append(signum)
        return
    raise interrupt_for(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """offlab's handlers for SIGINT, SIGTERM and SIGHUP while the block runs (main thread only;
    elsewhere a no-op: Python runs handlers in the main thread). The previous handlers come back
    at the end, put back inside a shield so that no signal finds a handler half restored."""
    if not _main_thread():
        yield
        return
    old: dict[int, object] = {}
    try:
        with shielded():  # installing is a section too: a signal between two signal() calls waits
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            for s in SIGNALS:
                if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                    continue  # nohup: the user asked for the run to outlive the terminal
                old[s] = signal.signal(s, _handler)
        yield
    finally:
        with shielded():
            for s, handler in old.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A section no signal may cut short (a restore, a teardown). A SIGINT/SIGTERM/SIGHUP that
    arrives inside is raised as soon as the outermost shielded section ends; if another exception
    is leaving the section, the interrupt replaces it (an error must not hide a Ctrl-C from a
    caller that handles errors and goes on), unless it is already an interrupt."""
    if not _main_thread():
        yield
        return
    _SHIELD.depth += 1
    try:
        yield
    except BaseException as exc:
        signum = _leave()
        if signum is not None and not is_interrupt(exc):
            raise interrupt_for(signum) from exc
        raise
    signum = _leave()
    if signum is not None:
        raise interrupt_for(signum)


def _leave() -> int | None:
    """Leave one shielded level; at the outermost, the first signal that arrived inside (if any)."""
    _SHIELD.depth -= 1
    if _SHIELD.depth > 0 or not _SHIELD.pending:
        return None
    signum = _SHIELD.pending[0]
    _SHIELD.pending.clear()
    return signum
