"""Parsers of the text the kernel and tools print, on outputs checked by hand."""

from __future__ import annotations

from pathlib import Path

from offlab import netdev
from offlab.doctor import parse
from offlab.doctor.source import command_name

DOCTOR = Path(__file__).parent / "fixtures" / "doctor"

K_TEXT = """Features for eth0:
rx-checksumming: on [fixed]
tx-checksumming: on
\ttx-checksum-ipv4: off [fixed]
generic-receive-offload: off [requested on]
tx-nocache-copy: off
"""


def test_ethtool_k_text_keeps_fixed_and_requested():
    f = netdev.parse_features(K_TEXT)
    assert (f["rx-checksumming"].active, f["rx-checksumming"].fixed) == (True, True)
    assert (f["tx-checksum-ipv4"].active, f["tx-checksum-ipv4"].fixed) == (False, True)
    gro = f["generic-receive-offload"]
    assert (gro.active, gro.fixed, gro.requested) == (False, False, True)
    assert set(f) == {"rx-checksumming", "tx-checksumming", "tx-checksum-ipv4", "generic-receive-offload",
                      "tx-nocache-copy"}


def test_ethtool_rings_and_channels_sections():
    g = netdev.parse_limits("Ring parameters for x:\nPre-set maximums:\nRX:\t\t4096\nRX Mini:\tn/a\n"
                            "TX:\t\t4096\nCurrent hardware settings:\nRX:\t\t512\nRX Mini:\tn/a\nTX:\t\t256\n")
    assert g.fields == {"rx": netdev.Limit(512, 4096), "rx-mini": netdev.Limit(None, None),
                        "tx": netdev.Limit(256, 4096)}
    assert g["rx-jumbo"] == netdev.Limit(None, None)  # not printed


def test_ethtool_rings_and_channels_of_a_real_nic():
    """amd-avic0: a 63-queue NIC's `ethtool -g` and `-l`; this-machine: a virtio NIC's newer `-g` lines
    (TX Push: off is a word, not a number)."""
    rings = netdev.parse_limits((DOCTOR / "amd-avic0/commands/ethtool_-g_enp65s0f0").read_text())
    assert (rings["rx"].current, rings["rx"].maximum, rings["tx"].current, rings["tx"].maximum) == (128, 8192, 128, 8192)
    assert list(rings.fields) == ["rx", "rx-mini", "rx-jumbo", "tx"]
    channels = netdev.parse_limits((DOCTOR / "amd-avic0/commands/ethtool_-l_enp65s0f0").read_text())
    assert channels["combined"] == netdev.Limit(current=8, maximum=63)
    assert channels["rx"] == netdev.Limit(None, None)
    virtio = netdev.parse_limits((DOCTOR / "this-machine/commands/ethtool_-g_eth0").read_text())
    assert virtio["rx"] == netdev.Limit(256, 256) and virtio["tx-push"] == netdev.Limit(None, None)
    assert "rx-buf-len" in virtio.fields


def test_ethtool_coalesce_adaptive_line_and_values():
    c = netdev.parse_coalesce("Coalesce parameters for x:\nAdaptive RX: on  TX: n/a\nrx-usecs: 50\n"
                              "rx-frames: n/a\nCQE mode RX: n/a  TX: n/a\n")
    assert c.modes == {"adaptive-rx": "on", "adaptive-tx": "n/a", "cqe-mode-rx": "n/a", "cqe-mode-tx": "n/a"}
    assert c.values == {"rx-usecs": 50, "rx-frames": None}
    assert (c.text("adaptive-rx"), c.text("rx-usecs"), c.text("rx-frames"), c.text("tx-usecs")) == \
        ("on", "50", "n/a", None)


def test_ethtool_coalesce_of_a_real_nic():
    c = netdev.parse_coalesce((DOCTOR / "amd-avic0/commands/ethtool_-c_enp65s0f0").read_text())
    assert (c.modes["adaptive-rx"], c.modes["adaptive-tx"]) == ("off", "on")
    assert (c.values["rx-usecs"], c.values["rx-frames"], c.values["tx-usecs"], c.values["tx-frames"]) == \
        (8, 128, 8, 128)
    assert c.values["rx-usecs-irq"] is None and c.values["rx-frame-low"] is None  # ethtool's own spelling
    assert "coalesce-parameters-for-enp65s0f0" not in c.values


def test_flow_hash_letters():
    full = ("UDP over IPV4 flows use these fields for computing Hash flow key:\nIP SA\nIP DA\n"
            "L4 bytes 0 & 1 [TCP/UDP src port]\nL4 bytes 2 & 3 [TCP/UDP dst port]\n\n")
    assert netdev.parse_flow_hash(full) == netdev.FlowHash("sdfn") and netdev.parse_flow_hash(full).ports
    assert netdev.parse_flow_hash("UDP over IPV4 flows use these fields for computing Hash flow key:\nNone\n") == \
        netdev.FlowHash("")
    assert netdev.parse_flow_hash("Cannot get RX network flow hashing options") is None


def test_flow_hash_of_real_nics():
    amd = netdev.parse_flow_hash((DOCTOR / "amd-avic0/commands/ethtool_-n_enp65s0f0_rx-flow-hash_udp4").read_text())
    assert amd.letters == "sd" and not amd.ports
    virtio = netdev.parse_flow_hash((DOCTOR / "this-machine/commands/ethtool_-n_eth0_rx-flow-hash_udp4").read_text())
    assert virtio.letters == "" and not virtio.ports


def test_cpu_sets_and_masks():
    assert parse.cpulist("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert parse.cpumask("00000000,0000000f") == {0, 1, 2, 3}
    assert parse.cpumask("00000001,00000000") == {32}
    assert parse.format_cpus({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert parse.mask_of({0, 1, 2, 3, 8}) == "10f"


def test_softnet_rows_old_and_new_layouts():
    new = "00fa8791 00000000 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 " \
          "00000000 00000001 00000000 00000000\n"
    row = netdev.parse_softnet(new)[0]
    assert (row.cpu, row.processed, row.dropped, row.time_squeeze) == (1, 0xFA8791, 0, 2)
    old = "0000000a 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000004\n" * 2
    rows = netdev.parse_softnet(old)
    assert [(r.cpu, r.received_rps, r.flow_limit) for r in rows] == [(0, 3, 4), (1, 3, 4)]


def test_rule_counts():
    assert parse.count_save_rules("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A FORWARD -j DROP\nCOMMIT\n") == 2
    listing = ("Chain INPUT (policy ACCEPT 0 packets, 0 bytes)\n    pkts      bytes target     prot opt in out "
               "source destination\n       1        2 ACCEPT     all  --  *  *  0.0.0.0/0 0.0.0.0/0\n\n"
               "Chain FORWARD (policy ACCEPT)\n    pkts      bytes target\n")
    assert parse.count_list_rules(listing) == 1
    nft = ("table inet f {\n\tchain in {\n\t\ttype filter hook input priority 0; policy accept;\n"
           "\t\tct state established accept\n\t\ttcp dport 22 accept\n\t}\n\tset s {\n\t\ttype ipv4_addr\n\t}\n}\n")
    assert parse.count_nft_rules(nft) == 2


def test_ip_d_address_text_gives_the_json_fields():
    text = """2: ens1f0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq master br0 state UP group default qlen 1000
    link/ether 3c:fd:fe:a5:10:20 brd ff:ff:ff:ff:ff:ff promiscuity 1
    bridge_slave state forwarding priority 32
3: br0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP group default qlen 1000
    link/ether 3c:fd:fe:a5:10:20 brd ff:ff:ff:ff:ff:ff promiscuity 0
    bridge forward_delay 0 hello_time 200
    inet 172.20.10.7/16 brd 172.20.255.255 scope global br0
4: olx1@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc noqueue state UP group default qlen 1000
    link/ether f2:f1:8b:a9:cd:75 brd ff:ff:ff:ff:ff:ff link-netnsid 0 promiscuity 1
    veth
"""
    links = {l.ifname: l for l in netdev.parse_links(text)}
    assert links["ens1f0"].mtu == 9000 and links["ens1f0"].master == "br0"
    assert (links["ens1f0"].kind, links["ens1f0"].slave_kind) == (None, "bridge")
    assert links["br0"].kind == "bridge" and links["br0"].mtu == 1500
    assert (links["olx1"].link_index, links["olx1"].link_netnsid) == (2, 0)
    assert links["olx1"].kind == "veth"


def test_ovs_dpif_show():
    text = ("netdev@ovs-netdev: hit:4 missed:12\n  br0:\n    br0 65534/1: (tap)\n    olx1 1/2: (system)\n"
            "    olx2 2/3: (system)\nsystem@ovs-system: hit:0 missed:0\n  br1:\n    br1 65534/0: (internal)\n")
    assert parse.dpif_show(text) == {"netdev@ovs-netdev": {"br0": ["olx1", "olx2"]}, "system@ovs-system": {"br1": []}}


def test_command_names_match_sosreport():
    assert command_name(["ethtool", "-k", "eth0"]) == "ethtool_-k_eth0"
    assert command_name(["ethtool", "-n", "eth0", "rx-flow-hash", "udp4"]) == "ethtool_-n_eth0_rx-flow-hash_udp4"
    assert command_name(["iptables", "-vnxL"]) == "iptables_-vnxL"
    assert command_name(["nft", "list", "ruleset"]) == "nft_list_ruleset"
    assert command_name(["ovs-appctl", "dpif/show"]) == "ovs-appctl_dpif.show"
    assert command_name(["pgrep", "-w", "-l", "^vhost-"]) == "pgrep_-w_-l_vhost"
