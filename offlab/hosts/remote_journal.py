"""The journal offlab keeps ON a remote host, so the host can be put back without the controller.

Every change offlab makes on an SSH host (a setting, a copied engine) is also written there,
before it is made, as a small shell script of the exact commands that undo it:

    <remote_dir>/undo/<time_ns>-<name>.sh      # "# offlab: <what>" then one quoted argv per line
    <remote_dir>/restore.sh                    # runs every undo script, newest first, and removes it

A process offlab starts there (iperf3, the engine, tcpdump, sockperf: RemoteProcess) is recorded
the same way in the same command that starts it, before it starts: its undo script ends the
process and its runner by pid, each checked against the start time the runner wrote beside it
(field 22 of /proc/PID/stat), so a pid the kernel gave to another process since is never hit, then
removes its directory `<remote_dir>/proc/<stamp>` (its output files). A second comment line names
the controller process that started it (boot id, pid, start time): `offlab restore` and `lab down`
on that controller end the processes whose owner is dead, and leave a live run's alone.

`remote_dir` defaults to /run/offlab-remote: a tmpfs that a reboot empties, exactly when the
kernel has forgotten the settings too. Restoring needs only `sh` and the tools the scripts call
(ip, ethtool): `sh /run/offlab-remote/restore.sh` as root on the host, also after the controller
was killed with SIGKILL. The controller removes a script once it has restored that change itself.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time

from offlab.hosts.base import Host
from offlab.hosts.process import START_TIME_SH
from offlab.hosts.ssh import remote_command
from offlab.interrupts import shielded

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")

# Run in the private directory: removes each process directory whose undo script is gone, a start cut off
# as its host was lost (the directory made after its record was already undone). Never a live one: a start
# writes its undo script before its directory. restore.sh and the controller's tidy-up both run it.
STRAY_PROCS_SH = 'for p in proc/*; do [ -d "$p" ] || continue; [ -e "undo/${p#proc/}.sh" ] || rm -rf -- "$p"; done; '

RESTORE_SH = """#!/bin/sh
# Written by offlab. Puts back, newest first, every change offlab made on this host and has not
# restored yet, and ends every process it started here and did not end itself (each checked by its
# start time); each undo/*.sh holds the exact commands for one. Needs sh, ip, ethtool, kill.
# Run as root:  sh {dir}/restore.sh      (exit 0: all put back; 1: see the lines on stderr)
cd "$(dirname "$0")" || exit 1
rc=0
# First the lease watchdogs (offlab.hosts.lease): each stopped by its pid and start time, so none
# restores at the same time as this script; then what their leases restored earlier, said once.
st() { s=$(cat /proc/$1/stat 2>/dev/null) || return 0; s=${s##*) }; set -- $s; [ "$1" = Z ] || echo "${20}"; }
for l in lease/*/; do
  [ -d "$l" ] || continue
  if read -r p t <"$l/ids" 2>/dev/null && [ "$(st "$p")" = "$t" ]; then kill -TERM "$p" 2>/dev/null || true; fi
  rm -rf -- "$l"
done
rmdir lease 2>/dev/null
for f in lapsed/*.txt; do [ -e "$f" ] && sed 's/^/earlier: /' "$f" && rm -f "$f"; done
rmdir lapsed 2>/dev/null
for f in $(ls -1 undo 2>/dev/null | sort -r); do
  case "$f" in *.sh) ;; *) continue ;; esac
  what=$(sed -n '1s/^# offlab: //p' "undo/$f")
  if sh -e "undo/$f"; then
    rm -f "undo/$f"; echo "restored: $what"
  else
    rc=1; echo "could not restore: $what (kept: $PWD/undo/$f)" >&2
  fi
done
# All put back: nothing of offlab's is left here (this script is already read; sh keeps it open).
if [ "$rc" = 0 ] && [ -z "$(ls -A undo 2>/dev/null)" ]; then
  {strays}rmdir undo proc 2>/dev/null; rm -f restore.sh; d=$PWD; cd / && rmdir "$d" 2>/dev/null
fi
exit $rc
""".replace("{strays}", STRAY_PROCS_SH)

# Refuses (exit 4) when this process's lease ($4, if any) on the host has lapsed: its watchdog has put
# the host back, and a change made now would be restored by nobody's lease.
LEASE_CHECK = ('if [ -n "$4" ] && [ ! -d "$1/lease/$4" ]; then echo "the lease of this offlab process on this '
               'host has lapsed: the host put itself back (offlab restore says when)" >&2; exit 4; fi; ')
# ...then, after the undo script is in place, names it in the lease's list of what it restores.
LEASE_OWN = ' && { [ -z "$4" ] || echo "$2.sh" >>"$1/lease/$4/own"; }'
# One round trip: make the private directory, (re)write restore.sh, then the undo script from stdin.
_RECORD = (LEASE_CHECK + 'umask 077; mkdir -p "$1/undo" && printf "%s" "$3" >"$1/restore.sh" && '
           'cat >"$1/undo/.$2.tmp" && mv "$1/undo/.$2.tmp" "$1/undo/$2.sh"' + LEASE_OWN)



def lease_of(host: Host, remote_dir: str) -> str:
    """The lease of this process on a host, if it keeps one: called before anything is recorded there,
    it starts the host's watchdog on the first call; the lease's id, or ""."""
    from offlab.hosts import lease  # late: the lease is built on this journal

    return lease.lease_of(host, remote_dir)


_FORGET = 'rm -f "$1/undo/"*"-$2.sh"'


def script(title: str, argvs: list[list[str]]) -> str:
    """The undo script of one change: a comment naming it, then each command exactly quoted."""
    safe = " ".join(title.split())
    return f"# offlab: {safe}\n" + "".join(remote_command(a) + "\n" for a in argvs)


def record(host: Host, remote_dir: str, name: str, title: str, argvs: list[list[str]]) -> str:
    """Write the undo script of change `name` on `host` before the change is made; its path there."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"invalid remote journal name {name!r}")
    lease = lease_of(host, remote_dir)
    stamped = f"{time.time_ns():019d}-{name}"
    host.run(["sh", "-c", _RECORD, "sh", remote_dir, stamped, RESTORE_SH.replace("{dir}", remote_dir), lease],
             input=script(title, argvs), timeout=30)
    return f"{remote_dir}/undo/{stamped}.sh"


def forget(host: Host, remote_dir: str, name: str) -> None:
    """The controller put change `name` back itself: its undo script goes."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"invalid remote journal name {name!r}")
    host.run(["sh", "-c", _FORGET, "sh", remote_dir, name], timeout=30)


def tidy(host: Host, remote_dir: str) -> None:
    """Remove the private directory once nothing in it is left to restore (the host as it was found);
    this process's lease there goes first when nothing it covers is left."""
    from offlab.hosts import lease
    from offlab.hosts.ssh import SshHost

    if isinstance(host, SshHost):
        lease.release_idle(host, remote_dir)
    host.run(["sh", "-c", 'cd "$1" 2>/dev/null || exit 0; ' + STRAY_PROCS_SH + 'rmdir undo 2>/dev/null; rmdir proc 2>/dev/null; '
              'rmdir lease 2>/dev/null; [ -e undo ] || [ -e proc ] || [ -e lease ] || [ -e lapsed ] || '
              '{ rm -f restore.sh; cd /; rmdir "$1" 2>/dev/null; }; exit 0',
              "sh", remote_dir], timeout=30)


def pending(host: Host, remote_dir: str) -> list[str]:
    """The first lines ("what") of the undo scripts still on the host, newest first."""
    res = host.run(["sh", "-c", 'cd "$1/undo" 2>/dev/null || exit 0; for f in $(ls -1 | sort -r); do '
                    'sed -n "1s/^# offlab: //p" "$f"; done', "sh", remote_dir], timeout=30)
    return [l for l in res.stdout.splitlines() if l.strip()]


# ---- processes ---------------------------------------------------------------------------------

PROC_TAG = "-proc-"
OWNER = "# owner: "

# The undo script of one process: its directory is $d; "$d/ids" holds "PID START" of the command and
# of its runner (hosts/process.py). Each is signalled only while /proc/PID/stat still shows START.
_END_PROCESS = START_TIME_SH + r"""
if [ -s "$d/ids" ]; then
  while read -r p t; do
    [ -n "$p" ] && [ -n "$t" ] || continue
    [ "$(st "$p")" = "$t" ] || continue
    kill -TERM "$p" 2>/dev/null || true
    n=0; while [ "$(st "$p")" = "$t" ] && [ $n -lt 30 ]; do sleep 0.1; n=$((n + 1)); done
    if [ "$(st "$p")" = "$t" ]; then kill -KILL "$p" 2>/dev/null || true; sleep 0.1; fi
  done <"$d/ids"
fi
rm -rf -- "$d"
"""


def boot_id() -> str:
    """This machine's boot: a pid and start time name a process only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def process_record(remote_dir: str, argv: list[str], title: str | None = None,
                   lease: str = "") -> tuple[str, str, str]:
    """(stamp, undo script, start script) for one process: the start script, run with `remote_dir` and
    the stamp as $1 $2 and the undo script on stdin, records it in `remote_dir`, makes its directory,
    prints it, and leaves `"$D" argv...` as its arguments for the starter (hosts/process.py)."""
    from offlab.state import me

    stamp = f"{time.time_ns():019d}{PROC_TAG}{secrets.token_hex(4)}"
    d = f"{remote_dir}/proc/{stamp}"
    owner = me()
    what = title or "stop " + " ".join(" ".join(argv).split())[:160]
    undo = (f"# offlab: {what}\n{OWNER}{boot_id()} {owner['pid']} {owner['start']}\n"
            f"d={shlex.quote(d)}\n{_END_PROCESS}")
    check = LEASE_CHECK.replace("$1", "$R").replace("$4", "$K")
    own = LEASE_OWN.replace("$1", "$R").replace("$4", "$K").replace("$2", "$S")
    start = (f'R=$1; S=$2; K={shlex.quote(lease)}; shift 2; ' + check + 'umask 077; mkdir -p "$R/undo" "$R/proc" && '
             'printf "%s" ' + shlex.quote(RESTORE_SH.replace("{dir}", remote_dir)) + ' >"$R/restore.sh" && '
             'cat >"$R/undo/.$S.tmp" && mv "$R/undo/.$S.tmp" "$R/undo/$S.sh"' + own + ' && mkdir "$R/proc/$S" || exit 1; '
             'umask 022; D="$R/proc/$S"; echo "$D"; set -- "$D" "$@"; ')
    return stamp, undo, start


_LIST_PROCS = ('cd "$1/undo" 2>/dev/null || exit 0; for f in *' + PROC_TAG + '*.sh; do [ -e "$f" ] || continue; '
               'printf "%s %s\n" "$f" "$(sed -n "s/^' + OWNER + '//p" "$f")"; done')
_RUN_UNDO = ('cd "$1/undo" 2>/dev/null || exit 0; shift; rc=0; for f; do [ -e "$f" ] || continue; '
             'what=$(sed -n "1s/^# offlab: //p" "$f"); if sh -e "$f"; then rm -f "$f"; echo "$what"; '
             'else rc=1; echo "could not: $what" >&2; fi; done; exit $rc')
_FILE_RE = re.compile(r"^[0-9]{19}" + PROC_TAG + r"[0-9a-f]{8}\.sh$")


def end_processes(host: Host, remote_dir: str, *, force: bool = False, also: frozenset[int] | set[int] = frozenset(),
                  list_only: bool = False) -> list[str]:
    """End the processes recorded on `host` that a process of this machine started and that outlived
    it (also those of the live processes `also`; all of this machine's, with `force`); processes
    another controller started are left alone. With `list_only`, only what would be ended.
    What was ended, one line each (`stop <argv>`)."""
    from offlab.state import owner_alive

    from offlab.hosts import lease as leases

    stopped = leases.stop_orphans(host, remote_dir, force=force, also=also, list_only=list_only)
    listed = host.run(["sh", "-c", _LIST_PROCS, "sh", remote_dir], timeout=30).stdout
    chosen = []
    for line in listed.splitlines():
        name, _, owner = line.partition(" ")
        parts = owner.split()
        if not _FILE_RE.fullmatch(name) or len(parts) != 3 or parts[0] != boot_id():
            continue  # another controller's (or not ours to read)
        try:
            pid, alive = int(parts[1]), owner_alive({"pid": int(parts[1]), "start": int(parts[2])})
        except ValueError:
            continue
        if force or not alive or pid in also:
            chosen.append(name)
    if not chosen:
        return stopped
    if list_only:  # what each would do, nothing done
        res = host.run(["sh", "-c", 'cd "$1/undo" 2>/dev/null || exit 0; shift; for f; do '
                        'sed -n "1s/^# offlab: //p" "$f"; done', "sh", remote_dir, *chosen], check=False, timeout=30)
        return [l for l in res.stdout.splitlines() if l.strip()] + stopped
    res = host.run(["sh", "-c", _RUN_UNDO, "sh", remote_dir, *chosen], check=False, timeout=30 + 4 * len(chosen))
    return [l for l in res.stdout.splitlines() if l.strip()] + stopped


def temp_dir(host: Host, remote_dir: str) -> tuple[str, str]:
    """A private directory on the host for a while (the engine's ready file), recorded like a process
    (with no process in it): restore.sh, `offlab restore` and `lab down` remove it after a crash.
    (its path, its undo script's path); `drop_temp_dir` removes both."""
    stamp, undo, start = process_record(remote_dir, [], title="remove a temporary directory",
                                        lease=lease_of(host, remote_dir))
    # Shielded: a signal meanwhile waits for the host's answer, so the directory is recorded before anything
    # unwinds (cut short, the command could still make it there after the lab's teardown had looked).
    with shielded():
        res = host.run(["sh", "-c", start, "sh", remote_dir, stamp], input=undo, timeout=30)
    d = f"{remote_dir}/proc/{stamp}"
    if res.stdout.strip() != d:
        raise OSError(f"could not make a temporary directory in {remote_dir} on {host.name}: "
                      f"{res.stderr.strip()[:200]}")
    return d, f"{remote_dir}/undo/{stamp}.sh"


def drop_temp_dir(host: Host, path: str, undo: str) -> None:
    host.run(["sh", "-c", 'rm -rf -- "$1"; rm -f -- "$2"', "sh", path, undo], check=False, timeout=15)
