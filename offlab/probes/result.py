"""What the probes found over one window: the door between `probes` and the sample that stores it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ProbeResult:
    """The deltas of one probe session's window (`ProbeSession.result`), and what `measure` reads
    beside it (the MTUs, testpmd's own settings). A sample stores `to_dict()` as its `probes`: the
    keys, their order and their values are those samples had before this class (docs/results.md)."""

    window_s: float  # between the two snapshots, on this machine's monotonic clock
    # the window's start on this machine's CLOCK_MONOTONIC: a tool's series that carries its own
    # start on that clock (the engine's) is cut to the window with it (witnesses.window_loss)
    t0_mono_s: float
    reads: dict[str, dict]  # role → when its counters were read (clock.read_times)
    cpu: dict[str, Any]  # per_cpu, client/server sides, system, own_kernel (hosts with their own)
    processes: list[dict]  # pid, comm, role, cpu_pct of the processes that used CPU
    interfaces: dict[str, dict]  # "role:iface" → counter deltas and average sizes
    snmp: dict[str, dict]  # role → protocol → counter delta
    softnet: dict[int, dict[str, int]]  # CPU → softnet_stat deltas
    qdisc: dict[str, dict]  # "role:dev" → root qdisc deltas
    # the local roles' UDP/IP counters over the channel hosts' own windows (ProbeSession.aligned)
    aligned: dict | None = None
    # what sampling this machine's counters for `aligned` took: samples and the sampler's CPU time
    local_sampling: dict | None = None
    # packets over 64 KiB per interface and direction, where the workload asked (big_packets)
    big_packets: dict | None = None
    # "role:iface" → rx/tx → queue → packets, where a setting about queues asked (probes/queues.py)
    queues: dict | None = None
    testpmd: dict | None = None  # a dpdk lab's testpmd port counters over the window
    mtus: dict[str, int] | None = None  # "role:iface" → MTU, read beside the window (measure)
    testpmd_settings: dict | None = None  # testpmd's own read of what was in force (measure)
    trace: dict | None = None  # the kernel's account from its tracepoints (probes/trace.py), when asked

    def to_dict(self) -> dict:
        """The sample's `probes` JSON: a key that does not apply is left out, as it always was."""
        d: dict[str, Any] = {"window_s": self.window_s, "t0_mono_s": self.t0_mono_s, "reads": self.reads}
        if self.aligned:
            d["aligned"] = self.aligned
        if self.local_sampling is not None:
            d["local_sampling"] = self.local_sampling
        d.update(cpu=self.cpu, processes=self.processes, interfaces=self.interfaces, snmp=self.snmp,
                 softnet=self.softnet, qdisc=self.qdisc)
        for key in ("big_packets", "queues", "testpmd", "mtus", "testpmd_settings", "trace"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d
