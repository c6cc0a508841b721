"""The root qdisc of an interface: `tc qdisc replace dev IF root KIND [ARGS]`.

Restore puts back exactly what `tc -j qdisc show dev IF` showed. A root qdisc the
kernel attached by itself (handle 0:, e.g. the `noqueue` of a veth) comes back
with `tc qdisc del dev IF root`, which lets the kernel attach its default again.
A configured root qdisc is rebuilt, handle included, for the kinds whose options
can be rebuilt exactly (below); any other one is left alone and the change
refused, since it could not be put back.
"""

from __future__ import annotations

import re
from typing import Any

from offlab.errors import BadInput
from offlab.knobs.base import Knob, Plan
from offlab.netdev import Qdisc as TcQdisc
from offlab.netdev import qdiscs

KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
ARG_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,32}$")
HANDLE_RE = re.compile(r"^[0-9a-f]{1,4}:$")


def _rebuild_args(q: dict) -> list[str] | None:
    """tc arguments that recreate a configured root qdisc exactly, or None if offlab cannot."""
    kind, opts = q["kind"], q.get("options", {})
    if kind in ("noqueue", "pfifo_fast", "mq"):
        return []
    if kind in ("pfifo", "bfifo") and isinstance(opts.get("limit"), int):
        return ["limit", str(opts["limit"])]
    return None


def parse_spec(label: str, value: Any) -> list[str]:
    if not isinstance(value, str):
        raise BadInput(f"{label}: expected a qdisc such as noqueue, pfifo_fast, fq or 'pfifo limit 100', got {value!r}")
    words = value.split()
    if not words or not KIND_RE.fullmatch(words[0]) or len(words) > 16 or not all(ARG_RE.fullmatch(w) for w in words[1:]):
        raise BadInput(f"{label}: invalid qdisc {value!r} (a kind like fq, then simple arguments)")
    return words


class Qdisc(Knob):
    kind = "qdisc"

    def _show(self) -> list[TcQdisc]:
        return [q for q in qdiscs(self.host, self.iface) if q.under_root]

    def check(self, value: Any, plan: Plan) -> str:
        words = parse_spec(self.label, value)
        if self.iface not in plan.links(self.target):
            raise BadInput(f"no interface {self.iface!r} in {self.target.where.split(':')[0]}")
        return " ".join(words)

    def snapshot(self) -> dict:
        tree = self._show()
        root = next((q for q in tree if q.root), None)
        return {"kind": root.kind if root else "noqueue", "handle": root.handle if root else "0:",
                "options": root.options if root else {},
                "children": [{"kind": q.kind, "handle": q.handle, "parent": q.parent}
                             for q in tree if not q.root and q.handle != "0:"]}

    def show(self, snap: dict) -> str:
        return snap["kind"]

    def satisfied(self, value: str, snap: dict) -> bool:
        return snap["kind"] == value.split()[0]

    def impossible(self, value: str, snap: dict) -> str | None:
        if snap["handle"] != "0:" and (_rebuild_args(snap) is None or snap["children"]):
            return (f"the root qdisc of {self.target.where} is a configured {snap['kind']} that offlab cannot "
                    f"rebuild exactly, so it leaves it alone — cannot test qdisc={value} here")
        return None

    def apply(self, value: str) -> None:
        self.host.run(["tc", "qdisc", "replace", "dev", self.iface, "root", *value.split()], timeout=10)

    def restore(self, snap: dict) -> None:
        now = self.snapshot()
        if self.same(now, snap):
            return
        if snap["handle"] == "0:":
            if now["handle"] != "0:":
                self.host.run(["tc", "qdisc", "del", "dev", self.iface, "root"], timeout=10)
            return
        handle = snap["handle"]
        if not HANDLE_RE.fullmatch(handle) or not KIND_RE.fullmatch(snap["kind"]):
            raise BadInput(f"invalid qdisc {snap['kind']!r} {handle!r} in journal")
        args = _rebuild_args(snap)
        if args is None:
            raise BadInput(f"cannot rebuild a {snap['kind']} root qdisc on {self.target.where}")
        if now["handle"] != "0:" and now["handle"] != handle:
            self.host.run(["tc", "qdisc", "del", "dev", self.iface, "root"], timeout=10)
        self.host.run(["tc", "qdisc", "replace", "dev", self.iface, "root", "handle", handle,
                       snap["kind"], *args], timeout=10)

    def same(self, a: dict, b: dict) -> bool:
        keys = ("kind", "handle", "options")
        return all(a.get(k) == b.get(k) for k in keys)
