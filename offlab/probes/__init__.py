"""What is measured beside the traffic, in the traffic window only (after warm-up).

A `ProbeSession` opens each lab host's `net_reader()` (for a namespace, an idle anchor
process whose /proc/PID/net/* is read from here without spawning a command at the
edges of the window), which keeps the two snapshots close to the instants they claim.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from offlab.netdev import parse_softnet
from offlab.errors import EnvironmentProblem
from offlab.probes import counters, cpu

WATCHED_THREADS = ("ksoftirqd/", "vhost-")


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/dev → {ifname: {rx_bytes, rx_packets, rx_errors, rx_dropped, tx_...}}."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        cols = [int(c) for c in rest.split()]
        if len(cols) < 16:
            continue
        out[name.strip()] = {
            "rx_bytes": cols[0], "rx_packets": cols[1], "rx_errors": cols[2], "rx_dropped": cols[3],
            "tx_bytes": cols[8], "tx_packets": cols[9], "tx_errors": cols[10], "tx_dropped": cols[11],
        }
    return out


@dataclass
class Snapshot:
    t: float
    stat: dict[str, dict[str, int]]
    procs: dict[int, tuple[str, int]]
    netdev: dict[str, dict[str, dict[str, int]]]
    snmp: dict[str, dict[str, dict[str, int]]]
    softnet: dict[int, dict[str, int]]


class ProbeSession:
    """Anchors in every lab host; `snapshot()` twice; `result(a, b)` the deltas."""

    def __init__(self, lab, *, lifetime: float = 600.0) -> None:
        self.lab = lab
        self.readers = {}
        self.pids: dict[str, int] = {}  # role → pid of the process under test (client, server)
        try:
            for role in lab.hosts:
                self.readers[role] = lab.host(role).net_reader()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()

    def __enter__(self) -> "ProbeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def watch(self, role: str, pid: int) -> None:
        self.pids[role] = pid

    def snapshot(self) -> Snapshot:
        netdev, snmp = {}, {}
        for role, reader in self.readers.items():
            try:
                netdev[role] = parse_net_dev(reader.read("dev"))
                if role in ("client", "server", "router"):
                    snmp[role] = counters.parse_snmp(reader.read("snmp"))
            except OSError as exc:
                # The reader's anchor process dies with its namespace: the lab went away mid-window.
                raise EnvironmentProblem(
                    f"lab {self.lab.name}: the counters of host {role} cannot be read any more "
                    f"({exc.strerror or exc}): was the lab removed (`offlab lab list`)?") from None
        procs = {}
        lab_daemons = {d.pid for d in self.lab.daemons}  # e.g. this lab's ovs-vswitchd, not another's
        for pid in {*self.pids.values(), *lab_daemons, *cpu.kernel_threads(WATCHED_THREADS)}:
            ticks = cpu.process_ticks(pid)
            if ticks:
                procs[pid] = ticks
        t = time.monotonic()
        stat = cpu.parse_proc_stat(_read("/proc/stat"))
        softnet = {r.cpu: {"processed": r.processed, "dropped": r.dropped, "time_squeeze": r.time_squeeze}
                   for r in parse_softnet(_read("/proc/net/softnet_stat"))}
        return Snapshot(t, stat, procs, netdev, snmp, softnet)

    def result(self, a: Snapshot, b: Snapshot, *, client_cpu: int | None, server_cpu: int | None) -> dict:
        window = b.t - a.t
        hz = cpu.ticks_per_second()
        per_cpu = {name: cpu.cpu_split(a.stat[name], b.stat[name]) for name in b.stat if name in a.stat}
        sides = {}
        for side, n in (("client", client_cpu), ("server", server_cpu)):
            if n is not None and f"cpu{n}" in per_cpu:
                sides[side] = {"cpu": f"cpu{n}", **per_cpu[f"cpu{n}"]}
        procs = []
        role_of = {pid: role for role, pid in self.pids.items()}
        for pid, (comm, ticks) in b.procs.items():
            if pid not in a.procs:
                continue
            pct = 100.0 * (ticks - a.procs[pid][1]) / hz / window if window > 0 else 0.0
            if pct > 0 or pid in role_of:
                procs.append({"pid": pid, "comm": comm, "role": role_of.get(pid), "cpu_pct": round(pct, 2)})
        procs.sort(key=lambda p: (p["role"] is None, -p["cpu_pct"]))
        interfaces = {}
        for role, links in b.netdev.items():
            for ifname, after in links.items():
                before = a.netdev.get(role, {}).get(ifname)
                if ifname == "lo" or before is None:
                    continue
                d = counters.delta(before, after)
                if d["rx_packets"] or d["tx_packets"]:
                    interfaces[f"{role}:{ifname}"] = {**d, **counters.average_sizes(d)}
        return {
            "window_s": window,
            "cpu": {"per_cpu": per_cpu, **sides, "system": cpu.system_time(a.stat, b.stat, hz)},
            "processes": procs,
            "interfaces": interfaces,
            "snmp": {role: counters.delta(a.snmp[role], b.snmp[role]) for role in b.snmp if role in a.snmp},
            "softnet": {c: counters.delta(a.softnet[c], v) for c, v in b.softnet.items() if c in a.softnet},
        }


def service_demand(busy_pct: float, window_s: float, kib: float) -> float | None:
    """CPU µs per KiB transferred for one CPU's busy share (the per-side split)."""
    if kib <= 0 or window_s <= 0:
        return None
    return busy_pct / 100.0 * window_s * 1e6 / kib


def system_service_demand(busy_s: float, kib: float) -> float | None:
    """netperf's service demand: CPU µs of the whole system (utilisation × CPUs × time) per KiB."""
    if kib <= 0:
        return None
    return busy_s * 1e6 / kib


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
