"""Parsers for the text the kernel and the other tools print, live or in a sosreport.

`ip`, `tc` and `ethtool` output (JSON or the text a sosreport holds) and softnet_stat are parsed in
offlab.netdev, which knobs, lab and probes share; here are /proc, nftables, OVS and ps.
"""

from __future__ import annotations

import re


def key_values(text: str) -> dict[str, str]:
    """'key: value' lines (/proc/PID/status) → dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


# ---- CPU sets -------------------------------------------------------------

MAX_CPUS = 8192


def cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' → {0,1,2,3,8,10,11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"malformed CPU list {text.strip()[:40]!r}")
        first, last = int(lo), int(hi or lo)
        # Linux has at most 8192 CPUs (NR_CPUS); a larger range is damaged data, not a machine.
        if last < first or last >= MAX_CPUS:
            raise ValueError(f"CPU range {part[:40]!r} is out of range 0..{MAX_CPUS - 1}")
        cpus.update(range(first, last + 1))
    return cpus


def cpumask(text: str) -> set[int]:
    """'00000000,0000000f' (sysfs hex mask, comma-grouped) → {0,1,2,3}."""
    value = int(text.strip().replace(",", "") or "0", 16)
    return {i for i in range(value.bit_length()) if value >> i & 1}


def format_cpus(cpus: set[int] | list[int]) -> str:
    """{0,1,2,3,8} → '0-3,8'."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def mask_of(cpus: set[int]) -> str:
    """{0,1,2,3} → 'f' (what rps_cpus / xps_cpus accept)."""
    return format(sum(1 << c for c in cpus), "x")


# ---- /proc ----------------------------------------------------------------

def kernel_version(release: str) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def meminfo(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.split():
            try:
                out[key.strip()] = int(value.split()[0])
            except ValueError:
                continue
    return out


def cpuinfo(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo → one dict per processor."""
    procs, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                procs.append(cur)
            cur = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            cur[key.strip()] = value.strip()
    if cur:
        procs.append(cur)
    return procs


def interrupts(text: str) -> dict[str, dict]:
    """/proc/interrupts → {irq: {"counts": [per cpu], "name": "... virtio2-input.0"}}."""
    lines = text.splitlines()
    if not lines:
        return {}
    ncpu = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        irq, sep, rest = line.partition(":")
        irq = irq.strip()
        if not sep or not irq.isdigit():
            continue
        fields = rest.split()
        counts = [int(f) for f in fields[:ncpu] if f.isdigit()]
        out[irq] = {"counts": counts, "name": " ".join(fields[len(counts):])}
    return out


# ---- firewall rule counts -------------------------------------------------

def count_save_rules(text: str) -> int:
    """iptables-save / ip6tables-save / ebtables-save: one rule per '-A' line."""
    return sum(1 for l in text.splitlines() if l.startswith("-A "))


def count_list_rules(text: str) -> int:
    """`iptables -vnxL` / `ebtables -t T -L` text: lines that are neither headers nor blank."""
    n = 0
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("Chain ", "Bridge table:", "Bridge chain:", "pkts ", "target ", "num ")):
            continue
        n += 1
    return n


def count_nft_rules(text: str) -> int:
    """`nft list ruleset`: statements inside chain blocks, not the chain's type/policy lines."""
    n, in_chain = 0, False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("chain ") and s.endswith("{"):
            in_chain = True
            continue
        if not in_chain:
            continue
        if s == "}":
            in_chain = False
            continue
        if not s or s.startswith(("type ", "policy ", "comment ", "#", "devices ")):
            continue
        n += 1
    return n


# ---- ip / ovs / pgrep -----------------------------------------------------

def dpif_show(text: str) -> dict[str, dict[str, list[str]]]:
    """`ovs-appctl dpif/show` → {"netdev@ovs-netdev": {"br0": ["port", ...]}}."""
    out: dict[str, dict[str, list[str]]] = {}
    dp = bridge = None
    for line in text.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            dp = line.split(":")[0]
            out[dp] = {}
            bridge = None
        elif indent <= 2 and line.strip().endswith(":") and dp:
            bridge = line.strip()[:-1]
            out[dp][bridge] = []
        elif dp and bridge:
            port = line.split()[0]
            if port != bridge:
                out[dp][bridge].append(port)
    return out


def pgrep_list(text: str) -> list[tuple[int, str]]:
    """`pgrep -l` / `pgrep -a` lines → [(pid, rest)]."""
    out = []
    for line in text.splitlines():
        pid, _, rest = line.strip().partition(" ")
        if pid.isdigit():
            out.append((int(pid), rest.strip()))
    return out


def netns_ids(text: str) -> dict[int, str]:
    """`ip netns list` → {nsid: name} for the namespaces that have an id here."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+) \(id: (\d+)\)", line.strip())
        if m:
            out[int(m.group(2))] = m.group(1)
    return out


# ---- sosreport command outputs ---------------------------------------------

def lscpu(text: str) -> dict[str, str]:
    """`lscpu` text → {field: value}, in any of its layouts.

    Piped, as sos captures it, lscpu prints one flat field per line (util-linux 2.37+
    adds empty section lines such as 'Vulnerabilities:'); on a terminal 2.37+ indents
    the fields under their section and drops the 'Vulnerability ' prefix, which is
    put back here. The first of a repeated field wins.
    """
    out: dict[str, str] = {}
    section = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        name, value = key.strip(), value.strip()
        if not sep or not name:
            continue
        nested = line[:1].isspace()
        if not nested:
            section = name if not value else None
        elif section == "Vulnerabilities":
            name = "Vulnerability " + name
        out.setdefault(name, value)
    return out


def lscpu_cpus(text: str) -> set[int]:
    """An lscpu CPU list ('0-15,32-47'); empty when it is missing or not a list."""
    try:
        return cpulist(text) if re.fullmatch(r"[\d,\-\s]+", text or "") else set()
    except ValueError:
        return set()


def lscpu_vulnerabilities(fields: dict[str, str]) -> dict[str, str]:
    """lscpu's 'Vulnerability Spectre v2: Mitigation; ...' lines → sysfs names {"spectre_v2": "Mitigation; ..."}."""
    return {key[len("Vulnerability "):].strip().lower().replace(" ", "_"): value
            for key, value in fields.items() if key.startswith("Vulnerability ")}


def ps_processes(text: str) -> list[tuple[int, str]]:
    """`ps auxwww` / `ps auxwwwm` (sos 4: thread rows with PID '-') → [(pid, command line)]."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split(None, 10)
        if len(cols) == 11 and cols[1].isdigit():
            out.append((int(cols[1]), cols[10]))
    return out


def cpupower_frequency(text: str) -> dict[str, str]:
    """`cpupower frequency-info` → {"driver": "intel_pstate", "governor": "powersave"} (what it says of CPU 0)."""
    out = {}
    m = re.search(r"^\s*driver: (\S+)", text, re.M)
    if m:
        out["driver"] = m.group(1)
    m = re.search(r'The governor "([^"]+)"', text)
    if m:
        out["governor"] = m.group(1)
    return out


def strip_nft_handles(text: str) -> str:
    """`nft -a list ruleset` (what sos 4 runs) → the same text without its ' # handle N' comments."""
    return re.sub(r"\s*# handle \d+\s*$", "", text, flags=re.M)


def cpupower_idle(text: str) -> dict:
    """`cpupower idle-info` → {"driver", "governor", "states": [{"name", "latency_us", "disabled"}]} of CPU 0."""
    out: dict = {"driver": None, "governor": None, "states": []}
    state: dict | None = None
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"^CPUidle (driver|governor): (\S+)", s)
        if m:
            out[m.group(1)] = m.group(2)
            continue
        m = re.fullmatch(r"([A-Za-z0-9_-]+)( \(DISABLED\))?\s*:", s)
        if m:
            state = {"name": m.group(1), "latency_us": None, "disabled": bool(m.group(2))}
            out["states"].append(state)
            continue
        m = re.fullmatch(r"Latency: (\d+)", s)
        if m and state is not None:
            state["latency_us"] = int(m.group(1))
    return out
