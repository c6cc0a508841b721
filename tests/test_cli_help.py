"""`offlab … --help` of every command, read as on an 80-column terminal: plain text that fits, flags without
a type label, a first paragraph that flows as one."""

from __future__ import annotations

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


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "offlab")
def test_help_fits_80_columns_and_labels_no_flag_as_bool(path):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"},
                             terminal_width=80)
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output
    long = [line for line in res.output.splitlines() if len(line) > 80]
    assert not long, long
    assert res.output.startswith("Usage: ")
