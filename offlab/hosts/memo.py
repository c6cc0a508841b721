"""What this process learned about a host that stays true while the host lives, kept for that life only.

A host with a kernel of its own (a guest, an SSH host) answers each question in a round trip (0.2-3 s
for a TCG guest under load), so what does not change while it lives (what a feature key resolves to,
its CPU count, its clock against this machine's, testpmd's answers) is asked once and kept in the
host's `Memo`. Hosts are values, rebuilt from their `ref()` wherever they are needed, so the memo is
found by the host's own `key`; it ends with the host's lab: removing a lab calls `Host.forget()` on
each of its hosts (lab.remove), which drops the memo (a guest also closes its channel, guest.py's
pool, kept by socket). A guest's key names its
life (QEMU pid and start time), so a new guest of the same lab name starts empty even where another
process removed the old one. Parts above `hosts` keep no cache of their own: what they learn about
a host goes here (tests/test_layering.py checks that no module above `hosts` fills a module-level dict).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

_MEMOS: dict[str, "Memo"] = {}
_LOCK = threading.Lock()


class Memo:
    """One host's facts, by a key the caller names (e.g. ("feature names", iface, key))."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            return self._values.get(key, default)

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._values[key] = value


def memo_of(key: str) -> Memo:
    """The memo of the host whose `Host.key` is `key` (a new, empty one if it has none)."""
    with _LOCK:
        memo = _MEMOS.get(key)
        if memo is None:
            memo = _MEMOS[key] = Memo()
        return memo


def drop(key: str) -> Memo | None:
    """End the memo of that host: the caller closes what it held (Host.forget)."""
    with _LOCK:
        return _MEMOS.pop(key, None)


def kept(key: str) -> bool:
    """Whether this process keeps a memo for that host (tests: a removed lab's hosts have none)."""
    with _LOCK:
        return key in _MEMOS
