"""The MTU of every interface of every lab host, read once beside the window (sysfs)."""

from __future__ import annotations

from offlab.errors import OfflabError
from offlab.probes import counters
from offlab.probes.remote import Async

_MTUS = 'for d in /sys/class/net/*; do echo "${d##*/} $(cat "$d/mtu")"; done'


def mtus(lab) -> dict[str, int]:
    """"role:iface" → MTU of every interface of every lab host, read once beside the window (sysfs); a
    host that cannot say is left out. A host with a kernel of its own (a guest) reads its interface
    names and their MTU files in two `read_many` requests, which its agent answers without forking
    (a shell loop there would fork a `cat` per interface in the guest, beside the traffic)."""
    def read(host) -> dict[str, int]:
        try:
            if host.shares_kernel:
                res = host.run(["sh", "-c", _MTUS], check=False, timeout=10)
                lines = res.stdout.splitlines() if res.ok else []
            else:
                names = [n for n in counters.parse_net_dev(host.read_many(["/proc/net/dev"])["/proc/net/dev"] or "")]
                found = host.read_many([f"/sys/class/net/{n}/mtu" for n in names], timeout=10)
                lines = [f"{n} {found[f'/sys/class/net/{n}/mtu'] or ''}" for n in names]
        except OfflabError:
            return {}
        out = {}
        for line in lines:
            name, _, mtu = line.partition(" ")
            if mtu.strip().isdigit() and name != "lo":
                out[name] = int(mtu)
        return out

    tasks = {role: Async(read, lab.host(role)) for role in lab.hosts}
    return {f"{role}:{name}": mtu for role, t in tasks.items() for name, mtu in (t.result() or {}).items()}
