"""A probe session: what is measured beside the traffic, in the traffic window only (after warm-up).

A `ProbeSession` opens each lab host's `net_reader()` (for a namespace, an idle anchor
process whose /proc/PID/net/* is read from here without spawning a command at the
edges of the window), which keeps the two snapshots close to the instants they claim.
A host with a kernel of its own (a guest, an SSH host) cannot be read from here: each
snapshot starts one read per such host, all at once, before this machine's files are
read (remote.py), and the snapshot does not wait for the answers (`settle` does). Every
host's read is timed (sent → answered, on this machine's clock, narrowed by the host's own
clock: clock.py), and this machine's UDP/IP counters are sampled meanwhile, so a witness that
compares two hosts uses counters read at the same instants and knows how far apart they
may still be (`reads`, `aligned`, `witnesses.skew`; docs/results.md). `result` gives the
window's deltas as a `ProbeResult`.

The probes beside the core counters (qdisc, softnet, packets over 64 KiB, per-queue packets, testpmd's
ports, and any new one) are the modules of offlab/probes/edge/, found as a session starts
(base.found) and called through `base.Probe`: started before this machine's files (a command, on a
thread), read at the edge's instant after /proc/stat, folded in from a channel host's answer, a delta.
What stays here is what sets the edge's timing, read in a deliberate order: the channel hosts' reads
sent first; each namespace's /proc/net/dev, snmp, netstat and snmp6 through its anchor (these instants
are `reads`, which the cross-host witnesses bound their skew with); the kernel trace's signal right
after them (its edge is that instant); the watched processes' ticks; the edge's instant `t`; /proc/stat;
a channel host's clock and /proc/stat from its one read; the sampler behind `aligned`; the hist
triggers. Moved behind an interface called in a loop, these would lose that order or their timing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from offlab.errors import EnvironmentProblem, OfflabError
from offlab.probes import counters, cpu, hist, trace
from offlab.probes.base import Options, Probe, found
from offlab.probes.clock import Clocks, is_number, read_times
from offlab.probes.remote import Async, RemoteRead, RemoteReaders, split_files
from offlab.probes.result import ProbeResult
from offlab.sample import (Aligned, Cpu, CpuAccount, HistHow, Iface, LocalSampling, OwnKernelCpu, Process, Read,
                           TraceAccount)
from offlab.tracefs import HIST_FILES, NAME_PREFIX, tag_of

WATCHED_THREADS = ("ksoftirqd/", "vhost-", "napi/")
# wait_for_traffic: bytes over all lab interfaces here (a frame counts once per interface it crosses)
DATA_LOOK_BYTES = 4096  # in 20 ms: a few full-size frames; a TCP handshake with iperf3's parameters is less
DATA_BYTES = 65536
SAMPLE_EVERY_S = 0.01
MAX_SAMPLES = 20000  # ~2 minutes of samples: a bound, never reached by a window and its reads


@dataclass
class Snapshot:
    t: float
    stat: dict[str, dict[str, int]]
    procs: dict[int, tuple[str, int]]
    netdev: dict[str, dict[str, dict[str, int]]]
    snmp: dict[str, dict[str, dict[str, int]]]
    # role → /proc/stat of a host with its own kernel
    guest_stat: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    # each probe's reading at this edge (offlab/probes/edge/), by its stored key
    found: dict[str, Any] = field(default_factory=dict)
    # role → (sent, answered) on this machine's monotonic clock: the counters of that host were read
    # at some instant in between (microseconds apart for a namespace, a round trip for a channel host).
    reads: dict[str, tuple[float, float]] = field(default_factory=dict)
    # role → that host's own clock (/proc/uptime, 10 ms steps) read by the same process just before its
    # counters: the length of its window on its own clock, whatever the channel's delays.
    clocks: dict[str, float] = field(default_factory=dict)
    pending: dict = field(default_factory=dict, repr=False)  # role → a channel host's read still under way
    trace: trace.Maps | None = None  # the kernel's account (trace.py) as it stood at this edge
    # role → a channel host's hist triggers (hist.py) as they stood when it read its counters
    hist: dict[str, dict] = field(default_factory=dict)


class ProbeSession:
    """Anchors in every lab host; `snapshot()` twice; `result(a, b)` the deltas."""

    def __init__(self, lab, *, lifetime: float = 600.0, options: Options | None = None, kernel_trace: bool = False,
                 hist_trace: dict[str, str | None] | None = None) -> None:
        self.lab = lab
        self.readers = {}
        # what the probes of offlab/probes/edge/ are asked to read beyond what they always read (base.Options)
        self.options = options or Options()
        self.probes: list[Probe] = []  # opened below, in their stored order
        self.remote_files: tuple[str, ...] = ()  # the files they need from each host with its own kernel
        self.pids: dict[str, int] = {}  # role → pid of the process under test (client, server)
        hosts = {role: lab.host(role) for role in lab.hosts}
        # Hosts with a kernel of their own (a guest, an SSH host) are read in one command per snapshot
        # (their counters and /proc/stat, see remote.py); the others through their net_reader.
        self.own_kernel = {role: h for role, h in hosts.items() if not h.shares_kernel}
        self.clocks = Clocks(self.own_kernel)
        self.exchanges = self.clocks.exchanges  # role → (sent, its clock, answered): see clock.py
        self.samples: list[tuple[float, float, dict]] = []
        self.sampling_cpu_s = 0.0
        self._pending_reads, self._pending_lock, self._reading = 0, threading.Lock(), threading.Event()
        self._sampler: threading.Thread | None = None
        self._sampling = False
        self.remote: RemoteReaders | None = None
        # the kernel's account of this machine's lab namespaces (trace.py), when asked
        self.trace: trace.KernelTrace | None = None
        # and of each host with a kernel of its own, by hist triggers in its tracefs (hist.py)
        self.hist: HostHists | None = None
        try:
            if kernel_trace:
                self.trace = trace.KernelTrace({trace.netns_inode(h.netns_name): role for role, h in hosts.items()
                                                if h.shares_kernel and h.netns_name is not None})
                if self.trace.netns:
                    self.trace.start()
                # each guest's and SSH host's, by the hist triggers its caller set there (experiment/host_trace.py)
                if hist_trace:
                    self.hist = HostHists({role: self.own_kernel[role] for role in hist_trace}, hist_trace)
            for role, host in hosts.items():
                if role not in self.own_kernel:
                    self.readers[role] = host.net_reader()
            # found as the session starts (base.found): each module of offlab/probes/edge/ is one probe
            for kind in found():
                if kind.wanted(self, self.options):
                    self.probes.append(kind(self, self.options))
            self.remote_files = tuple(dict.fromkeys(f for p in self.probes for f in p.remote_files))
            self.remote = RemoteReaders(self.own_kernel, lifetime=lifetime,
                                        extra=self.hist.files() if self.hist is not None else None,
                                        files=self.remote_files)
            calls = [Async(self.clocks.exchange, role, self.remote.read_clock, self.clocks.needed(role))
                     for role in self.own_kernel]
            for c in calls:
                c.result(timeout=60)
            for probe in self.probes:
                probe.open()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.clocks.keep()
        self._stop_sampling()
        if self.trace is not None:
            self.trace.close()
        for probe in self.probes:
            probe.close()
        for reader in self.readers.values():
            reader.close()
        if self.remote is not None:
            self.remote.close()

    # ---- this machine's counters, sampled while a channel host's read is under way ----------------
    # A channel host's counters are read when its command gets there (1–2.5 s after it was sent, seen
    # under TCG on a loaded machine); this machine's are cheap to read at any instant. So while a
    # snapshot's channel reads are under way (from their sending to the last answer: the only span in
    # which the host can have read its counters), the UDP counters of every local role are sampled every
    # SAMPLE_EVERY_S, and the cross-host witnesses compare the channel host's counters with the local
    # ones read when it read its own (`aligned`), not with the local ones read at the window's edges.
    # Between the edges nothing is sampled: the sampler's reads would compete with the traffic for the
    # same CPUs (benchmarks/probe_sampling, docs/results.md).
    # Off only to measure what the sampling costs (benchmarks/probe_sampling): `aligned` is then None.
    sampling = True

    def _reads_begin(self, n: int) -> None:
        with self._pending_lock:
            self._pending_reads += n
            self._reading.set()

    def _read_done(self) -> None:
        with self._pending_lock:
            self._pending_reads -= 1
            if self._pending_reads <= 0:
                self._reading.clear()

    def _start_sampling(self) -> None:
        if self._sampler is not None or not self.own_kernel or not self.readers or not self.sampling:
            return
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        roles = [r for r in self.readers if r in ("client", "server", "router")]
        cpu0 = time.thread_time()
        try:
            while self._sampling and len(self.samples) < MAX_SAMPLES:
                if not self._reading.wait(timeout=0.1):
                    continue
                t0 = time.monotonic()
                # the files' text only: of all the samples, `aligned` parses the two it picks
                raw = {r: _udp_text(self.readers[r]) for r in roles}
                self.samples.append((t0, time.monotonic(), raw))
                time.sleep(SAMPLE_EVERY_S)
        except OSError:
            pass
        finally:
            self.sampling_cpu_s = time.thread_time() - cpu0  # this thread's own CPU time: what it cost

    def _stop_sampling(self) -> None:
        self._sampling = False
        if self._sampler is not None:
            self._sampler.join(timeout=5)

    def __enter__(self) -> "ProbeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_for_traffic(self, timeout: float) -> bool:
        """Wait until this machine's lab interfaces carry the traffic (a look every 20 ms: DATA_LOOK_BYTES
        more than the last look, or DATA_BYTES more than the first), at most `timeout` s: a sender in a
        guest starts sending well after offlab hears it started, and a loaded TCG guest's iperf3 took
        over a second from its control connection (a handshake, its parameters: a few hundred bytes,
        which once opened the window on nothing but those) to its data. True if traffic was seen;
        False (at once) where no lab host is read from here."""
        if not self.readers:
            return False
        deadline, first, last = time.monotonic() + timeout, None, None
        while time.monotonic() < deadline:
            try:
                now = sum(d["rx_bytes"] + d["tx_bytes"] for r in self.readers.values()
                          for name, d in counters.parse_net_dev(r.read("dev")).items() if name != "lo")
            except OSError:
                return False
            if last is not None and first is not None and (now - last >= DATA_LOOK_BYTES or now - first >= DATA_BYTES):
                return True
            first = now if first is None else first
            last = now
            time.sleep(0.02)
        return False

    def watch(self, role: str, pid: int) -> None:
        self.pids[role] = pid

    def snapshot(self) -> Snapshot:
        netdev: dict[str, dict[str, dict[str, int]]] = {}
        snmp: dict[str, dict[str, dict[str, int]]] = {}
        guest_stat: dict[str, dict[str, dict[str, int]]] = {}
        assert self.remote is not None  # opened in __init__, closed only by close()
        # A host with a kernel of its own answers over a channel (tens of ms): one command each for
        # all its files, all of them at once, while this machine's files are read.
        self._start_sampling()
        track = self._sampler is not None  # this machine's counters are sampled while those reads are under way
        if track:
            self._reads_begin(len(self.own_kernel))
        remote = {role: RemoteRead(self.remote.read, role, done=self._read_done if track else None,
                                   extra=self.remote.read_extra if self.hist is not None else None)
                  for role in self.own_kernel}
        # A probe whose read is a command (tc, nft, ethtool) starts it now, on a thread, so it runs
        # while the files are read.
        started = [(probe, probe.start()) for probe in self.probes]
        reads: dict[str, tuple[float, float]] = {}
        clocks: dict[str, float] = {}
        for role, reader in self.readers.items():
            try:
                t0 = time.monotonic()
                netdev[role] = counters.parse_net_dev(reader.read("dev"))
                if role in ("client", "server", "router"):
                    snmp[role] = {**counters.parse_snmp(reader.read("snmp") + reader.read("netstat")),
                                  **_snmp6(reader)}
                reads[role] = (t0, time.monotonic())
            except OSError as exc:
                # The reader's anchor process dies with its namespace: the lab went away mid-window.
                raise EnvironmentProblem(
                    f"lab {self.lab.name}: the counters of host {role} cannot be read any more "
                    f"({exc.strerror or exc}): was the lab removed (`offlab lab list`)?") from None
        # the kernel's maps right after the counters' files: the edge is the instant of that signal (trace.py)
        asked = self.trace.request() if self.trace is not None and self.trace.netns and self.trace.error is None else None
        procs = {}
        lab_daemons = {d.pid for d in self.lab.daemons}  # e.g. this lab's ovs-vswitchd, not another's
        for pid in {*self.pids.values(), *lab_daemons, *cpu.kernel_threads(WATCHED_THREADS)}:
            ticks = cpu.process_ticks(pid)
            if ticks:
                procs[pid] = ticks
        t = time.monotonic()
        stat = cpu.parse_proc_stat(_read("/proc/stat"))
        # the probes' reads at the edge's instant first (a file, testpmd's counters), then the answers of
        # the commands started above, which may still take a while
        readings = {probe.key: probe.read(None) for probe, begun in started if begun is None}
        readings.update({probe.key: probe.read(begun) for probe, begun in started if begun is not None})
        # The channel hosts' answers are not waited for here: a guest under TCG may take seconds to
        # answer, and the window's other edge must still come on time. `settle` collects them.
        return Snapshot(t, stat, procs, netdev, snmp, guest_stat,
                        found={probe.key: readings[probe.key] for probe in self.probes},
                        reads=reads, clocks=clocks, pending=remote,
                        trace=self.trace.collect(asked) if self.trace is not None and asked is not None else None)

    def aligned(self, a: Snapshot, b: Snapshot) -> Aligned | None:
        """The local roles' UDP/IP counters over the channel hosts' own windows (the samples nearest to
        the instants they read theirs), with those hosts' counters: each role's delta (`snmp`) and when
        it was read (`reads`, in seconds from a.t / b.t, as the window's)."""
        remote = [r for r in self.own_kernel if r in a.snmp and r in b.snmp]
        if not remote or not self.samples:
            return None
        times = read_times(a, b, self.exchanges)
        out_snmp = {r: counters.delta(a.snmp[r], b.snmp[r]) for r in remote}
        out_reads = {r: times[r] for r in remote if r in times}
        picked = []
        for snap, edge in ((a, "start"), (b, "end")):
            spans = [getattr(times[r], edge) for r in remote if r in times]
            if not spans:
                return None
            instant = snap.t + (min(x[0] for x in spans) + max(x[1] for x in spans)) / 2
            picked.append(_nearest(self.samples, instant))
        (a0, a1, sa), (b0, b1, sb) = picked
        for role in sa.keys() & sb.keys():
            out_snmp[role] = counters.delta(_parse_udp_text(*sa[role]), _parse_udp_text(*sb[role]))
            out_reads[role] = Read.keyed(start=[round(a0 - a.t, 6), round(a1 - a.t, 6)],
                                         end=[round(b0 - b.t, 6), round(b1 - b.t, 6)])
        return Aligned.keyed(snmp=out_snmp, reads=out_reads)

    def settle(self, snap: Snapshot) -> Snapshot:
        """Wait for the channel hosts' answers to `snap` and fold them in (done once)."""
        for role, r in snap.pending.items():
            files, tc_text = r.result(self.lab.name, role)
            snap.netdev[role] = counters.parse_net_dev(files["dev"])
            snap.snmp[role] = {**counters.parse_snmp(files["snmp"] + files["netstat"]),
                               **counters.parse_snmp6(files["snmp6"])}
            snap.guest_stat[role] = cpu.parse_proc_stat(files["stat"])
            mine = split_files(r.out, self.remote_files) if self.remote_files else {}
            for probe in self.probes:
                probe.remote(snap.found[probe.key], role, {f: mine[f] for f in probe.remote_files if f in mine},
                             tc_text)
            snap.reads[role] = (r.sent, r.answered)
            if r.extra:
                tag = self.hist.tags[role] if self.hist is not None else None
                snap.hist[role] = {name: h for text in r.extra.values() for name, h in hist.parse_hist(text, tag).items()}
            uptime = files["uptime"].split()
            if uptime and is_number(uptime[0]):
                snap.clocks[role] = float(uptime[0])
                self.clocks.add(role, r.sent, float(uptime[0]), r.answered)
        snap.pending = {}
        return snap

    def result(self, a: Snapshot, b: Snapshot, *, client_cpu: int | None, server_cpu: int | None) -> ProbeResult:
        self.settle(a)
        self.settle(b)
        self._stop_sampling()
        window = b.t - a.t
        return ProbeResult(
            window_s=window, t0_mono_s=round(a.t, 6), reads=read_times(a, b, self.exchanges),
            aligned=self.aligned(a, b),
            local_sampling=LocalSampling.keyed(samples=len(self.samples), every_s=SAMPLE_EVERY_S,
                                               cpu_s=round(self.sampling_cpu_s, 4)) if self._sampler is not None else None,
            cpu=self._cpu(a, b, client_cpu=client_cpu, server_cpu=server_cpu),
            processes=self._processes(a, b, window),
            interfaces=_interfaces(a, b),
            snmp={role: counters.delta(a.snmp[role], b.snmp[role]) for role in b.snmp if role in a.snmp},
            trace=self._kernel_account(a, b),
            found={probe.key: (probe.slot, probe.delta(a.found[probe.key], b.found[probe.key]))
                   for probe in self.probes},
        )

    def _cpu(self, a: Snapshot, b: Snapshot, *, client_cpu: int | None, server_cpu: int | None) -> CpuAccount:
        """The window's CPU: this machine's CPUs, each and all, the sides pinned to one of them, and each
        host with a kernel of its own (its side, if it is one, is all its CPUs)."""
        hz = cpu.ticks_per_second()
        per_cpu = {name: cpu.cpu_split(a.stat[name], b.stat[name]) for name in b.stat if name in a.stat}
        sides: dict[str, Cpu] = {}
        for side, n in (("client", client_cpu), ("server", server_cpu)):
            if side in self.own_kernel:
                continue
            if n is not None and f"cpu{n}" in per_cpu:
                sides[side] = per_cpu[f"cpu{n}"].on(f"cpu{n}")
        own = {}
        for role, before in (a.guest_stat or {}).items():
            after = (b.guest_stat or {}).get(role, {})
            names = [n for n in before if n in after]
            total_a = {k: sum(before[n].get(k, 0) for n in names) for k in cpu.STAT_FIELDS}
            total_b = {k: sum(after[n].get(k, 0) for n in names) for k in cpu.STAT_FIELDS}
            # Its own CPUs, all of them: a guest's vCPUs are not pinned by offlab.
            own[role] = OwnKernelCpu.keyed(per_cpu={n: cpu.cpu_split(before[n], after[n]) for n in names},
                                           system=cpu.system_time(before, after, hz))
            if role in ("client", "server"):
                sides[role] = cpu.cpu_split(total_a, total_b).on(f"{role}'s own {len(names)} CPU(s)")
        return CpuAccount.keyed(per_cpu=per_cpu, **sides, system=cpu.system_time(a.stat, b.stat, hz),
                                **({"own_kernel": own} if own else {}))

    def _processes(self, a: Snapshot, b: Snapshot, window: float) -> list[Process]:
        """The watched processes that used CPU in the window, and the client and server whatever they used:
        theirs first, then by CPU."""
        hz = cpu.ticks_per_second()
        procs: list[Process] = []
        role_of = {pid: role for role, pid in self.pids.items()}
        for pid, (comm, ticks) in b.procs.items():
            if pid not in a.procs:
                continue
            pct = 100.0 * (ticks - a.procs[pid][1]) / hz / window if window > 0 else 0.0
            if pct > 0 or pid in role_of:
                procs.append(Process.keyed(pid=pid, comm=comm, role=role_of.get(pid), cpu_pct=round(pct, 2)))
        procs.sort(key=lambda p: (p.role is None, -p.cpu_pct))
        return procs

    def _kernel_account(self, a: Snapshot, b: Snapshot) -> TraceAccount | None:
        """The window's drops and skbs by the kernel's tracepoints (trace.account); where it could not
        run, why; None where it was not asked."""
        if self.trace is None:
            return None
        # a guest's or an SSH host's kernel is its own: its hist triggers count there (hist.py), where
        # they could be set and were read at both edges
        guests = self.hist.account(a, b) if self.hist is not None else {}
        untraced = [f"{role}: " + (self.hist.error.get(role, "not traced") if self.hist is not None and role in self.hist.hosts
                                   else f"its own kernel ({self.lab.host(role).kind} host): not traced")
                    for role in sorted(self.own_kernel) if role not in guests]
        out: TraceAccount | None = None
        if self.trace.netns:
            if a.trace is None or b.trace is None:
                if not guests:
                    return TraceAccount.keyed(unavailable=self.trace.error or "bpftrace was not read at both edges")
                untraced.append(f"this machine's namespaces: {self.trace.error or 'bpftrace was not read at both edges'}")
            else:
                out = trace.account(a.trace, b.trace, self.trace,
                                    {role: self.lab.host(role) for role in self.trace.netns.values()})
                # how long after the last counters' read of each edge the kernel's edge came (a loaded
                # machine may preempt offlab in between): the two accounts' windows differ by up to this much
                out = out.plus(edge_lag_s=[round(snap.trace.t - max(r[1] for r in snap.reads.values()), 6)
                                           if snap.reads and snap.trace else None for snap in (a, b)])
        if out is None and not guests:
            return TraceAccount.keyed(unavailable="no lab host could be traced (" + "; ".join(untraced) + ")")
        if out is None:
            out = TraceAccount.keyed(tool="hist triggers", drops=[], gro_in=[], queue=[], xmit=[], rx=[])
        out = out.plus(drops=out.drops + [d for rows, _ in guests.values() for d in rows.drops],
                       gro_in=out.gro_in + [r for rows, _ in guests.values() for r in rows.gro_in],
                       queue=out.queue + [r for rows, _ in guests.values() for r in rows.queue],
                       xmit=out.xmit + [r for rows, _ in guests.values() for r in rows.xmit],
                       rx=out.rx + [r for rows, _ in guests.values() for r in rows.rx])
        out.drops.sort(key=lambda x: -int(x.datagrams or 0))
        if guests:
            out = out.plus(hist={role: how for role, (_, how) in guests.items()})
        if untraced:
            out = out.plus(not_traced=untraced)
        return out


class HostHists:
    """What offlab's hist triggers counted in each guest and SSH host (set by the caller:
    experiment/host_trace.py), read with its counters at each edge; `error`: role → why that host's
    kernel is not traced."""

    def __init__(self, hosts: dict, errors: dict[str, str | None]) -> None:
        self.hosts = hosts
        self.tags = {role: tag_of(h.key) for role, h in hosts.items()}  # the names of its triggers (tracefs.py)
        self.error: dict[str, str] = {role: why for role, why in errors.items() if why}
        self.reasons: dict[str, dict[int, str]] = {}
        self.reason_error: dict[str, str] = {}  # role → why its reasons are numbers

    def files(self) -> dict[str, tuple[str, ...]]:
        """role → the hist files read with its counters at each edge."""
        return {role: HIST_FILES for role in self.hosts if role not in self.error}

    def account(self, a: "Snapshot", b: "Snapshot") -> dict[str, tuple[TraceAccount, HistHow]]:
        """role → its window's rows (hist.account) and how they were taken, for the roles read at both edges."""
        out = {}
        for role in self.hosts:
            if role in self.error:
                continue
            if role not in a.hist or role not in b.hist:
                self.error[role] = "its hist triggers were not read at both edges"
                continue
            d = hist.delta(a.hist[role], b.hist[role])
            if d.get(f"{NAME_PREFIX}drop") and role not in self.reasons:
                self.reasons[role] = self._reasons(role)
            rows = hist.account(d, role, self.reasons.get(role, {}))
            how = HistHow.keyed(tool="tracefs hist triggers", drops_counted_in="skbs",
                                **({"reasons": self.reason_error[role]} if role in self.reason_error else {}))
            out[role] = (rows, how)
        return out

    def _reasons(self, role: str) -> dict[int, str]:
        try:
            return hist.drop_reasons(self.hosts[role].read_bytes(hist.BTF))
        except (OfflabError, OSError, ValueError) as exc:
            self.reason_error[role] = f"drop reasons by number: {role}'s BTF could not be read ({exc})"
            return {}


def _interfaces(a: Snapshot, b: Snapshot) -> dict[str, Iface]:
    """"role:iface" → the counter deltas and average sizes of each lab interface that moved a packet."""
    out = {}
    for role, links in b.netdev.items():
        for ifname, now in links.items():
            was = a.netdev.get(role, {}).get(ifname)
            if ifname == "lo" or was is None:
                continue
            d = counters.delta(was, now)
            moved = Iface.keyed(**d, **counters.average_sizes(d))
            if moved.rx_packets or moved.tx_packets:
                out[f"{role}:{ifname}"] = moved
    return out


def _udp_text(reader) -> tuple[str, str]:
    """/proc/net/snmp and snmp6 as text ("" where IPv6 is disabled): one sample, parsed only if picked."""
    try:
        v6 = reader.read("snmp6")
    except FileNotFoundError:
        v6 = ""
    return reader.read("snmp"), v6


def _parse_udp_text(snmp: str, snmp6: str) -> dict[str, dict[str, int]]:
    return {**counters.parse_snmp(snmp), **(counters.parse_snmp6(snmp6) if snmp6 else {})}


def _snmp6(reader) -> dict[str, dict[str, int]]:
    try:
        return counters.parse_snmp6(reader.read("snmp6"))
    except FileNotFoundError:  # IPv6 disabled in that namespace
        return {}


def _nearest(samples: list, instant: float):
    return min(samples, key=lambda smp: abs((smp[0] + smp[1]) / 2 - instant)) if samples else None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
