"""Helpers that several test modules use (fixtures live in conftest.py); no test module imports another."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import site
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from offlab.store import Store
from tests.conftest import OUR_NAMESPACES, REPO, kill_9_once_daemon_is_recorded, netns_names, requires_root, running

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
DEBIAN_PYTHON = "/usr/bin/python3"
SYSCTLS = ("net.ipv4.tcp_rmem", "net.core.somaxconn", "net.ipv4.ip_forward")


def one_line_error(res: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert res.returncode == code, (res.returncode, res.stderr)
    assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process: offlab's own entry (`offlab.cli.main`) with argv, stdout and stderr its own,
    and `env` (e.g. OFFLAB_STATE_DIR, OFFLAB_DB, COLUMNS) set for the call; the exit code as the process
    would give it. No interpreter start (about a quarter CPU-second each): for the tests that check what a
    command prints and its exit code. A handful of tests keep starting the real `python -m offlab`
    (tests.conftest.offlab_cli) to prove the one-line, traceback-free error end to end."""
    import io

    from offlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    sys.argv = ["offlab", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old_argv
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def ended(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """An offlab's output once it has ended, within `timeout` (a hang guard, not a speed test). One that
    has not ended by then is asked where its threads are (`kill -USR2`: offlab's faulthandler prints
    their stacks on its stderr and goes on), then killed; the test fails with those stacks, not with a
    bare timeout."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR2)
        time.sleep(1)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"pid {proc.pid} did not end within {timeout:g} s; its stderr, with its threads' stacks:\n"
                    f"{(err or '')[-6000:]}\nstdout: {(out or '')[-1000:]}")


def run_with_env(env: dict, *args: str) -> subprocess.CompletedProcess:
    """`run` with these environment variables set for the call (e.g. a module lab's OFFLAB_STATE_DIR)."""
    return run(*args, env=env)


def run_until_samples(plan_path, db, state_dir, samples: int, timeout: float = 90):
    """Start `offlab run` on a plan; return (process, store, env) once `samples` samples are stored.
    A run that dies first, or stores fewer within `timeout`, fails the test (the run ended)."""
    env = {**os.environ, "OFFLAB_STATE_DIR": str(state_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "offlab", "run", str(plan_path), "--db", str(db)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = Store.open(db)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = store.list_runs()
        if runs and len(store.samples(runs[0]["id"])) >= samples:
            return proc, store, env
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    raise AssertionError(f"the background run stored fewer than {samples} samples in {timeout:g} s")


def pair_plan(name: str, rounds: int, rate: str | None = "100M") -> str:
    """The small plan the host-pair tests and benchmarks/fleet_scale run: iperf3 TCP 1 s at `rate` (None:
    unlimited) with the server's gro off and on, `rounds` samples of each. The tests check where samples go
    and what is put back, not how fast: unlimited TCP would take the machine's 2 CPUs for every sample."""
    limit = f", rate: {rate}" if rate else ""
    return textwrap.dedent(f"""
        name: {name}
        topology: {{kind: veth}}
        workload: {{tool: iperf3, protocol: tcp, duration: 1, warmup: 0.3{limit}}}
        axes:
          gro:
            "off": {{settings: {{server:to-client: {{gro: false}}}}}}
            "on": {{settings: {{server:to-client: {{gro: true}}}}}}
        repeat: {{min: {rounds}, max: {rounds}, level: 95, width: 50}}
        """)


# One runner writing a run of its own (each sample its own transaction, as `offlab run` commits them):
# `python -c WRITER URL TAG N`; tests/test_store_pg.py and benchmarks/store_writers start many at once.
WRITER = textwrap.dedent("""
    import sys, time
    from offlab.store import Store
    url, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Store.open(url) as s:
        run = s.create_run(f"writer {tag}", "name: w", {"name": "w"}, 1, {"host": tag}, None, {})
        cells = s.add_cells(run, [{"key": f"k={i}", "params": {"k": i}} for i in range(2)])
        print(run, flush=True)
        for i in range(n):
            s.add_sample(run, cells[f"k={i % 2}"], i, {"writer": tag, "i": i}, {"throughput_bps": float(i)})
        s.set_run_status(run, "done")
""")


def uso_plan(rounds: tuple[int, int] = (3, 3), lro: bool = True) -> str:
    """USO+GSO+GRO vs neither on a veth pair, engine at 1472 B; `lro` adds a cell this machine
    cannot test (veth's LRO is fixed off). 3 rounds by default: the sequential rule's first look,
    which decides this effect at any load (tests/fixtures/directions: ×8.6 and ×10.7, both in 3)."""
    lro_cell = "    lro: {features: {client: {lro: on}}}\n" if lro else ""
    return (textwrap.dedent("""\
        name: uso-test
        topology: {kind: veth}
        axes:
          offload:
            off: {features: {client: {uso: off}}, workload: {gso: false, gro: false}}
            on: {features: {client: {uso: on}}, workload: {gso: true, gro: true}}
        """) + lro_cell + textwrap.dedent(f"""\
        workload: {{tool: engine, protocol: udp, size: 1472, duration: 1, warmup: 0.3}}
        repeat: {{min: {rounds[0]}, max: {rounds[1]}, level: 95, width: 50}}
        baseline: {{offload: off}}
        seed: 7
        """))


USO = uso_plan()


def live_in(ns: str, skip: Callable[[str], bool] = lambda comm: False) -> list[str]:
    """"PID COMM" of each live process in namespace `ns` whose comm `skip` does not accept (a zombie waiting
    for this machine's late PID 1 is not one)."""
    found = []
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and not skip(comm):
            found.append(f"{pid} {comm}")
    return found


def journals(state_dir) -> list[str]:
    d = state_dir / "journal"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def lab_state(lab) -> dict:
    """Everything a knob can touch, for every interface of every host of a lab."""
    out: dict = {}
    for role in lab.hosts:
        host = lab.host(role)
        for link in json.loads(host.run(["ip", "-j", "link", "show"]).stdout):
            name = link["ifname"]
            # A bridge's carrier comes up a moment after `lab up` and after its ports change: not a knob.
            link["flags"] = [f for f in link["flags"] if f not in ("NO-CARRIER", "LOWER_UP")]
            link.pop("operstate", None)
            out[f"{role}/{name}/link"] = link
            out[f"{role}/{name}/features"] = json.loads(host.run(["ethtool", "--json", "-k", name]).stdout)
            out[f"{role}/{name}/qdisc"] = json.loads(host.run(["tc", "-j", "qdisc", "show", "dev", name]).stdout)
            out[f"{role}/{name}/channels"] = host.run(["ethtool", "-l", name], check=False).stdout
            out[f"{role}/{name}/queues"] = host.run(
                ["grep", "-rsH", ".", "--include=rps_cpus", "--include=xps_cpus", f"/sys/class/net/{name}/queues"],
                check=False).stdout
            bridge = host.run(["grep", "-rsH", ".", f"/sys/class/net/{name}/bridge"], check=False).stdout
            if bridge:
                out[f"{role}/{name}/bridge"] = [l for l in bridge.splitlines() if "nf_call" in l]
        out[f"{role}/sysctl"] = {k: host.read("/proc/sys/" + k.replace(".", "/")) for k in SYSCTLS}
    return out


def kill_9_once_qemu_is_recorded(topology: str, name: str, state_dir) -> int:
    """Start `offlab lab up TOPOLOGY`, kill -9 it once its first QEMU is in the lab file; QEMU's pid."""
    pid = kill_9_once_daemon_is_recorded(topology, name, state_dir, "QEMU")["pid"]
    # once (a fresh clone's suite, 2026-11-30) the QEMU it recorded had already ended: what it said, if so
    assert running(pid), {str(f): f.read_text()[-1500:] for f in Path(state_dir, "vm").glob("*/*.qemu.log")}
    return pid


GUEST_MARKS = [
    requires_root,
    pytest.mark.network,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                       reason="QEMU is not installed (scripts/install-deps installs it)"),
]


def tool_saw_no_loss(sample: dict) -> dict:
    """A copy of a real sample doctored into a tool that saw no loss: its total and every row of its
    receiver's series say 0 lost (the lost ones counted as received, so its rows still add up)."""
    d = copy.deepcopy(sample)
    d["traffic"]["loss"] = 0.0
    for s in d["traffic"].get("series") or []:
        if "lost" in s["columns"]:
            lost, got = s["columns"].index("lost"), s["columns"].index("datagrams")
            for row in s["rows"]:
                row[got] += max(0, row[lost] or 0)
                row[lost] = 0
    return d


def as_nobody(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """offlab as an unprivileged user, run by the interpreter the Makefile builds the venv from
    (Debian's), with this checkout and the venv's packages on its path."""
    path = os.pathsep.join([REPO, *site.getsitepackages()])
    return subprocess.run([*NOBODY, "env", "-i", "PATH=/usr/bin:/bin", f"PYTHONPATH={path}",
                           *[f"{k}={v}" for k, v in (env or {}).items()], DEBIAN_PYTHON, "-m", "offlab", *args],
                          capture_output=True, text=True, cwd="/", timeout=120)


@contextlib.contextmanager
def stand_in_machines(start: Callable[[], Any], stop: Callable[[Any], list[str]] | None = None) -> Iterator[Any]:
    """Stand-in machines (tests/sshd.py: a pair or a fleet, each machine a namespace with its own sshd;
    or, with its own `stop`, tests/guesthost.py's pair) for a module: started, yielded, stopped; fails if
    a session had to be killed or a namespace is left."""
    from tests import sshd

    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    before = netns_names()
    group = start()
    try:
        yield group
    finally:
        leftovers = (stop or sshd.stop_machines)(group)
        assert not leftovers, f"sshd sessions had to be killed: {leftovers}"
        assert not {n for n in netns_names() - before if n.startswith(OUR_NAMESPACES)}, "namespaces left"


@contextlib.contextmanager
def module_lab(topology: str, name: str, state_dir) -> Iterator[Any]:
    """A lab built in this process for a module's tests that only read it (`labs.up`), with its own
    offlab state directory for as long as it lives; taken down, and the state directory given back."""
    from offlab import lab as labs
    from offlab.experiment import teardown

    was = os.environ.get("OFFLAB_STATE_DIR")
    os.environ["OFFLAB_STATE_DIR"] = str(state_dir)
    try:
        built = labs.up(topology, name)
        try:
            yield built
        finally:
            teardown.down(name)
    finally:
        if was is None:
            os.environ.pop("OFFLAB_STATE_DIR", None)
        else:
            os.environ["OFFLAB_STATE_DIR"] = was


# ---- two stored runs whose environments differ (compare's "what changed") ----------------------------

def iface(name: str, peer: str, **features) -> dict:
    return {"name": name, "kind": "veth", "mtu": 1500, "peer_host": peer,
            "features": {"generic-receive-offload": False, "tx-udp-segmentation": True, **features}}


ENV = {"kernel": "6.1.0-18-amd64", "kernel_version": "#1 SMP Debian 6.1.76-1", "cmdline": "BOOT_IMAGE=/vmlinuz ro quiet",
       "cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz", "cpus": 2, "hostname": "lab1", "governor": None,
       "loadavg": 0.4, "versions": {"offlab": "0.1.0", "iperf3": "iperf 3.12"},
       "sysctls": {"net.core.netdev_max_backlog": "1000", "net.core.rmem_max": "4194304"},
       "labs": [{"name": "a", "topology": "veth", "hosts": {
           "client": {"interfaces": [iface("olta0", "server")]},
           "server": {"interfaces": [iface("olta1", "client")]}}}]}


def store_two(tmp_path, env_a: dict | None, env_b: dict | None, slower: float = 1.0) -> tuple[str, int, int]:
    db = tmp_path / "offlab.db"
    with Store.open(db) as s:
        ids = []
        for env, factor in ((env_a, 1.0), (env_b, slower)):
            run = s.create_run("p", "name: p", {}, 1, env or {}, None, {"level": 95})
            cells = s.add_cells(run, [{"key": "gro=on", "params": {"gro": "on"}, "settings": {}}])
            for rnd, v in enumerate((1.0e9, 1.02e9, 0.98e9)):
                s.add_sample(run, cells["gro=on"], rnd, {}, {"throughput_bps": v * factor})
            s.set_cell_status(cells["gro=on"], "done")
            s.set_run_status(run, "done")
            ids.append(run)
    return str(db), ids[0], ids[1]


def judge_effects(sample: dict, settings: list[dict]) -> list[dict]:
    """The effect witnesses over a stored sample (JSON, as a fixture or `measure --json` gives it) and
    settings given as {"where", "key", "value"}: their findings as stored."""
    from offlab.experiment import effects
    from offlab.sample import Held, StoredSample

    return [e.stored().to_json() for e in effects.witness(StoredSample.from_json(sample),
                                                          [Held.from_json(s) for s in settings])]


def recorded_history(tmp_path: Path) -> Path:
    """The recorded plan history (tests/fixtures/trend), loaded from its SQL dump into a database of this test's own."""
    db = tmp_path / "history.db"
    conn = sqlite3.connect(db)
    try:
        conn.executescript((Path(__file__).parent / "fixtures" / "trend" / "history.sql").read_text())
        # sqlite3's .dump leaves out PRAGMA user_version, where the store reads its schema version from
        [(version,)] = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        conn.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        conn.close()
    return db
