"""Taking a lab down, the one way every caller does it (CLI, runner, fan-out, benchmarks, tests).

Three steps in order: settings journalled on interfaces that outlive the lab (an SSH host's, a phys
port's) go back; the lab is removed (`lab.remove`: daemons by pid, namespaces, run directory); the
journal forgets what was set inside the namespaces that went, since their kernel state went with them.
`lab` may not import `knobs`, so the step that needs both lives here, and is called, never hooked.
"""

from __future__ import annotations

from offlab import lab as labs
from offlab.errors import BadInput, EnvironmentProblem, OfflabError
from offlab.knobs import forget_lab_namespaces
from offlab.knobs.restore import restore_lab


def _put_back(lab: labs.LabState) -> list[str]:
    report = restore_lab(lab.name)
    if report.failed:
        raise EnvironmentProblem(f"lab down {lab.name}: {report.failed[0]} (the journal is kept: "
                                 f"`offlab restore` retries once the host answers)")
    return [line.replace("restored ", "journalled setting, put back: ", 1) for line in report.lines]


def down(name: str, *, force: bool = False) -> list[str]:
    """Restore, remove, forget (see the module's docstring); idempotent; returns a line per thing done."""
    removal = labs.remove(name, force=force, put_back=_put_back)
    return removal.lines + forget_lab_namespaces(removal.namespaces)


def down_all(*, force: bool = False) -> list[str]:
    """Every lab with a state file here; one in use (unless `force`) or unreadable does not keep the others."""
    removed: list[str] = []
    refused: list[OfflabError] = []
    for name in labs.state_names():
        try:
            removed += down(name, force=force)
        except OfflabError as exc:
            refused.append(exc)
    if refused:
        text = "; ".join(str(e) for e in refused) + (f" ({len(removed)} other item(s) removed)" if removed else "")
        raise (EnvironmentProblem if any(e.exit_code == 3 for e in refused) else BadInput)(text)
    return removed
