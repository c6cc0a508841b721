"""What the probes found over one window: the door between `probes` and the sample that stores it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offlab.sample import (Aligned, Counters, CpuAccount, Iface, LocalSampling, Probes, Process, Read, TestpmdSettings,
                           TraceAccount)


@dataclass
class ProbeResult:
    """The deltas of one probe session's window (`ProbeSession.result`), and what `measure` reads
    beside it (the MTUs, testpmd's own settings), each as the record a sample stores: `stored()`
    gives the sample's `probes`, with the keys, their order and their values samples had before
    this class (docs/results.md)."""

    window_s: float  # between the two snapshots, on this machine's monotonic clock
    # the window's start on this machine's CLOCK_MONOTONIC: a tool's series that carries its own
    # start on that clock (the engine's) is cut to the window with it (witnesses.window_loss)
    t0_mono_s: float
    reads: dict[str, Read]  # role → when its counters were read (clock.read_times)
    cpu: CpuAccount
    processes: list[Process]  # the processes that used CPU
    interfaces: dict[str, Iface]  # "role:iface" → counter deltas and average sizes
    snmp: dict[str, Counters]  # role → protocol → counter delta
    # the local roles' UDP/IP counters over the channel hosts' own windows (ProbeSession.aligned)
    aligned: Aligned | None = None
    # what sampling this machine's counters for `aligned` took: samples and the sampler's CPU time
    local_sampling: LocalSampling | None = None
    mtus: dict[str, int] | None = None  # "role:iface" → MTU, read beside the window (measure)
    testpmd_settings: TestpmdSettings | None = None  # testpmd's own read of what was in force (measure)
    trace: TraceAccount | None = None  # the kernel's account from its tracepoints (probes/trace.py), when asked
    # each probe of offlab/probes/edge/ that the session read: key → (its slot, its stored value); None
    # where it had nothing to store (the key is then left out)
    found: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def stored(self) -> Probes:
        """The sample's `probes`: a key that does not apply is left out, as it always was. The keys
        come in their slots' order (SLOTS here, a probe's own `slot`), the order samples always had."""
        core = {"window_s": self.window_s, "t0_mono_s": self.t0_mono_s, "reads": self.reads,
                "aligned": self.aligned, "local_sampling": self.local_sampling, "cpu": self.cpu,
                "processes": self.processes, "interfaces": self.interfaces, "snmp": self.snmp,
                "mtus": self.mtus, "testpmd_settings": self.testpmd_settings, "trace": self.trace}
        keys = [(SLOTS[k], k, v) for k, v in core.items()] + [(slot, k, v) for k, (slot, v) in self.found.items()]
        return Probes.keyed(**{k: v for _, k, v in sorted(keys, key=lambda x: x[0]) if v is not None})


# The session's own keys' places in a sample's `probes` JSON; a probe's module (offlab/probes/edge/) says
# its own (`Probe.slot`: softnet 10, qdisc 20, big_packets 30, queues 40, testpmd 50 keep the places they
# had; a new probe goes after all of these)
SLOTS = {"window_s": 0, "t0_mono_s": 1, "reads": 2, "aligned": 3, "local_sampling": 4, "cpu": 5,
         "processes": 6, "interfaces": 7, "snmp": 8, "mtus": 60, "testpmd_settings": 61, "trace": 70}
