"""`pytest -p tests.cpu_account`: the CPU time of each test, every process it started included.

Where the suite's time goes on a 2-CPU machine is CPU more than waiting: this says which tests spend it.
Each pytest process (each xdist worker) moves itself into a cpuacct cgroup of its own at its start, so
every process a test starts (a QEMU guest, an sshd, offlab itself, even one that made itself a daemon)
is counted in it, and takes the cgroup's usage before and after each test (setup, call and teardown;
a module's shared lab or guest counts in the test that built it, and its idling in the tests that ran
beside it). Kernel work done outside those processes (softirqs charged to whoever ran) is not in it.
Each process writes `.venv/test-cpu/<pid>.json` ({nodeid: CPU seconds}) at its end, and leaves its
cgroup. Root only, cgroup v1's cpuacct; elsewhere it says so and counts nothing. Not part of `make test`.
"""

from __future__ import annotations

import json
import os

import pytest

ROOT = "/sys/fs/cgroup/cpuacct"
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv", "test-cpu")
_state: dict = {"path": None, "cpu": {}}


def _usage() -> float:
    with open(os.path.join(_state["path"], "cpuacct.usage")) as f:
        return int(f.read()) / 1e9


def pytest_configure(config):
    path = os.path.join(ROOT, f"offlab-tests-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        print(f"cpu_account: no cpuacct cgroup ({exc}): nothing counted")
        return
    _state["path"] = path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _state["path"] is None:
        yield
        return
    before = _usage()
    yield
    _state["cpu"][item.nodeid] = round(_usage() - before, 3)


def pytest_unconfigure(config):
    path = _state["path"]
    if path is None:
        return
    with open(os.path.join(ROOT, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    if _state["cpu"]:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
            json.dump(_state["cpu"], f, indent=1)
    try:
        os.rmdir(path)
    except OSError:
        pass  # a process a test left behind is still in it (the suite's leftover checks name it)
