"""`tc [-s] -j qdisc show` output → typed records. Pure: nothing here runs a command.

The argv is `TC_QDISC_SHOW` in offlab.hosts (a guest's agent answers it from its own rtnetlink dump,
in the same JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# ingress / clsact hang off these parents, not under the root
SPECIAL_PARENTS = ("ffff:fff1", "ffff:fff2", "ffff:fff3")
MQ_CHILD = re.compile(r"^:[0-9a-f]+$")  # a child of the root's class N: an mq's transmit queue N − 1


@dataclass(frozen=True)
class Qdisc:
    dev: str  # "" where the output names none (`show dev IF` leaves it out)
    kind: str
    handle: str = "0:"  # 0: for one the kernel attached by itself
    parent: str | None = None  # None for the root
    root: bool = False
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    packets: int = 0  # the counters, with -s (0 without)
    bytes: int = 0
    drops: int = 0
    overlimits: int = 0
    requeues: int = 0

    @property
    def tx_queue(self) -> int | None:
        """The transmit queue an mq root's child serves (parent `:N` is queue N − 1), else None."""
        return int(self.parent[1:], 16) - 1 if self.parent and MQ_CHILD.match(self.parent) else None

    @property
    def under_root(self) -> bool:
        """Part of the root's tree (not an ingress or clsact qdisc)."""
        return self.parent not in SPECIAL_PARENTS


def parse_qdiscs(text: str, dev: str = "") -> list[Qdisc]:
    """`tc [-s] -j qdisc show [dev IF]` → its qdiscs (`dev`: the IF asked for, which tc leaves out of
    each row then); none for text that is no JSON list."""
    try:
        rows = json.loads(text or "[]")
    except ValueError:
        return []
    out = []
    for q in rows if isinstance(rows, list) else []:
        if not isinstance(q, dict) or not q.get("kind"):
            continue
        out.append(Qdisc(str(q.get("dev") or dev), str(q["kind"]), str(q.get("handle") or "0:"),
                         str(q["parent"]) if q.get("parent") else None, bool(q.get("root")),
                         dict(q.get("options") or {}),
                         *(int(q.get(k) or 0) for k in ("packets", "bytes", "drops", "overlimits", "requeues"))))
    return out
