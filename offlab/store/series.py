"""A sample's per-interval series, stored as rows of sample_series (one per interval, a column per
figure) rather than inside the sample's JSON: split out when a sample is written, joined back when
it is read."""

from __future__ import annotations

import copy
from typing import Iterator

from offlab.store.codec import clean
from offlab.store.schema import SERIES_VALUES


def series_holders(sample: dict | None, depth: int = 3) -> Iterator[tuple[str, dict]]:
    """(dotted part, dict) for every dict with a `series` list within `depth` levels of the sample:
    ("traffic", sample["traffic"]), ("rr.loaded", sample["rr"]["loaded"]), ..."""
    if not isinstance(sample, dict) or depth == 0:
        return
    for key, sub in sample.items():
        if isinstance(sub, dict):
            if isinstance(sub.get("series"), list):
                yield str(key), sub
            for part, inner in series_holders(sub, depth - 1):
                yield f"{key}.{part}", inner


def split_series(sample: dict) -> tuple[dict, list[tuple[str, dict]]]:
    """A copy of the sample without its series' rows (each series keeps its header and `rows_in`), and
    (part, series) for every series in it."""
    found: list[tuple[str, dict]] = []
    out = copy.deepcopy(sample)
    for part, holder in series_holders(out):
        headers = []
        for s in holder["series"]:
            if isinstance(s, dict) and isinstance(s.get("rows"), list):
                found.append((part, s))
                headers.append({k: v for k, v in s.items() if k != "rows"} | {"rows_in": "sample_series"})
            else:
                headers.append(s)
        holder["series"] = headers
    return out, found


def series_rows(sample_id: int, cell_id: int, run_id: int, part: str, s: dict) -> list[tuple]:
    """The sample_series rows of one series, in SERIES_VALUES' column order."""
    cols = list(s.get("columns") or [])
    if "t_s" not in cols:
        return []
    idx = {c: cols.index(c) for c in cols}
    rows = []
    for i, r in enumerate(s["rows"]):
        vals = []
        for name in SERIES_VALUES:
            v = r[idx[name]] if name in idx and idx[name] < len(r) else None
            vals.append(int(bool(v)) if name == "warmup" else clean(v))
        rows.append((sample_id, cell_id, run_id, part, str(s.get("source") or "?"), i, r[idx["t_s"]], *vals))
    return rows


def join_series(sample: dict | None, rows: dict[tuple[str, str], list[dict]]) -> None:
    """Puts the rows of sample_series back into the series headers the sample kept."""
    for part, holder in list(series_holders(sample)):
        for s in holder["series"]:
            if isinstance(s, dict) and s.pop("rows_in", None) == "sample_series":
                cols = s.get("columns") or []
                s["rows"] = [[d.get(c) for c in cols] for d in rows.get((part, str(s.get("source") or "?")), [])]
