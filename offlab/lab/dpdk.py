"""The `dpdk` topology: dpdk-testpmd forwarding between two namespaces (seed 001's forwarding hop).

testpmd is a lab daemon: recorded (pid, start time, runtime directory) the moment it exists, so
`lab down` stops it and removes /var/run/dpdk/<prefix> even after offlab was killed with -9.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

from offlab.addresses import CLIENT4, CLIENT6, SERVER4, SERVER6
from offlab.dpdk import Port, Testpmd
from offlab.dpdk.ports import PMD_MAX_FRAME, PMD_MAX_MTU
from offlab.dpdk.testpmd import DAEMON, IDLE_MODES, rundir_for
from offlab.errors import BadInput
from offlab.lab.build import Builder, LabBuildFailed
from offlab.lab.model import Daemon, Interface, LabState
from offlab.names import link_name, netns_name
from offlab.state import ensure_dir

PMDS = ("tap", "af_packet")
# The largest MTU the tap and af_packet PMDs take (their frames: offlab/dpdk/ports.py).
MAX_MTU = PMD_MAX_MTU
AF_PACKET_CSUM_WHY = ("the af_packet PMD hands testpmd partial-checksum frames and io forwarding passes them "
                      "on unchanged, so TCP is black-holed unless the senders checksum in software")


def check_vm_options(name: str, mtu: int, options: dict) -> None:
    """`lab up dpdk-vm`'s options, before anything is built."""
    if "pmd" in options:
        raise BadInput("--pmd is an option of the dpdk topology; dpdk-vm's ports are a tap and a vhost-user port")
    if mtu != MAX_MTU:
        raise BadInput(f"--mtu {mtu}: the dpdk-vm lab's tap port takes at most {MAX_MTU} (DPDK 22.11 net_tap "
                       f"frames ≤ {PMD_MAX_FRAME['net_tap']} B), and so does the path through it")
    check_cpu(options.get("cpu"))
    check_idle(options.get("testpmd_idle"))


def check_options(name: str, mtu: int, options: dict) -> None:
    """`lab up dpdk`'s options, before anything is built."""
    pmd = options.get("pmd", "tap")
    if pmd not in PMDS:
        raise BadInput(f"--pmd {pmd!r}: choose tap or af_packet")
    if mtu != MAX_MTU:
        raise BadInput(f"--mtu {mtu}: the dpdk lab's ports take at most {MAX_MTU} (DPDK 22.11 net_tap frames "
                       f"≤ {PMD_MAX_FRAME['net_tap']} B, net_af_packet ≤ {PMD_MAX_FRAME['net_af_packet']} B); jumbo frames need vhost-user ports at both ends "
                       f"(dpdk-vm has a tap port too)")
    check_cpu(options.get("cpu"))
    check_idle(options.get("testpmd_idle"))


def check_idle(idle: object) -> None:
    """--testpmd-idle: what testpmd does while no offlab measurement uses the lab."""
    if idle is not None and idle not in IDLE_MODES:
        raise BadInput(f"--testpmd-idle {idle!r}: poll (forward, and busy-poll its CPU, from lab up to lab down) or "
                       f"stop (forward only while offlab measures through it)")


def forwarding(lab: LabState) -> contextlib.AbstractContextManager:
    """The lab's switch forwards for the block: a testpmd that rests while idle (`--testpmd-idle stop`)
    forwards while an offlab command sends through it (a sample, `mtu probe --lab`, `lab exec`); every
    other lab's switch forwards all the time and this is a no-op."""
    tp = Testpmd.for_lab(lab.name) if lab.has_testpmd else None
    return tp.forwarding() if tp is not None else contextlib.nullcontext()


def check_cpu(cpu: object, whose: str = "") -> None:
    """--testpmd-cpu: a CPU this machine has (`whose`: e.g. "the OVS PMD thread's CPU; ")."""
    ncpu = os.cpu_count() or 1
    if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int) or not 0 <= cpu < ncpu):
        raise BadInput(f"--testpmd-cpu {cpu!r}: {whose}this machine has CPUs 0..{ncpu - 1}")


def attach_ports(b: Builder, pmd: str, ends: list[tuple[str, str, str, str]],
                 send_taps_home: Callable[[], None] | None = None) -> None:
    """The kernel end of each DPDK port, as (host, interface, IPv4, IPv6), made a working interface of
    its host: a tap (the tap PMD makes it in the switch namespace) moved home and up — by
    `send_taps_home` when the DPDK process does it itself (testpmd) —, an af_packet veth end with tx
    checksumming off; then each addressed, as the address the other hosts reach it by."""
    if pmd == "tap":
        with b.step("tap ports " + ", ".join(f"{iface} → {role}" for role, iface, _, _ in ends)):
            if send_taps_home is not None:
                send_taps_home()
            for role, iface, _, _ in ends:
                if send_taps_home is None:
                    b.ip("switch", "link", "set", iface, "netns", b.lab.hosts[role].netns)
                    b.ip(role, "link", "set", iface, "up")
                b.lab.hosts[role].interfaces.append(Interface(iface, "tap", peer_host="switch"))
            b.lab.save()
    else:
        for role, iface, _, _ in ends:
            b.ethtool_off(role, iface, "tx-checksumming", AF_PACKET_CSUM_WHY)
    for role, iface, cidr4, cidr6 in ends:
        b.address(role, iface, cidr4, cidr6, reach=True)


def default_cpu() -> int:
    """The last CPU: traffic pins the client to CPU 0 (and the server to 1), so on 2 CPUs testpmd
    shares the server's; nothing on this machine can give it a CPU of its own."""
    return (os.cpu_count() or 1) - 1


def dpdk(b: Builder, mtu: int) -> None:
    """client ─ tap ─ [switch: dpdk-testpmd] ─ tap ─ server        (--pmd tap, the default)
    client ─ veth ─ [switch: testpmd on af_packet] ─ veth ─ server  (--pmd af_packet: no GRO/GSO)

    The tap PMD creates its kernel taps in the switch namespace; they are moved to the client and
    server and addressed there, and go back whenever testpmd reconfigures its ports.
    """
    opts = b.lab.options
    check_options(b.lab.name, mtu, opts)
    pmd = opts.setdefault("pmd", "tap")
    cpu = opts.setdefault("cpu", default_cpu())
    b.host("client"), b.host("switch"), b.host("server")
    ns = {role: netns_name(b.lab.name, role) for role in ("client", "switch", "server")}
    if pmd == "af_packet":
        c, sw_c = b.wire("client", "switch", mtu=mtu)
        sw_s, s = b.wire("switch", "server", mtu=mtu)
        ports = [Port(0, f"net_af_packet0,iface={sw_c}", pmd, sw_c), Port(1, f"net_af_packet1,iface={sw_s}", pmd, sw_s)]
    else:
        c, s = link_name(b.lab.name, 0), link_name(b.lab.name, 1)
        ports = [Port(0, f"net_tap0,iface={c}", pmd, c, home=ns["client"]),
                 Port(1, f"net_tap1,iface={s}", pmd, s, home=ns["server"])]
    tp = _start_testpmd(b, ns["switch"], ensure_dir(rundir_for(b.lab.name)), ports, cpu, f"{pmd} ports")
    attach_ports(b, pmd, [("client", c, CLIENT4, CLIENT6), ("server", s, SERVER4, SERVER6)],
                 send_taps_home=tp.send_taps_home)
    with b.step("testpmd: peers for mac/csum forwarding, start forwarding"):
        # mac and csum forwarding rewrite the destination MAC to the port's peer: the far end's interface
        for port, (role, iface) in zip(ports, (("client", c), ("server", s)), strict=True):
            mac = b.lab.host(role).read(f"/sys/class/net/{iface}/address").strip()
            tp.checked(f"set eth-peer {port.index} {mac}")
        tp.checked("start")


VHOST_SOCKET = "vhost0.sock"
VHOST_LINK_TIMEOUT = 15.0


def dpdk_vm(b: Builder, mtu: int) -> None:
    """client ─ tap ─ [switch: dpdk-testpmd, port 0 net_tap · port 1 net_vhost] ─ vhost-user ─ [server (guest): eth0]

    Seed 001's forwarding path: testpmd between a port and a VM. testpmd is the vhost-user server
    (`--vdev net_vhost1,iface=SOCK,tso=1`), QEMU (in the switch namespace) the client, with shared
    memfd guest RAM; the guest's virtio-net properties (host_tso4, guest_tso4, csum, ...) are the
    `nic` option (`--nic PROP=VALUE`), boot-time like the vm labs'. Port 0's tap is moved to the client.
    """
    from offlab.lab.vm import boot_guest, guest_address

    opts = b.lab.options
    check_vm_options(b.lab.name, mtu, opts)
    cpu = opts.setdefault("cpu", default_cpu())
    b.host("client"), b.host("switch")
    ns = {role: netns_name(b.lab.name, role) for role in ("client", "switch")}
    c = link_name(b.lab.name, 0)
    rundir = ensure_dir(rundir_for(b.lab.name))
    sock = str(rundir / VHOST_SOCKET)
    # tso=1: the port offers HOST_TSO4/6, so a guest with host_tso4=on may hand it super-packets (DPDK GSO's input)
    ports = [Port(0, f"net_tap0,iface={c}", "tap", c, home=ns["client"]),
             Port(1, f"net_vhost1,iface={sock},queues=1,tso=1", "vhost", None)]
    tp = _start_testpmd(b, ns["switch"], rundir, ports, cpu, f"tap port, vhost-user server {sock}")
    attach_ports(b, "tap", [("client", c, CLIENT4, CLIENT6)], send_taps_home=tp.send_taps_home)
    guest = boot_guest(b, "server", "switch", [], peers=["switch"], vhost_user=[sock], rundir=rundir)
    with b.step("testpmd: the guest is connected (port 1 link up)"):
        deadline = time.monotonic() + VHOST_LINK_TIMEOUT
        while (link := tp.port_info(1).get("link")) != "up":
            if time.monotonic() > deadline:
                raise LabBuildFailed(f"testpmd's vhost-user port shows link {link} {VHOST_LINK_TIMEOUT:g} s after "
                                     f"the guest booted: {tp.last_lines()}")
            time.sleep(0.5)
    guest_address(b, "server", guest, "eth0", SERVER4, SERVER6, mtu=mtu, reach=True)
    with b.step("testpmd: peers for mac/csum forwarding, start forwarding"):
        client_mac = b.lab.host("client").read(f"/sys/class/net/{c}/address").strip()
        tp.checked(f"set eth-peer 0 {client_mac}")
        tp.checked(f"set eth-peer 1 {b.lab.hosts['server'].guest['nics'][0]['mac']}")
        tp.checked("start")


def _start_testpmd(b: Builder, netns: str, rundir, ports: list, cpu: int, what: str) -> Testpmd:
    """testpmd in `netns`, recorded as a lab daemon the moment it exists (before offlab waits for it)."""
    b.lab.rundir = str(rundir)
    b.lab.save()

    def record(pid: int, start_time: int, runtime: str) -> None:
        b.lab.daemons.append(Daemon(DAEMON, pid, netns, start_time, runtime_dir=runtime))
        b.lab.save()

    with b.step(f"start dpdk-testpmd ({what}) in {netns} on CPU {cpu}"):
        return Testpmd.start(netns, rundir, lab=b.lab.name, ports=ports, cpu=cpu, on_started=record,
                             idle=b.lab.options.get("testpmd_idle", "poll"))
