"""One way to make a rich console (at least 120 columns, so tables are not cut when piped) and one way to
make a command group."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

MIN_WIDTH = 120


def console(*, stderr: bool = False) -> Console:
    detected = Console(stderr=stderr).width
    return Console(stderr=stderr, width=max(detected, MIN_WIDTH), soft_wrap=stderr)


def command_group(help: str, **options: Any) -> typer.Typer:
    """A Typer app of offlab's: help text plain (a line break inside a first paragraph is a space, never a
    new line), shown when it is called without a command."""
    return typer.Typer(rich_markup_mode=None, help=help, no_args_is_help=True, **options)
