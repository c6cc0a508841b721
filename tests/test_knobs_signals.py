"""A process killed in the middle of a transaction: SIGINT, SIGTERM and SIGHUP restore by themselves
(also when the process started with SIGINT ignored or blocked, as a shell's background job does),
SIGKILL leaves a journal that `offlab restore` replays. In every case the lab ends as it began. A
signal that arrives during a restore is raised as soon as the restore ends, never lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from offlab import lab as labs
from offlab.experiment import teardown
from tests.conftest import REPO, offlab_cli, requires_root
from tests.helpers import journals, lab_state

pytestmark = [requires_root, pytest.mark.network]

CELL = """
import sys, time
from offlab.lab import LabState
from offlab.knobs import Change, Transaction
lab = LabState.load(sys.argv[1])
c = lab.client
with Transaction(label="signal test") as tx:
    out = tx.apply([Change(c, "gro", "on", None, lab), Change(c, "tx", "off", None, lab),
                    Change(c, "mtu", 9000, None, lab), Change(c, "qdisc", "pfifo_fast", None, lab),
                    Change(c, "net.ipv4.ip_forward", 1, None, lab)])
    assert all(o.ok for o in out), [o.line() for o in out]
    print("applied", flush=True)
    time.sleep(60)
"""


def _as_started(ignored: tuple[int, ...] = (), blocked: tuple[int, ...] = ()):
    """preexec_fn: the child starts with these signals ignored / blocked, as a parent can leave them
    (a non-interactive shell's `cmd &` ignores SIGINT; `nohup` ignores SIGHUP)."""
    def setup() -> None:
        for s in ignored:
            signal.signal(s, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    return setup


def _spawn(script: str, lab_name: str, args: tuple[str, ...] = (), **start) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, lab_name, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_as_started(**start))


def _mask(pid: int, field: str) -> int:
    """SigIgn / SigCgt / SigBlk of a process, as a bit mask (bit n-1 is signal n)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(l.split()[1] for l in f if l.startswith(field + ":")), 16)


def _bit(signum: int) -> int:
    return 1 << (signum - 1)


@pytest.mark.parametrize("signum,start", [
    (signal.SIGINT, {}), (signal.SIGTERM, {}), (signal.SIGHUP, {}), (signal.SIGKILL, {}),
    # The flaky `make test` runs: a pytest started as a shell's background job passes SIGINT ignored
    # to every child, and Python then installs no KeyboardInterrupt; a parent may also leave it blocked.
    (signal.SIGINT, {"ignored": (signal.SIGINT,)}), (signal.SIGINT, {"blocked": (signal.SIGINT,)}),
], ids=["sigint", "sigterm", "sighup", "sigkill", "sigint-inherited-ignored", "sigint-inherited-blocked"])
def test_killed_cell_ends_with_every_setting_back(signum, start, lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = _spawn(CELL, lab_name, **start)
        try:
            assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
            assert lab_state(lab) != before
            listed = offlab_cli("restore", "--list")
            assert "belongs to running process" in listed.stdout and "would restore" not in listed.stdout
            os.kill(proc.pid, signum)
            rc = proc.wait(timeout=20)  # a hang guard: a restore takes well under a second here
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert rc == -signal.SIGKILL if signum == signal.SIGKILL else rc != 0
        if signum == signal.SIGINT:
            assert rc == -signal.SIGINT  # Python's own exit for an uncaught KeyboardInterrupt
        if signum in (signal.SIGTERM, signal.SIGHUP):
            assert rc == 130  # offlab's one exit code for an interrupt (README)
        if signum == signal.SIGKILL:
            assert len(journals(state_dir)) == 1
            assert lab_state(lab) != before
            res = offlab_cli("restore")
            assert res.returncode == 0 and res.stdout.count("restored ") == 5, res.stdout + res.stderr
        assert lab_state(lab) == before
        assert journals(state_dir) == []
    finally:
        teardown.down(lab_name)


def test_restore_force_takes_over_a_live_process_journal(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = _spawn(CELL, lab_name)
        try:
            assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
            assert "left alone" in offlab_cli("restore").stdout
            assert lab_state(lab) != before
            res = offlab_cli("restore", "--force")
            assert res.returncode == 0 and res.stdout.count("restored ") == 5, res.stdout + res.stderr
            assert lab_state(lab) == before and journals(state_dir) == []
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=20) == 130  # timeout: a hang guard
            assert "warning" not in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert lab_state(lab) == before
    finally:
        teardown.down(lab_name)


# A signal sent at a chosen point: the restore itself sends it (offlab's restore_entries, wrapped here),
# so it arrives inside the shielded restore every time.
SIGNAL_IN_RESTORE = """
import os, sys, time
from offlab.lab import LabState
from offlab.knobs import Change, Transaction
from offlab.knobs import transaction as t
lab, signum = LabState.load(sys.argv[1]), int(sys.argv[2])
c = lab.client
real, sent = t.restore_entries, []
def restore_entries(entries, report):
    if not sent:
        sent.append(os.kill(os.getpid(), signum))
    real(entries, report)
    print(f"restored {len(report.lines)}", flush=True)
"""

AN_ERROR_DURING_RESTORE = SIGNAL_IN_RESTORE + """
t.restore_entries = restore_entries
try:
    with Transaction(label="signal test") as tx:
        assert all(o.ok for o in tx.apply([Change(c, "gro", "on", None, lab), Change(c, "mtu", 9000, None, lab)]))
        raise ValueError("the cell failed")
except ValueError:  # a caller that handles a failed cell and goes on: the signal must not be lost here
    print("went on", flush=True)
    time.sleep(60)
"""

A_SWITCH = SIGNAL_IN_RESTORE + """
with Transaction(label="signal test") as tx:
    assert all(o.ok for o in tx.switch([Change(c, "gro", "on", None, lab), Change(c, "mtu", 9000, None, lab)]))
    t.restore_entries = restore_entries
    try:
        tx.switch([Change(c, "tx", "off", None, lab)])  # gro and mtu go back, then tx off would be set
        print("switched", flush=True)
    except BaseException:
        print(f"interrupted with {tx.counts['applied']} applied, {tx.counts['restored']} restored", flush=True)
        raise
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["sigint", "sigterm", "sighup"])
def test_signal_during_the_restore_after_an_error_is_raised_not_lost(signum, lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = _spawn(AN_ERROR_DURING_RESTORE, lab_name, args=(str(signum),))
        try:
            out, err = proc.communicate(timeout=20)  # a hang guard: "went on" would sleep 60 s
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert out.split("\n") == ["restored 2", ""], out + err  # the restore finished first
        assert proc.returncode == (-signal.SIGINT if signum == signal.SIGINT else 130), err
        assert lab_state(lab) == before and journals(state_dir) == []
    finally:
        teardown.down(lab_name)


def test_signal_during_a_switch_acts_as_soon_as_its_restore_ends(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = _spawn(A_SWITCH, lab_name, args=(str(signal.SIGTERM),))
        try:
            out, err = proc.communicate(timeout=20)  # a hang guard
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # Both settings were put back (not one, cut short), and tx off was never set.
        assert out.split("\n")[:2] == ["restored 2", "interrupted with 2 applied, 2 restored"], out + err
        assert proc.returncode == 130, err
        assert lab_state(lab) == before and journals(state_dir) == []
    finally:
        teardown.down(lab_name)


def test_a_sighup_ignored_at_start_stays_ignored_and_others_are_caught(lab_name, clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        for start, hup_ignored in (({"ignored": (signal.SIGHUP,)}, True), ({}, False)):
            proc = _spawn(CELL, lab_name, **start)
            try:
                assert proc.stdout.readline().strip() == "applied", proc.stderr.read()
                ignored, caught = _mask(proc.pid, "SigIgn"), _mask(proc.pid, "SigCgt")
                assert bool(ignored & _bit(signal.SIGHUP)) == hup_ignored  # nohup's choice is kept
                assert bool(caught & _bit(signal.SIGHUP)) != hup_ignored
                assert caught & _bit(signal.SIGINT) and caught & _bit(signal.SIGTERM)
                os.kill(proc.pid, signal.SIGTERM)
                assert proc.wait(timeout=20) == 130  # a hang guard
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert lab_state(lab) == before and journals(state_dir) == []
    finally:
        teardown.down(lab_name)


# The harness's ns seed 80 (SIGTERM 0.81 s after a run's last sample): the signal landed as the run's
# transaction began to close, before its restore's shield took hold, and the whole restore was skipped
# (the lab's teardown then took the namespaces, and the journal stayed). Here the signal is sent at that
# instant every time: when Transaction.__exit__'s frame starts (a trace function sends it).
AS_IT_CLOSES = """
import os, sys, threading
from offlab.lab import LabState
from offlab.knobs import Change, Transaction
lab, signum = LabState.load(sys.argv[1]), int(sys.argv[2])
c = lab.client
def tracer(frame, event, arg):
    if event == "call" and frame.f_code is Transaction.__exit__.__code__:
        sys.settrace(None)
        os.kill(os.getpid(), signum)
    return None
with Transaction(label="signal test") as tx:
    assert all(o.ok for o in tx.apply([Change(c, "gro", "on", None, lab), Change(c, "mtu", 9000, None, lab)]))
    sys.settrace(tracer)
print("went on", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["sigint", "sigterm", "sighup"])
def test_a_signal_as_the_transaction_begins_to_close_still_puts_everything_back(signum, lab_name, clean_machine,
                                                                                 state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = _spawn(AS_IT_CLOSES, lab_name, args=(str(signum),))
        out, err = proc.communicate(timeout=60)  # a hang guard
        assert "went on" not in out, out + err  # the signal was raised, once the restore was done
        assert proc.returncode == (-signal.SIGINT if signum == signal.SIGINT else 130), err
        assert lab_state(lab) == before and journals(state_dir) == [], err
    finally:
        teardown.down(lab_name)


# `offlab lab set` as a person runs it, the signal landing as its third setting begins (a trace function
# counts the transaction's `_apply_one` calls): the two made go back, the journal goes, exit 130.
LAB_SET_CUT = """
import os, sys
from offlab.knobs.transaction import Transaction
signum, calls = int(sys.argv[2]), []
def tracer(frame, event, arg):
    if event == "call" and frame.f_code is Transaction._apply_one.__code__:
        calls.append(1)
        if len(calls) == 3:
            sys.settrace(None)
            os.kill(os.getpid(), signum)
    return None
sys.settrace(tracer)
sys.argv = ["offlab", "lab", "set", sys.argv[1], "client", "to-server", "gro=on", "mtu=9000", "tx=off", "qdisc=pfifo_fast"]
from offlab.__main__ import main
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["sigint", "sigterm", "sighup"])
def test_a_signal_in_the_middle_of_lab_set_puts_back_what_it_had_made_and_exits_130(signum, lab_name,
                                                                                   clean_machine, state_dir):
    lab = labs.up("veth", lab_name)
    try:
        before = lab_state(lab)
        proc = _spawn(LAB_SET_CUT, lab_name, args=(str(signum),))
        out, err = proc.communicate(timeout=60)  # a hang guard
        assert proc.returncode == 130, out + err
        assert "interrupted" in err and "Traceback" not in err, err
        assert lab_state(lab) == before and journals(state_dir) == [], out + err
        # the same command, not cut short, keeps its settings (journalled) until restore
        res = offlab_cli("lab", "set", lab_name, "client", "to-server", "gro=on", "mtu=9000")
        assert res.returncode == 0 and lab_state(lab) != before, res.stdout + res.stderr
        assert offlab_cli("restore").returncode == 0 and lab_state(lab) == before
    finally:
        teardown.down(lab_name)
