"""Guest topologies: a QEMU guest is a lab host like a namespace.

QEMU runs inside a lab namespace and creates its taps there; it is recorded as a lab daemon
(pid + start time) the moment it exists, before the boot is waited for, so `lab down` stops it
even after offlab was killed with -9 (and removing the namespace kills what is left in it).
A tap may then move to another lab namespace (vm-router's two ends): it stays QEMU's, and it
vanishes with QEMU or with that namespace, never returning to the machine's own.

Topology options (`lab.options`, from a plan's `topology:`): `nic` — virtio-net-pci properties
for every NIC of every guest, plus `queues`; `guest_cpus` — vCPUs per guest; `kernel_version` — the
guest kernel (offlab.vm.kernels), one for every guest or per guest role ({"client": "6.1", "server": "7.2"});
`qemu` — the QEMU that runs the guest (offlab.vm.qemus: "7.2", "10.0", installed), likewise.
"""

from __future__ import annotations

from pathlib import Path

from offlab import netdev
from offlab.addresses import (BEHIND4, BEHIND6, CLIENT4, CLIENT6, ROUTER_C4, ROUTER_C6, ROUTER_S4, ROUTER_S6,
                              SERVER4, SERVER6, address)
from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts import Host
from offlab.lab.build import Builder, LabBuildFailed
from offlab.lab.model import Adjustment, Daemon, HostEntry, Interface
from offlab.names import link_name, netns_name
from offlab.state import ensure_dir, state_dir

QEMU_DAEMON = "qemu-system-x86_64"  # /proc/PID/comm shows its first 15 characters
MAX_GUEST_CPUS = 8
FORWARD_WHY = "the guest routes between its two virtio-net NICs (seed 002's VM-as-router)"


def vm(b: Builder, mtu: int) -> None:
    """[client: guest eth0] ─ virtio-net ─ tap ─ [server: br0]   (seed 000: guest → tap0 → virbr0 → server)

    The server namespace plays the hypervisor host: the bridge (virbr0's role) holds the tap and
    the server's address, so traffic between client and server crosses virtio-net and the tap.
    """
    b.host("server")
    br = b.bridge("server", "br0", [], mtu=mtu)
    b.address("server", br, SERVER4, SERVER6, reach=True)
    tap = link_name(b.lab.name, 0)
    guest = boot_guest(b, "client", "server", [tap], peers=["server"])
    tap_onto_bridge(b, tap, "server", "server", peer="client", mtu=mtu)
    guest_address(b, "client", guest, "eth0", CLIENT4, CLIENT6, mtu=mtu, reach=True)


def vm_router(b: Builder, mtu: int) -> None:
    """[client: br0 ─ tap] ─ virtio-net ─ [router (guest): eth0 · ip_forward · eth1] ─ virtio-net ─ [tap ─ br0: server]

    Seed 002's router: a guest forwarding between two virtio-net NICs. Each end namespace plays
    a hypervisor host whose bridge holds a tap and the host's address; QEMU runs in the router
    namespace and its two taps move to the ends.
    """
    for role in ("client", "router", "server"):
        b.host(role)
    taps = [link_name(b.lab.name, 0), link_name(b.lab.name, 1)]
    guest = boot_guest(b, "router", "router", taps, peers=["client", "server"])
    for role, tap, cidr4, cidr6 in (("client", taps[0], CLIENT4, CLIENT6), ("server", taps[1], BEHIND4, BEHIND6)):
        b.bridge(role, "br0", [], mtu=mtu)
        tap_onto_bridge(b, tap, "router", role, peer="router", mtu=mtu)
        b.address(role, "br0", cidr4, cidr6, reach=True)
    guest_address(b, "router", guest, "eth0", ROUTER_C4, ROUTER_C6, mtu=mtu, reach=False)
    guest_address(b, "router", guest, "eth1", ROUTER_S4, ROUTER_S6, mtu=mtu, reach=False)
    guest_sysctl(b, "router", guest, "net.ipv4.ip_forward", "1", FORWARD_WHY)
    if b.lab.ipv6:
        guest_sysctl(b, "router", guest, "net.ipv6.conf.all.forwarding", "1", FORWARD_WHY)
    b.default_route("client", address(ROUTER_C4), address(ROUTER_C6))
    b.default_route("server", address(ROUTER_S4), address(ROUTER_S6))


def vm_pair(b: Builder, mtu: int) -> None:
    """[client (guest): eth0] ─ virtio-net ─ tap ─ [switch: br0] ─ tap ─ virtio-net ─ [server (guest): eth0]

    The classic guest-to-guest test: two guests on one Linux bridge of one hypervisor host (the
    switch namespace, where both QEMUs run); traffic never leaves the bridge.
    """
    b.host("switch")
    b.bridge("switch", "br0", [], mtu=mtu)
    for i, (role, cidr4, cidr6) in enumerate((("client", CLIENT4, CLIENT6), ("server", SERVER4, SERVER6))):
        tap = link_name(b.lab.name, i)
        guest = boot_guest(b, role, "switch", [tap], peers=["switch"])
        tap_onto_bridge(b, tap, "switch", "switch", peer=role, mtu=mtu)
        guest_address(b, role, guest, "eth0", cidr4, cidr6, mtu=mtu, reach=True)


# ---- parts ---------------------------------------------------------------------------------
def guest_roles(topology: str) -> list[str]:
    """The roles that are QEMU guests in a topology (those with a virtio-net NIC)."""
    from offlab.catalog import TOPOLOGIES

    return [role for role, ifaces in TOPOLOGIES[topology].hosts.items() if any(i.kind == "virtio-net" for i in ifaces)]


def kernel_for(value: str | dict | None, role: str) -> str | None:
    """A per-guest option (kernel_version, qemu) for one guest: the one value, or its role's entry
    (None: the default)."""
    return value.get(role) if isinstance(value, dict) else value


def _per_guest(value: object, topology: str, what: str) -> dict[str, object]:
    """`value` as {role or "": spec}: one spec for every guest, or one per guest role of `topology`;
    BadInput (naming `what`) for a topology without guests or a role it does not have."""
    roles = guest_roles(topology) if topology in _guest_topologies() else []
    if not roles:
        raise BadInput(f"{what} is for topologies with guests ({', '.join(_guest_topologies())}), not {topology}")
    specs = value if isinstance(value, dict) else {"": value}
    for role in specs:
        if role and role not in roles:
            raise BadInput(f"{what} {role}: {topology}'s guests are {', '.join(roles)}")
    return specs


def _field(what: str, role: str) -> str:
    return f"{what} {role}" if role else what


def check_qemu(value: object, topology: str, what: str = "qemu", *, resolve: bool = True) -> None:
    """BadInput (naming `what`) unless `value` is a QEMU for every guest or per guest role of `topology`.
    `resolve`: fetch and unpack it now if it is not cached (lab up); else only check it against
    the archive's lists offlab already has (a plan is checked without the network)."""
    from offlab.vm import qemus

    specs = _per_guest(value, topology, what)
    for role, spec in specs.items():
        qemus.check_known(spec, _field(what, role))  # every spec first: nothing is fetched for a plan with a bad one
    if resolve:
        for spec in specs.values():
            qemus.resolve(spec, what)


def check_kernel_version(value: str | dict, topology: str, what: str = "kernel_version", *,
                         resolve: bool = True) -> None:
    """BadInput (naming `what`) unless `value` is a kernel for every guest or per guest role of `topology`.
    `resolve`: look each release up in the archive's index (fetching the lists once); else only where
    offlab already has them (a plan is checked without the network)."""
    from offlab.vm import kernels

    for role, spec in _per_guest(value, topology, what).items():
        if not isinstance(spec, str):
            raise BadInput(f"{_field(what, role)} {spec!r}: write the kernel as a string, e.g. \"6.12\"")
        if resolve:
            kernels.resolve(spec, _field(what, role))
        else:
            kernels.check_known(spec, _field(what, role))


def _guest_topologies() -> tuple[str, ...]:
    from offlab.catalog import GUEST_TOPOLOGIES

    return GUEST_TOPOLOGIES


def guest_cpus(options: dict) -> int:
    cpus = options.get("guest_cpus", 1)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or not 1 <= cpus <= MAX_GUEST_CPUS:
        raise BadInput(f"guest_cpus {cpus!r}: a whole number of vCPUs from 1 to {MAX_GUEST_CPUS}")
    return cpus


def boot_guest(b: Builder, role: str, where: str, taps: list[str], *, peers: list[str],
               timeout: float = 120.0, vhost_user: list[str] = (), rundir: Path | None = None) -> Host:
    """Boot the guest `role` with one virtio-net NIC per tap (QEMU creates them in `where`), or,
    given `vhost_user` sockets instead, one vhost-user NIC per socket (its server must exist).

    NIC i is the guest's eth<i> (q35 gives the devices PCI slots in command-line order; checked
    by MAC once it is up) and faces `peers[i]`. `rundir`: where its files go (default vm/<lab>).
    The guest is restored from a saved one when there is a usable one (offlab.vm.saved: tap NICs
    only), else booted cold and saved; the lab's guest entry says which (`start`) and why.
    """
    from offlab.vm import image as vm_image
    from offlab.vm import qemu, qemus, saved

    opts = b.lab.options
    with b.step(f"QEMU for {role}"):
        q = qemus.resolve(kernel_for(opts.get("qemu"), role))
    if vhost_user:
        nics = [qemu.VhostUserNic.from_options(sock, qemu.mac_for(b.lab.name, role, Path(sock).name),
                                               opts.get("nic", {}), q) for sock in vhost_user]
    else:
        nics = [qemu.Nic.from_options(tap, qemu.mac_for(b.lab.name, role, tap), opts.get("nic", {}), q)
                for tap in taps]
    cpus = guest_cpus(opts)
    with b.step(f"guest image for {role}"):
        image = vm_image.build(kernel_for(opts.get("kernel_version"), role))
    if rundir is None:
        rundir = ensure_dir(state_dir() / "vm" / b.lab.name)
    b.lab.rundir = str(rundir)
    b.lab.save()
    ns = netns_name(b.lab.name, where)

    recorded: list[Daemon] = []

    def record(pid: int, start_time: int) -> None:
        # A warm start that failed was stopped by pid before the cold boot starts: only the QEMU
        # that runs the guest stays listed (else the lab would read as broken, its daemon dead).
        for gone in recorded:
            b.lab.daemons.remove(gone)
        recorded[:] = [Daemon(QEMU_DAEMON, pid, ns, start_time)]
        b.lab.daemons.append(recorded[0])
        b.lab.save()

    def check_nics(cold: qemu.Guest) -> None:  # before a cold-booted guest is saved
        with b.step(f"guest {role}'s NICs by MAC"):
            _check_nic_order(cold.host(), nics)

    with b.step(f"start guest {role} (QEMU in {ns})"):
        guest, how = saved.start(image, b.lab.host(where), rundir, name=role, nics=nics, smp=cpus,
                                 timeout=timeout, lab=b.lab.name, role=role, on_started=record,
                                 after_cold=check_nics, q=q)
    described = [{"iface": f"eth{i}", **_backend(n), "mac": n.mac, "queues": n.queues, "properties": n.properties,
                  "device_id": qemu.device_id(i)} for i, n in enumerate(nics)]
    b.lab.hosts[role] = HostEntry(
        netns=ns,
        interfaces=[Interface(f"eth{i}", "virtio-net", peer_host=peer) for i, peer in enumerate(peers)],
        guest={"ref": guest.host().ref(), "accel": guest.accel, "qemu_version": guest.qemu_version,
               "qemu_package_version": q.package_version, "qemu_suite": q.suite, "qemu_binary": q.binary,
               "kernel_release": guest.kernel_release, "kernel_package": image.kernel_package,
               "kernel_package_version": image.kernel_package_version, "kernel_suite": image.kernel_suite or "machine's apt",
               "kernel_entry": "pvh" if image.pvh else "classic", **({"kernel_entry_why": image.pvh_why} if not image.pvh else {}),
               "vhost": False, "cpus": cpus, "memory_mb": 512,
               **_backend(nics[0]), "nic_properties": nics[0].properties, "nics": described,
               "ready_seconds": guest.ready_seconds, "qmp": guest.qmp, "start": how.how,
               # under TCG: the TSC rate the kernel was told, and a cold boot's clock against this machine's
               "tsc_early_khz": guest.tsc_khz, "clock_rate": guest.clock_rate,
               "start_why": how.why, "machine": qemu.MACHINE, "device": "virtio-net-pci"},
    )
    b.lab.save()
    return guest.host()


def _backend(nic) -> dict:
    """A tap NIC's tap, or a vhost-user NIC's socket (`vhost` above is vhost-net, absent here)."""
    return {"tap": nic.tap} if hasattr(nic, "tap") else {"vhost_user": nic.socket}


def _check_nic_order(host: Host, nics: list) -> None:

    by_mac = {l.address: l.ifname for l in netdev.link_rows(host, timeout=30)}
    for i, nic in enumerate(nics):
        if by_mac.get(nic.mac) != f"eth{i}":
            raise LabBuildFailed(f"the guest's NIC on {next(iter(_backend(nic).values()))} (MAC {nic.mac}) is "
                                 f"{by_mac.get(nic.mac, 'missing')}, not eth{i}")


def tap_onto_bridge(b: Builder, tap: str, made_in: str, role: str, *, peer: str, mtu: int) -> None:
    """Move QEMU's tap from `made_in` to `role` (if they differ), onto its br0, up at `mtu`."""
    with b.step(f"tap {tap} on br0 in {role}"):
        if made_in != role:
            b.ip(made_in, "link", "set", tap, "netns", b.lab.hosts[role].netns)
        b.ip(role, "link", "set", tap, "mtu", str(mtu))
        b.ip(role, "link", "set", tap, "master", "br0")
        b.ip(role, "link", "set", tap, "up")
        b.lab.hosts[role].interfaces.append(Interface(tap, "tap", peer_host=peer, role="port"))
        b.lab.save()


def guest_address(b: Builder, role: str, guest: Host, iface: str, cidr4: str, cidr6: str, *,
                  mtu: int, reach: bool) -> None:
    """A guest NIC up at `mtu` with its addresses; `reach` marks them as the way others reach it."""
    with b.step(f"guest {role} {iface} up with {cidr4}"):
        guest.run(["ip", "link", "set", iface, "mtu", str(mtu), "up"])
        guest.run(["ip", "addr", "add", cidr4, "dev", iface])
        entry = b.lab.hosts[role]
        if reach:
            entry.address = cidr4.split("/")[0]
        if b.lab.ipv6:
            guest.run(["ip", "addr", "add", cidr6, "dev", iface, "nodad"])
            if reach:
                entry.address6 = cidr6.split("/")[0]
        b.lab.save()


def guest_sysctl(b: Builder, role: str, guest: Host, key: str, value: str, why: str) -> None:
    """A sysctl the topology needs in a guest, recorded (with why) in the lab file before it is set.

    It needs no restore: the guest's kernel, and the setting with it, ends with the lab.
    """
    with b.step(f"sysctl {key}={value} in guest {role}"):
        b.lab.adjustments.append(Adjustment(role, "", key, value, why))
        b.lab.save()
        guest.run(["sysctl", "-q", "-w", f"{key}={value}"])
        got = guest.read(f"/proc/sys/{key.replace('.', '/')}").strip()
        if got != value:
            raise LabBuildFailed(f"{key} reads {got} in guest {role} after setting {value}")


def check_guest_options(options: dict, topology: str | None = None) -> None:
    """BadInput (exit 2) for a guest option that is wrong, before anything is built: the NIC
    properties against each guest's QEMU (fetched first if another version is asked for)."""
    from offlab.vm import qemu, qemus

    nic = options.get("nic", {})
    if not isinstance(nic, dict):
        raise BadInput(f"nic {nic!r}: a mapping of virtio-net-pci properties, e.g. {{rx_queue_size: 1024}}")
    value = options.get("qemu")
    if value is not None and topology is not None:
        check_qemu(value, topology)
    specs = set(value.values()) if isinstance(value, dict) else {value}
    for spec in specs:
        qemu.Nic.from_options("tap0", "52:54:00:00:00:00", nic, qemus.resolve(spec) if spec is not None else None)
    guest_cpus(options)
    if value is not None and topology is not None:
        for role in guest_roles(topology):
            check_boots(qemus.resolve(kernel_for(value, role)), kernel_for(options.get("kernel_version"), role))


def check_boots(q, kernel_version: str | None) -> None:
    """EnvironmentProblem (exit 3, one line, before anything is built) for a QEMU and guest kernel
    seen not to boot together here (offlab.vm.qemus.UNBOOTABLE)."""
    from offlab.vm import image as vm_image
    from offlab.vm import qemus

    if any(series == q.series for series, _ in qemus.UNBOOTABLE):  # else no need to look the kernel up
        if why := qemus.cannot_boot(q, vm_image.resolve_kernel(kernel_version).abi):
            raise EnvironmentProblem(why)

