"""`offlab measure`: one measured run in an existing lab, with every probe."""

from __future__ import annotations

import json
from typing import Optional

from typing import TYPE_CHECKING

import typer
from offlab.cli.console import OnFirstUse

from offlab.experiment.request import MeasureRequest

if TYPE_CHECKING:  # the printers import what they read, so another command's start does not
    from offlab.sample import Rr, RrPhase, StoredSample

out = OnFirstUse()


def register(app: typer.Typer) -> None:
    app.command("measure")(measure_cmd)


_D = MeasureRequest(lab="")  # the options' defaults are the request's


def measure_cmd(
    lab: str = typer.Argument(..., help="An existing lab (offlab lab list)."),
    tool: str = typer.Option(_D.tool, "--tool", help="iperf3 | engine"),
    proto: Optional[str] = typer.Option(_D.proto, "--proto", help="tcp | udp (default: udp for the engine, tcp for iperf3)"),
    size: Optional[int] = typer.Option(_D.size, "--size", help="UDP payload per datagram / TCP write length, bytes."),
    gso: bool = typer.Option(_D.gso, "--gso", help="engine: UDP_SEGMENT on the sender."),
    gro: bool = typer.Option(_D.gro, "--gro", help="engine: UDP_GRO on the receiver."),
    batch: Optional[int] = typer.Option(_D.batch, "--batch", help="engine: sendmmsg/recvmmsg batch, or linked SQEs "
                                                                "per io_uring_enter with --send io_uring[-zc]."),
    send: Optional[str] = typer.Option(_D.send, "--send", help="engine: send | sendmmsg | zerocopy (MSG_ZEROCOPY, "
                                                              "completions and kernel copies reported) | io_uring "
                                                              "(IORING_OP_SEND) | io_uring-zc (IORING_OP_SEND_ZC)."),
    rate: Optional[str] = typer.Option(_D.rate, "--rate", help="Packets/s (100kpps, 10Mpps; engine only) or bit/s (250M, 1G); default: as fast as possible."),
    streams: int = typer.Option(_D.streams, "--streams", help="iperf3 parallel streams."),
    duration: float = typer.Option(_D.duration, "--duration", help="Seconds measured (after warm-up)."),
    warmup: float = typer.Option(_D.warmup, "--warmup", help="Seconds of traffic before the window opens."),
    ipv6: bool = typer.Option(_D.ipv6, "--ipv6", help="Use the lab's IPv6 addresses."),
    big_packets: bool = typer.Option(_D.big_packets, "--big-packets", help="Count packets over 64 KiB on every interface of "
                                                                          "the lab's namespaces (nftables; BIG TCP's proof)."),
    trace: bool = typer.Option(_D.trace, "--trace", help="The kernel's own account of the window: drops by reason "
                                                         "and skbs by gso_type per device, from tracepoints "
                                                         "(bpftrace in this machine's namespaces; tracefs hist "
                                                         "triggers in a guest's or an SSH host's own kernel)."),
    capture: Optional[str] = typer.Option(_D.capture, "--capture", help="HOST[:IFACE] to capture on (IFACE may be to-<host>)."),
    frames: int = typer.Option(_D.frames, "--frames", help="Frames to capture."),
    as_json: bool = typer.Option(False, "--json", help="Print the sample as JSON (with its per-interval series)."),
    workload: str = typer.Option(_D.workload, "--workload", help="stream | rr (request/response with offlab-engine) | "
                                                                "rr-under-load (rr alone, then rr beside the stream)."),
    request_size: int = typer.Option(_D.request_size, "--request-size", help="rr: bytes per request."),
    response_size: int = typer.Option(_D.response_size, "--response-size", help="rr: bytes per response."),
    flows: int = typer.Option(_D.flows, "--flows", help="rr: parallel flows."),
    rr_timeout: float = typer.Option(_D.rr_timeout, "--timeout", help="rr: seconds before a transaction counts as lost."),
    rr_proto: str = typer.Option(_D.rr_proto, "--rr-proto", help="rr-under-load: the probe's udp | tcp | tcp-crr "
                                                                "(--proto is the stream's)."),
    rr_rate: Optional[str] = typer.Option(_D.rr_rate, "--rr-rate", help="rr-under-load: the probe's transactions/s "
                                                                       "(default: closed loop)."),
) -> None:
    """Run one measurement in a lab: throughput, pps, loss, CPU per side, service demand, wire proof."""
    options = dict(locals())  # first: every parameter, nothing else
    as_json = options.pop("as_json")
    from offlab.experiment import request

    job = request.check(request_from_options(options))
    s = request.run(job)
    if as_json:
        typer.echo(json.dumps(json_doc(s, job.kind), indent=2, default=str))
        return
    if job.kind == "rr":
        from rich.markup import escape

        print_rr(s)
        print_kernel_account(s)
        for note in s.notes:
            out.print(f"  [dim]note: {escape(note)}[/dim]")
        return
    print_sample(s)
    if s.rr:
        print_rr_under_load(s.rr)


def json_doc(s: StoredSample, kind: str) -> dict:
    """What `--json` prints: the sample as stored; an rr sample's result on top, with its probes and notes."""
    if kind != "rr" or not s.rr or not s.rr.idle:
        return s.to_json()
    return {**s.rr.idle.to_json(), "probes": s.probes.to_json(), "notes": s.notes,
            **({"kernel_account": s.kernel_account.to_json()} if s.kernel_account is not None else {})}


def request_from_options(options: dict) -> MeasureRequest:
    """`offlab measure`'s options (its parameters by name, --json left out) → the request they ask for."""
    return MeasureRequest(**options)


def print_kernel_account(s: StoredSample) -> None:
    """The kernel's account of the sample (--trace), as `results show` prints it: loss by reason, segmentation."""
    if s.kernel_account is None:
        return
    from rich.markup import escape

    from offlab.report import kernel  # here, not on every CLI start

    account = kernel.merge([s.kernel_account])
    for line in kernel.loss_lines(account) + kernel.segmentation_lines(account):
        out.print(f"  {escape(line)}")


def print_rr(s: StoredSample) -> None:
    from offlab.sample import RrPhase
    from offlab.traffic import rr

    res = s.rr.idle if s.rr and s.rr.idle else RrPhase()
    stored = res.to_json()
    for line in rr.RrResult(**{k: stored[k] for k in rr.RrResult.__dataclass_fields__ if k in stored}).summary_lines():
        out.print(line)
    _print_series([x.to_json() for x in res.series], "rtt_p99_us", lambda v: f"{v:.1f} µs", "rtt p99")
    out.print(_rr_cpu_line(res))


def _rr_cpu_line(res: RrPhase) -> str:
    cpus = [(side, res.cpu.side(side)) for side in ("client", "server")] if res.cpu is not None else []
    sides = "  ".join(f"{side} {c.cpu} {c.busy:.0f} % busy" for side, c in cpus if c is not None)
    per = res.cpu_us_per_transaction
    return f"  cpu          {sides}; {'-' if per is None else f'{per:.1f}'} µs CPU per transaction (whole system)"


RTT_ROWS = (("rtt_p50_us", "p50"), ("rtt_p90_us", "p90"), ("rtt_p99_us", "p99"), ("rtt_p99_9_us", "p99.9"),
            ("rtt_max_us", "max"), ("rtt_mean_us", "mean"))


def print_rr_under_load(rr: Rr) -> None:
    """Idle vs loaded round trips side by side, with the factor."""
    from rich.table import Table

    from offlab.sample import RrPhase

    idle, loaded, x = rr.idle or RrPhase(), rr.loaded or RrPhase(), rr.loaded_over_idle
    t = Table("rtt (whole round trip)", "idle (just before)", "under load", "× idle", box=None)
    for key, label in RTT_ROWS:
        f = x.get(key)
        t.add_row(label, _us(getattr(idle, key)), _us(getattr(loaded, key)), "-" if f is None else f"{f:.1f}")
    t.add_row("transactions/s", f"{idle.transactions_per_s:.0f}", f"{loaded.transactions_per_s:.0f}", "")
    t.add_row("lost", str(idle.lost), str(loaded.lost), "")
    out.print(f"  rr {idle.protocol} {idle.request_size}/{idle.response_size} B, {idle.flows} flow(s):")
    out.print(t)
    out.print(_rr_cpu_line(idle).replace("cpu         ", "idle cpu    "))


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} µs"


def _si(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.2f} {prefix}{unit}"
    return f"{v:.0f} {unit}"


def _print_series(series: list[dict], col: str, fmt, label: str) -> None:
    """One line: the first series' `col` per interval over the window as a sparkline, min and max."""
    from offlab.traffic.series import summary

    if series:
        out.print(f"  {label:<11} " + summary(series[0], col, fmt), markup=False, highlight=False)


def print_sample(s: StoredSample) -> None:
    from rich.markup import escape
    from rich.table import Table

    from offlab.metrics import NOT_EXERCISED
    from offlab.probes.edge.dpdk_ports import TestpmdPorts
    from offlab.probes.edge.softnet import SoftnetStat

    t, p, w = s.traffic, s.probes, s.workload
    what = f"{w.tool} {w.protocol}" + (f" {w.size} B" if w.size else "") + \
        (" gso" if w.gso else "") + (" gro" if w.gro else "")
    out.print(f"[bold]{s.lab}[/bold] ({s.topology}) {what}: window {p.window_s:.2f} s after "
              f"{w.warmup:g} s warm-up")
    out.print(f"  throughput  {_si(t.throughput_bps, 'bit/s')} received"
              + (f"   (sent {_si(t.sent_bps, 'bit/s')})" if t.sent_bps else ""))
    if t.pps is not None:
        out.print(f"  datagrams   {_si(t.pps, 'pps')} received, {t.datagrams_received} of "
                  f"{t.datagrams_sent} sent, loss {100 * (t.loss or 0):.3f} %"
                  + (f", jitter {t.jitter_us:.1f} µs" if t.jitter_us is not None else ""))
    if t.retransmits is not None:
        out.print(f"  retransmits {t.retransmits}")
    _print_series([x.to_json() for x in t.series], "bps", lambda v: _si(v, "bit/s"), "over time")
    if t.errors:
        out.print(f"  send errors {t.errors}")
    sd = s.service_demand_us_per_kib
    cpu = Table("side", "cpu", "usr %", "sys %", "softirq %", "irq %", "busy %", "µs/KiB", box=None)
    for side in ("client", "server"):
        c = p.cpu.side(side)
        if c:
            cpu.add_row(side, c.cpu, f"{c.user:.1f}", f"{c.system:.1f}", f"{c.softirq:.1f}",
                        f"{c.irq:.1f}", f"{c.busy:.1f}", f"{sd.get(side) or 0:.3f}")
    out.print(cpu)
    procs = ", ".join(f"{x.comm}{'(' + x.role + ')' if x.role else ''} {x.cpu_pct:.0f}%" for x in p.processes[:6])
    out.print(f"  processes   {procs}")
    ifs = Table("interface", "rx pkts", "rx avg B", "tx pkts", "tx avg B", "drops", box=None)
    for name, d in p.interfaces.items():
        ifs.add_row(name, str(d.rx_packets), f"{d.rx_avg_bytes or 0:.0f}", str(d.tx_packets),
                    f"{d.tx_avg_bytes or 0:.0f}", str(d.rx_dropped + d.tx_dropped))
    out.print(ifs)
    tp = p.of(TestpmdPorts)
    if tp:
        for port, q in tp.ports.items():
            out.print(f"  testpmd     port {port}: rx {q.rx_packets} pkts {q.rx_bytes} B, "
                      f"tx {q.tx_packets} pkts {q.tx_bytes} B, errors rx {q.rx_errors} "
                      f"tx {q.tx_errors}, missed {q.rx_missed}, fwd drops {q.fwd_tx_dropped}")
        if tp.out_per_in is not None:
            out.print(f"  testpmd     packets out per packet in ({tp.data_direction.replace('>', ' → ')}): "
                      f"{tp.out_per_in:.3f}")
    for role, g in (s.guests or {}).items():
        for nic in g.nics or []:  # the chain at sample time: only what is fixed off, and why (offlab.lab.explain)
            for r in nic.rows:
                if r.fixed_off:
                    out.print(f"  guest       {role}:{nic.iface} {escape(r.why)}")
    for role in p.snmp:
        for group in ("Udp", "Udp6"):
            dropped = p.counter(role, group, "RcvbufErrors")
            if dropped:
                out.print(f"  {role}: {group} RcvbufErrors +{dropped} (receive buffer overflow explains loss)")
    squeeze = sum(v.time_squeeze for v in p.of(SoftnetStat).values())
    dropped = sum(v.dropped for v in p.of(SoftnetStat).values())
    if squeeze or dropped:
        out.print(f"  softnet     time_squeeze +{squeeze}, dropped +{dropped}")
    if s.capture:
        cap = s.capture
        out.print(f"  wire        {cap.host}:{cap.iface} {cap.frames} frames: {cap.verdict}")
    for seg in s.segmentation or []:
        out.print(f"  segments    {escape(seg.line)}")
    # offlab.report's package pulls in the store and the HTML report: a second of every CLI start
    from offlab.report import format as fmt

    for line in fmt.loss_lines(s.loss_attribution):
        out.print(f"  {escape(line)}")
    if s.loss_attribution and s.loss_attribution.receiver_absent:
        out.print(f"  [bold red]no receiver[/bold red] {escape(s.loss_attribution.receiver_absent)}")
    print_kernel_account(s)
    if s.kernel_account is None and s.workload.kind != "rr":
        from offlab.report import kernel

        out.print(f"  [dim]{kernel.OFF_LINE}[/dim]")
    for e in s.effects or []:
        style = "bold red" if e.status == NOT_EXERCISED else "dim"
        out.print(f"  [{style}]{escape(e.status)}[/{style}] {escape(e.setting)}={escape(e.value)} at "
                  f"{escape(e.where)}: {escape(e.detail)}" + (f" — {escape(e.cause)}" if e.cause else ""))
    if s.consistency and s.consistency.status != "consistent":
        for check in s.consistency.checks:
            if not check.ok:
                out.print(f"  [bold red]inconsistent[/bold red] {check.check}: {check.detail}")
    for note in s.notes:
        out.print(f"  [dim]note: {note}[/dim]")
