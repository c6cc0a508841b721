"""The state directory: lab files, settings journals, OVS run directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_STATE_DIR = "/run/offlab"


def state_dir() -> Path:
    return Path(os.environ.get("OFFLAB_STATE_DIR", DEFAULT_STATE_DIR))


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path


def write_json_atomic(path: Path, data: object) -> None:
    """Write, fsync, rename: a crash leaves either the old or the new file, never half."""
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: Path) -> object:
    with open(path) as f:
        return json.load(f)
