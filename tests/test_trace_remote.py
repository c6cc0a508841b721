"""The kernel's own account on an SSH host with a kernel of its own (issue 34).

tests/test_trace_ssh.py's stand-ins share this machine's kernel, which has no hist triggers: they prove
the refusal path only. Here the server is a QEMU guest of offlab's image running sshd (tests/guesthost.py;
a 6.12 Debian kernel with CONFIG_HIST_TRIGGERS), reached over SSH like any host; the client is a
namespace stand-in. `offlab run PLAN --inventory INV --trace` floods UDP from the client into a tiny
receive buffer on the guest: offlab's hist triggers are set in the guest's kernel over its SSH channel,
count its SOCKET_RCVBUFF drops as the guest's own counter does, the report names them as the server's
own kernel's, and nothing of offlab's is left in the guest's tracefs afterwards. A second test sets the
triggers as a killed controller would have left them and lets the guest's own restore.sh take them off.
The guest runs under TCG here: its figures are an emulated machine's.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import textwrap

import pytest

from offlab import tracefs
from tests import guesthost
from tests.conftest import OUR_NAMESPACES, offlab_cli, requires_root
from tests.helpers import stand_in_machines

# a hang guard only: one TCG boot and a two-sample run whose guest is busy dropping datagrams
pytestmark = pytest.mark.timeout(1200)

# UDP from the namespace into a 4 KiB socket buffer in the guest: slow enough that a TCG guest still
# answers its SSH channel during the flood, fast enough that its socket overflows (at 3 Mbit/s, 268
# datagrams/s, a guest's iperf3 once read every one in time on a fresh clone's run: no drop to count)
PLAN = textwrap.dedent("""
    name: remote-kernel
    topology: {kind: veth}
    workload: {tool: iperf3, protocol: udp, duration: 1, warmup: 0.3, rate: 20M, size: 1400, rcvbuf: 4096}
    axes:
      gro:
        "off": {settings: {server:to-client: {gro: false}}}
    repeat: {min: 2, max: 2, level: 95, width: 50}
    """)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("QEMU is not installed (scripts/install-deps installs it)")
    # 10.200.210-212: no other module's stand-ins use them (the workers run modules side by side)
    with stand_in_machines(lambda: guesthost.start_pair(tmp_path_factory.mktemp("tr"), f"{OUR_NAMESPACES[0]}tr",
                                                        subnet=210), guesthost.stop_pair) as p:
        yield p


def guest_tracefs(p) -> list[str]:
    """The guest's tracefs as seen through its agent (not the SSH path under test): 'mounted' or
    'unmounted', then every trigger of offlab's, whichever host it was set for."""
    res = p.guest_host().run(["sh", "-c", "grep -qs ' /sys/kernel/tracing tracefs ' /proc/mounts || "
                              "{ echo unmounted; exit 0; }; echo mounted; "
                              "grep -H '^hist:name=offlab_' /sys/kernel/tracing/events/*/*/trigger; exit 0"],
                             timeout=60)
    return res.stdout.splitlines()


def ssh(p, command: str) -> subprocess.CompletedProcess:
    """A command on the guest over its sshd, as an operator would type it."""
    b = p.inventory()["hosts"]["b"]
    return subprocess.run(["ip", "netns", "exec", p.controller, "ssh", "-F", "/dev/null", "-i", b["identity_file"],
                           *b["ssh_args"], "-o", "BatchMode=yes", f"root@{p.b_ssh_ip}", command],
                          capture_output=True, text=True, timeout=120)


@requires_root
@pytest.mark.network
def test_a_udp_flood_into_a_tiny_buffer_on_an_ssh_host_is_counted_by_its_own_kernel(pair, tmp_path, state_dir):
    inv, plan, db = tmp_path / "inventory.yml", tmp_path / "plan.yaml", tmp_path / "results.db"
    inv.write_text(json.dumps(pair.inventory()))  # JSON is YAML
    plan.write_text(PLAN)
    assert guest_tracefs(pair) == ["unmounted"]
    env = {"OFFLAB_STATE_DIR": str(state_dir)}
    res = offlab_cli("run", str(plan), "--inventory", str(inv), "--db", str(db), "--trace", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        samples = [json.loads(r[0]) for r in conn.execute("SELECT sample FROM samples")]
        (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
    assert len(samples) == 2
    kernel, counted = 0, 0
    for s in samples:
        # the client (a namespace of this machine) cannot be traced, and says why; the server is
        assert [w for w in s["kernel_account"]["not_traced"] if w.startswith("client: ")], s["kernel_account"]
        assert not [w for w in s["kernel_account"]["not_traced"] if w.startswith("server: ")], s["kernel_account"]
        assert s["probes"]["trace"]["hist"]["server"]["drops_counted_in"] == "skbs"
        drops = [d for d in s["probes"]["trace"]["drops"] if d["reason"] == "SOCKET_RCVBUFF"]
        assert {(d["host"], d["device"], d["unit"]) for d in drops} <= {("server", None, "skbs")}, drops
        kernel += sum(d["datagrams"] for d in drops)
        counted += s["probes"]["snmp"]["server"]["Udp"]["RcvbufErrors"]
        # the datagrams reached the guest's test interface, by its own tracepoints
        assert any(h["host"] == "server" and h["device"] == "t1" and h["received"]["skbs"] > 0
                   for h in s["kernel_account"]["hops"]), s["kernel_account"]["hops"]
    # The guest's own counter, read by the same awk as the hist files at each edge: the two differ only
    # by the drops its softirq made between those two file reads (a TCG guest under a loaded host).
    assert counted > 0 and kernel == pytest.approx(counted, rel=0.2, abs=25), (kernel, counted)
    shown = offlab_cli("results", "show", str(run_id), "--db", str(db), env=env)
    assert shown.returncode == 0, shown.stderr
    assert "server (its own kernel) SOCKET_RCVBUFF" in shown.stdout, shown.stdout[-3000:]
    # nothing of offlab's left on the guest: no trigger, tracefs unmounted as found, no remote_dir
    assert guest_tracefs(pair) == ["unmounted"]
    assert ssh(pair, f"test -e {pair.remote_dir('b')} || echo gone").stdout.strip() == "gone"
    assert not list(state_dir.glob("journal/*.journal"))


@requires_root
@pytest.mark.network
def test_an_ssh_hosts_own_restore_sh_takes_real_triggers_off_its_kernel(pair, state_dir):
    """Triggers set in the guest's kernel and journalled there as a controller does before setting them;
    the controller gone: `sh restore.sh` on the host (sh and its tools only) removes them and unmounts
    the tracefs offlab mounted."""
    from offlab.hosts.ssh import SshHost
    from offlab.knobs import undo

    b = pair.inventory()["hosts"]["b"]
    host = SshHost(pair.b_ssh_ip, user="root", port=pair.port, identity=b["identity_file"], ssh_args=b["ssh_args"],
                   config="/dev/null", via_netns=pair.controller, connect_timeout=10, name="b",
                   remote_dir=pair.remote_dir("b"))
    tag = tracefs.tag_of(host.key)
    record = {"seq": 1, "kind": "trace-hist", "key": "trace-hist", "netns": None, "iface": None, "host": host.ref(),
              "value": "on", "original": {"tracefs": "unmounted", "triggers": []}, "original_text": "0 trigger(s)"}
    try:
        undo.copy_to_host(state_dir / "trace.journal", record)
        res = host.run(tracefs.install_argv(tracefs.triggers(1514, tag), tag), check=False, timeout=60)
        assert res.rc == 0 and res.stdout.strip() == "mounted", res.stderr
        set_there = guest_tracefs(pair)
        assert set_there[0] == "mounted" and len(set_there) == 1 + len(tracefs.triggers(1514, tag)), set_there
    finally:
        host.close()
    res = ssh(pair, f"sh {pair.remote_dir('b')}/restore.sh")
    assert res.returncode == 0 and res.stdout.startswith("restored: - trace-hist: on"), res.stdout + res.stderr
    assert guest_tracefs(pair) == ["unmounted"]
    assert ssh(pair, f"test -e {pair.remote_dir('b')} || echo gone").stdout.strip() == "gone"
