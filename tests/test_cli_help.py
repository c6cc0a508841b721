"""`offlab … --help` of every command, read as on an 80-column terminal: plain text that fits, no word broken
at a hyphen, values named (NAME, --mtu MTU) rather than typed (<str>, {name}), a first paragraph that flows as
one, and one wording of --db."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from offlab.cli import app


def _commands(cmd, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out += _commands(sub, (*path, name))
    return out


COMMANDS = _commands(typer.main.get_command(app))


def test_every_command_is_walked():
    assert len(COMMANDS) > 30 and ("lab", "up") in COMMANDS and ("bisect",) in COMMANDS


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"},
                             terminal_width=80)
    assert res.exit_code == 0, res.output
    return res.output


# a Python type where a value's name belongs: <str>, <list[str]>, <path>; {lab} in a usage line
PYTHON_TYPE = re.compile(r"<(?:str|int|float|bool|path|file|list\[\w+\]|tuple\[[\w,]+\])>|\{[a-z_]+\}")


def broken_at_hyphens(text: str) -> list[str]:
    """The lines that end inside a hyphenated word (vm-|pair) whose rest starts the next line."""
    lines = text.splitlines()
    return [f"{a.strip()} / {b.strip()}" for a, b in zip(lines, lines[1:], strict=False)
            if re.search(r"\w-$", a) and re.match(r"\s*\w", b)]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "offlab")
def test_help_fits_80_columns_and_labels_no_flag_as_bool(path):
    text = _help(path)
    assert "<bool>" not in text
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, long
    assert text.startswith("Usage: ")
    assert not broken_at_hyphens(text)
    assert not PYTHON_TYPE.findall(text)


def test_the_hyphen_check_sees_a_broken_name():
    assert broken_at_hyphens("  veth | vm-\n  pair | dpdk") == ["veth | vm- / pair | dpdk"]
    assert not broken_at_hyphens("  a real name, to-<host>, or -\n  for sysctls")


def test_names_and_code_stay_whole_when_wrapped():
    from offlab.cli.console import wrap

    text = "vm, vm-router, vm-pair, ovs-dpdk: a plan's `topology: {qemu: \"7.2\"}` here  [default: none]"
    for width in range(24, 80):
        lines = wrap(text, width).splitlines()
        assert " ".join(" ".join(lines).split()) == " ".join(text.split())
        assert all(line.count("`") in (0, 2) for line in lines)
        assert all(line.count("[") == line.count("]") for line in lines)
        assert not any(line.endswith("-") for line in lines)


def test_every_db_option_says_the_same():
    """--db is one definition (offlab.cli.options): one wording in every command that takes it."""
    from offlab.cli.options import DB_HELP

    helps = {path: [p.help for p in cmd.params if "--db" in getattr(p, "opts", ())]
             for path, cmd in _walk(typer.main.get_command(app))}
    with_db = {path: h for path, h in helps.items() if h}
    assert len(with_db) >= 10 and ("results", "import") in with_db and ("fleet", "run") in with_db
    assert {h for hs in with_db.values() for h in hs} == {DB_HELP}


def _walk(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


@pytest.mark.parametrize("path, needs", [
    (("lab", "list"), ["--json  Print the labs as JSON."]),
    (("lab", "show"), ["NAME", "Lab name", "Print the lab as JSON."]),
    (("lab", "exec"), ["NAME", "HOST", "A host of the lab", "`offlab lab exec demo client -- ping 10.200.1.2`"]),
    (("suite", "show"), ["A built-in suite"]),
    (("suite", "run"), ["A built-in suite", "Print each run's summary as JSON."]),
])
def test_arguments_and_json_flags_say_what_they_are(path, needs):
    text = " ".join(_help(path).split())
    for want in needs:
        assert " ".join(want.split()) in text, (want, text)
