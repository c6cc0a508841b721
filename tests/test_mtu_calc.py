"""`offlab mtu calc`: the seeds' numbers come out of small pure functions."""

from __future__ import annotations

import json

import pytest

from offlab.errors import BadInput
from offlab.mtu import calc
from tests.helpers import one_line_error, run


@pytest.mark.parametrize("mtu, payload", [(1500, 1472), (9000, 8972)])
def test_largest_udp_payload_without_fragments_seed_000(mtu, payload):
    assert calc.udp_payload_max(mtu) == payload


def test_largest_udp_datagram_seed_000():
    assert calc.udp_datagram_max() == 65507
    assert calc.udp_datagram_max(ipv6=True) == 65527


def test_jumbo_frame_numbers_seed_004():
    # "帧大小为9018B，IP报文大小为9000B，数据大小为8960B"
    assert calc.frame_size(9000) == 9018
    assert calc.tcp_mss(9000) == 8960
    assert calc.frame_size(9000, fcs=False) == 9014  # what tcpdump shows
    assert calc.frame_size(6000) == 6018  # the run-time change to 6000
    assert calc.tcp_mss(6000) == 5960


def test_tcp_payload_with_timestamps_and_ipv6():
    assert calc.tcp_payload_with_timestamps(1500) == 1448
    assert calc.tcp_mss(1500, ipv6=True) == 1440
    assert calc.udp_payload_max(1500, ipv6=True) == 1452


@pytest.mark.parametrize("encap, v6, inner", [("vxlan", False, 1450), ("vxlan", True, 1430), ("gre", False, 1476),
                                              ("gre", True, 1456), ("vlan", False, 1500), ("none", False, 1500)])
def test_inner_mtu_through_tunnels(encap, v6, inner):
    assert calc.inner_mtu(1500, encap, v6) == inner


def test_vlan_grows_the_frame_not_the_mtu():
    assert calc.frame_size(1500, vlan_tags=1) == 1522
    assert calc.frame_size(1500, fcs=False, vlan_tags=1) == 1518


def test_65507_at_1500_is_45_fragments_of_1480():
    f = calc.fragments(65507, 1500)
    # 65507 + 8 = 65515 bytes of IP payload; (1500 - 20) = 1480, a multiple of 8
    assert (f.count, f.data_per_fragment, f.last_data) == (45, 1480, 65515 - 44 * 1480)
    assert f.packet_sizes == (1500, 395 + 20)


def test_fragment_payload_is_rounded_down_to_8_bytes():
    f = calc.fragments(65507, 9000)
    assert f.data_per_fragment == 8976 and f.count == 8  # 8980 is not a multiple of 8
    assert calc.fragments(1472, 1500).count == 1
    assert calc.fragments(1473, 1500).count == 2


def test_ipv6_fragments_carry_an_8_byte_header():
    f = calc.fragments(65527, 1500, ipv6=True)
    assert f.data_per_fragment == 1448  # 1500 - 40 - 8
    assert f.count == 46 and f.packet_sizes[0] == 1496


def test_table_rows_and_bad_input():
    values = {r.key: r.value for r in calc.table(9000, encap="vxlan")}
    assert values["udp_payload_max"] == 8972 and values["frame_wire"] == 9018
    assert values["frame_captured"] == 9014 and values["tcp_mss"] == 8960
    assert values["inner_mtu_ipv4_underlay"] == 8950 and values["fragments_of_max"] == 8
    with pytest.raises(BadInput, match="below IPv6's minimum 1280"):
        calc.table(1200, ipv6=True)
    with pytest.raises(BadInput, match="--encap 'ipip'"):
        calc.table(1500, encap="ipip")


def test_calc_cli_json_and_errors():
    res = run("mtu", "calc", "--mtu", "1500", "--json")
    assert res.returncode == 0, res.stderr
    values = json.loads(res.stdout)["values"]
    assert (values["udp_payload_max"], values["udp_datagram_max"], values["fragments_of_max"]) == (1472, 65507, 45)
    res = run("mtu", "calc", "--mtu", "9000")
    assert "9018" in res.stdout and "8960" in res.stdout and "9014" in res.stdout
    one_line_error(run("mtu", "calc", "--mtu", "67"), 2, "out of range")
