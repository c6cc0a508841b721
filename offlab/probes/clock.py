"""A channel host's clock against this machine's: when its counters were read, on this machine's clock.

A host with a kernel of its own (a guest, an SSH host) reads its counters some time between offlab
sending the request and the answer (a round trip: 1-2.5 s under TCG on a loaded machine). Each
answer starts with the host's own clock (/proc/uptime), and every exchange (sent, its clock,
answered) bounds the offset of its clock from this machine's monotonic clock; the tightest bounds
narrow when the counters were read (`read_instant`, `read_times`; docs/results.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from offlab.errors import OfflabError
from offlab.hosts import Host
from offlab.sample import Read

if TYPE_CHECKING:
    from offlab.probes.session import Snapshot

Exchange = tuple[float, float, float]  # (sent, the host's clock, answered), on this machine's monotonic clock

CLOCK_EXCHANGES = 3
UPTIME_STEP_S = 0.01  # /proc/uptime prints hundredths

# A channel host's exchanges stay good for a while: its clock and this machine's tick at the same rate,
# and exchanges that disagree (a reboot, a jump) make clock_offset claim nothing. So a new session
# of the same host (a guest's pid and start time, an SSH host's address) adds one exchange to those
# of the last CLOCK_KEEP_S instead of three: two round trips less before every sample in a guest.
# They outlive the probe session (one per sample) on purpose, so they are kept in the host's memo,
# which ends with the host's lab (hosts/memo.py): a lab built again under the same name starts afresh.
CLOCK_KEEP_S = 300.0
CLOCK_KEEP_MAX = 32


def kept_exchanges(host: Host) -> list[Exchange]:
    """The host's exchanges of earlier sessions, those of the last CLOCK_KEEP_S."""
    now = time.monotonic()
    return [e for e in host.memo.get("clock exchanges", []) if now - e[0] < CLOCK_KEEP_S]


def keep_exchanges(host: Host, exchanges: list[Exchange]) -> None:
    host.memo.put("clock exchanges", sorted(set(exchanges))[-CLOCK_KEEP_MAX:])


class Clocks:
    """The exchanges of one probe session with each channel host: those kept from its earlier sessions,
    a few fresh ones before the traffic (`exchange`), one per snapshot (`add`); `keep` at the end."""

    def __init__(self, hosts: dict[str, Host]) -> None:
        self.hosts = hosts
        # role → (sent, its clock, answered) of every exchange with a channel host: together they pin
        # its clock against this machine's (see read_times).
        self.exchanges: dict[str, list[Exchange]] = {role: kept_exchanges(h) for role, h in hosts.items()}

    def needed(self, role: str) -> int:
        """Fresh exchanges to make before the traffic: one where enough are kept, else CLOCK_EXCHANGES."""
        return 1 if len(self.exchanges[role]) >= CLOCK_EXCHANGES else CLOCK_EXCHANGES

    def exchange(self, role: str, read_clock: Callable[[str], str], count: int | None = None) -> None:
        """A few reads of the host's clock before the traffic: the quickest answers bound its offset."""
        for _ in range(count or CLOCK_EXCHANGES):
            t0 = time.monotonic()
            try:
                up = read_clock(role).split()
            except (OfflabError, OSError):
                return
            if up and is_number(up[0]):
                self.exchanges[role].append((t0, float(up[0]), time.monotonic()))

    def add(self, role: str, sent: float, clock: float, answered: float) -> None:
        self.exchanges.setdefault(role, []).append((sent, clock, answered))

    def keep(self) -> None:
        """Leave this session's exchanges to the host's next session (its memo)."""
        for role, host in self.hosts.items():
            keep_exchanges(host, self.exchanges.get(role, []))


def clock_offset(exchanges: list[Exchange]) -> tuple[float, float] | None:
    """Bounds of (host clock − this machine's monotonic clock) from exchanges (sent, clock, answered):
    each says the clock was read in between, so every one bounds the offset; the tightest win."""
    if not exchanges:
        return None
    low = max(u - t1 for t0, u, t1 in exchanges)
    high = min(u + UPTIME_STEP_S - t0 for t0, u, t1 in exchanges)
    return (low, high) if low <= high else None  # clocks that disagree with themselves: no claim


def read_instant(sent: float, answered: float, clock: float | None, offset) -> tuple[float, float]:
    """When a host's counters were read, on this machine's clock: between sending and answer, narrowed
    by the host's own clock reading (taken by the same process just before) where its offset is known."""
    if clock is None or offset is None:
        return sent, answered
    low, high = max(sent, clock - offset[1]), min(answered, clock + UPTIME_STEP_S - offset[0])
    return (low, high) if low <= high else (sent, answered)


def read_times(a: Snapshot, b: Snapshot, exchanges: dict | None = None) -> dict[str, Read]:
    """role → when its counters were read ([earliest, latest] at `start` and `end`), in seconds from
    the window's reference instants (a.t, b.t) on this machine's clock; for a channel host also
    `own_window_s`, the window between its two reads on its own clock, and `clock_offset_s`, the bounds
    of its clock (/proc/uptime) minus this machine's monotonic clock."""
    out: dict[str, Read] = {}
    for role in a.reads.keys() & b.reads.keys():
        offset = clock_offset((exchanges or {}).get(role, []))
        ra = read_instant(*a.reads[role], a.clocks.get(role), offset)
        rb = read_instant(*b.reads[role], b.clocks.get(role), offset)
        read: dict[str, Any] = {"start": [round(x - a.t, 6) for x in ra], "end": [round(x - b.t, 6) for x in rb]}
        if offset is not None:
            read["clock_offset_s"] = [round(x, 6) for x in offset]  # its clock − this machine's, bounds
        if role in a.clocks and role in b.clocks:
            read["own_window_s"] = round(b.clocks[role] - a.clocks[role], 3)
            read["answered_s"] = [round(a.reads[role][1] - a.t, 3), round(b.reads[role][1] - b.t, 3)]
        out[role] = Read.keyed(**read)
    return out


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
