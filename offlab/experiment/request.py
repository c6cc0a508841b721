"""What `offlab measure` was asked for (a request of plain values), checked into workloads, then run;
and what `offlab run` / `suite run` change in the plans they run (PlanOverrides).

The CLI maps its options to a `MeasureRequest` and prints what `run` returns; every value is checked
here (`check`, pure: no lab is read) before the lab is even loaded, so no child tool starts on a bad one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offlab.errors import BadInput
from offlab.names import IFNAME_RE, ROLE_RE

if TYPE_CHECKING:  # imported where used: the CLI reads MeasureRequest's defaults at start-up
    from offlab.experiment.measure import CaptureRequest
    from offlab.experiment.plan import Plan
    from offlab.sample import Held, StoredSample
    from offlab.traffic import Workload
    from offlab.traffic.rr import RrWorkload

MAX_FRAMES = 1_000_000  # the same bound as a plan's capture.frames
WORKLOADS = ("stream", "rr", "rr-under-load")
RR_PROTOCOLS = ("udp", "tcp", "tcp-crr")


@dataclass(frozen=True)
class MeasureRequest:
    """One measurement as asked, option by option (the defaults are the CLI's)."""

    lab: str
    workload: str = "stream"  # stream | rr | rr-under-load
    tool: str = "iperf3"
    proto: str | None = None  # None: the tool's default (rr: udp)
    size: int | None = None
    gso: bool = False
    gro: bool = False
    batch: int | None = None
    send: str | None = None
    rate: str | None = None  # stream: bit/s or pps; rr: transactions/s
    streams: int = 1
    duration: float = 2.0
    warmup: float = 0.5
    ipv6: bool = False
    big_packets: bool = False
    trace: bool = False  # the kernel's account from its tracepoints (offlab.probes.trace)
    capture: str | None = None  # HOST[:IFACE]
    frames: int = 2000
    request_size: int = 64
    response_size: int = 64
    flows: int = 1
    rr_timeout: float = 1.0
    rr_proto: str = "udp"  # rr-under-load: the probe's protocol (proto is the stream's)
    rr_rate: str | None = None  # rr-under-load: the probe's transactions/s


@dataclass
class MeasureJob:
    """A checked request: the workloads to run and where to capture."""

    lab: str
    kind: str  # stream | rr | rr-under-load
    stream: Workload | None  # None for rr
    rr: RrWorkload | None  # None for stream
    capture: CaptureRequest | None
    big_packets: bool = False  # rr: count packets over 64 KiB (a stream's workload carries its own)
    trace: bool = False  # the kernel's account from its tracepoints (a stream's and an rr's)


def check(req: MeasureRequest) -> MeasureJob:
    """Every value of `req` checked, in the order the options are documented; BadInput names the option."""
    from offlab.experiment.measure import check_under_load
    from offlab.traffic import Workload, default_protocol

    if req.workload not in WORKLOADS:
        raise BadInput(f"--workload {req.workload!r}: choose stream, rr or rr-under-load")
    if req.workload == "rr":
        # --rate is transactions/s here; --proto also takes tcp-crr.
        return MeasureJob(req.lab, req.workload, None, _rr(req, req.proto or "udp", req.rate), None,
                          big_packets=req.big_packets, trace=req.trace)
    probe: RrWorkload | None = None
    if req.workload == "rr-under-load":
        if req.rr_proto not in RR_PROTOCOLS:
            raise BadInput(f"--rr-proto {req.rr_proto!r}: the probe is udp, tcp or tcp-crr (--proto is the stream's)")
        probe = _rr(req, req.rr_proto, req.rr_rate)
    # tool and protocol are any text here: Workload.check names a bad one
    w = Workload(tool=req.tool, protocol=req.proto or default_protocol(req.tool),  # type: ignore[arg-type]
                 size=req.size, gso=req.gso, gro=req.gro, batch=req.batch, send=req.send, rate=req.rate, streams=req.streams,
                 duration=req.duration, warmup=req.warmup, ipv6=req.ipv6, big_packets=req.big_packets).check()
    if probe is not None:
        check_under_load(w)
    if not 1 <= req.frames <= MAX_FRAMES:
        raise BadInput(f"--frames {req.frames}: 1..{MAX_FRAMES}")
    return MeasureJob(req.lab, req.workload, w, probe, capture_request(req.capture, req.frames), trace=req.trace)


def capture_request(text: str | None, frames: int) -> CaptureRequest | None:
    """`HOST[:IFACE]` → a capture request; the host and interface are looked up in the lab later."""
    from offlab.experiment.measure import CaptureRequest

    if text is None:
        return None
    role, _, iface = text.partition(":")
    if not ROLE_RE.fullmatch(role) or (iface and not IFNAME_RE.fullmatch(iface)):
        raise BadInput(f"--capture {text!r}: write HOST[:IFACE], e.g. server or switch:to-server")
    return CaptureRequest(role, iface or None, frames)


def _rr(req: MeasureRequest, protocol: str, rate: str | None) -> RrWorkload:
    from offlab.traffic import rr

    return rr.RrWorkload(protocol=protocol, request_size=req.request_size,  # type: ignore[arg-type]
                         response_size=req.response_size, flows=req.flows, rate=rr.parse_tps(rate),
                         duration=req.duration, warmup=req.warmup, timeout=req.rr_timeout, ipv6=req.ipv6).check()


def run(job: MeasureJob) -> StoredSample:
    """Run a checked job in its lab, holding the lab meanwhile (`lab down` refuses it, issue #14 item 8)."""
    from offlab.experiment.measure import measure, measure_rr, measure_rr_under_load
    from offlab.lab import LabState, hold

    state = LabState.load(job.lab)
    if job.kind == "rr":
        assert job.rr is not None
        with hold(job.lab, "offlab measure --workload rr"):
            return measure_rr(state, job.rr, big_packets=job.big_packets, trace=job.trace)
    assert job.stream is not None
    if job.stream.ipv6 and not state.ipv6:
        raise BadInput(f"lab {job.lab} has no IPv6 addresses: rebuild it with `offlab lab up ... --ipv6`")
    if job.capture is not None:
        state.resolve_iface(job.capture.role, job.capture.iface)  # fail before any traffic
    with hold(job.lab, "offlab measure"):
        if job.rr is None:
            return measure(state, job.stream, job.capture, settings=lab_settings(state), trace=job.trace)
        return measure_rr_under_load(state, job.stream, job.rr, job.capture, trace=job.trace)


def lab_settings(state) -> list[Held]:
    """The settings `lab set` made on the lab and that still hold (its journal): each gets an effect witness."""
    from offlab.knobs import pending_changes
    from offlab.sample import Held

    role_of = {e.netns: role for role, e in state.hosts.items() if e.netns and not e.guest}
    held: dict[tuple, Held] = {}
    for c in pending_changes(role_of, state.name):  # newest first: a later `lab set` of a key wins
        where = f"{c['host']}:{c['iface']}" if c.get("iface") else str(c["host"])
        held.setdefault((where, c["key"]), Held(where=where, key=c["key"], value=c["value"]))
    return list(held.values())


UNTIL = ("decided", "width")


@dataclass(frozen=True)
class PlanOverrides:
    """`--budget` (shared out over the plans of a suite as they run) and `--until`, over the plans' own."""

    budget: str | None = None
    until: str | None = None
    trace: bool = False  # --trace: every stream sample takes the kernel's account, whatever the plan says


def override(plans: list[Plan], o: PlanOverrides) -> list[Plan]:
    """The plans with `o` applied (in place); BadInput names the option. Checked before any plan is touched."""
    from offlab.experiment.plan.load import parse_budget

    if o.until is not None and o.until not in UNTIL:
        raise BadInput(f"--until {o.until!r}: choose decided or width")
    seconds = parse_budget(o.budget, "--budget") if o.budget is not None else None
    for p in plans:
        if o.until is not None:
            p.repeat = p.repeat.model_copy(update={"until": o.until})
        if seconds is not None:
            p.budget_s = seconds / len(plans)
        if o.trace:
            p.trace = True
    return plans
