"""Numbers as people read them, shared by the terminal tables and the HTML report."""

from __future__ import annotations

import math
from typing import Sequence

from offlab.metrics import METRICS
from offlab.sample import LossAttribution, LossPlace, NotLost
from offlab.stats import CI, partition, percents

MINUS = "\u2212"

# Column headers for tables where METRICS' labels are too long to fit beside each other.
SHORT = {"throughput_bps": "throughput", "pps": "pps", "loss": "loss", "retransmits": "retransmits",
         "jitter_us": "jitter", "cpu_client_busy": "client CPU", "cpu_server_busy": "server CPU",
         "sd_client_us_per_kib": "client µs/KiB", "sd_server_us_per_kib": "server µs/KiB",
         "sd_total_us_per_kib": "service demand", "rtt_p50_us": "p50 idle", "rtt_p99_us": "p99 idle",
         "rtt_p99_9_us": "p99.9 idle", "rtt_mean_us": "rtt mean idle", "transactions_per_s": "tps idle",
         "loaded_rtt_p50_us": "p50 loaded", "loaded_rtt_p99_us": "p99 loaded", "loaded_rtt_p99_9_us": "p99.9 loaded",
         "loaded_rtt_mean_us": "rtt mean loaded", "loaded_transactions_per_s": "tps loaded",
         "cpu_us_per_transaction": "CPU µs/transaction"}


def short(metric: str) -> str:
    return SHORT.get(metric) or (METRICS[metric].label if metric in METRICS else metric)


def _prefix(v: float) -> tuple[float, str]:
    for div, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return div, p
    return 1.0, ""


def _num(x: float, digits: int = 3) -> str:
    """`digits` significant digits, without scientific notation for everyday magnitudes."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    magnitude = int(math.floor(math.log10(abs(x))))
    if abs(round(x, digits - 1 - magnitude)) >= 10 ** (magnitude + 1):
        magnitude += 1  # 0.09995 rounds to 0.100, not 0.1000
    decimals = max(0, digits - 1 - magnitude)
    return f"{x:.{decimals}f}"


def value(metric: str, v: float | None, half_width: float | None = None) -> str:
    """"3.10 ± 0.04 Gbit/s", "27.5 %", "0.100 %" (loss), "0.574 µs/KiB"."""
    if v is None:
        return "–"
    unit = METRICS[metric].unit if metric in METRICS else ""
    if unit == "fraction":  # loss is stored as a fraction, read as a percentage
        v, half_width, unit = 100 * v, None if half_width is None else 100 * half_width, "%"
    div, p = (_prefix(v) if unit in ("bit/s", "pps") else (1.0, ""))
    scaled = v / div
    text = _num(scaled)
    if half_width is not None:
        hw = half_width / div
        text += f" ± {_fixed_like(hw, text)}"
    if unit == "%":
        return f"{text} %"
    return f"{text} {p}{unit}".rstrip()


def _fixed_like(x: float, like: str) -> str:
    """x with as many decimals as `like`; one significant digit when that would show a spread as 0."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    if x < 1e-9:  # identical values whose mean picked up float rounding: no spread at all
        x = 0.0
    if x > 0 and round(x, decimals) == 0:
        return _num(x, 1)
    return f"{x:.{decimals}f}"


def ci(metric: str, c: CI | None) -> str:
    if c is None:
        return "–"
    return value(metric, c.mean, c.half_width)


def signed(x: float | None, decimals: int = 1) -> str:
    """+1.2, −1.2 (a real minus sign), and 0.0 without a sign when it rounds to zero."""
    if x is None:
        return "–"
    if round(x, decimals) == 0:
        return f"{0:.{decimals}f}"
    return f"+{x:.{decimals}f}" if x > 0 else f"{MINUS}{-x:.{decimals}f}"


def change(row) -> str:
    """"+49.2 % [+45.1, +53.4]" for a compare Row; a difference where the baseline mean is 0."""
    if row.change_pct is not None:
        text = f"{signed(row.change_pct)} %"
        if row.change_low_pct is not None:
            text += f" [{signed(row.change_low_pct)}, {signed(row.change_high_pct)}]"
        return text
    if row.diff is not None:
        unit = METRICS[row.metric].unit
        scale, unit = (100.0, " pp") if unit == "fraction" else (1.0, f" {unit}")
        text = f"{signed(row.diff * scale, 3)}{unit}"
        if row.diff_low is not None:
            text += f" [{signed(row.diff_low * scale, 3)}, {signed(row.diff_high * scale, 3)}]"
        return text
    return "–"


def verdict_text(row) -> str:
    """"+69.0 % [−53.4, +514.0] undetermined": a comparison's interval and verdict, as every line that
    shows a comparison (headline, published ratio, compare, report) prints it."""
    text = change(row)
    return f"{text} {row.verdict}" if text != "–" else row.verdict


# What a loss attribution stored before counts were converted to datagrams cannot say.
OLDER_ATTRIBUTION = ("stored by an older offlab: its counts are as each counter counted them (a GRO packet as one "
                     "datagram) and, with GSO/GRO, lost is the tool's whole run; measure again for datagrams "
                     "over the window")


def loss_lines(la: LossAttribution | None) -> list[str]:
    """Loss attribution (offlab.experiment.witnesses.attribute_loss) as lines people read, in datagrams:
    'router:oltrq2 qdisc (tbf) drops 27410 (98 %): queue full or over its rate';
    'server Udp RcvbufErrors 87137 packets ≈ 3834028 datagrams (44.0 per packet, server:x rx: 64810 B per
    packet; bounds 87137..3834028) (98 %): socket receive buffer full'. The shares shown add up to 100 %."""
    if not la:
        return []
    # Samples stored before offlab recorded the source and the sent count still read.
    of = f" of {la.sent}" if la.sent else ""
    head = f"lost {la.lost}{of} datagrams" + (f" ({la.lost_source})" if la.lost_source else "")
    if not la.places:
        head += ": no counter explains them"
    pct, rest_pct = loss_percents(la)
    lines = [head] + [f"  {place_text(p)} ({share} %)" + (f": {p.what}" if p.what else "")
                      for p, share in zip(la.places, pct, strict=True)]
    if la.places and la.explained_low is not None and la.explained_low != la.explained_high:
        lines.append(f"  explained {la.explained} datagrams ({100 * (la.explained or 0) / la.lost:.0f} %), "
                     f"bounds {la.explained_low}..{la.explained_high}")
    if la.places and la.unexplained:
        lines.append(f"  unexplained {la.unexplained} ({rest_pct} %)")
    if la.overshoot:
        lines.append(f"  the places' estimates add up to {la.overshoot} datagrams more than the {la.lost} lost: "
                     f"each place's share is of their sum, not of the lost")
    lines += [f"  not loss: {n.where} {n.count}: {n.what}" for n in la.not_lost]
    lines += [f"  not read: {u}" for u in la.unread]
    if la.lost_uncertainty:
        flight = la.lost_in_flight or 0
        lines.append(f"  ± {la.lost_uncertainty} datagrams: the client's and the server's counters were read "
                     f"up to {1000 * (la.skew_s or 0):.1f} ms apart"
                     + (f", and {flight} packets waited in this machine's input backlogs at an edge" if flight else ""))
    if la.lost_low is not None and la.lost_high is not None:
        lag = (f"; a gap is counted when the receiver reads past it, up to {1000 * la.detection_lag_s:.1f} ms "
               f"(the run's largest one-way latency) after it went missing" if la.detection_lag_s else "")
        lines.append(f"  lost in the window {la.lost_low}..{la.lost_high} by the tool's rows: those at its edges "
                     f"count in part in the {la.lost}{lag}")
    return lines


def loss_partition(la: LossAttribution) -> tuple[list[float], float]:
    """Each place's share and the unexplained share, adding up to 1; a sample stored before shares did
    (its places' estimates summed as if exact) is partitioned here the same way (stats.partition)."""
    if la.unexplained_share is not None:
        return [p.share for p in la.places], la.unexplained_share
    return partition([p.bound("datagrams") for p in la.places], la.lost)


def loss_percents(la: LossAttribution) -> tuple[list[str], str]:
    """The places' shares and the unexplained one as printed percentages that add up to 100."""
    shares, rest = loss_partition(la)
    shown = percents([*shares, rest])
    return shown[:-1], shown[-1]


def place_text(p: LossPlace) -> str:
    """A place and its count in datagrams; a per-packet count with its conversion and bounds."""
    if p.unit != "packets":
        return f"{p.where} {p.count}"
    return (f"{p.where} {p.count} packets ≈ {p.datagrams} datagrams ({p.per_packet:.1f} per packet, "
            f"{p.basis}; bounds {p.low}..{p.high})")


def merge_attributions(found: Sequence[LossAttribution | None]) -> LossAttribution | None:
    """The attributions of a cell's samples summed: lost, each place's count, and its share of the total:
    the datagrams each sample gave it (its share × its lost), so the shares still add up to 1."""
    got = [a for a in found if a]
    if not got:
        return None
    lost = sum(a.lost for a in got)
    places: dict[str, LossPlace] = {}
    given: dict[str, float] = {}
    rest = 0.0
    for a in got:
        shares, unexplained = loss_partition(a)
        rest += unexplained * a.lost
        for p, share in zip(a.places, shares, strict=True):
            # Older samples counted every place in datagrams, without an estimate of their own.
            q = places.get(p.where)
            if q is None:
                q = places[p.where] = LossPlace.from_json({**p.to_json(), "count": 0, "datagrams": 0, "low": 0,
                                                           "high": 0})
            q.count += p.count
            q.datagrams, q.low, q.high = (q.bound(k) + p.bound(k) for k in ("datagrams", "low", "high"))
            given[p.where] = given.get(p.where, 0.0) + share * a.lost
    for q in places.values():
        if q.unit == "packets":
            q.per_packet = (q.datagrams or 0) / q.count
            q.basis = f"mean over {len(got)} sample(s)" if len(got) > 1 else q.basis
    not_lost: dict[str, NotLost] = {}
    for a in got:
        for n in a.not_lost:
            m = not_lost.setdefault(n.where, NotLost.from_json({**n.to_json(), "count": 0}))
            m.count += n.count
    for where, q in places.items():
        q.share = given[where] / lost if lost else 0.0
    overshoot = sum(a.overshoot or 0 for a in got)
    sources = sorted({_source_kind(a.lost_source) for a in got if a.lost_source})
    out = LossAttribution(lost=lost, sent=sum(a.sent or 0 for a in got), lost_source=", ".join(sources),
                          places=list(places.values()), unexplained=round(rest),
                          unexplained_share=rest / lost if lost else 0.0, overshoot=overshoot or None,
                          not_lost=list(not_lost.values()), samples=len(got),
                          unread=sorted({u for a in got for u in a.unread}))
    if all(a.explained_low is not None for a in got):
        out.explained = sum(a.explained or 0 for a in got)
        out.explained_low = sum(a.explained_low or 0 for a in got)
        out.explained_high = sum(a.explained_high or 0 for a in got)
    return out


def _source_kind(source: str) -> str:
    """A lost count's source without its per-sample figures (rows, ms), so a cell's samples name it once."""
    return source.split("'s ", 1)[0] + "'s intervals in the window" if "intervals in the window" in source else source
