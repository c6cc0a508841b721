"""netdev's `ip -j` readers on a real veth lab: every part reads links, addresses and routes through them."""

from __future__ import annotations

from ipaddress import ip_interface

import pytest

from offlab import netdev
from offlab.addresses import CLIENT4, SERVER4, address, ip4
from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts import LOCAL
from tests.conftest import requires_root


def test_ip_argv_keeps_the_order_a_sosreport_names_its_files_by():
    assert netdev.ip_argv("link", "show", details=True, netns="ol-a-client") == \
        ["ip", "-n", "ol-a-client", "-d", "-j", "link", "show"]
    assert netdev.ip_argv("-4", "route", "show", "default") == ["ip", "-j", "-4", "route", "show", "default"]
    with pytest.raises(BadInput, match="invalid network namespace name"):
        netdev.ip_argv("link", "show", netns="a;b")


@requires_root
def test_links_addresses_routes_and_namespaces_read_through_netdev(veth_lab):
    client = veth_lab.host("client")
    ns = veth_lab.hosts["client"].netns
    veth = veth_lab.hosts["client"].interfaces[0].name
    names = {l.ifname for l in netdev.link_rows(client)}
    assert names == {"lo", veth}
    inside = netdev.find_link(client, veth, details=True)
    from_root = netdev.find_link(LOCAL, veth, netns=ns)
    assert inside is not None and from_root is not None and inside.ifindex == from_root.ifindex
    assert inside.kind == "veth" and from_root.kind is None  # -d gave the details
    assert netdev.find_link(client, "nope0") is None
    assert netdev.find_link(LOCAL, "lo", netns="ol-nonexistent-x") is None
    [row] = netdev.addr_rows(client, veth)
    assert CLIENT4 in [a.cidr for a in row.addrs]
    assert netdev.find_addrs(client, veth) == row.addrs and netdev.find_addrs(client, "nope0") is None
    assert netdev.route_get(client, address(SERVER4)).dev == veth
    assert [r.dst for r in netdev.routes(client, 4, "dev", veth)] == [str(ip_interface(CLIENT4).network)]
    assert netdev.routes(client, 4, "default") == []
    with pytest.raises(EnvironmentProblem, match=f"no route to {ip4(9, 9)} from "):
        netdev.route_get(client, ip4(9, 9))
    assert ns in netdev.netns_names(LOCAL)
