"""The arrows of docs/architecture.md, checked over the import graph of the offlab package.

cli → experiment → {lab, knobs, traffic, probes} → hosts; lab → vm → hosts; report → store.
Every import counts, also one inside a function (a late import is still an arrow).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=None)
def _parse(source: str) -> ast.Module:
    """A source's tree, parsed once for all the checks of this module (each walks every file of the
    package; the trees are only read)."""
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def _nodes(source: str) -> tuple[ast.AST, ...]:
    """Every node of a source's tree, in `ast.walk`'s order, listed once (walking every file's tree
    again for each check was most of this module's time)."""
    return tuple(ast.walk(_parse(source)))


PACKAGE = Path(__file__).resolve().parent.parent / "offlab"

# Module (or package) → part; the longest prefix wins. A new top-level module needs a line here.
PARTS = {
    "offlab": "base",  # the package itself (__version__), not what lies below it
    "offlab.errors": "base",
    "offlab.names": "base",
    "offlab.state": "common",  # where offlab keeps its files
    "offlab.stats": "common",  # pure statistics
    "offlab.metrics": "common",  # what a sample measures, by name
    "offlab.addresses": "common",  # the lab's address ranges and host addresses (labs, the MTU probe, help texts)
    "offlab.catalog": "common",  # the topologies by name: hosts, tools, kinds; builders named, imported by lab
    "offlab.sample": "common",  # a stored sample read as dataclasses (witnesses, report, results)
    "offlab.interrupts": "common",  # SIGINT, SIGTERM and SIGHUP as exceptions, held through shielded sections
    "offlab.wire": "common",  # header sizes on the wire
    "offlab.feature_names": "common",  # ethtool's feature names and offlab's aliases (knobs, lab show, witnesses)
    "offlab.tracefs": "common",  # offlab's hist triggers: which, and the shell that sets and removes them
    "offlab.hosts": "hosts",
    "offlab.inventory": "inventory",  # inventories (offlab's YAML, Ansible's) → SSH hosts and test interfaces
    "offlab.hostcheck": "doctor",  # `hosts check`: an audit of inventory hosts
    "offlab.netdev": "netdev",  # the one parser of ip/ethtool/softnet, the one ovs-vsctl
    "offlab.rtnl": "netdev",  # a link's GSO/GRO sizes over rtnetlink (stdlib only; run inside a namespace)
    "offlab.mtu": "mtu",  # MTU arithmetic (the VXLAN overhead) and the path MTU probe
    "offlab.vm": "vm",
    "offlab.dpdk": "dpdk",  # dpdk-testpmd as a daemon and its command line (lab, knobs and probes use it)
    "offlab.lab": "lab",
    "offlab.knobs": "knobs",
    "offlab.traffic": "traffic",
    "offlab.probes": "probes",
    "offlab.doctor": "doctor",
    "offlab.experiment": "experiment",
    "offlab.store": "store",
    "offlab.fleet": "fleet",  # a plan across an inventory's pairs, driven by ansible-playbook
    "offlab.report": "report",
    "offlab.cli": "cli",
    "offlab.__main__": "cli",
}

_LOW = {"base", "common"}
# Part → the other parts it may import. `hosts` gets errors/names and the state directory only.
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "common": {"base"},
    "hosts": {"base", "common"},  # common: where offlab keeps its files (SSH control sockets)
    "inventory": {"hosts", *_LOW},
    "netdev": {"hosts", "base"},
    "mtu": {"hosts", "netdev", *_LOW},  # netdev: the route to a destination and its device
    "vm": {"hosts", "netdev", *_LOW},
    "dpdk": {"hosts", "netdev", *_LOW},  # netdev: a tap's addresses before testpmd takes it back
    "lab": {"vm", "dpdk", "hosts", "inventory", "netdev", "mtu", *_LOW},
    "knobs": {"hosts", "dpdk", "netdev", "mtu", *_LOW},
    "traffic": {"hosts", "netdev", *_LOW},
    "probes": {"hosts", "dpdk", "netdev", *_LOW},
    "doctor": {"hosts", "inventory", "netdev", "mtu", *_LOW},
    "store": {*_LOW},
    "report": {"store", *_LOW},
    "experiment": {"lab", "vm", "dpdk", "inventory", "knobs", "traffic", "probes", "netdev", "mtu", "hosts", "store", *_LOW},
    "fleet": {"experiment", "store", "inventory", "hosts", *_LOW},
    "cli": set(PARTS.values()),
}

# Calls that start a process; only `hosts` may make them.
PROCESS_CALLS = {("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output",
                                             "getoutput", "getstatusoutput")}
PROCESS_CALLS |= {("os", n) for n in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
                                      "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp",
                                      "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl")}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str | None:
    best = max((p for p in PARTS if module == p or (p != "offlab" and module.startswith(p + "."))),
               key=len, default=None)
    return PARTS[best] if best else None


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported offlab module) for every import in `source`, at any depth."""
    out = []
    for node in _nodes(source):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # `from offlab import lab` imports the module offlab.lab
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if sub in known else target))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            out.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in out if name == "offlab" or name.startswith("offlab.")]


def process_calls(source: str) -> list[tuple[int, str]]:
    out = []
    for node in _nodes(source):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in PROCESS_CALLS):
            out.append((node.lineno, f"{node.func.value.id}.{node.func.attr}"))
    return out


def load(root: Path) -> dict[str, tuple[str, str, bool]]:
    """module → (file, source, is_package) for every .py below `root` (a package directory)."""
    return {module_name(p, root): (str(p), p.read_text(), p.name == "__init__.py") for p in sorted(root.rglob("*.py"))}


def violations(modules: dict[str, tuple[str, str, bool]]) -> list[str]:
    """One line per import that points the wrong way, per module without a part, per process started."""
    known = set(modules)
    problems = []
    for mod, (file, source, is_pkg) in sorted(modules.items()):
        src_part = part_of(mod)
        if src_part is None:
            problems.append(f"{file}: module {mod} belongs to no part (add it to PARTS in tests/test_layering.py)")
            continue
        for line, target in imports_of(source, mod, is_pkg, known):
            dst_part = part_of(target)
            if dst_part is None or dst_part == src_part or dst_part in ALLOWED[src_part]:
                continue
            problems.append(f"{file}:{line}: {mod} ({src_part}) imports {target} ({dst_part}); "
                            f"{src_part} may import only {', '.join(sorted(ALLOWED[src_part])) or 'nothing of offlab'}")
        if src_part != "hosts":
            problems += [f"{file}:{line}: {mod} ({src_part}) calls {call}: only hosts starts processes"
                         for line, call in process_calls(source)]
    return list(dict.fromkeys(problems))


def test_imports_follow_the_arrows_of_the_design():
    problems = violations(load(PACKAGE))
    assert not problems, "imports against docs/architecture.md's arrows:\n" + "\n".join(problems)


def test_every_part_has_its_rule():
    assert set(PARTS.values()) <= set(ALLOWED)


def parts_table(text: str) -> dict[str, tuple[set[str], set[str] | None]]:
    """docs/architecture.md's parts table: part → (the modules it names in its row's first column, the
    parts its "may import" column names; None for "every part"). Rows of non-Python parts (`engine/`)
    are left out."""
    lines = text.split("| part | owns | may import", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    out: dict[str, tuple[set[str], set[str] | None]] = {}
    for line in lines:
        first, _, imports, _ = [c.strip() for c in line.strip().strip("|").split(" | ")]
        names = re.findall(r"`([^`]+)`", first)
        if any(n.endswith("/") for n in names):
            continue
        out[names[0]] = (set(names), None if imports == "every part" else set(re.findall(r"`([^`]+)`", imports)))
    return out


def test_the_parts_table_of_the_architecture_doc_is_the_import_rule():
    """Each part of PARTS has its row in docs/architecture.md, a row names a part (or a module on its own
    row, `sample`, under its part's rule), and its "may import" column is ALLOWED's set."""
    table = parts_table((PACKAGE.parent / "docs" / "architecture.md").read_text())
    problems = [f"part {p!r} has no row in the doc's table" for p in sorted(set(ALLOWED) - set(table))]
    for name, (_, imports) in sorted(table.items()):
        part = name if name in ALLOWED else PARTS.get(f"offlab.{name}")
        if part is None:
            problems.append(f"the doc's row {name!r} is no part and no module of PARTS")
            continue
        want = ALLOWED[part] if part != "cli" else None
        if imports != want:
            problems.append(f"the doc's row {name!r} may import {sorted(imports) if imports else imports}, "
                            f"ALLOWED[{part!r}] says {sorted(want) if want else want}")
    assert not problems, "\n".join(problems)


def test_the_parts_table_reader_sees_a_wrong_row():
    doc = ("| part | owns | may import (rule) | files |\n|---|---|---|---|\n"
           "| `store` | runs | `base`, `common`, `hosts` | `store/` |\n| `cli` | it | every part | x |\n"
           "| `engine/` | Rust | (Rust) | y |\n\nafter\n")
    assert parts_table(doc) == {"store": ({"store"}, {"base", "common", "hosts"}), "cli": ({"cli"}, None)}


# ---- the checker itself, on a made-up package ------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "offlab"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


CLEAN = {
    "__init__.py": "__version__ = '0'\n",
    "errors.py": "",
    "hosts/__init__.py": "from offlab.errors import *\nimport subprocess\nsubprocess.run(['true'])\n",
    "knobs/__init__.py": "",
    "knobs/link.py": "from offlab.hosts import LOCAL\nfrom . import __init__\n",
    "lab/__init__.py": "from offlab import hosts\n",
    "experiment/run.py": "from offlab import lab, knobs\n",
    "cli/__init__.py": "import offlab.experiment.run\n",
}


def test_checker_passes_a_clean_tree(tmp_path):
    assert violations(load(_tree(tmp_path, CLEAN))) == []


@pytest.mark.parametrize("file, line, wrong", [
    ("knobs/link.py", "from offlab.experiment import x\n", "offlab.knobs.link (knobs) imports offlab.experiment"),
    ("knobs/link.py", "def f():\n    from offlab.lab import down\n", "offlab.knobs.link (knobs) imports offlab.lab"),
    ("lab/__init__.py", "from offlab import knobs\n", "offlab.lab (lab) imports offlab.knobs"),
    ("lab/__init__.py", "from ..knobs import link\n", "offlab.lab (lab) imports offlab.knobs"),
    ("hosts/__init__.py", "import importlib\nimportlib.import_module('offlab.lab')\n",
     "offlab.hosts (hosts) imports offlab.lab"),
    ("knobs/link.py", "import subprocess\nsubprocess.Popen(['ip'])\n", "calls subprocess.Popen"),
    ("extra.py", "", "module offlab.extra belongs to no part"),
])
def test_checker_names_each_wrong_import(tmp_path, file, line, wrong):
    files = dict(CLEAN)
    files[file] = files.get(file, "") + line
    problems = violations(load(_tree(tmp_path, files)))
    assert len(problems) == 1 and wrong in problems[0], problems
    if "imports" in wrong:
        assert f"offlab/{file}:" in problems[0]


# ---- one source for each fact ---------------------------------------------------------------

def _literal_number(value: ast.expr) -> bool:
    """50, 14 + 20 + 8 + 8, or {4: 50, 6: 70}: a number written out, not one looked up."""
    if isinstance(value, ast.Dict):
        return any(_literal_number(v) for v in value.values)
    return isinstance(value, (ast.Constant, ast.BinOp)) and all(
        isinstance(n, (ast.Constant, ast.BinOp, ast.operator)) for n in ast.walk(value))


def test_the_vxlan_overhead_and_the_ovs_vsctl_call_are_written_once():
    """50/70 bytes of VXLAN live in mtu/calc.py, the ovs-vsctl argv in netdev/__init__.py; elsewhere they are imported."""
    problems = []
    for mod, (file, source, _) in load(PACKAGE).items():
        for node in _nodes(source):
            if (mod != "offlab.mtu.calc" and isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and "VXLAN" in t.id and "OVERHEAD" in t.id for t in node.targets)
                    and _literal_number(node.value)):
                problems.append(f"{file}:{node.lineno}: a VXLAN overhead written again (import offlab.mtu.calc's)")
            if (mod != "offlab.netdev" and isinstance(node, ast.List) and node.elts
                    and isinstance(node.elts[0], ast.Constant) and node.elts[0].value == "ovs-vsctl"):
                problems.append(f"{file}:{node.lineno}: an ovs-vsctl call written again (use offlab.netdev.vsctl)")
    assert not problems, "\n".join(problems)


def _non_doc_strings(source: str):
    """(line, text) of every string constant that is not a docstring or a bare string statement."""
    docs = {id(n.value) for n in _nodes(source) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in _nodes(source)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_lab_addresses_are_written_once():
    """10.200.x.y and fd00:200:… live in offlab/addresses.py; labs, the MTU probe and help texts import them
    (a docstring may show one as an example)."""
    problems = [f"{file}:{line}: a lab address written again (use offlab.addresses): {text!r}"
                for mod, (file, source, _) in load(PACKAGE).items() if mod != "offlab.addresses"
                for line, text in _non_doc_strings(source) if "10.200." in text or "fd00:200" in text.lower()]
    assert not problems, "\n".join(problems)


def test_the_addresses_module_gives_the_addresses_labs_have_always_had():
    from offlab import addresses as a

    assert (a.CLIENT4, a.SERVER4, a.CLIENT6, a.SERVER6) == (
        "10.200.1.1/24", "10.200.1.2/24", "fd00:200:0:1::1/64", "fd00:200:0:1::2/64")
    assert (a.ROUTER_C4, a.ROUTER_S4, a.BEHIND4, a.HV1_UNDERLAY, a.HV2_UNDERLAY) == (
        "10.200.1.254/24", "10.200.2.254/24", "10.200.2.2/24", "10.200.254.1/24", "10.200.254.2/24")
    assert (a.ROUTER_C6, a.ROUTER_S6, a.BEHIND6) == ("fd00:200:0:1::fe/64", "fd00:200:0:2::fe/64", "fd00:200:0:2::2/64")
    assert a.address(a.ROUTER_C6) == "fd00:200:0:1::fe"


def test_the_pmd_limits_the_role_pattern_and_the_tool_packages_are_written_once():
    """The tap/af_packet PMD MTU and frame limits live in dpdk/ports.py, the role pattern (client, hv1, ...) in
    names.py, the tool → Debian package map in hosts/base.py; elsewhere they are imported."""
    from offlab.hosts import TOOL_PACKAGES
    from offlab.names import ROLE_PATTERN

    problems = []
    for mod, (file, source, _) in load(PACKAGE).items():
        for node in _nodes(source):
            if (mod != "offlab.dpdk.ports" and isinstance(node, ast.Assign) and _literal_number(node.value)
                    and any(isinstance(t, ast.Name) and t.id.endswith(("MAX_MTU", "MAX_FRAME")) for t in node.targets)):
                problems.append(f"{file}:{node.lineno}: a PMD limit written again (import offlab.dpdk.ports)")
            if (mod != "offlab.names" and isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and ROLE_PATTERN in node.value):
                problems.append(f"{file}:{node.lineno}: the role pattern written again (use offlab.names.ROLE_RE)")
            if mod != "offlab.hosts.base" and isinstance(node, ast.Dict):
                again = [k.value for k, v in zip(node.keys, node.values, strict=True)
                         if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                         and k.value in TOOL_PACKAGES and v.value == TOOL_PACKAGES[k.value]]
                if again:
                    problems.append(f"{file}:{node.lineno}: the package of {again} written again "
                                    "(use offlab.hosts.TOOL_PACKAGES)")
    assert not problems, "\n".join(problems)


def test_every_ip_json_command_is_built_in_netdev():
    """`ip -j …` argv lists live in netdev/__init__.py (ip_argv and the readers on it: link_rows, find_link, addr_rows,
    routes, route_get, netns_names); the other parts call those. Shell scripts that batch one round trip
    (lab/hosts.py's SSH probe, vm/saved.py's guest recheck) are not argv lists and stay where they are."""
    problems = []
    for mod, (file, source, _) in load(PACKAGE).items():
        if mod == "offlab.netdev":
            continue
        for node in _nodes(source):
            if (isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)
                    and node.elts[0].value == "ip"
                    and any(isinstance(e, ast.Constant) and e.value == "-j" for e in node.elts)):
                problems.append(f"{file}:{node.lineno}: an `ip -j` command written again (use offlab.netdev)")
    assert not problems, "\n".join(problems)


def _knob_classes() -> set[str]:
    from offlab.knobs.base import Knob
    from offlab.knobs.registry import KINDS

    seen, todo = set(), [Knob, *KINDS.values()]
    while todo:
        cls = todo.pop()
        if cls.__name__ not in seen:
            seen.add(cls.__name__)
            todo += cls.__subclasses__()
    return seen


def test_plan_checks_name_no_knob_class():
    """A knob class judges its own plan values and places (Knob.plan_value_problem, plan_place_problem):
    experiment/plan/checks.py asks the class, so a new knob touches only `knobs`."""
    classes = _knob_classes()
    assert {"Mtu", "Feature", "Sysctl", "TestpmdSetting", "BridgeNf"} <= classes
    file = PACKAGE / "experiment" / "plan" / "checks.py"
    named = []
    for node in _nodes(file.read_text()):
        if isinstance(node, ast.Name) and node.id in classes:
            named.append((node.lineno, node.id))
        elif isinstance(node, ast.alias) and (node.asname or node.name) in classes:
            named.append((getattr(node, "lineno", 0), node.name))
    assert not named, f"{file} names knob classes (move the check into the class): {named}"


# ---- one teardown ----------------------------------------------------------------------------

def test_labs_are_removed_only_through_the_one_teardown():
    """`lab.remove` leaves journalled settings unrestored and unforgotten: every caller (CLI, runner,
    fan-out, benchmarks, tests) goes through `experiment.teardown.down`, and no import-time hook exists."""
    import re

    repo = PACKAGE.parent
    allowed = {"offlab/experiment/teardown.py", "offlab/lab/__init__.py", "tests/test_layering.py"}
    files = [p for p in [*PACKAGE.rglob("*.py"), *(repo / "tests").glob("*.py"), *(repo / "benchmarks").iterdir()]
             if p.is_file() and str(p.relative_to(repo)) not in allowed]
    wrong = [f"{p.relative_to(repo)}:{n}" for p in files for n, text in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\blabs?\.(remove|down|down_all|on_down|on_down_hosts)\(", text)]
    assert not wrong, f"labs removed without experiment.teardown (or through a hook): {wrong}"


def test_no_test_module_imports_another():
    """Shared test code lives in tests/helpers.py (fixtures in conftest.py): a test module that imports
    another runs that module's fixtures and marks too, and breaks when it is renamed."""
    tests = PACKAGE.parent / "tests"
    wrong = [f"{p.name}:{node.lineno}" for p in sorted(tests.glob("test_*.py"))
             for node in _nodes(p.read_text())
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.test_")]
    assert not wrong, f"test modules importing test modules: {wrong}"


# lab.topology, place.topology, topo.kind, cell.topology.kind, a plan's `kinds` (its set of topology kinds)
_TOPOLOGY_EXPR = re.compile(r"(\w+\.)*(topology|topo)(\.kind)?|kinds")
# what `.startswith("dpdk")` / `.endswith("-vm")` is asked of when it asks after a topology
_NAMED = re.compile(r"(\w+\.)*(topology|topo|kind|name)(\.kind)?")
DEVICE_KINDS = {"veth", "bridge", "vxlan", "router", "ovs", "dpdk"}
_DEVICE_KIND = re.compile(r"(\w+\.)*\w*kind")


def topology_names_again(source: str, names: set[str], pseudo: set[str] = frozenset()) -> list[str]:
    """Each place in `source` that writes topology facts again: a collection (tuple, list, set, dict keys)
    of two or more topology names of which one is a topology only (veth, bridge, vxlan, router, ovs and
    dpdk alone are device kinds and doctor's areas: `("veth", "bridge", "vxlan")` is a list of link kinds),
    a dict keyed by a topology-only name; any comparison, `match` case or `topology=` argument with a
    topology (`lab.topology`, `topo.kind`, `place.topology`, ...), any comparison with a topology-only name
    (`name == "phys"`), and a prefix or suffix of one asked of a name or kind (`kind.startswith("dpdk")`).
    `pseudo` names (the `hosts` lab) count only beside a topology, as they are common words elsewhere."""
    only = names - DEVICE_KINDS
    every = names | set(pseudo)
    out = []

    def branch(line: int, consts: set[str]) -> None:
        out.append(f"{line}: a branch on topology {sorted(consts)} (put the fact in its offlab.catalog record)")

    for node in _nodes(source):
        elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and elts:
            found = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
            if (len(found) >= 2 or isinstance(node, ast.Dict)) and found & only:
                out.append(f"{node.lineno}: topologies {sorted(found)} listed again (use offlab.catalog)")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and c.value in every}
            texts = [ast.unparse(s) for s in sides]
            # a device's own kind (`iface.kind == "ovs-dpdk"`: an OVS-DPDK port) is not a topology's
            a_device = any(_DEVICE_KIND.fullmatch(t) and not _TOPOLOGY_EXPR.fullmatch(t) for t in texts)
            if consts and ((consts & only and not a_device) or any(_TOPOLOGY_EXPR.fullmatch(t) for t in texts)):
                branch(node.lineno, consts)
        elif isinstance(node, ast.Match):
            consts = {c.value for case in node.cases for c in ast.walk(case.pattern)
                      if isinstance(c, ast.Constant) and c.value in every}
            if consts and (consts & only or _TOPOLOGY_EXPR.fullmatch(ast.unparse(node.subject))):
                branch(node.lineno, consts)
        elif isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr in ("startswith", "endswith") and node.args
                    and _NAMED.fullmatch(ast.unparse(f.value))):
                args = [c.value for c in ast.walk(node.args[0]) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if any(len(a) >= 2 and (n.startswith(a) if f.attr == "startswith" else n.endswith(a))
                       for a in args for n in only):
                    branch(node.lineno, set(args))
            consts = {k.value.value for k in node.keywords if k.arg == "topology"
                      and isinstance(k.value, ast.Constant) and k.value.value in every}
            if consts:
                branch(node.lineno, consts)
    return out


def test_topology_names_are_only_in_the_catalog_and_the_builders():
    """offlab/catalog.py holds one record per topology, with every fact other parts branch on; the modules
    of the builders it names may name their own topology. Anywhere else a topology list or a branch on a
    topology's name is a fact written again."""
    from offlab.catalog import HOSTS, NAMES, TOPOLOGIES

    home = {"offlab.catalog", *(t.builder.partition(":")[0] for t in TOPOLOGIES.values())}
    problems = []
    for mod, (file, source, _) in load(PACKAGE).items():
        if mod not in home:
            problems += [f"{file}:{p}" for p in topology_names_again(source, set(NAMES), {HOSTS})]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, found", [
    ('KINDS = ("dpdk", "dpdk-vm")\n', ["listed again"]),
    ('KINDS = {"vm-pair": 1, "veth": 2}\n', ["listed again"]),
    ('PMD = {"phys": "net_i40e"}\n', ["listed again"]),
    ('if lab.topology == "phys":\n    pass\n', ["a branch on topology ['phys']"]),
    ('if topo.kind in ("vxlan",):\n    pass\n', ["a branch on topology ['vxlan']"]),
    ('if place.topology not in ("dpdk", "bridge"):\n    pass\n', ["a branch on topology ['bridge', 'dpdk']"]),
    ('if kinds != {"veth"}:\n    pass\n', ["a branch on topology ['veth']"]),
    ('if name == "phys":\n    pass\n', ["a branch on topology ['phys']"]),
    ('if kind.startswith("dpdk"):\n    pass\n', ["a branch on topology ['dpdk']"]),
    ('if lab.name.endswith("-vm"):\n    pass\n', ["a branch on topology ['-vm']"]),
    ('match topology:\n    case "vm" | "vm-pair":\n        pass\n', ["a branch on topology ['vm', 'vm-pair']"]),
    ('if lab.topology == "hosts":\n    pass\n', ["a branch on topology ['hosts']"]),
    ('lab = LabState(name=n, topology="hosts")\n', ["a branch on topology ['hosts']"]),
    # device kinds and areas, not topologies; `hosts` as a word
    ('L2 = ("veth", "bridge", "vxlan")\nif link.kind == "bridge" or kinds.get(m) != "veth":\n    pass\n', []),
    ('AREAS = ("nic", "bridge", "ovs", "dpdk")\n', []),
    ('row = {"hosts": [], "bridge": 1}\nif key == "hosts" or ifname.startswith("ol"):\n    pass\n', []),
    ('if iface.kind == "ovs-dpdk":\n    pass\n', []),
])
def test_the_topology_checker_finds_each_way_of_writing_a_fact_again(source, found):
    from offlab.catalog import HOSTS, NAMES

    got = topology_names_again(source, set(NAMES), {HOSTS})
    assert len(got) == len(found) and all(f in g for f, g in zip(found, got, strict=True)), got


# ---- host kinds are invisible above hosts -------------------------------------------------------

HOST_CLASSES = {"Host", "LocalHost", "NetnsHost", "GuestHost", "SshHost"}


def test_no_part_above_hosts_asks_which_kind_a_host_is_or_signals_a_pid_itself():
    """A guest, an SSH machine and a namespace are the same `Host` above `hosts`: no `isinstance` of a
    host class (lab and vm make hosts, so they may), and no `os.kill`: `Host.signal` or
    `hosts.process.signal_pid` (which checks the start time) sends it."""
    problems = []
    for mod, (file, source, _) in load(PACKAGE).items():
        part = part_of(mod)
        for node in _nodes(source):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (part not in ("hosts", "lab", "vm") and isinstance(f, ast.Name) and f.id == "isinstance"
                    and len(node.args) == 2):
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                named = {k.id if isinstance(k, ast.Name) else getattr(k, "attr", "") for k in kinds}
                if named & (HOST_CLASSES - {"Host"}):
                    problems.append(f"{file}:{node.lineno}: {mod} ({part}) asks which kind of host it has")
            if (part != "hosts" and isinstance(f, ast.Attribute) and f.attr in ("kill", "killpg")
                    and isinstance(f.value, ast.Name) and f.value.id == "os"):
                problems.append(f"{file}:{node.lineno}: {mod} ({part}) calls os.{f.attr}: use Host.signal or signal_pid")
    assert not problems, "\n".join(problems)


# ---- caches have an owner that ends -------------------------------------------------------------

_MUTATORS = {"setdefault", "update", "pop", "popitem", "clear", "append", "add", "extend", "insert", "remove",
             "discard", "__setitem__"}
_CONTAINERS = {"dict", "set", "list", "defaultdict", "OrderedDict"}


def _mutable_value(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.Set, ast.List, ast.DictComp, ast.SetComp, ast.ListComp)):
        return True
    return (isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) in _CONTAINERS)


def module_caches(source: str) -> list[tuple[int, str]]:
    """(line, name) of every module-level dict, set or list that a function fills or empties: a cache
    that lives as long as the process (the module), whatever it was about."""
    tree = _parse(source)
    globals_: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and _mutable_value(node.value):
            globals_.update({t.id: node.lineno for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _mutable_value(node.value):
            globals_[node.target.id] = node.lineno
    found: dict[str, int] = {}
    for fn in _nodes(source):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        declared = {n for g in ast.walk(fn) if isinstance(g, ast.Global) for n in g.names}
        for node in ast.walk(fn):
            name = None
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
                name = getattr(node.value, "id", None)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in _MUTATORS):
                name = getattr(node.func.value, "id", None)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in declared:
                name = node.id
            if name in globals_:
                found.setdefault(name, globals_[name])
    return sorted((line, name) for name, line in found.items())


# Above `hosts`, what a part learns about a host, a lab or a daemon belongs to an object that ends with
# it (the host's memo, which its lab's removal drops; a probe session; a Testpmd), never to the module
# (a module-global cache outlives what it describes). `hosts` keeps the one registry of memos and its
# connections (hosts/memo.py). These few are not caches, and say why:
NOT_CACHES = {
    ("offlab.knobs.lease", "_HELD"): "the leases this process holds: Lease.release removes each",
    ("offlab.knobs.watchdog", "_PROC"): "this process's watchdog while it holds a machine-wide setting: stop() ends it",
}


def test_no_part_above_hosts_keeps_a_cache_in_a_module():
    """A dict (or set, or list) at module level that a function fills lives as long as the process:
    e.g. feature names keyed by host, which outlived the lab they were read in and needed
    monkeypatching in tests (features, queues, probes' clocks, testpmd's answers, explain's bits)."""
    problems = [f"{file}:{line}: {mod} keeps {name} at module level and fills it in a function"
                for mod, (file, source, _) in load(PACKAGE).items() if part_of(mod) != "hosts"
                for line, name in module_caches(source) if (mod, name) not in NOT_CACHES]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source,names", [
    ("_NAMES: dict[tuple, list[str]] = {}\ndef f(k):\n    _NAMES[k] = 1\n", ["_NAMES"]),
    ("_C = dict()\ndef f(k):\n    return _C.setdefault(k, [])\n", ["_C"]),
    ("_S = set()\nclass A:\n    def m(self, x):\n        _S.add(x)\n", ["_S"]),
    ("_L = {}\ndef f():\n    global _L\n    _L = {1: 2}\n", ["_L"]),
    ("_D = {}\ndef f(k):\n    del _D[k]\n", ["_D"]),
    # a constant table only read, and a function's own dict: no cache
    ("TABLE = {'a': 1}\ndef f(k):\n    d = {}\n    d[k] = TABLE[k]\n    return d\n", []),
])
def test_the_module_cache_checker_finds_each_way_of_filling_one(source, names):
    assert [n for _, n in module_caches(source)] == names


# A call (or decorator) by one of these names puts something into another's table or the process's.
_REGISTERS = re.compile(r"regist|subscribe|hook|^on_|add_handler|signal$")
# What starts threads or processes that live as long as the module, whoever imported it.
_POOLS = {"ThreadPoolExecutor", "ProcessPoolExecutor", "Thread", "Timer", "Pool"}


def import_time_registrations(source: str) -> list[tuple[int, str]]:
    """What a module does as it loads to something it imported: a call (`register_kind(...)`,
    `journal.on_record(...)`, `atexit.register(...)`, `signal.signal(...)`, also kept as `_ = reg(...)`),
    a decorator that registers (`@registry.register`; a mark such as doctor's `@check`, which only sets an
    attribute on the function, is not one), a store into its table (`REG["k"] = ...`),
    and a module-level thread or process pool. Each puts this module into another's state (or the
    process's) just because it was imported, so what works depends on who imported what. Calls on the
    module's own names (a YAML loader class it defines, its own command table), assignments of what a
    call returns (`LOG = logging.getLogger(...)`) and the `if __name__ == "__main__":` block are not that."""
    tree = _parse(source)
    imported = {(a.asname or a.name).split(".")[0] for n in _nodes(source)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    found = []

    def root(node: ast.expr) -> ast.expr:
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node

    def on_imported(node: ast.expr) -> bool:
        r = root(node)
        return isinstance(r, ast.Name) and r.id in imported

    def called(node: ast.expr) -> str:
        return ast.unparse(node.func if isinstance(node, ast.Call) else node)

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and on_imported(node.value.func):
                found.append((node.lineno, called(node.value)))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                if isinstance(value, ast.Call) and on_imported(value.func):
                    name = called(value).rpartition(".")[2]
                    discarded = all(isinstance(t, ast.Name) and t.id == "_" for t in targets)
                    if discarded or _REGISTERS.search(name) or name in _POOLS:
                        found.append((node.lineno, called(value)))
                found.extend((node.lineno, f"{ast.unparse(t.value)}[...] =") for t in targets
                             if isinstance(t, ast.Subscript) and on_imported(t.value))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for deco in node.decorator_list:
                    if on_imported(deco) and _REGISTERS.search(called(deco).rpartition(".")[2]):
                        found.append((deco.lineno, f"@{called(deco)}"))
            for block in ("body", "orelse", "finalbody"):
                if isinstance(node, (ast.If, ast.Try, ast.With)) and hasattr(node, block):
                    visit(getattr(node, block))
            for handler in getattr(node, "handlers", []) if isinstance(node, ast.Try) else []:
                visit(handler.body)

    visit(tree.body)
    return found


def test_no_module_registers_itself_where_it_is_imported():
    """Host kinds are one table (hosts/refs.py), doctor checks are found by their mark, the SSH copy of
    the journal is called by the transaction, ssh's at-exit close is set when a master opens."""
    problems = [f"{file}:{line}: {mod} calls {call}(...) as it loads"
                for mod, (file, source, _) in load(PACKAGE).items()
                for line, call in import_time_registrations(source)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source,calls", [
    ("from offlab.hosts.base import register_kind\nregister_kind('x', f)\n", ["register_kind"]),
    ("import atexit\natexit.register(close)\n", ["atexit.register"]),
    ("from offlab.knobs import journal\nif True:\n    journal.on_record(a, b)\n", ["journal.on_record"]),
    ("import signal\ntry:\n    signal.signal(2, h)\nexcept OSError:\n    pass\n", ["signal.signal"]),
    ("from offlab.hosts.base import register_kind\n_ = register_kind('x', f)\n", ["register_kind"]),
    ("import atexit\nCLOSER = atexit.register(close)\n", ["atexit.register"]),
    ("from offlab.doctor import registry\n@registry.register('mtu')\ndef f():\n    pass\n", ["@registry.register"]),
    ("from offlab.hosts import refs\nrefs.KINDS['x'] = f\n", ["refs.KINDS[...] ="]),
    ("from concurrent.futures import ThreadPoolExecutor\nPOOL = ThreadPoolExecutor(4)\n", ["ThreadPoolExecutor"]),
    # its own names, a main block, a call inside a function, a plain decorator, a value kept: none
    ("import yaml\nclass L(yaml.SafeLoader):\n    pass\nL.add_constructor('!x', f)\n", []),
    ("import sys\ndef main():\n    sys.exit(0)\nif __name__ == '__main__':\n    sys.exit(main())\n", []),
    ("import atexit\ndef f():\n    atexit.register(g)\n", []),
    ("from dataclasses import dataclass\nfrom offlab.doctor.registry import check\n@dataclass(frozen=True)\n"
     "class A:\n    x: int\n@check('mtu', area='nic')\ndef g():\n    pass\n", []),
    ("import logging, re\nLOG = logging.getLogger(__name__)\nRX = re.compile('x')\nTABLE = {}\nTABLE['a'] = 1\n", []),
])
def test_the_registration_checker_finds_each_way_of_registering(source, calls):
    assert [c for _, c in import_time_registrations(source)] == calls


HEADER_NAME = re.compile(r"ETH|HEADER|OVERHEAD|FCS|VLAN_TAG")


def header_constants(source: str) -> list[tuple[int, str]]:
    """Module-level names for a header size given as a number (`ETH = 14`), not taken from offlab.wire."""
    return [(node.lineno, t.id) for node in _parse(source).body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)
            for t in node.targets if isinstance(t, ast.Name) and HEADER_NAME.search(t.id)]


def test_each_header_size_is_written_once_in_wire():
    problems = [f"{file}:{line}: {name} is a header size: take it from offlab.wire"
                for mod, (file, source, _) in load(PACKAGE).items() if mod != "offlab.wire"
                for line, name in header_constants(source)]
    assert not problems, "\n".join(problems)
    assert header_constants("ETH = 14\nTSO_HEADERS = 66\nETH_HEADER = wire.ETH_HEADER\nLIMIT = 3\n") == \
        [(1, "ETH"), (2, "TSO_HEADERS")]


# Numbers that are only ever a frame or a payload size made of headers: a frame at MTU 1500 or 9000
# (+ FCS, + a VLAN tag), the largest UDP payload, the UDP payload and the TCP MSS at 1500 and 9000.
# 65535 is left out: alone it is as often a port's or an MTU's bound (in arithmetic it is caught below).
FRAME_SIZES = {1514, 1518, 1522, 9014, 9018, 9022, 65507, 65527, 1472, 8972, 1460, 8960, 1448, 8948}
# Header sizes (and sums of them: 28 = IPv4 + UDP, 50 = VXLAN over IPv4, ...), caught when added to or
# taken from a size (`mtu + 14`, `off + 40`, `off += 4`, `size - 28`); 65535 in any arithmetic (`65535 - 8`).
HEADER_SIZES = {4, 8, 12, 14, 18, 20, 24, 28, 40, 44, 48, 50, 54, 66, 70}
_A_SIZE = re.compile(r"mtu|frame|payload|mss|datagram|segment|packet|header|hdr|size|\blen\b|\boff(set)?\b", re.I)


def inline_header_sizes(source: str) -> list[tuple[int, str]]:
    """(line, text) of each frame size written as a number, and each header size added to or taken from
    a size, in code (strings and docstrings may show the numbers)."""
    out = []
    for node in _nodes(source):
        if _is(node, FRAME_SIZES):
            out.append((node.lineno, str(node.value)))
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult))
              and any(_is(side, {65535}) for side in (node.left, node.right))):  # not a mask: `x & 0xFFFF`
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, (ast.Add, ast.Sub)):
            pairs = ([(node.value, node.target)] if isinstance(node, ast.AugAssign)
                     else [(node.left, node.right), (node.right, node.left)])
            if any(_is(num, HEADER_SIZES) and _A_SIZE.search(ast.unparse(other)) for num, other in pairs):
                out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


def _is(node: ast.AST, numbers: set[int]) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value in numbers


def test_no_header_or_frame_size_is_written_as_a_number_outside_wire():
    """`mtu + 14`, `<= 1514`, `65507`: each is a sum of offlab.wire's headers, written with their names."""
    problems = [f"{file}:{line}: {text} is a header or frame size written as a number (use offlab.wire)"
                for mod, (file, source, _) in load(PACKAGE).items() if mod != "offlab.wire"
                for line, text in inline_header_sizes(source)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, found", [
    ("if size + UDP_FRAME_OVERHEAD <= 1514:\n    pass\n", ["1514"]),
    ("UDP_MAX = {4: 65507, 6: 65527}\n", ["65507", "65527"]),
    ("argv = ['--size', str(w.size or 1472)]\n", ["1472"]),
    ("if len(buf) < off + 40:\n    pass\n", ["off + 40"]),
    ("off += 4  # a VLAN tag\n", ["off += 4"]),
    ("GRO_MAX = 8 * 65535\nlength = info & 0xFFFF\n", ["8 * 65535"]),
    ("frame = mtu + 14\n", ["mtu + 14"]),
    ("GRE = {4: IPV4_HEADER + 4}\nLIMIT = 65535 - 8\n", ["IPV4_HEADER + 4", "65535 - 8"]),
    ("if w.size > UDP_MAX - 8 or datagram + 28 > mtu:\n    pass\n", ["datagram + 28"]),
    # not a header: a port's bound, a count, an index, a size from wire, a number in a help text
    ("ok = 1 <= port <= 65535\nn = count + 8\nx = buf[i + 14]\nf = mtu + ETH_HEADER\n"
     "h = 'Packets are IPv6 (40-byte header), 1514 B frames.'\n", []),
])
def test_the_header_size_checker_finds_each_way_of_writing_one_as_a_number(source, found):
    assert [t for _, t in inline_header_sizes(source)] == found



# ---- each feature alias once ------------------------------------------------------------------

def _feature_canon() -> dict[str, str]:
    """Every name in offlab/feature_names.py's tables → the kernel feature (or legacy pattern) it stands for."""
    from offlab.feature_names import ALIASES, LEGACY, LONG_TO_SHORT

    def canon(name: str) -> str:
        name = ALIASES.get(name, name)
        name = LONG_TO_SHORT.get(name, name)
        return LEGACY[name][1] if name in LEGACY else name

    names = {*ALIASES, *ALIASES.values(), *LEGACY, *LONG_TO_SHORT, *(pat for _, pat in LEGACY.values())}
    return {n: canon(n) for n in names}


def alias_pairs_again(source: str, canon: dict[str, str]) -> list[tuple[int, tuple[str, ...]]]:
    """Each collection (tuple, list, set, a dict's entry or its keys) that holds two names of one feature
    (`("gro-list", "rx-gro-list")`, `{"uso": "tx-udp-segmentation"}`): an alias pair written again."""
    out = []
    for node in _nodes(source):
        if isinstance(node, ast.Dict):
            groups = [[k, v] for k, v in zip(node.keys, node.values, strict=True)] + [list(node.keys)]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            groups = [node.elts]
        else:
            continue
        for group in groups:
            by_feature: dict[str, set[str]] = {}
            for e in group:
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in canon:
                    by_feature.setdefault(canon[e.value], set()).add(e.value)
            for names in by_feature.values():
                if len(names) >= 2:
                    out.append((node.lineno, tuple(sorted(names))))
    return list(dict.fromkeys(out))


# ethtool's parser (netdev imports nothing of common) says which leaves a held-off feature needs, and
# ethtool prints rx-checksum's leaf under its long name: the parser looks for both.
ALIAS_PAIRS_IN_PARSER = {("offlab.netdev.ethtool", ("rx-checksum", "rx-checksumming"))}


def test_each_feature_alias_is_written_once():
    """ethtool's short and long names and offlab's aliases are paired in offlab/feature_names.py only; `lab
    show`'s columns, the knobs and the witnesses derive the other names of a feature from it (names_for,
    shown_name)."""
    canon = _feature_canon()
    problems = [f"{file}:{line}: {list(names)} name one feature (use offlab.feature_names)"
                for mod, (file, source, _) in load(PACKAGE).items() if mod != "offlab.feature_names"
                for line, names in alias_pairs_again(source, canon) if (mod, names) not in ALIAS_PAIRS_IN_PARSER]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, found", [
    ('if key not in ("gro-list", "rx-gro-list"):\n    pass\n', ["['gro-list', 'rx-gro-list']"]),
    ('SUMMARY = {"tso": "tcp-segmentation-offload", "uso": "tx-udp-segmentation"}\n',
     ["['tcp-segmentation-offload', 'tso']", "['tx-udp-segmentation', 'uso']"]),
    ('KEYS = {"gro": 1, "generic-receive-offload": 2}\n', ["['generic-receive-offload', 'gro']"]),
    ('ON = ["tx-csum", "tx-checksumming"]\n', ["['tx-checksumming', 'tx-csum']"]),
    # names of different features, or one name alone
    ('FEATS = ("tso", "gso", "gro", "uso")\nX = {"gro": "on"}\nif key not in names_for("rx-gro-list"):\n    pass\n', []),
])
def test_the_alias_checker_finds_each_way_of_pairing_names_again(source, found):
    assert [str(list(names)) for _, names in alias_pairs_again(source, _feature_canon())] == found

# What an `offlab` start may not load before a command runs: each command imports its machinery in its own
# body (the suite starts `python -m offlab` hundreds of times, and a person types it).
HEAVY_AT_START = ("offlab.lab", "offlab.knobs", "offlab.hosts", "offlab.sample", "offlab.experiment.runner",
                  "offlab.store", "offlab.report", "offlab.netdev", "rich.console", "rich.table")


def test_offlab_starts_without_loading_the_machinery_of_its_commands():
    import subprocess
    import sys

    code = ("import sys\nsys.argv = ['offlab', '--version']\nfrom offlab.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint(' '.join(sorted(sys.modules)))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)  # timeout: a hang guard only
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("offlab 0"), res.stdout
    loaded = set(res.stdout.split("\n", 1)[1].split())
    assert "offlab.cli.lab" in loaded and "offlab.catalog" in loaded  # every command is registered
    heavy = sorted(m for m in loaded if m.startswith(HEAVY_AT_START))
    assert not heavy, f"`offlab --version` loaded {heavy}: import these inside the command that uses them"


# ---- stored samples are read as records --------------------------------------------------------------
# Where rows of Store.samples may stay rows: written out as they are stored (`results show --json/--csv`),
# merged store to store, or only counted (a fleet's import).
ROWS_AS_STORED = {"offlab/cli/results.py": "as stored, for --json/--csv", "offlab/fleet/__init__.py": "counted"}


def raw_sample_reads(source: str) -> list[int]:
    """Lines calling `<store>.samples(...)` whose result is not handed straight to `records(...)`."""
    wrapped = {id(n.args[0]) for n in _nodes(source) if isinstance(n, ast.Call) and
               getattr(n.func, "id", getattr(n.func, "attr", None)) == "records" and n.args}
    return sorted(n.lineno for n in _nodes(source) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr == "samples" and id(n) not in wrapped)


def test_stored_samples_are_read_as_records_above_the_store():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        if rel.startswith("offlab/store/") or rel in ROWS_AS_STORED:
            continue
        found += [f"{rel}:{line}" for line in raw_sample_reads(path.read_text())]
    assert not found, "stored samples read as rows (read them through offlab.sample.records):\n" + "\n".join(found)


@pytest.mark.parametrize("source, lines", [
    ("s = records(store.samples(1))\n", []),
    ("rows = store.samples(1)\nfor r in rows: r['sample']\n", [1]),
    ("x = [r['metrics'] for r in self.store.samples(run)]\n", [1]),
])
def test_the_sample_row_checker_finds_a_row_read_as_a_dict(source, lines):
    assert raw_sample_reads(source) == lines
