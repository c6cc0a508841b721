"""A TCG guest's clock: told the TSC's rate at boot, and checked against this machine's after a cold boot.

Under TCG a guest's TSC is this machine's TSC (QEMU's emulated RDTSC reads it), and the guest's kernel
measures its rate at boot against the emulated PIT and ACPI PM timer. On a loaded machine that
measurement can be far off (seen: `tsc: PIT calibration deviates from PMTIMER: 650187 2596271`, `Using
PIT calibration value`, a clock that then ran 4.0x fast), and with `tsc=reliable` nothing corrects it
later. Every time the engine in such a guest paces or reports is off by that factor, and a saved guest
carries the error into every warm start. So the guest is told the rate (`tsc_early_khz=`, measured
here once per boot of this machine), and a cold boot's clock is compared with this machine's before the
guest is used or saved (`check`).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from offlab.errors import EnvironmentProblem
from offlab.hosts.remote_journal import boot_id

# rdtsc; shl rdx, 32; or rax, rdx; ret — the 64-bit TSC in rax
_RDTSC = bytes((0x0F, 0x31, 0x48, 0xC1, 0xE2, 0x20, 0x48, 0x09, 0xD0, 0xC3))
# The guest's clock may run this far from this machine's before a cold boot is refused. The kernel itself
# distrusts calibrations that disagree by 10 %; a wrong one was 300 % off.
RATE_TOLERANCE = 0.10
CHECK_SPAN_S = 0.4  # between the guest clock's two reads
UPTIME_RESOLUTION_S = 0.01  # /proc/uptime counts hundredths


def _rdtsc():
    """A callable returning this CPU's TSC, or None (not x86-64, or no executable mapping allowed)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    page.write(_RDTSC)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64)(address)
    fn.page = page  # the mapping lives as long as the function
    return fn


def measure_tsc_khz(trials: int = 5, span_s: float = 0.02) -> int | None:
    """This machine's TSC rate in kHz against CLOCK_MONOTONIC_RAW (median of `trials` spans; each edge
    read between two TSC reads, so a preemption there only widens one trial), or None without a TSC."""
    rdtsc = _rdtsc()
    if rdtsc is None:
        return None

    def edge() -> tuple[float, float]:
        a = rdtsc()
        ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        b = rdtsc()
        return (a + b) / 2, ns

    rates = []
    for _ in range(trials):
        t0, n0 = edge()
        time.sleep(span_s)
        t1, n1 = edge()
        if n1 > n0 and t1 > t0:
            rates.append((t1 - t0) / (n1 - n0) * 1e6)  # ticks per ns → kHz
    return round(statistics.median(rates)) if rates else None


def tsc_khz(cache: Path) -> int | None:
    """The rate a TCG guest is told (`tsc_early_khz=`): $OFFLAB_VM_TSC_KHZ if set (0: none), else this
    machine's TSC measured once per boot of it (cached in `cache`) and rounded to the MHz, so the
    guest's command line — and the key of its saved guest — stays the same from one run to the next."""
    forced = os.environ.get("OFFLAB_VM_TSC_KHZ")
    if forced is not None:
        try:
            value = int(forced)
        except ValueError:
            raise EnvironmentProblem(f"OFFLAB_VM_TSC_KHZ={forced!r}: give the guest's TSC rate in kHz, "
                                     f"or 0 for none") from None
        return value or None
    boot = boot_id()
    try:
        found = json.loads(cache.read_text())
        if found.get("boot_id") == boot and boot != "unknown":
            return found.get("khz")
    except (OSError, ValueError, AttributeError):
        pass
    khz = measure_tsc_khz()
    khz = round(khz / 1000) * 1000 if khz else None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"boot_id": boot, "khz": khz}))
        os.replace(tmp, cache)
    except OSError:
        pass  # measured again next time
    return khz


@dataclass
class ClockRate:
    """How fast a guest's clock ran against this machine's, with the bounds its reads allow."""

    rate: float
    low: float
    high: float

    @property
    def off(self) -> bool:
        return self.low > 1 + RATE_TOLERANCE or self.high < 1 - RATE_TOLERANCE


def rate(read_uptime, span_s: float = CHECK_SPAN_S) -> ClockRate:
    """The guest clock's rate from two reads of its /proc/uptime (`read_uptime()` → seconds) `span_s`
    apart on this machine's clock; each read lies between the two instants taken around it."""
    a0 = time.monotonic()
    g0 = read_uptime()
    a1 = time.monotonic()
    time.sleep(span_s)
    b0 = time.monotonic()
    g1 = read_uptime()
    b1 = time.monotonic()
    guest = g1 - g0
    longest, shortest = b1 - a0, max(b0 - a1, 1e-6)
    return ClockRate(rate=round(guest / ((b0 + b1 - a0 - a1) / 2), 3),
                     low=round(max(0.0, guest - UPTIME_RESOLUTION_S) / longest, 3),
                     high=round((guest + UPTIME_RESOLUTION_S) / shortest, 3))


def check(name: str, read_uptime, told_khz: int | None) -> ClockRate:
    """The cold-booted guest `name`'s clock rate; EnvironmentProblem when it is off by more than
    RATE_TOLERANCE (the guest is then neither used nor saved)."""
    found = rate(read_uptime)
    if found.off:
        told = (f"it was told the TSC runs at {told_khz} kHz (OFFLAB_VM_TSC_KHZ or this machine's measured "
                f"rate)" if told_khz else "its kernel measured the TSC's rate itself, under this machine's load")
        raise EnvironmentProblem(
            f"guest {name}'s clock runs {found.rate:g}x as fast as this machine's ({found.low:g}..{found.high:g} "
            f"over {CHECK_SPAN_S:g} s): {told}; every time its tools measure would be off by that factor. "
            f"Fix: unset OFFLAB_VM_TSC_KHZ, or set it to this machine's TSC rate in kHz")
    return found


__all__ = ["ClockRate", "RATE_TOLERANCE", "check", "measure_tsc_khz", "rate", "tsc_khz"]
