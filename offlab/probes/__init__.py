"""What is measured beside the traffic, in the traffic window only (after warm-up).

A `ProbeSession` opens each lab host's `net_reader()` (for a namespace, an idle anchor
process whose /proc/PID/net/* is read from here without spawning a command at the
edges of the window), which keeps the two snapshots close to the instants they claim.
A host with a kernel of its own (a guest, an SSH host) cannot be read from here: each
snapshot starts one read per such host, all at once, before this machine's files are
read (its clock and all its counter files back to back: a guest's agent in one `read_many`
request, answered without a fork; an SSH host with one `awk` through a reader stream), and
the snapshot does not wait for the answers (`settle` does). Every host's
read is timed (sent → answered, on this machine's clock, narrowed by the host's own
clock), and this machine's UDP/IP counters are sampled meanwhile, so a witness that
compares two hosts uses counters read at the same instants and knows how far apart they
may still be (`reads`, `aligned`, `witnesses.skew`; docs/results.md).
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

from offlab.netdev import parse_softnet
from offlab.errors import EnvironmentProblem, OfflabError
from offlab.dpdk import Testpmd
from offlab.probes import counters, cpu, dpdk_ports, qdisc
from offlab.probes.bigpackets import BigPacketCounters
from offlab.probes import bigpackets

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
    big: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # role → iface → packets > 64 KiB
    # role → (sent, answered) on this machine's monotonic clock: the counters of that host were read
    # at some instant in between (microseconds apart for a namespace, a round trip for a channel host).
    reads: dict[str, tuple[float, float]] = field(default_factory=dict)
    # role → that host's own clock (/proc/uptime, 10 ms steps) read by the same process just before its
    # counters: the length of its window on its own clock, whatever the channel's delays.
    clocks: dict[str, float] = field(default_factory=dict)
    pending: dict = field(default_factory=dict, repr=False)  # role → a channel host's read still under way


class ProbeSession:
    """Anchors in every lab host; `snapshot()` twice; `result(a, b)` the deltas."""

    def __init__(self, lab, *, lifetime: float = 600.0, big_packets: bool = False) -> None:
        self.lab = lab
        self.readers = {}
        # role → nftables counters of packets over 64 KiB (namespace hosts; only when asked: bigpackets)
        self.big: dict[str, BigPacketCounters] = {}
        self.pids: dict[str, int] = {}  # role → pid of the process under test (client, server)
        hosts = {role: lab.host(role) for role in lab.hosts}
        # Hosts with a kernel of their own (a guest, an SSH host) are read in one command per snapshot
        # (their counters and /proc/stat, see _Remote); the others through their net_reader.
        self.own_kernel = {role: h for role, h in hosts.items() if not h.shares_kernel}
        self.testpmd = Testpmd.for_lab(lab.name) if lab.has_testpmd else None
        # role → (sent, its clock, answered) of every exchange with a channel host: together they pin
        # its clock against this machine's (see read_times).
        self.exchanges: dict[str, list[tuple[float, float, float]]] = {
            role: kept_exchanges(h) for role, h in self.own_kernel.items()}
        self.samples: list[tuple[float, float, dict]] = []
        self.sampling_cpu_s = 0.0
        self._pending_reads, self._pending_lock, self._reading = 0, threading.Lock(), threading.Event()
        self._sampler: threading.Thread | None = None
        self._sampling = False
        self.streams: dict[str, _Stream] = {}
        try:
            for role, host in hosts.items():
                if role not in self.own_kernel:
                    self.readers[role] = host.net_reader()
                elif (proc := host.stream(["sh", "-c", _STREAM_READ], lifetime=lifetime)) is not None:
                    self.streams[role] = _Stream(proc, host.name)
            calls = [_Async(self._exchange, role, 1 if len(self.exchanges[role]) >= CLOCK_EXCHANGES else CLOCK_EXCHANGES)
                     for role in self.own_kernel]
            for c in calls:
                c.result(timeout=60)
            if big_packets:
                for role, host in hosts.items():
                    if host.netns_name is not None:
                        self.big[role] = BigPacketCounters(host)
                        self.big[role].add()
        except BaseException:
            self.close()
            raise

    def _read_remote(self, role: str) -> tuple[str, float, "_Async | str"]:
        """One snapshot of a channel host's counters: the files' text as split_counter_files reads it,
        the instant they were answered (this machine's monotonic clock), and its tc text (a string, or
        an _Async that gives it). Over an SSH host's stream: one _REMOTE_READ answer. Elsewhere (a
        guest): every file in one `read_many`, then its qdiscs (`qdisc_json`), both answered by its
        agent without forking; the qdiscs are not waited for here: the files' read span stays theirs."""
        if role in self.streams:
            files, _, tc_text = self.streams[role].ask().partition(_SEP + "\n")
            return files, time.monotonic(), tc_text
        host = self.own_kernel[role]
        texts = host.read_many(COUNTER_FILES)
        tc = _Async(_tc_text, host)
        answered = time.monotonic()
        if texts.get("/proc/net/dev") is None:
            raise OSError(f"{host.name} did not give its /proc/net/dev")
        text = "".join(f"@@{path}\n{t}" + ("" if t.endswith("\n") else "\n")
                       for path, t in texts.items() if t is not None)
        return text, answered, tc

    def _read_clock(self, role: str) -> str:
        """The host's /proc/uptime: over its stream where it has one, else alone (a guest's agent
        reads it without forking)."""
        if role in self.streams:
            return split_counter_files(self.streams[role].ask().partition(_SEP + "\n")[0])["uptime"]
        return self.own_kernel[role].read("/proc/uptime")

    def _exchange(self, role: str, count: int | None = None) -> None:
        """A few reads of the host's clock before the traffic: the quickest answers bound its offset."""
        for _ in range(count or CLOCK_EXCHANGES):
            t0 = time.monotonic()
            try:
                up = self._read_clock(role).split()
            except (OfflabError, OSError):
                return
            if up and _is_number(up[0]):
                self.exchanges[role].append((t0, float(up[0]), time.monotonic()))

    def close(self) -> None:
        for role, host in self.own_kernel.items():
            keep_exchanges(host, self.exchanges.get(role, []))
        self._stop_sampling()
        for counting in self.big.values():
            counting.remove()
        for reader in self.readers.values():
            reader.close()
        for stream in self.streams.values():
            stream.close()

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
                          for name, d in parse_net_dev(r.read("dev")).items() if name != "lo")
            except OSError:
                return False
            if last is not None and (now - last >= DATA_LOOK_BYTES or now - first >= DATA_BYTES):
                return True
            first = now if first is None else first
            last = now
            time.sleep(0.02)
        return False

    def watch(self, role: str, pid: int) -> None:
        self.pids[role] = pid

    def snapshot(self) -> Snapshot:
        netdev, snmp, guest_stat = {}, {}, {}
        # A host with a kernel of its own answers over a channel (tens of ms): one command each for
        # all its files, all of them at once, while this machine's files are read.
        self._start_sampling()
        track = self._sampler is not None  # this machine's counters are sampled while those reads are under way
        if track:
            self._reads_begin(len(self.own_kernel))
        remote = {role: _Remote(self._read_remote, role, done=self._read_done if track else None)
                  for role in self.own_kernel}
        # tc is a command, not a file: one per namespace, all at once, while the files are read.
        tc = {role: _Async(qdisc.read, self.lab.host(role)) for role in self.readers}
        big = {role: _Async(counting.read) for role, counting in self.big.items()}
        reads, clocks = {}, {}
        for role, reader in self.readers.items():
            try:
                t0 = time.monotonic()
                netdev[role] = parse_net_dev(reader.read("dev"))
                if role in ("client", "server", "router"):
                    snmp[role] = {**counters.parse_snmp(reader.read("snmp") + reader.read("netstat")),
                                  **_snmp6(reader)}
                reads[role] = (t0, time.monotonic())
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
        softnet = {r.cpu: {"processed": r.processed, "dropped": r.dropped, "time_squeeze": r.time_squeeze,
                           "received_rps": r.received_rps}
                   for r in parse_softnet(_read("/proc/net/softnet_stat"))}
        qdiscs = {role: a.result() for role, a in tc.items()}
        big_read = {role: a.result() for role, a in big.items()}
        if any(v is None for v in big_read.values()):
            raise EnvironmentProblem(f"lab {self.lab.name}: the counters of packets over 64 KiB could not be read "
                                     f"(hosts {', '.join(r for r, v in big_read.items() if v is None)})")
        # The channel hosts' answers are not waited for here: a guest under TCG may take seconds to
        # answer, and the window's other edge must still come on time. `settle` collects them.
        return Snapshot(t, stat, procs, netdev, snmp, softnet, guest_stat, qdiscs, ports, big_read, reads, clocks,
                        pending=remote)

    def aligned(self, a: Snapshot, b: Snapshot) -> dict | None:
        """The local roles' UDP/IP counters over the channel hosts' own windows (the samples nearest to
        the instants they read theirs), with those hosts' counters: {"snmp": {role: delta}, "reads":
        {role: {"start": [..], "end": [..]}}} in seconds from a.t / b.t, as `reads`."""
        remote = [r for r in self.own_kernel if r in a.snmp and r in b.snmp]
        if not remote or not self.samples:
            return None
        times = read_times(a, b, self.exchanges)
        out_snmp = {r: counters.delta(a.snmp[r], b.snmp[r]) for r in remote}
        out_reads = {r: times[r] for r in remote if r in times}
        picked = []
        for snap, edge in ((a, "start"), (b, "end")):
            spans = [times[r][edge] for r in remote if r in times]
            if not spans:
                return None
            instant = snap.t + (min(x[0] for x in spans) + max(x[1] for x in spans)) / 2
            picked.append(_nearest(self.samples, instant))
        (a0, a1, sa), (b0, b1, sb) = picked
        for role in sa.keys() & sb.keys():
            out_snmp[role] = counters.delta(_parse_udp_text(*sa[role]), _parse_udp_text(*sb[role]))
            out_reads[role] = {"start": [round(a0 - a.t, 6), round(a1 - a.t, 6)],
                               "end": [round(b0 - b.t, 6), round(b1 - b.t, 6)]}
        return {"snmp": out_snmp, "reads": out_reads}

    def settle(self, snap: Snapshot) -> Snapshot:
        """Wait for the channel hosts' answers to `snap` and fold them in (done once)."""
        for role, r in snap.pending.items():
            files, tc_text = r.result(self.lab.name, role)
            snap.netdev[role] = parse_net_dev(files["dev"])
            snap.snmp[role] = {**counters.parse_snmp(files["snmp"] + files["netstat"]),
                               **counters.parse_snmp6(files["snmp6"])}
            snap.guest_stat[role] = cpu.parse_proc_stat(files["stat"])
            snap.qdisc[role] = qdisc.parse_tc(tc_text) if tc_text.strip() else None
            snap.reads[role] = (r.sent, r.answered)
            uptime = files["uptime"].split()
            if uptime and _is_number(uptime[0]):
                snap.clocks[role] = float(uptime[0])
                self.exchanges.setdefault(role, []).append((r.sent, float(uptime[0]), r.answered))
        snap.pending = {}
        return snap

    def result(self, a: Snapshot, b: Snapshot, *, client_cpu: int | None, server_cpu: int | None) -> dict:
        self.settle(a)
        self.settle(b)
        self._stop_sampling()
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
            # the window's start on this machine's CLOCK_MONOTONIC: a tool's series that carries its own
            # start on that clock (the engine's) is cut to the window with it (witnesses.window_loss)
            "t0_mono_s": round(a.t, 6),
            "reads": read_times(a, b, self.exchanges),
            **({"aligned": aligned} if (aligned := self.aligned(a, b)) else {}),
            # what sampling this machine's counters for `aligned` took: samples and the sampler's CPU time
            **({"local_sampling": {"samples": len(self.samples), "every_s": SAMPLE_EVERY_S,
                                   "cpu_s": round(self.sampling_cpu_s, 4)}} if self._sampler is not None else {}),
            "cpu": {"per_cpu": per_cpu, **sides, "system": cpu.system_time(a.stat, b.stat, hz),
                    **({"own_kernel": own} if own else {})},
            "processes": procs,
            "interfaces": interfaces,
            "snmp": {role: counters.delta(a.snmp[role], b.snmp[role]) for role in b.snmp if role in a.snmp},
            "softnet": {c: counters.delta(a.softnet[c], v) for c, v in b.softnet.items() if c in a.softnet},
            "qdisc": {f"{role}:{dev}": d for role in b.qdisc
                      for dev, d in qdisc.delta(a.qdisc.get(role), b.qdisc[role]).items()},
            # packets over 64 KiB per interface and direction, where the workload asked (big_packets)
            **({"big_packets": bigpackets.delta(a.big, b.big)} if self.big else {}),
            **({"testpmd": dpdk_ports.result(a.testpmd_ports, b.testpmd_ports)}
               if a.testpmd_ports is not None and b.testpmd_ports is not None else {}),
        }


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


CLOCK_EXCHANGES = 3
# wait_for_traffic: bytes over all lab interfaces here (a frame counts once per interface it crosses)
DATA_LOOK_BYTES = 4096  # in 20 ms: a few full-size frames; a TCP handshake with iperf3's parameters is less
DATA_BYTES = 65536
SAMPLE_EVERY_S = 0.01
MAX_SAMPLES = 20000  # ~2 minutes of samples: a bound, never reached by a window and its reads
UPTIME_STEP_S = 0.01  # /proc/uptime prints hundredths


# A channel host's exchanges stay good for a while: its clock and this machine's tick at the same rate,
# and exchanges that disagree (a reboot, a jump) make clock_offset claim nothing. So a new session
# of the same host (a guest's pid and start time, an SSH host's address) adds one exchange to those
# of the last CLOCK_KEEP_S instead of three: two round trips less before every sample in a guest.
# They outlive the probe session (one per sample) on purpose, so they are kept in the host's memo,
# which ends with the host's lab (hosts/memo.py): a lab built again under the same name starts afresh.
CLOCK_KEEP_S = 300.0
CLOCK_KEEP_MAX = 32


def kept_exchanges(host) -> list[tuple[float, float, float]]:
    """The host's exchanges of earlier sessions, those of the last CLOCK_KEEP_S."""
    now = time.monotonic()
    return [e for e in host.memo.get("clock exchanges", []) if now - e[0] < CLOCK_KEEP_S]


def keep_exchanges(host, exchanges: list[tuple[float, float, float]]) -> None:
    host.memo.put("clock exchanges", sorted(set(exchanges))[-CLOCK_KEEP_MAX:])


def _nearest(samples: list, instant: float):
    return min(samples, key=lambda smp: abs((smp[0] + smp[1]) / 2 - instant)) if samples else None


def clock_offset(exchanges: list[tuple[float, float, float]]) -> tuple[float, float] | None:
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


def read_times(a: Snapshot, b: Snapshot, exchanges: dict | None = None) -> dict[str, dict]:
    """role → {"start": [earliest, latest], "end": [...]}: when its counters were read, in seconds from
    the window's reference instants (a.t, b.t) on this machine's clock; for a channel host also
    "own_window_s", the window between its two reads on its own clock, and "clock_offset_s", the bounds
    of its clock (/proc/uptime) minus this machine's monotonic clock."""
    out = {}
    for role in a.reads.keys() & b.reads.keys():
        offset = clock_offset((exchanges or {}).get(role, []))
        ra = read_instant(*a.reads[role], a.clocks.get(role), offset)
        rb = read_instant(*b.reads[role], b.clocks.get(role), offset)
        out[role] = {"start": [round(x - a.t, 6) for x in ra], "end": [round(x - b.t, 6) for x in rb]}
        if offset is not None:
            out[role]["clock_offset_s"] = [round(x, 6) for x in offset]  # its clock − this machine's, bounds
        if role in a.clocks and role in b.clocks:
            out[role]["own_window_s"] = round(b.clocks[role] - a.clocks[role], 3)
            out[role]["answered_s"] = [round(a.reads[role][1] - a.t, 3), round(b.reads[role][1] - b.t, 3)]
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_SEP = "@@offlab-probe@@"
# One process reads every counter file back to back, its own clock first (/proc/uptime), and sends
# only the lines offlab keeps with single spaces: the answer crosses a guest's channel at a few KB a
# second under TCG (6 KB took ~1.5 s here, a load of 7 on 2 cores). tc, a command, comes after.
_REMOTE_READ = (
    'set -- /proc/uptime /proc/net/dev /proc/net/snmp /proc/net/netstat; '
    '[ -e /proc/net/snmp6 ] && set -- "$@" /proc/net/snmp6; '
    "awk 'FNR==1{print \"@@\" FILENAME} "
    "FILENAME ~ /snmp$/ && !/^(Ip|Tcp|Udp):/ {next} "
    # /proc/net/netstat's TcpExt has ~120 columns: only those offlab keeps (names, then values)
    "FILENAME ~ /netstat$/ {if (!/^TcpExt:/) next; if (!n) for (i = 2; i <= NF; i++) "
    f"if ($i ~ /^({'|'.join(counters.SNMP_KEEP['TcpExt'])})$/) k[++n] = i; "
    "l = $1; for (j = 1; j <= n; j++) l = l \" \" $(k[j]); print l; next} "
    "FILENAME ~ /snmp6$/ && !/^(Ip6|Udp6)[A-Z]/ {next} "
    "FILENAME ~ /\\/stat$/ && !/^cpu/ {next} {$1=$1; print}' \"$@\" /proc/stat; "
    f"echo {_SEP}; {' '.join(qdisc.TC_SHOW)} 2>/dev/null")


def split_counter_files(text: str) -> dict[str, str]:
    """The answer of _REMOTE_READ before its tc part → {"uptime": ..., "dev": ..., "snmp": ..., "netstat": ...,
    "snmp6": ..., "stat": ...} (a file the host lacks is "")."""
    files = {name: "" for name in ("uptime", "dev", "snmp", "netstat", "snmp6", "stat")}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith("@@/proc/"):
            name = line.strip().rsplit("/", 1)[1]
        elif name in files:
            files[name] += line
    return files


# What a guest's agent reads in one request (read_many), in this order: its clock first.
COUNTER_FILES = ("/proc/uptime", "/proc/net/dev", "/proc/net/snmp", "/proc/net/netstat", "/proc/net/snmp6",
                 "/proc/stat")


def _tc_text(host) -> str:
    """`tc -s -j qdisc show`'s JSON of a host (a guest's agent asks rtnetlink, no fork), "" where it
    cannot say."""
    try:
        return host.qdisc_json(timeout=30) or ""
    except OfflabError:
        return ""


# The same read, once per line on stdin, for a host that keeps a reader process (an SSH host's stream).
_END = "@@offlab-end@@"
_STREAM_READ = f"while read -r _; do {_REMOTE_READ}; echo {_END}; done"


class _Stream:
    """A reader process on a channel host: a line in, one _REMOTE_READ answer out (ends with _END)."""

    def __init__(self, proc, name: str) -> None:
        self.proc, self.name, self.lock = proc, name, threading.Lock()

    def ask(self) -> str:
        with self.lock:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
            except OSError as exc:
                raise OSError(f"the counter reader on {self.name} is gone: {exc}") from None
            lines = []
            while (line := self.proc.stdout.readline()) and line.rstrip("\n") != _END:
                lines.append(line)
            if not line:
                raise OSError(f"the counter reader on {self.name} ended")
            return "".join(lines)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own ssh client, by its pid
            self.proc.wait()


class _Remote:
    """One snapshot's files of a host with its own kernel, read in one request on a thread, timed."""

    def __init__(self, read, role: str, *, done=None) -> None:
        self.read, self.role, self.out, self.tc, self.error, self.done = read, role, "", "", None, done
        self.sent = self.answered = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sent = time.monotonic()
            self.out, self.answered, self.tc = self.read(self.role)
        except (OfflabError, OSError) as exc:
            self.error = exc
        finally:
            if self.done is not None:
                self.done()

    def result(self, lab: str, role: str) -> tuple[dict[str, str], str]:
        self.thread.join(timeout=35)
        if self.error is not None or not self.out:
            raise EnvironmentProblem(f"lab {lab}: the counters of host {role} cannot be read"
                                     + (f": {self.error}" if self.error else ""))
        tc_text = self.tc.result(timeout=35) if isinstance(self.tc, _Async) else self.tc
        return split_counter_files(self.out), tc_text or ""


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
    """"role:iface" → MTU of every interface of every lab host, read once beside the window (sysfs); a
    host that cannot say is left out. A host with a kernel of its own (a guest) reads its interface
    names and their MTU files in two `read_many` requests, which its agent answers without forking
    (a shell loop there would fork a `cat` per interface in the guest, beside the traffic)."""
    def read(host) -> dict[str, int]:
        try:
            if host.shares_kernel:
                res = host.run(["sh", "-c", _MTUS], check=False, timeout=10)
                lines = res.stdout.splitlines() if res.ok else []
            else:
                names = [n for n in parse_net_dev(host.read_many(["/proc/net/dev"])["/proc/net/dev"] or "")]
                found = host.read_many([f"/sys/class/net/{n}/mtu" for n in names], timeout=10)
                lines = [f"{n} {found[f'/sys/class/net/{n}/mtu'] or ''}" for n in names]
        except OfflabError:
            return {}
        out = {}
        for line in lines:
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
