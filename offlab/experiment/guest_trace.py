"""offlab's hist triggers in each guest of a lab for one sample (`--trace`): set, then put back.

The triggers are a journalled setting of the guest (knobs/trace_hist.py) in a transaction of their
own: put back when the sample ends, on Ctrl-C/SIGTERM/SIGHUP, and by `offlab restore` after a kill -9.
What they count is read with the guest's counters by the probe session (probes/hist.py).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from offlab.errors import OfflabError
from offlab.knobs.trace_hist import KEY
from offlab.knobs.transaction import Change, Transaction


@contextlib.contextmanager
def triggers(lab, asked: bool) -> Iterator[dict[str, str | None] | None]:
    """role → None where the triggers are set in that guest, else why not (one line); None when not
    asked or the lab has no guest. An SSH host's kernel is not traced yet (docs/results.md)."""
    guests = {role: lab.host(role) for role in lab.hosts} if asked else {}
    guests = {role: h for role, h in guests.items() if not h.shares_kernel and h.kind == "guest"}
    if not guests:
        yield None
        return
    out: dict[str, str | None] = {}
    with Transaction("trace") as tx:
        for role, host in guests.items():
            try:
                done = tx.apply([Change(host, KEY, "on")])[0]
            except OfflabError as exc:
                out[role] = f"hist triggers could not be set: {exc}"
                continue
            out[role] = None if done.ok else f"hist triggers could not be set ({done.reason})"
        yield out
