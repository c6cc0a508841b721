"""YAML for plans: bounded, YAML 1.2 core types only, and the line of every value for error messages.

A plan comes from anyone, so the loader refuses before it spends: a file over
MAX_PLAN_BYTES is not read past the cap; aliases are counted as they would expand
(an alias bomb of a few hundred bytes is refused at MAX_NODES, without building
anything); only the plain types (map, list, str, int, float, true/false, null) are
accepted, so `!!python/...` and every other tag is refused; a key given twice is an
error, not "the last one wins". PyYAML follows YAML 1.1, where `on`, `off`, `yes`
and `no` are booleans; in a plan about offloads `off:` is a name, so only
`true`/`false` are booleans here, and dates stay strings.
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from offlab.errors import BadInput

MAX_PLAN_BYTES = 64 * 1024  # the built-in suites are under 8 KiB; PyYAML parses the cap in ~0.5 s
MAX_NODES = 20_000  # values after expanding aliases; the largest suite has a few hundred
MAX_DEPTH = 32  # nesting, aliases expanded; a plan is five levels deep

_CORE = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
_DROPPED_RESOLVERS = {_CORE + "bool", _CORE + "timestamp", _CORE + "value"}


class PlanLoader(yaml.SafeLoader):
    """A SafeLoader that sizes every node as it is composed (aliases included) and refuses tags."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._size: dict[int, tuple[int, int]] = {}  # id(node) → (expanded nodes, expanded depth)
        self._nodes: list[Node] = []  # keeps sized nodes alive, so their ids stay theirs
        self._open = 0  # nodes being composed around this one: PyYAML recurses, so refuse early

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            anchored = self.anchors.get(event.anchor)
            if anchored is not None and id(anchored) not in self._size:
                raise _Refused(event.start_mark, f"alias *{event.anchor} is used inside the value it names "
                                                 "(a recursive structure)")
            return super().compose_node(parent, index)  # sized already: the parent counts it again
        tag = getattr(event, "tag", None)
        if tag not in (None, "!") and tag not in ALLOWED_TAGS:
            raise _Refused(event.start_mark, f"tag {_short(tag)} is not allowed: a plan holds only mappings, "
                                             "lists, strings, numbers, true/false and null; no code runs from it")
        self._open += 1
        if self._open > MAX_DEPTH:
            raise _Refused(event.start_mark, f"nested more than {MAX_DEPTH} levels deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open -= 1
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        sizes = [self._size[id(c)] for c in children]
        count = 1 + sum(s[0] for s in sizes)
        depth = 1 + max((s[1] for s in sizes), default=0)
        if count > MAX_NODES:
            raise _Refused(node.start_mark, f"more than {MAX_NODES} values once aliases are expanded "
                                            "(an alias bomb?); a plan needs far fewer")
        if depth > MAX_DEPTH:
            raise _Refused(node.start_mark, f"nested more than {MAX_DEPTH} levels deep (aliases expanded)")
        self._size[id(node)] = (count, depth)
        self._nodes.append(node)
        return node


# Replace the YAML 1.1 bool resolver by the YAML 1.2 one (true/false only); no timestamps.
PlanLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in _DROPPED_RESOLVERS]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
PlanLoader.add_implicit_resolver(
    _CORE + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class _Refused(Exception):
    def __init__(self, mark: yaml.Mark, message: str) -> None:
        super().__init__(message)
        self.mark, self.message = mark, message


def read_text(path: str) -> str:
    """The text of a plan file: at most MAX_PLAN_BYTES, UTF-8; BadInput otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)  # never more: a huge file costs nothing
    except OSError as exc:
        raise BadInput(f"cannot read plan {path}: {exc.strerror}") from None
    if len(data) > MAX_PLAN_BYTES:
        raise BadInput(_too_big(path))
    return decode(data, path)


def decode(data: bytes, source: str) -> str:
    """UTF-8 bytes as text; BadInput naming the line and byte that are not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise BadInput(f"{source}:{line}: the plan is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                       f"{exc.start}): save it as UTF-8") from None
    return text.removeprefix("\ufeff")


def load(text: str, source: str) -> tuple[object, dict[tuple, int]]:
    """(data, {path tuple: line number}) — paths use keys and list indexes."""
    if len(text) > MAX_PLAN_BYTES:
        raise BadInput(_too_big(source))
    loader = None
    try:
        loader = PlanLoader(text)  # the reader refuses control characters here already
        node = loader.get_single_node()
        if node is None:
            raise BadInput(f"{source}: the plan is empty")
        lines: dict[tuple, int] = {}
        data = _build(loader, node, (), lines, source)
    except _Refused as exc:
        raise BadInput(f"{source}:{exc.mark.line + 1}: {exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise BadInput(f"{where}: not valid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text[:exc.position].count("\n") + 1 if isinstance(exc.position, int) else None
        where = f"{source}:{line}" if line else source
        raise BadInput(f"{where}: not valid YAML: character #x{exc.character:04x} is not allowed in YAML text"
                       if isinstance(exc.character, int) else f"{where}: not valid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines


def _build(loader: PlanLoader, node: Node, path: tuple, lines: dict[tuple, int], source: str) -> object:
    """Python data from a composed node, recording each path's line; aliases were bounded when composed."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, ScalarNode):
        if node.tag == _CORE + "merge":
            raise _Refused(node.start_mark, "merge keys (<<) are YAML 1.1: write the keys out "
                                            "(an alias such as *name may stand for a whole value)")
        return loader.construct_object(node)
    if isinstance(node, SequenceNode):
        return [_build(loader, item, path + (i,), lines, source) for i, item in enumerate(node.value)]
    out: dict = {}
    first: dict = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode):
            raise _Refused(key_node.start_mark, "a key must be a plain name or number, not a list or mapping")
        key = _build(loader, key_node, path + ("<key>",), {}, source)
        line = key_node.start_mark.line + 1
        if key in first:
            raise _Refused(key_node.start_mark, f"duplicate key {key!r} (first on line {first[key]}): "
                                                "a key may appear once per mapping")
        first[key] = line
        out[key] = _build(loader, value_node, path + (key,), lines, source)
        lines[path + (key,)] = line  # the key's line, not its value's
    return out


def _short(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


def _too_big(source: str) -> str:
    return (f"{source}: the plan is larger than {MAX_PLAN_BYTES // 1024} KiB; a plan is a few KiB of YAML "
            "(axes multiply, so a large matrix needs no large file)")


def line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    """The line of `path`, or of its nearest ancestor that has one."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())
