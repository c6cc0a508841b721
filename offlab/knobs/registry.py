"""Which knob a key names: `mtu`, `channels.rx`, `rps.0`, `qdisc`, `gro_flush_timeout`, `gso_max_size`,
`threaded`, a sysctl, or a feature."""

from __future__ import annotations

from offlab.errors import BadInput
from offlab.knobs.base import KEY_RE, Knob
from offlab.knobs.bigtcp import SIZE_KEYS, THREADED_KEYS, LinkSize, Threaded
from offlab.knobs.bridge import BRIDGE_NF_KEYS, BridgeNf
from offlab.knobs.ethtool_params import Channels, Coalesce, Ring
from offlab.knobs.features import Feature
from offlab.knobs.link import Mtu, TxQueueLen
from offlab.knobs.napi import NAPI_KEYS, NapiParam
from offlab.knobs.qdisc import Qdisc
from offlab.knobs.queues import QueueMask
from offlab.knobs.sysctl import Sysctl, is_sysctl_key
from offlab.knobs.target import Target
from offlab.knobs.testpmd import TestpmdSetting, is_testpmd_key
from offlab.knobs.trace_hist import KEY as TRACE_HIST_KEY, HistTriggers

KINDS: dict[str, type[Knob]] = {k.kind: k for k in (Feature, Mtu, TxQueueLen, Channels, Ring, Coalesce,
                                                    QueueMask, Sysctl, BridgeNf, Qdisc, NapiParam, TestpmdSetting,
                                                    LinkSize, Threaded, HistTriggers)}
PREFIXED = {"channels": Channels, "ring": Ring, "coalesce": Coalesce}


def knob_class(key: str) -> type[Knob]:
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise BadInput(f"invalid setting name {key!r}")
    if is_sysctl_key(key):
        return Sysctl
    if is_testpmd_key(key):
        return TestpmdSetting
    if key == "mtu":
        return Mtu
    if key == "txqueuelen":
        return TxQueueLen
    if key == "qdisc":
        return Qdisc
    if key == TRACE_HIST_KEY:
        return HistTriggers
    if key in BRIDGE_NF_KEYS:
        return BridgeNf
    if key in NAPI_KEYS:
        return NapiParam
    if key in SIZE_KEYS:
        return LinkSize
    if key in THREADED_KEYS:
        return Threaded
    base, dot, _ = key.partition(".")
    if base in ("rps", "xps") and (dot or key == base):
        return QueueMask
    if dot and base in PREFIXED:
        return PREFIXED[base]
    if "." in key:
        raise BadInput(f"unknown setting {key!r}: a sysctl starts with net., kernel. or vm.; "
                       f"others are channels.X, ring.X, coalesce.X, rps[.N], xps[.N]")
    return Feature


def plan_knob_class(key: str, section: str) -> type[Knob]:
    """The class that judges `key` in a plan's `section`: every key under `features` is judged as a feature."""
    cls = knob_class(key)
    return Feature if section == "features" else cls


def knob_for(target: Target, key: str) -> Knob:
    cls = knob_class(key)
    if cls.needs_iface and target.iface is None:
        raise BadInput(f"{key} is a setting of an interface: name one (e.g. to-server)")
    if not cls.needs_iface and target.iface is not None:
        what = "a setting of dpdk-testpmd" if cls is TestpmdSetting else "a sysctl"
        raise BadInput(f"{key} is {what}, not a setting of {target.iface}: give no interface (- on the command line)")
    return cls(target, key)


def knob_from_entry(entry: dict) -> Knob:
    """Rebuild the knob a journal entry was written for, from the entry alone."""
    kind = entry.get("kind")
    if kind not in KINDS:
        raise BadInput(f"unknown setting kind {kind!r} in journal")
    key = entry.get("key")
    if not isinstance(key, str) or knob_class(key) is not KINDS[kind]:
        raise BadInput(f"setting {key!r} does not match kind {kind!r} in journal")
    return KINDS[kind](Target.from_dict(entry), key)
