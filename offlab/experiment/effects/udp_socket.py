"""The engine's --gso (UDP_SEGMENT) and --gro (UDP_GRO): datagrams per send and per receive, from the
kernel's Udp OutDatagrams / InDatagrams (one per super-packet, one per merged buffer) against the bytes
the sender's interfaces carried / the datagrams the receiving application got."""

from __future__ import annotations

from offlab.experiment.effects import EXERCISED, MIN_PACKETS, NOT_APPLICABLE, NOT_EXERCISED, Effect
from offlab.experiment.effects._paths import roles
from offlab.sample import StoredSample
from offlab.wire import UDP_FRAME_OVERHEAD


def judge_sample(sample: StoredSample) -> list[Effect]:
    probes, workload, traffic = sample.probes, sample.workload, sample.traffic
    if workload.protocol != "udp" or not workload.size:
        return []
    out = []
    sender, receiver = roles(workload)
    group = "Udp6" if workload.ipv6 else "Udp"
    datagram = workload.size + UDP_FRAME_OVERHEAD
    for flag, role, counter in (("gso", sender, "OutDatagrams"), ("gro", receiver, "InDatagrams")):
        if not getattr(workload, flag):
            continue
        calls = probes.counter(role, group, counter, None)
        if flag == "gso":  # what left the sender's interfaces, in datagrams
            size = sum(v.tx_bytes for n, v in probes.interfaces.items() if n.startswith(f"{role}:"))
            datagrams, source = size / datagram, f"{size} B on its interfaces"
        else:  # what its application received over the window (a receive-buffer drop counts in neither)
            datagrams = (traffic.pps or 0) * (probes.window_s or 0)
            source = f"{datagrams:.0f} datagrams its application received"
        per = datagrams / calls if calls else None
        what = "UDP_SEGMENT" if flag == "gso" else "UDP_GRO"
        e = Effect(setting=f"workload {flag} ({what})", where=f"{role} (socket)", value="on", status=NOT_APPLICABLE,
                   detail="", counters={f"{role}_{group}_{counter}": calls, "datagrams": round(datagrams),
                                        "datagrams_per_call": per})
        e.detail = (f"{role} {group} {counter} {calls} for {source}: {per:.1f} datagrams of "
                    f"{workload.size} B per {'send' if flag == 'gso' else 'receive'}" if per is not None
                    else f"{role} {group} {counter} unknown")
        if calls is None or per is None or calls < MIN_PACKETS:
            e.cause = f"fewer than {MIN_PACKETS} {counter}: nothing to judge"
        elif per > 1.5:
            e.status = EXERCISED
        else:
            e.status = NOT_EXERCISED
            e.cause = ("each send carried one datagram" if flag == "gso" else
                       "each receive got one datagram: the receiving device merged nothing (a veth merges "
                       "only with its gro feature on)")
        out.append(e)
    return out
