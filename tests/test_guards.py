"""Mechanical guards, run by `make test` like every other test: ruff with the rule set pyproject.toml
chooses (and says why), and mypy on the parts whose types the rest leans on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# hosts, knobs and store: every part above them calls them; a wrong type there is everyone's bug.
# hosts, knobs and the store (the floor), and the typed doors between parts: the stored
# sample's view, the measure request, the witnesses that read samples, the probe result
TYPED = ["offlab/hosts", "offlab/netdev", "offlab/knobs", "offlab/store", "offlab/sample.py", "offlab/experiment/request.py",
         "offlab/experiment/witnesses.py", "offlab/probes", "offlab/experiment/measure.py",
         "offlab/experiment/effects", "offlab/report/trend.py", "offlab/experiment/kernel_account.py",
         "offlab/metrics.py", "offlab/experiment/search.py"]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    # the benchmarks are scripts without a .py suffix: named one by one
    scripts = sorted(str(p.relative_to(REPO)) for p in Path(REPO, "benchmarks").iterdir() if p.is_file())
    res = _run("ruff", "check", "--no-cache", "--output-format", "concise", "offlab", "tests", *scripts)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_finds_nothing_in_the_typed_parts():
    res = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null", "--ignore-missing-imports",
               "--follow-imports=silent", *TYPED)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_repo_stands_alone_no_file_cites_one_outside_it():
    """Code, tests and docs say what they mean themselves: none points a reader at a design note, a style
    guide or a notes folder that lives outside this repository."""
    outside = ("DESIGN" + ".md", "STYLE" + ".md", "shared" + "/notes", "../" + "shared")
    found = []
    for top in ("offlab", "tests", "docs", "scripts", "benchmarks", "engine/src", "README.md", "Makefile"):
        root = Path(REPO, top)
        for p in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if p.is_file() and "__pycache__" not in p.parts and "fixtures" not in p.parts:
                text = p.read_text(errors="replace")
                found += [f"{p.relative_to(REPO)}: {w}" for w in outside if w in text]
    assert not found, found
