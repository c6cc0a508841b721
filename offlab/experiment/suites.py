"""Built-in suites: plans shipped with offlab that reproduce the seed documents."""

from __future__ import annotations

from importlib import resources

import yaml

from offlab.errors import BadInput
from offlab.experiment import yamlio
from offlab.experiment.plan import Plan, load_plan


def _files() -> dict[str, str]:
    root = resources.files("offlab.suites")
    return {p.name.removesuffix(".yaml"): p.read_text() for p in root.iterdir() if p.name.endswith(".yaml")}


def names() -> list[str]:
    return sorted(_files())


def text(name: str) -> str:
    files = _files()
    if name not in files:
        raise BadInput(f"no suite named {name!r}: choose one of {', '.join(sorted(files))} (offlab suite list)")
    return files[name]


def description(name: str) -> str:
    data, _ = yamlio.load(text(name), f"suite {name}")
    return " ".join(str(data.get("description", "")).split())


def plans(name: str, *, quick: bool = False) -> list[Plan]:
    """The plans a suite runs: itself, or each part a composite suite includes (with --quick, those
    that do not say `in_quick: false`)."""
    data, _ = yamlio.load(text(name), f"suite {name}")
    if "include" not in data:
        return [load_plan(text(name), f"suite {name}", quick=quick)]
    out = []
    for i, part in enumerate(data["include"]):
        if quick and part.get("in_quick") is False:  # a part too slow for --quick's two minutes
            continue
        base, _ = yamlio.load(text(part["suite"]), f"suite {part['suite']}")
        for key in ("only", "exclude", "repeat", "budget", "headline", "quick", "quick_workload"):
            if key in part:
                base[key] = part[key]
        if "workload" in part:  # e.g. shorter samples: merged into the suite's own workload
            base["workload"] = {**(base.get("workload") or {}), **part["workload"]}
        effective = yaml.safe_dump(base, sort_keys=False, allow_unicode=True)
        out.append(load_plan(effective, f"suite {name} part {i + 1} ({part['suite']})", quick=quick))
    return out
