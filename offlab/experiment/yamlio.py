"""YAML for plans: YAML 1.2 booleans and the line of every value, for error messages.

PyYAML follows YAML 1.1, where `on`, `off`, `yes` and `no` are booleans; in a
plan about offloads `off:` is a name, so only `true`/`false` are booleans here.
"""

from __future__ import annotations

import re

import yaml

from offlab.errors import BadInput


class PlanLoader(yaml.SafeLoader):
    pass


# Replace the YAML 1.1 bool resolver by the YAML 1.2 one (true/false only).
PlanLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
PlanLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load(text: str, source: str) -> tuple[object, dict[tuple, int]]:
    """(data, {path tuple: line number}) — paths use keys and list indexes."""
    try:
        node = yaml.compose(text, Loader=PlanLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadInput(f"{where}: not valid YAML: {problem}") from None
    if node is None:
        raise BadInput(f"{source}: the plan is empty")
    lines: dict[tuple, int] = {}
    _walk(node, (), lines)
    data = yaml.load(text, Loader=PlanLoader)  # noqa: S506 - PlanLoader is a SafeLoader
    return data, lines


def _walk(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            _walk(value_node, path + (key,), lines)
            lines[path + (key,)] = key_node.start_mark.line + 1  # the key's line, not its value's
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), lines)


def _scalar(node: yaml.Node) -> object:
    """The Python value of a scalar key, resolved the way the plan loader resolves it."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    loader = PlanLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    """The line of `path`, or of its nearest ancestor that has one."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())
