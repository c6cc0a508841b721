"""One measured sample: traffic plus every probe, over the window after warm-up, as one typed record
(offlab.sample's StoredSample) from here to the store."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from offlab.state import private_tmp
from offlab import lab as labs
from offlab.errors import BadInput, EnvironmentProblem, OfflabError
from offlab.lab.dpdk import forwarding
from offlab.lab.explain import guest_chains
from offlab.lab.model import UPLINK_KINDS, LabState
from offlab.metrics import TCG_MARK
from offlab.probes import ProbeResult, ProbeSession, Snapshot, mtus, service_demand, system_service_demand
from offlab.probes.base import Options as ProbeOptions
from offlab.probes.counters import rcvq_pruned
from offlab.probes.cpu import NOTABLE_STEAL_PCT
from offlab.sample import (Cpu, Guest, Held, Iface, Probes, Rr, RrPhase, SampleWorkload, StoredSample,
                           TestpmdSettings)
from offlab.dpdk import Testpmd
from offlab.experiment import effects, host_trace, kernel_account, witnesses
from offlab.probes.capture import Capture, CaptureSummary, read_pcap, summarize
from offlab.traffic import TrafficResult, Workload
from offlab.traffic import engine as engine_driver
from offlab.traffic import iperf3 as iperf3_driver
from offlab.traffic import rr as rr_driver
from offlab.wire import ETH_HEADER

# Probes stop this much before the sender does, so the second snapshot is still inside traffic.
END_MARGIN_S = 0.05
# Traffic that ends more than this (or 10 % of the window) before the window's end is a failed sample.
EARLY_END_TOLERANCE_S = 0.5
RCVQ_MARK = "receive queue pruned"  # a sample's note that flags it (reports search for it)
PROCESSES_GONE_MARK = "processes gone"  # a sample's note: a watched tool's process ended before the window
CHANNEL_MARGIN_S = 1.0
# How long a window with a channel host waits for its traffic to show on this machine's interfaces
# (a guest's iperf3 took seconds to begin sending on a loaded machine); then it starts anyway.
CHANNEL_START_WAIT_S = 10.0

VETH_NOTE = ("a veth counts a GSO/GRO super-packet once: an average near 64 KiB on a veth is the proof "
             "that the super-packet crossed it unsegmented")


@dataclass
class CaptureRequest:
    role: str
    iface: str | None = None  # None: the host's only veth
    frames: int = 2000


GUEST_KEYS = ("accel", "vhost", "qemu_version", "qemu_package_version", "qemu_suite", "kernel_release", "kernel_package",
              "kernel_package_version", "kernel_suite")  # what a sample says of each guest's run, in this order


def measure(lab: LabState, w: Workload, capture: CaptureRequest | None = None, *,
            alongside: Callable[[], None] | None = None, settings: list[Held] | None = None,
            trace: bool = False) -> StoredSample:
    """Run `w` from client to server of `lab` with all probes, and return the sample.

    `alongside` runs on a thread from the moment the traffic starts, and is waited for before
    the sample is made (rr-under-load's probe). `settings` are the settings the sample runs with,
    each given an effect witness (offlab.experiment.effects). `trace`:
    the kernel's own account of the window beside the counters (offlab.probes.trace). A
    failure while a lab daemon (testpmd, OVS) is dead is reported as that daemon's death, with its last lines: the traffic error is its symptom."""
    # reads that run beside the traffic (MTUs, testpmd's settings): this sample's own threads
    beside = ThreadPoolExecutor(max_workers=2, thread_name_prefix="offlab-beside")
    try:
        with forwarding(lab):
            return _measure(lab, w, capture, beside, alongside=alongside, settings=settings or [], trace=trace)
    except (OfflabError, OSError) as exc:
        died = _daemon_died(lab, within=0 if isinstance(exc, BadInput) or not lab.daemons else DYING_S)
        if died is not None:
            raise died from exc
        raise
    finally:
        beside.shutdown(wait=False, cancel_futures=True)  # a read stuck on a dead guest does not hold the caller


# A killed testpmd's taps go with its files, which can be before its leader shows as exited (a zombie):
# the traffic then fails first ("Network is unreachable") with the daemon not yet seen dead. A failure in a
# lab with daemons looks this long for one that is dying, so the error names the cause, not its symptom.
DYING_S = 2.0


def _daemon_died(lab: LabState, *, within: float) -> labs.LabDaemonDied | None:
    deadline = time.monotonic() + within
    while (died := labs.daemon_died(lab)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return died


def _measure(lab: LabState, w: Workload, capture: CaptureRequest | None, beside: ThreadPoolExecutor, *,
             alongside: Callable[[], None] | None, settings: list[Held], trace: bool = False) -> StoredSample:
    w.ipv6 = w.ipv6 and bool(lab.entry("server").address6)
    w.check()
    server_entry = lab.entry("server")
    server_addr = server_entry.address6 if w.ipv6 else server_entry.address
    if not server_addr:
        raise BadInput(f"lab {lab.name} has no {'IPv6 ' if w.ipv6 else ''}address for the server")
    cap_iface = lab.resolve_iface(capture.role, capture.iface) if capture else None
    if capture and lab.entry(capture.role).guest:
        # tcpdump would run (and write its pcap) inside the guest, where the probe cannot read it
        raise BadInput(f"--capture {capture.role}: {capture.role} is a QEMU guest, where measure cannot capture; "
                       f"run tcpdump there (`offlab lab exec {lab.name} {capture.role} -- tcpdump -nn -e -i "
                       f"{cap_iface}`) or capture on a namespace host of the lab")
    driver = engine_driver if w.tool == "engine" else iperf3_driver
    started_at = time.time()
    # Nothing changes the MTUs during a sample: read them beside the traffic, not after it (a guest's
    # read is a channel round trip, seconds on a loaded machine).
    mtu_read = beside.submit(mtus, lab)
    # testpmd's own read of its GRO/GSO/fwd: what the effect witnesses judge its counters against
    tp = Testpmd.for_lab(lab.name) if lab.has_testpmd else None
    tp_read = beside.submit(tp.settings) if tp is not None else None
    # a guest's own kernel account: offlab's hist triggers there, set before the probes open and put back
    # after they close (host_trace.py)
    with host_trace.triggers(lab, trace) as traced, \
            ProbeSession(lab, options=ProbeOptions(big_packets=w.big_packets,
                                                   queue_ifaces=_queue_ifaces(lab, settings)),
                         kernel_trace=trace, hist_trace=traced) as probes, \
            private_tmp("cap") as tmp:
        window = Window()
        probe_thread: threading.Thread | None = None
        side_thread: threading.Thread | None = None

        def on_started(client_pid: int, server_pid: int) -> None:
            nonlocal probe_thread, side_thread
            heard = time.monotonic()  # the window is timed from here, not from its thread's start
            if lab.daemons and lab.client.shares_kernel:
                threading.Thread(target=_watch_daemons, args=(lab, client_pid, traffic_done), daemon=True).start()
            if alongside is not None:
                side_thread = threading.Thread(target=alongside, daemon=True)
                side_thread.start()
            # A pid in a guest or on an SSH host is not a process of this machine's /proc.
            if lab.client.shares_kernel:
                probes.watch("client", client_pid)
            if lab.server.shares_kernel:
                probes.watch("server", server_pid)
            lead = 0.0 if w_run is w else CHANNEL_MARGIN_S
            probe_thread = threading.Thread(target=_window, args=(probes, w, capture, cap_iface, lab, tmp, window),
                                            kwargs={"lead": lead, "traffic_done": traffic_done,
                                                    "window_read": window_read, "heard": heard}, daemon=True)
            probe_thread.start()

        # A sender on a channel host (a guest's agent, SSH) starts a little after offlab hears of it,
        # and every snapshot there takes a round trip: the window starts CHANNEL_MARGIN_S later and
        # the traffic runs that much longer at each end, so the window stays inside traffic.
        w_run = w if lab.client.shares_kernel and lab.server.shares_kernel else \
            dataclasses.replace(w, duration=w.duration + 2 * CHANNEL_MARGIN_S)
        traffic_done = threading.Event()
        # Set once every host has read its counters at the window's end: the engine's sender stops there
        # rather than running out its margin (a guest's sender at full speed costs a whole CPU under TCG).
        window_read = threading.Event()
        stops_early = driver is engine_driver and w_run is not w
        try:
            traffic: TrafficResult = driver.run(lab.client, lab.server, server_addr, w_run, on_started=on_started,
                                                **({"stop_when": window_read} if stops_early else {}))
        finally:
            traffic_done.set()
        if probe_thread is not None:
            probe_thread.join(timeout=10)
        if side_thread is not None:
            side_thread.join(timeout=w.duration + 60)
        if window.error is not None:
            raise window.error
        if window.ended_early_s is not None or window.start is None or window.end is None:
            raise _ended_early(lab, w, traffic, window.ended_early_s)
        probe = probes.result(window.start, window.end, client_cpu=w.client_cpu, server_cpu=w.server_cpu)
        if window.capture is not None:
            _check_capture_saw_traffic(window.capture, probe.interfaces)
    probe.mtus = mtu_read.result(timeout=60)
    if tp_read is not None:
        probe.testpmd_settings = TestpmdSettings.from_json(tp_read.result(timeout=60))
    same_kernel = lab.client.shares_kernel and lab.server.shares_kernel
    guests = guests_of(lab)
    notes = sample_notes(probe, lab.mtu, guests, channel_margin_s=None if w_run is w else CHANNEL_MARGIN_S,
                         late_start_s=window.late_start_s, stopped_at_end=stops_early,
                         ended_before_s=window.ended_before_s,
                         gone=[r for r in probes.pids if not any(p.role == r for p in probe.processes)])
    sample = StoredSample.measured(
        lab=lab.name, topology=lab.topology, workload=SampleWorkload.from_json(w.to_dict()), started_at=started_at,
        traffic=traffic.stored(), probes=probe.stored(),
        service_demand_us_per_kib=service_demands(probe, traffic.throughput_bps, same_kernel),
        capture=window.capture.stored() if window.capture else None, notes=notes, guests=guests or None)
    return _witnessed(sample, settings)


def guests_of(lab: LabState) -> dict[str, Guest]:
    """role → how that guest of the lab ran, with each NIC's negotiation chain as it stood at the end of
    the traffic (read after it, so the guest round trips do not steal from the measured work): why its
    offloads were what they were."""
    guests = {role: Guest.keyed(**{k: e.guest.get(k) for k in GUEST_KEYS}) for role, e in lab.hosts.items()
              if e.guest}
    for role, chains in guest_chains(lab).items():
        guests[role] = guests[role].plus(nics=chains)
    return guests


@dataclass
class Window:
    """What the probe thread found around the traffic: the two snapshots, the capture, and why there
    may be no sample (the traffic ended early, an error to raise in the caller's thread)."""

    start: Snapshot | None = None
    end: Snapshot | None = None
    capture: CaptureSummary | None = None
    late_start_s: float | None = None  # no traffic seen on this machine's lab interfaces for this long
    ended_early_s: float | None = None
    ended_before_s: float | None = None  # the traffic ended this long before the window's planned end
    error: BaseException | None = None


def service_demands(probe: ProbeResult, throughput_bps: float, same_kernel: bool) -> dict[str, float | None]:
    """CPU µs per KiB on each side, and in total when both sides share this machine's kernel (netperf's
    definition: the whole system's CPU time; the pinned per-side figures are the split)."""
    kib = throughput_bps * probe.window_s / 8 / 1024
    sides = {side: probe.cpu.side(side) for side in ("client", "server")}
    sd: dict[str, float | None] = {side: service_demand(cpu.busy, probe.window_s, kib)
                                   for side, cpu in sides.items() if cpu is not None}
    if same_kernel:
        sd["total"] = system_service_demand(_system(probe).busy_s, kib)
    return sd


def _system(probe: ProbeResult) -> Cpu:
    """The whole machine's CPU over the window: the session always reads it."""
    assert probe.cpu.system is not None
    return probe.cpu.system


def sample_notes(probe: ProbeResult, lab_mtu: int, guests: dict[str, Guest], *, channel_margin_s: float | None,
                 late_start_s: float | None, stopped_at_end: bool = False,
                 ended_before_s: float | None = None, gone: Sequence[str] = ()) -> list[str]:
    """What a reader of the sample must know about how it was measured, one line each."""
    notes = []
    if gone:
        notes.append(f"{PROCESSES_GONE_MARK}: the {' and '.join(gone)} process(es) ended before the window did"
                     + (f" (the traffic ended {ended_before_s:.2f} s before the window's planned end, and the window "
                        f"with it)" if ended_before_s else "") + ": their CPU is not in its process list")
    if channel_margin_s is not None and stopped_at_end:
        notes.append(f"the window began {channel_margin_s:g} s after the warm-up, once the traffic flowed, and the "
                     f"sender was stopped once every host had read its counters at its end: a host here answers "
                     f"over a channel, so the window was kept inside the traffic")
    elif channel_margin_s is not None:
        notes.append(f"traffic ran {2 * channel_margin_s:g} s longer than the window, which began "
                     f"{channel_margin_s:g} s after the warm-up: a host here answers over a channel, so the "
                     f"window was kept inside the traffic")
    if late_start_s:
        notes.append(f"no traffic showed on this machine's lab interfaces within {late_start_s:g} s of the "
                     f"warm-up: the window began then, and may hold little of the traffic")
    steal = _system(probe).steal_pct or 0.0
    if steal >= NOTABLE_STEAL_PCT:
        notes.append(f"CPU steal {steal:.1f} % of the window: the hypervisor ran other work on "
                     f"these CPUs; expect noise")
    if any(max(d.rx_avg_bytes or 0, d.tx_avg_bytes or 0) > lab_mtu + ETH_HEADER for d in probe.interfaces.values()):
        notes.append(VETH_NOTE)
    for role, d in probe.snmp.items():
        pruned = rcvq_pruned(d)
        if pruned:
            notes.append(f"{RCVQ_MARK}: {role} hit its TCP receive-memory limit and pruned or collapsed its "
                         f"receive queue (" + ", ".join(f"{k} {v}" for k, v in pruned.items())
                         + "): this measured its socket receive memory (tcp_rmem), not only the path")
    tcg = [role for role, g in guests.items() if g.accel == "tcg"]
    if tcg:
        notes.append(f"{TCG_MARK}: {', '.join(tcg)} ran under TCG (an emulated CPU)")
    return notes


def _queue_ifaces(lab: LabState, settings: list[Held]) -> dict[str, list[str]]:
    """role → the interfaces whose per-queue packets a setting about queues (channels, xps) is witnessed
    by: every uplink of a namespace host (a veth's queue shows on its peer's), and on another host (a
    guest) the ones the settings name. None set: {} (nothing is read)."""
    named: dict[str, list[str]] = {}
    for s in settings:
        if effects.needs_queues(str(s.key or "")):
            role, _, iface = str(s.where or "").partition(":")
            named.setdefault(role, []).append(iface)
    if not named:
        return {}
    out = {}
    for role, entry in lab.hosts.items():
        here = entry.netns is not None and not entry.guest  # a namespace of this machine
        mine = [i.name for i in entry.interfaces if i.kind in UPLINK_KINDS] if here else []
        ifaces = list(dict.fromkeys(mine + named.get(role, [])))
        if ifaces:
            out[role] = ifaces
    return out


def _witnessed(sample: StoredSample, settings: list[Held]) -> StoredSample:
    """The sample's second witnesses, loss attribution, segmentation and effect witnesses (pure, over
    its own figures; what they clamp they clamp in its traffic, in order: each reads what the ones
    before it set)."""
    sample.notes += witnesses.bound(sample.traffic)
    short = witnesses.offered_short(sample.workload, sample.traffic)
    if short:
        sample.notes.append(short)
    sample.consistency = witnesses.cross_check(sample)
    sample.loss_attribution = witnesses.attribute_loss(sample)
    sample.segmentation = witnesses.segmentation(sample.probes, sample.probes.mtus)
    zc = witnesses.zerocopy(sample.traffic)
    if zc:
        sample.notes.append(zc)
    big = witnesses.big_packets(sample.probes)
    if big:
        sample.notes.append(big)
    sample.notes += witnesses.out_of_range(sample)
    sample.effects = [e.stored() for e in effects.witness(sample, settings)]
    return _judged(sample)


def _judged(sample: StoredSample) -> StoredSample:
    """The sample's `kernel_account` (where `--trace` took one), and its notes."""
    ka = sample.kernel_account = kernel_account.judge(sample)
    if ka is not None and ka.unavailable is not None:
        sample.notes.append(f"kernel account not taken: {ka.unavailable}")
    elif ka is not None and ka.not_traced:
        sample.notes.append(f"kernel account partial: not traced {'; '.join(ka.not_traced)}")
    sample.notes += kernel_account.disagreements(ka)
    return sample


def _watch_daemons(lab: LabState, client_pid: int, done: threading.Event) -> None:
    """A lab daemon (testpmd, ovs-vswitchd, QEMU) that dies mid-traffic takes the path with it and
    the sender would wait out its timeout: end the sender (ours, by pid) so the cell fails now."""
    while not done.wait(WATCH_INTERVAL_S):
        if labs.daemon_died(lab) is not None:
            lab.client.signal(client_pid, signal.SIGTERM)
            return


WATCH_INTERVAL_S = 0.5


def _ended_early(lab: LabState, w: Workload, traffic: TrafficResult, early_s: float | None) -> OfflabError:
    """The traffic stopped before the window's end: no sample, and why, in one line."""
    gone = [role for role in ("client", "server") if not lab.host(role).alive()]
    when = f"{early_s:.1f} s before the end of its {w.duration:g} s window" if early_s else "before its window began"
    if gone:
        return EnvironmentProblem(f"lab {lab.name}: the traffic ended {when}: host {', '.join(gone)} is gone "
                                  f"(was the lab removed? `offlab lab list`); nothing measured")
    return EnvironmentProblem(f"lab {lab.name}: the {traffic.tool} traffic ended {when}; nothing measured "
                              f"(run `offlab measure {lab.name}` again; `offlab doctor` checks the lab)")


def _window(probes: ProbeSession, w: Workload, capture: CaptureRequest | None, cap_iface: str | None,
            lab: LabState, tmp: str, out: Window, *, heard: float, lead: float = 0.0,
            traffic_done: threading.Event | None = None, window_read: threading.Event | None = None) -> None:
    """The capture listening (if one is asked), warm-up (+ `lead`, and for a channel host until traffic
    flows), first snapshot, the window, second snapshot; timed from `heard` (when offlab heard the traffic
    had started). Traffic that ends before the window does ends the window at once: by
    more than the tolerance, with `ended_early_s` saying by how much (the caller gives no sample then);
    by less, with `ended_before_s` (the sample says so). `window_read` is set once every host's counters
    at the window's end are in (a channel host's answer waited for), or on a failure."""
    cap = None
    try:
        t0 = heard + lead
        # the capture's host and interface (the interface is resolved whenever a capture is asked)
        at = (capture.role, cap_iface) if capture is not None and cap_iface is not None else None
        if at is not None and capture is not None:
            # Listening before the window opens, not as it opens: on a loaded machine tcpdump's start (its
            # exec in the namespace, libpcap's socket) took longer than a 1-s window, and the capture of a
            # sample whose traffic crossed the interface came back with no frame at all.
            cap = Capture(lab.host(at[0]), at[1], Path(tmp) / "wire.pcap", frames=capture.frames)
            cap.wait_ready()
        time.sleep(max(0.0, t0 + w.warmup - time.monotonic()))
        if lead:
            seen = probes.wait_for_traffic(CHANNEL_START_WAIT_S)
            if seen or time.monotonic() > t0 + w.warmup + 0.1:
                t0 = time.monotonic() - w.warmup  # the window starts when the traffic is seen to flow
            if not seen and probes.readers:
                out.late_start_s = CHANNEL_START_WAIT_S
        out.start = probes.snapshot()
        end = t0 + w.warmup + w.duration - END_MARGIN_S
        done = traffic_done or threading.Event()
        if done.wait(max(0.0, end - time.monotonic())):
            left = end - time.monotonic()
            # A tool's own clock starts a little before offlab hears of it: a few tenths early is normal.
            if left > max(EARLY_END_TOLERANCE_S, 0.1 * w.duration):
                out.ended_early_s = left
            elif left > 0:
                # the window ends with the traffic, not in idle time after it (that would dilute its rates)
                out.ended_before_s = left
        out.end = probes.snapshot()
        if window_read is not None:
            probes.settle(out.end)  # a channel host reads its counters when the request gets there
            window_read.set()
        if cap is not None and at is not None:
            dropped = cap.stop()
            mtu = _mtu(lab, at[0], at[1])
            linktype, frames = read_pcap(cap.pcap) if cap.pcap.exists() else (1, [])
            summary: CaptureSummary = summarize(frames, host=at[0], iface=at[1], mtu=mtu,
                                                linktype=linktype)
            summary.kernel_dropped = dropped
            out.capture = summary
    except Exception as exc:  # handed to the caller's thread, which raises it
        if cap is not None and out.capture is None:
            cap.stop()
        out.error = exc
    finally:
        if window_read is not None:
            window_read.set()


def _check_capture_saw_traffic(cap: CaptureSummary, interfaces: dict[str, Iface]) -> None:
    """A capture with no frame of a window whose traffic crossed its interface proves nothing about that
    traffic: an error to say, never a figure (a sample that says "largest frame 0" under a loaded CPU)."""
    counted = interfaces.get(f"{cap.host}:{cap.iface}") or Iface()
    crossed = counted.packets("rx") + counted.packets("tx")
    if cap.frames == 0 and crossed:
        raise EnvironmentProblem(
            f"the capture on {cap.host}:{cap.iface} saw no frame while {crossed} packets crossed it in the window "
            f"(tcpdump dropped {cap.kernel_dropped or 0}); nothing measured: run the sample again on a less "
            f"loaded machine, or without the capture")


def _mtu(lab: LabState, role: str, iface: str) -> int:
    from offlab import netdev

    return int(netdev.link(lab.host(role), iface).mtu or 0)


# The loaded RR probe ends this long before the stream does, so it never sees the stream stop.
LOADED_END_MARGIN_S = 0.2


def measure_rr(lab: LabState, rw: rr_driver.RrWorkload, *, big_packets: bool = False,
               trace: bool = False) -> StoredSample:
    """One request/response sample with CPU, interface and softnet probes over its window (after warm-up);
    with `big_packets`, the packets over 64 KiB per interface too (BIG TCP's proof, as for a stream);
    with `trace`, the kernel's own account of the window (drops by reason, skbs per device), as a stream's."""
    rw.ipv6 = rw.ipv6 and bool(lab.entry("server").address6)
    rw.check()
    started_at = time.time()
    with forwarding(lab), host_trace.triggers(lab, trace) as traced, \
            ProbeSession(lab, options=ProbeOptions(big_packets=big_packets), kernel_trace=trace, hist_trace=traced) as probes:
        window = Window()
        probe_thread: threading.Thread | None = None

        def on_started(client_pid: int, server_pid: int) -> None:
            nonlocal probe_thread
            heard = time.monotonic()
            if lab.client.shares_kernel:
                probes.watch("client", client_pid)
            if lab.server.shares_kernel:
                probes.watch("server", server_pid)
            probe_thread = threading.Thread(target=_window, args=(probes, rw, None, None, lab, "", window),
                                            kwargs={"heard": heard}, daemon=True)
            probe_thread.start()

        result = rr_driver.run_lab(lab, rw, on_started=on_started)
        if probe_thread is not None:
            probe_thread.join(timeout=10)
        if window.error is not None:
            raise window.error
        if window.start is None or window.end is None:
            raise EnvironmentProblem(f"lab {lab.name}: the request/response traffic ended before its window; "
                                     f"nothing measured (run `offlab measure {lab.name} --workload rr` again)")
        probe = probes.result(window.start, window.end, client_cpu=rw.client_cpu, server_cpu=rw.server_cpu)
    probes_read = probe.stored()
    idle = result.stored(cpu=probe.cpu.without_per_cpu(),
                         cpu_us_per_transaction=cpu_per_transaction(probe, result.transactions_per_s))
    notes = [f"rr kernel check: {result.kernel_check['status']}"] if result.kernel_check else []
    big = witnesses.big_packets(probes_read)
    if big:
        notes.append(big)
    sample = rr_sample(lab.name, lab.topology, rw, started_at, idle, probes_read, notes)
    return _judged(sample) if trace else sample


def rr_sample(lab: str, topology: str, rw: rr_driver.RrWorkload, started_at: float, idle: RrPhase, probes: Probes,
              notes: list[str]) -> StoredSample:
    """A request/response sample: the probe's round trips (`rr.idle`) and the counters over its window."""
    return StoredSample.measured(lab=lab, topology=topology, workload=SampleWorkload.from_json({"kind": "rr", **rw.to_dict()}),
                                 started_at=started_at, probes=probes, notes=notes, rr=Rr(idle=idle))


def cpu_per_transaction(probe: ProbeResult, tps: float) -> float | None:
    """The whole system's CPU µs per transaction over the probe window (both ends share this kernel)."""
    n = tps * probe.window_s
    busy_s = _system(probe).busy_s
    return busy_s * 1e6 / n if n > 0 and busy_s is not None else None


def check_under_load(w: Workload) -> Workload:
    """The stream of rr-under-load: a valid workload long enough to hold the loaded probe."""
    w.check()
    if w.duration <= 2 * LOADED_END_MARGIN_S:
        raise BadInput(f"--duration {w.duration:g}: rr-under-load needs more than {2 * LOADED_END_MARGIN_S:g} s "
                       f"(the RR probe ends {LOADED_END_MARGIN_S:g} s before the stream)")
    return w


def measure_rr_under_load(lab: LabState, w: Workload, rw: rr_driver.RrWorkload,
                          capture: CaptureRequest | None = None, *, trace: bool = False) -> StoredSample:
    """flent's RRUL idea on one path: the RR probe alone first (idle), then the stream `w` with the
    same probe running beside it (loaded). One sample: the stream's throughput and both sets of rtt.
    With `trace`, each phase's kernel account: the loaded one is the sample's, the idle one `rr.idle`'s."""
    check_under_load(w)
    idle = measure_rr(lab, rw, trace=trace)
    loaded_w = dataclasses.replace(rw, warmup=w.warmup, duration=w.duration - LOADED_END_MARGIN_S)
    got: dict = {}

    def probe() -> None:
        try:
            got["result"] = rr_driver.run_lab(lab, loaded_w, count_packets=False)
        except Exception as exc:  # handed to this thread's caller
            got["error"] = exc

    sample = measure(lab, w, capture, alongside=probe, trace=trace)
    if "error" in got:
        raise got["error"]
    if "result" not in got:
        raise rr_driver.TrafficFailed("the loaded RR probe did not finish with the stream")
    return under_load(sample, idle, got["result"].stored(), w, rw)


def under_load(stream: StoredSample, idle: StoredSample, loaded: RrPhase, w: Workload,
               rw: rr_driver.RrWorkload) -> StoredSample:
    """The sample of stream `w` made rr-under-load's: its workload with the probe's, the probe's round
    trips alone (`idle`'s sample, with its kernel account) and beside the stream (`loaded`), and their factor."""
    assert idle.rr is not None and idle.rr.idle is not None  # measure_rr's sample always has its rr figures
    base = idle.rr.idle
    base.kernel_account = idle.kernel_account
    # w is the stream as measure checked it: the sample's workload, with what kind it was first
    stream.workload = SampleWorkload.from_json({"kind": "rr-under-load", **w.to_dict(), "rr": rw.to_dict()})
    stream.rr = Rr(idle=base, loaded=loaded, loaded_over_idle={
        k: (getattr(loaded, k) / getattr(base, k) if getattr(loaded, k) and getattr(base, k) else None)
        for k in ("rtt_p50_us", "rtt_p99_us", "rtt_p99_9_us", "rtt_mean_us")})
    stream.notes.append(f"rr idle: measured alone just before the stream ({base.window_s:.1f} s window); rr "
                        f"loaded: the same probe beside the {w.tool} {w.protocol} stream on the same path and CPUs")
    if loaded.transactions == 0:
        stream.notes.append("under load no RR transaction was answered: the stream starved the probe")
    return stream
