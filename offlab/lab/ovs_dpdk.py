"""The `ovs-dpdk` topology: a private OVS-DPDK between two namespaces (seed 004's switch).

ovsdb-server and the DPDK build of ovs-vswitchd run with the lab's own database, sockets, pid and
log files (see lab/ovs.py); DPDK runs with `--no-huge --legacy-mem` (no hugepages here; without
`--legacy-mem` OVS adds `--in-memory` and EAL aborts) and a `--file-prefix` of its own, whose
/var/run/dpdk/<prefix> offlab makes and marks first, so only that one is ever removed. The system's
OVS (service, /usr/sbin/ovs-vswitchd alternative, database) is never read or touched.

ovs-vswitchd-dpdk is started in the foreground of its own session, not with --detach, so its pid
is known (and recorded, with its start time) the moment it exists, before DPDK initialises.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time

from offlab import netdev
from offlab.addresses import CLIENT4, CLIENT6, SERVER4, SERVER6
from offlab.dpdk.ports import PMD_MAX_FRAME, PMD_MAX_MTU, VHOST_MAX_FRAME, VHOST_MAX_MTU
from offlab.dpdk.testpmd import OWNER_FILE, owner_mark, runtime_dir, version
from offlab.errors import BadInput, EnvironmentProblem, OfflabError, ToolMissing
from offlab.hosts import TOOL_PACKAGES
from offlab.hosts.process import process_start_time
from offlab.lab.build import Builder
from offlab.lab.dpdk import attach_ports, check_cpu, default_cpu
from offlab.lab.model import Daemon, Interface, LabState
from offlab.lab.ovs import Ovs, alive
from offlab.names import link_name

VSWITCHD = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk"
DAEMON = "ovs-vswitchd-dpdk"
PACKAGE = TOOL_PACKAGES[DAEMON]
BRIDGE = "br0"
MEMORY_MB = 1024
# vhost-user ports at up to 9710: jumbo mbufs, and a run-time MTU change needs a second pool while
# the first is in use (with 1024 MB and shared pools OVS logged `Failed to create mempool ... No
# buffer space available` and dropped both vhost ports, which only a guest restart recovers)
VHOST_MEMORY_MB = 2048
INIT_TIMEOUT = 90.0
# seconds ovs-vsctl waits for vswitchd to attach a DPDK port: the PMD probes the device and starts
# its queues, which took over 10 s (ovs-vsctl's usual wait) under a loaded CI run
DPDK_PORT_WAIT = 60
# --pmd → the PMD of the dpdk ports; what each takes is in offlab/dpdk/ports.py: above MTU 1500 OVS
# refuses mtu_request and detaches the port until it is cleared.
PORT_TYPES = {"tap": "net_tap", "af_packet": "net_af_packet"}
MAX_MTU = PMD_MAX_MTU
# --pmd-sleep: OVS 3.1's other_config:pmd-maxsleep takes 0..10000 µs
MAX_PMD_SLEEP_US = 10_000


def require_vswitchd() -> str:
    """The DPDK build of ovs-vswitchd (called by full path: the system alternative stays the plain one)."""
    if not os.access(VSWITCHD, os.X_OK):
        raise ToolMissing(DAEMON, PACKAGE)
    return VSWITCHD


def check_options(name: str, mtu: int, options: dict) -> None:
    """What `lab up ovs-dpdk` can refuse before anything exists (exit 2)."""
    pmd = options.get("pmd", "tap")
    if pmd not in PORT_TYPES:
        raise BadInput(f"--pmd {pmd!r}: ovs-dpdk ports are tap or af_packet")
    if mtu > MAX_MTU:
        driver = PORT_TYPES[pmd]
        frame = PMD_MAX_FRAME[driver]
        raise BadInput(f"--mtu {mtu}: ovs-dpdk's {pmd} ports ({driver}, DPDK 22.11) take frames ≤ {frame} B, i.e. "
                       f"MTU ≤ {MAX_MTU}; OVS refuses mtu_request={mtu} there and detaches the port until the "
                       f"request is cleared. Use --mtu {MAX_MTU} (jumbo frames need vhost-user ports)")
    check_cpu(options.get("cpu"), "the OVS PMD thread's CPU; ")
    check_pmd_sleep(options.get("pmd_sleep"))


def check_pmd_sleep(us: int | None) -> None:
    """--pmd-sleep: µs OVS's pmd-maxsleep takes."""
    if us is not None and not 0 <= us <= MAX_PMD_SLEEP_US:
        raise BadInput(f"--pmd-sleep {us}: give 0..{MAX_PMD_SLEEP_US} µs (OVS's pmd-maxsleep); 0 busy-polls")


def check_vm_options(name: str, mtu: int, options: dict) -> None:
    """What `lab up ovs-dpdk-vm` can refuse before anything exists (exit 2)."""
    if "pmd" in options:
        raise BadInput("--pmd: ovs-dpdk-vm's ports are vhost-user (dpdkvhostuser); --pmd is for ovs-dpdk")
    if mtu > VHOST_MAX_MTU:
        raise BadInput(f"--mtu {mtu}: OVS-DPDK's vhost-user ports take at most MTU {VHOST_MAX_MTU} "
                       f"(frames ≤ {VHOST_MAX_FRAME} B)")
    check_options(name, MAX_MTU, {k: v for k, v in options.items() if k in ("cpu", "pmd_sleep")})


def ovs_dpdk_vm(b: Builder, mtu: int) -> None:
    """[client (guest): eth0] ─ vhost-user ─ [switch: OVS-DPDK br0] ─ vhost-user ─ [server (guest): eth0]

    Seed 004's guest ↔ guest test: OVS serves a `dpdkvhostuser` socket per guest in its run
    directory, with `mtu_request` = the lab's MTU (9000 works here, unlike tap and af_packet);
    each QEMU (TCG, in the switch namespace) is its client, guest RAM shared memfd memory.
    """
    from offlab.lab.vm import boot_guest, guest_address

    opts = b.lab.options
    check_vm_options(b.lab.name, mtu, opts)
    cpu = opts.setdefault("cpu", default_cpu())
    b.host("switch")
    switch = Ovs.start(b, vswitchd=False)
    start_vswitchd(b, switch, cpu, memory_mb=VHOST_MEMORY_MB, per_port_memory=True,
                   pmd_sleep=opts.get("pmd_sleep", 0))
    switch.add_bridge(BRIDGE)
    with b.step(f"OVS bridge {BRIDGE} mtu_request={mtu}"):
        switch.vsctl("set", "Interface", BRIDGE, f"mtu_request={mtu}")
    for role, cidr4, cidr6 in (("client", CLIENT4, CLIENT6), ("server", SERVER4, SERVER6)):
        port = f"vhu-{role}"
        with b.step(f"OVS-DPDK vhost-user port {port} (mtu_request={mtu})"):
            switch.vsctl("add-port", BRIDGE, port, "--", "set", "Interface", port, "type=dpdkvhostuser",
                         f"mtu_request={mtu}", wait=DPDK_PORT_WAIT)
            b.lab.hosts["switch"].interfaces.append(Interface(port, "ovs-dpdk", peer_host=role, role="port"))
            b.lab.save()
            error = port_error(switch.vsctl, port)
            if error:
                raise EnvironmentProblem(f"OVS did not add {port}: {error}; {last_lines(switch.rundir)}")
        sock = str(switch.rundir / port)
        guest = boot_guest(b, role, "switch", [], peers=["switch"], vhost_user=[sock], rundir=switch.rundir)
        guest_address(b, role, guest, "eth0", cidr4, cidr6, mtu=mtu, reach=True)


def ovs_dpdk(b: Builder, mtu: int) -> None:
    """client ─ tap ─ [switch: OVS-DPDK br0 (netdev), dpdk ports on net_tap] ─ tap ─ server   (seed 004)
    client ─ veth ─ [switch: OVS-DPDK, dpdk ports on net_af_packet] ─ veth ─ server          (--pmd af_packet)

    The tap PMD makes its kernel taps in ovs-vswitchd's namespace (switch); they are moved to the
    client and server and addressed there. Any later port reconfiguration needs them back first.
    """
    opts = b.lab.options
    check_options(b.lab.name, mtu, opts)
    pmd = opts.setdefault("pmd", "tap")
    cpu = opts.setdefault("cpu", default_cpu())
    b.host("client"), b.host("switch"), b.host("server")
    if pmd == "af_packet":
        c, sw_c = b.wire("client", "switch", mtu=mtu)
        sw_s, s = b.wire("switch", "server", mtu=mtu)
        devargs = [f"net_af_packet0,iface={sw_c}", f"net_af_packet1,iface={sw_s}"]
    else:
        c, s = link_name(b.lab.name, 0), link_name(b.lab.name, 1)
        devargs = [f"net_tap0,iface={c}", f"net_tap1,iface={s}"]
    switch = Ovs.start(b, vswitchd=False)
    start_vswitchd(b, switch, cpu, pmd_sleep=opts.get("pmd_sleep", 0))
    switch.add_bridge(BRIDGE)
    for n, dev in enumerate(devargs):
        add_dpdk_port(b, switch, f"dpdk{n}", dev, mtu=mtu)
    attach_ports(b, pmd, [("client", c, CLIENT4, CLIENT6), ("server", s, SERVER4, SERVER6)])


def rehome_taps(lab: LabState) -> list[str]:
    """Send back to client and server any tap OVS re-created in the switch namespace (a dpdk port
    that was detached and attached again, e.g. after a refused mtu_request was cleared), with the
    lab's addresses and link up; the taps moved."""
    from offlab.hosts import LOCAL

    switch = lab.hosts["switch"].netns
    here = {l.ifname for l in netdev.links(lab.host("switch"))}
    moved = []
    for role, (cidr4, cidr6) in (("client", (CLIENT4, CLIENT6)), ("server", (SERVER4, SERVER6))):
        entry = lab.hosts[role]
        for iface in entry.interfaces:
            if iface.kind != "tap" or iface.name not in here:
                continue
            LOCAL.run(["ip", "-n", switch, "link", "set", iface.name, "netns", entry.netns])
            LOCAL.run(["ip", "-n", entry.netns, "addr", "add", cidr4, "dev", iface.name])
            if lab.ipv6:
                LOCAL.run(["ip", "-n", entry.netns, "addr", "add", cidr6, "dev", iface.name, "nodad"])
            LOCAL.run(["ip", "-n", entry.netns, "link", "set", iface.name, "up"])
            moved.append(iface.name)
    if moved:
        # a re-created tap has a new MAC: the other end's neighbour entry would point at the old one
        for role in ("client", "server"):
            LOCAL.run(["ip", "-n", lab.hosts[role].netns, "neigh", "flush", "all"], check=False)
    return moved


def start_vswitchd(b: Builder, switch: Ovs, cpu: int, *, memory_mb: int = MEMORY_MB,
                   per_port_memory: bool = False, pmd_sleep: int = 0) -> None:
    """Configure DPDK in the private database, then run ovs-vswitchd-dpdk until DPDK says it is up.
    `pmd_sleep` > 0: the PMD thread sleeps up to that many µs per loop while its queues bring few
    packets (OVS's load-based sleep) instead of busy-polling its CPU."""
    exe = require_vswitchd()
    prefix = f"offlab-{b.lab.name}-ovs{secrets.token_hex(2)}"
    runtime = runtime_dir(prefix)
    mask = f"{1 << cpu:#x}"
    polls = f"sleeping up to {pmd_sleep} µs when idle" if pmd_sleep else "busy-polling"
    with b.step(f"configure DPDK (--no-huge --legacy-mem, prefix {prefix}, PMD on CPU {cpu}, {polls})"):
        switch.vsctl("--no-wait", "set", "Open_vSwitch", ".", "other_config:dpdk-init=true",
                     f"other_config:dpdk-extra=--no-huge -m {memory_mb} --no-pci --legacy-mem --file-prefix={prefix}",
                     f"other_config:dpdk-lcore-mask={mask}", f"other_config:pmd-cpu-mask={mask}",
                     f"other_config:pmd-maxsleep={pmd_sleep}",
                     # per port: pools sized to each port's queues, not OVS's shared 262144-mbuf pools
                     f"other_config:per-port-memory={str(per_port_memory).lower()}")
    with b.step(f"start private {DAEMON} in {switch.host.netns}"):
        # Recorded before the runtime directory or the process exist: a kill -9 at any point leaves
        # a lab file that names both (pid 0 until the process is there; stop_daemon skips pid 0).
        daemon = Daemon(DAEMON, 0, switch.host.netns, None, runtime_dir=str(runtime))
        b.lab.daemons.append(daemon)
        b.lab.save()
        try:
            runtime.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            daemon.runtime_dir = None  # someone else's: never ours to remove
            b.lab.save()
            raise EnvironmentProblem(f"DPDK runtime directory {runtime} exists and is not this lab's: left alone; "
                                     f"remove it if nothing uses it, or choose another --name") from None
        (runtime / OWNER_FILE).write_text(owner_mark(b.lab.name))
        rd = switch.rundir
        log = rd / f"{DAEMON}.out"
        argv = [exe, switch.db, "--disable-system-route", f"--pidfile={rd}/ovs-vswitchd.pid",
                f"--unixctl={rd}/ovs-vswitchd.ctl", f"--log-file={rd}/ovs-vswitchd.log", "--no-chdir"]
        with open(log, "w") as out:
            proc = switch.host.spawn(argv, env={**os.environ, **netdev.ovs_env(rd)}, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        daemon.pid, daemon.start_time = proc.pid, process_start_time(proc.pid)
        b.lab.save()
        deadline = time.monotonic() + INIT_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise EnvironmentProblem(f"{DAEMON} exited (rc {proc.returncode}) while DPDK initialised: "
                                         f"{last_lines(rd)}")
            with contextlib.suppress(OfflabError):
                if switch.vsctl("--no-wait", "get", "Open_vSwitch", ".", "dpdk_initialized").strip() == "true":
                    return
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"{DAEMON} did not initialise DPDK within {INIT_TIMEOUT:g} s: "
                                         f"{last_lines(rd)}")
            time.sleep(0.2)


def add_dpdk_port(b: Builder, switch: Ovs, port: str, devargs: str, *, mtu: int) -> None:
    """A `type=dpdk` port; n_rxq=2 because OVS asks for PMD threads + 1 tx queues and the tap PMD
    wants as many rx as tx queues (with n_rxq=1 the port fails `Operation not permitted`)."""
    with b.step(f"OVS-DPDK port {port} ({devargs}, mtu_request={mtu})"):
        switch.vsctl("add-port", BRIDGE, port, "--", "set", "Interface", port, "type=dpdk",
                     f"options:dpdk-devargs={devargs}", "options:n_rxq=2", f"mtu_request={mtu}", wait=DPDK_PORT_WAIT)
        b.lab.hosts["switch"].interfaces.append(Interface(port, "ovs-dpdk", role="port"))
        b.lab.save()
        error = port_error(switch.vsctl, port)
        if error:
            raise EnvironmentProblem(f"OVS did not attach {port}: {error}; {last_lines(switch.rundir)}")


def port_error(vsctl, port: str) -> str:
    """The Interface row's `error` column ("" when the port is attached)."""
    out = vsctl("get", "Interface", port, "error").strip()
    return "" if out in ("[]", '""') else out.strip('"')


def last_lines(rundir, n: int = 3) -> str:
    """The last warnings and errors of the lab's ovs-vswitchd log, for a one-line message."""
    try:
        text = (rundir / "ovs-vswitchd.log").read_text(errors="replace")
    except OSError:
        text = ""
    lines = [l.split("|", 4)[-1].strip() for l in text.splitlines() if "|ERR|" in l or "|WARN|" in l or "|EMER|" in l]
    if not lines:
        try:
            lines = [l.strip() for l in (rundir / f"{DAEMON}.out").read_text(errors="replace").splitlines() if l.strip()]
        except OSError:
            lines = []
    return " | ".join(lines[-n:]) or "(its log is empty)"


def describe(lab: LabState) -> dict:
    """What `lab show --json` says about the OVS-DPDK switch: DPDK version, daemon, ports as OVS sees them."""
    vswitchd = next((d for d in lab.daemons if d.name == DAEMON), None)
    out: dict = {"dpdk_version": version(), "rundir": lab.rundir, "pmd_cpu": lab.options.get("cpu"),
                 "pmd_sleep_us": lab.options.get("pmd_sleep", 0),
                 "vswitchd": None if vswitchd is None else {
                     "pid": vswitchd.pid, "running": alive(vswitchd.pid) if vswitchd.pid else False,
                     "runtime_dir": vswitchd.runtime_dir}}
    if not out["vswitchd"] or not out["vswitchd"]["running"]:
        return out
    from offlab.lab.ovs import vsctl_for

    ports = []
    for iface in lab.hosts["switch"].interfaces:
        if iface.kind != "ovs-dpdk":
            continue
        cols = {}
        for col in ("type", "mtu", "mtu_request", "error", "link_state"):
            try:
                cols[col] = vsctl_for(lab, "get", "Interface", iface.name, col).strip().strip('"')
            except OfflabError:
                cols[col] = None
        try:
            status = vsctl_for(lab, "get", "Interface", iface.name, "status").strip()
        except OfflabError:
            status = ""
        for key in ("driver_name", "max_rx_pktlen"):
            mark = f"{key}="
            if mark in status:
                cols[key] = status.split(mark, 1)[1].split(",", 1)[0].strip('"} ')
        ports.append({"name": iface.name, **cols})
    out["ports"] = ports
    return out
