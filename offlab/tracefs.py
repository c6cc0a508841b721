"""offlab's hist triggers in a kernel's tracefs: which, and the shell that sets, lists and removes them.

Shared by the setting that puts them in a guest (knobs/trace_hist.py, journalled) and the probe that
reads what they counted (probes/hist.py). Each trigger is named `offlab_<what>` (`hist:name=…`): by
that name offlab finds its own again, also those a killed controller left.
"""

from __future__ import annotations

from dataclasses import dataclass

from offlab.wire import ETH_HEADER

TRACEFS = "/sys/kernel/tracing"
NAME_PREFIX = "offlab_"


@dataclass(frozen=True)
class Trigger:
    name: str  # offlab_<what>: the hist's name, by which offlab finds its own triggers again
    event: str  # group/event
    keys: str
    vals: str = "hitcount"
    filter: str = ""

    def command(self) -> str:
        """The line written to the event's `trigger` file ('!' + it removes it)."""
        vals = f":vals={self.vals}" if self.vals != "hitcount" else ""
        return f"hist:name={self.name}:keys={self.keys}{vals}" + (f" if {self.filter}" if self.filter else "")

    @property
    def hist_path(self) -> str:
        return f"{TRACEFS}/events/{self.event}/hist"

    @property
    def trigger_path(self) -> str:
        return f"{TRACEFS}/events/{self.event}/trigger"


EVENTS = ("skb/kfree_skb", "net/net_dev_start_xmit", "net/net_dev_queue", "net/napi_gro_receive_entry",
          "net/netif_receive_skb")
HIST_FILES = tuple(f"{TRACEFS}/events/{e}/hist" for e in EVENTS)
_ENV = "EVENT_TRIGGERS=\"" + " ".join(f"{e}/trigger" for e in EVENTS) + "\"; "


def triggers(frame_max: int) -> list[Trigger]:
    """offlab's triggers; `frame_max`: the longest skb that is one frame (largest MTU + Ethernet header)."""
    if not isinstance(frame_max, int) or not 0 < frame_max < 1 << 20:
        raise ValueError(f"a frame length expected, not {frame_max!r}")
    big = f"len > {frame_max}"
    return [Trigger(f"{NAME_PREFIX}drop", "skb/kfree_skb", "reason,location.sym"),
            Trigger(f"{NAME_PREFIX}xmit", "net/net_dev_start_xmit", "name,gso_type,gso_segs"),
            Trigger(f"{NAME_PREFIX}queue", "net/net_dev_queue", "name"),
            Trigger(f"{NAME_PREFIX}queue_super", "net/net_dev_queue", "name", filter=big),
            Trigger(f"{NAME_PREFIX}gro_in", "net/napi_gro_receive_entry", "name"),
            Trigger(f"{NAME_PREFIX}rx", "net/netif_receive_skb", "name"),
            Trigger(f"{NAME_PREFIX}rx_super", "net/netif_receive_skb", "name", filter=big)]




# ---- the shell run in the guest (busybox sh), argv only: names and numbers are offlab's own ------

# Every script below takes the tracefs directory as $1, finds offlab's triggers with one grep over the
# trigger files of EVENTS only (a fork per file of the ~1500 events costs a minute under TCG) and
# removes each by writing it back with a leading '!'.
_OURS = r"""
ours() { (cd "$t/events" && grep -H '^hist:name=offlab_' $EVENT_TRIGGERS 2>/dev/null) | sed 's/ \[[a-z]*\]$//'; }
drop_ours() { ours | while IFS= read -r l; do echo "!${l#*:}" >>"$t/events/${l%%:*}"; done; }
"""

# then the triggers as "group/event|command". Prints "mounted" if it mounted tracefs. Any trigger of
# offlab's already there (left by a controller killed before it removed it) goes first, so a named
# hist never carries an older run's counts.
INSTALL_SH = _OURS + r"""
t=$1; shift; cd /
if ! grep -qs " $t tracefs " /proc/mounts; then mount -t tracefs nodev "$t" || exit 3; echo mounted; fi
[ -e "$t/events/skb/kfree_skb/trigger" ] || { echo "no skb:kfree_skb tracepoint in $t" >&2; exit 3; }
drop_ours
for c; do
  f="$t/events/${c%%|*}/trigger"; echo "${c#*|}" >>"$f" || { echo "the kernel refused '${c#*|}' in $f" >&2; exit 3; }
done
"""

# $2 = "umount" to unmount tracefs after. Removes every trigger of offlab's.
REMOVE_SH = _OURS + r"""
t=$1; cd /
grep -qs " $t tracefs " /proc/mounts || exit 0
drop_ours
[ -z "$(ours)" ] || { echo "triggers of offlab's are still there: $(ours)" >&2; exit 1; }
[ "$2" = umount ] && { umount "$t" || exit 1; }
exit 0
"""

# "mounted" or "unmounted", then each trigger of offlab's, one a line ("group/event/trigger:command").
STATE_SH = _OURS + r"""
t=$1; cd /
grep -qs " $t tracefs " /proc/mounts || { echo unmounted; exit 0; }
echo mounted
ours
exit 0
"""

# The largest MTU among the guest's interfaces (lo excepted): what is longer than it + 14 is not a frame.
MTU_SH = r"""cd /sys/class/net && for i in *; do [ "$i" = lo ] || cat "$i/mtu"; done"""


def install_argv(ts: list[Trigger]) -> list[str]:
    return ["sh", "-c", _ENV + INSTALL_SH, "sh", TRACEFS, *(f"{t.event}|{t.command()}" for t in ts)]


def remove_argv(unmount: bool) -> list[str]:
    return ["sh", "-c", _ENV + REMOVE_SH, "sh", TRACEFS, "umount" if unmount else "keep"]


def state_argv() -> list[str]:
    return ["sh", "-c", _ENV + STATE_SH, "sh", TRACEFS]


def frame_max(mtu_text: str) -> int:
    mtus = [int(x) for x in mtu_text.split() if x.isdigit()]
    return (max(mtus) if mtus else 1500) + ETH_HEADER
