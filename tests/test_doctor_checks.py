"""Every doctor check against committed fixtures: each has an ok and a non-ok case here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offlab.doctor import all_checks, audit, open_root

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"

# (fixture, check id, interface or None, status, text the summary must contain)
EXPECTED = [
    ("dpdk-host", "dpdk.runnable", None, "ok", "no hugepages reserved: offlab runs DPDK with --no-huge"),
    ("dpdk-missing", "dpdk.runnable", None, "fail", "missing dpdk-testpmd, ovs-vswitchd-dpdk"),
    ("this-machine", "cpu.smt", None, "ok", "SMT not supported"),
    ("sos-centos7-kvm", "cpu.smt", None, "warn", "CPUs 0,4 share a core"),
    ("tuned-host", "cpu.governor", None, "ok", "performance on 8"),
    ("this-machine", "cpu.governor", None, "ok", "no cpufreq driver"),
    ("sos-centos7-kvm", "cpu.governor", None, "warn", "powersave on 8"),
    ("this-machine", "cpu.idle", None, "ok", "haltpoll"),
    ("tuned-host", "cpu.idle", None, "ok", "C1E (10 µs)"),
    ("sos-centos7-kvm", "cpu.idle", None, "warn", "C6 133 µs"),
    ("this-machine", "cpu.numa-nodes", None, "ok", "GenuineIntel"),
    ("amd-avic0", "cpu.numa-nodes", None, "warn", "2 NUMA node(s) on 2 socket(s) (NPS1)"),
    ("this-machine", "kernel.version", None, "ok", "6.18.44"),
    ("virtio-1q-8cpu", "kernel.version", None, "warn", "older than the guide's 5.4"),
    ("sos-centos7-kvm", "kernel.version", None, "warn", "lacks limited busy polling (4.6)"),
    ("tuned-host", "kernel.mitigations", None, "ok", "mitigations=off"),
    ("this-machine", "kernel.mitigations", None, "warn", "mitigations=auto"),
    ("sos-centos7-kvm", "kernel.mitigations", None, "warn", "6 mitigations active"),
    ("amd-avic0", "kernel.hugepages", None, "ok", "1024 hugepages of 2048 kB"),
    ("this-machine", "kernel.hugepages", None, "info", "no hugepages"),
    ("this-machine", "kvm.avic", None, "ok", "kvm_amd not loaded"),
    ("amd-avic0", "kvm.avic", None, "warn", "kvm_amd avic=0"),
    ("sos-centos7-kvm", "kvm.ept", None, "ok", "kvm_intel ept=Y"),
    ("amd-avic0", "kvm.ept", None, "ok", "kvm_amd npt=1"),
    ("virtio-1q-8cpu", "kvm.ept", None, "fail", "ept=N"),
    ("this-machine", "kvm.vhost", None, "ok", "no vhost workers"),
    ("tuned-host", "kvm.vhost", None, "ok", "2 vhost workers (kthread) pinned"),
    ("amd-avic0", "kvm.vhost", None, "warn", "2 of 2 vhost workers (kthread) may run on any CPU (0-7)"),
    ("sos-centos7-kvm", "kvm.vhost", None, "skip", "no data: 2 vhost workers listed"),
    ("this-machine", "nic.rings", "eth0", "ok", "rx 256/256"),
    ("sos-centos7-kvm", "nic.rings", "ens1f0", "ok", "rx 512/4096"),
    ("amd-avic0", "nic.rings", "enp65s0f0", "warn", "rx 128/8192"),
    ("tuned-host", "nic.flow-hash", "ens1f0", "ok", "sdfn"),
    ("amd-avic0", "nic.flow-hash", "enp65s0f0", "warn", "'sd' only"),
    ("this-machine", "nic.flow-hash", "eth0", "info", "one rx queue"),
    ("virtio-1q-8cpu", "nic.flow-hash", "eth0", "skip", "Operation not supported"),
    ("amd-avic0", "nic.coalesce", "enp65s0f0", "ok", "adaptive-rx off"),
    ("sos-centos7-kvm", "nic.coalesce", "ens1f0", "warn", "adaptive RX coalescing on"),
    ("this-machine", "nic.coalesce", "eth0", "info", "an interrupt per received packet"),
    ("this-machine", "nic.offloads", "eth0", "ok", "every changeable offload"),
    ("sos-centos7-kvm", "nic.offloads", "ens1f0", "warn", "generic-receive-offload"),
    ("this-machine", "nic.nocache-copy", "eth0", "ok", "tx-nocache-copy off"),
    ("sos-centos7-kvm", "nic.nocache-copy", "ens1f0", "warn", "tx-nocache-copy on"),
    ("tuned-host", "nic.queues", "ens1f0", "ok", "8 queue(s) for 8 CPU(s)"),
    ("sos-centos7-kvm", "nic.queues", "ens1f0", "warn", "4 of 64 queues in use on 8 CPUs"),
    ("virtio-1q-8cpu", "nic.queues", "eth0", "warn", "single queue to 8 CPUs"),
    ("this-machine", "nic.queues", "eth0", "warn", "single queue to 2 CPUs"),
    ("tuned-host", "nic.rps-xps", "ens1f0", "ok", "XPS set"),
    ("virtio-1q-8cpu", "nic.rps-xps", "eth0", "warn", "one rx queue and RPS off"),
    ("this-machine", "nic.numa", "eth0", "ok", "one NUMA node"),
    ("tuned-host", "nic.numa", "ens1f0", "ok", "its 9 IRQs stay on node 0"),
    ("amd-avic0", "nic.numa", "enp65s0f0", "warn", "on node 1 but 9 of its 9 IRQs"),
    ("virtio-1q-8cpu", "nic.numa", "eth0", "warn", "numa_node -1"),
    ("this-machine", "irq.balance", None, "ok", "not running"),
    ("sos-centos7-kvm", "irq.balance", None, "warn", "irqbalance running"),
    ("virtio-1q-8cpu", "irq.balance", None, "warn", "irqbalance running"),
    ("tuned-host", "napi.sysctls", None, "ok", "at or above"),
    ("this-machine", "napi.sysctls", None, "warn", "netdev_budget 300 < 50000"),
    ("tuned-host", "napi.softnet", None, "ok", "no drops or squeezes in 1.0 s (2,800,020 packets/s"),
    ("amd-avic0", "napi.softnet", None, "warn", "CPU 0: 251/s"),
    ("virtio-1q-8cpu", "napi.softnet", None, "fail", "backlog drops over 1.0 s (CPU 0: 741/s)"),
    ("sos-centos7-kvm", "napi.softnet", None, "skip", "one snapshot only"),
    ("tuned-host", "bridge.netfilter", None, "ok", "bridge-nf-call-iptables=0 for br0"),
    ("this-machine", "bridge.netfilter", None, "ok", "no Linux bridges"),
    ("sos-centos7-kvm", "bridge.netfilter", None, "warn", "frames on br_ens1f0 walk iptables"),
    ("tuned-host", "bridge.mtu", None, "ok", "br0 9000 (2 ports)"),
    ("sos-centos7-kvm", "bridge.mtu", None, "fail", "br_ens1f0: vnic1.1 1500 vs 9000"),
    ("tuned-host", "firewall.rules", None, "ok", "no rules"),
    ("amd-avic0", "firewall.rules", None, "ok", "no rules (iptables 0, ip6tables 0, nft 0)"),
    ("sos-centos7-kvm", "firewall.rules", None, "warn", "10 rules (iptables 8, ip6tables 0, ebtables 2)"),
    ("virtio-1q-8cpu", "firewall.rules", None, "warn", "14 rules (iptables 0, nft 14)"),
    ("this-machine", "firewall.rules", None, "skip", "no iptables"),
    ("lab-ovs-ok", "mtu.path", None, "ok", "MTU 9000 end to end over 3 namespace(s)"),
    ("this-machine", "mtu.path", None, "ok", "no veth here"),
    ("lab-ovs-trap", "mtu.path", None, "fail", "ol-dfix-server:oldfix3 6000 vs 9000"),
    ("lab-ovs-ok", "ovs.veth-csum", None, "ok", "every peer has tx checksumming off"),
    ("tuned-host", "ovs.veth-csum", None, "ok", "no ovs-vswitchd running"),
    ("lab-ovs-trap", "ovs.veth-csum", None, "fail", "tx checksumming on at oldfix0 (peer of oldfix1, ol-dfix-client)"),
]

_cache: dict[str, dict] = {}


def findings(fixture: str) -> dict:
    if fixture not in _cache:
        report = audit(open_root(FIXTURES / fixture))
        _cache[fixture] = {(f.id, f.target): f for f in report.findings}
    return _cache[fixture]


@pytest.mark.parametrize("fixture, check_id, target, status, text", EXPECTED,
                         ids=[f"{e[0]}:{e[1]}:{e[3]}" for e in EXPECTED])
def test_fixture_finding(fixture, check_id, target, status, text):
    f = findings(fixture)[(check_id, target)]
    assert (f.status, text in f.summary) == (status, True), f.summary
    if status in ("warn", "fail", "info"):
        assert f.why and f.fix, "a finding that asks for action names the reason and the fix"


def test_every_check_has_an_ok_and_a_non_ok_case():
    by_check: dict[str, set[str]] = {}
    for _, cid, _, status, _ in EXPECTED:
        by_check.setdefault(cid, set()).add("ok" if status == "ok" else "non-ok")
    for cid in ("platform.tier",):  # graded by --target-pps: covered in test_doctor_tiers.py
        by_check[cid] = {"ok", "non-ok"}
    missing = {s.id for s in all_checks() if by_check.get(s.id) != {"ok", "non-ok"}}
    assert not missing, f"checks without both an ok and a non-ok fixture case: {sorted(missing)}"


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_no_check_crashes_on_any_fixture(fixture):
    crashed = [f"{f.id}: {f.summary}" for f in findings(fixture).values() if f.summary.startswith("check crashed")]
    assert not crashed


def test_fixes_are_exact_commands_for_the_interface():
    amd = findings("amd-avic0")
    assert amd[("nic.rings", "enp65s0f0")].fix == "ethtool -G enp65s0f0 rx 256 tx 256"
    assert amd[("nic.flow-hash", "enp65s0f0")].fix == "ethtool -N enp65s0f0 rx-flow-hash udp4 sdfn"
    sos = findings("sos-centos7-kvm")
    assert sos[("nic.queues", "ens1f0")].fix == "ethtool -L ens1f0 combined 8"
    assert sos[("nic.nocache-copy", "ens1f0")].fix == "ethtool -K ens1f0 tx-nocache-copy off"
    assert sos[("bridge.mtu", None)].fix == "ip link set vnic1.1 mtu 9000"
    assert sos[("bridge.netfilter", None)].fix == "sysctl -w net.bridge.bridge-nf-call-iptables=0"
    assert findings("dpdk-missing")[("dpdk.runnable", None)].fix == "apt-get install dpdk-dev openvswitch-switch-dpdk"
    trap = findings("lab-ovs-trap")
    assert trap[("ovs.veth-csum", None)].fix == "ip netns exec ol-dfix-client ethtool -K oldfix0 tx off"
    assert trap[("mtu.path", None)].fix == "ip -n ol-dfix-server link set oldfix3 mtu 9000"
    virtio = findings("virtio-1q-8cpu")
    assert virtio[("nic.rps-xps", "eth0")].fix == "echo ff > /sys/class/net/eth0/queues/rx-0/rps_cpus"


def test_automatable_fixes_are_knobs_changes():
    sos = findings("sos-centos7-kvm")
    assert [(c.key, c.value, c.iface) for c in sos[("nic.offloads", "ens1f0")].changes] == \
        [("generic-receive-offload", "on", "ens1f0")]
    assert [(c.key, c.value) for c in sos[("napi.sysctls", None)].changes] == [
        ("net.core.netdev_max_backlog", 100000), ("net.core.netdev_budget", 50000), ("net.core.dev_weight", 6000)]
    virtio = findings("virtio-1q-8cpu")
    assert [(c.key, c.value, c.iface) for c in virtio[("nic.rps-xps", "eth0")].changes] == [("rps.0", "ff", "eth0")]
    trap = findings("lab-ovs-trap")
    assert [(c.key, c.value, c.iface, c.netns) for c in trap[("ovs.veth-csum", None)].changes] == \
        [("tx-checksumming", "off", "oldfix0", "ol-dfix-client")]
    # advice that is not a setting (BIOS, kernel upgrade, firewall flush) is never automated
    assert not sos[("kernel.version", None)].changes and not sos[("firewall.rules", None)].changes


def test_hardware_checks_say_nothing_about_veths():
    ids = {(cid, t) for cid, t in findings("lab-ovs-ok") if t}
    assert ids == {("nic.offloads", "oldfix1"), ("nic.offloads", "oldfix2"),
                   ("nic.nocache-copy", "oldfix1"), ("nic.nocache-copy", "oldfix2")}


def test_vhost_workers_as_threads_of_qemu_since_linux_6_4(tmp_path):
    """From 6.4 vhost workers are threads named vhost-<qemu pid> inside QEMU, not kthreads."""
    (tmp_path / "offlab-capture.json").write_text(json.dumps({"format": "offlab-capture/1", "host": {}}))
    files = {
        "commands/pgrep_-w_-l_vhost": "9012 vhost-9000\n9013 vhost-9000\n",
        "sys/devices/system/cpu/online": "0-7\n",
        "proc/9000/comm": "qemu-system-x86\n",
        "proc/9012/status": "Name:\tvhost-9000\nTgid:\t9000\nPid:\t9012\nPPid:\t1433\nKthread:\t0\n"
                            "Cpus_allowed_list:\t2-3\n",
        "proc/9013/status": "Name:\tvhost-9000\nTgid:\t9000\nPid:\t9013\nPPid:\t1433\nKthread:\t0\n"
                            "Cpus_allowed_list:\t0-7\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    f = next(f for f in audit(open_root(tmp_path), only={"kvm.vhost"}).findings)
    assert f.status == "warn" and "1 of 2 vhost workers (thread of the VM process)" in f.summary
    assert [(t["tid"], t["owner"], t["cpus"]) for t in f.evidence["threads"]] == \
        [(9012, "qemu-system-x86", "2-3"), (9013, "qemu-system-x86", "0-7")]
