"""Realistic synthetic results for the store/compare/report tests: samples in the stored shape of
offlab.sample's StoredSample (JSON), written through the same Store API the runner uses, with the
metrics read from them as the runner reads them."""

from __future__ import annotations

import random

from offlab.metrics import metrics_of
from offlab.probes.capture import HIST_EDGES
from offlab.sample import StoredSample
from offlab.store import Store

PLAN_TEXT = """\
name: uso
topology: {kind: bridge}
axes:
  payload:
    - {udp_payload: 1472, mtu: 1500}
    - {udp_payload: 8972, mtu: 9000}
    - {udp_payload: 65507, mtu: 1500}
  offload:
    off: {features: {client: {tx-udp-segmentation: off}}, engine: {gso: false, gro: false}}
    on:  {features: {client: {tx-udp-segmentation: on}},  engine: {gso: true, gro: true}}
workload: {tool: engine, protocol: udp, duration: 5, warmup: 1}
repeat: {min: 3, max: 10, level: 99, width: 5}
baseline: {offload: off}
capture: {on: server, frames: 2000}
"""

ENV = {
    "kernel": "6.1.0-18-amd64", "os": "Debian GNU/Linux 12 (bookworm)",
    "cpu": {"model": "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", "count": 8},
    "versions": {"offlab": "0.1.0", "iperf3": "3.12", "offlab-engine": "0.1.0", "python": "3.11.2"},
    "lab": {"name": "uso", "topology": "bridge", "mtu": 1500, "hosts": {
        "client": {"netns": "ol-uso-client", "address": "10.200.1.1", "interfaces": [
            {"name": "olu0a", "mtu": 1500, "features": {"tx-udp-segmentation": True, "generic-receive-offload": True,
                                                         "tx-udp_tnl-segmentation": False},
             "fixed": ["tx-udp_tnl-segmentation"]}]},
        "server": {"netns": "ol-uso-server", "address": "10.200.1.2", "interfaces": [
            {"name": "olu1b", "mtu": 1500, "features": {"tx-udp-segmentation": True, "generic-receive-offload": True,
                                                         "tx-udp_tnl-segmentation": False},
             "fixed": ["tx-udp_tnl-segmentation"]}]}}},
}


def _bin(size: int) -> str:
    lo = 0
    for edge in HIST_EDGES:
        if size <= edge:
            return f"{lo + 1}-{edge}"
        lo = edge
    raise ValueError(size)


def cpu_side(rng: random.Random, cpu: str, user: float, system: float, softirq: float, irq: float = 0.2) -> dict:
    j = lambda x: max(0.0, x * rng.uniform(0.97, 1.03))  # noqa: E731
    d = {"cpu": cpu, "user": j(user), "system": j(system), "softirq": j(softirq), "irq": j(irq)}
    d["idle"] = max(0.0, 100.0 - d["user"] - d["system"] - d["softirq"] - d["irq"])
    d["busy"] = 100.0 - d["idle"]
    return d


def sample(rng: random.Random, *, payload: int, mtu: int, gso: bool, throughput_bps: float, loss: float = 0.001,
           capture: bool = False, spread: float = 0.01) -> dict:
    """One engine UDP sample: throughput near `throughput_bps` (± spread), CPU split per side."""
    thr = throughput_bps * rng.gauss(1.0, spread)
    window = 4.95
    pps = thr / 8 / payload
    client = cpu_side(rng, "cpu0", 6.0, 40.0 if gso else 75.0, 8.0)
    server = cpu_side(rng, "cpu1", 5.0, 30.0, 45.0 if not gso else 30.0)
    kib = thr * window / 8 / 1024
    sd = {s: c["busy"] / 100 * window * 1e6 / kib for s, c in (("client", client), ("server", server))}
    sd["total"] = sd["client"] + sd["server"]
    received = int(pps * window)
    sent = int(received / (1 - loss))
    cap = None
    if capture:
        fragments = payload + 28 > mtu
        frame = min(payload + 42, mtu + 14)
        per = -(-(payload + 8) // (mtu - 20)) if fragments else 1
        if gso and not fragments:
            hist, largest, verdict = [["1025-1514", 120], ["32769-65536", 1880]], 64042, (
                "no IP fragments, 1880 of 2000 frames larger than MTU + 14 = 1514 bytes (largest 64042): "
                "GSO/GRO super-packets crossed olu1b unsegmented")
        elif fragments:
            hist, largest, verdict = [["513-1024", 400], ["1025-1514", 1600]], mtu + 14, (
                f"{payload}-byte datagrams left as {per} IP fragments each (1800 fragments of 40 datagrams), "
                f"every frame ≤ {mtu + 14} bytes (largest {mtu + 14})")
        else:
            label = _bin(frame)
            hist, largest, verdict = [[label, 2000]], frame, (
                f"no IP fragments, every frame ≤ {mtu + 14} bytes (largest {frame})")
        cap = {"host": "server", "iface": "olu1b", "mtu": mtu, "frames": 2000, "largest_frame": largest,
               "over_mtu_frames": 1880 if gso and not fragments else 0,
               "ip_fragments": 1800 if fragments else 0, "fragmented_datagrams": 40 if fragments else 0,
               "fragments_per_datagram": per if fragments else None, "histogram": hist,
               "udp_payload_sizes": {str(payload): 2000}, "tcp_payload_sizes": {}, "kernel_dropped": 0,
               "verdict": verdict}
    return {
        "lab": "uso", "topology": "bridge",
        "workload": {"tool": "engine", "protocol": "udp", "size": payload, "gso": gso, "gro": gso, "batch": None,
                     "rate": None, "streams": 1, "duration": 5.0, "warmup": 1.0, "reverse": False,
                     "sndbuf": None, "rcvbuf": None, "client_cpu": 0, "server_cpu": 1, "ipv6": False},
        "started_at": 1714560000.0 + rng.random() * 1000,
        "traffic": {"tool": "engine", "protocol": "udp", "throughput_bps": thr, "sent_bps": thr / (1 - loss),
                    "pps": pps, "datagrams_sent": sent, "datagrams_received": received,
                    "loss": (sent - received) / sent, "duplicates": 0, "reordered": 0,
                    "jitter_us": rng.uniform(5, 15), "latency_us": None, "retransmits": None,
                    "window_s": window, "tool_cpu": None, "errors": {}, "client_pid": 4242, "server_pid": 4243},
        "probes": {
            "window_s": window,
            "cpu": {"per_cpu": {"cpu0": {k: v for k, v in client.items() if k != "cpu"},
                                "cpu1": {k: v for k, v in server.items() if k != "cpu"}},
                    "client": client, "server": server},
            "processes": [{"pid": 4242, "comm": "offlab-engine", "role": "client", "cpu_pct": client["busy"]},
                          {"pid": 4243, "comm": "offlab-engine", "role": "server", "cpu_pct": server["busy"]}],
            "interfaces": {"server:olu1b": {"rx_packets": received, "rx_bytes": received * (payload + 28),
                                            "tx_packets": 3, "tx_bytes": 180, "rx_dropped": 0, "tx_dropped": 0,
                                            "rx_avg_bytes": float(payload + 28), "tx_avg_bytes": 60.0}},
            "snmp": {"server": {"Udp": {"InDatagrams": received, "RcvbufErrors": sent - received}}},
            "softnet": {"1": {"processed": received, "dropped": 0, "time_squeeze": 2}},
        },
        "service_demand_us_per_kib": sd,
        "capture": cap,
        "notes": [],
    }


# Mean throughput (bit/s) per (payload, offload): offload on gains most with large datagrams.
THROUGHPUT = {(1472, "off"): 2.1e9, (1472, "on"): 3.1e9, (8972, "off"): 9.0e9, (8972, "on"): 9.1e9,
              (65507, "off"): 1.9e9, (65507, "on"): 1.2e9}
PAYLOADS = {"1472@1500": (1472, 1500), "8972@9000": (8972, 9000), "65507@1500": (65507, 1500)}


def make_uso_run(store: Store, *, rounds: int = 4, seed: int = 7, skip: str | None = "65507@1500",
                 name: str = "uso", scale: float = 1.0, capture_round: int = 0) -> tuple[int, dict[str, int]]:
    """A payload × offload run like the payload × offload plan of docs/plans.md; the cell payload=`skip`,offload=on is skipped."""
    rng = random.Random(seed)
    plan = {"name": name, "axes": {"payload": list(PAYLOADS), "offload": ["off", "on"]},
            "baseline": {"offload": "off"}, "repeat": {"min": 3, "max": 10, "level": 99, "width": 5}}
    run = store.create_run(name, PLAN_TEXT, plan, seed, ENV, {"offload": "off"}, plan["repeat"])
    cells = [{"key": f"payload={p},offload={o}", "params": {"payload": p, "offload": o},
              "settings": {"udp_payload": PAYLOADS[p][0], "mtu": PAYLOADS[p][1], "gso": o == "on"}}
             for p in PAYLOADS for o in ("off", "on")]
    ids = store.add_cells(run, cells)
    for c in cells:
        cid = ids[c["key"]]
        p, o = c["params"]["payload"], c["params"]["offload"]
        if p == skip and o == "on":
            store.set_cell_status(cid, "skipped", "tx-udp-segmentation is [fixed] off on olu0a: cannot test here")
            continue
        payload, mtu = PAYLOADS[p]
        for rnd in range(rounds):
            s = sample(rng, payload=payload, mtu=mtu, gso=o == "on",
                       throughput_bps=THROUGHPUT[(payload, o)] * scale, capture=rnd == capture_round)
            store.add_sample(run, cid, rnd, s, metrics_of(StoredSample.from_json(s)))
        store.set_cell_status(cid, "done")
    store.set_run_status(run, "done")
    return run, ids


def make_sweep_run(store: Store, *, rounds: int = 3, seed: int = 11, sizes=(64, 256, 1024, 1472, 8972),
                   name: str = "sweep") -> tuple[int, dict[str, int]]:
    """A size sweep: size (numeric) × gso × streams = 20 cells with captures; baseline gso=off."""
    rng = random.Random(seed)
    plan = {"name": name, "axes": {"size": list(sizes), "gso": ["off", "on"], "streams": [1, 2]},
            "baseline": {"gso": "off"}, "repeat": {"min": 3, "max": 10, "level": 95, "width": 5}}
    run = store.create_run(name, "name: sweep\n", plan, seed, ENV, {"gso": "off"}, plan["repeat"])
    cells = [{"key": f"size={z},gso={g},streams={st}", "params": {"size": z, "gso": g, "streams": st},
              "settings": {"size": z}} for z in sizes for g in ("off", "on") for st in (1, 2)]
    ids = store.add_cells(run, cells)
    for c in cells:
        z, g, st = c["params"]["size"], c["params"]["gso"], c["params"]["streams"]
        base = min(9.5e9, 2.5e6 * z) * (1.6 if g == "on" else 1.0) * (1.3 if st == 2 else 1.0)
        for rnd in range(rounds):
            s = sample(rng, payload=z, mtu=9000 if z > 1472 else 1500, gso=g == "on", throughput_bps=base,
                       capture=rnd == 0, spread=0.02)
            store.add_sample(run, ids[c["key"]], rnd, s, metrics_of(StoredSample.from_json(s)))
        store.set_cell_status(ids[c["key"]], "done" if st == 1 else "confidence_not_reached",
                              None if st == 1 else "throughput interval 7.1 % of the mean after 10 rounds (target 5 %)")
    store.set_run_status(run, "done")
    return run, ids


PPS_PLAN_TEXT = """\
name: pps
topology: {kind: router}
axes:
  rps:
    off: {settings: {"router:to-client": {rps: "0"}}}
    on: {settings: {"router:to-client": {rps: "3"}}}
    all: {settings: {"router:to-client": {rps: "ff"}}}
workload: {tool: engine, protocol: udp, size: 64, duration: 1, search_low: 10kpps, search_high: 3Mpps}
repeat: {min: 2, max: 4, level: 95, width: 20, metric: pps}
baseline: {rps: "off"}
"""


def search_of(found: int | None, ceiling: int | None, fail_at: int | None) -> dict:
    """A zero-loss search record in the shape offlab.experiment.search writes."""
    trials = [{"phase": "search", "target_pps": 3_000_000, "achieved_pps": 292_353.0, "received_pps": 125_000.0,
               "sent": 292_353, "received": 125_700, "loss": 0.57, "passed": False, "generator_limited": True},
              {"phase": "search", "target_pps": 10_000, "achieved_pps": 10_000.0, "received_pps": 10_000.0,
               "sent": 10_000, "received": 10_000, "loss": 0.0, "passed": True, "generator_limited": False},
              {"phase": "confirm", "target_pps": 126_000, "achieved_pps": 125_300.0, "received_pps": 125_300.0,
               "sent": 125_300, "received": 125_300, "loss": 0.0, "passed": True, "generator_limited": False}]
    verdict = (f"{found / 1e3:.1f} kpps offered at ≤ 0 % loss (confirmed); loss exceeded the threshold at "
               f"{fail_at} pps") if found else "no rate met ≤ 0 % loss"
    return {"max_loss": 0.0, "low_pps": 10_000, "high_pps": 3_000_000, "confirm": 1, "trials": trials,
            "found_pps": found, "received_pps": found, "generator_limited": False,
            "generator_ceiling_pps": ceiling, "lowest_failing_pps": fail_at, "verdict": verdict}


def make_pps_run(store: Store, *, seed: int = 5) -> tuple[int, dict[str, int]]:
    """The pps suite's shape: a zero-loss search per sample, no loss in any baseline sample (so the
    comparison carries long notes), and one cell that failed after measuring (it must show no figures)."""
    rng = random.Random(seed)
    plan = {"name": "pps", "axes": {"rps": ["off", "on", "all"]}, "baseline": {"rps": "off"},
            "repeat": {"min": 2, "max": 4, "level": 95, "width": 20}}
    env = {**ENV, "plan_text": PPS_PLAN_TEXT, "ipv6": False, "numa_node": None}
    run = store.create_run("pps", PPS_PLAN_TEXT, plan, seed, env, {"rps": "off"}, plan["repeat"])
    cells = [{"key": f"rps={v}", "params": {"rps": v}, "settings": {}} for v in ("off", "on", "all")]
    ids = store.add_cells(run, cells)
    for c, rate in zip(cells, (58_900, 125_300, 77_700), strict=True):
        for rnd in range(2):
            s = sample(rng, payload=64, mtu=1500, gso=False, throughput_bps=rate * 64 * 8, loss=0.0, spread=0.05)
            s["search"] = search_of(int(rate * rng.uniform(0.97, 1.03)), None, int(rate * 1.05))
            s["segmentation"] = [{"interface": "client:olr0", "direction": "tx", "packets": 1512,
                                  "bytes": 1512 * 63880, "avg_bytes": 63880.0, "mtu": 1500,
                                  "verdict": "super-packets: not segmented on this hop",
                                  "line": "client:olr0 tx: 1512 pkts of avg 63880 B (super-packets: not segmented "
                                          "on this hop)"}]
            if c["key"] == "rps=off":  # the router's queue dropped most of what was lost
                s["loss_attribution"] = {
                    "lost": 120, "lost_source": "client Udp OutDatagrams − server Udp InDatagrams", "sent": 60000,
                    "places": [{"host": "router", "where": "router:olr2 qdisc (pfifo) drops", "count": 100,
                                "what": "queue full or over its rate", "layer": "queue", "share": 100 / 120}],
                    "explained": 100, "unexplained": 20, "not_lost": []}
            store.add_sample(run, ids[c["key"]], rnd, s, metrics_of(StoredSample.from_json(s)))
        store.set_cell_status(ids[c["key"]], "done")
    store.set_cell_status(ids["rps=all"], "failed", "offlab-engine rx exited 1: bind: address in use")
    store.set_run_status(run, "done")
    return run, ids
