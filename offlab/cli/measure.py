"""`offlab measure`: one measured run in an existing lab, with every probe."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Optional

import typer
from offlab.cli.console import console
from rich.markup import escape
from rich.table import Table

from offlab.errors import BadInput
from offlab.experiment.effects import NOT_EXERCISED
from offlab.report import format as fmt
from offlab.names import IFNAME_RE

if TYPE_CHECKING:
    from offlab.experiment.measure import Sample

MAX_FRAMES = 1_000_000  # the same bound as a plan's capture.frames

out = console()


def register(app: typer.Typer) -> None:
    app.command("measure")(measure_cmd)


def measure_cmd(
    lab: str = typer.Argument(..., help="An existing lab (offlab lab list)."),
    tool: str = typer.Option("iperf3", "--tool", help="iperf3 | engine"),
    proto: Optional[str] = typer.Option(None, "--proto", help="tcp | udp (default: udp for the engine, tcp for iperf3)"),
    size: Optional[int] = typer.Option(None, "--size", help="UDP payload per datagram / TCP write length, bytes."),
    gso: bool = typer.Option(False, "--gso", help="engine: UDP_SEGMENT on the sender."),
    gro: bool = typer.Option(False, "--gro", help="engine: UDP_GRO on the receiver."),
    batch: Optional[int] = typer.Option(None, "--batch", help="engine: sendmmsg/recvmmsg batch, or linked SQEs per "
                                                             "io_uring_enter with --send io_uring[-zc]."),
    send: Optional[str] = typer.Option(None, "--send", help="engine: send | sendmmsg | zerocopy (MSG_ZEROCOPY, "
                                                           "completions and kernel copies reported) | io_uring "
                                                           "(IORING_OP_SEND) | io_uring-zc (IORING_OP_SEND_ZC)."),
    rate: Optional[str] = typer.Option(None, "--rate", help="Packets/s (100kpps, 10Mpps; engine only) or bit/s (250M, 1G); default: as fast as possible."),
    streams: int = typer.Option(1, "--streams", help="iperf3 parallel streams."),
    duration: float = typer.Option(2.0, "--duration", help="Seconds measured (after warm-up)."),
    warmup: float = typer.Option(0.5, "--warmup", help="Seconds of traffic before the window opens."),
    ipv6: bool = typer.Option(False, "--ipv6", help="Use the lab's IPv6 addresses."),
    big_packets: bool = typer.Option(False, "--big-packets", help="Count packets over 64 KiB on every interface of "
                                                                  "the lab's namespaces (nftables; BIG TCP's proof)."),
    capture: Optional[str] = typer.Option(None, "--capture", help="HOST[:IFACE] to capture on (IFACE may be to-<host>)."),
    frames: int = typer.Option(2000, "--frames", help="Frames to capture."),
    as_json: bool = typer.Option(False, "--json", help="Print the sample as JSON (with its per-interval series)."),
    workload: str = typer.Option("stream", "--workload", help="stream | rr (request/response with offlab-engine) | "
                                                             "rr-under-load (rr alone, then rr beside the stream)."),
    request_size: int = typer.Option(64, "--request-size", help="rr: bytes per request."),
    response_size: int = typer.Option(64, "--response-size", help="rr: bytes per response."),
    flows: int = typer.Option(1, "--flows", help="rr: parallel flows."),
    rr_timeout: float = typer.Option(1.0, "--timeout", help="rr: seconds before a transaction counts as lost."),
    rr_proto: str = typer.Option("udp", "--rr-proto", help="rr-under-load: the probe's udp | tcp | tcp-crr "
                                                           "(--proto is the stream's)."),
    rr_rate: Optional[str] = typer.Option(None, "--rr-rate", help="rr-under-load: the probe's transactions/s "
                                                                  "(default: closed loop)."),
) -> None:
    """Run one measurement in a lab: throughput, pps, loss, CPU per side, service demand, wire proof."""
    from offlab.traffic import Workload, default_protocol
    from offlab.traffic import rr

    if workload not in ("stream", "rr", "rr-under-load"):
        raise BadInput(f"--workload {workload!r}: choose stream, rr or rr-under-load")
    if workload == "rr":
        # --rate is transactions/s here; --proto also takes tcp-crr.
        from offlab.experiment.measure import measure_rr
        from offlab.lab import LabState, hold

        rw = rr.RrWorkload(protocol=proto or "udp", request_size=request_size, response_size=response_size,
                           flows=flows, rate=rr.parse_tps(rate), duration=duration, warmup=warmup,
                           timeout=rr_timeout, ipv6=ipv6).check()
        state = LabState.load(lab)
        with hold(lab, "offlab measure --workload rr"):
            sample = measure_rr(state, rw)
        res = sample.rr["idle"]
        if as_json:
            typer.echo(json.dumps({**res, "probes": sample.probes, "notes": sample.notes}, indent=2, default=str))
        else:
            for line in rr.RrResult(**{k: res[k] for k in rr.RrResult.__dataclass_fields__ if k in res}).summary_lines():
                out.print(line)
            _print_series(res.get("series") or [], "rtt_p99_us", lambda v: f"{v:.1f} µs", "rtt p99")
            out.print(_rr_cpu_line(res))
        return
    rw = None
    if workload == "rr-under-load":
        if rr_proto not in ("udp", "tcp", "tcp-crr"):
            raise BadInput(f"--rr-proto {rr_proto!r}: the probe is udp, tcp or tcp-crr (--proto is the stream's)")
        rw = rr.RrWorkload(protocol=rr_proto, request_size=request_size, response_size=response_size, flows=flows,
                           rate=rr.parse_tps(rr_rate), duration=duration, warmup=warmup, timeout=rr_timeout,
                           ipv6=ipv6).check()
    # Every value is checked before the lab is even read, so no child tool starts on a bad one.
    w = Workload(tool=tool, protocol=proto or default_protocol(tool), size=size, gso=gso, gro=gro, batch=batch, send=send, rate=rate,
                 streams=streams, duration=duration, warmup=warmup, ipv6=ipv6, big_packets=big_packets).check()
    if rw is not None:
        from offlab.experiment.measure import check_under_load

        check_under_load(w)
    if not 1 <= frames <= MAX_FRAMES:
        raise BadInput(f"--frames {frames}: 1..{MAX_FRAMES}")
    if capture is not None:
        role, _, iface = capture.partition(":")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,15}", role) or (iface and not IFNAME_RE.fullmatch(iface)):
            raise BadInput(f"--capture {capture!r}: write HOST[:IFACE], e.g. server or switch:to-server")
    from offlab.experiment.measure import CaptureRequest, measure, measure_rr_under_load
    from offlab.lab import LabState, hold

    state = LabState.load(lab)
    if ipv6 and not state.ipv6:
        raise BadInput(f"lab {lab} has no IPv6 addresses: rebuild it with `offlab lab up ... --ipv6`")
    cap = None
    if capture:
        role, _, iface = capture.partition(":")
        cap = CaptureRequest(role, iface or None, frames)
        state.resolve_iface(role, iface or None)  # fail before any traffic
    with hold(lab, "offlab measure"):  # `lab down` refuses the lab meanwhile (issue #14, item 8)
        sample = measure(state, w, cap, settings=lab_settings(state)) if rw is None else \
            measure_rr_under_load(state, w, rw, cap)
    if as_json:
        typer.echo(json.dumps(sample.to_dict(), indent=2, default=str))
    else:
        print_sample(sample)
        if sample.rr:
            print_rr_under_load(sample.rr)


def lab_settings(state) -> list[dict]:
    """The settings `lab set` made on the lab and that still hold (its journal): each gets an effect witness."""
    from offlab.knobs import pending_changes

    role_of = {e.netns: role for role, e in state.hosts.items() if e.netns and not e.guest}
    held: dict[tuple, dict] = {}
    for c in pending_changes(role_of, state.name):  # newest first: a later `lab set` of a key wins
        where = f"{c['host']}:{c['iface']}" if c.get("iface") else str(c["host"])
        held.setdefault((where, c["key"]), {"where": where, "key": c["key"], "value": c["value"]})
    return list(held.values())


def _rr_cpu_line(res: dict) -> str:
    c = res.get("cpu") or {}
    sides = "  ".join(f"{side} {c[side]['cpu']} {c[side]['busy']:.0f} % busy" for side in ("client", "server")
                      if side in c)
    per = res.get("cpu_us_per_transaction")
    return f"  cpu          {sides}; {'-' if per is None else f'{per:.1f}'} µs CPU per transaction (whole system)"


def print_rr_under_load(rr: dict) -> None:
    """Idle vs loaded round trips side by side, with the factor."""
    idle, loaded, x = rr["idle"], rr["loaded"], rr["loaded_over_idle"]
    t = Table("rtt (whole round trip)", "idle (just before)", "under load", "× idle", box=None)
    for key, label in (("rtt_p50_us", "p50"), ("rtt_p90_us", "p90"), ("rtt_p99_us", "p99"),
                       ("rtt_p99_9_us", "p99.9"), ("rtt_max_us", "max"), ("rtt_mean_us", "mean")):
        f = x.get(key)
        t.add_row(label, _us(idle.get(key)), _us(loaded.get(key)), "-" if f is None else f"{f:.1f}")
    t.add_row("transactions/s", f"{idle['transactions_per_s']:.0f}", f"{loaded['transactions_per_s']:.0f}", "")
    t.add_row("lost", str(idle["lost"]), str(loaded["lost"]), "")
    out.print(f"  rr {idle['protocol']} {idle['request_size']}/{idle['response_size']} B, {idle['flows']} flow(s):")
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


def print_sample(s: Sample) -> None:
    t, p, w = s.traffic, s.probes, s.workload
    what = f"{w['tool']} {w['protocol']}" + (f" {w['size']} B" if w["size"] else "") + \
        (" gso" if w["gso"] else "") + (" gro" if w["gro"] else "")
    out.print(f"[bold]{s.lab}[/bold] ({s.topology}) {what}: window {p['window_s']:.2f} s after "
              f"{w['warmup']:g} s warm-up")
    out.print(f"  throughput  {_si(t['throughput_bps'], 'bit/s')} received"
              + (f"   (sent {_si(t['sent_bps'], 'bit/s')})" if t.get("sent_bps") else ""))
    if t.get("pps") is not None:
        out.print(f"  datagrams   {_si(t['pps'], 'pps')} received, {t['datagrams_received']} of "
                  f"{t['datagrams_sent']} sent, loss {100 * (t['loss'] or 0):.3f} %"
                  + (f", jitter {t['jitter_us']:.1f} µs" if t.get("jitter_us") is not None else ""))
    if t.get("retransmits") is not None:
        out.print(f"  retransmits {t['retransmits']}")
    _print_series(t.get("series") or [], "bps", lambda v: _si(v, "bit/s"), "over time")
    if t.get("errors"):
        out.print(f"  send errors {t['errors']}")
    sd = s.service_demand_us_per_kib
    cpu = Table("side", "cpu", "usr %", "sys %", "softirq %", "irq %", "busy %", "µs/KiB", box=None)
    for side in ("client", "server"):
        c = p["cpu"].get(side)
        if c:
            cpu.add_row(side, c["cpu"], f"{c['user']:.1f}", f"{c['system']:.1f}", f"{c['softirq']:.1f}",
                        f"{c['irq']:.1f}", f"{c['busy']:.1f}", f"{sd.get(side) or 0:.3f}")
    out.print(cpu)
    procs = ", ".join(f"{x['comm']}{'(' + x['role'] + ')' if x['role'] else ''} {x['cpu_pct']:.0f}%"
                      for x in p["processes"][:6])
    out.print(f"  processes   {procs}")
    ifs = Table("interface", "rx pkts", "rx avg B", "tx pkts", "tx avg B", "drops", box=None)
    for name, d in p["interfaces"].items():
        ifs.add_row(name, str(d["rx_packets"]), f"{d['rx_avg_bytes'] or 0:.0f}", str(d["tx_packets"]),
                    f"{d['tx_avg_bytes'] or 0:.0f}", str(d["rx_dropped"] + d["tx_dropped"]))
    out.print(ifs)
    tp = p.get("testpmd")
    if tp:
        for port, d in tp["ports"].items():
            out.print(f"  testpmd     port {port}: rx {d.get('rx_packets', 0)} pkts {d.get('rx_bytes', 0)} B, "
                      f"tx {d.get('tx_packets', 0)} pkts {d.get('tx_bytes', 0)} B, errors rx {d.get('rx_errors', 0)} "
                      f"tx {d.get('tx_errors', 0)}, missed {d.get('rx_missed', 0)}, "
                      f"fwd drops {d.get('fwd_tx_dropped', 0)}")
        if tp["out_per_in"] is not None:
            out.print(f"  testpmd     packets out per packet in ({tp['data_direction'].replace('>', ' → ')}): "
                      f"{tp['out_per_in']:.3f}")
    for role, g in (s.guests or {}).items():
        for nic in g.get("nics") or []:  # the chain at sample time: only what is fixed off, and why
            for r in nic["rows"]:
                if any(v.startswith("off [fixed]") for v in r["guest"].values()):
                    out.print(f"  guest       {role}:{nic['iface']} {escape(r['why'])}")
    for role, snmp in p["snmp"].items():
        for group in ("Udp", "Udp6"):
            udp = snmp.get(group, {})
            if udp.get("RcvbufErrors"):
                out.print(f"  {role}: {group} RcvbufErrors +{udp['RcvbufErrors']} (receive buffer overflow explains loss)")
    squeeze = sum(v["time_squeeze"] for v in p["softnet"].values())
    dropped = sum(v["dropped"] for v in p["softnet"].values())
    if squeeze or dropped:
        out.print(f"  softnet     time_squeeze +{squeeze}, dropped +{dropped}")
    if s.capture:
        c = s.capture
        out.print(f"  wire        {c['host']}:{c['iface']} {c['frames']} frames: {c['verdict']}")
    for seg in s.segmentation or []:
        out.print(f"  segments    {escape(seg['line'])}")
    for line in fmt.loss_lines(s.loss_attribution):
        out.print(f"  {escape(line)}")
    if s.loss_attribution and s.loss_attribution.get("receiver_absent"):
        out.print(f"  [bold red]no receiver[/bold red] {escape(s.loss_attribution['receiver_absent'])}")
    for e in s.effects or []:
        style = "bold red" if e["status"] == NOT_EXERCISED else "dim"
        out.print(f"  [{style}]{escape(e['status'])}[/{style}] {escape(e['setting'])}={escape(e['value'])} at "
                  f"{escape(e['where'])}: {escape(e['detail'])}" + (f" — {escape(e['cause'])}" if e["cause"] else ""))
    if s.consistency and s.consistency["status"] != "consistent":
        for c in s.consistency["checks"]:
            if not c["ok"]:
                out.print(f"  [bold red]inconsistent[/bold red] {c['check']}: {c['detail']}")
    for note in s.notes:
        out.print(f"  [dim]note: {note}[/dim]")
