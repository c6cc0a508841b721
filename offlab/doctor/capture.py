"""`offlab doctor --capture DIR`: write what the checks read, so the audit can run elsewhere.

The checks run once against the live host through a Recorder; the tree then
holds exactly the /proc and /sys fragments and command outputs they used:

    DIR/offlab-capture.json   format, host, options, command index, samples, redactions
    DIR/proc/..., DIR/sys/... files as read (a directory listing keeps its entries as empty files)
    DIR/commands/NAME         stdout of each command, NAME as sosreport names it (ethtool_-k_eth0)
    DIR/samples/...           the timed snapshots of counters (softnet_stat)

`offlab doctor --root DIR` replays the same reads from the tree.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path, PurePosixPath

from offlab import __version__
from offlab.doctor import audit
from offlab.doctor.model import Report
from offlab.doctor.source import CAPTURE_FORMAT, MANIFEST, LiveSource, Recorder
from offlab.errors import BadInput, EnvironmentProblem

# Init arguments after " -- " on the kernel command line belong to the init system, not
# the kernel, and are not needed by any check.
REDACTIONS = {"/proc/cmdline": "init arguments after ' -- ' removed"}


def _redact(path: str, text: str) -> str:
    if path == "/proc/cmdline" and " -- " in text:
        return text.split(" -- ")[0].rstrip() + "\n"
    return text


def capture(directory: str | Path, src: LiveSource, *, ifaces: list[str] | None = None,
            sample_seconds: float = 1.0) -> tuple[Report, dict]:
    """Audit `src` while recording, write the tree to `directory`; returns the report and counts."""
    root = Path(directory)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise BadInput(f"--capture {root}: exists and is not an empty directory; name a new one")
    rec = Recorder(src)
    report = audit(rec, ifaces=ifaces, sample_seconds=sample_seconds)
    try:
        counts = _write(rec, root, report, sample_seconds)
    except PermissionError as exc:
        raise EnvironmentProblem(f"--capture {root}: cannot write ({exc.strerror})") from None
    return report, counts


def _rel(path: str) -> PurePosixPath:
    rel = PurePosixPath(os.path.normpath(path).lstrip("/"))
    if not rel.parts or rel.parts[0] == "..":
        raise ValueError(f"refusing to store {path!r} outside the capture")
    return rel


def _write(rec: Recorder, root: Path, report: Report, sample_seconds: float) -> dict:
    files = {_rel(p): _redact(p, t) for p, t in rec.files.items() if t is not None}
    placeholders = {_rel(p) / e for p, entries in rec.listings.items() for e in entries}
    placeholders |= {_rel(p) for p, found in rec.existence.items() if found}
    everything = set(files) | placeholders
    parents = {a for p in everything for a in p.parents}
    root.mkdir(parents=True, exist_ok=True)
    written = 0
    for rel, text in sorted(files.items()):
        if rel in parents:
            continue  # cannot be both a file and a directory; the directory wins
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        written += 1
    for rel in sorted(placeholders - set(files) - parents):
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.touch()
    for p, entries in rec.listings.items():
        if not entries and rec.inner.exists(p):
            (root / _rel(p)).mkdir(parents=True, exist_ok=True)
    commands = {}
    (root / "commands").mkdir(exist_ok=True)
    for name, (argv, out) in sorted(rec.commands.items()):
        if out is None:
            commands[name] = {"argv": argv, "missing": True}
            continue
        (root / "commands" / name).write_text(out.stdout)
        commands[name] = {"argv": argv, "rc": out.rc, "stderr": out.stderr[-2000:]}
    samples = {}
    for i, (path, snaps) in enumerate(sorted(rec.samples.items())):
        if len(snaps) < 2:
            continue
        (root / "samples").mkdir(exist_ok=True)
        names = []
        for k, (_, text) in enumerate(snaps):
            name = f"samples/{i}-{PurePosixPath(path).name}.{k}"
            (root / name).write_text(text)
            names.append(name)
        samples[path] = {"times": [t for t, _ in snaps], "files": names}
    manifest = {
        "format": CAPTURE_FORMAT,
        "offlab": __version__,
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"name": report.host.get("name"), "kernel": report.host.get("kernel"),
                 "netns": report.host.get("netns")},
        "privileged": rec.privileged,
        "options": {"interfaces": report.host.get("interfaces"), "sample_seconds": sample_seconds},
        "redacted": {p: why for p, why in REDACTIONS.items() if p in rec.files},
        "denied": sorted(rec.denied),
        "commands": commands,
        "samples": samples,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {"files": written, "commands": len(commands), "samples": len(samples)}
