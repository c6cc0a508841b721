"""The errors a user can cause, each mapped to an exit code by the CLI."""

from __future__ import annotations


class OfflabError(Exception):
    """Base of every error offlab reports to a person: one line, no traceback."""

    exit_code = 2


class BadInput(OfflabError):
    """Arguments, plan or names that are wrong: exit 2."""

    exit_code = 2


class EnvironmentProblem(OfflabError):
    """Something missing on the machine (root, a tool, a feature): exit 3."""

    exit_code = 3


class CannotTestHere(EnvironmentProblem):
    """This machine cannot run a setting a cell asks for (a kernel feature disabled or absent, e.g.
    io_uring with kernel.io_uring_disabled = 2): a run skips that cell as "cannot test here"."""


def shown(argv: list[str]) -> str:
    """A command as a message quotes it, on one line: a script passed as an argument (`sh -c '...'`)
    is named by its size, not printed."""
    return " ".join(f"<script of {a.count(chr(10)) + 1} lines>" if "\n" in a or len(a) > 200 else a for a in argv)


class CommandFailed(EnvironmentProblem):
    """A system command failed; carries its argv and stderr."""

    def __init__(self, argv: list[str], rc: int, stderr: str, where: str = "") -> None:
        self.argv = list(argv)
        self.rc = rc
        self.stderr = stderr.strip()
        loc = f" in {where}" if where else ""
        detail = self.stderr.splitlines()[-1] if self.stderr else f"exit code {rc}"
        super().__init__(f"`{shown(argv)}` failed{loc}: {detail}")


class CommandTimeout(EnvironmentProblem):
    def __init__(self, argv: list[str], timeout: float, where: str = "") -> None:
        self.argv = list(argv)
        loc = f" in {where}" if where else ""
        super().__init__(f"`{shown(argv)}` did not finish within {timeout:g} s{loc}")


class ToolMissing(EnvironmentProblem):
    def __init__(self, tool: str, package: str | None = None) -> None:
        self.tool = tool
        pkg = package or tool
        super().__init__(f"{tool} is not installed: run `apt-get install {pkg}` (or `make demo`)")


class NotRoot(EnvironmentProblem):
    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs root: run it as root (sudo offlab ...)")
