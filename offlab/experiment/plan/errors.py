"""Plan errors as one line: `file:line: field: what is wrong`, with a did-you-mean."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from offlab.errors import BadInput
from offlab.experiment import yamlio


class PlanErrors:
    """Turns problems into one BadInput line naming the file, the line and the field."""

    def __init__(self, source: str, lines: dict[tuple, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: tuple, msg: str) -> None:
        line = yamlio.line_of(self.lines, path)
        where = f"{self.source}:{line}" if line else self.source
        field_name = ".".join(str(p) for p in path)
        raise BadInput(f"{where}: {field_name + ': ' if field_name and not msg.startswith(field_name) else ''}{msg}")

    def unknown(self, path: tuple, key: Any, allowed: set, what: str = "field") -> None:
        close = difflib.get_close_matches(str(key), sorted(map(str, allowed)), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        self.fail(path, f"unknown {what} {key!r}; {hint}allowed: {', '.join(sorted(map(str, allowed)))}")

    def model(self, model: type[BaseModel], data: Any, path: tuple, partial_keys: set | None = None):
        """`model(**data)`, or fail at the first field pydantic refuses (only `partial_keys` if given)."""
        if not isinstance(data, dict):
            self.fail(path, f"must be a mapping of {', '.join(model.model_fields)}")
        try:
            return model(**data)
        except ValidationError as exc:
            for e in exc.errors():
                loc = tuple(e["loc"])
                if partial_keys is not None and (not loc or loc[0] not in partial_keys):
                    continue
                if e["type"] == "extra_forbidden":
                    self.unknown(path + loc, loc[-1], set(model.model_fields))
                got = e.get("input")
                shown = "" if isinstance(got, dict) else f" (got {got!r})"
                self.fail(path + loc, f"{e['msg'].removeprefix('Value error, ')}{shown}")
            return None
