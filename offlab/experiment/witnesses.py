"""Second witnesses for the headline figures of a sample, and where lost datagrams died.

A traffic tool's own count can be wrong: iperf3 3.12's receiver counters stop adding up
when most datagrams die in the receive buffer (negative "received", loss above 100 %).
The kernel saw the same datagrams: the client's `Udp OutDatagrams` and the server's
`Udp InDatagrams` over the same window. Every figure is bounded to its possible range,
the witnesses are compared, and a disagreement beyond a stated tolerance marks the
sample "inconsistent" with both values, never silently one of them.

Pure functions over `Sample.to_dict()`-shaped dicts, so they are tested on numbers.
"""

from __future__ import annotations

# Loss fractions from the tool and from the kernel differ by the window's edges: iperf3 counts its
# whole test, the kernel counters only the window after warm-up (seen here: 2.9 % vs 0.8 % at
# 4096 B, 5 Gbit/s offered). Beyond five percentage points the witnesses disagree.
LOSS_TOLERANCE = 0.05
# Throughput against pps × datagram size: the two come from the same receiver count.
RATE_TOLERANCE = 0.10
# offlab-engine's sender ends with two END markers; the second may reach a receiver that has
# already stopped on the first: up to this many UdpNoPorts on the server are the harness's own.
END_MARKER_NOPORTS = 2


def bound(traffic: dict) -> list[str]:
    """Clamp impossible figures in place (received < 0, loss outside 0..1); say what was clamped."""
    notes = []
    sent, received = traffic.get("datagrams_sent"), traffic.get("datagrams_received")
    if received is not None and received < 0:
        notes.append(f"the tool reported {received} datagrams received: impossible, taken as unknown")
        traffic["datagrams_received"] = None
        traffic["pps"] = None
    loss = traffic.get("loss")
    if loss is not None and not 0.0 <= loss <= 1.0:
        notes.append(f"the tool reported loss {100 * loss:.1f} %: impossible, taken as unknown")
        traffic["loss"] = None
    if sent is not None and received is not None and received > sent > 0 and traffic.get("tool") == "iperf3":
        notes.append(f"the tool reported {received} received of {sent} sent")
    return notes


def kernel_loss(probes: dict, workload: dict | None = None) -> tuple[float | None, int | None, int | None]:
    """(loss, sent, received) from the client's Udp OutDatagrams and the server's Udp InDatagrams.

    With UDP GRO on the receiver the kernel counts one InDatagram per merged buffer, and with
    UDP_SEGMENT one OutDatagram per super-packet, so these counters cannot witness loss then.
    """
    if workload and (workload.get("gro") or workload.get("gso")):
        return None, None, None
    snmp = probes.get("snmp") or {}
    out = (snmp.get("client") or {}).get("Udp", {}).get("OutDatagrams")
    got = (snmp.get("server") or {}).get("Udp", {}).get("InDatagrams")
    if not out or got is None:
        return None, out, got
    return max(0.0, min(1.0, (out - got) / out)), out, got


def cross_check(sample: dict) -> dict:
    """Every check run on the sample: name, ok, and the values each witness gave."""
    traffic, probes, w = sample["traffic"], sample["probes"], sample["workload"]
    checks = []
    if w.get("protocol") == "udp":
        k_loss, k_sent, k_got = kernel_loss(probes, w)
        t_loss = traffic.get("loss")
        if k_loss is not None:
            ok = t_loss is not None and abs(t_loss - k_loss) <= LOSS_TOLERANCE
            checks.append({
                "check": "loss", "ok": ok,
                "tool": t_loss, "kernel": k_loss, "kernel_sent": k_sent, "kernel_received": k_got,
                "detail": (f"loss {_pct(t_loss)} by {traffic.get('tool')}, {_pct(k_loss)} by the kernel "
                           f"(client Udp OutDatagrams {k_sent}, server Udp InDatagrams {k_got})"),
            })
            if t_loss is None:
                # The tool's count was impossible: the kernel's sender/receiver counts are the best source.
                traffic["loss"] = k_loss
                traffic["loss_source"] = "kernel"
        size, pps, bps = w.get("size"), traffic.get("pps"), traffic.get("throughput_bps")
        if size and pps and bps:
            implied = pps * size * 8
            ok = abs(bps - implied) <= RATE_TOLERANCE * max(bps, implied)
            checks.append({"check": "throughput = pps × size", "ok": ok, "throughput_bps": bps,
                           "pps_times_size_bps": implied,
                           "detail": f"throughput {bps:.4g} bit/s vs {pps:.4g} pps × {size} B = {implied:.4g} bit/s"})
    app_bytes = (traffic.get("throughput_bps") or 0) * probes.get("window_s", 0) / 8
    rx_bytes = _server_rx_bytes(probes)
    if app_bytes > 0 and rx_bytes is not None:
        ok = app_bytes <= rx_bytes * 1.02
        checks.append({"check": "application bytes ≤ interface bytes", "ok": ok, "application_bytes": app_bytes,
                       "interface_bytes": rx_bytes,
                       "detail": f"{app_bytes:.4g} B received by the application, {rx_bytes:.4g} B by the "
                                 f"server's interfaces"})
    status = "consistent" if all(c["ok"] for c in checks) else "inconsistent"
    return {"status": status, "checks": checks}


def _server_rx_bytes(probes: dict) -> int | None:
    found = [d["rx_bytes"] for name, d in (probes.get("interfaces") or {}).items() if name.startswith("server:")]
    return sum(found) if found else None


def attribute_loss(sample: dict) -> dict | None:
    """Where the lost datagrams died, from counter deltas on every host, with each one's share."""
    traffic, probes = sample["traffic"], sample["probes"]
    if sample["workload"].get("protocol") != "udp":
        return None
    _, k_sent, k_got = kernel_loss(probes, sample["workload"])
    lost = (k_sent - k_got) if k_sent is not None and k_got is not None else None
    if lost is None and traffic.get("datagrams_sent") is not None and traffic.get("datagrams_received") is not None:
        lost = traffic["datagrams_sent"] - traffic["datagrams_received"]
    if not lost or lost <= 0:
        return None
    places: list[tuple[str, int]] = []
    for role, snmp in (probes.get("snmp") or {}).items():
        udp, ip = snmp.get("Udp", {}), snmp.get("Ip", {})
        # InErrors already counts RcvbufErrors and InCsumErrors: only the rest is its own place.
        other = udp.get("InErrors", 0) - udp.get("RcvbufErrors", 0) - udp.get("InCsumErrors", 0)
        counts = {**udp, "InErrors": max(0, other)}
        for key, what in (("RcvbufErrors", "socket receive buffer full"), ("InErrors", "other UDP input errors"),
                          ("NoPorts", "no socket on the port"), ("InCsumErrors", "bad UDP checksum"),
                          ("SndbufErrors", "socket send buffer full")):
            if role == "server" or key == "SndbufErrors":
                if counts.get(key):
                    places.append((f"{role} Udp {key} ({what})", counts[key]))
        for key, what in (("InDiscards", "IP input discards"), ("ReasmFails", "fragment reassembly failed")):
            if ip.get(key):
                places.append((f"{role} Ip {key} ({what})", ip[key]))
    for name, d in (probes.get("interfaces") or {}).items():
        for key in ("rx_dropped", "tx_dropped"):
            if d.get(key):
                places.append((f"{name} {key}", d[key]))
    softnet = sum(v.get("dropped", 0) for v in (probes.get("softnet") or {}).values())
    if softnet:
        places.append(("softnet backlog dropped", softnet))
    explained = sum(n for _, n in places)
    return {
        "lost": lost,
        "places": [{"where": w, "count": n, "share": n / lost} for w, n in sorted(places, key=lambda p: -p[1])],
        "unexplained": max(0, lost - explained),
        "receiver_absent": receiver_absent(sample),
    }


def receiver_absent(sample: dict) -> str | None:
    """Why datagrams found no receiver, when the counters say they did not: the harness's fault, not the path's.

    A receiver that listens on its port gets no UdpNoPorts but the END marker's; more means the
    datagrams arrived while nothing listened (the receiver had stopped — idle timeout after a
    stalled sender, its deadline passed before a slow sender began — or a wrong port). The sender
    then sees ECONNREFUSED from the ICMP port-unreachable replies. With UDP_SEGMENT the receiving
    kernel counts a super-packet that finds no socket once, so NoPorts × segments ≈ datagrams.
    """
    traffic, probes, w = sample["traffic"], sample["probes"], sample["workload"]
    noports = ((probes.get("snmp") or {}).get("server") or {}).get("Udp", {}).get("NoPorts", 0) or 0
    refused = (traffic.get("errors") or {}).get("ECONNREFUSED", 0)
    if noports <= END_MARKER_NOPORTS and not refused:
        return None
    stop = traffic.get("receiver_stop")
    seen = [f"server Udp NoPorts +{noports}" + (" (one per UDP_SEGMENT super-packet)" if w.get("gso") else "")]
    if refused:
        seen.append(f"sender ECONNREFUSED ×{refused}")
    if stop and stop != "end":
        seen.append(f"receiver stopped on {stop}, not on the sender's END marker")
    return (f"{', '.join(seen)}: datagrams reached the server while no socket listened on the port — "
            f"the receiver was not running (stopped early or not yet started, a harness race) or the port was "
            f"wrong; this is not loss on the path")


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.2f} %"
