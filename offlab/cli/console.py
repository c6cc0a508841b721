"""One way to make a rich console: at least 120 columns, so tables are not cut when piped."""

from __future__ import annotations

from rich.console import Console

MIN_WIDTH = 120


def console(*, stderr: bool = False) -> Console:
    detected = Console(stderr=stderr).width
    return Console(stderr=stderr, width=max(detected, MIN_WIDTH), soft_wrap=stderr)
