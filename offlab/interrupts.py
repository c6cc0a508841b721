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

Once a signal has been raised, offlab is ending: a second one (Ctrl-C pressed again, a scheduler's
SIGTERM after a dropped terminal's SIGHUP) is noted and not raised, so that it cannot cut short the
restore, the teardown or the line that says how to resume. The exit stays 130.

A signal whose exception Python swallows (it arrived while a `__del__` or a weakref callback ran,
e.g. inside an import: "Exception ignored in ...") is not lost: it is raised again at the next
shielded section's edge, or when `interrupts()` ends.

A cleanup that a `with` statement or a `finally` calls (a transaction's `__exit__`, a run's teardown)
is a `@protected` function: the whole call is one shielded section, from its first instruction. A
`with shielded():` inside the function itself comes a few instructions in, and a signal that landed
in between (the harness found one: SIGTERM as a run's transaction closed) skipped the whole cleanup.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Callable, Iterator, TypeVar

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
    installed: int = 0  # interrupts() blocks open (nested: a bisect's runs)
    ending: int | None = None  # the signal raised: offlab is unwinding to its exit; later ones are not raised
    raised: BaseException | None = None  # the exception `ending`'s signal became
    # the first signal that reached offlab's handler, whatever became of it: the process exits 130 if one
    # did (`final_exit`), even one that came after the command had done its work
    signalled: int | None = None
    said: bool = False  # "offlab: interrupted" was printed
    pending: list[int] = field(default_factory=list)
    swallowed: list[int] = field(default_factory=list)  # raised where Python ignores exceptions


_SHIELD = _Shield()


def keep_for_life() -> None:
    """Leave every object made so far out of Python's collections from now on, its exit's included.

    Called once offlab's modules are imported and again as a command ends: Python's exit otherwise
    walks every object the imports made (sqlalchemy, pydantic, typer: 0.3 s of CPU here, 1-3 s of
    wall on a loaded 2-core machine, after the restore and before the exit a signal waits for) only to
    free memory the process is about to give back. Objects that live as long as the process lose
    nothing by it."""
    gc.freeze()


def interrupt_for(signum: int) -> BaseException:
    """The exception a signal becomes."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raising(signum: int) -> BaseException:
    """The exception for a signal that ends offlab now: from here on, further signals are not raised."""
    _SHIELD.ending = signum
    _SHIELD.raised = interrupt_for(signum)
    return _SHIELD.raised


def is_interrupt(exc: BaseException | None) -> bool:
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def _handler(signum: int, frame: FrameType | None) -> None:
    if _SHIELD.signalled is None:
        _SHIELD.signalled = signum
    if _SHIELD.ending is not None:
        return  # already ending on a signal: its cleanup goes on to the end
    if _SHIELD.depth > 0 or _entering_protected(frame):
        _SHIELD.pending.append(signum)
        return
    raise _raising(signum)


F = TypeVar("F", bound=Callable)
_OUT = "_interrupts_left"  # the wrapper's local set once its section has ended


def protected(fn: F) -> F:
    """`fn` as one shielded section from its very first instruction (a cleanup called by a `with` or a
    `finally`): a signal that lands before the section is entered waits like one inside it (the handler
    finds this wrapper's frame on the stack, not yet entered), and is raised as the section ends."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _main_thread():
            return fn(*args, **kwargs)
        _SHIELD.depth += 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _interrupts_left = True  # noqa: F841  (read by the handler through the frame: see _OUT)
            _end_section(exc)
            raise
        _interrupts_left = True  # noqa: F841  (set while the depth still counts: nothing lands in between)
        _end_section(None)
        return result

    return wrapper  # type: ignore[return-value]


# Every @protected function's wrapper runs this one code object (a nested function's code is a constant of
# the function that defines it): a frame running it is a protected call.
_WRAPPER: CodeType = next(c for c in protected.__code__.co_consts if isinstance(c, CodeType) and c.co_name == "wrapper")


def _entering_protected(frame: FrameType | None) -> bool:
    """Whether the signal landed in a @protected call whose section has not begun yet (depth not counted
    yet): its wrapper is on the stack and has not set its end marker."""
    while frame is not None:
        if frame.f_code is _WRAPPER:
            return _OUT not in frame.f_locals
        frame = frame.f_back
    return False


def _signum_of(exc: BaseException | None) -> int | None:
    if isinstance(exc, Terminated):
        return exc.signum
    return signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None


def _unraisable_hook(previous):
    """sys.unraisablehook while offlab's handlers are in: an interrupt Python would only print
    ("Exception ignored in ...") is kept, to be raised at the next safe point."""
    def hook(unraisable) -> None:
        signum = _signum_of(unraisable.exc_value)
        if signum is None:
            previous(unraisable)
            return
        if _SHIELD.ending is not None and unraisable.exc_value is _SHIELD.raised:
            # the very interrupt that began the ending, swallowed before anything saw it: not ending yet, so
            # it is kept below like any swallowed one (else offlab went on as if no signal had come, exit 0)
            _SHIELD.ending = _SHIELD.raised = None
        if _SHIELD.ending is not None:
            pass  # the second signal of an ending offlab
        elif _SHIELD.depth > 0:
            _SHIELD.pending.append(signum)
        else:
            _SHIELD.swallowed.append(signum)
    return hook


def _raise_swallowed() -> None:
    if _SHIELD.swallowed and _SHIELD.depth == 0:
        signum = _SHIELD.swallowed[0]
        _SHIELD.swallowed.clear()
        raise _raising(signum)


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
    old_hook = sys.unraisablehook
    _SHIELD.installed += 1
    try:
        with shielded():  # installing is a section too: a signal between two signal() calls waits
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            sys.unraisablehook = _unraisable_hook(old_hook)
            for s in SIGNALS:
                if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                    continue  # nohup: the user asked for the run to outlive the terminal
                old[s] = signal.signal(s, _handler)
        yield
        _raise_swallowed()
    finally:
        with shielded():
            for s, handler in old.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]
            sys.unraisablehook = old_hook
        _SHIELD.installed -= 1
        if _SHIELD.installed == 0:
            _SHIELD.ending = None


def signalled() -> bool:
    """Whether a SIGINT, SIGTERM or SIGHUP has reached offlab's handler in this process."""
    return _SHIELD.signalled is not None


def ending() -> bool:
    """Whether offlab is unwinding to its exit on a signal (its restore and teardown under way)."""
    return _SHIELD.ending is not None


def say_interrupted() -> None:
    """The one line an interrupted offlab ends with, printed once."""
    if not _SHIELD.said:
        _SHIELD.said = True
        sys.stderr.write("offlab: interrupted\n")
        sys.stderr.flush()


def final_exit(code: object) -> None:
    """End the process with `code` (a SystemExit's), or 130 if a signal reached offlab at any time, also
    after its command had done its work. Signals are blocked first, then the exit's own work is done
    here (non-daemon threads joined, atexit functions run, output flushed) and the process ends with
    os._exit: Python's own finalization puts the default handlers back first, and a signal that came
    in those last milliseconds ended the process by its default action (killed by SIGINT, exit -2,
    or an exit 0 that never said it was interrupted). One still pending at the end counts too."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    rc = code if isinstance(code, int) else (0 if code is None else 1)
    if not isinstance(code, int) and code is not None:
        sys.stderr.write(f"{code}\n")
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # what Python's exit does first
    with contextlib.suppress(Exception):
        import atexit

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # Looked at last, right before the exit: a signal that came while the output went (a pipe under a loaded
    # machine: tens of ms) counts too. One after this instant comes to a process that has ended its work.
    pending = set(signal.sigpending()) & set(SIGNALS)
    if pending and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        pending.discard(signal.SIGHUP)  # nohup's choice
    if _SHIELD.signalled is not None or pending:
        if rc != EXIT_INTERRUPTED:
            with contextlib.suppress(Exception):
                say_interrupted()
        rc = EXIT_INTERRUPTED
    os._exit(rc)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A section no signal may cut short (a restore, a teardown). A SIGINT/SIGTERM/SIGHUP that
    arrives inside is raised as soon as the outermost shielded section ends; if another exception
    is leaving the section, the interrupt replaces it (an error must not hide a Ctrl-C from a
    caller that handles errors and goes on), unless it is already an interrupt."""
    if not _main_thread():
        yield
        return
    _raise_swallowed()
    _SHIELD.depth += 1
    try:
        yield
    except BaseException as exc:
        _end_section(exc)
        raise
    _end_section(None)


def _end_section(leaving: BaseException | None) -> None:
    """Leave one shielded level; at the outermost, raise the first signal that arrived inside: in place of
    the exception `leaving` the section, unless that is an interrupt already."""
    signum = _leave()
    if signum is None or is_interrupt(leaving):
        return
    if leaving is None:
        raise _raising(signum)
    raise _raising(signum) from leaving


def _leave() -> int | None:
    """Leave one shielded level; at the outermost, the first signal that arrived inside (if any)."""
    _SHIELD.depth -= 1
    if _SHIELD.depth == 0 and _SHIELD.swallowed:
        _SHIELD.pending += _SHIELD.swallowed
        _SHIELD.swallowed.clear()
    if _SHIELD.depth > 0 or not _SHIELD.pending:
        return None
    signum = _SHIELD.pending[0]
    _SHIELD.pending.clear()
    return signum
