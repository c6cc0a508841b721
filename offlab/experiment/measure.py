"""One measured sample: traffic plus every probe, over the window after warm-up."""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from offlab.errors import BadInput
from offlab.lab.model import LabState
from offlab.metrics import TCG_MARK
from offlab.probes import ProbeSession, service_demand, system_service_demand
from offlab.probes.cpu import NOTABLE_STEAL_PCT
from offlab.experiment import witnesses
from offlab.probes.capture import Capture, CaptureSummary, read_pcap, summarize
from offlab.traffic import TrafficResult, Workload
from offlab.traffic import engine as engine_driver
from offlab.traffic import iperf3 as iperf3_driver

# Probes stop this much before the sender does, so the second snapshot is still inside traffic.
END_MARGIN_S = 0.05
CHANNEL_MARGIN_S = 1.0

VETH_NOTE = ("a veth counts a GSO/GRO super-packet once: an average near 64 KiB on a veth is the proof "
             "that the super-packet crossed it unsegmented")


@dataclass
class CaptureRequest:
    role: str
    iface: str | None = None  # None: the host's only veth
    frames: int = 2000


@dataclass
class Sample:
    lab: str
    topology: str
    workload: dict
    started_at: float
    traffic: dict
    probes: dict
    service_demand_us_per_kib: dict
    capture: dict | None = None
    notes: list[str] = field(default_factory=list)
    search: dict | None = None  # zero-loss search steps, when the sample came from one
    consistency: dict | None = None  # second witnesses for the headline figures (offlab.experiment.witnesses)
    loss_attribution: dict | None = None  # where lost datagrams died, from counters
    guests: dict | None = None  # role → how that guest ran (accel, vhost, QEMU, kernel): TCG marks the sample emulated

    def to_dict(self) -> dict:
        return asdict(self)

    # Headline figures, named once so every output agrees.
    @property
    def throughput_bps(self) -> float:
        return self.traffic["throughput_bps"]


def measure(lab: LabState, w: Workload, capture: CaptureRequest | None = None) -> Sample:
    """Run `w` from client to server of `lab` with all probes, and return the sample."""
    w.ipv6 = w.ipv6 and bool(lab.entry("server").address6)
    w.check()
    server_entry = lab.entry("server")
    server_addr = server_entry.address6 if w.ipv6 else server_entry.address
    if not server_addr:
        raise BadInput(f"lab {lab.name} has no {'IPv6 ' if w.ipv6 else ''}address for the server")
    cap_iface = lab.resolve_iface(capture.role, capture.iface) if capture else None
    driver = engine_driver if w.tool == "engine" else iperf3_driver
    started_at = time.time()
    with ProbeSession(lab) as probes, tempfile.TemporaryDirectory(prefix="offlab-cap-") as tmp:
        window: dict = {}
        probe_thread: threading.Thread | None = None

        def on_started(client_pid: int, server_pid: int) -> None:
            nonlocal probe_thread
            # A pid in a guest or on an SSH host is not a process of this machine's /proc.
            if lab.client.shares_kernel:
                probes.watch("client", client_pid)
            if lab.server.shares_kernel:
                probes.watch("server", server_pid)
            probe_thread = threading.Thread(target=_window, args=(probes, w, capture, cap_iface, lab, tmp, window),
                                            daemon=True)
            probe_thread.start()

        # A sender on a channel host (a guest's agent, SSH) starts a little after offlab hears of it,
        # and every snapshot there takes a round trip: it runs longer, so the window stays inside traffic.
        w_run = w if lab.client.shares_kernel and lab.server.shares_kernel else \
            dataclasses.replace(w, duration=w.duration + CHANNEL_MARGIN_S)
        traffic: TrafficResult = driver.run(lab.client, lab.server, server_addr, w_run, on_started=on_started)
        if probe_thread is not None:
            probe_thread.join(timeout=10)
        if "error" in window:
            raise window["error"]
        probe = probes.result(window["a"], window["b"], client_cpu=w.client_cpu, server_cpu=w.server_cpu)
        cap = window.get("capture")
    kib = traffic.throughput_bps * probe["window_s"] / 8 / 1024
    sd = {side: service_demand(probe["cpu"][side]["busy"], probe["window_s"], kib)
          for side in ("client", "server") if side in probe["cpu"]}
    system = probe["cpu"]["system"]
    # Both ends run on this machine's kernel: the whole system's CPU time is their total (netperf's
    # definition; the pinned per-side figures above are the split).
    if lab.client.shares_kernel and lab.server.shares_kernel:
        sd["total"] = system_service_demand(system["busy_s"], kib)
    notes = []
    if w_run is not w:
        notes.append(f"traffic ran {CHANNEL_MARGIN_S:g} s longer than the window: a host here answers over a "
                     f"channel, so the window was kept inside the traffic")
    if system["steal_pct"] >= NOTABLE_STEAL_PCT:
        notes.append(f"CPU steal {system['steal_pct']:.1f} % of the window: the hypervisor ran other work on "
                     f"these CPUs; expect noise")
    if any(max(d["rx_avg_bytes"] or 0, d["tx_avg_bytes"] or 0) > lab.mtu + 14 for d in probe["interfaces"].values()):
        notes.append(VETH_NOTE)
    guests = {role: {k: e.guest.get(k) for k in ("accel", "vhost", "qemu_version", "kernel_release")}
              for role, e in lab.hosts.items() if e.guest}
    if any(g["accel"] == "tcg" for g in guests.values()):
        notes.append(f"{TCG_MARK}: {', '.join(r for r, g in guests.items() if g['accel'] == 'tcg')} ran under "
                     f"TCG (an emulated CPU)")
    sample = Sample(lab=lab.name, topology=lab.topology, workload=w.to_dict(), started_at=started_at,
                    traffic=traffic.to_dict(), probes=probe, service_demand_us_per_kib=sd,
                    capture=cap.to_dict() if cap else None, notes=notes, guests=guests or None)
    d = {"traffic": sample.traffic, "probes": probe, "workload": sample.workload}
    sample.notes += witnesses.bound(sample.traffic)
    sample.consistency = witnesses.cross_check(d)
    sample.loss_attribution = witnesses.attribute_loss(d)
    return sample


def _window(probes: ProbeSession, w: Workload, capture: CaptureRequest | None, cap_iface: str | None,
            lab: LabState, tmp: str, out: dict) -> None:
    """Warm-up, first snapshot (and capture start), the window, second snapshot."""
    try:
        t0 = time.monotonic()
        time.sleep(w.warmup)
        out["a"] = probes.snapshot()
        cap = None
        if capture:
            cap = Capture(lab.host(capture.role), cap_iface, Path(tmp) / "wire.pcap", frames=capture.frames)
            cap.wait_ready()
        time.sleep(max(0.0, t0 + w.warmup + w.duration - END_MARGIN_S - time.monotonic()))
        out["b"] = probes.snapshot()
        if cap:
            dropped = cap.stop()
            mtu = _mtu(lab, capture.role, cap_iface)
            linktype, frames = read_pcap(cap.pcap) if cap.pcap.exists() else (1, [])
            summary: CaptureSummary = summarize(frames, host=capture.role, iface=cap_iface, mtu=mtu,
                                                linktype=linktype)
            summary.kernel_dropped = dropped
            out["capture"] = summary
    except Exception as exc:  # handed to the caller's thread, which raises it
        out["error"] = exc


def _mtu(lab: LabState, role: str, iface: str) -> int:
    from offlab import netdev

    return int(netdev.link(lab.host(role), iface)["mtu"])
