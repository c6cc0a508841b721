"""Guest topologies: a QEMU guest is a lab host like a namespace.

QEMU runs inside a lab namespace and creates its tap there; it is recorded as a lab daemon
(pid + start time) the moment it exists, before the boot is waited for, so `lab down` stops it
even after offlab was killed with -9 (and removing the namespace kills what is left in it).
"""

from __future__ import annotations

from offlab.lab.build import Builder
from offlab.lab.model import Daemon, HostEntry, Interface
from offlab.names import link_name, netns_name
from offlab.state import ensure_dir, state_dir

CLIENT4, SERVER4 = "10.200.1.1/24", "10.200.1.2/24"
CLIENT6, SERVER6 = "fd00:200:0:1::1/64", "fd00:200:0:1::2/64"
QEMU_DAEMON = "qemu-system-x86_64"  # /proc/PID/comm shows its first 15 characters


def vm(b: Builder, mtu: int) -> None:
    """[client: guest eth0] ─ virtio-net ─ tap ─ [server: br0]   (seed 000: guest → tap0 → virbr0 → server)

    The server namespace plays the hypervisor host: the bridge (virbr0's role) holds the tap and
    the server's address, so traffic between client and server crosses virtio-net and the tap.
    """
    opts = b.lab.options
    b.host("server")
    br = b.bridge("server", "br0", [], mtu=mtu)
    b.address("server", br, SERVER4, SERVER6, reach=True)
    tap = link_name(b.lab.name, 0)
    guest = boot_guest(b, "client", "server", tap, properties=opts.get("nic", {}),
                       kernel_version=opts.get("kernel_version"))
    with b.step(f"tap {tap} on br0 in server"):
        b.ip("server", "link", "set", tap, "mtu", str(mtu))
        b.ip("server", "link", "set", tap, "master", br)
        b.ip("server", "link", "set", tap, "up")
        b.lab.hosts["server"].interfaces.append(Interface(tap, "tap", peer_host="client", role="port"))
        b.lab.save()
    with b.step("guest eth0 up with its address"):
        guest.run(["ip", "link", "set", "eth0", "mtu", str(mtu), "up"])
        guest.run(["ip", "addr", "add", CLIENT4, "dev", "eth0"])
        entry = b.lab.hosts["client"]
        entry.address = CLIENT4.split("/")[0]
        if b.lab.ipv6:
            guest.run(["ip", "addr", "add", CLIENT6, "dev", "eth0", "nodad"])
            entry.address6 = CLIENT6.split("/")[0]
        b.lab.save()


def boot_guest(b: Builder, role: str, where: str, tap: str, *, properties: dict,
               kernel_version: str | None = None, timeout: float = 120.0):
    """Boot a guest for `role` with one virtio-net NIC on `tap` (created by QEMU in `where`)."""
    from offlab.vm import image as vm_image
    from offlab.vm import qemu

    with b.step(f"guest image for {role}"):
        image = vm_image.build(kernel_version)
    rundir = ensure_dir(state_dir() / "vm" / b.lab.name)
    b.lab.rundir = str(rundir)
    b.lab.save()
    ns = netns_name(b.lab.name, where)
    nic = qemu.Nic(tap, qemu.mac_for(b.lab.name, role, tap), qemu.check_nic_properties(properties))

    def record(pid: int, start_time: int) -> None:
        b.lab.daemons.append(Daemon(QEMU_DAEMON, pid, ns, start_time))
        b.lab.save()

    with b.step(f"boot guest {role} (QEMU in {ns})"):
        guest = qemu.boot(image, b.lab.host(where), rundir, name=role, nics=[nic], timeout=timeout,
                          lab=b.lab.name, role=role, on_started=record)
    b.lab.hosts[role] = HostEntry(
        netns=ns,
        interfaces=[Interface("eth0", "virtio-net", peer_host=where)],
        guest={"ref": guest.host().ref(), "accel": guest.accel, "qemu_version": guest.qemu_version,
               "kernel_release": guest.kernel_release, "vhost": False, "tap": tap,
               "nic_properties": nic.properties, "ready_seconds": guest.ready_seconds},
    )
    b.lab.save()
    return guest.host()
