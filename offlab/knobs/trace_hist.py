"""offlab's hist triggers in a host's tracefs (probes/hist.py), as a journalled setting.

`--trace` on a lab with a guest or an SSH host sets `trace-hist=on` there in a transaction of its
own: the original (tracefs mounted or not, and this host's triggers there: none) is in the journal
before a trigger is written, and is put back when the sample ends, on Ctrl-C/SIGTERM/SIGHUP, and after
a kill -9 of the controller by `offlab restore` (or `lab down`, which takes a guest's kernel with it;
an SSH host's own restore.sh runs the same removal: knobs/undo.py): every trigger named
`offlab_<this host's tag>_*` removed, tracefs unmounted if offlab mounted it and no other host's
triggers are left in it (SSH stand-ins share one kernel). Not a plan setting.
"""

from __future__ import annotations

from typing import Any

from offlab.errors import BadInput
from offlab.knobs.base import Knob
from offlab import tracefs as hist
from offlab.wire import ETH_HEADER

KEY = "trace-hist"


class HistTriggers(Knob):
    kind = "trace-hist"
    needs_iface = False

    @classmethod
    def plan_value_problem(cls, key: str, value: Any) -> str | None:
        return f"{KEY} is offlab's own (set by --trace for the sample's window), not a plan setting"

    def check(self, value: Any, plan) -> str:
        if value != "on":
            raise BadInput(f"{KEY}: only on (offlab sets it for --trace; restore puts it back)")
        return "on"

    @property
    def tag(self) -> str:
        return hist.tag_of(self.host.key)

    def snapshot(self) -> dict:
        lines = self.host.run(hist.state_argv(self.tag), timeout=60).stdout.split("\n")
        return {"tracefs": (lines[0].strip() or "unmounted"),
                "triggers": sorted(l.strip() for l in lines[1:] if l.strip())}

    def show(self, snap: Any) -> str:
        if not isinstance(snap, dict):
            return str(snap)
        n = len(snap.get("triggers") or [])
        return f"{n} trigger(s) of offlab's" + ("" if snap.get("tracefs") == "mounted" else ", tracefs unmounted")

    def satisfied(self, value: str, snap: Any) -> bool:
        return isinstance(snap, dict) and len(snap.get("triggers") or []) == len(hist.triggers(1500 + ETH_HEADER, self.tag))

    def apply(self, value: str) -> None:
        mtu = self.host.run(["sh", "-c", hist.MTU_SH], timeout=60).stdout
        self.host.run(hist.install_argv(hist.triggers(hist.frame_max(mtu), self.tag), self.tag), timeout=60)

    def restore_argv(self, snap: Any) -> list[str]:
        """The one command that puts `snap` back (also in an SSH host's own restore.sh)."""
        mounted_before = isinstance(snap, dict) and snap.get("tracefs") == "mounted"
        return hist.remove_argv(unmount=not mounted_before, tag=self.tag)

    def restore(self, snap: Any) -> None:
        self.host.run(self.restore_argv(snap), timeout=60)

    def same(self, a: Any, b: Any) -> bool:
        return isinstance(a, dict) and isinstance(b, dict) and a.get("tracefs") == b.get("tracefs") \
            and a.get("triggers") == b.get("triggers")
