"""Processes a driver starts: pinning, readiness, and stopping them by pid."""

from __future__ import annotations

import signal
import subprocess
import time

from offlab.hosts import Host


def pinned(argv: list[str], cpu: int | None) -> list[str]:
    """argv run under `taskset -c CPU`, so each side has its own CPU."""
    return ["taskset", "-c", str(cpu), *argv] if cpu is not None else list(argv)


def wait_listening(host: Host, port: int, proto: str, proc: subprocess.Popen, timeout: float = 5.0) -> bool:
    """True once something listens on `port` in `host`; False if `proc` died or time ran out."""
    flag = "-Hltn" if proto == "tcp" else "-Hlun"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if host.run(["ss", flag, f"sport = :{port}"], check=False, timeout=5).stdout.strip():
            return True
        time.sleep(0.02)
    return False


def stop(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """End a process we started: SIGINT, then SIGKILL; always reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()
