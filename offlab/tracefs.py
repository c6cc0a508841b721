"""offlab's hist triggers in a kernel's tracefs: which, and the shell that sets, lists and removes them.

Shared by the setting that puts them in a guest's or an SSH host's kernel (knobs/trace_hist.py,
journalled) and the probe that reads what they counted (probes/hist.py). Each trigger is named
`offlab_<tag>_<what>` (`hist:name=…`), `tag` naming the host it was set for (`tag_of` its key): by that
name offlab finds its own again, also those a killed controller left, and never touches another host's
that shares the kernel (two SSH stand-ins on one machine: docs/results.md).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from offlab.wire import ETH_HEADER

TRACEFS = "/sys/kernel/tracing"
NAME_PREFIX = "offlab_"


def tag_of(host_key: str) -> str:
    """The tag in the names of the triggers offlab sets for one host: the same in every process."""
    return hashlib.sha256(host_key.encode()).hexdigest()[:10]


def prefix(tag: str) -> str:
    """The start of every trigger name offlab sets for the host tagged `tag`."""
    if not re.fullmatch(r"[0-9a-f]{1,16}", tag):
        raise ValueError(f"a hex tag expected, not {tag!r}")
    return f"{NAME_PREFIX}{tag}_"


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


def _env(tag: str) -> str:
    return f"TAG={prefix(tag)}; EVENT_TRIGGERS=\"" + " ".join(f"{e}/trigger" for e in EVENTS) + "\"; "


def triggers(frame_max: int, tag: str) -> list[Trigger]:
    """offlab's triggers for the host tagged `tag`; `frame_max`: the longest skb that is one frame
    (largest MTU + Ethernet header)."""
    if not isinstance(frame_max, int) or not 0 < frame_max < 1 << 20:
        raise ValueError(f"a frame length expected, not {frame_max!r}")
    big, p = f"len > {frame_max}", prefix(tag)
    return [Trigger(f"{p}drop", "skb/kfree_skb", "reason,location.sym"),
            Trigger(f"{p}xmit", "net/net_dev_start_xmit", "name,gso_type,gso_segs"),
            Trigger(f"{p}queue", "net/net_dev_queue", "name"),
            Trigger(f"{p}queue_super", "net/net_dev_queue", "name", filter=big),
            Trigger(f"{p}gro_in", "net/napi_gro_receive_entry", "name"),
            Trigger(f"{p}rx", "net/netif_receive_skb", "name"),
            Trigger(f"{p}rx_super", "net/netif_receive_skb", "name", filter=big)]




# ---- the shell run in the guest (busybox sh) or on the SSH host, argv only: names and numbers are offlab's own

# Every script below takes the tracefs directory as $1 and the host's name prefix as $TAG, finds that
# host's triggers with one grep over the trigger files of EVENTS only (a fork per file of the ~1500
# events costs a minute under TCG) and removes each by writing it back with a leading '!'. `anyone`
# lists every trigger of offlab's, whichever host it was set for (another SSH host on this kernel).
_OURS = r"""
ours() { (cd "$t/events" && grep -H "^hist:name=$TAG" $EVENT_TRIGGERS 2>/dev/null) | sed 's/ \[[a-z]*\]$//'; }
anyone() { (cd "$t/events" && grep -l '^hist:name=offlab_' $EVENT_TRIGGERS 2>/dev/null); }
drop_ours() { ours | while IFS= read -r l; do echo "!${l#*:}" >>"$t/events/${l%%:*}"; done; }
"""

# then the triggers as "group/event|command". Prints "mounted" if it mounted tracefs. Any trigger of
# this host's already there (left by a controller killed before it removed it) goes first, so a named
# hist never carries an older run's counts. A kernel without hist triggers (no `hist` file beside the
# tracepoint: CONFIG_HIST_TRIGGERS off) is left as it was found, exit 3 and one line saying so.
INSTALL_SH = _OURS + r"""
t=$1; shift; cd /; m=
if ! grep -qs " $t tracefs " /proc/mounts; then mount -t tracefs nodev "$t" || exit 3; m=1; echo mounted; fi
[ -e "$t/events/skb/kfree_skb/trigger" ] || { echo "no skb:kfree_skb tracepoint in $t" >&2; [ -z "$m" ] || umount "$t"; exit 3; }
[ -e "$t/events/skb/kfree_skb/hist" ] || {
  echo "this kernel has no hist triggers (CONFIG_HIST_TRIGGERS is off)" >&2; [ -z "$m" ] || umount "$t"; exit 3; }
drop_ours
for c; do
  f="$t/events/${c%%|*}/trigger"; echo "${c#*|}" >>"$f" || { echo "the kernel refused '${c#*|}' in $f" >&2; exit 3; }
done
"""

# $2 = "umount" to unmount tracefs after, unless a trigger offlab set for another host is still there
# (that host shares this kernel and its mount: its own restore unmounts). Removes this host's triggers.
REMOVE_SH = _OURS + r"""
t=$1; cd /
grep -qs " $t tracefs " /proc/mounts || exit 0
drop_ours
[ -z "$(ours)" ] || { echo "triggers of offlab's are still there: $(ours)" >&2; exit 1; }
[ "$2" = umount ] && [ -z "$(anyone)" ] && { umount "$t" || exit 1; }
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


def install_argv(ts: list[Trigger], tag: str, tracefs: str = TRACEFS) -> list[str]:
    return ["sh", "-c", _env(tag) + INSTALL_SH, "sh", tracefs, *(f"{t.event}|{t.command()}" for t in ts)]


def remove_argv(unmount: bool, tag: str, tracefs: str = TRACEFS) -> list[str]:
    return ["sh", "-c", _env(tag) + REMOVE_SH, "sh", tracefs, "umount" if unmount else "keep"]


def state_argv(tag: str, tracefs: str = TRACEFS) -> list[str]:
    return ["sh", "-c", _env(tag) + STATE_SH, "sh", tracefs]


def frame_max(mtu_text: str) -> int:
    mtus = [int(x) for x in mtu_text.split() if x.isdigit()]
    return (max(mtus) if mtus else 1500) + ETH_HEADER
