"""A stand-in SSH host with a kernel of its own: a QEMU guest (offlab's guest image) running sshd.

The stand-ins of tests/sshd.py are namespaces of this machine: they share its kernel, so what an SSH
host's own kernel does (its hist triggers, for one) cannot be seen through them. This one is a guest
of offlab's image and kernel (offlab.vm) with OpenSSH's sshd, the one this machine's tests already
run, and the libraries it links, added as a second cpio archive after the image's initramfs (the
kernel unpacks both, the later over the earlier: /etc/passwd gains the sshd user, root's login shell
/bin/sh, which in the image is dash (as its agent uses), not busybox's sh, which would prefer its own `ip` to iproute2's).

`start_pair` makes a pair as tests/sshd.py's `SshdPair`: `a` a namespace with its own sshd, `b` the
guest. QEMU runs in the controller namespace `c`; the guest's first NIC is its management link (a
tap in `c`), its second is its test interface, renamed `t1` in the guest, whose tap is moved into
`a` and named `t1` there: a:t1 ─ b:t1 is the test link, as a cable between two machines' ports.

    c:gm0 10.200.S.1 ─ b:mgmt 10.200.S.2 (ssh to the guest)    c:mgta 10.200.S+1.1 ─ a:mgmt 10.200.S+1.2
    a:t1 10.200.S+2.1 ─ b:t1 10.200.S+2.2 (test traffic)

Two vCPUs: its sshd and the commands offlab runs there keep one while its softirq drops a flood on the
other (with one, a start of iperf3 over SSH outlasted offlab's 15 s at a load of 32). One guest per module; `stop_pair` powers the guest off by pid and leaves no namespace, tap or sshd.

The overlay holds no key: each pair's keys are written into the booted guest through its agent, so the
initramfs is the same bytes for every pair (kept in offlab's cache, named by what went into it) and the
guest starts as offlab's labs do (offlab.vm.saved, in a directory of its own): the first pair boots it
cold and saves it, later ones restore it in a fraction of a TCG boot's CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from offlab.hosts import LOCAL, NetnsHost, netns_exists
from offlab.hosts.guest import GuestHost
from offlab.vm import image as images
from offlab.vm import qemu, saved
from tests import sshd as sshd_mod

SSHD = sshd_mod.SSHD
PORT = 22
GUEST_CONF = "/etc/offlab-test-ssh"
# The image's users and the sshd privilege-separation user.
PASSWD = ("root:x:0:0:root:/root:/bin/sh\ntcpdump:x:104:104:tcpdump:/nonexistent:/bin/false\n"
          "sshd:x:105:65534::/run/sshd:/bin/false\n")
GROUP = "root:x:0:\ntcpdump:x:104:\nnogroup:x:65534:\n"


@dataclass
class GuestPair:
    """`a` (a namespace machine) and `b` (the guest), reached from controller namespace `controller`."""

    dir: Path
    controller: str
    a: sshd_mod.Machine
    b_ssh_ip: str
    subnet: int
    guest: qemu.Guest | None = None
    port: int = PORT

    @property
    def machines(self) -> dict[str, sshd_mod.Machine]:
        return {"a": self.a}  # what stop_machines stops: the guest is stopped apart

    def test_ip(self, side: str) -> str:
        return f"10.200.{self.subnet + 2}.{1 if side == 'a' else 2}"

    def remote_dir(self, side: str) -> str:
        # a shares this machine's filesystem; the guest has its own (offlab's default place)
        return str(self.dir / "remote-a") if side == "a" else "/run/offlab-remote"

    def guest_host(self) -> GuestHost:
        """The guest through offlab's agent: read its kernel's state apart from the SSH path under test."""
        assert self.guest is not None
        return self.guest.host()

    def inventory(self) -> dict:
        """An offlab inventory of both machines, their test links paired a:t1,b:t1."""
        common = {"user": "root", "identity_file": str(self.dir / "userkey"), "ssh_config": "/dev/null",
                  "ssh_args": ["-o", f"UserKnownHostsFile={self.dir / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes"],
                  "via_netns": self.controller, "connect_timeout": 10}
        hosts = {side: {**common, "ssh": ip, "port": port, "remote_dir": self.remote_dir(side),
                        "interfaces": [{"name": "t1", "addresses": [f"{self.test_ip(side)}/24"]}]}
                 for side, ip, port in (("a", self.a.ssh_ip, sshd_mod.PORT), ("b", self.b_ssh_ip, self.port))}
        return {"hosts": hosts, "pairs": ["a:t1,b:t1"]}


SSHD_CONFIG = "\n".join([
    f"Port {PORT}", f"HostKey {GUEST_CONF}/hostkey", f"AuthorizedKeysFile {GUEST_CONF}/authorized_keys",
    "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "PermitUserRC no",
    "ClientAliveInterval 5", "ClientAliveCountMax 3"]) + "\n"


def _overlay(rootfs: Path, files: list[str]) -> None:
    """sshd, its libraries, its config, and the files above, in the guest's layout (no key: see start_pair)."""
    for path in files:
        dst = rootfs / path.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), dst)
    conf = rootfs / GUEST_CONF.lstrip("/")
    conf.mkdir(parents=True, mode=0o700)
    (conf / "sshd_config").write_text(SSHD_CONFIG)
    (rootfs / "etc/passwd").write_text(PASSWD)
    (rootfs / "etc/group").write_text(GROUP)


def _initrd(image: images.Image, d: Path) -> images.Image:
    """The image with a copy of its initramfs that has the overlay's archive after it, in offlab's cache
    under a name made from what went into it (the image's initramfs, sshd and its libraries as they
    are on this machine, the files above): a saved guest keys on that path (offlab.vm.saved)."""
    files = [SSHD, *images._libraries(SSHD)]
    inputs = hashlib.sha256(json.dumps([image.initrd, SSHD_CONFIG, PASSWD, GROUP] + [
        [p, hashlib.sha256(Path(os.path.realpath(p)).read_bytes()).hexdigest()] for p in files]).encode())
    joined = images.cache_root() / "test-ssh" / f"initrd-{inputs.hexdigest()[:16]}.img"
    if joined.exists():
        return dataclasses.replace(image, initrd=str(joined))
    rootfs = d / "overlay"
    _overlay(rootfs, files)
    extra = d / "overlay.cpio"
    LOCAL.run(["sh", "-c", 'cd "$1" && find . | "$2" cpio -o -H newc >"$3"', "sh", str(rootfs),
               images._busybox(), str(extra)], timeout=120)
    joined.parent.mkdir(parents=True, exist_ok=True)
    tmp = joined.with_name(f".{joined.name}.{os.getpid()}")
    with open(tmp, "wb") as out:
        for part in (image.initrd, extra):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    os.replace(tmp, joined)  # whole or not there: another worker may build the same one
    shutil.rmtree(rootfs)
    return dataclasses.replace(image, initrd=str(joined))


@contextlib.contextmanager
def _own_saved_guests():
    """This guest saved apart from the labs' ($OFFLAB_VM_SAVED_DIR for the start): offlab keeps only the
    saved.KEEP guests last used, shared by every lab of a test run, and one more kind among them could
    push one of theirs out (a cold boot for that lab instead)."""
    before = os.environ.get("OFFLAB_VM_SAVED_DIR")
    os.environ["OFFLAB_VM_SAVED_DIR"] = str(images.cache_root() / "test-ssh" / "saved")
    try:
        yield
    finally:
        if before is None:
            del os.environ["OFFLAB_VM_SAVED_DIR"]
        else:
            os.environ["OFFLAB_VM_SAVED_DIR"] = before


def _guest_iface(g: GuestHost, mac: str) -> str:
    out = g.run(["sh", "-c", "for d in /sys/class/net/*; do echo \"${d##*/} $(cat $d/address)\"; done"]).stdout
    return next(line.split()[0] for line in out.splitlines() if line.split()[1:] == [mac])


def start_pair(tmp: Path, prefix: str, subnet: int = 210) -> GuestPair:
    """Namespaces `<prefix>-c` and `-a`, the guest booted in `-c` with sshd listening on its management
    address; one key pair for both machines' sshd and the controller's client."""
    d = tmp / "guesthost"
    d.mkdir(mode=0o700)
    p = GuestPair(d, f"{prefix}-c", sshd_mod.Machine(f"{prefix}-a", f"10.200.{subnet + 1}.2"),
                  f"10.200.{subnet}.2", subnet)
    try:
        for ns in (p.controller, p.a.ns):
            LOCAL.run(["ip", "netns", "add", ns])
        sshd_mod._veth(p.controller, "mgta", f"10.200.{subnet + 1}.1", p.a.ns, "mgmt", p.a.ssh_ip)
        for key in ("hostkey", "userkey"):
            LOCAL.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"offlab-test-{key}", "-f", str(d / key)])
        pub = (d / "hostkey.pub").read_text().split()
        (d / "known_hosts").write_text(f"[{p.a.ssh_ip}]:{sshd_mod.PORT} {pub[0]} {pub[1]}\n"
                                       f"{p.b_ssh_ip} {pub[0]} {pub[1]}\n")
        (d / "authorized_keys").write_text((d / "userkey.pub").read_text())
        os.chmod(d / "authorized_keys", 0o600)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        conf = sshd_mod._sshd_config(d / "sshd_config-a", p.a.ssh_ip, sshd_mod.PORT, d / "hostkey",
                                     d / "authorized_keys", d / "sshd-a.pid", client_alive=True)
        p.a.proc = sshd_mod._start_sshd(p.a.ns, conf, d / "sshd-a.log")

        img = _initrd(images.build(), d)
        macs = {"mgmt": qemu.mac_for(prefix, "mgmt"), "t1": qemu.mac_for(prefix, "t1")}
        with _own_saved_guests():
            p.guest, _ = saved.start(img, NetnsHost(p.controller), d / "run", name=f"{prefix}-b",
                                     nics=[qemu.Nic("gm0", macs["mgmt"]), qemu.Nic("gt1", macs["t1"])], smp=2,
                                     timeout=180)
        c = NetnsHost(p.controller)
        c.run(["ip", "addr", "add", f"10.200.{subnet}.1/24", "dev", "gm0"])
        c.run(["ip", "link", "set", "gm0", "up"])
        c.run(["ip", "link", "set", "gt1", "netns", p.a.ns])
        a = NetnsHost(p.a.ns)
        a.run(["ip", "link", "set", "gt1", "name", "t1"])
        a.run(["ip", "addr", "add", f"{p.test_ip('a')}/24", "dev", "t1"])
        a.run(["ip", "link", "set", "t1", "up"])
        g = p.guest_host()
        g.write(f"{GUEST_CONF}/hostkey", (d / "hostkey").read_text())
        g.write(f"{GUEST_CONF}/authorized_keys", (d / "userkey.pub").read_text())
        names = {role: _guest_iface(g, mac) for role, mac in macs.items()}
        g.run(["sh", "-c", f"""set -e
            ip link set {names['mgmt']} name mgmt; ip link set {names['t1']} name t1
            ip addr add {p.b_ssh_ip}/24 dev mgmt; ip link set mgmt up
            ip addr add {p.test_ip('b')}/24 dev t1; ip link set t1 up
            chmod 600 {GUEST_CONF}/hostkey; mkdir -p /run/sshd; chmod 755 /run/sshd
            {SSHD} -f {GUEST_CONF}/sshd_config -E /tmp/sshd.log
            n=0; until grep -q 'Server listening' /tmp/sshd.log; do
              n=$((n+1)); [ $n -lt 1500 ] || {{ cat /tmp/sshd.log; exit 1; }}; sleep 0.1; done"""],
              # hang guards only: a fresh clone's make test (three workers on two CPUs, this guest TCG with two
              # vCPUs) once took over 60 s for this script
              timeout=240)
    except BaseException:
        stop_pair(p)
        raise
    return p


def stop_pair(p: GuestPair) -> list[str]:
    """The guest powered off (by pid if it does not answer), a's sshd and sessions stopped by pid, the
    namespaces deleted; what had to be killed beyond the listeners (should be empty)."""
    sshd_mod.close_all()
    if p.guest is not None:
        qemu.stop(p.guest.pid, p.guest.start_time, p.guest.socket)
        p.guest = None
    leftovers = sshd_mod._end_sshd(p.a.proc, p.a.ns)
    for ns in (p.controller, p.a.ns):
        if netns_exists(ns):
            LOCAL.run(["ip", "netns", "del", ns], check=False)
    return leftovers
