"""One parser per tool: `ip -j`, `tc -j qdisc` and ethtool's text are read in offlab/netdev/ only.

The parsers are tested on outputs captured on this machine (tests/fixtures/netdev/, iproute2 6.1,
Linux 6.18; the guests run the same iproute2, not busybox's `ip`), and the tree is checked for a
module that parses those tools' output itself or reads their raw keys.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from offlab import netdev

FIXTURES = Path(__file__).parent / "fixtures" / "netdev"
PACKAGE = Path(__file__).resolve().parent.parent / "offlab"
HOME = PACKAGE / "netdev"


# ---- the parsers on captured outputs ----------------------------------------------------------

def test_ip_links_with_details_and_addresses_become_records():
    links = {l.ifname: l for l in netdev.parse_links((FIXTURES / "ip-d-j-addr-show.json").read_text())}
    assert set(links) == {"lo", "a0", "a1", "br9", "vx9"}
    a0, a1, br, vx = links["a0"], links["a1"], links["br9"], links["vx9"]
    assert a0.kind == a1.kind == "veth" and (a0.parent, a1.parent) == ("a1", "a0") and a0.link_netnsid is None
    assert a1.master == "br9" and a1.slave_kind == "bridge" and br.kind == "bridge"
    assert [a.cidr for a in a0.addrs if a.scope == "global"] == ["10.200.99.1/24", "fd00:200:99::1/64"]
    assert {a.family for a in a0.addrs} == {"inet", "inet6"} and a0.up and "LOOPBACK" in links["lo"].flags
    assert (vx.kind, vx.mtu, vx.vxlan_dev, vx.vxlan_family) == ("vxlan", 1450, "a0", 4)
    assert a0.min_mtu == 68 and a0.max_mtu == 65535 and a0.sizes["gso_max_size"] == 65536
    assert a0.mac == a0.address and len(a0.address or "") == 17


def test_an_address_goes_to_a_state_file_and_back_unchanged():
    link = next(l for l in netdev.parse_links((FIXTURES / "ip-d-j-addr-show.json").read_text()) if l.ifname == "a0")
    for addr in link.addrs:
        assert netdev.Addr.from_json(addr.to_json()) == addr


def test_routes_become_records():
    [via] = [r for r in netdev.parse_routes((FIXTURES / "ip-j-4-route-show.json").read_text()) if r.gateway]
    assert (via.dst, via.gateway, via.dev, via.metric) == ("10.200.98.0/24", "10.200.99.2", "a0", 7)
    [got] = netdev.parse_routes((FIXTURES / "ip-j-route-get.json").read_text())
    assert (got.dst, got.dev, got.prefsrc) == ("10.200.98.5", "a0", "10.200.99.1")
    six = netdev.parse_routes((FIXTURES / "ip-j-6-route-show.json").read_text())
    assert "fd00:200:99::/64" in [r.dst for r in six]
    assert netdev.parse_routes("") == []


def test_qdiscs_with_and_without_their_device_named():
    tree = netdev.parse_qdiscs((FIXTURES / "tc-s-j-qdisc-show.json").read_text())
    [tbf] = [q for q in tree if q.dev == "a0"]
    assert (tbf.kind, tbf.root, tbf.options["limit"]) == ("tbf", True, 6000) and tbf.handle != "0:"
    assert all(q.under_root and q.packets >= 0 for q in tree)
    [one] = netdev.parse_qdiscs((FIXTURES / "tc-j-qdisc-show-dev.json").read_text(), "a0")
    assert (one.dev, one.kind, one.root) == ("a0", "tbf", True)  # tc leaves dev out with `show dev IF`
    assert netdev.parse_qdiscs("not json") == []


def test_ethtool_driver_of_a_veth():
    drv = netdev.parse_driver((FIXTURES / "ethtool-i-veth.txt").read_text())
    assert drv == netdev.Driver("veth", "1.0", "", "")


# ---- the home check ---------------------------------------------------------------------------

# Keys only `ip -j`, `tc -j` and `ethtool -i` print: a read of one outside netdev is a parse again.
RAW_KEYS = {
    "ifname", "operstate", "addr_info", "linkinfo", "info_kind", "info_slave_kind", "info_data", "link_netnsid",
    "link_index", "prefixlen", "permaddr", "altnames", "min_mtu", "max_mtu", "nexthops", "ifalias", "txqlen",
    "parentbus", "parentdev",  # ip
    "overlimits", "requeues",  # tc
    "bus-info", "firmware-version",  # ethtool -i
}
# A command of one of the tools, as argv or inside a shell script: `ip -j` (or -js, -json), `tc -j`, tc's
# text of a qdisc, class or filter listing, any ethtool query.
_AT = r"(^|[\s;|&(`])"
_TOOL_TEXT = re.compile(_AT + r"(ip|tc)\s(-[a-z]+\s+)*-j(s|son)?\b|" + _AT + r"tc\s(-[a-z]+\s+)*(qdisc|class|filter)\s+show\b|"
                        + _AT + r"ethtool\s+-[a-zA-Z]\b")
_JSON_FLAGS = {"-j", "-js", "-json"}
_TC_LISTS = {"qdisc", "class", "filter"}
_TOOL_NAMES = {"ip_argv", "TC_QDISC_SHOW", "TC_SHOW", "qdisc_json"}
_PARSE_CALLS = {"loads", "splitlines", "partition", "match", "fullmatch", "findall", "finditer", "search"}


def _tool_argv(node: ast.List) -> bool:
    words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if not node.elts or not isinstance(node.elts[0], ast.Constant) or node.elts[0].value not in ("ip", "tc", "ethtool"):
        return False
    tool = node.elts[0].value
    return ((tool == "ethtool" and "--version" not in words) or bool(_JSON_FLAGS & set(words))
            or (tool == "tc" and "show" in words and bool(_TC_LISTS & set(words))))


def _runs_a_tool(node: ast.AST, names: set[str] = frozenset()) -> bool:
    """Whether `node` holds a command of the tools, or names one (`netdev.ip_argv`, or a module constant
    of `names` that holds a script or argv of them)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.List) and _tool_argv(sub):
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _TOOL_TEXT.search(sub.value):
            return True
        if isinstance(sub, (ast.Name, ast.Attribute)) and (getattr(sub, "id", None) or getattr(sub, "attr", None)) in (
                _TOOL_NAMES | names):
            return True
    return False


def _tool_constants(tree: ast.Module) -> set[str]:
    """Module-level names that hold a command of the tools (`SCRIPT = "ip -j link; ..."`)."""
    return {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            and _runs_a_tool(node.value)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}


def _parses(node: ast.AST) -> int | None:
    """The line of a call that takes text apart (json.loads, splitlines, re.match, ...) in `node`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _PARSE_CALLS:
            return sub.lineno
    return None


def parses_elsewhere(source: str) -> list[str]:
    """Each function that runs ip -j / tc -j / ethtool and takes its output apart itself, and each
    read of a key only those tools print (`x["ifname"]`, `x.get("linkinfo")`)."""
    out = []
    tree = ast.parse(source)
    constants = _tool_constants(tree)
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _runs_a_tool(fn, constants):
            line = _parses(fn)
            if line is not None:
                out.append(f"{line}: {fn.name} parses ip/tc/ethtool output itself (use offlab.netdev)")
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if key in RAW_KEYS:
            out.append(f"{node.lineno}: reads {key!r}, a key of ip/tc/ethtool output (read the netdev record's field)")
    return out


# Functions that run one batched script for one round trip and cut its output into the script's sections
# only, handing the `ip -j` section to netdev's parser (file, function).
BATCHED = {
    ("vm/saved.py", "_recheck"),  # the restored guest's clock, MACs, `ip -j addr` and virtio features at once
}


def test_no_module_but_netdev_parses_ip_tc_or_ethtool_output():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if HOME not in path.parents:
            rel = str(path.relative_to(PACKAGE))
            problems += [f"{path}:{p}" for p in parses_elsewhere(path.read_text())
                         if not any(rel == f and f" {fn} parses " in p for f, fn in BATCHED)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, found", [
    ('import json\ndef f(h):\n    return json.loads(h.run(["ip", "-j", "link"]).stdout)\n', ["f parses"]),
    ('import json\ndef f(h):\n    return json.loads(h.run(netdev.ip_argv("link")).stdout)\n', ["f parses"]),
    ('def f(h):\n    return h.run(["sh", "-c", "ip -d -j addr show"]).stdout.splitlines()\n', ["f parses"]),
    ('def f(h):\n    return h.run(["ethtool", "-i", "x"]).stdout.partition(":")\n', ["f parses"]),
    ('import json\ndef f(h):\n    return json.loads(h.qdisc_json())\n', ["f parses"]),
    ('def f(link):\n    return link["ifname"], link.get("linkinfo")\n', ["reads 'ifname'", "reads 'linkinfo'"]),
    ('def f(q):\n    return q["requeues"]\n', ["reads 'requeues'"]),
    ('SCRIPT = "for n in a b; do ip -j link show dev $n; done"\n'
     'def f(h):\n    return h.run(["sh", "-c", SCRIPT]).stdout.splitlines()\n', ["f parses"]),
    ('import json\ndef f(h):\n    return json.loads(h.run(["ip", "-json", "addr"]).stdout)\n', ["f parses"]),
    ('def f(h):\n    return h.run(["sh", "-c", "ip -json route"]).stdout.splitlines()\n', ["f parses"]),
    ('def f(h):\n    return h.run(["tc", "-s", "qdisc", "show", "dev", "x"]).stdout.splitlines()\n', ["f parses"]),
    ('def f(h):\n    return h.run(["sh", "-c", "tc -s class show dev x"]).stdout.splitlines()\n', ["f parses"]),
    # not a parse: a tool run whose output is handed to netdev, a command that is no ip -j, other JSON
    ('def f(h):\n    return netdev.parse_links(h.run(netdev.ip_argv("link")).stdout)\n', []),
    ('import json\ndef f(h):\n    h.run(["ip", "link", "set", "x", "up"])\n    return json.loads(h.read("s.json"))\n', []),
    ('def f(lab):\n    return lab["name"], lab.get("mtu"), ["ip", "link", "set", "dev", "x", "master", "br0"]\n', []),
    ('TOOLS = {"ethtool": ["ethtool", "--version"]}\ndef v(h):\n    return h.run(TOOLS["ethtool"]).stdout.splitlines()\n', []),
    ('ADD = ["tc", "qdisc", "replace", "dev", "x", "root", "tbf"]\n'
     'def f(h):\n    h.run(ADD)\n    return h.read("/proc/net/dev").splitlines()\n', []),
])
def test_the_home_checker_finds_each_way_of_parsing_again(source, found):
    got = parses_elsewhere(source)
    assert len(got) == len(found) and all(f in g for f, g in zip(found, got, strict=True)), got
