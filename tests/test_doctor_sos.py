"""`offlab doctor --root` on a sosreport as sos 4 writes it: each fact from the right file, no data is no pass.

The fixture `sos-rhel9-real` (see tests/fixtures/doctor/README.md) has no /proc/cpuinfo,
no /sys/devices/system/cpu, no /sys/class/net, no /proc/version and no top-level `uname`:
the facts are in sos's command outputs, named as sos names them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from offlab import netdev
from offlab.doctor import all_checks, audit, open_root, parse
from offlab.doctor.schema import validate
from offlab.doctor.source import command_name
from tests.helpers import run as offlab_in_process


FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
RHEL9 = FIXTURES / "sos-rhel9-real"


def findings(root: Path, **kw) -> dict:
    return {(f.id, f.target): f for f in audit(open_root(root), **kw).findings}


@pytest.fixture(scope="module")
def rhel9() -> dict:
    return findings(RHEL9)


def copy_of(tmp_path: Path) -> Path:
    """A writable copy of the fixture, symlinks kept as symlinks (as tar extracts them)."""
    root = tmp_path / "sosreport-kvm-rhel9-01-2024-03-17-abcdefg"
    shutil.copytree(RHEL9, root, symlinks=True)
    return root


# ---- each fact from the file sos writes it to --------------------------------------------

def test_kernel_release_comes_from_uname_a_when_proc_version_is_absent(tmp_path):
    root = copy_of(tmp_path)
    assert not (root / "proc" / "version").exists() and not (root / "uname").exists()
    (root / "sos_commands" / "kernel" / "sysctl_-a").unlink()  # its kernel.osrelease must not be needed
    f = findings(root)[("kernel.version", None)]
    assert (f.status, f.evidence["release"]) == ("ok", "5.14.0-427.13.1.el9_4.x86_64")
    assert f.evidence["read_from"] == ["sos_commands/kernel/uname_-a"]


def test_host_name_comes_from_sos_commands_when_the_top_symlink_is_absent(tmp_path):
    root = copy_of(tmp_path)
    (root / "hostname").unlink()
    (root / "sos_commands/kernel/sysctl_-a").unlink()  # nor its kernel.hostname
    assert audit(open_root(root)).host["name"] == "kvm-rhel9-01"  # sos_commands/host/hostname


def test_a_flow_hash_output_is_read_under_its_sos_name_when_someone_collected_it(tmp_path):
    """sos itself never runs `ethtool -n IF rx-flow-hash udp4`; a tree that has it (sos -c, a later sos) is read."""
    root = copy_of(tmp_path)
    (root / "sos_commands/networking/ethtool_-n_ens1f0_rx-flow-hash_udp4").write_text(
        "UDP over IPV4 flows use these fields for computing Hash flow key:\nIP SA\nIP DA\n\n")
    f = findings(root)[("nic.flow-hash", "ens1f0")]
    assert (f.status, f.evidence["udp4"], f.evidence["rx_queues"]) == ("warn", "sd", 8)
    assert "sos_commands/networking/ethtool_-n_ens1f0_rx-flow-hash_udp4" in f.evidence["read_from"]


def test_interfaces_come_from_ip_d_address_when_sys_class_net_is_missing():
    assert not (RHEL9 / "sys" / "class" / "net").exists()
    report = audit(open_root(RHEL9))
    # NICs: the links iproute2 shows a parent PCI device for; br0, vnet0/1 and lo are not audited
    assert report.host["interfaces"] == ["ens1f0", "ens1f1"]
    bridge = next(f for f in report.findings if f.id == "bridge.mtu")
    assert bridge.evidence["bridges"] == {"br0": {"mtu": 9000, "ports": {"ens1f0": 9000, "vnet0": 9000,
                                                                          "vnet1": 9000}}}
    assert bridge.evidence["read_from"] == ["sos_commands/networking/ip_-d_address"]


def test_features_channels_and_rings_come_from_the_ethtool_files(rhel9):
    offloads = rhel9[("nic.offloads", "ens1f0")]
    assert offloads.evidence["off_changeable"] == ["generic-segmentation-offload"]
    assert "sos_commands/networking/ethtool_-k_ens1f0" in offloads.evidence["read_from"]
    queues = rhel9[("nic.queues", "ens1f0")]
    assert (queues.evidence["queues"], queues.evidence["max"], queues.evidence["driver"]) == (8, 64, "i40e")
    assert {"sos_commands/networking/ethtool_-l_ens1f0", "sos_commands/networking/ethtool_-i_ens1f0"} <= \
        set(queues.evidence["read_from"])
    rings = rhel9[("nic.rings", "ens1f0")]
    assert rings.evidence == {"rx": 512, "rx_max": 4096, "tx": 512, "tx_max": 4096,
                              "read_from": ["sos_commands/networking/ip_-d_address",
                                            "sos_commands/networking/ethtool_-g_ens1f0"]}
    coalesce = rhel9[("nic.coalesce", "ens1f0")]
    assert coalesce.evidence["adaptive-rx"] == "on"
    assert "sos_commands/networking/ethtool_-c_ens1f0" in coalesce.evidence["read_from"]


def test_sysctls_come_from_sysctl_a(rhel9):
    napi = rhel9[("napi.sysctls", None)]
    assert napi.evidence["values"] == {"net.core.netdev_max_backlog": 1000, "net.core.netdev_budget": 300,
                                       "net.core.netdev_budget_usecs": 2000, "net.core.dev_weight": 64}
    assert napi.evidence["read_from"] == ["sos_commands/kernel/sysctl_-a"]
    brnf = rhel9[("bridge.netfilter", None)]
    assert brnf.evidence["bridge-nf-call-iptables"] == "1"
    assert "sos_commands/kernel/sysctl_-a" in brnf.evidence["read_from"]


def test_cpu_facts_come_from_lscpu_and_cpupower(rhel9):
    report = audit(open_root(RHEL9))
    assert report.host["cpus"] == 64  # lscpu's On-line CPU(s) list 0-63
    smt = rhel9[("cpu.smt", None)]
    assert (smt.status, smt.evidence["threads_per_core"]) == ("warn", 2)
    assert smt.evidence["read_from"] == ["sos_commands/processor/lscpu"]
    numa = rhel9[("cpu.numa-nodes", None)]
    assert (numa.evidence["vendor"], numa.evidence["sockets"], numa.evidence["numa_nodes"]) == ("GenuineIntel", 2, 2)
    vulns = rhel9[("kernel.mitigations", None)].evidence["vulnerabilities"]
    assert vulns["spectre_v2"].startswith("Mitigation; Enhanced / Automatic IBRS")
    assert vulns["meltdown"] == "Not affected"
    gov = rhel9[("cpu.governor", None)]
    assert gov.evidence["read_from"] == ["sos_commands/processor/cpupower_frequency-info"]
    idle = rhel9[("cpu.idle", None)]
    assert [(s["name"], s["latency_us"]) for s in idle.evidence["states"]] == [
        ("POLL", 0), ("C1", 1), ("C1E", 4), ("C6", 170)]


def test_processes_come_from_ps_auxwwwm_with_its_thread_rows(rhel9):
    vhost = rhel9[("kvm.vhost", None)]
    assert [(t["tid"], t["model"], t["cpus"]) for t in vhost.evidence["threads"]] == [
        (4730, "kthread", "0-63"), (4731, "kthread", "0-63")]
    assert vhost.evidence["read_from"][:3] == ["sos_commands/process/ps_auxwwwm", "proc/4730/status",
                                               "proc/4731/status"]
    assert rhel9[("irq.balance", None)].evidence["pids"] == [1187]


# ---- what the fixture must show ------------------------------------------------------------

EXPECTED = [
    ("cpu.smt", None, "warn", "SMT on: 2 threads per core (lscpu)"),
    ("cpu.governor", None, "warn", "powersave on CPU 0 (cpupower)"),
    ("cpu.idle", None, "warn", "intel_idle: deep idle states enabled: C6 170 µs"),
    ("cpu.numa-nodes", None, "ok", "GenuineIntel"),
    ("kernel.version", None, "ok", "5.14.0-427.13.1.el9_4.x86_64 has every feature"),
    ("kernel.mitigations", None, "warn", "5 mitigations active"),
    ("kernel.hugepages", None, "info", "no hugepages reserved"),
    ("kvm.avic", None, "ok", "kvm_amd not loaded (GenuineIntel"),
    ("kvm.ept", None, "ok", "kvm_intel ept=Y"),
    ("kvm.vhost", None, "warn", "2 of 2 vhost workers (kthread) may run on any CPU (0-63)"),
    ("nic.rings", "ens1f0", "ok", "rx 512/4096, tx 512/4096"),
    ("nic.flow-hash", "ens1f0", "skip", "no data: ethtool -n ens1f0 rx-flow-hash udp4"),
    ("nic.coalesce", "ens1f0", "warn", "adaptive RX coalescing on"),
    ("nic.offloads", "ens1f0", "warn", "off but changeable: generic-segmentation-offload"),
    ("nic.offloads", "ens1f1", "ok", "every changeable offload of the 6 checked is on"),
    ("nic.nocache-copy", "ens1f0", "ok", "tx-nocache-copy off"),
    ("nic.queues", "ens1f0", "warn", "8 of 64 queues in use on 64 CPUs"),
    ("nic.queues", "ens1f1", "ok", "64 queue(s) for 64 CPU(s)"),
    ("nic.rps-xps", "ens1f0", "skip", "no data: /sys/class/net/ens1f0/queues"),
    ("nic.numa", "ens1f0", "skip", "no data: the NUMA node of ens1f0"),
    ("irq.balance", None, "warn", "irqbalance running"),
    ("napi.sysctls", None, "warn", "netdev_budget 300 < 50000"),
    ("napi.softnet", None, "skip", "one snapshot only (since boot: 0 dropped, 124 squeezed)"),
    ("bridge.netfilter", None, "warn", "bridge-nf-call-iptables=1: frames on br0 walk iptables"),
    ("bridge.mtu", None, "ok", "br0 9000 (3 ports)"),
    ("firewall.rules", None, "warn", "29 rules (nft 29), 2184 conntrack entries"),
    ("mtu.path", None, "ok", "no veth here"),
    ("ovs.veth-csum", None, "ok", "no ovs-vswitchd running (ps)"),
]


@pytest.mark.parametrize("check_id, target, status, text", EXPECTED, ids=[f"{e[0]}:{e[1]}" for e in EXPECTED])
def test_rhel9_sosreport_finding(rhel9, check_id, target, status, text):
    f = rhel9[(check_id, target)]
    assert (f.status, text in f.summary) == (status, True), f.summary


def test_every_finding_names_the_files_it_read_relative_to_the_root(rhel9):
    for (cid, target), f in rhel9.items():
        files = f.evidence.get("read_from")
        assert files, f"{cid} {target}: no read_from"
        for rel in files:
            assert not rel.startswith("/") and (RHEL9 / rel).is_file(), (cid, rel)


def test_a_failed_command_keeps_its_exit_code_from_sos_manifest(tmp_path):
    src = open_root(RHEL9)
    failed = src.command("ethtool_-g_vnet0", ["ethtool", "-g", "vnet0"])  # ethtool's netlink get fails with 1
    assert (failed.rc, failed.stdout) == (1, "netlink error: Operation not supported\n")
    assert src.command("ethtool_-g_ens1f0", ["ethtool", "-g", "ens1f0"]).rc == 0
    root = copy_of(tmp_path)
    (root / "sos_commands/networking/ethtool_-k_ens1f0").write_text("netlink error: No such device\n")
    manifest = json.loads((root / "sos_reports/manifest.json").read_text())
    for c in manifest["components"]["report"]["plugins"]["networking"]["commands"]:
        if c["exec"] == "ethtool -k ens1f0":
            c["return_code"] = 1
    (root / "sos_reports/manifest.json").write_text(json.dumps(manifest))
    f = findings(root)[("nic.offloads", "ens1f0")]
    assert (f.status, f.summary) == ("skip", "ethtool -k ens1f0 failed: netlink error: No such device")


def test_long_command_names_are_cut_to_255_like_sos():
    argv = ["ovs-ofctl", "dump-flows", "br-" + "x" * 300]
    assert len(command_name(argv)) == 255 and command_name(argv).startswith("ovs-ofctl_dump-flows_br-xxx")


# ---- missing data is "no data", never a pass --------------------------------------------------

def test_kvm_modules_without_sys_module_are_no_data_not_ok(tmp_path):
    root = copy_of(tmp_path)
    shutil.rmtree(root / "sys" / "module")
    ept = findings(root)[("kvm.ept", None)]
    assert (ept.status, ept.summary) == (
        "skip", "no data: kvm_intel is loaded (lsmod) but /sys/module/kvm_intel/parameters is not in this source")
    assert ept.evidence["read_from"] == ["sos_commands/kernel/lsmod"]
    (root / "lsmod").unlink()
    (root / "sos_commands/kernel/lsmod").unlink()
    assert findings(root)[("kvm.avic", None)].summary.startswith("no data: /sys/module nor lsmod")


def test_almost_empty_sosreport_gives_no_data_skips_not_passes(tmp_path):
    (tmp_path / "sos_commands" / "host").mkdir(parents=True)
    (tmp_path / "sos_commands" / "host" / "hostname").write_text("bare-host\n")
    (tmp_path / "sos_reports").mkdir()
    (tmp_path / "sos_reports" / "manifest.json").write_text('{"version": "4.7.2"}')
    res = offlab_in_process("doctor", "--root", str(tmp_path), "--json", "--fail-on", "warn")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert validate(doc) == []
    assert doc["host"]["name"] == "bare-host" and doc["host"]["interfaces"] == []
    # no NIC: no per-IF check; dpdk.runnable is about the machine offlab runs on, never a sosreport's
    host_wide = [s.id for s in all_checks() if not s.per_iface and s.id not in ("platform.tier", "dpdk.runnable")]
    assert sorted(c["id"] for c in doc["checks"]) == sorted(host_wide)
    assert doc["summary"]["skip"] == doc["summary"]["total"]
    assert [c["id"] for c in doc["checks"] if not c["summary"].startswith("no data: ")] == []


def _damage(root: Path) -> None:
    """Outputs as they come back from the field: cut short, overwritten with binary junk."""
    net = root / "sos_commands" / "networking"
    (net / "ethtool_-k_ens1f0").write_text("Features for ens1f0:\nrx-checksumming: on\ntx-checks")
    (net / "ethtool_-g_ens1f0").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00\x00Ring parameters\x00\x9c")
    (net / "ethtool_-l_ens1f0").write_text("Channel parameters for ens1f0:\nPre-set maximums:\nRX:\t\tn/a\nTX")
    (net / "ethtool_-c_ens1f0").write_bytes(bytes(range(256)) * 4)
    (root / "sos_commands/processor/lscpu").write_bytes(b"\x00\x01garbage: \xff\xfe\nOn-line CPU(s) list: 0-\x00\n")
    (root / "sos_commands/processor/cpupower_idle-info").write_bytes(b"\xff" * 64)
    (root / "sos_commands/kernel/sysctl_-a").write_bytes(b"net.core.netdev_budget = \xff\xfe\nkernel.osrelease\n")
    (root / "sos_commands/kernel/uname_-a").write_text("Linux")
    (root / "sos_commands/process/ps_auxwwwm").write_text("USER PID\nroot - - -\n")
    (root / "proc/net/softnet_stat").write_bytes(b"zzzz 0001\n\x00\x00")
    (root / "sos_reports/manifest.json").write_text("{\"components\": [")


def test_malformed_files_give_no_traceback_via_the_cli(tmp_path):
    root = copy_of(tmp_path)
    _damage(root)
    res = offlab_in_process("doctor", "--root", str(root), "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    assert validate(doc) == []
    by = {(c["id"], c["target"]): c for c in doc["checks"]}
    assert not [k for k, c in by.items() if c["summary"].startswith("check crashed")]
    assert by[("nic.rings", "ens1f0")]["summary"].startswith("no data: ethtool -g ens1f0 output has no current")
    assert by[("nic.coalesce", "ens1f0")]["summary"].startswith("no data: ethtool -c ens1f0")
    assert by[("kernel.version", None)]["status"] == "skip"
    assert by[("napi.softnet", None)]["summary"] == "no data: /proc/net/softnet_stat holds no hex counter rows"
    # a cut `ethtool -k` is judged on what it shows, and says what it did not
    assert "not reported" in by[("nic.offloads", "ens1f0")]["summary"]
    text = offlab_in_process("doctor", "--root", str(root))
    assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr


def test_sosreport_without_any_output_is_bad_input_via_the_cli(tmp_path):
    (tmp_path / "sos_commands" / "networking").mkdir(parents=True)
    res = offlab_in_process("doctor", "--root", str(tmp_path))
    assert res.returncode == 2 and "malformed sosreport" in res.stderr and "Traceback" not in res.stderr


def test_rhel9_sosreport_via_the_cli_fails_on_warn():
    res = offlab_in_process("doctor", "--root", str(RHEL9), "--fail-on", "warn", "--verbose")
    assert res.returncode == 1, res.stderr
    assert "kvm-rhel9-01 (kernel 5.14.0-427.13.1.el9_4.x86_64, sosreport" in res.stdout
    assert "read: sos_commands/kernel/uname_-a" in res.stdout


# ---- parsers for sos's command outputs --------------------------------------------------------

LSCPU_237_TERMINAL = """Architecture:            x86_64
CPU(s):                  8
  On-line CPU(s) list:   0-7
Vendor ID:               AuthenticAMD
  Model name:            AMD EPYC 7313 16-Core Processor
    Thread(s) per core:  2
    Socket(s):           1
NUMA:
  NUMA node(s):          1
  NUMA node0 CPU(s):     0-7
Vulnerabilities:
  Spectre v2:            Mitigation; Retpolines, IBPB conditional, IBRS_FW, STIBP always-on
  Meltdown:              Not affected
"""


def test_lscpu_reads_the_terminal_layout_of_util_linux_2_37_too():
    """Piped (sos) lscpu is flat, as in the fixture; a terminal's copy-paste is indented by section."""
    fields = parse.lscpu(LSCPU_237_TERMINAL)
    assert (fields["On-line CPU(s) list"], fields["Vendor ID"], fields["Thread(s) per core"],
            fields["NUMA node0 CPU(s)"]) == ("0-7", "AuthenticAMD", "2", "0-7")
    assert parse.lscpu_vulnerabilities(fields) == {
        "spectre_v2": "Mitigation; Retpolines, IBPB conditional, IBRS_FW, STIBP always-on", "meltdown": "Not affected"}


def test_ps_auxwwwm_thread_rows_are_skipped():
    text = ("USER PID %CPU %MEM VSZ RSS TTY STAT START TIME COMMAND\n"
            "root 1187 0.0 0.0 81532 3948 ? - Mar11 1:12 /usr/sbin/irqbalance --foreground\n"
            "root - 0.0 - - - - Ssl Mar11 1:12 -\n")
    assert parse.ps_processes(text) == [(1187, "/usr/sbin/irqbalance --foreground")]


def test_ip_d_address_names_the_parent_device():
    links = netdev.parse_links((RHEL9 / "sos_commands/networking/ip_-d_address").read_text())
    by = {l.ifname: l for l in links}
    assert (by["ens1f0"].parentbus, by["ens1f0"].parentdev, by["ens1f0"].master) == ("pci", "0000:3b:00.0", "br0")
    assert by["vnet0"].parentbus is None and by["vnet0"].kind == "tun"


def test_nft_a_handles_do_not_hide_chains():
    text = "table inet f { # handle 1\n\tchain input { # handle 2\n\t\ttcp dport 22 accept # handle 5\n\t}\n}\n"
    assert parse.count_nft_rules(text) == 0  # what `nft -a` output gave before
    assert parse.count_nft_rules(parse.strip_nft_handles(text)) == 1


def test_cpupower_idle_info_marks_disabled_states():
    text = ("CPUidle driver: intel_idle\nCPUidle governor: menu\nanalyzing CPU 0:\n\nNumber of idle states: 3\n"
            "Available idle states: POLL C1 C6\nPOLL:\nFlags/Description: CPUIDLE CORE POLL IDLE\nLatency: 0\n"
            "C1:\nFlags/Description: MWAIT 0x00\nLatency: 2\nC6 (DISABLED) :\nFlags/Description: MWAIT 0x20\n"
            "Latency: 170\nResidency: 600\n")
    info = parse.cpupower_idle(text)
    assert (info["driver"], info["governor"]) == ("intel_idle", "menu")
    assert info["states"] == [{"name": "POLL", "latency_us": 0, "disabled": False},
                              {"name": "C1", "latency_us": 2, "disabled": False},
                              {"name": "C6", "latency_us": 170, "disabled": True}]


def test_vhost_threads_unnamed_in_ps_are_no_data_not_no_vms(tmp_path):
    """Since Linux 6.4 vhost workers are QEMU threads: a ps without [vhost-PID] rows does not mean no VM."""
    root = copy_of(tmp_path)
    ps = root / "sos_commands/process/ps_auxwwwm"
    ps.write_text("".join(l for l in ps.read_text().splitlines(keepends=True) if "[vhost-" not in l))
    f = findings(root)[("kvm.vhost", None)]
    assert (f.status, f.summary.startswith("no data: QEMU (pid 4711) uses vhost but ps lists no")) == ("skip", True)


def test_a_sosreport_says_when_its_facts_were_taken(tmp_path):
    assert audit(open_root(RHEL9)).host["collected"] == "Sun Mar 17 10:02:14 EDT 2024"  # sos_commands/date/date
    root = copy_of(tmp_path)
    (root / "sos_commands/date/date").unlink()
    assert audit(open_root(root)).host["collected"] == "Sun 2024-03-17 10:02:13 EDT"  # `date` → timedatectl


def test_iptables_nft_rules_are_not_counted_twice(tmp_path):
    """On RHEL 9 iptables is iptables-nft: sos lists its rules (iptables -vnxL) and nft shows the same table."""
    root = copy_of(tmp_path)
    fw = root / "sos_commands/firewall_tables"
    (fw / "iptables_-vnxL").write_text(
        "Chain INPUT (policy ACCEPT 0 packets, 0 bytes)\n"
        "    pkts      bytes target     prot opt in     out     source               destination\n"
        "     812    53312 ACCEPT     udp  --  virbr0 *       0.0.0.0/0            0.0.0.0/0            udp dpt:53\n"
        "       0        0 ACCEPT     tcp  --  virbr0 *       0.0.0.0/0            0.0.0.0/0            tcp dpt:53\n"
        "\nChain FORWARD (policy ACCEPT 0 packets, 0 bytes)\n"
        "    pkts      bytes target     prot opt in     out     source               destination\n"
        "       0        0 REJECT     all  --  *      virbr0  0.0.0.0/0            0.0.0.0/0            "
        "reject-with icmp-port-unreachable\n")
    nft = fw / "nft_-a_list_ruleset"
    nft.write_text(nft.read_text() + (
        "table ip filter { # handle 2\n\tchain INPUT { # handle 1\n"
        "\t\ttype filter hook input priority filter; policy accept;\n"
        '\t\tiifname "virbr0" meta l4proto udp udp dport 53 counter packets 812 bytes 53312 accept # handle 4\n'
        '\t\tiifname "virbr0" meta l4proto tcp tcp dport 53 counter packets 0 bytes 0 accept # handle 5\n\t}\n'
        "\tchain FORWARD { # handle 2\n\t\ttype filter hook forward priority filter; policy accept;\n"
        '\t\toifname "virbr0" counter packets 0 bytes 0 reject # handle 6\n\t}\n}\n'))
    f = findings(root)[("firewall.rules", None)]
    assert f.evidence["rules"] == {"iptables": 3, "nft": 32} and f.evidence["counted_in_nft"] == ["iptables"]
    assert f.summary.startswith("32 rules (iptables 3 (in nft), nft 32)"), f.summary
