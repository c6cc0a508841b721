"""Signals at the edges of offlab's handlers: while the CLI is still importing, and inside code where
Python swallows exceptions (a `__del__`, a weakref callback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from offlab.interrupts import EXIT_INTERRUPTED, Terminated, interrupts, protected, shielded
from tests.conftest import REPO

# A real `offlab lab list` that signals itself while the CLI's imports are under way: a meta path
# finder sends the signal when `typer` is first looked for (offlab.cli's first heavy import).
STARTING = """
import os, signal, sys
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), {signum})
        return None
sys.meta_path.insert(0, Finder())
sys.argv = ["offlab", "lab", "list"]
from offlab.__main__ import main
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_the_cli_imports_ends_it_with_one_line_and_130(signum, tmp_path):
    res = subprocess.run([sys.executable, "-c", STARTING.format(signum=int(signum))], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={"OFFLAB_STATE_DIR": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert res.returncode == EXIT_INTERRUPTED, res.stderr
    assert res.stderr == "offlab: interrupted while starting; nothing was changed\n"
    assert res.stdout == ""  # the command itself never ran


class _RaisesOnCollection:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __del__(self) -> None:
        raise self.exc  # what a signal handler does when its signal lands here


@pytest.mark.parametrize("exc,expect", [(KeyboardInterrupt(), KeyboardInterrupt), (Terminated(signal.SIGHUP), Terminated)])
def test_an_interrupt_python_swallows_is_raised_at_the_next_shielded_section(exc, expect):
    reached = []
    with pytest.raises(expect):
        with interrupts():
            obj = _RaisesOnCollection(exc)
            del obj  # Python prints "Exception ignored in ..." and goes on: offlab keeps it
            reached.append("after the swallowed interrupt")
            with shielded():
                reached.append("never: raised as the section is entered")
    assert reached == ["after the swallowed interrupt"]


def test_an_interrupt_swallowed_inside_a_shielded_section_is_raised_when_it_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts():
            with shielded():
                obj = _RaisesOnCollection(KeyboardInterrupt())
                del obj
                reached.append("the section runs to its end")
            reached.append("never")
    assert reached == ["the section runs to its end"]


def test_an_interrupt_swallowed_last_is_raised_when_the_handlers_go():
    with pytest.raises(KeyboardInterrupt):
        with interrupts():
            obj = _RaisesOnCollection(KeyboardInterrupt())
            del obj
    before = sys.unraisablehook
    with interrupts():
        pass
    assert sys.unraisablehook is before  # put back


def test_a_second_signal_while_offlab_ends_on_the_first_does_not_cut_its_cleanup_short():
    """The harness's double signals (a SIGTERM, then a SIGHUP 0.05 s later) lost the line that says how
    to resume: the second, raised when the teardown's shield ended, replaced the first on its way out."""
    import os

    cleaned = []
    with pytest.raises(Terminated) as raised:
        with interrupts():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0)  # a pause for the handler to run at
            finally:
                with shielded():  # the restore: a signal inside it, and one after it, change nothing
                    os.kill(os.getpid(), signal.SIGHUP)
                    cleaned.append("restored")
                os.kill(os.getpid(), signal.SIGINT)
                cleaned.append("the resume line")
    assert raised.value.signum == signal.SIGTERM and cleaned == ["restored", "the resume line"]
    with pytest.raises(KeyboardInterrupt):  # a later command's first signal is raised again
        with interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)


class _SignalledOnCollection:
    def __del__(self) -> None:
        import os

        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)  # offlab's handler runs here, inside __del__: Python swallows what it raises


def test_the_first_signal_python_swallows_is_not_taken_for_a_second_one():
    """The handler marks offlab as ending before it raises; swallowed (a `__del__` ran when the signal
    came), that interrupt was then dropped as "the second signal of an ending offlab" and the run went
    on to exit 0 (the signal harness, ns seeds 21 and 79, under stress-ng)."""
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts():
            obj = _SignalledOnCollection()
            del obj
            reached.append("after the swallowed interrupt")
            with shielded():
                reached.append("never: raised as the section is entered")
    assert reached == ["after the swallowed interrupt"]


# A real `offlab lab list` whose exit is signalled from an atexit function: the last moments of the process,
# after the command and its handlers are done (where a signal once killed offlab by its default action:
# exit -2, the harness's ns seed 8).
AT_EXIT = """
import atexit, os, signal, sys
if {signum}:
    atexit.register(lambda: os.kill(os.getpid(), {signum}))
sys.argv = ["offlab", "lab", "list"]
from offlab.__main__ import main
main()
"""


@pytest.mark.parametrize("signum", [0, signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name if s else "none")
def test_a_signal_as_offlab_exits_still_ends_it_130_with_its_one_line(signum, tmp_path):
    res = subprocess.run([sys.executable, "-c", AT_EXIT.format(signum=int(signum))], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={"OFFLAB_STATE_DIR": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if not signum:
        assert (res.returncode, res.stderr) == (0, ""), res.stderr
        return
    assert res.returncode == EXIT_INTERRUPTED, (res.returncode, res.stderr)
    assert res.stderr == "offlab: interrupted\n", res.stderr


def test_a_signal_as_a_protected_cleanup_begins_waits_until_it_has_run():
    """A cleanup a `with` or a `finally` calls (Transaction.__exit__, a run's teardown, process.stop) is
    @protected: a signal in its first instruction, before any `with shielded()` inside it could take hold,
    waits for it. A trace function sends the signal as the cleanup's frame starts."""
    done: list[str] = []

    @protected
    def cleanup() -> None:
        done.append("put back")

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is cleanup.__code__:
            sys.settrace(None)
            os.kill(os.getpid(), signal.SIGTERM)
        return None

    with pytest.raises(Terminated):
        with interrupts():
            sys.settrace(tracer)
            cleanup()
            done.append("went on")
    assert done == ["put back"]


def test_a_signal_while_calls_run_at_once_waits_until_every_one_has_ended():
    """`at_once` (a step on several SSH hosts on threads: masters connecting, leases taken): a Ctrl-C meanwhile is
    raised once every call has ended, never while one still runs on its thread (a master connecting there
    detached after the unwinding that closes masters had passed)."""
    import threading
    import time

    from offlab.hosts.ssh import at_once

    ended: list[str] = []
    started = threading.Event()

    def slow(name: str) -> None:
        started.set()
        time.sleep(0.3)
        ended.append(name)

    def signal_then_wait() -> None:
        started.wait(5)
        os.kill(os.getpid(), signal.SIGINT)
        slow("b")

    with pytest.raises(KeyboardInterrupt), interrupts():
        at_once([lambda: slow("a"), signal_then_wait])
    assert sorted(ended) == ["a", "b"]


def test_sigusr2_prints_where_each_thread_of_a_waiting_offlab_is_and_it_goes_on(tmp_path):
    # `hosts check /dev/stdin` waits to read its inventory from a pipe nobody writes yet: a stuck offlab
    proc = subprocess.Popen([sys.executable, "-m", "offlab", "hosts", "check", "/dev/stdin"], cwd=REPO,
                            env={**os.environ, "OFFLAB_STATE_DIR": str(tmp_path)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a hang guard: a loaded machine starts Python slowly
        while not _reading_stdin(proc.pid):  # its handler is in long before it reads
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
        assert proc.poll() is None  # it goes on
        out, err = proc.communicate("", timeout=120)  # a hang guard; an empty inventory is bad input
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "most recent call first" in err and "offlab/inventory.py" in err, err
    assert proc.returncode == 2 and err.strip().splitlines()[-1].startswith("offlab: error:"), err


def _reading_stdin(pid: int) -> bool:
    """Whether the process waits in read(2) (x86-64: syscall 0; /proc/PID/syscall) on its stdin's pipe."""
    try:
        fields = open(f"/proc/{pid}/syscall").read().split()
        return fields[0] == "0" and os.readlink(f"/proc/{pid}/fd/{int(fields[1], 16)}") == os.readlink(f"/proc/{pid}/fd/0")
    except (OSError, IndexError, ValueError):
        return False
