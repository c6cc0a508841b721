"""Did each setting a sample ran with do anything? One effect witness per setting, from the window's counters.

A setting can read back "on" and change nothing: testpmd's GRO outside its csum forwarding engine,
TSO on a tap the kernel never hands a super-packet, jumbo MTU on one hop of a 1500 path. Each
witness compares the counters over the sample's window with what the setting should produce
for that workload, and says one of:

- `exercised`: the counters show the setting's effect (e.g. 0.073 packets out per packet in);
- `set but not exercised`: it should have shown and did not; `cause` names the likely reason;
- `not applicable`: this workload or path cannot show it either way (UDP datagrams sent one by one
  cannot be segmented; GRO → GSO back to the input's size leaves the packet count unchanged);
- `off`: a setting turned off, recorded with its counters and not judged.

A witness is one module of this package, found by what it witnesses: a module with `covers(key)` and
`judge(setting, sample)` witnesses the settings whose key it covers; a module with `judge_sample(sample)`
witnesses something every stream sample carries (testpmd's own settings, the workload's socket
options, zero-copy sends). Modules whose name starts with "_" hold what several witnesses share. Each
witness is a pure function of the typed sample (offlab.sample.StoredSample), tested on numbers from
real captured samples; a new witness is a new file here and its test.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import partial
from types import ModuleType
from typing import Callable, Sequence

from offlab.metrics import NOT_EXERCISED  # noqa: F401  (a status, named here with the others)
from offlab.sample import Effect, Held, StoredSample

EXERCISED = "exercised"
NOT_APPLICABLE = "not applicable"
OFF = "off"
UNREADABLE = "witness could not read its counters"  # the cause of a witness whose sample lacks a counter

# Fewer packets than this in the data direction say nothing (ARP, a handshake): not applicable.
MIN_PACKETS = 100
# A merge shows when at most this fraction of the packets that would leave without it leaves;
# a split when at least this factor more leave (testpmd GRO into a vhost guest: 0.073; re-segmenting
# 1448 B payloads at 1348 B: 2.00 without GRO, 1.15 with it).
MERGED_BELOW = 0.75
SPLIT_ABOVE = 1.05


def parts(setting: Held) -> tuple[str, str, str]:
    """A setting's key, value and place, as text: what every witness compares."""
    return str(setting.key), str(setting.value), str(setting.where or "")


def on(value: object) -> bool:
    return str(value).strip().lower() in ("on", "true", "1", "yes")


# ---- the witnesses, found by what they witness ------------------------------------------------------

def _modules() -> list[ModuleType]:
    """Every witness module of this package, imported at first use (nothing registers itself)."""
    global _found
    if _found is None:
        _found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_")]
    return _found


_found: list[ModuleType] | None = None


def witness_of(key: str) -> ModuleType | None:
    """The module that witnesses setting `key`; None for a setting without a witness."""
    return next((m for m in _modules() if hasattr(m, "covers") and m.covers(key)), None)


def needs_queues(key: str) -> bool:
    """A setting whose witness needs the per-queue packets (the probes read them only then)."""
    m = witness_of(key)
    return bool(m is not None and getattr(m, "NEEDS_QUEUES", False))


def _judge_one(m: ModuleType, setting: Held, sample: StoredSample) -> list[Effect]:
    return [m.judge(setting, sample)]


def witness(sample: StoredSample, settings: Sequence[Held]) -> list[Effect]:
    """Every effect witness of a stream sample: the sample-wide ones (testpmd's, from its own read of
    what was in force; the workload's socket options; zero-copy sends), and each setting in `settings`
    (the cell's settings in force, or the lab's journalled ones) that has a witness. A witness that
    cannot read the counters it needs (a sample stored before they were kept) says so as `not
    applicable`, with why, and never costs the sample; any other error in a witness is a bug and is
    raised."""
    if sample.workload.kind == "rr":
        return []
    out: list[Effect] = []
    steps: list[tuple[str, Callable[[], list[Effect]]]] = [
        (m.__name__.rsplit(".", 1)[1], partial(m.judge_sample, sample)) for m in _modules() if hasattr(m, "judge_sample")]
    for s in settings:
        key = str(s.key or "")
        m = witness_of(key)
        if m is not None:
            steps.append((key, partial(_judge_one, m, s, sample)))
    for name, step in steps:
        try:
            out += step()
        except KeyError as exc:
            out.append(Effect(setting=name, where="?", value="?", status=NOT_APPLICABLE,
                              detail="the counters this witness reads are not all there",
                              cause=f"{UNREADABLE}: KeyError: {exc}"))
    return out
