"""What is measured beside the traffic, in the traffic window only (after warm-up).

A `ProbeSession` opens each lab host's `net_reader()` (for a namespace, an idle anchor
process whose /proc/PID/net/* is read from here without spawning a command at the
edges of the window), which keeps the two snapshots close to the instants they claim.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from offlab.netdev import parse_softnet
from offlab.errors import EnvironmentProblem, OfflabError
from offlab.dpdk import Testpmd
from offlab.probes import counters, cpu, dpdk_ports, qdisc

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
            "rx_fifo": cols[4], "rx_frame": cols[5],
            "tx_bytes": cols[8], "tx_packets": cols[9], "tx_errors": cols[10], "tx_dropped": cols[11],
            "tx_fifo": cols[12], "tx_carrier": cols[14],
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
    guest_stat: dict[str, dict[str, dict[str, int]]] | None = None  # role → /proc/stat of a host with its own kernel
    qdisc: dict[str, dict[str, dict] | None] = field(default_factory=dict)  # role → root qdisc counters per dev
    testpmd_ports: dict[int, dict[str, int]] | None = None  # a dpdk lab's testpmd port counters


class ProbeSession:
    """Anchors in every lab host; `snapshot()` twice; `result(a, b)` the deltas."""

    def __init__(self, lab, *, lifetime: float = 600.0) -> None:
        self.lab = lab
        self.readers = {}
        self.pids: dict[str, int] = {}  # role → pid of the process under test (client, server)
        hosts = {role: lab.host(role) for role in lab.hosts}
        # Hosts with a kernel of their own (a guest, an SSH host) are read in one command per snapshot
        # (their counters and /proc/stat, see _Remote); the others through their net_reader.
        self.own_kernel = {role: h for role, h in hosts.items() if not h.shares_kernel}
        self.testpmd = Testpmd.for_lab(lab.name) if lab.topology.startswith("dpdk") else None
        try:
            for role, host in hosts.items():
                if role not in self.own_kernel:
                    self.readers[role] = host.net_reader()
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
        netdev, snmp, guest_stat = {}, {}, {}
        # A host with a kernel of its own answers over a channel (tens of ms): one command each for
        # all its files, all of them at once, while this machine's files are read.
        remote = {role: _Remote(host) for role, host in self.own_kernel.items()}
        # tc is a command, not a file: one per namespace, all at once, while the files are read.
        tc = {role: _Async(qdisc.read, self.lab.host(role)) for role in self.readers}
        for role, reader in self.readers.items():
            try:
                netdev[role] = parse_net_dev(reader.read("dev"))
                if role in ("client", "server", "router"):
                    snmp[role] = counters.parse_snmp(reader.read("snmp") + reader.read("netstat"))
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
        ports = dpdk_ports.read(self.testpmd) if self.testpmd is not None else None
        stat = cpu.parse_proc_stat(_read("/proc/stat"))
        softnet = {r.cpu: {"processed": r.processed, "dropped": r.dropped, "time_squeeze": r.time_squeeze}
                   for r in parse_softnet(_read("/proc/net/softnet_stat"))}
        qdiscs = {role: a.result() for role, a in tc.items()}
        for role, r in remote.items():
            dev, snmp_text, stat_text, tc_text = r.result(self.lab.name, role)
            netdev[role] = parse_net_dev(dev)
            snmp[role] = counters.parse_snmp(snmp_text)
            guest_stat[role] = cpu.parse_proc_stat(stat_text)
            qdiscs[role] = qdisc.parse_tc(tc_text) if tc_text.strip() else None
        return Snapshot(t, stat, procs, netdev, snmp, softnet, guest_stat, qdiscs, ports)

    def result(self, a: Snapshot, b: Snapshot, *, client_cpu: int | None, server_cpu: int | None) -> dict:
        window = b.t - a.t
        hz = cpu.ticks_per_second()
        per_cpu = {name: cpu.cpu_split(a.stat[name], b.stat[name]) for name in b.stat if name in a.stat}
        sides = {}
        for side, n in (("client", client_cpu), ("server", server_cpu)):
            if side in self.own_kernel:
                continue
            if n is not None and f"cpu{n}" in per_cpu:
                sides[side] = {"cpu": f"cpu{n}", **per_cpu[f"cpu{n}"]}
        own = {}
        for role, before in (a.guest_stat or {}).items():
            after = (b.guest_stat or {}).get(role, {})
            names = [n for n in before if n in after]
            total_a = {k: sum(before[n].get(k, 0) for n in names) for k in cpu.STAT_FIELDS}
            total_b = {k: sum(after[n].get(k, 0) for n in names) for k in cpu.STAT_FIELDS}
            # Its own CPUs, all of them: a guest's vCPUs are not pinned by offlab.
            own[role] = {"per_cpu": {n: cpu.cpu_split(before[n], after[n]) for n in names},
                         "system": cpu.system_time(before, after, hz)}
            if role in ("client", "server"):
                sides[role] = {"cpu": f"{role}'s own {len(names)} CPU(s)", **cpu.cpu_split(total_a, total_b)}
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
            "cpu": {"per_cpu": per_cpu, **sides, "system": cpu.system_time(a.stat, b.stat, hz),
                    **({"own_kernel": own} if own else {})},
            "processes": procs,
            "interfaces": interfaces,
            "snmp": {role: counters.delta(a.snmp[role], b.snmp[role]) for role in b.snmp if role in a.snmp},
            "softnet": {c: counters.delta(a.softnet[c], v) for c, v in b.softnet.items() if c in a.softnet},
            "qdisc": {f"{role}:{dev}": d for role in b.qdisc
                      for dev, d in qdisc.delta(a.qdisc.get(role), b.qdisc[role]).items()},
            **({"testpmd": dpdk_ports.result(a.testpmd_ports, b.testpmd_ports)}
               if a.testpmd_ports is not None and b.testpmd_ports is not None else {}),
        }


_SEP = "@@offlab-probe@@"
_REMOTE_READ = (f"cat /proc/net/dev; echo {_SEP}; cat /proc/net/snmp /proc/net/netstat; echo {_SEP}; cat /proc/stat; echo {_SEP}; "
                f"{' '.join(qdisc.TC_SHOW)} 2>/dev/null")


class _Remote:
    """One snapshot's files of a host with its own kernel, read in one command on a thread."""

    def __init__(self, host) -> None:
        self.host, self.out, self.error = host, "", None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.out = self.host.run(["sh", "-c", _REMOTE_READ], timeout=30).stdout
        except OfflabError as exc:
            self.error = exc

    def result(self, lab: str, role: str) -> tuple[str, str, str, str]:
        self.thread.join(timeout=35)
        parts = self.out.split(_SEP + "\n")
        if self.error is not None or len(parts) != 4:
            raise EnvironmentProblem(f"lab {lab}: the counters of host {role} cannot be read"
                                     + (f": {self.error}" if self.error else ""))
        return parts[0], parts[1], parts[2], parts[3]


class _Async:
    """fn(*args) on a thread; `result()` waits for it (None if it did not finish in time)."""

    def __init__(self, fn, *args) -> None:
        self.value = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn, *args) -> None:
        self.value = fn(*args)

    def result(self, timeout: float = 15.0):
        self.thread.join(timeout=timeout)
        return self.value


_MTUS = 'for d in /sys/class/net/*; do echo "${d##*/} $(cat "$d/mtu")"; done'


def mtus(lab) -> dict[str, int]:
    """"role:iface" → MTU of every interface of every lab host, read once after the window (sysfs, so a
    guest's busybox answers too); a host that cannot say is left out."""
    def read(host) -> dict[str, int]:
        try:
            res = host.run(["sh", "-c", _MTUS], check=False, timeout=10)
        except OfflabError:
            return {}
        out = {}
        for line in res.stdout.splitlines() if res.ok else []:
            name, _, mtu = line.partition(" ")
            if mtu.strip().isdigit() and name != "lo":
                out[name] = int(mtu)
        return out

    tasks = {role: _Async(read, lab.host(role)) for role in lab.hosts}
    return {f"{role}:{name}": mtu for role, t in tasks.items() for name, mtu in (t.result() or {}).items()}


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
