"""The kernel's own account of a window: drops by reason and place, skbs by gso_type per device.

One bpftrace process per sample (Debian's bpftrace, started before the traffic and ended by pid
with the probe session) counts, inside the kernel, in BPF maps keyed by network namespace inode:
- `skb:kfree_skb`: datagrams dropped by (namespace, device, reason, location), a dropped super-packet
  (a gso_size and more than one segment, as the kernel's skb_is_gso) counted as its
  `skb_shinfo(skb)->gso_segs` (read through BTF);
- `net:net_dev_queue`: skbs handed to each device's queue and their segments, by gso_type, super-packets
  keyed apart from the rest of their type: what the stack built, before the device's features are
  checked and a super-packet it cannot take is cut in software;
- `net:net_dev_start_xmit`: skbs handed to each device's driver and their segments, by gso_type;
- `net:napi_gro_receive_entry`: frames each device's NAPI handed to GRO;
- `net:netif_receive_skb`: skbs each device passed up the stack and their segments (what GRO built).
Only the lab's namespaces are counted. Each edge of the window sends the process SIGUSR1, which makes
it print its maps (one JSON line each): the window's account is end − start. tracefs is mounted in
a private mount namespace of that process (it goes away with it), where the reasons' names are read
from `skb:kfree_skb`'s format. Nothing is read per packet in user space.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from offlab import netdev
from offlab.errors import EnvironmentProblem, OfflabError
from offlab.hosts import LOCAL, Process
from offlab.hosts.process import die_with_parent
from offlab.sample import TraceAccount

BTF = "/sys/kernel/btf/vmlinux"
MIN_VERSION = (0, 17, 0)  # Debian 12's, the one this program was written and tested on
START_TIMEOUT_S = 90.0  # bpftrace parses BTF and compiles: seconds, tens of seconds on a loaded machine
READ_TIMEOUT_S = 10.0
# bpftrace prints its maps from its main loop after SIGUSR1, which waits for the next 100 ms tick
# unless an event wakes it: the SIGUSR1 sent to it makes one (signal:signal_generate → printf). How
# late it then prints does not matter: the edge is the epoch the same probe moves on (EPOCH).
WAKE_SIGNAL = int(signal.SIGUSR1)
STOP_WAIT_S = 1.0  # bpftrace 0.17 was seen to outlive a SIGINT by over 10 s: then SIGKILL
MAPS = ("@drop", "@gro_in", "@queue", "@queue_segs", "@rx", "@rx_segs", "@xmit", "@xmit_segs")
# bpftrace prints its maps in the order of their names and leaves out the empty ones: this one, set
# once, is always there and always last, so it ends each printout.
LAST = "@zz_edge"
# Every count is keyed by the edges before it: the SIGUSR1 that asks for a printout (sent by offlab
# beside its counters' reads) moves this on, in the kernel, at the instant of the kill() itself. The
# window is what was counted between its two edges, however late bpftrace then prints.
EPOCH = "@epoch"
FORMAT_END = "offlab-format-end"
# skb_shinfo(skb)->gso_type bits (include/linux/skbuff.h) that name what a super-packet carries
GSO_TYPES = {1 << 0: "TCPV4", 1 << 1: "DODGY", 1 << 2: "TCP_ECN", 1 << 3: "TCP_FIXEDID", 1 << 4: "TCPV6",
             1 << 5: "FCOE", 1 << 6: "GRE", 1 << 7: "GRE_CSUM", 1 << 8: "IPXIP4", 1 << 9: "IPXIP6",
             1 << 10: "UDP_TUNNEL", 1 << 11: "UDP_TUNNEL_CSUM", 1 << 12: "PARTIAL",
             1 << 13: "TUNNEL_REMCSUM", 1 << 14: "SCTP", 1 << 15: "ESP", 1 << 16: "UDP", 1 << 17: "UDP_L4",
             1 << 18: "FRAGLIST"}
UDP_L4 = 1 << 17
_SYMBOL = re.compile(r"\{\s*(\d+)\s*,\s*\"(\w+)\"\s*\}")


def gso_names(gso_type: int) -> str:
    """gso_type bits as names joined by '|' ('-' for none): 'UDP_L4', 'TCPV4|DODGY'."""
    names = [n for bit, n in GSO_TYPES.items() if gso_type & bit]
    rest = gso_type & ~sum(GSO_TYPES)
    return "|".join(names + ([hex(rest)] if rest else [])) or "-"


def program(netns: list[int]) -> str:
    """The bpftrace program, counting only in the given network namespaces (inode numbers)."""
    if not netns or not all(isinstance(n, int) and n > 0 for n in netns):
        raise ValueError(f"network namespace inodes expected, not {netns!r}")
    mine = " || ".join(f"$ns == {n}" for n in sorted(set(netns)))
    return f"""
BEGIN {{ {LAST} = 1; {EPOCH} = 0; }}
tracepoint:signal:signal_generate /args->sig == {WAKE_SIGNAL} && args->pid == $1/
{{
  {EPOCH} = {EPOCH} + 1;
  printf("offlab-edge\\n");
}}
tracepoint:skb:kfree_skb
{{
  $skb = (struct sk_buff *)args->skbaddr;
  $dev = $skb->dev;
  $sk = $skb->sk;
  $ns = (uint64)0;
  if ($dev != 0) {{ $ns = $dev->nd_net.net->ns.inum; }}
  else {{ if ($sk != 0) {{ $ns = $sk->__sk_common.skc_net.net->ns.inum; }} }}
  if ({mine}) {{
    $sh = (struct skb_shared_info *)($skb->head + $skb->end);
    $segs = $sh->gso_size > 0 && $sh->gso_segs > 1 ? $sh->gso_segs : 1;
    @drop[{EPOCH}, $ns, $dev != 0 ? $dev->ifindex : 0, args->reason, ksym(args->location)] = sum($segs);
  }}
}}
tracepoint:net:net_dev_queue
{{
  // handed to the device's queue, before any software segmentation (validate_xmit_skb) for its features
  $skb = (struct sk_buff *)args->skbaddr;
  $ns = $skb->dev->nd_net.net->ns.inum;
  if ({mine}) {{
    $sh = (struct skb_shared_info *)($skb->head + $skb->end);
    $segs = $sh->gso_size > 0 && $sh->gso_segs > 1 ? $sh->gso_segs : 1;
    @queue[{EPOCH}, $ns, str(args->name), $sh->gso_type, $segs > 1] = count();
    @queue_segs[{EPOCH}, $ns, str(args->name), $sh->gso_type, $segs > 1] = sum($segs);
  }}
}}
tracepoint:net:net_dev_start_xmit
{{
  $skb = (struct sk_buff *)args->skbaddr;
  $ns = $skb->dev->nd_net.net->ns.inum;
  if ({mine}) {{
    // the tracepoint's own gso_type field is a u16 on this kernel: SKB_GSO_UDP_L4 (1 << 17) reads 0 there
    $type = ((struct skb_shared_info *)($skb->head + $skb->end))->gso_type;
    $segs = args->gso_size > 0 && args->gso_segs > 1 ? args->gso_segs : 1;
    @xmit[{EPOCH}, $ns, str(args->name), $type, $segs > 1] = count();
    @xmit_segs[{EPOCH}, $ns, str(args->name), $type, $segs > 1] = sum($segs);
  }}
}}
tracepoint:net:napi_gro_receive_entry
{{
  // each frame a device's NAPI handed to GRO: against what netif_receive_skb passed up, what GRO merged
  $skb = (struct sk_buff *)args->skbaddr;
  $ns = $skb->dev->nd_net.net->ns.inum;
  if ({mine}) {{
    @gro_in[{EPOCH}, $ns, str(args->name)] = count();
  }}
}}
tracepoint:net:netif_receive_skb
{{
  $skb = (struct sk_buff *)args->skbaddr;
  $ns = $skb->dev->nd_net.net->ns.inum;
  if ({mine}) {{
    $sh = (struct skb_shared_info *)($skb->head + $skb->end);
    $segs = $sh->gso_size > 0 && $sh->gso_segs > 1 ? $sh->gso_segs : 1;
    @rx[{EPOCH}, $ns, str(args->name), $sh->gso_type, $segs > 1] = count();
    @rx_segs[{EPOCH}, $ns, str(args->name), $sh->gso_type, $segs > 1] = sum($segs);
  }}
}}
"""


def unavailable() -> str | None:
    """Why the witness cannot run on this machine (one line), or None."""
    if os.geteuid() != 0:
        return "not root: loading BPF programs needs CAP_BPF and CAP_PERFMON"
    if shutil.which("bpftrace") is None:
        return "bpftrace is not installed (apt-get install bpftrace; scripts/install-deps does)"
    if not os.path.exists(BTF):
        return f"this kernel has no BTF ({BTF} missing): a dropped super-packet's segments cannot be read"
    try:
        said = LOCAL.run(["bpftrace", "--version"], timeout=30, check=False).stdout
    except OfflabError as exc:
        return f"bpftrace --version failed: {exc}"
    found = version(said)
    if found is None or found < MIN_VERSION:
        return (f"bpftrace {'.'.join(map(str, found)) if found else repr(said.strip()[:40])} is older than "
                f"{'.'.join(map(str, MIN_VERSION))} (its JSON printout and BTF struct reads): install bpftrace ≥ "
                f"{'.'.join(map(str, MIN_VERSION))}")
    return None


def version(text: str) -> tuple[int, ...] | None:
    """`bpftrace --version`'s 'bpftrace v0.17.0' → (0, 17, 0); None if it says no version."""
    m = re.search(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x or 0) for x in m.groups()) if m else None


def parse_reasons(format_text: str) -> dict[int, str]:
    """`skb:kfree_skb`'s format file → {reason number: name} from its print fmt's __print_symbolic."""
    fmt = format_text.split("print fmt:", 1)[-1]
    return {int(n): name for n, name in _SYMBOL.findall(fmt)}


def parse_map_line(line: str) -> tuple[str, dict[tuple, int]] | None:
    """One line of `bpftrace -f json`'s map printout → (map name, {key tuple: value}); None for other lines."""
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("type") != "map" or not isinstance(d.get("data"), dict):
        return None
    (name, entries), = d["data"].items()
    out: dict[tuple, int] = {}
    for key, value in (entries if isinstance(entries, dict) else {}).items():
        parts = tuple(int(p) if p.lstrip("-").isdigit() else p for p in str(key).split(","))
        out[parts] = int(value)
    return name, out


@dataclass
class Maps:
    """One edge's printout: map name → {key: value} (maps without entries are absent or empty)."""

    t: float  # when SIGUSR1 was sent (this machine's monotonic clock)
    epoch: int = 0  # edges counted up to this one (the printout's @epoch)
    maps: dict[str, dict[tuple, int]] = field(default_factory=dict)
    printed_s: float = 0.0  # from the signal to the end of the printout: how late this edge was read


def delta(a: Maps, b: Maps) -> dict[str, dict[tuple, int]]:
    """What was counted between edge `a` and edge `b` per map and key (the key without its epoch): the
    entries of b's printout whose epoch is a's or later and before b's."""
    out: dict[str, dict[tuple, int]] = {}
    for name in MAPS:
        got: dict[tuple, int] = {}
        for key, v in b.maps.get(name, {}).items():
            if a.epoch <= int(key[0]) < b.epoch:
                got[key[1:]] = got.get(key[1:], 0) + v
        if got:
            out[name] = got
    return out


class KernelTrace:
    """The bpftrace process of one sample: `start()`, `read()` at each edge, `close()` (by pid)."""

    def __init__(self, netns: dict[int, str]) -> None:
        self.netns = netns  # namespace inode → role
        self.proc: Process | None = None
        self.reasons: dict[int, str] = {}
        self.error: str | None = None  # why it could not run (the sample's one line)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._err_pump: threading.Thread | None = None

    def start(self) -> bool:
        """Start bpftrace and wait until its probes are attached; False (with `error`) if it cannot run."""
        self.error = unavailable()
        if self.error is not None:
            return False
        script = program(list(self.netns))
        # tracefs in the process's own mount namespace: bpftrace finds the tracepoints there, the
        # reasons' names are read from it, and it is unmounted when the process ends.
        sh = ("mount -t tracefs nodev /sys/kernel/tracing && cat /sys/kernel/tracing/events/skb/kfree_skb/format"
              f" && echo {FORMAT_END} && exec bpftrace -f json -e \"$0\" $$")
        try:
            self.proc = LOCAL.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", sh, script],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    # its own session: a Ctrl-C reaches offlab, which ends it by pid (close); it
                                    # dies with offlab if offlab is killed outright
                                    text=True, start_new_session=True, preexec_fn=die_with_parent)
        except OfflabError as exc:
            self.error = f"bpftrace could not be started: {exc}"
            return False
        threading.Thread(target=self._pump, daemon=True).start()
        self._err_pump = threading.Thread(target=self._pump_err, daemon=True)
        self._err_pump.start()
        fmt: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            line = self._next(deadline)
            if line is None:
                self.error = self._why_not("did not start")
                self.close()
                return False
            if line.strip() == FORMAT_END:
                self.reasons = parse_reasons("".join(fmt))
                fmt = []
                continue
            if '"attached_probes"' in line:
                return True
            fmt.append(line)

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            if "RLIMIT_MEMLOCK" not in line:  # memory is charged to the cgroup on this kernel: harmless
                self._stderr.append(line.strip())

    def _next(self, deadline: float) -> str | None:
        try:
            return self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def _why_not(self, what: str) -> str:
        if self._err_pump is not None and self.proc is not None:
            # When bpftrace has ended (or is ending: its stdout closed), its stderr is read to the end before
            # it is quoted: the stdout's end can reach us first, and on a loaded machine the refusal was then
            # missing from the line. One still running (a start that timed out) is not waited for.
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            else:
                self._err_pump.join(timeout=5)
        err = next((e for e in self._stderr if "ERROR" in e), self._stderr[0] if self._stderr else "")
        return f"bpftrace {what}" + (f": {err}" if err else "")

    def read(self) -> Maps:
        """The maps as they stand now (SIGUSR1: bpftrace prints them all)."""
        return self.collect(self.request())

    def request(self) -> float:
        """Ask for a printout now (at the edge, beside the counters' reads); `collect` waits for it."""
        if self.proc is None or self.proc.poll() is not None:
            raise EnvironmentProblem(self._why_not("ended before the window's end"))
        t = time.monotonic()
        LOCAL.signal(self.proc.pid, signal.SIGUSR1)
        return t

    def collect(self, t: float) -> Maps:
        """The printout asked for at `t`."""
        got = Maps(t)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            line = self._next(deadline)
            if line is None:
                raise EnvironmentProblem(self._why_not("did not print its maps"))
            if line.startswith('{"type": "map", "data": {"' + EPOCH + '":'):
                got.epoch = int(json.loads(line)["data"][EPOCH])
                continue
            parsed = parse_map_line(line)
            if parsed is not None:
                if parsed[0] == LAST:
                    got.printed_s = time.monotonic() - t
                    return got
                got.maps[parsed[0]] = parsed[1]

    def close(self) -> None:
        """End bpftrace by its pid (SIGINT, then SIGKILL); its mount namespace and tracefs go with it, and
        the kernel detaches its programs when its last file descriptor closes."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        LOCAL.signal(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            LOCAL.signal(p.pid, signal.SIGKILL)
            p.wait(timeout=STOP_WAIT_S)


def netns_inode(netns_name: str) -> int:
    """The inode of a named network namespace (/run/netns/NAME): the kernel's ns.inum."""
    return os.stat(f"/run/netns/{netns_name}").st_ino


def ifnames(host) -> dict[int, str]:
    """ifindex → name of a namespace host's links, {} where it cannot say."""
    try:
        links = netdev.link_rows(host)
    except OfflabError:
        return {}
    return {x.ifindex: x.ifname for x in links if x.ifindex is not None}


def account(a: Maps, b: Maps, kt: KernelTrace, hosts: dict) -> TraceAccount:
    """The window's account as the sample stores it: drops (host, device, reason, location, datagrams); per
    device the skbs handed to its queue (queue) and its driver (xmit) and passed up from it (rx) by gso_type,
    with their segments; and the frames its NAPI handed to GRO (gro_in)."""
    d = delta(a, b)
    roles = kt.netns
    names: dict[str, dict[int, str]] = {}
    drops = []
    for (ns, ifindex, reason, location), n in d.get("@drop", {}).items():
        role = roles.get(int(ns), str(ns))
        device = None
        if ifindex:
            if role not in names:
                names[role] = ifnames(hosts[role]) if role in hosts else {}
            device = names[role].get(int(ifindex), f"ifindex {ifindex}")
        drops.append({"host": role, "device": device, "reason": kt.reasons.get(int(reason), str(reason)),
                      "location": location or None, "datagrams": n})
    drops.sort(key=lambda x: -int(x["datagrams"] or 0))
    out: dict = {"tool": "bpftrace", "window_s": round(b.t - a.t, 6),
                 "printed_s": [round(a.printed_s, 6), round(b.printed_s, 6)], "drops": drops}
    gro = [{"host": roles.get(int(ns), str(ns)), "device": dev, "frames": n} for (ns, dev), n in d.get("@gro_in", {}).items()]
    out["gro_in"] = sorted(gro, key=lambda r: (r["host"], r["device"]))
    for key in ("queue", "xmit", "rx"):
        segs = d.get(f"@{key}_segs", {})
        # keyed by namespace, device, gso_type and (since the super-packets are keyed apart from the rest
        # of their type) whether they are super-packets: a row's skbs are all super-packets or none
        rows = [{"host": roles.get(int(k[0]), str(k[0])), "device": k[1], "gso_type": gso_names(int(k[2])),
                 "skbs": n, "segments": segs.get(k, n)}
                for k, n in d.get(f"@{key}", {}).items()]
        out[key] = sorted(rows, key=lambda r: (r["host"], r["device"], -r["skbs"]))
    return TraceAccount.from_json(out)
