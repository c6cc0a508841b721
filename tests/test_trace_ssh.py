"""The kernel's own account on SSH hosts (issue 34): offlab's hist triggers set over the host's channel.

Parser and shell tests read hist files captured from a real 6.12 guest (tests/fixtures/trace_guest/)
and run offlab's own trigger scripts with sh on a copy of the events' trigger files. The live tests use
two stand-in machines (tests/sshd.py: sshd in namespaces of this machine): they share this machine's
kernel, and this kernel has no hist triggers (CONFIG_HIST_TRIGGERS is off), so what they prove is the
SSH path around the triggers, not what a remote kernel counts (docs/results.md says which is which):
the two stand-ins are found to be one kernel, the sample goes on untraced with one line naming the
host, nothing is left in this kernel's tracefs or on the hosts, and the host's own restore.sh knows
how to take offlab's triggers off.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from offlab import tracefs
from offlab.probes import hist, remote
from tests import sshd as sshd_mod
from tests.conftest import OUR_NAMESPACES, offlab_cli, requires_root
from tests.helpers import pair_plan, stand_in_machines

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "trace_guest")


def _captured(tag: str) -> str:
    """A real 6.12 guest's hist files with its triggers named as offlab names those of the host tagged `tag`."""
    with open(os.path.join(FIX, "kg612.end.txt")) as f:
        return f.read().replace("hist:name=offlab_", f"hist:name={tracefs.prefix(tag)}")


def test_a_hosts_histograms_are_read_without_another_hosts_on_the_same_kernel():
    mine, other = tracefs.tag_of("host a"), tracefs.tag_of("host b")
    assert mine != other
    # one kernel, two hosts' triggers: each hist file lists both, one after the other
    both = {p: a + b for (p, a), b in zip(remote.split_files(_captured(mine), tracefs.HIST_FILES).items(),
                                          remote.split_files(_captured(other).replace(" 44", " 45"),
                                                             tracefs.HIST_FILES).values(), strict=True)}
    got: dict = {}
    for text in both.values():
        got.update(hist.parse_hist(text, mine))
    alone: dict = {}
    for text in remote.split_files(_captured(mine), tracefs.HIST_FILES).values():
        alone.update(hist.parse_hist(text, mine))
    assert got == alone and "offlab_xmit" in got and any(k[2] == 44 for k in got["offlab_xmit"]), got.get("offlab_xmit")
    assert not any(k[2] == 45 for k in got["offlab_xmit"])


def _events(root: Path, lines: dict[str, list[str]]) -> None:
    for event in tracefs.EVENTS:
        d = root / "events" / event
        d.mkdir(parents=True, exist_ok=True)
        (d / "trigger").write_text("".join(l + "\n" for l in lines.get(event, [])))


def test_only_this_hosts_triggers_are_removed_and_anothers_keep_tracefs_mounted(tmp_path):
    """offlab's own shell (tracefs._OURS) on trigger files as the kernel lists them: removing one host's
    triggers writes '!' + each of its lines and none of the other host's (the kernel removes a trigger
    by that line)."""
    mine, other = tracefs.tag_of("host a"), tracefs.tag_of("host b")
    line = "hist:name={}drop:keys=reason,location.sym:vals=hitcount:sort=hitcount:size=2048 [active]"
    _events(tmp_path, {"skb/kfree_skb": [line.format(tracefs.prefix(mine)), line.format(tracefs.prefix(other)),
                                         "traceoff:unlimited"]})
    script = tracefs._env(mine) + tracefs._OURS + 't=$1; drop_ours; echo "anyone: $(anyone)"'
    res = subprocess.run(["sh", "-c", script, "sh", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    written = (tmp_path / "events/skb/kfree_skb/trigger").read_text().splitlines()[3:]
    assert written == ["!" + line.format(tracefs.prefix(mine)).removesuffix(" [active]")], written
    # the other host's trigger is still listed (in a real tracefs: still set), so tracefs stays mounted
    assert res.stdout.strip() == "anyone: skb/kfree_skb/trigger", res.stdout


def test_the_ssh_hosts_own_restore_knows_offlabs_triggers():
    """The journal's copy on an SSH host (knobs/undo.py) is the knob's own removal, not "only `offlab
    restore` can put this back"."""
    from offlab.hosts.ssh import SshHost
    from offlab.knobs.undo import undo_argvs

    host = SshHost("192.0.2.1", name="m1")
    entry = {"kind": "trace-hist", "key": "trace-hist", "netns": None, "iface": None, "host": host.ref(),
             "original": {"tracefs": "unmounted", "triggers": []}}
    argvs = undo_argvs(entry)
    assert argvs == [tracefs.remove_argv(unmount=True, tag=tracefs.tag_of(host.key))]
    entry["original"] = {"tracefs": "mounted", "triggers": []}
    assert undo_argvs(entry) == [tracefs.remove_argv(unmount=False, tag=tracefs.tag_of(host.key))]


# ---- two stand-in machines ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    # 10.200.218-220: no other module's stand-ins use them (the workers run modules side by side)
    with stand_in_machines(lambda: sshd_mod.start_pair(tmp_path_factory.mktemp("ts"), f"{OUR_NAMESPACES[0]}ts",
                                                       subnet=218)) as p:
        yield p


def offlab_triggers_on_this_kernel() -> list[str]:
    """Every trigger of offlab's in this machine's tracefs (the stand-ins' kernel), seen through a mount
    of its own (a mount namespace of its own: this machine's mounts are left as they are)."""
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          "mount -t tracefs nodev /sys/kernel/tracing && "
                          "grep -H '^hist:name=offlab_' /sys/kernel/tracing/events/*/*/trigger; exit 0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def tracefs_mounted() -> bool:
    with open("/proc/mounts") as f:
        return any(l.split()[2] == "tracefs" for l in f if len(l.split()) > 2)


@requires_root
@pytest.mark.network
def test_trace_on_two_stand_ins_finds_one_kernel_says_why_it_is_untraced_and_leaves_nothing(pair, tmp_path, state_dir):
    """`run PLAN --inventory --trace` (each pair's run measures with --trace, as `measure --trace` does)."""
    inv, plan, db = tmp_path / "inventory.yml", tmp_path / "plan.yaml", tmp_path / "results.db"
    inv.write_text(json.dumps(pair.inventory()))  # JSON is YAML
    plan.write_text(pair_plan("traced", 1))
    mounted_before = tracefs_mounted()
    res = offlab_cli("run", str(plan), "--inventory", str(inv), "--db", str(db), "--trace", "--json",
                     env={"OFFLAB_STATE_DIR": str(state_dir)}, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        samples = [json.loads(r[0]) for r in conn.execute("SELECT sample FROM samples")]
    assert len(samples) == 2 and all(s["traffic"]["throughput_bps"] > 0 for s in samples)  # the samples went on
    for s in samples:
        why = s["kernel_account"]["unavailable"]
        # one kernel (this machine's), traced at most once: the server is named as sharing the client's
        assert "client: " in why and "one kernel with client" in why, why
        assert "CONFIG_HIST_TRIGGERS is off" in why, why
        assert [n for n in s["notes"] if n.startswith("kernel account not taken: ") and "CONFIG_HIST_TRIGGERS" in n]
    assert not offlab_triggers_on_this_kernel()
    assert tracefs_mounted() == mounted_before
    assert not list(state_dir.glob("journal/*.journal")) and not list(state_dir.glob("labs/*.json"))
    for side in ("a", "b"):
        assert not Path(pair.remote_dir(side)).exists(), list(Path(pair.remote_dir(side)).rglob("*"))


@requires_root
@pytest.mark.network
def test_a_stand_ins_restore_sh_takes_offlabs_triggers_off_alone(pair, state_dir):
    """A trace-hist change journalled on a stand-in, its controller gone: the host's restore.sh (sh and
    its tools only) runs the removal and says so; nothing of offlab's is left in the kernel or the host."""
    from offlab.hosts.ssh import SshHost
    from offlab.knobs import undo

    m, inv = pair.b, pair.inventory()["hosts"]["b"]
    host = SshHost(m.ssh_ip, user="root", port=pair.port, identity=inv["identity_file"], ssh_args=inv["ssh_args"],
                   config="/dev/null", via_netns=pair.controller, connect_timeout=5, name="b",
                   remote_dir=pair.remote_dir("b"))
    record = {"seq": 1, "kind": "trace-hist", "key": "trace-hist", "netns": None, "iface": None, "host": host.ref(),
              "value": "on", "original": {"tracefs": "unmounted", "triggers": []}, "original_text": "0 trigger(s)"}
    undo.copy_to_host(state_dir / "trace.journal", record)
    from offlab.hosts import NetnsHost
    res = NetnsHost(m.ns).run(["sh", f"{pair.remote_dir('b')}/restore.sh"], check=False)
    assert res.rc == 0 and res.stdout.startswith("restored: - trace-hist: on"), res.stdout + res.stderr
    assert not Path(pair.remote_dir("b")).exists()
    assert not offlab_triggers_on_this_kernel()
