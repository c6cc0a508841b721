"""The bad-input table: every input a person (or a hostile plan) can get wrong, through the real CLI.

Each case is an argv, or a plan file (run as `offlab run PLAN --validate`), with the exit code
and a fragment of the one-line message it must give, and never a traceback. None needs a lab:
every value is judged before one is built. Add a row for every new bad input found.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO

MEMORY_LIMIT = 1 << 30  # a regression (an alias bomb expanded) must fail here, not take the machine down
# A hang guard, not a threshold: a refusal takes a Python start-up (~0.7 CPU-s), but on a 2-core machine
# under load ~18 (stress-ng, TCG guests, rustc) three at a time got no answer within 30 s.
TIMEOUT_S = 120

PLAN = textwrap.dedent("""\
    name: t
    topology: {kind: bridge}
    axes:
      offload:
        off: {features: {client: {uso: off}}}
        on: {features: {client: {uso: on}}}
    workload: {tool: engine, protocol: udp, duration: 1}
    """)


def plan(old: str = "", new: str = "", extra: str = "") -> str:
    """PLAN with `old` replaced by `new` (which must be there) and `extra` appended."""
    assert old in PLAN
    return PLAN.replace(old, new) + extra if old else PLAN + extra


def bomb(levels: int = 9, width: int = 9) -> str:
    """Billion laughs: a few hundred bytes that expand to width**levels values."""
    text = f"a0: &a0 [{', '.join(['lol'] * width)}]\n"
    for i in range(1, levels + 1):
        text += f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]\n"
    return text


@dataclass
class Case:
    id: str
    expect_rc: int
    fragment: str
    argv: list[str] = field(default_factory=list)  # {plan}, {tmp}, {db} are filled in
    plan: str | bytes | None = None  # written to {plan}; argv defaults to `run {plan} --validate`
    db: tuple[str, tuple] | None = None  # (SQL, parameters) run on a fresh results database {db} first
    xfail: str | None = None
    hostile: bool = False  # could exhaust memory if a regression let it through: own process, 1 GiB
    process: bool = False  # the process edge itself: a real `python -m offlab`, its exit code and stderr

    @property
    def in_process(self) -> bool:
        """Every case but the hostile ones, those with a database, and a few kept as real processes runs
        through offlab.cli.main in this process: a Python start-up each costs ~0.5-0.7 CPU-s."""
        return not (self.hostile or self.process or self.db is not None)

    def args(self, tmp: Path) -> list[str]:
        argv = self.argv or ["run", "{plan}", "--validate"]
        return [a.format(plan=tmp / f"{self.id}.yaml", tmp=tmp, db=tmp / f"{self.id}.db") for a in argv]


HOSTS_UP = ["lab", "up", "hosts", "--name", "zz", "--inventory", "{plan}"]
INVENTORY = textwrap.dedent("""\
    hosts:
      a:
        ssh: 192.0.2.1
        interfaces: [{name: e0, addresses: [198.51.100.1/24]}]
      b:
        ssh: 192.0.2.2
        interfaces: [{name: e0, addresses: [198.51.100.2/24]}]
    """)
MEASURE = ["measure", "nolab"]  # the lab does not exist: each value must be refused before it is looked up

CASES = [
    # ---- 1. hostile plans: refused fast, with bounded memory, nothing executed -------------------
    Case("alias-bomb", 2, "alias-bomb.yaml:5: more than 20000 values once aliases are expanded", plan=bomb() + PLAN, hostile=True),
    Case("alias-recursive", 2, "alias *a is used inside the value it names", plan="a: &a [1, *a]\n" + PLAN, hostile=True),
    Case("nesting-deep", 2, "nested more than 32 levels deep", plan="x: " + "[" * 5000 + "]" * 5000 + "\n", hostile=True),
    Case("plan-11MB", 2, "the plan is larger than 64 KiB", plan=PLAN + "#" + "x" * (11 << 20) + "\n", hostile=True),
    Case("plan-dev-zero", 2, "the plan is larger than 64 KiB", argv=["run", "/dev/zero", "--validate"], hostile=True),
    Case("tag-python-apply", 2, "tag !!python/object/apply:os.system is not allowed",
         plan=PLAN.replace("name: t", "name: !!python/object/apply:os.system ['touch {tmp}/pwned']")),
    Case("tag-python-name", 2, "tag !!python/name:os.system is not allowed", plan=plan(extra="seed: !!python/name:os.system ''\n")),
    Case("tag-binary", 2, "tag !!binary is not allowed", plan=plan(extra="description: !!binary aGk=\n")),
    Case("tag-local", 2, "tag !include is not allowed", plan=plan(extra="description: !include /etc/passwd\n")),
    Case("tag-set", 2, "tag !!set is not allowed", plan=plan(extra="description: !!set {a, b}\n")),
    Case("duplicate-key", 2, ".yaml:8: duplicate key 'topology' (first on line 2)", plan=plan(extra="topology: {kind: veth}\n")),
    Case("duplicate-nested-key", 2, ".yaml:7: duplicate key 'duration' (first on line 7)",
         plan=plan("duration: 1}", "duration: 1, duration: 2}")),
    Case("merge-key", 2, "merge keys (<<) are YAML 1.1", plan="base: &b {kind: veth}\n" +
         plan("topology: {kind: bridge}", "topology: {<<: *b}")),
    Case("not-utf8", 2, ".yaml:2: the plan is not UTF-8 text (byte 0xe9", plan=b"name: t\ntopology: {kind: caf\xe9}\n"),
    Case("utf16", 2, "the plan is not UTF-8 text", plan=PLAN.encode("utf-16")),
    Case("control-char", 2, ".yaml:1: not valid YAML: character #x0007", plan="name: t\x07\n"),
    Case("not-yaml", 2, "not valid YAML", plan="name: [unclosed\n"),
    Case("empty-plan", 2, "the plan is empty", plan=""),
    Case("plan-is-a-list", 2, "a plan is a mapping", plan="- name: t\n"),
    Case("plan-missing", 2, "cannot read plan", argv=["run", "{tmp}/nonexistent.yaml", "--validate"], process=True),
    Case("plan-is-a-directory", 2, "Is a directory", argv=["run", "{tmp}", "--validate"]),
    Case("too-many-cells", 2, ".yaml:3: axes: the axes make 20000 cells (10 × 10 × 10 × 10 × 2); at most 4096",
         plan=plan("axes:\n", "axes:\n" + "".join(
             f"  {key}: [{', '.join(f'{{{key}: {base + j}}}' for j in range(10))}]\n"
             for key, base in (("sndbuf", 4096), ("rcvbuf", 4096), ("warmup", 0), ("duration", 1)))), hostile=True),
    Case("stored-plan-is-a-bomb", 2, "run 1 plan:5: more than 20000 values once aliases are expanded",
         argv=["run", "--resume", "1", "--db", "{db}"],
         db=("INSERT INTO runs(name, status, started_at, offlab_version, seed, plan_text, plan, env, repeat) "
             "VALUES ('t', 'interrupted', '2026-01-01T00:00:00.000Z', '0', 1, ?, '{}', '{}', '{}')", (bomb() + PLAN,))),
    # ---- 6. --validate finds what used to surface only once the lab was up ----------------------
    Case("host-not-in-topology", 2, ".yaml:5: axes.offload.off.features.router: a bridge lab has no host 'router'",
         plan=plan("client: {uso: off}", "router: {uso: off}")),
    Case("iface-not-on-host", 2, "host 'client' of a bridge lab has no interface 'to-router'; it has to-switch",
         plan=plan("client: {uso: off}", "'client:to-router': {uso: off}")),
    Case("iface-ambiguous", 2, "host 'switch' of a bridge lab has several interfaces (to-client, to-server, br0)",
         plan=plan("client: {uso: off}", "switch: {uso: off}")),
    Case("capture-host-missing", 2, ".yaml:8: capture.host: a bridge lab has no host 'router'",
         plan=plan(extra="capture: {on: router}\n")),
    Case("capture-iface-ambiguous", 2, "capture: host 'switch' of a bridge lab has several interfaces",
         plan=plan(extra="capture: {on: switch}\n")),
    Case("machine-non-sysctl", 2, "'machine' takes host-wide sysctls only (net.*, kernel.*, vm.*), not 'gro'",
         plan=plan("features: {client: {uso: off}}", "settings: {machine: {gro: off}}")),
    Case("setting-unknown", 2, "unknown setting 'foo.bar'", plan=plan("features: {client: {uso: off}}",
                                                                      "settings: {client: {foo.bar: 1}}")),
    Case("setting-feature-typo", 2, "unknown feature 'grp'; did you mean gro",
         plan=plan("features: {client: {uso: off}}", "settings: {client: {grp: off}}")),
    Case("sysctl-with-iface", 2, "net.core.rmem_max is a sysctl of client's namespace, not of an interface",
         plan=plan("features: {client: {uso: off}}", "settings: {'client:to-switch': {net.core.rmem_max: 4194304}}")),
    Case("bridge-nf-on-veth", 2, "nf_call_iptables is a per-bridge setting; client is not a bridge (a bridge lab's bridges: switch:br0)",
         plan=plan("features: {client: {uso: off}}", "settings: {client: {nf_call_iptables: 0}}")),
    Case("setting-mtu-range", 2, "mtu 70000 is out of range", plan=plan("features: {client: {uso: off}}",
                                                                       "settings: {client: {mtu: 70000}}")),
    Case("engine-tcp", 2, ".yaml:7: workload.protocol: the engine drives UDP only", plan=plan("protocol: udp", "protocol: tcp")),
    Case("iperf3-gso", 2, ".yaml:6: axes.offload.on.gso: needs tool engine",
         plan=plan("tool: engine", "tool: iperf3").replace("on: {features: {client: {uso: on}}}",
                                                           "on: {features: {client: {uso: on}}, gso: true}")),
    Case("iperf3-pps-rate", 2, "iperf3 takes a bit rate", plan=plan("tool: engine", "tool: iperf3, rate: 100kpps")),
    Case("plan-rate-banana", 2, "workload.rate: a rate is 0 (unlimited)", plan=plan("duration: 1", "duration: 1, rate: banana")),
    Case("plan-size-too-big", 2, "a UDP payload for engine is 24..65507 bytes (got 70000)",
         plan=plan("duration: 1", "duration: 1, size: 70000")),
    Case("plan-size-ipv6-ok-v4-not", 2, "24..65507", plan=plan("duration: 1", "duration: 1, size: 65520")),
    Case("plan-duration-negative", 2, "workload.duration: seconds, more than 0", plan=plan("duration: 1", "duration: -1")),
    Case("plan-batch-0", 2, "workload.batch: datagrams per sendmmsg/recvmmsg call or linked SQEs per io_uring_enter, 1..1024 (got 0)",
         plan=plan("duration: 1", "duration: 1, batch: 0")),
    Case("plan-ipv6-mtu", 2, ".yaml:2: topology.mtu: mtu 1000 with ipv6: IPv6 needs an MTU of at least 1280",
         plan=plan("kind: bridge}", "kind: bridge, ipv6: true, mtu: 1000}")),
    Case("plan-vxlan-underlay", 2, "mtu 9000 does not fit the VXLAN underlay: at most underlay_mtu 1550 - 50 = 1500",
         plan=plan("kind: bridge}", "kind: vxlan, mtu: 9000, underlay_mtu: 1550}")),
    Case("plan-vni-on-bridge", 2, "topology.vni: vni applies to a vxlan lab only", plan=plan("kind: bridge}", "kind: bridge, vni: 7}")),
    Case("plan-search-bounds", 2, "search_low (2Mpps) must be below search_high (10kpps)",
         plan=plan("duration: 1", "duration: 1, search_max_loss: 0.001, search_low: 2Mpps, search_high: 10kpps")),
    Case("plan-budget-zero", 2, "budget is seconds", plan=plan(extra="budget: 0s\n")),
    # ---- 7. values checked before any child tool runs -------------------------------------------
    Case("measure-batch-0", 2, "--batch 0: datagrams per sendmmsg/recvmmsg call or linked SQEs per io_uring_enter, 1..1024", argv=[*MEASURE, "--batch", "0"]),
    Case("measure-batch-100000", 2, "--batch 100000: ", argv=[*MEASURE, "--tool", "engine", "--proto", "udp", "--batch", "100000"]),
    Case("measure-rate-banana", 2, "--rate 'banana': a rate is", argv=[*MEASURE, "--rate", "banana"]),
    Case("measure-rate-pps-iperf3", 2, "--rate 100kpps: iperf3 takes a bit rate", argv=[*MEASURE, "--rate", "100kpps"]),
    Case("measure-size-0", 2, "--size 0: a TCP payload for iperf3 is 1..1048576 bytes", argv=[*MEASURE, "--size", "0"]),
    Case("measure-size-udp-70000", 2, "--size 70000: a UDP payload for iperf3 is 16..65507 bytes",
         argv=[*MEASURE, "--proto", "udp", "--size", "70000"]),
    Case("measure-size-engine-16", 2, "--size 16: a UDP payload for engine is 24..65507 bytes",
         argv=[*MEASURE, "--tool", "engine", "--proto", "udp", "--size", "16"]),
    Case("measure-duration-negative", 2, "--duration -1.0: seconds, more than 0", argv=[*MEASURE, "--duration", "-1"]),
    Case("measure-duration-nan", 2, "--duration nan", argv=[*MEASURE, "--duration", "nan"]),
    Case("measure-warmup-negative", 2, "--warmup -0.5", argv=[*MEASURE, "--warmup", "-0.5"]),
    Case("measure-streams-0", 2, "--streams 0: 1..128", argv=[*MEASURE, "--streams", "0"]),
    Case("measure-engine-tcp", 2, "--proto tcp: the engine drives UDP only", argv=[*MEASURE, "--tool", "engine", "--proto", "tcp"]),
    Case("measure-tool-unknown", 2, "--tool 'ncat': choose iperf3 or engine", argv=[*MEASURE, "--tool", "ncat"]),
    Case("measure-frames-0", 2, "--frames 0: 1..1000000", argv=[*MEASURE, "--frames", "0"]),
    Case("measure-capture-shell", 2, "--capture 'server;rm': write HOST[:IFACE]", argv=[*MEASURE, "--capture", "server;rm"]),
    Case("measure-size-not-a-number", 2, "Invalid value for '--size'", argv=[*MEASURE, "--size", "big"],
         process=True),
    # ---- request/response and rr-under-load (issue #12) ------------------------------------------
    Case("measure-workload-unknown", 2, "--workload 'ping': choose stream, rr or rr-under-load",
         argv=[*MEASURE, "--workload", "ping"]),
    Case("rr-request-size-0", 2, "--request-size 0: a udp request/response here is 24..65507 bytes",
         argv=[*MEASURE, "--workload", "rr", "--request-size", "0"]),
    Case("rr-response-size-negative", 2, "--response-size -64: a tcp request/response here is 24..1048576 bytes",
         argv=[*MEASURE, "--workload", "rr", "--proto", "tcp", "--response-size", "-64"]),
    Case("rr-flows-0", 2, "--flows 0: 1..256", argv=[*MEASURE, "--workload", "rr", "--flows", "0"]),
    Case("rr-under-load-request-size-0", 2, "--request-size 0: a udp request/response",
         argv=[*MEASURE, "--workload", "rr-under-load", "--request-size", "0"]),
    Case("rr-under-load-rr-proto", 2, "--rr-proto 'icmp': the probe is udp, tcp or tcp-crr",
         argv=[*MEASURE, "--workload", "rr-under-load", "--rr-proto", "icmp"]),
    Case("rr-under-load-too-short", 2, "--duration 0.3: rr-under-load needs more than 0.4 s",
         argv=[*MEASURE, "--workload", "rr-under-load", "--tool", "engine", "--duration", "0.3"]),
    Case("plan-rr-request-size-0", 2, "workload.request_size: a udp request/response here is 24..65507 bytes",
         plan=plan("duration: 1", "duration: 1, kind: rr, request_size: 0")),
    Case("plan-kind-unknown", 2, "workload.kind", plan=plan("duration: 1", "duration: 1, kind: ping")),
    Case("plan-napi-defer-negative", 2, "napi_defer_hard_irqs takes an integer 0..2147483647, got -1",
         plan=plan("{client: {uso: on}}", "{client: {uso: on}}, settings: {client: {napi_defer_hard_irqs: -1}}")),
    Case("plan-gro-flush-timeout-text", 2, "gro_flush_timeout takes an integer 0..1000000000, got '20us'",
         plan=plan("{client: {uso: on}}", "{client: {uso: on}}, settings: {client: {gro_flush_timeout: 20us}}")),
    Case("plan-busy-poll-negative", 2, "net.core.busy_poll takes an integer 0..2147483647, got -5",
         plan=plan("{client: {uso: on}}", "{client: {uso: on}}, settings: {machine: {net.core.busy_poll: -5}}")),
    Case("plan-busy-poll-in-a-namespace", 2, "net.core.busy_poll is host-wide (no network namespace has it)",
         plan=plan("{client: {uso: on}}", "{client: {uso: on}}, settings: {client: {net.core.busy_poll: 50}}")),
    Case("lab-up-name-empty", 2, "--name: invalid lab name ''", argv=["lab", "up", "veth", "--name", ""]),
    Case("lab-up-name-path", 2, "--name: invalid lab name '../x'", argv=["lab", "up", "veth", "--name", "../x"],
         process=True),
    Case("lab-up-ipv6-mtu-1000", 2, "--mtu 1000 with --ipv6: IPv6 needs an MTU of at least 1280",
         argv=["lab", "up", "veth", "--name", "zz", "--ipv6", "--mtu", "1000"]),
    Case("lab-up-mtu-70000", 2, "--mtu 70000 is out of range", argv=["lab", "up", "veth", "--name", "zz", "--mtu", "70000"]),
    Case("lab-up-topology-unknown", 2, "unknown topology 'mesh'", argv=["lab", "up", "mesh", "--name", "zz"]),
    Case("lab-up-dpdk-pmd", 2, "--pmd 'virtio': choose tap or af_packet",
         argv=["lab", "up", "dpdk", "--name", "zz", "--pmd", "virtio"]),
    Case("lab-up-dpdk-jumbo", 2, "--mtu 9000: the dpdk lab's ports take at most 1500",
         argv=["lab", "up", "dpdk", "--name", "zz", "--mtu", "9000"]),
    Case("lab-up-pmd-not-dpdk", 2, "--pmd is an option of the dpdk and ovs-dpdk topologies only",
         argv=["lab", "up", "veth", "--name", "zz", "--pmd", "tap"]),
    Case("lab-up-vni-0", 2, "--vni 0 is out of range", argv=["lab", "up", "vxlan", "--name", "zz", "--vni", "0"]),
    Case("lab-up-nic-no-value", 2, "--nic 'mq': write PROP=VALUE", argv=["lab", "up", "vm-router", "--name", "zz", "--nic", "mq"]),
    Case("lab-up-nic-queues-99", 2, "virtio-net queues=99: a whole number from 1 to 8",
         argv=["lab", "up", "vm-pair", "--name", "zz", "--nic", "queues=99"]),
    Case("lab-up-nic-on-veth", 2, "--nic and --guest-cpus are for guest topologies",
         argv=["lab", "up", "veth", "--name", "zz", "--nic", "mq=on"]),
    Case("lab-up-guest-cpus-0", 2, "guest_cpus 0: a whole number of vCPUs from 1 to 8",
         argv=["lab", "up", "vm-router", "--name", "zz", "--guest-cpus", "0"]),
    Case("lab-show-bad-name", 2, "invalid lab name '../etc'", argv=["lab", "show", "../etc"]),
    Case("lab-explain-no-lab", 2, "no lab named 'nolabhere'", argv=["lab", "explain", "nolabhere"]),
    Case("mtu-calc-ipv6-1000", 2, "--mtu 1000 is below IPv6's minimum 1280", argv=["mtu", "calc", "--mtu", "1000", "--ipv6"]),
    Case("run-nothing", 2, "give a PLAN file or --resume RUN_ID", argv=["run"], process=True),
    Case("run-validate-resume", 2, "--validate checks a PLAN file", argv=["run", "--resume", "1", "--validate"]),
    Case("suite-unknown", 2, "no suite named 'nope'", argv=["suite", "show", "nope"]),
    # ---- 9. no tracebacks, where the cause is input ---------------------------------------------
    # `doctor --root` with a malformed cpu/online is not bad input: doctor counts the CPUs from cpuinfo
    # instead (tests/test_crash_safety.py::test_doctor_root_with_a_malformed_cpu_online_counts_cpus_from_cpuinfo).
    Case("results-bad-json-row", 2, "column env of run 1 in", argv=["results", "show", "1", "--db", "{db}"],
         db=("INSERT INTO runs(name, status, started_at, offlab_version, seed, plan_text, plan, env, repeat) "
             "VALUES ('t', 'done', '2026-01-01T00:00:00.000Z', '0', 1, 'name: t', '{}', '{not json', '{}')", ())),
    # ---- 10. labs over existing machines: the inventory and --pair, refused before anything connects ----
    Case("lab-up-hosts-no-inventory", 2, "lab up hosts needs --inventory FILE", argv=["lab", "up", "hosts"]),
    Case("lab-up-veth-with-pair", 2, "--inventory, --pair and --allow-management-traffic are for `lab up hosts`",
         argv=["lab", "up", "veth", "--name", "zz", "--pair", "a:e0,b:e0"]),
    Case("hosts-inventory-unknown-key", 2, "host 'a': unknown key 'sshh'", argv=[*HOSTS_UP],
         plan=INVENTORY.replace("ssh: 192.0.2.1", "sshh: 192.0.2.1")),
    Case("hosts-pair-unknown-host", 2, "no host 'c' in the inventory (hosts: a, b)", argv=[*HOSTS_UP, "--pair", "a:e0,c:e0"],
         plan=INVENTORY),
    Case("hosts-pair-hostile-iface", 2, "--pair: invalid interface name", argv=[*HOSTS_UP, "--pair", "a:e0;reboot,b:e0"],
         plan=INVENTORY),
    Case("hosts-pair-same-port", 2, "both ends are the same interface", argv=[*HOSTS_UP, "--pair", "a:e0,a:e0"],
         plan=INVENTORY),
    Case("hosts-test-address-is-ssh-address", 2, "host 'a': interface 'e0': test address 192.0.2.1 is the SSH address",
         argv=[*HOSTS_UP], plan=INVENTORY.replace("198.51.100.1/24", "192.0.2.1/24")),
    Case("hosts-duplicate-address", 2, "address 198.51.100.1 is also declared by a:e0", argv=[*HOSTS_UP],
         plan=INVENTORY.replace("198.51.100.2/24", "198.51.100.1/24")),
    Case("hosts-which-pair", 2, "which hosts face each other? declare `pairs:", argv=[*HOSTS_UP],
         plan=INVENTORY + "  c: {ssh: 192.0.2.3, interfaces: [{name: e0, addresses: [198.51.100.3/24]}]}\n"),
    Case("hosts-no-test-interface", 2, "which hosts face each other", argv=[*HOSTS_UP],
         plan=INVENTORY.replace("    interfaces: [{name: e0, addresses: [198.51.100.2/24]}]\n", "")),
    Case("hosts-pairs-unknown-host", 2, "pairs[0]: no host 'z'", argv=[*HOSTS_UP],
         plan="pairs: ['a:e0,z:e0']\n" + INVENTORY),
    Case("hosts-remote-dir-relative", 2, "host 'a': remote_dir 'tmp/x': an absolute path", argv=[*HOSTS_UP],
         plan=INVENTORY.replace("ssh: 192.0.2.1", "ssh: 192.0.2.1\n    remote_dir: tmp/x")),
    Case("run-pair-without-inventory", 2, "--pair with `offlab run` needs --inventory FILE",
         argv=["run", "{plan}", "--pair", "a:e0,b:e0"], plan=PLAN),
    Case("run-inventory-plan-not-veth", 2, "a plan run with --inventory runs on two existing hosts",
         argv=["run", "{plan}", "--inventory", "/nonexistent.yml"], plan=PLAN),
]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _prepare(case: Case, tmp: Path) -> dict:
    """Write the case's plan and database; the environment it runs in."""
    if case.plan is not None:
        data = case.plan if isinstance(case.plan, bytes) else case.plan.replace("{tmp}", str(tmp)).encode()
        (tmp / f"{case.id}.yaml").write_bytes(data)
    if case.db is not None:
        from offlab.store import Store

        Store.open(tmp / f"{case.id}.db")  # creates the schema
        with sqlite3.connect(tmp / f"{case.id}.db") as conn:
            conn.execute(*case.db)
    return {"OFFLAB_STATE_DIR": str(tmp / "state"), "OFFLAB_DB": str(tmp / "default.db")}


def _run_in_process(case: Case, tmp: Path) -> tuple[subprocess.CompletedProcess, float, str]:
    """offlab.cli.main, as `python -m offlab` runs it, with its stderr captured and any escape as a traceback."""
    from offlab.cli import main

    env, argv = _prepare(case, tmp), case.args(tmp)
    saved_argv, saved_env = sys.argv, dict(os.environ)
    saved_signals = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    sys.argv, err, rc = ["offlab", *argv], io.StringIO(), 0
    os.environ.update(env)
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - what escapes main() is what a person would see as a traceback
        err.write(traceback.format_exc())
        rc = 1
    finally:
        sys.argv = saved_argv
        for n, handler in saved_signals.items():
            signal.signal(n, handler)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(argv, rc, "", err.getvalue()), time.monotonic() - t0, ""


def _run(case: Case, tmp: Path) -> tuple[subprocess.CompletedProcess | None, float, str]:
    env = {**os.environ, **_prepare(case, tmp)}
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-m", "offlab", *case.args(tmp)], capture_output=True, text=True,
                             cwd=REPO, env=env, timeout=TIMEOUT_S, preexec_fn=_limited)
    except subprocess.TimeoutExpired:
        return None, TIMEOUT_S, f"no answer within {TIMEOUT_S} s"
    return res, time.monotonic() - t0, ""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case run once (hostile, database and process-edge cases as processes, three at a time; the
    rest in this process): id → (result, seconds, why)."""
    tmp = tmp_path_factory.mktemp("bad-input")
    spawned = [c for c in CASES if not c.in_process]
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.id: pool.submit(_run, c, tmp) for c in spawned}
        out = {c.id: _run_in_process(c, tmp) for c in CASES if c.in_process}
        out.update({cid: f.result() for cid, f in futures.items()})
    if (tmp / "state" / "labs").exists():  # only a regression builds a lab: do not leave it behind
        subprocess.run([sys.executable, "-m", "offlab", "lab", "down", "--all"], cwd=REPO, capture_output=True,
                       env={**os.environ, "OFFLAB_STATE_DIR": str(tmp / "state")}, timeout=120)
    out["_tmp"] = tmp
    return out


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(reason=c.xfail, strict=False)]
                                               if c.xfail else []) for c in CASES])
def test_bad_input_exits_with_its_code_and_one_line_naming_it(case, results):
    res, seconds, why = results[case.id]
    assert res is not None, why
    err = res.stderr
    assert "Traceback" not in err, err[-2000:]
    assert res.returncode == case.expect_rc, f"rc {res.returncode}: {err[-1000:]}"
    assert case.fragment in err, err[-1000:]
    if not case.fragment.startswith("Invalid value"):  # click's own usage errors take a few lines
        assert err.strip().startswith("offlab: error: ") and len(err.strip().splitlines()) == 1, err


def test_no_command_from_a_plan_ran(results):
    assert not (results["_tmp"] / "pwned").exists()


def test_no_lab_was_built_for_a_bad_input(results):
    labs = results["_tmp"] / "state" / "labs"
    assert not labs.exists() or not any(labs.iterdir())


HOSTILE = {
    "alias-bomb": bomb() + PLAN,
    "alias-bomb-wide": bomb(levels=4, width=200) + PLAN,
    "nesting-deep": "x: " + "[" * 20000 + "]" * 20000 + "\n",
    "alias-chain-deep": "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 2000)),
    "many-keys-at-the-cap": "name: t\n" + "".join(f"k{i}: {i}\n" for i in range(7000)),
}


# A hostile plan may cost this many times a valid plan's load, no more (measured side by side). Seen
# here: the 33-level nesting ~100× (the YAML parser's own recursion), every other case ≤ 6×; an
# alias expansion grows exponentially past any such factor.
HOSTILE_COST_RATIO = 250


def test_hostile_plans_are_refused_at_the_cost_of_a_valid_one_with_bounded_memory(tmp_path):
    """Timed in CPU seconds against a valid plan's load in the same child (the machine is shared),
    inside a child limited to 1 GiB of address space, so a regression cannot exhaust the machine."""
    script = textwrap.dedent("""\
        import json, sys, time
        from offlab.errors import BadInput
        from offlab.experiment.plan import load_plan, load_plan_file
        out = {}
        plan = json.load(open(sys.argv[3]))
        base = []
        for _ in range(5):  # a valid plan, loaded side by side: what parsing costs on this machine now
            t0 = time.process_time()
            load_plan(plan, "valid.yaml")
            base.append(time.process_time() - t0)
        out["valid"] = sorted(base)[2]
        for name, text in json.load(open(sys.argv[1])).items():
            t0 = time.process_time()
            try:
                load_plan(text, name)
                msg = "accepted"
            except BadInput as exc:
                msg = str(exc)
            out[name] = [time.process_time() - t0, msg]
        t0 = time.process_time()
        try:
            load_plan_file(sys.argv[2])
        except BadInput as exc:
            out["11MB"] = [time.process_time() - t0, str(exc)]
        # this process's own peak (VmHWM: its memory since exec; getrusage's maxrss would carry the
        # forking pytest worker's peak across the exec)
        out["maxrss_kib"] = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))
        print(json.dumps(out))
        """)
    (tmp_path / "cases.json").write_text(json.dumps(HOSTILE))
    big = tmp_path / "big.yaml"
    big.write_text(PLAN + "#" + "x" * (11 << 20) + "\n")
    (tmp_path / "valid.json").write_text(json.dumps(PLAN))
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cases.json"), str(big),
                          str(tmp_path / "valid.json")], cwd=REPO,
                         capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limited)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    for name in (*HOSTILE, "11MB"):
        seconds, msg = out[name]
        assert msg != "accepted", name
        # relative to loading a valid plan in the same process (the machine is shared)
        ratio = seconds / max(out["valid"], 1e-4)
        assert ratio < HOSTILE_COST_RATIO, f"{name}: {seconds:.3f} CPU s, {ratio:.0f}× a valid plan: {msg}"
        assert "\n" not in msg
    assert "larger than 64 KiB" in out["11MB"][1]
    assert out["maxrss_kib"] < 300 * 1024  # the interpreter and pydantic (~55 MiB here); no expansion
