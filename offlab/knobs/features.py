"""ethtool features (offloads), by kernel name or by the short names people type.

`ethtool --json -k` shows most features by kernel name, but the legacy ones with
a single kernel feature under their long name (`generic-receive-offload` is
`rx-gro`) and groups (`tx-checksumming`) as a header over their members. Here
everything is brought back to kernel "leaf" features; a key names one leaf or a
group of them, `ethtool -K` is given leaves, and restore puts back each leaf's
*requested* bit, from which the kernel derives the active state again (turning
`tx` off leaves TSO requested-on, so `tx on` brings TSO back by itself).
"""

from __future__ import annotations

import contextlib
import difflib
import threading
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from typing import Any, Iterator

from offlab import netdev
from offlab.errors import BadInput, CommandFailed
# the names: one table for knobs, labs and the effect witnesses (re-exported here for the knobs' callers)
from offlab.feature_names import ALIASES, LEGACY, LONG_TO_KERNEL, LONG_TO_SHORT, names_for  # noqa: F401
from offlab.knobs.base import Knob, Plan, as_bool, onoff

# Why the kernel may keep a feature off: what it needs (netdev_fix_features and friends).
NEEDS: list[tuple[str, list[str]]] = [
    ("tx-tcp*-segmentation", ["tx", "sg"]),
    ("tx-udp-segmentation", ["tx", "sg"]),
    ("tx-generic-segmentation", ["sg"]),
    ("tx-*-segmentation", ["sg"]),
    ("tx-gso-list", ["sg"]),
    ("rx-gro-hw", ["rx"]),
]


# Inside shared_reads(): each interface's features read once, for a pass that only reads.
_SHARED = threading.local()


@contextlib.contextmanager
def shared_reads() -> Iterator[None]:
    """Read each interface's features at most once inside (for many knobs read back together, e.g.
    the settings in force at the end of a sample); a feature written inside reads its device anew."""
    outer = getattr(_SHARED, "memo", None)
    _SHARED.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _SHARED.memo = outer


def shared_memo() -> dict | None:
    """Inside shared_reads(), the memo other per-interface reads may keep their results in (keys of
    their own); None outside."""
    return getattr(_SHARED, "memo", None)


def forget_reads() -> None:
    """Inside shared_reads(), after a write: every device is read anew (a bridge's features follow
    its ports', and other settings can move features)."""
    memo = getattr(_SHARED, "memo", None)
    if memo is not None:
        memo.clear()


def leaves(host, iface: str) -> dict[str, netdev.Feature]:
    """Every kernel feature of `iface` → its state (group headers dropped)."""
    memo = getattr(_SHARED, "memo", None)
    key = (type(host).__name__, host.name, iface)
    if memo is not None and key in memo:
        return memo[key]
    out = {}
    for name, feat in netdev.features(host, iface).items():
        if feat.requested is None:
            continue  # a group header such as tx-checksumming: its members follow
        out[LONG_TO_KERNEL.get(name, name)] = feat
    if memo is not None:
        memo[key] = out
    return out


def kernel_pattern(key: str) -> str:
    """The kernel feature name, or the pattern of a legacy group, that a key (an alias, a short or
    long ethtool name) stands for, before any device is read."""
    name = ALIASES.get(key, key)
    name = LONG_TO_SHORT.get(name, name)
    return LEGACY[name][1] if name in LEGACY else name


def resolve(key: str, feats: dict[str, netdev.Feature], where: str) -> list[str]:
    """Kernel features a key stands for on this device; BadInput with close names if none."""
    name = ALIASES.get(key, key)
    name = LONG_TO_SHORT.get(name, name)
    pattern = kernel_pattern(key)
    if "*" in pattern:
        found = [f for f in feats if fnmatchcase(f, pattern)]
        if not found and LEGACY[name][0] in feats:  # a group with a single member is shown by its long name
            found = [LEGACY[name][0]]
    else:
        found = [pattern] if pattern in feats else []
    if found:
        return found
    known = sorted({*LEGACY, *ALIASES, *LONG_TO_SHORT, *feats})
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `ethtool -k` lists the features"
    raise BadInput(f"unknown feature {key!r} on {where}{hint}")


def state(names: list[str], snap: dict[str, list]) -> str:
    """on / off / mixed over the members that can change (all members if none can)."""
    free = [n for n in names if not snap[n][2]] or names
    active = [n for n in free if snap[n][0]]
    if len(active) == len(free):
        return "on"
    if not active:
        return "off"
    return "mixed (" + ", ".join(f"{n} {onoff(snap[n][0])}" for n in free) + ")"


@cache
def kernel_features() -> frozenset[str]:
    """Every feature name `ethtool -k` shows on the kernels offlab knows (kernel_features.txt), for plans."""
    return frozenset(resources.files("offlab.knobs").joinpath("kernel_features.txt").read_text().split())


class Feature(Knob):
    """One feature or a group of them (`tx`, `tso`, `sg`) on one interface."""

    kind = "feature"

    def __init__(self, target, key: str) -> None:
        super().__init__(target, key)
        self._names: list[str] | None = None
        self._read: dict[str, netdev.Feature] | None = None  # the device's features as snapshot() last read them
        self._fixed: dict[str, bool] | None = None  # which are [fixed], from that read, until a write uses it
        self._sides: list[dict[str, netdev.Feature]] = []  # the last two reads side_state used

    @property
    def names(self) -> list[str]:
        if self._names is None:
            host = self.host
            # What a key resolves to on a host with a kernel of its own (a guest, an SSH host), where
            # each `ethtool -k` is a round trip (0.2-3 s for a TCG guest under load here), is kept in
            # the host's memo: a device's feature names do not change while its host lives, and the
            # memo ends with the host's lab (hosts/memo.py). Here, reading them again is cheap.
            memo = None if host.shares_kernel else host.memo
            names = memo.get(("feature names", self.iface, self.key)) if memo is not None else None
            if names is None:
                names = resolve(self.key, leaves(host, self.iface), self.target.where)
                if memo is not None:
                    memo.put(("feature names", self.iface, self.key), names)
            self._names = list(names)
        return self._names

    @classmethod
    def plan_value_problem(cls, key: str, value: Any) -> str | None:
        known = kernel_features() | set(LEGACY) | set(ALIASES) | set(LONG_TO_SHORT)
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=3, cutoff=0.6)
            return f"unknown feature {key!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                 "; `ethtool -k` lists the features")
        if not (isinstance(value, bool) or value in ("on", "off")):
            return f"feature {key} must be on or off, got {value!r}"
        return None

    def check(self, value: Any, plan: Plan) -> str:
        flag = as_bool(f"{self.label}", value)
        self.names  # noqa: B018 - resolves the name now, so an unknown one fails validation
        return onoff(flag)

    def snapshot(self) -> dict[str, list]:
        feats = self._read = leaves(self.host, self.iface)
        self._fixed = {n: f.fixed for n, f in feats.items()}
        return {n: [feats[n].active, bool(feats[n].requested), feats[n].fixed] for n in self.names}

    def show(self, snap: dict[str, list]) -> str:
        names = list(snap)
        text = state(names, snap)
        return text + (" [fixed]" if all(snap[n][2] for n in names) else "")

    def satisfied(self, value: str, snap: dict[str, list]) -> bool:
        return state(list(snap), snap) == value

    def impossible(self, value: str, snap: dict[str, list]) -> str | None:
        if all(v[2] for v in snap.values()) and state(list(snap), snap) != value:
            return (f"{self.key} is {self.show(snap)} on {self.target.where}: the driver does not let it "
                    f"change — cannot test {self.key}={value} here")
        return None

    def apply(self, value: str) -> None:
        want = value == "on"
        self._ethtool({n: want for n in self.names})

    def restore(self, snap: dict[str, list]) -> None:
        self._names = list(snap)  # exactly the features the journal holds, however the key resolves now
        now = self.snapshot()
        self._ethtool({n: v[1] for n, v in snap.items() if not v[2] and now[n][1] != v[1]})

    def _ethtool(self, wanted: dict[str, bool]) -> None:
        self._read = None  # whatever was read before no longer holds
        # [fixed] from the read just made before this write (apply and restore read first), else now
        fixed, self._fixed = self._fixed, None
        if fixed is None or not all(n in fixed for n in wanted):
            fixed = {n: f.fixed for n, f in leaves(self.host, self.iface).items()}
        args = [a for n, on in wanted.items() if not fixed[n] for a in (n, onoff(on))]
        if not args:
            return
        forget_reads()
        res = self.host.run(["ethtool", "-K", self.iface, *args], check=False, timeout=10)
        if not res.ok and "Could not change any device features" not in res.stderr:
            raise CommandFailed(res.argv, res.rc, res.stderr, self.host.name)
        # "could not change" means a dependency kept it: the read-back says which and why

    def same(self, a: dict, b: dict) -> bool:
        return all(n in b and a[n][:2] == b[n][:2] for n in a)

    def explain(self, value: str, before: dict, after: dict) -> str:
        kept = [n for n, v in after.items() if not v[2] and onoff(v[0]) != value]
        fixed = [n for n, v in after.items() if v[2] and onoff(v[0]) != value]
        parts = []
        if kept:
            parts.append(f"the kernel kept {', '.join(kept)} {onoff(not (value == 'on'))} although "
                         f"requested {value}{self._needs_hint(kept, value)}")
        if fixed:
            parts.append(f"{', '.join(fixed)} {'is' if len(fixed) == 1 else 'are'} [fixed]")
        return f"{self.label}: " + "; ".join(parts) + f" — cannot test {self.key}={value} here"

    def _needs_hint(self, kept: list[str], value: str) -> str:
        if value != "on":
            return " (the driver or a device it depends on forces it on)"
        feats = leaves(self.host, self.iface)
        off = []
        for pattern, needs in NEEDS:
            if any(fnmatchcase(n, pattern) for n in kept):
                for short in needs:
                    members = [f for f in feats if fnmatchcase(f, LEGACY[short][1])]
                    if members and not any(feats[m].active for m in members) and short not in off:
                        off.append(short)
                break
        if off:
            return " (it needs " + " and ".join(f"{s} ({LEGACY[s][0]})" for s in off) + ", which is off)"
        return " (the driver or a device it depends on, e.g. a bridge's ports, does not allow it)"

    def side_state(self) -> dict[str, str]:
        """The other features, from the read snapshot() just made (a transaction asks for both
        together, before and after a change), else read now."""
        own = set(self.names)
        feats, self._read = self._read, None
        if feats is None:
            feats = leaves(self.host, self.iface)
        self._sides = [*self._sides[-1:], feats]
        return {n: onoff(f.active) for n, f in feats.items() if n not in own}

    def side_reasons(self, changed: list[str]) -> dict[str, str]:
        """A feature the kernel took along: the one it needs that went off (or came back on)."""
        if len(self._sides) < 2:
            return {}
        before, after = (netdev.held_off(s) for s in self._sides)
        out = {}
        for name in changed:
            if name in after:
                out[name] = after[name]
            elif name in before:
                out[name] = before[name].replace(", which is off", ", which is on again")
        return out
