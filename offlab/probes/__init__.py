"""What is measured beside the traffic, in the traffic window only (after warm-up).

session.py: the probe session (snapshots at the window's edges, their deltas as a `ProbeResult`);
clock.py: a channel host's clock against this machine's (when its counters were read);
remote.py: the readers of hosts with a kernel of their own (a guest, an SSH host);
interface_mtus.py: every lab interface's MTU, read beside the window; demand.py: service demand;
counters, cpu, capture: what each snapshot reads and how it is parsed;
base.py: the probe interface; edge/: the probes beside the core counters, one module each (qdisc,
softnet, in_flight, bigpackets, queues, dpdk_ports), found by listing that package when a session starts.
"""

from offlab.probes.clock import CLOCK_EXCHANGES, CLOCK_KEEP_S, clock_offset, keep_exchanges, kept_exchanges, read_instant
from offlab.probes.counters import parse_net_dev
from offlab.probes.demand import service_demand, system_service_demand
from offlab.probes.interface_mtus import mtus
from offlab.probes.remote import split_counter_files
from offlab.probes.result import ProbeResult
from offlab.probes.session import ProbeSession, Snapshot

__all__ = ["CLOCK_EXCHANGES", "CLOCK_KEEP_S", "ProbeResult", "ProbeSession", "Snapshot", "clock_offset",
           "keep_exchanges", "kept_exchanges", "mtus", "parse_net_dev", "read_instant", "service_demand",
           "split_counter_files", "system_service_demand"]
