"""SSH hosts against a real sshd in a test namespace, inventories (offlab's and Ansible's), and
`offlab hosts check`: arguments arrive exactly, one master per host reused and closed, an
unreachable host fails fast naming itself, a knob flipped over ssh comes back from a fresh
process, and nothing is left behind."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offlab import inventory
from offlab.errors import BadInput, CommandFailed, CommandTimeout
from offlab.hosts import NetnsHost, from_ref
from offlab.hosts.ssh import HostUnreachable, SshHost, check_ssh_args, remote_command
from tests import sshd as sshd_mod
from tests.conftest import OUR_NAMESPACES, REPO, netns_names, offlab_cli, requires_root

FIXTURES = Path(REPO) / "tests" / "fixtures" / "inventory"
HOSTILE = ["a b", "it's", '"dq"', "$HOME", "`id`", "$(id)", "*", "semi;colon", "", "new\nline",
           "back\\slash", "é漢字", "-n", "--", "a|b&c>d<e", "~root", "#hash", "{a,b}", "\t tab"]


# ---- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists(sshd_mod.SSHD):
        pytest.fail("openssh-server is not installed: run scripts/install-deps")
    before = netns_names()
    s = sshd_mod.start(tmp_path_factory.mktemp("ssh"), f"{OUR_NAMESPACES[0]}ssh")
    try:
        yield s
    finally:
        leftovers = sshd_mod.stop(s)
        assert not leftovers, f"sshd sessions had to be killed: {leftovers}"
        assert not sshd_mod.mux_processes(s), f"ssh masters left: {sshd_mod.mux_processes(s)}"
        assert not ({n for n in netns_names() - before if n.startswith(OUR_NAMESPACES)}), "namespaces left"


@pytest.fixture
def host(sshd, state_dir):
    h = sshd.host()
    yield h
    h.close()


def write_inventory(path: Path, sshd, **extra) -> Path:
    """An offlab inventory naming the test sshd as host `remote`, its test interface sshs1."""
    entry = {"ssh": sshd.server_ip, "user": "root", "port": sshd.port, "identity_file": str(sshd.user_key),
             "ssh_args": sshd.ssh_args(), "ssh_config": "/dev/null", "via_netns": sshd.client_ns,
             "connect_timeout": 3,
             "interfaces": [{"name": "sshs1", "addresses": [f"{sshd.test_server_ip}/24"]}]}
    hosts = {"remote": entry, **extra}
    path.write_text(json.dumps({"hosts": hosts}))  # JSON is YAML
    return path


def gro(sshd) -> bool:
    out = NetnsHost(sshd.server_ns).run(["ethtool", "--json", "-k", "sshs1"]).stdout
    return json.loads(out)[0]["generic-receive-offload"]["active"]


# ---- quoting (no sshd needed) ---------------------------------------------------------------------------
def test_remote_command_splits_back_into_exactly_the_argv():
    assert shlex.split(remote_command(["printf", "%s", *HOSTILE])) == ["printf", "%s", *HOSTILE]


@pytest.mark.parametrize("args,message", [
    (["-o", "A=b", "evil.example"], "not an ssh option"),
    (["-p"], "needs a value"),
    (["--", "x"], "not an ssh option"),
    (["-o", "X=1\nY"], "invalid argument"),
    (["-o", "BatchMode=no"], "offlab sets batchmode itself"),
    (["-oControlPath=/tmp/x"], "offlab sets controlpath itself"),
    (["-o", "ControlMaster no"], "offlab sets controlmaster itself"),
    (["-vS", "/tmp/sock"], "offlab sets -S itself"),
    (["-t"], "offlab sets -t itself"),
    (["--help"], "not an ssh option"),
])
def test_ssh_args_accept_options_only(args, message):
    with pytest.raises(BadInput, match=message):
        check_ssh_args(args)


def test_ssh_args_keep_ordinary_options():
    ok = ["-o", "UserKnownHostsFile=~/k", "-oServerAliveInterval=9", "-4v", "-J", "jump@bastion", "-c", "aes128-ctr"]
    assert check_ssh_args(ok) == ok


@pytest.mark.parametrize("kw,message", [
    ({"target": "-oProxyCommand=x"}, "invalid ssh target"),
    ({"target": "a b"}, "invalid ssh target"),
    ({"target": "h", "user": "root;id"}, "invalid ssh user"),
    ({"target": "h", "port": 0}, "invalid ssh port"),
    ({"target": "h", "via_netns": "../x"}, "namespace"),
])
def test_ssh_host_refuses_bad_settings(kw, message):
    target = kw.pop("target")
    with pytest.raises(BadInput, match=message):
        SshHost(target, **kw)


# ---- a real sshd -------------------------------------------------------------------------------------
@requires_root
def test_hostile_arguments_arrive_exactly(host):
    out = host.run(["printf", "%s\\0", *HOSTILE]).stdout
    assert out.split("\0")[:-1] == HOSTILE
    # The remote side really is the server namespace, reached from the client namespace.
    assert host.run(["ip", "netns", "identify"]).stdout.strip().endswith("ssh-s")


@requires_root
def test_the_stand_in_reads_roots_shell_start_up_files_empty_and_this_machine_keeps_its_own(host):
    home = Path(pwd.getpwuid(0).pw_dir)
    files = [str(home / n) for n in sshd_mod.STARTUP_FILES if (home / n).is_file()]
    assert host.read_many(files) == {f: "" for f in files}
    mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert not set(files) & set(mounted)  # bound over in the stand-in's mount namespace only


@requires_root
def test_one_master_per_host_is_reused_then_closed(sshd, host):
    host.run(["true"])
    sock = host._control_path()
    assert sock.exists() and oct(sock.parent.stat().st_mode & 0o777) == "0o700"
    masters = sshd_mod.mux_processes(sshd)
    assert len(masters) == 1, subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    assert host._master_pid() == int(masters[0].split()[0])  # what close() waits for to be gone
    for _ in range(3):
        host.run(["true"])
    assert sshd_mod.mux_processes(sshd) == masters  # same master process, reused
    # An equal host (same connection) in the same process shares it.
    sshd.host().run(["true"])
    assert sshd_mod.mux_processes(sshd) == masters
    host.close()
    assert not sock.exists() and not sshd_mod.mux_processes(sshd)
    assert host.run(["echo", "again"]).stdout == "again\n"  # reopens on demand
    host.close()


@requires_root
def test_files_are_written_and_read_byte_for_byte(host):
    data = bytes(range(256)) * 300 + "é\n".encode()
    path = "/tmp/offlab test 'file' $x"  # a hostile path too
    try:
        host.write(path, data)
        assert host.read_bytes(path) == data
        assert host.exists(path) and not host.exists(path + ".no")
        host.write(path, "text\n")
        assert host.read(path) == "text\n"
        host.write(path + ".nonl", "no newline")
        # several files in one command, in order; one that cannot be read is None
        many = host.read_many([path, "/nonexistent/offlab", path + ".nonl", "/proc/version"])
        assert list(many.values())[:3] == ["text\n", None, "no newline"]
        assert many["/proc/version"] == host.read("/proc/version")
    finally:
        host.run(["rm", "-f", path + ".nonl"])
        host.run(["rm", "-f", path])
    with pytest.raises(CommandFailed, match="No such file"):
        host.read("/nonexistent/offlab")


@requires_root
def test_remote_failure_keeps_exit_code_and_stderr(host):
    res = host.run(["sh", "-c", "echo oops >&2; exit 7"], check=False)
    assert (res.rc, res.stderr) == (7, "oops\n")
    res = host.run(["sh", "-c", "exit 255"], check=False)  # 255 from the command is not "unreachable"
    assert res.rc == 255
    with pytest.raises(CommandFailed, match="oops"):
        host.run(["sh", "-c", "echo oops >&2; exit 1"])
    assert host.run(["sh", "-c", 'printf %s "$X"'], env={"X": "a b;c"}).stdout == "a b;c"
    assert host.run(["cat"], input="to stdin\n").stdout == "to stdin\n"


@requires_root
def test_spawned_remote_process_is_stopped_by_pid(host):
    proc = host.spawn(["sleep", "30"])
    assert proc.poll() is None
    assert host.run(["kill", "-0", str(proc.pid)], check=False).ok
    proc.terminate()
    assert proc.wait(timeout=10) == 143  # killed by SIGTERM, as the runner records it
    proc.cleanup()
    assert not host.run(["kill", "-0", str(proc.pid)], check=False).ok
    assert not host.exists(proc.dir)


@requires_root
def test_spawned_remote_process_ends_on_sigint(host):
    # A background job of a non-interactive shell starts with SIGINT ignored; the launcher resets it,
    # so `stop` (SIGINT first) ends a server the way Ctrl-C would, without falling back to SIGKILL.
    from offlab.hosts.process import stop

    proc = host.spawn(["sleep", "30"])
    ignored = int(host.run(["awk", "/^SigIgn/ {print $2}", f"/proc/{proc.pid}/status"]).stdout, 16)
    assert ignored & (1 << (2 - 1)) == 0 and ignored & (1 << (3 - 1)) == 0  # SIGINT, SIGQUIT not ignored
    proc.send_signal(2)
    assert proc.wait(timeout=10) == 130  # ended by SIGINT itself, as the runner records it
    proc.cleanup()
    proc = host.spawn(["sleep", "30"])
    stop(proc, grace=5)
    assert proc.returncode == 130


@requires_root
def test_command_timeout_is_bounded_and_ends_the_remote_command_too(host):
    host.run(["true"])
    marker = f"{40 + os.getpid() % 1000 / 1000:.3f}"  # a sleep no one else runs
    # The sleep lasts 40 s: a CommandTimeout at all is the 1-s timeout firing (how soon is for benchmarks/).
    with pytest.raises(CommandTimeout, match="within 1 s"):
        host.run(["sleep", marker], timeout=1)

    def running() -> bool:
        out = subprocess.run(["ps", "-ww", "-eo", "args="], capture_output=True, text=True).stdout
        return f"sleep {marker}" in out.splitlines()

    deadline = time.monotonic() + 8
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(), "the remote command outlived its timeout"


@requires_root
@pytest.mark.parametrize("change,expect", [
    ({"port": 2299}, "Connection refused"),
    ({"ssh_args": ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes"]},
     "Host key verification failed"),
    ({"identity": "/nonexistent/key"}, "Permission denied"),
])
def test_unreachable_host_is_environment_problem_naming_host_and_cause(sshd, state_dir, change, expect):
    h = sshd.host(name="deadhost", **change)
    start = time.monotonic()
    with pytest.raises(HostUnreachable) as info:
        h.run(["true"])
    msg = str(info.value)
    assert msg.startswith("ssh host deadhost: connecting failed (ssh exit 255)") and expect in msg, msg
    assert "\n" not in msg and info.value.exit_code == 3
    assert time.monotonic() - start < 60  # a hang guard only: each fails at once, a prompt would wait forever
    assert not h.alive()


@requires_root
@pytest.mark.parametrize("asked", ["at once", "once ssh has exited"])
def test_a_counter_reader_whose_host_dies_says_the_ssh_host_and_its_connection(sshd, state_dir, asked):
    """A sample's counter reader (one ssh session answering a line per read) on a host that crashes: the
    read fails naming the SSH host and the connection, not only that some reader ended; also when the
    request itself meets the ended ssh (a broken pipe), as it does when the read comes after ssh exited."""
    from offlab.probes.remote import Stream, stream_read

    host = sshd.host(connect_timeout=2)
    stream = Stream(host.stream(["sh", "-c", stream_read()], lifetime=60), host.name)
    try:
        assert "Ip:" in stream.ask()  # /proc/net/snmp, read through the session
        for pid in sshd.sshd_pids() - {sshd.proc.pid}:  # the host's side of every session gone
            os.kill(pid, 9)
        if asked != "at once":
            stream.proc.wait(timeout=30)  # a hang guard: ssh sees its connection end
        with pytest.raises(OSError, match=r"^ssh host root@10\.200\.222\.2:2222: the connection of its counter "
                                          r"reader ended \(ssh exit 255\)$"):
            stream.ask()
    finally:
        stream.close()
        host.close()


def test_host_that_dies_mid_session_is_reported_not_waited_for(sshd, state_dir):
    host = sshd.host(connect_timeout=2)
    host.run(["true"])
    server = NetnsHost(sshd.server_ns)
    # What a crashed host looks like: its side of our connection gone, and no answer any more.
    for pid in sshd.sshd_pids() - {sshd.proc.pid}:
        os.kill(pid, 9)
    # Our master sees its connection end before the link goes (under load the kill lands late, and a
    # master that missed it would take the next command as its own: "running true failed").
    deadline = time.monotonic() + 30  # a hang guard only
    while sshd_mod.mux_processes(sshd) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sshd_mod.mux_processes(sshd)
    server.run(["ip", "link", "set", "sshs0", "down"])
    try:
        start = time.monotonic()
        with pytest.raises(HostUnreachable, match=r"^ssh host root@10\.200\.222\.2:2222: connecting failed"):
            host.run(["true"])
        # a hang guard only: without the 2-s connect timeout ssh would wait out TCP's retries (over 2 min)
        assert time.monotonic() - start < 60
        assert not host.alive()
    finally:
        server.run(["ip", "link", "set", "sshs0", "up"])
        client = NetnsHost(sshd.client_ns)
        for _ in range(20):  # the link comes back and the neighbour is resolved again
            if client.run(["ping", "-c1", "-W1", sshd.server_ip], check=False).ok:
                break
    assert host.run(["echo", "back"]).stdout == "back\n"  # a new master once the host answers again
    host.close()


@requires_root
def test_lost_master_is_replaced_transparently(sshd, host):
    host.run(["true"])
    for pid in sshd.sshd_pids() - {sshd.proc.pid}:
        os.kill(pid, 9)
    # The dying master may still answer for this call (ssh then connects directly); the next one opens a new master.
    assert host.run(["echo", "again"]).stdout == "again\n"
    assert host.run(["echo", "and again"]).stdout == "and again\n"
    assert len(sshd_mod.mux_processes(sshd)) == 1


@requires_root
def test_interactive_returns_the_remote_exit_code(host):
    assert host.interactive(["sh", "-c", "exit 3"]) == 3
    assert host.interactive(["true"]) == 0


@requires_root
def test_address_that_never_answers_fails_within_the_connect_timeout(sshd, state_dir):
    h = sshd.host(name="blackhole", connect_timeout=2)
    NetnsHost(sshd.client_ns).run(["ip", "route", "add", "blackhole", "10.200.250.9/32"])
    try:
        h = SshHost("10.200.250.9", **{**{k: v for k, v in h.ref().items()
                                         if k not in ("kind", "target")}})
        start = time.monotonic()
        with pytest.raises(HostUnreachable, match="blackhole: connecting failed"):
            h.run(["true"])
        assert time.monotonic() - start < 60  # a hang guard only, as above
    finally:
        NetnsHost(sshd.client_ns).run(["ip", "route", "del", "blackhole", "10.200.250.9/32"])


@requires_root
def test_become_runs_through_sudo_and_says_when_sudo_is_missing(sshd, host):
    h = sshd.host(become=True)
    has_sudo = host.run(["sh", "-c", "command -v sudo"], check=False).ok
    res = h.run(["id", "-u"], check=False)
    if has_sudo:
        assert res.stdout.strip() == "0"
    else:
        assert res.rc == 127 and "sudo" in res.stderr
    h.close()


@requires_root
def test_ref_rebuilds_the_host_in_another_process(sshd, host):
    ref = host.ref()
    assert from_ref(json.loads(json.dumps(ref))) == host
    code = ("import json, sys; from offlab.hosts import from_ref; "
            "h = from_ref(json.loads(sys.argv[1])); print(h.run(['ip', 'netns', 'identify']).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(ref)], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ssh-s")
    assert not sshd_mod.mux_processes(sshd)  # the child closed its own master at exit


@requires_root
def test_knob_flipped_over_ssh_is_restored_from_a_fresh_process_once_the_host_answers(sshd, state_dir):
    from offlab.knobs import Change, Transaction

    host = sshd.host(connect_timeout=2)
    assert gro(sshd) is False
    with Transaction("remote gro", persist=True) as tx:
        [outcome] = tx.apply([Change(host, "gro", "on", "sshs1")])
    assert outcome.ok and outcome.where == f"{host.name}:sshs1"
    assert gro(sshd) is True
    [journal] = (state_dir / "journal").glob("*.journal")
    assert '"kind": "ssh"' in journal.read_text()
    host.close()
    # The host stops answering: restore must keep the original, not forget it as "host gone".
    server = NetnsHost(sshd.server_ns)
    server.run(["ip", "link", "set", "sshs0", "down"])
    try:
        res = offlab_cli("restore", env={"OFFLAB_STATE_DIR": str(state_dir)})
        assert res.returncode == 3, res.stdout + res.stderr
        assert f"could not restore {host.name}:sshs1 gro to off: ssh host {host.name}: connecting failed" in res.stdout
        assert len(list((state_dir / "journal").glob("*.journal"))) == 1  # kept for the next restore
        assert gro(sshd) is True
    finally:
        server.run(["ip", "link", "set", "sshs0", "up"])
        client = NetnsHost(sshd.client_ns)
        for _ in range(20):
            if client.run(["ping", "-c1", "-W1", sshd.server_ip], check=False).ok:
                break
    res = offlab_cli("restore", env={"OFFLAB_STATE_DIR": str(state_dir)})
    assert res.returncode == 0 and f"restored {host.name}:sshs1 gro = off" in res.stdout, res.stdout + res.stderr
    assert gro(sshd) is False and not list((state_dir / "journal").glob("*.journal"))
    assert not sshd_mod.mux_processes(sshd)


@requires_root
def test_hostile_interface_or_pair_is_refused_before_any_ssh_runs(sshd, state_dir, tmp_path, monkeypatch):
    from offlab.knobs import Change, Transaction

    def no_ssh(*a, **kw):
        raise AssertionError("ssh ran")

    monkeypatch.setattr(SshHost, "_exec", no_ssh)
    monkeypatch.setattr(SshHost, "connect", no_ssh)
    with Transaction("hostile") as tx, pytest.raises(BadInput, match="invalid interface name"):
        tx.apply([Change(sshd.host(), "gro", "on", "eth0;reboot")])
    inv = inventory.load(write_inventory(tmp_path / "inv.yml", sshd))
    for pair in ("remote:sshs1;id,remote:sshs1", "remote:$(reboot),remote:x", "remote:a b,remote:c"):
        with pytest.raises(BadInput, match="invalid interface name"):
            inventory.parse_pair(pair, inv)
    with pytest.raises(BadInput, match="no host 'other'"):
        inventory.parse_pair("remote:sshs1,other:eth1", inv)
    assert [(h.name, i) for h, i in inventory.parse_pair("remote:sshs1,remote:sshs0", inv)] == [
        ("remote", "sshs1"), ("remote", "sshs0")]


@requires_root
def test_doctor_over_ssh_reads_the_remote_not_this_machine(sshd, host):
    from offlab import doctor

    src = doctor.LiveSource(host)
    assert src.label == host.name
    assert "sshs1:" in src.read("/proc/net/dev") and "sshc1:" not in src.read("/proc/net/dev")
    assert "sshs1" in src.listdir("/sys/class/net") and src.exists("/sys/class/net/sshs1")
    report = doctor.audit(src, ifaces=["sshs1"], only={"nic.offloads", "kernel.version"})
    offloads = next(f for f in report.findings if f.id == "nic.offloads")
    assert offloads.target == "sshs1" and "generic-receive-offload" in offloads.summary, offloads


def _masters_left(sshd, within: float = 10.0) -> list[str]:
    """The masters of this sshd's clients that offlab commands opened, still there (none, once a closed master's
    process has ended: it ends a moment after it answered, its closer waits for it up to 3 s, under load the
    last of it can take longer). A master of this test process's own (its control directory names its pid:
    an earlier test's host, in this process) is not a command's: the module's teardown checks those.
    `within` is a hang guard."""
    mine = (f"/offlab-ssh.{os.getpid()}.", f"/ssh/{os.getpid()}.")  # under /tmp, or under a short state dir

    def commands() -> list[str]:
        return [line for line in sshd_mod.mux_processes(sshd) if not any(m in line for m in mine)]

    deadline = time.monotonic() + within
    while (left := commands()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@requires_root
def test_hosts_check_reports_everything_and_unreachable_hosts_apart(sshd, state_dir, tmp_path):
    dead = {"ssh": sshd.server_ip, "port": 2299, "user": "root", "identity_file": str(sshd.user_key),
            "ssh_args": sshd.ssh_args(), "ssh_config": "/dev/null", "via_netns": sshd.client_ns,
            "connect_timeout": 3}
    path = write_inventory(tmp_path / "inv.yml", sshd, dead=dead)
    res = offlab_cli("hosts", "check", str(path), "--json")
    assert res.returncode == 3, res.stderr
    assert res.stderr.strip() == "offlab: error: hosts check: unreachable: dead"
    report = json.loads(res.stdout)
    by = {h["name"]: h for h in report["hosts"]}
    remote, dead = by["remote"], by["dead"]
    assert remote["reachable"] and remote["ok"]
    assert remote["kernel"] == os.uname().release  # the "remote" shares this machine's kernel
    assert remote["user"] == "root" and remote["management_address"] == sshd.server_ip
    [iface] = remote["interfaces"]
    assert iface["driver"] == "veth" and iface["mtu"] == 1500 and iface["state"] == "UP"
    assert iface["addresses"] == [f"{sshd.test_server_ip}/24"]
    assert iface["features"]["generic-receive-offload"] == {"active": False, "fixed": False}
    assert remote["tools"]["iperf3"] and remote["tools"]["ethtool"]
    assert not dead["reachable"] and "Connection refused" in dead["error"]
    assert report["summary"] == {"hosts": 2, "unreachable": 1, "failing": 0}
    text = offlab_cli("hosts", "check", str(path))
    assert text.returncode == 3
    assert re.search(r"remote  root@\S+:2222  kernel \S+  user root", text.stdout)
    assert "sshs1: driver veth" in text.stdout and "gro off" in text.stdout
    assert "dead  root@" in text.stdout and "UNREACHABLE" in text.stdout
    assert text.stdout.strip().splitlines()[-1] == "2 host(s): 1 ready, 1 unreachable (dead)"
    left = _masters_left(sshd)
    assert not left, subprocess.run(["ps", "-ww", "-o", "pid,ppid,stat,etime,args", "-p",
                                     ",".join(l.split()[0] for l in left)], capture_output=True, text=True).stdout


@requires_root
def test_hosts_check_says_what_is_missing_and_the_command_that_fixes_it(sshd, state_dir, tmp_path):
    # The ssh address on a test interface, allowed; a declared address not configured; an interface
    # that does not exist; sudo asked for.
    extra = {"name": "sshs0", "addresses": [f"{sshd.server_ip}/24", "10.200.99.9/24"]}
    path = write_inventory(tmp_path / "inv.yml", sshd)
    data = json.loads(path.read_text())
    data["hosts"]["remote"]["interfaces"] += [extra, {"name": "nosuch0"}]
    data["hosts"]["remote"]["sudo"] = True
    data["hosts"]["remote"]["allow_management_traffic"] = True
    path.write_text(json.dumps(data))
    res = offlab_cli("hosts", "check", str(path), "--json")
    checks = {c["id"]: c for c in json.loads(res.stdout)["hosts"][0]["checks"]}
    assert checks["iface:sshs0"]["status"] == "warn"
    assert "declared but not configured: 10.200.99.9/24" in checks["iface:sshs0"]["why"]
    assert checks["engine"]["status"] == "info"
    assert checks["iface:nosuch0"] == {**checks["iface:nosuch0"], "status": "fail",
                                       "evidence": "no interface nosuch0 on remote",
                                       "fix": "see `ip link` on remote and correct the inventory"}
    assert res.returncode == 3 and "missing something: remote" in res.stderr
    has_sudo = NetnsHost(sshd.server_ns).run(["sh", "-c", "command -v sudo"], check=False).ok
    if has_sudo:
        assert checks["sudo"]["status"] == "ok"
    else:
        assert checks["sudo"] == {**checks["sudo"], "status": "fail", "evidence": "sudo is not installed",
                                  "fix": "on remote, as root: apt-get install sudo (or set sudo: false: you log in as root)"}


@requires_root
def test_ansible_inventory_drives_hosts_check(sshd, state_dir, tmp_path):
    common = " ".join(shlex.quote(a) for a in sshd.ssh_args())
    path = tmp_path / "hosts.yml"
    path.write_text(f"""
all:
  vars:
    ansible_user: root
    ansible_ssh_common_args: {json.dumps(common)}
    offlab_ssh_config: /dev/null
    offlab_via_netns: {sshd.client_ns}
  children:
    lab:
      vars:
        ansible_port: {sshd.port}
        ansible_ssh_private_key_file: {sshd.user_key}
      hosts:
        sut:
          ansible_host: {sshd.server_ip}
          offlab_interfaces:
            - name: sshs1
              addresses: [{sshd.test_server_ip}/24]
""")
    res = offlab_cli("hosts", "check", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == "1 host(s): 1 ready"
    assert "ok    test interface" not in res.stdout and "sshs1: driver veth" in res.stdout


# ---- inventories (parsing only) ----------------------------------------------------------------------
def test_ansible_inventory_vars_inherit_from_all_down_to_the_host():
    inv = inventory.load(FIXTURES / "ansible_lab.yml")
    assert inv.format == "ansible"
    assert list(inv.hosts) == ["hv1", "hv2", "lg01.lab.example.net", "lg02.lab.example.net",
                               "lg03.lab.example.net", "bastion.lab.example.net"]
    hv1, hv2, lg2 = inv.hosts["hv1"], inv.hosts["hv2"], inv.hosts["lg02.lab.example.net"]
    # all: vars → hypervisors: vars → xl710: vars → host vars, each level winning over the one above.
    assert (hv1.target, hv1.user, hv1.port, hv1.become, hv1.identity) == (
        "192.0.2.11", "labadmin", 2222, True, "~/.ssh/lab_ed25519")
    assert hv1.ssh_args == ("-o", "UserKnownHostsFile=~/.ssh/lab_known_hosts", "-o", "ServerAliveInterval=10")
    assert hv1.groups == ("hypervisors", "monitoring", "xl710")
    assert hv1.interfaces == (inventory.TestInterface("ens1f0", ("198.51.100.1/24",)),)
    assert (hv2.user, hv2.become, hv2.port) == ("root", False, 2222)
    assert hv2.interface("ens1f0").ips() == ["198.51.100.2", "2001:db8:100::2"]
    assert (lg2.target, lg2.user, lg2.port, lg2.become, lg2.interfaces) == (
        "lg02.lab.example.net", "labadmin", 2200, False, ())
    ssh = hv1.ssh_host()
    assert ssh.ref()["name"] == "hv1" and ssh.become and ssh.port == 2222
    with pytest.raises(BadInput, match=r"ansible_lab.yml: host 'lg01.lab.example.net': no test interface"):
        inv.require_interfaces(["hv1", "lg01.lab.example.net"])


def test_offlab_inventory_defaults_apply_to_every_host():
    inv = inventory.load(FIXTURES / "offlab_lab.yml")
    left, right = inv.hosts["left"], inv.hosts["right"]
    assert inv.format == "offlab"
    assert (left.target, left.user, left.port, left.become, left.identity) == (
        "192.0.2.21", "root", None, False, "~/.ssh/lab_ed25519")
    assert (right.target, right.user, right.port, right.become, right.connect_timeout) == (
        "right.lab.example.net", "tester", 2022, True, 5)
    assert right.ssh_args == ("-o", "UserKnownHostsFile=~/.ssh/lab_known_hosts")
    inv.require_interfaces()


OFFLAB_HOST = "hosts:\n  h1:\n    ssh: 192.0.2.1\n"
BAD = [
    ("offlab-unknown", OFFLAB_HOST + "    sshport: 22\n", r"host 'h1': unknown key 'sshport'"),
    ("offlab-port", OFFLAB_HOST + "    port: 70000\n", r"host 'h1': port 70000"),
    ("offlab-args", OFFLAB_HOST + "    ssh_args: '-o A=b evil'\n", r"host 'h1': ssh_args: 'evil' is not an ssh option"),
    ("offlab-iface", OFFLAB_HOST + "    interfaces: [{name: 'e;x'}]\n", r"host 'h1': interfaces\[0\]: name: invalid"),
    ("offlab-addr", OFFLAB_HOST + "    interfaces: [{name: e1, addresses: [300.1.1.1/24]}]\n",
     r"interfaces\[0\]: addresses: '300.1.1.1/24' is not an IP address"),
    ("mgmt", OFFLAB_HOST + "    interfaces: [{name: e1, addresses: [192.0.2.1/24]}]\n",
     r"host 'h1': interface 'e1': test address 192.0.2.1 is the SSH address.*allow_management_traffic: true"),
    ("dup", OFFLAB_HOST + "    interfaces: [{name: e1, addresses: [10.9.0.1/24]}]\n"
            "  h2:\n    interfaces: [{name: e1, addresses: [10.9.0.1/24]}]\n",
     r"host 'h2': interface 'e1': address 10.9.0.1 is also declared by h1:e1"),
    ("dup-key", OFFLAB_HOST + "  h1:\n    ssh: 192.0.2.2\n", r":4: key 'h1' appears twice"),
    ("ans-group-key", "all:\n  host:\n    a:\n", r"group 'all': unknown key 'host'"),
    ("ans-offlab-var", "all:\n  hosts:\n    a:\n      offlab_iface: [x]\n", r"host 'a': unknown key 'offlab_iface'"),
    ("ans-jinja", "all:\n  vars:\n    ansible_user: '{{ lookup(\"env\", \"USER\") }}'\n  hosts:\n    a:\n",
     r"host 'a': ansible_user: .* is a Jinja template"),
    ("ans-vault", "all:\n  hosts:\n    a:\n      ansible_host: !vault |\n        $ANSIBLE_VAULT;1.1;AES256\n        3132\n",
     r"host 'a': ansible_host: encrypted with ansible-vault"),
    ("ans-local", "all:\n  hosts:\n    a:\n      ansible_connection: local\n", r"ansible_connection: 'local'"),
    ("ans-become-user", "all:\n  hosts:\n    a:\n      ansible_become_user: postgres\n", r"offlab needs root"),
    ("ans-cycle", "all:\n  children:\n    a:\n      children:\n        b:\n          children:\n            a:\n",
     r"group 'a' is its own descendant"),
    ("ans-range", "all:\n  hosts:\n    web[1:9999]:\n", r"gives 9999 hosts"),
    ("empty", "", r"the inventory is empty"),
    ("yaml", "hosts: [\n", r":2: not valid YAML"),
    ("bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)), r"more than 200000 values once aliases are expanded"),
    ("python-tag", "hosts: !!python/object/apply:os.system ['id']\n", r"not valid YAML"),
]


@pytest.mark.parametrize("name,text,message", BAD, ids=[b[0] for b in BAD])
def test_bad_inventory_is_one_line_naming_file_host_and_field(tmp_path, name, text, message):
    path = tmp_path / f"{name}.yml"
    path.write_text(text)
    with pytest.raises(BadInput) as info:
        inventory.load(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and "\n" not in msg and re.search(message, msg), msg


def test_test_address_may_equal_the_ssh_address_when_the_user_says_so(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(OFFLAB_HOST + "    allow_management_traffic: true\n"
                    "    interfaces: [{name: e1, addresses: [192.0.2.1/24]}]\n")
    assert inventory.load(path).hosts["h1"].allow_management_traffic


def test_oversized_inventory_is_refused_unread(tmp_path):
    path = tmp_path / "big.yml"
    path.write_text("# x\n" * (inventory.MAX_BYTES // 4 + 10))
    with pytest.raises(BadInput, match="larger than 1024 KiB"):
        inventory.load(path)


def test_hosts_check_cli_bad_inventory_is_exit_2(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(OFFLAB_HOST + "    sshport: 22\n")
    res = offlab_cli("hosts", "check", str(path))
    assert res.returncode == 2
    assert res.stderr.strip() == f"offlab: error: {path}: host 'h1': unknown key 'sshport' (known: " \
        "allow_management_traffic, connect_timeout, identity_file, interfaces, lease, port, remote_dir, ssh, ssh_args, " \
        "ssh_config, sudo, user, via_netns)"


def test_inventory_examples_in_the_docs_load():
    text = (Path(REPO) / "docs" / "remote.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    import yaml

    offlab_inv, ansible_inv = (inventory.parse(yaml.safe_load(b), f"docs/remote.md#{n}") for n, b in enumerate(blocks))
    assert offlab_inv.format == "offlab" and sorted(offlab_inv.hosts) == ["left", "right"]
    assert ansible_inv.format == "ansible" and len(ansible_inv.hosts) == 5
    assert ansible_inv.hosts["hv1"].port == 2222 and ansible_inv.hosts["hv2"].user == "root"


# A wait on an SSH host for a file that never appears (how offlab waits for a remote process's end),
# interrupted by SIGTERM while the host looks: prints whether the host was marked as having had a command
# cut short (what the controller must then clean up there at its exit).
LOOK_CUT_SHORT = """
import json, sys
from offlab.hosts import from_ref
from offlab.hosts.ssh import cut_short
from offlab.interrupts import interrupts
host = from_ref(json.loads(sys.argv[1]))
try:
    with interrupts():
        host.wait_for_file(sys.argv[2], 60)
    print("not interrupted", flush=True)
except SystemExit:
    print("interrupted; cut short:", cut_short(host), flush=True)
"""


def test_an_interrupted_wait_on_an_ssh_host_is_dropped_at_once_and_its_look_there_ends(sshd, tmp_path, state_dir):
    # A command that changes something is let finish when a signal comes (test_lease: the record it
    # writes); one that only looks is dropped: nothing of it needs putting back, and waiting it out only
    # delays the exit. Its loop on the host ends at its next look, as no one reads it any more.
    look = "sh -c n=$2; while"
    child = subprocess.Popen([sys.executable, "-c", LOOK_CUT_SHORT, json.dumps(sshd.host().ref()),
                              f"/tmp/{tmp_path.name}-never"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "OFFLAB_STATE_DIR": str(state_dir)})
    try:
        deadline = time.monotonic() + 60  # a hang guard: the look starts once the master is up
        while not any(c.startswith(look) for c in sshd_mod.processes_in(sshd.server_ns).values()):
            assert time.monotonic() < deadline and child.poll() is None, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=50)  # a hang guard: the look alone would take 60 s
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out == "interrupted; cut short: False\n", out + err
    deadline = time.monotonic() + 10  # a hang guard: its next look is 0.2 s away
    while any(c.startswith(look) for c in sshd_mod.processes_in(sshd.server_ns).values()):
        assert time.monotonic() < deadline, sshd_mod.processes_in(sshd.server_ns)
        time.sleep(0.05)
