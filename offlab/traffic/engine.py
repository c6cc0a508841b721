"""offlab-engine driver: `rx` in the server host, `tx` in the client host, loss from sequence numbers."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from offlab.state import private_tmp
from offlab.errors import CannotTestHere, OfflabError, ToolMissing
from offlab.hosts import Host, which
from offlab.interrupts import shielded
from offlab.traffic import TrafficResult, Workload
from offlab.traffic import series as intervals
from offlab.traffic.iperf3 import TrafficFailed
from offlab.wire import IPV4_HEADER, UDP_HEADER
from offlab.hosts.process import cpu_on as _cpu, pinned, stop

ENGINE = "offlab-engine"
# The report format this offlab reads (engine/SCHEMA.md; engine/src/json.rs `envelope` writes it).
SCHEMA = "offlab-engine/1"
DEFAULT_SIZE = 1500 - IPV4_HEADER - UDP_HEADER  # a datagram that fills one frame at MTU 1500: 1472


def report(text: str, role: str, host: Host) -> dict:
    """One engine report, checked: JSON, the schema this offlab reads, the role asked for."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise TrafficFailed(f"offlab-engine {role} on {host.name} printed no JSON report: {text.strip()[:200]!r}") \
            from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise TrafficFailed(f"offlab-engine {role} on {host.name} reports schema {got!r}; this offlab reads "
                            f"{SCHEMA!r}: install the engine of this checkout (`make install`)")
    if doc.get("role") != role:
        raise TrafficFailed(f"offlab-engine on {host.name} reported role {doc.get('role')!r} for {role}")
    return doc


def engine_path() -> str:
    """The engine next to this Python (the virtualenv), on PATH, or built in the checkout.

    A release build in the checkout that is newer than the installed one wins: a developer's
    `cargo build --release` is then what the tests run, not a stale copy in a shared venv.
    """
    built = Path(__file__).resolve().parents[2] / "engine" / "target" / "release" / ENGINE
    candidates = [Path(sys.executable).parent / ENGINE, Path(which(ENGINE) or "/nonexistent"), built]
    found = [p for p in candidates if p.is_file() and os.access(p, os.X_OK)]
    if not found:
        raise ToolMissing(ENGINE, None) from None
    if built in found and built.stat().st_mtime > found[0].stat().st_mtime:
        return str(built)
    return str(found[0])


def engine_on(host: Host) -> str:
    """The engine's path on `host`: ours on this machine, the one on PATH in a guest or SSH host."""
    return engine_path() if host.shares_kernel else ENGINE


# A receiver stops this long after the last datagram (the END marker normally ends it first). A sender
# in a TCG guest can stall longer than 1 s on a loaded host; a receiver that gave up then leaves the
# rest of the run to UdpNoPorts (docs/vm.md, the USO finding): senders that answer over a channel get
# more patience, and the receiver's deadline covers the slower start of such a sender.
IDLE_S, CHANNEL_IDLE_S = 1.0, 5.0
DEADLINE_MARGIN_S, CHANNEL_DEADLINE_MARGIN_S = 5.0, 20.0


def _every(w: Workload, interval_ms: int | None) -> int:
    """The series' interval in ms: as asked (0 = none), else offlab.traffic.series.interval_ms of the run."""
    return intervals.interval_ms(w.warmup + w.duration) if interval_ms is None else interval_ms


def rx_argv(w: Workload, bind: str, port: int, ready: str, run_id: int, exe: str | None = None, *,
            channel: bool = False, interval_ms: int | None = None, end_port: int | None = None) -> list[str]:
    idle, margin = (CHANNEL_IDLE_S, CHANNEL_DEADLINE_MARGIN_S) if channel else (IDLE_S, DEADLINE_MARGIN_S)
    argv = [exe or engine_path(), "rx", "--bind", bind, "--port", str(port), "--ready-file", ready,
            "--run-id", str(run_id), "--duration", f"{w.warmup + w.duration + margin:g}", "--idle-timeout", f"{idle:g}",
            "--interval", str(_every(w, interval_ms))]
    if end_port is not None:
        argv += ["--end-port", str(end_port)]
    if w.gro:
        argv.append("--gro")
    if w.batch:
        argv += ["--batch", str(w.batch)]
    if w.rcvbuf:
        argv += ["--rcvbuf", str(w.rcvbuf)]
    return argv


def tx_argv(w: Workload, dest: str, port: int, run_id: int, exe: str | None = None,
            interval_ms: int | None = None, end_port: int | None = None) -> list[str]:
    argv = [exe or engine_path(), "tx", "--dest", dest, "--port", str(port), "--size", str(w.size or DEFAULT_SIZE),
            "--duration", f"{w.warmup + w.duration:g}", "--run-id", str(run_id),
            "--interval", str(_every(w, interval_ms))]
    if end_port is not None:
        argv += ["--end-port", str(end_port)]
    if w.gso:
        argv.append("--gso")
    if w.batch:
        argv += ["--batch", str(w.batch)]
    if w.send:
        argv += ["--send", w.send]
    if w.rate:
        argv += ["--rate", w.rate]
    if w.sndbuf:
        argv += ["--sndbuf", str(w.sndbuf)]
    return argv


def parse(rx: dict, tx: dict, w: Workload) -> TrafficResult:
    """Both sides' JSON → TrafficResult; loss is exact: what tx sent minus what rx got."""
    sent = int(tx.get("datagrams", 0))
    got = int(rx.get("unique_datagrams", rx.get("datagrams", 0)))
    return TrafficResult(
        tool="engine",
        protocol="udp",
        throughput_bps=float(rx.get("goodput_bps") or 0.0),
        sent_bps=float(tx.get("bps") or 0.0),
        sent_pps=tx.get("pps"),
        pps=rx.get("pps"),
        datagrams_sent=sent,
        datagrams_received=got,
        loss=(sent - got) / sent if sent else None,
        duplicates=rx.get("duplicates"),
        reordered=rx.get("reordered"),
        jitter_us=rx.get("jitter_us"),
        latency_us=rx.get("latency_us"),
        window_s=rx.get("window_s"),
        errors=dict(tx.get("errors") or {}),
        zerocopy=tx.get("zerocopy"),
        series=[s for s in (intervals.from_engine(rx, "offlab-engine rx", w.warmup),
                            intervals.from_engine(tx, "offlab-engine tx", w.warmup)) if s],
        receiver_stop=rx.get("stop_reason"),
        sender_stop=tx.get("stop_reason"),
        raw={"rx": rx, "tx": tx},
    )


def run(client: Host, server: Host, server_addr: str, w: Workload, *, on_started=None,
        interval_ms: int | None = None, stop_when: threading.Event | None = None) -> TrafficResult:
    """Send `w` from client to server; the result once both ends reported. `stop_when`: once it is set, the
    sender is asked to stop (SIGINT: it ends its run there, sends its END markers and reports what it sent),
    so a sample's traffic need not run its whole planned length past the end of its window."""
    # The END markers also go to a port of their own: one the data cannot fill (see rx --end-port)
    port, end_port = random.sample(range(20000, 60001), 2)
    run_id = random.randint(1, 2**32 - 1)
    with _ready_dir(server) as tmp:
        ready = f"{tmp}/ready"
        rx = tx = None
        try:
            # Started shielded: a signal while a process starts waits until it is ours to stop (one that
            # cut the spawn short lost its Popen, and the engine ran on in a lab being removed).
            with shielded():
                rx = server.spawn(pinned(rx_argv(w, server_addr, port, ready, run_id, engine_on(server),
                                                 channel=not client.shares_kernel, interval_ms=interval_ms,
                                                 end_port=end_port),
                                         _cpu(server, w.server_cpu)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # a hang guard, not a speed test: a receiver's start took over 5 s once on a loaded 2-CPU machine
            deadline = time.monotonic() + (20 if server.shares_kernel else 30)
            while not (os.path.exists(ready) if server.shares_kernel else server.exists(ready)):
                if rx.poll() is not None or time.monotonic() > deadline:
                    err = rx.stderr.read().strip() if rx.poll() is not None else "not ready in time"
                    raise TrafficFailed(f"offlab-engine rx on {server.name} did not start: {err}")
                time.sleep(0.01)
            with shielded():
                tx = client.spawn(pinned(tx_argv(w, server_addr, port, run_id, engine_on(client), interval_ms,
                                                 end_port),
                                         _cpu(client, w.client_cpu)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if on_started:
                on_started(tx.pid, rx.pid)
            ended = threading.Event()
            if stop_when is not None:
                threading.Thread(target=_stop_on, args=(stop_when, ended, tx), daemon=True).start()
            try:
                tx_out, tx_err = tx.communicate(timeout=w.warmup + w.duration + 30)
            finally:
                ended.set()
            if tx.returncode == 3 and "cannot test here" in tx_err:
                # The engine's own verdict on a send path this kernel cannot take (io_uring disabled).
                raise CannotTestHere(f"offlab-engine tx: {tx_err.strip().removeprefix('offlab-engine: error: ')}")
            if tx.returncode != 0:
                raise TrafficFailed(f"offlab-engine tx: {tx_err.strip() or 'exit ' + str(tx.returncode)}")
            rx_out, rx_err = rx.communicate(timeout=15)
            if rx.returncode != 0:
                raise TrafficFailed(f"offlab-engine rx: {rx_err.strip() or 'exit ' + str(rx.returncode)}")
            result = parse(report(rx_out, "rx", server), report(tx_out, "tx", client), w)
            result.client_pid, result.server_pid = tx.pid, rx.pid
            return result
        finally:
            if tx is not None:
                stop(tx)
            if rx is not None:
                stop(rx)


def _stop_on(stop_when: threading.Event, ended: threading.Event, tx) -> None:
    """SIGINT to the sender once `stop_when` is set, unless it ended first (`ended`)."""
    while not ended.is_set():
        if stop_when.wait(0.05):
            if not ended.is_set():
                # a host that cannot be reached now: the sender ends at its planned length, as before
                with contextlib.suppress(OSError, subprocess.SubprocessError, OfflabError):
                    tx.send_signal(signal.SIGINT)
            return


@contextlib.contextmanager
def _ready_dir(server: Host) -> Iterator[str]:
    """A private directory where the receiver drops its ready file, on the server's filesystem."""
    if server.shares_kernel:
        with private_tmp("engine") as tmp:
            yield str(tmp)
        return
    remote_dir = getattr(server, "remote_dir", None)
    if remote_dir is not None:  # an SSH host: in its journal, so a crash leaves nothing there either
        from offlab.hosts import remote_journal

        made: tuple[str, str] | None = None
        try:
            with shielded():  # a signal while it is made waits until it is ours to remove
                made = remote_journal.temp_dir(server, remote_dir)
            yield made[0]
        finally:
            if made is not None:
                remote_journal.drop_temp_dir(server, *made)
        return
    tmp = server.run(["mktemp", "-d", "/tmp/offlab-engine.XXXXXX"], timeout=15).stdout.strip()
    try:
        yield tmp
    finally:
        server.run(["rm", "-rf", tmp], check=False, timeout=15)
