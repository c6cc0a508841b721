"""A probe is one file: the probes of offlab/probes/edge/ are found there, one per module, and the
session, the result and the stored sample's views name none of them (docs/architecture.md)."""

from __future__ import annotations

import ast
import inspect
import json
import os
from pathlib import Path

from offlab.probes.base import Probe, found
from offlab.sample import JsonView, StoredSample

PACKAGE = Path(__file__).resolve().parent.parent / "offlab"
# the places a probe was once written into, field by field
SHARED = ("probes/session.py", "probes/result.py", "sample.py")
SAMPLES = Path(__file__).resolve().parent / "fixtures" / "samples"


def names_of(probe: type[Probe]) -> set[str]:
    """What would name this probe in shared code: its stored key, its module, its class and its views."""
    module = inspect.getmodule(probe)
    assert module is not None
    views = {c.__name__ for _, c in inspect.getmembers(module, inspect.isclass)
             if issubclass(c, JsonView) and c.__module__ == module.__name__}
    return {probe.key, module.__name__.rsplit(".", 1)[1], module.__name__, probe.__name__, *views}


def named(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every identifier, attribute, argument, keyword, imported module or string equal to
    one of `names`: a field, a branch or a key of that probe (prose in a docstring or a comment is not)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        words: list[str] = []
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            words = [node.arg]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = [node.value]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names), *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            words = [a.name for a in node.names]
        out += [(getattr(node, "lineno", 0), w) for w in words if w in names]
    return out


def test_every_module_of_the_edge_package_is_one_probe_with_its_key_and_view():
    probes = found()
    modules = sorted(p.name for p in (PACKAGE / "probes" / "edge").glob("*.py") if p.name != "__init__.py")
    assert sorted(f"{p.__module__.rsplit('.', 1)[1]}.py" for p in probes) == modules
    keys = [p.key for p in probes]
    assert len(set(keys)) == len(keys) and all(keys)
    for p in probes:
        assert "view" in p.stored.metadata or p.stored.default is not None or p.stored.default_factory is not None


def test_no_shared_module_names_a_probe_of_the_edge_package():
    problems = []
    for probe in found():
        names = names_of(probe)
        for rel in SHARED:
            problems += [f"offlab/{rel}:{line}: names {w!r} ({probe.__name__})"
                         for line, w in named((PACKAGE / rel).read_text(), names)]
    assert not problems, "a probe is one file (offlab/probes/edge/):\n" + "\n".join(problems)


def test_the_check_sees_a_probe_written_into_a_shared_module():
    names = {"qdisc", "Qdisc", "QdiscProbe"}
    assert [w for _, w in named("class S:\n    qdisc: dict = {}\n", names)] == ["qdisc"]
    assert [w for _, w in named("d = {'qdisc': 1}\n", names)] == ["qdisc"]
    assert [w for _, w in named("x = snap.qdisc\n", names)] == ["qdisc"]
    assert [w for _, w in named("R(qdisc=1)\n", names)] == ["qdisc"]
    assert [w for _, w in named("from offlab.probes.edge.qdisc import QdiscProbe\n", names)] == ["QdiscProbe"]
    assert named('"""How the qdisc counters are read."""\n# the qdisc\n', names) == []


def test_stored_samples_read_back_the_same_and_each_probe_reads_its_key_as_its_view():
    paths = sorted(SAMPLES.glob("*.json"))
    assert paths
    for path in paths:
        d = json.loads(path.read_text())
        if not isinstance(d, dict) or not isinstance(d.get("probes"), dict):
            continue
        s = StoredSample.from_json(d)
        assert json.dumps(s.to_json()) == json.dumps(d), os.fspath(path)
        for probe in found():
            got = s.probes.of(probe)
            if probe.key not in d["probes"]:
                continue
            view = probe.stored.metadata["view"]
            values = got.values() if probe.stored.metadata.get("map") else [got]
            assert all(isinstance(v, view) for v in values), (path.name, probe.key)
