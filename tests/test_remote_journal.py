"""The record a host keeps of the processes offlab starts there, exercised on this machine (LocalHost
runs the same shell an SSH host runs): the undo script ends exactly the recorded process, never
another that got its pid, and leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from offlab.hosts import LOCAL
from offlab.hosts import remote_journal
from offlab.hosts.process import RemoteProcess, process_start_time


def test_restore_sh_ends_a_recorded_process_and_its_runner_and_leaves_nothing(tmp_path):
    remote = tmp_path / "remote"
    p = RemoteProcess(LOCAL, ["sleep", "300"], remote_dir=str(remote))
    ids = [tuple(map(int, line.split())) for line in Path(p.dir, "ids").read_text().splitlines()]
    assert ids[0] == (p.pid, process_start_time(p.pid)) and len(ids) == 2  # the process, then its runner
    undo = list((remote / "undo").iterdir())
    assert [u.name for u in undo] == [Path(p.undo).name]
    assert undo[0].read_text().splitlines()[:2] == [
        "# offlab: stop sleep 300", f"# owner: {remote_journal.boot_id()} {os.getpid()} {process_start_time(os.getpid())}"]
    res = subprocess.run(["sh", str(remote / "restore.sh")], capture_output=True, text=True, timeout=30)
    assert (res.returncode, res.stdout) == (0, "restored: stop sleep 300\n"), res.stderr
    assert all(process_start_time(pid) is None for pid, _ in ids)
    assert not remote.exists()


def test_a_pid_that_belongs_to_another_process_now_is_never_signalled(tmp_path):
    remote = tmp_path / "remote"
    p = RemoteProcess(LOCAL, ["sleep", "300"], remote_dir=str(remote))
    other = subprocess.Popen(["sleep", "300"])  # what the kernel might have given the recorded pid since
    try:
        ids = Path(p.dir, "ids")
        start = process_start_time(other.pid)
        ids.write_text(f"{other.pid} {start + 1}\n" + ids.read_text().splitlines()[1] + "\n")
        res = subprocess.run(["sh", str(remote / "restore.sh")], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        assert other.poll() is None and process_start_time(other.pid) == start
        assert not remote.exists()
    finally:
        other.kill()
        other.wait()
        os.kill(p.pid, signal.SIGKILL)  # ours, left running by design of this test (its record named another)


def test_end_processes_leaves_a_live_owners_process_and_ends_a_dead_owners(tmp_path):
    remote = str(tmp_path / "remote")
    p = RemoteProcess(LOCAL, ["sleep", "300"], remote_dir=remote)
    assert remote_journal.end_processes(LOCAL, remote) == []  # its owner (this test) is alive
    assert process_start_time(p.pid) is not None
    assert remote_journal.end_processes(LOCAL, remote, list_only=True, force=True) == ["stop sleep 300"]
    assert process_start_time(p.pid) is not None
    assert remote_journal.end_processes(LOCAL, remote, also={os.getpid()}) == ["stop sleep 300"]
    assert process_start_time(p.pid) is None
    remote_journal.tidy(LOCAL, remote)
    assert not Path(remote).exists()


def test_a_process_collected_by_the_controller_leaves_no_record(tmp_path):
    remote = tmp_path / "remote"
    p = RemoteProcess(LOCAL, ["sh", "-c", "echo out; echo err >&2"], remote_dir=str(remote))
    assert p.communicate(timeout=30) == ("out\n", "err\n") and p.returncode == 0
    assert list((remote / "undo").iterdir()) == [] and list((remote / "proc").iterdir()) == []
    d, undo = remote_journal.temp_dir(LOCAL, str(remote))
    assert Path(d).is_dir() and Path(undo).is_file()
    remote_journal.drop_temp_dir(LOCAL, d, undo)
    remote_journal.tidy(LOCAL, str(remote))
    assert not remote.exists()


def test_a_killed_owner_not_yet_reaped_is_not_alive():
    """A runner killed with its parent stays a zombie until init reaps it: it owns nothing any more."""
    from offlab.state import me, owner_alive, proc_start

    child = subprocess.Popen(["sleep", "300"])
    owner = {"pid": child.pid, "start": proc_start(child.pid)}
    assert owner_alive(owner) and owner_alive(me())
    child.kill()
    for _ in range(100):  # not waited for: a zombie
        if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.01)
    assert not owner_alive(owner)
    child.wait()


def test_a_signal_during_a_remote_start_waits_for_its_answer_and_the_lab_teardown_of_its_process_ends_it(tmp_path):
    """A Ctrl-C while a host runs a start command: the start finishes and the process is recorded before
    the interrupt unwinds (the object that would stop it is never returned), and the teardown of the lab
    in the same process ends it: its own records are among those it ends (offlab.lab.hosts)."""
    import pytest

    from offlab.interrupts import interrupts

    remote = str(tmp_path / "remote")

    class SignalledDuringStart:  # LOCAL, with a Ctrl-C arriving as its start command runs
        name, shares_kernel = LOCAL.name, True

        def run(self, argv, **kwargs):
            if "proc" in " ".join(argv):
                os.kill(os.getpid(), signal.SIGINT)
            return LOCAL.run(argv, **kwargs)

    with pytest.raises(KeyboardInterrupt), interrupts():
        RemoteProcess(SignalledDuringStart(), ["sleep", "301"], remote_dir=remote)
    (started,) = Path(remote, "proc").iterdir()
    pid = int(Path(started, "ids").read_text().split()[0])
    assert process_start_time(pid) is not None  # began, and recorded
    assert remote_journal.end_processes(LOCAL, remote) == []  # its owner, this process, lives
    assert remote_journal.end_processes(LOCAL, remote, also={os.getpid()}) == ["stop sleep 301"]
    assert process_start_time(pid) is None
    remote_journal.tidy(LOCAL, remote)
    assert not Path(remote).exists()


def test_a_signal_while_a_temporary_directory_is_made_waits_for_it_to_be_recorded(tmp_path):
    """The engine's ready-file directory on an SSH host: made and recorded whole before a Ctrl-C unwinds, so the
    lab's teardown finds it (it could otherwise be made there after the teardown looked)."""
    import pytest

    from offlab.interrupts import interrupts

    remote = str(tmp_path / "remote")

    class SignalledWhileMaking:
        name, shares_kernel = LOCAL.name, True

        def run(self, argv, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            return LOCAL.run(argv, **kwargs)

    with pytest.raises(KeyboardInterrupt), interrupts():
        remote_journal.temp_dir(SignalledWhileMaking(), remote)
    assert [p.name for p in Path(remote, "proc").iterdir()] and list(Path(remote, "undo").iterdir())
    assert remote_journal.end_processes(LOCAL, remote, also={os.getpid()}) == ["remove a temporary directory"]
    remote_journal.tidy(LOCAL, remote)
    assert not Path(remote).exists()


STRAY = "1795981327378439642-proc-903c26ba"  # as a lost host kept one: a process directory, its undo gone


def test_restore_sh_removes_a_process_directory_whose_undo_script_is_gone(tmp_path):
    d = tmp_path / "remote"
    (d / "proc" / STRAY).mkdir(parents=True)
    (d / "undo").mkdir()
    (d / "restore.sh").write_text(remote_journal.RESTORE_SH.replace("{dir}", str(d)))
    res = subprocess.run(["sh", str(d / "restore.sh")], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert not d.exists(), sorted(str(p) for p in d.rglob("*"))


def test_tidy_removes_only_the_process_directories_with_no_undo_script(tmp_path):
    d = tmp_path / "remote"
    live = "1795981327378439643-proc-0123abcd"
    for name in (STRAY, live):
        (d / "proc" / name).mkdir(parents=True)
    (d / "undo").mkdir()
    (d / "undo" / f"{live}.sh").write_text("# offlab: stop sleep\n")  # a process still recorded: kept
    remote_journal.tidy(LOCAL, str(d))
    assert sorted(p.name for p in (d / "proc").iterdir()) == [live]
    (d / "undo" / f"{live}.sh").unlink()
    remote_journal.tidy(LOCAL, str(d))
    assert not d.exists(), sorted(str(p) for p in d.rglob("*"))


def test_a_lease_that_lapses_or_is_released_removes_a_stray_process_directory_too(tmp_path):
    """The lease's watchdog tidies the directory after a lapse, and a release after its lease goes: both
    remove a process directory whose undo script is gone, as restore.sh does, or the directory stayed."""
    from offlab.hosts import lease

    for how in ("lapse", "release"):
        d = tmp_path / how / "remote"
        (d / "proc" / STRAY).mkdir(parents=True)
        (d / "undo").mkdir()
        if how == "lapse":
            dog = d / "lease" / "l1"
            dog.mkdir(parents=True)
            (dog / "deadline").write_text("0 0\n")  # lapsed already: it puts back what it owns (nothing), then tidies
            (dog / "own").write_text("")
            (dog / "label").write_text("test\n")
            argv = ["sh", "-c", lease.WATCHDOG, "sh", str(dog), str(d)]
        else:
            argv = ["sh", "-c", lease._TIDY + 'tidy "$1"', "sh", str(d)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # a hang guard
        assert res.returncode == 0, (how, res.stderr)
        assert not d.exists(), (how, sorted(str(p) for p in d.rglob("*")))
