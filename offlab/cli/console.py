"""One way to make a rich console (at least 120 columns, so tables are not cut when piped) and one way to
make a command group."""

from __future__ import annotations

import os
import re
import textwrap
from typing import TYPE_CHECKING, Any

import typer
import typer.core

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


# ---- help text: how every command's --help is laid out ------------------------------------------

def _value_name(param: Any) -> str:
    """What a value is called in help: its metavar if it has one, else the last word of its long option's
    or argument's name in capitals (--kernel-version VERSION, lab show NAME), never a Python type."""
    if param.metavar:
        return param.metavar
    names = [o.lstrip("-") for o in param.opts if o.startswith("--")] or [param.name]
    label = re.split(r"[-_]", max(names, key=len))[-1].upper()
    return label + ("..." if param.nargs != 1 else "")


class _Wrapper(textwrap.TextWrapper):
    """Breaks lines only at spaces outside `code` and [brackets] (never inside a name such as vm-pair,
    a quoted command or "[default: none]"); a word longer than the line is left whole."""

    def __init__(self, width: int, **kw: Any) -> None:
        super().__init__(width, break_on_hyphens=False, break_long_words=False, replace_whitespace=False, **kw)

    def _split(self, text: str) -> list[str]:
        out: list[str] = []
        whole = False  # inside a `code` span or a [bracket]: the next chunk joins the last
        for chunk in super()._split(text):
            if whole:
                out[-1] += chunk
            else:
                out.append(chunk)
            last = out[-1]
            whole = last.count("`") % 2 == 1 or last.count("[") > last.count("]")
        return out


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> str:
    """`text` filled to `width`, paragraph by paragraph (split at blank lines, each joined into one)."""
    paragraphs = [" ".join(p.split("\n")) for p in text.expandtabs().strip("\n").split("\n\n")]
    filled = []
    for i, para in enumerate(paragraphs):
        lead = len(para) - len(para.lstrip())
        start = (first if first is not None and i == 0 else indent) + " " * lead
        filled.append(_Wrapper(width, initial_indent=start, subsequent_indent=indent + " " * lead)
                      .fill(para.lstrip()))
    return "\n\n".join(filled)


class HelpFormatter(typer.Context.formatter_class):  # type: ignore[valid-type,misc]  # click's, as typer ships it
    """Click's help layout (usage, text, two-column lists) wrapped by `wrap`."""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        prefix = "Usage: " if prefix is None else prefix
        lead = f"{prefix:>{self.current_indent}}{prog} "
        self.write(wrap(args, self.width - self.current_indent, " " * len(lead), lead) + "\n")

    def write_text(self, text: str) -> None:
        self.write(wrap(text, self.width, " " * self.current_indent) + "\n")

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max(len(name) for name, _ in rows), col_max) + col_spacing
        pad = " " * (first_col + self.current_indent)
        for name, text in rows:
            self.write(f"{'':>{self.current_indent}}{name}")
            if not text:
                self.write("\n")
                continue
            self.write(" " * (first_col - len(name)) if len(name) <= first_col - col_spacing else "\n" + pad)
            lines = wrap(text, max(self.width - first_col - 2, 10)).splitlines() or [""]
            self.write("\n".join([lines[0], *(pad + line if line else line for line in lines[1:])]) + "\n")


class HelpContext(typer.Context):
    formatter_class = HelpFormatter


class HelpCommand(typer.core.TyperCommand):
    """A command whose help names values (NAME, --mtu MTU) instead of Python types (<str>, {name})."""

    context_class = HelpContext

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = _value_name(param)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args, opts = [], []
        params: list[Any] = self.get_params(ctx)  # typer's: TyperArgument and TyperOption
        for param in params:
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            if param.param_type_name == "argument":
                args.append((_value_name(param), text))
            else:
                # typer ≥ 0.2x shows a type (<int>) where click showed a metavar: the value's name instead
                typed = hasattr(param, "display_type_rich") and not (param.is_flag or param.count)
                shown = param.display_type_rich(ctx) if typed else None
                opts.append((name.replace(f" {shown}", f" {_value_name(param)}") if shown else name, text))
        for heading, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)


class HelpGroup(typer.core.TyperGroup):
    context_class = HelpContext


class _Typer(typer.Typer):
    """A Typer app whose commands lay out their help as HelpCommand does."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or HelpCommand, **kwargs)


def command_group(help: str, **options: Any) -> typer.Typer:
    """A Typer app of offlab's: help text plain (a line break inside a first paragraph is a space, never a
    new line), shown when it is called without a command, laid out by HelpCommand and HelpGroup."""
    return _Typer(rich_markup_mode=None, help=help, no_args_is_help=True, cls=HelpGroup, **options)
