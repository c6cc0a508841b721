"""iperf3 driver: a one-shot server on a free port per run, a pinned client, JSON parsed."""

from __future__ import annotations

import json
import math
import random
import subprocess

from offlab.errors import EnvironmentProblem
from offlab.hosts import Host, require_tool
from offlab.interrupts import shielded
from offlab.traffic import TrafficResult, Workload
from offlab.traffic import series as intervals
from offlab.traffic.rate import parse_rate
from offlab.hosts.process import cpu_on as _cpu, listen_timeout, pinned, stop, wait_listening


class TrafficFailed(EnvironmentProblem):
    pass


def client_argv(w: Workload, server: str, port: int) -> list[str]:
    # -O adds its seconds before the -t seconds; iperf3 omits them from every figure.
    argv = ["iperf3", "-c", server, "-p", str(port), "-J", "-t", str(math.ceil(w.duration)),
            "-i", f"{interval_s(w):g}"]
    if w.warmup:
        argv += ["-O", str(math.ceil(w.warmup))]
    # iperf3 reads a rate it does not understand as unlimited, so it gets only a number from
    # the one parser (Workload.check has already refused packet rates for iperf3).
    bps = parse_rate(w.rate).bps if w.rate else None
    if w.protocol == "udp":
        argv += ["-u", "-b", f"{bps:.0f}" if bps else "0"]
    elif bps:
        argv += ["-b", f"{bps:.0f}"]
    if w.size:
        argv += ["-l", str(w.size)]
    if w.streams > 1:
        argv += ["-P", str(w.streams)]
    if w.reverse:
        argv += ["-R"]
    if w.sndbuf or w.rcvbuf:
        argv += ["-w", str(w.sndbuf or w.rcvbuf)]
    if w.ipv6:
        argv += ["-6"]
    return argv


def interval_s(w: Workload) -> float:
    """iperf3's report interval: 0.1 s (it takes fractions), longer for long runs like the engine's."""
    return intervals.interval_ms(w.warmup + w.duration) / 1000


def parse(doc: dict, w: Workload) -> TrafficResult:
    """iperf3 -J client output → TrafficResult. Raises TrafficFailed on iperf3's own error."""
    if doc.get("error"):
        raise TrafficFailed(f"iperf3: {doc['error']}")
    end = doc.get("end") or {}
    sent, received = end.get("sum_sent") or {}, end.get("sum_received") or {}
    if not received:
        raise TrafficFailed("iperf3 produced no end-of-test summary (did the server die?)")
    res = TrafficResult(
        tool="iperf3",
        protocol=w.protocol,
        throughput_bps=float(received["bits_per_second"]),
        sent_bps=float(sent.get("bits_per_second", 0.0)) or None,
        window_s=float(received.get("seconds", 0.0)) or None,
        tool_cpu=end.get("cpu_utilization_percent"),
        raw=doc,
    )
    s = intervals.from_iperf3(doc, interval_s(w))
    if s:
        res.series.append(s)
    if w.protocol == "udp":
        # The receiver's view: packets is what was expected from sequence numbers.
        expected = int(received.get("packets", 0))
        lost = int(received.get("lost_packets", 0))
        res.datagrams_sent = int(sent.get("packets", expected))
        res.datagrams_received = expected - lost
        res.loss = lost / expected if expected else None
        res.jitter_us = float(received.get("jitter_ms", 0.0)) * 1000.0
        if res.window_s:
            res.pps = res.datagrams_received / res.window_s
        res.reordered = sum(int(s.get("udp", {}).get("out_of_order", 0)) for s in end.get("streams", []))
    else:
        res.retransmits = sent.get("retransmits")
    return res


def run(client: Host, server: Host, server_addr: str, w: Workload, *, on_started=None) -> TrafficResult:
    """One iperf3 run; `on_started()` is called once the client is sending (for probes)."""
    require_tool("iperf3")
    port = _free_port(server)
    srv = cli = None
    try:
        with shielded():  # a signal while a process starts waits until it is ours to stop
            srv = server.spawn(pinned(["iperf3", "-s", "-1", "-p", str(port)], _cpu(server, w.server_cpu)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if not wait_listening(server, port, "tcp", srv):
            if srv.poll() is not None:
                err = srv.stderr.read().strip() or f"it exited {srv.returncode} saying nothing"
            else:
                err = f"still running, not listening after {listen_timeout(server):g} s"
            raise TrafficFailed(f"iperf3 server on {server.name} port {port} did not start: {err}")
        with shielded():
            cli = client.spawn(pinned(client_argv(w, server_addr, port), _cpu(client, w.client_cpu)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if on_started:
            on_started(cli.pid, srv.pid)
        limit = w.duration + w.warmup + 30
        try:
            out, err = cli.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            raise TrafficFailed(f"iperf3 client did not finish within {limit:g} s: the path from "
                                f"{client.name} to {server_addr} stopped carrying its test") from None
        try:
            doc = json.loads(out)
        except json.JSONDecodeError:
            raise TrafficFailed(f"iperf3 client failed: {(err or out).strip()[:300]}") from None
        result = parse(doc, w)
        result.client_pid, result.server_pid = cli.pid, srv.pid
        return result
    finally:
        if cli is not None:
            stop(cli)
        if srv is not None:
            stop(srv)


def _free_port(server: Host) -> int:
    """A port nothing listens on in the server host (labs are private, so this is enough)."""
    busy = server.run(["ss", "-Hlntu"], check=False).stdout
    for _ in range(50):
        port = random.randint(20000, 60000)
        if f":{port} " not in busy:
            return port
    return random.randint(20000, 60000)


__all__ = ["run", "parse", "client_argv", "TrafficFailed"]
