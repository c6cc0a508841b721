"""A process on a channel host (a guest's agent, SSH) costs few round trips: its directory and start in
one command, its end (exit code, output, clean-up) in one, after a wait for its exit-code file that
the host does itself (a guest's agent on inotify, without a command). Run here against this machine's
shell through a host that counts its commands and its waits (RemoteProcess only ever uses host.run and
host.wait_for_file)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from offlab.hosts import LOCAL
from offlab.hosts.process import RemoteProcess, stop


class Counting:
    """This machine's shell, seen as a channel host: every command counted."""

    name = "counting"
    shares_kernel = False

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []
        self.waits: list[str] = []

    def run(self, argv, **kw):
        self.argvs.append(list(argv))
        return LOCAL.run(argv, **kw)

    def wait_for_file(self, path, seconds):
        self.waits.append(path)
        deadline = time.monotonic() + seconds
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return os.path.exists(path)


def test_a_finished_process_costs_two_commands_and_leaves_nothing_behind():
    host = Counting()
    proc = RemoteProcess(host, ["sh", "-c", 'printf "out\\n\\nlast"; echo "err line" >&2; exit 3'])
    assert os.path.isdir(proc.dir)
    out, err = proc.communicate(timeout=20)
    assert (out, err, proc.returncode) == ("out\n\nlast", "err line\n", 3)
    assert len(host.argvs) == 2  # start; the end (code, output, clean-up) in one
    assert host.waits and set(host.waits) == {f"{proc.dir}/rc"}  # the wait was the host's, not a command
    assert not os.path.exists(proc.dir)
    stop(proc)  # already ended and cleaned: nothing more to ask
    assert len(host.argvs) == 2


def test_wait_times_out_on_a_running_process_and_stop_ends_it():
    host = Counting()
    proc = RemoteProcess(host, ["sleep", "30"])
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.5)
    assert proc.poll() is None and os.path.isdir(proc.dir)
    stop(proc, grace=5)
    assert proc.returncode == 128 + signal.SIGINT  # the shell's code for a child ended by SIGINT
    assert not os.path.exists(proc.dir)


def test_a_program_that_is_not_there_ends_127_and_says_so_on_stderr():
    proc = RemoteProcess(Counting(), ["no-such-program-here"])
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 127 and "no-such-program-here" in err and out == ""


def test_a_helper_started_to_die_with_its_parent_ends_when_the_parent_is_killed_outright():
    """die_with_parent (PR_SET_PDEATHSIG): a parent that spawns a child with it and is then killed with
    SIGKILL, the way a timeout kills `offlab fleet run`, leaves no child behind."""
    import subprocess
    import sys
    import time

    import signal

    from offlab.hosts.process import running, signal_pid

    code = ("import subprocess, sys, time\n"
            "from offlab.hosts.process import die_with_parent\n"
            "p = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert running(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child)
    finally:
        parent.kill()
        parent.wait()
        if child is not None and running(child):  # the test failed: the sleep is ours to end
            signal_pid(child, signal.SIGKILL)


class Deaf(Counting):
    """A host that takes every command but `kill`: what a guest too loaded to act on one in time looks like."""

    def run(self, argv, **kw):
        if argv and argv[0] == "kill":
            self.argvs.append(list(argv))
            return LOCAL.run(["true"])
        return super().run(argv, **kw)


def test_a_process_still_there_after_sigkill_is_left_to_its_host_and_stop_does_not_raise(monkeypatch):
    # stop() runs in `finally` blocks: an error of its own there replaced the interrupt that was unwinding
    # (the signal harness's guest seed 63 under stress-ng: exit 1 with a traceback instead of 130).
    from offlab.hosts import process

    monkeypatch.setattr(process, "KILLED_WAIT_S", 0.3, raising=False)
    host = Deaf()
    proc = RemoteProcess(host, ["sleep", "30"])
    try:
        stop(proc, grace=0.3)
        assert [a[:2] for a in host.argvs if a[0] == "kill"] == [["kill", "-2"], ["kill", "-9"]]
        assert proc.returncode is None and os.path.isdir(proc.dir)  # not ended: its directory is kept
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
        proc.cleanup()
    assert not os.path.exists(proc.dir)


def test_while_offlab_ends_on_a_signal_a_process_gets_short_waits(monkeypatch):
    # an interrupted run needs nothing a process would still print: 0.5 s after SIGINT, 2 s after SIGKILL
    from offlab.hosts import process

    waited: list[float] = []

    class Timed(Deaf):
        def wait_for_file(self, path, seconds):
            waited.append(seconds)
            return super().wait_for_file(path, seconds)

    monkeypatch.setattr(process, "ending", lambda: True)
    host = Timed()
    proc = RemoteProcess(host, ["sleep", "30"])
    try:
        stop(proc, grace=5)
        assert [a[:2] for a in host.argvs if a[0] == "kill"] == [["kill", "-2"], ["kill", "-9"]]
        # what it asked its host to wait for: at most 0.5 s after SIGINT (grace=5 otherwise), 2 s after SIGKILL
        assert waited[0] <= process.ENDING_GRACE_S and max(waited) <= process.ENDING_KILLED_WAIT_S, waited
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
        proc.cleanup()
