"""Values as the database holds them: timestamps as ISO 8601 text in UTC, JSON columns as compact text
without NaN or infinities, and a damaged JSON column as one line naming it."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

from offlab.errors import BadInput
from offlab.sample import JsonView


def now_utc() -> str:
    """ISO 8601 in UTC with milliseconds, e.g. 2024-05-01T12:00:00.123Z (SQLite's datetime() reads it)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (json_extract rejects them), tuples become lists, a sample's
    view (offlab.sample) its JSON."""
    if isinstance(obj, JsonView):
        return clean(obj.to_json())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(clean(obj), default=str, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | None, where: str = "a JSON column") -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{where} is damaged (not valid JSON: {exc}): inspect it with `sqlite3` or `psql`, or "
                       f"pass --db to another database") from None
