"""One way to make a rich console (at least 120 columns, so tables are not cut when piped) and one way to
make a command group."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

MIN_WIDTH = 120


def console(*, stderr: bool = False) -> Console:
    from rich.console import Console  # here: rich's console is a good part of every command's start

    detected = Console(stderr=stderr).width
    return Console(stderr=stderr, width=max(detected, MIN_WIDTH), soft_wrap=stderr)


class OnFirstUse:
    """A command module's console, made when a command first prints (so `offlab --version` and the other
    commands never pay for it); made again when COLUMNS changed, as between two commands run in one
    process (the tests' in-process runner), since a console keeps the width it was made with."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None
        self._columns: str | None = None

    def made(self) -> Console:
        """The console itself (rich's Progress wants one, not a stand-in)."""
        columns = os.environ.get("COLUMNS")
        if self._console is None or columns != self._columns:
            self._console, self._columns = console(stderr=self._stderr), columns
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)


def command_group(help: str, **options: Any) -> typer.Typer:
    """A Typer app of offlab's: help text plain (a line break inside a first paragraph is a space, never a
    new line), shown when it is called without a command."""
    return typer.Typer(rich_markup_mode=None, help=help, no_args_is_help=True, **options)
