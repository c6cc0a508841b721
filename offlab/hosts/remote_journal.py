"""The journal offlab keeps ON a remote host, so the host can be put back without the controller.

Every change offlab makes on an SSH host (a setting, a copied engine) is also written there,
before it is made, as a small shell script of the exact commands that undo it:

    <remote_dir>/undo/<time_ns>-<name>.sh      # "# offlab: <what>" then one quoted argv per line
    <remote_dir>/restore.sh                    # runs every undo script, newest first, and removes it

`remote_dir` defaults to /run/offlab-remote: a tmpfs that a reboot empties, exactly when the
kernel has forgotten the settings too. Restoring needs only `sh` and the tools the scripts call
(ip, ethtool): `sh /run/offlab-remote/restore.sh` as root on the host, also after the controller
was killed with SIGKILL. The controller removes a script once it has restored that change itself.
"""

from __future__ import annotations

import re
import time

from offlab.hosts.base import Host
from offlab.hosts.ssh import remote_command

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")

RESTORE_SH = """#!/bin/sh
# Written by offlab. Puts back, newest first, every change offlab made on this host and has not
# restored yet; each undo/*.sh holds the exact commands for one change. Needs sh, ip, ethtool.
# Run as root:  sh {dir}/restore.sh      (exit 0: all put back; 1: see the lines on stderr)
cd "$(dirname "$0")" || exit 1
rc=0
for f in $(ls -1 undo 2>/dev/null | sort -r); do
  case "$f" in *.sh) ;; *) continue ;; esac
  what=$(sed -n '1s/^# offlab: //p' "undo/$f")
  if sh -e "undo/$f"; then
    rm -f "undo/$f"; echo "restored: $what"
  else
    rc=1; echo "could not restore: $what (kept: $PWD/undo/$f)" >&2
  fi
done
[ "$rc" = 0 ] && [ -z "$(ls -A undo 2>/dev/null)" ] && rmdir undo 2>/dev/null
exit $rc
"""

# One round trip: make the private directory, (re)write restore.sh, then the undo script from stdin.
_RECORD = ('umask 077; mkdir -p "$1/undo" && printf "%s" "$3" >"$1/restore.sh" && '
           'cat >"$1/undo/.$2.tmp" && mv "$1/undo/.$2.tmp" "$1/undo/$2.sh"')
_FORGET = 'rm -f "$1/undo/"*"-$2.sh"'


def script(title: str, argvs: list[list[str]]) -> str:
    """The undo script of one change: a comment naming it, then each command exactly quoted."""
    safe = " ".join(title.split())
    return f"# offlab: {safe}\n" + "".join(remote_command(a) + "\n" for a in argvs)


def record(host: Host, remote_dir: str, name: str, title: str, argvs: list[list[str]]) -> str:
    """Write the undo script of change `name` on `host` before the change is made; its path there."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"invalid remote journal name {name!r}")
    stamped = f"{time.time_ns():019d}-{name}"
    host.run(["sh", "-c", _RECORD, "sh", remote_dir, stamped, RESTORE_SH.replace("{dir}", remote_dir)],
             input=script(title, argvs), timeout=30)
    return f"{remote_dir}/undo/{stamped}.sh"


def forget(host: Host, remote_dir: str, name: str) -> None:
    """The controller put change `name` back itself: its undo script goes."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"invalid remote journal name {name!r}")
    host.run(["sh", "-c", _FORGET, "sh", remote_dir, name], timeout=30)


def tidy(host: Host, remote_dir: str) -> None:
    """Remove the private directory once nothing in it is left to restore (the host as it was found)."""
    host.run(["sh", "-c", 'cd "$1" 2>/dev/null || exit 0; rmdir undo 2>/dev/null; '
              '[ -e undo ] || { rm -f restore.sh; cd /; rmdir "$1" 2>/dev/null; }; exit 0', "sh", remote_dir],
             timeout=30)


def pending(host: Host, remote_dir: str) -> list[str]:
    """The first lines ("what") of the undo scripts still on the host, newest first."""
    res = host.run(["sh", "-c", 'cd "$1/undo" 2>/dev/null || exit 0; for f in $(ls -1 | sort -r); do '
                    'sed -n "1s/^# offlab: //p" "$f"; done', "sh", remote_dir], timeout=30)
    return [l for l in res.stdout.splitlines() if l.strip()]
