"""Leases on SSH hosts: a host that stops hearing from its controller puts itself back.

The first time a controller process journals something on an SSH host (a setting, a process it starts,
the engine it copies: offlab.hosts.remote_journal), it takes a lease there first, in one command:

    <remote_dir>/lease/<id>/owner      boot id, pid and start time of the controller process
    <remote_dir>/lease/<id>/label      that process, for the record (its host name, pid, command)
    <remote_dir>/lease/<id>/deadline   "DEADLINE NOW", both in seconds of the host's /proc/uptime
    <remote_dir>/lease/<id>/own        the undo scripts of this lease, one name a line, appended as recorded
    <remote_dir>/lease/<id>/ids        "PID START" of the watchdog

and starts the watchdog there: a `sh` loop in a session of its own (setsid, so it outlives the ssh
session), which wakes once a second and reads the deadline. The controller renews the lease every
quarter of it over one ssh session kept open for the purpose through the host's master connection:
a line out, a line back ("ok"), the deadline moved on; no new connection per renewal. A renewal that
fails or is late is said on stderr and retried; one that finds the lease gone says so too (the host
has put itself back: what is measured from then on is not of the settings asked for).

When the deadline passes unrenewed, the watchdog runs its lease's undo scripts newest first (settings
back, processes ended by pid and start time, the engine copy removed), writes what it did to
`<remote_dir>/lapsed/<id>.txt`, removes its lease and exits. The next `offlab restore`, `lab down`,
`lab show` or `hosts check` that reaches the host says so.

A controller that ends normally (also on Ctrl-C, SIGTERM, SIGHUP: offlab restores first) releases its
leases: the watchdog is stopped by its pid and start time (its whole process group) and the lease
removed. In the same command, whatever of its own the host still holds that it lost track of (a process
or a lease recorded by a command a signal cut short, which went on on the host: offlab.hosts.ssh,
INTERRUPTED_GRACE) is ended by the owner line its record carries. What the process left on purpose (a
`lab set`, a lab's engine copy) stays journalled on the host for `lab down`, `offlab restore` or
restore.sh, as before. `offlab restore` and `lab down` stop the
watchdogs of dead controllers of this machine, restore.sh stops every one, and a watchdog whose lease
was removed exits at its next wake-up.

Times are the host's own uptime, so neither clock's wall time matters; only the lapse record states
wall times (the host's).
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import select
import socket
import subprocess
import sys
import threading
import time

from offlab.errors import CommandFailed, EnvironmentProblem
from offlab.hosts import remote_journal
from offlab.hosts.base import Host
from offlab.hosts.process import START_TIME_SH
from offlab.hosts.ssh import SshHost, at_once, remote_command
from offlab.hosts.ssh import close_at_exit as ssh_close_at_exit, cut_short
from offlab.interrupts import signalled

RENEW_STREAM_LIFETIME = 3600  # seconds one renewal session lives on the host before it is opened again

# The watchdog: $1 its lease directory, $2 remote_dir. It writes its own ids first (the starter waits
# for them), then wakes once a second until the deadline passes or its lease is gone.
WATCHDOG = START_TIME_SH + r"""
L=$1; R=$2; id=${L##*/}; s=
# stopped (SIGTERM): its sleep is ended and reaped before it exits, so nothing of it outlives the stop
trap '[ -n "$s" ] && kill "$s" 2>/dev/null; [ -n "$s" ] && wait "$s" 2>/dev/null; exit 0' TERM
nap() { sleep 1 & s=$!; wait "$s"; s=; }
printf "%s %s\n" "$$" "$(st $$)" >"$L/ids.t" && mv "$L/ids.t" "$L/ids" || exit 0
while :; do
  read -r d r <"$L/deadline" 2>/dev/null || exit 0
  read -r u _ </proc/uptime; u=${u%.*}
  case "$d" in ''|*[!0-9]*) nap; continue ;; esac
  [ "$u" -lt "$d" ] || break
  nap
done
trap - TERM
mv "$L" "$L.lapsed" 2>/dev/null || exit 0
L=$L.lapsed; now=$(date +%s)
{
  echo "lapsed $now"
  echo "silent $((now - u + r))"
  sed 's/^/controller /' "$L/label"
  for f in $(sort -r "$L/own"); do
    [ -e "$R/undo/$f" ] || continue
    what=$(sed -n '1s/^# offlab: //p' "$R/undo/$f")
    if sh -e "$R/undo/$f" >/dev/null 2>&1; then rm -f "$R/undo/$f"; echo "restored: $what"
    else echo "could not restore: $what (kept: $R/undo/$f)"; fi
  done
} >"$L/record" 2>/dev/null
if grep -q -e '^restored: ' -e '^could not restore: ' "$L/record"; then
  mkdir -p "$R/lapsed" && mv "$L/record" "$R/lapsed/$id.txt"
fi
rm -rf -- "$L"
cd "$R" 2>/dev/null || exit 0
{strays}rmdir lease undo proc 2>/dev/null
[ -e undo ] || [ -e proc ] || [ -e lease ] || [ -e lapsed ] || { rm -f restore.sh; cd /; rmdir "$R" 2>/dev/null; }
exit 0
""".replace("{strays}", remote_journal.STRAY_PROCS_SH)

# Takes the lease and starts its watchdog: $1 remote_dir, $2 id, $3 seconds, $4 owner, $5 label, $6 the
# watchdog. Prints the watchdog's "PID START".
_ARM = r"""
R=$1; L=$1/lease/$2; umask 077
mkdir -p "$R/lease" && mkdir "$L" || exit 1
printf "%s\n" "$4" >"$L/owner"; printf "%s\n" "$5" >"$L/label"; : >"$L/own"
read -r u _ </proc/uptime; u=${u%.*}; echo "$((u + $3)) $u" >"$L/deadline"
setsid sh -c "$6" sh "$L" "$R" </dev/null >/dev/null 2>&1 &
n=0; while [ ! -s "$L/ids" ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n + 1)); done
cat "$L/ids"
"""

# The renewal session: a line in, the deadline moved on, a line out: "ok"; "failed" when the deadline
# could not be written; "gone" (and the session ends) once the lease is not there any more: lapsed, or
# stopped by restore.sh.
_RENEW = r"""
L=$1; s=$2
while read -r x; do
  [ -d "$L" ] || { echo gone; exit 0; }
  read -r u _ </proc/uptime; u=${u%.*}
  if echo "$((u + s)) $u" >"$L/deadline.t" 2>/dev/null && mv -f "$L/deadline.t" "$L/deadline" 2>/dev/null; then
    echo ok
  elif [ -d "$L" ]; then echo failed
  else echo gone; exit 0; fi
done
"""

# Stops one lease: its watchdog (which ends and reaps the child it sleeps in) by pid and start time, then
# the lease goes. $1 the lease directory. Prints "gone" if it was not there (lapsed meanwhile).
_STOP_ONE = START_TIME_SH + r"""
stop() {
  [ -d "$1" ] || { echo gone; return 0; }
  p=; t=; read -r p t <"$1/ids" 2>/dev/null
  rm -rf -- "$1"
  if [ -n "$p" ] && [ "$(st "$p")" = "$t" ]; then
    kill -TERM "$p" 2>/dev/null
    n=0; while [ "$(st "$p")" = "$t" ] && [ $n -lt 20 ]; do sleep 0.05; n=$((n + 1)); done
  fi
  echo stopped
}
"""
# After a lease goes, the remote directory goes too when nothing else is in it (the journal's own tidy-up
# ran earlier, while this lease still held it open).
_TIDY = r"""
tidy() {
  cd "$1" 2>/dev/null || return 0
  {strays}rmdir lease undo proc 2>/dev/null
  [ -e undo ] || [ -e proc ] || [ -e lease ] || [ -e lapsed ] || { rm -f restore.sh; cd /; rmdir "$1" 2>/dev/null; }
  cd /
}
""".replace("{strays}", remote_journal.STRAY_PROCS_SH)
_RELEASE = _STOP_ONE + _TIDY + r'stop "$1/lease/$2"; tidy "$1"; exit 0'
# Released only when nothing it lists is still journalled on the host (the controller put it all back).
_RELEASE_IF_IDLE = _STOP_ONE + _TIDY + r"""
L=$1/lease/$2
[ -d "$L" ] || { echo gone; exit 0; }
while read -r f; do [ -e "$1/undo/$f" ] && { echo busy; exit 0; }; done <"$L/own"
stop "$L"; tidy "$1"; exit 0
"""
# At this process's exit, on a host it started processes or took a lease on: its lease released ($2, if
# any: "gone" or "stopped" said), then whatever of its own is left there that it lost track of — a lease or
# a process recorded by a command a signal cut short, which went on on the host — stopped by the owner line
# ($3) that lease and process records carry; then the remote directory tidied. $1 remote_dir.
_AT_EXIT_SH = _STOP_ONE + _TIDY + r"""
R=$1; me=$3
[ -z "$2" ] || stop "$R/lease/$2"
for l in "$R"/lease/*/; do
  [ -f "${l}owner" ] && [ "$(cat "${l}owner")" = "$me" ] && stop "${l%/}" >/dev/null
done
for f in "$R"/undo/*""" + remote_journal.PROC_TAG + r"""*.sh; do
  [ -e "$f" ] && [ "$(sed -n 's/^""" + remote_journal.OWNER + r"""//p' "$f")" = "$me" ] || continue
  sh -e "$f" >/dev/null 2>&1 && rm -f "$f"
done
tidy "$R"; exit 0
"""
_LIST = r'cd "$1/lease" 2>/dev/null || exit 0; for l in */; do [ -f "$l/owner" ] || continue; ' \
        r'printf "%s %s %s\n" "${l%/}" "$(cat "$l/owner")" "$(head -c 200 "$l/label" | tr "\n" " ")"; done'
_STOP_MANY = _STOP_ONE + _TIDY + r'R=$1; shift; for l; do stop "$R/lease/$l" >/dev/null; done; tidy "$R"; exit 0'
_LAPSED_READ = r'if cd "$1/lapsed" 2>/dev/null; then for f in *.txt; do [ -e "$f" ] || continue; echo "@@ $f"; ' \
               r'cat "$f"; [ "$2" = remove ] && rm -f "$f"; done; cd "$1"; rmdir lapsed 2>/dev/null; fi; '
_LAPSED = _LAPSED_READ + "exit 0"
# The same read for a fleet's playbook (a task on each host, records removed: said once by `fleet run` or
# `fleet clean`), then the remote directory tidied if nothing else keeps it. $1 remote_dir, $2 "remove".
LAPSED_AND_TIDY_SH = _TIDY + _LAPSED_READ + 'tidy "$1"; exit 0'


def _owner_line() -> str:
    from offlab.state import me

    owner = me()
    return f"{remote_journal.boot_id()} {owner['pid']} {owner['start']}"


def _label() -> str:
    cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
    return f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(cmd.split())[:160]}"


class RemoteLease:
    """This process's lease on one SSH host (one remote_dir): taken, renewed, released."""

    def __init__(self, host: SshHost, remote_dir: str) -> None:
        self.host = host
        self.remote_dir = remote_dir
        self.seconds = host.lease
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.dir = f"{remote_dir}/lease/{self.id}"
        self.interval = max(0.5, self.seconds / 4)
        self.renewals = 0
        self.failures = 0
        self.lost = False
        self._streak = 0  # failed renewals in a row
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one renewal or release at a time
        self._thread: threading.Thread | None = None

    # ---- on the host -----------------------------------------------------------------------
    def arm(self) -> None:
        res = self.host.run(["sh", "-c", _ARM, "sh", self.remote_dir, self.id, str(self.seconds), _owner_line(),
                             _label(), WATCHDOG], check=False, timeout=30)
        if res.rc != 0 or len(res.stdout.split()) != 2:
            raise EnvironmentProblem(f"ssh host {self.host.name}: could not take offlab's lease there "
                                     f"({res.stderr.strip()[:200] or 'no watchdog started'})")
        self._thread = threading.Thread(target=self._loop, name=f"lease {self.host.name}", daemon=True)
        self._thread.start()

    def release(self, *, only_if_idle: bool = False, at_exit: bool = False) -> bool:
        """Stop the watchdog and remove the lease (with `only_if_idle`, only when nothing it lists is still
        journalled there; `at_exit`: also what this process lost track of there, see _AT_EXIT_SH);
        whether it is released."""
        script = _RELEASE_IF_IDLE if only_if_idle else _AT_EXIT_SH if at_exit else _RELEASE
        with self._lock:  # no renewal meanwhile: it would find the lease gone and take it for a lapse
            res = self.host.run(["sh", "-c", script, "sh", self.remote_dir, self.id, _owner_line()], check=False,
                                timeout=30)
            if res.stdout.strip() == "busy":
                return False
            self._stop.set()
        self._halt()
        _DONE.append(self)
        if res.stdout.strip() == "gone" and not self.lost:
            self.lost = True
            _say(f"lease on {self.host.name} had lapsed before it was released: the host put back what this "
                 f"process changed there (`offlab restore` says when)")
        return True

    # ---- renewals ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self.lost or self._stop.is_set():
                    return
                self.renew()

    def renew(self) -> None:
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._open()
            assert self._proc is not None and self._proc.stdin is not None
            os.write(self._proc.stdin.fileno(), b"r\n")
            answer = self._answer(timeout=max(self.interval, 2.0))
        except (OSError, EnvironmentProblem) as exc:
            answer, why = None, str(exc)
            self._close()
        else:
            why = "no answer" if answer is None else f"answered {answer!r}"
            if answer is None and self._proc is not None and self._proc.poll() is not None:
                why = "its ssh session ended"
                self._close()
        if answer == "ok":
            self.renewals += 1
            if self._streak:
                _say(f"lease on {self.host.name}: renewed again after {self._streak} failed renewal(s)")
                self._streak = 0
            return
        if answer == "gone":
            self.lost = True
            self._close()
            with _LOCK:  # the next change on this host takes a new lease
                if _mine().get((self.host._key, self.remote_dir)) is self:
                    _LEASES.pop((self.host._key, self.remote_dir))
                    _DONE.append(self)
            _say(f"lease on {self.host.name} lapsed: the host has put back what this process changed there; "
                 f"what is measured there from now on is not of the settings asked for")
            return
        self.failures += 1
        self._streak += 1
        if self._streak == 1:  # said once per run of failures; the next success says it is over
            _say(f"lease on {self.host.name}: renewal failed ({why}); retrying every {self.interval:g} s "
                 f"(the host puts itself back {self.seconds} s after the last renewal)")

    def _open(self) -> None:
        host = self.host
        remote = host._remote_argv(["sh", "-c", _RENEW, "sh", self.dir, str(self.seconds)], None,
                                   RENEW_STREAM_LIFETIME)
        host.connect()
        local = host._local([*host._base(), "-T", "--", host.target, remote_command(remote)])
        # Its own session: a Ctrl-C meant for the controller does not end the renewals while it restores.
        self._proc = subprocess.Popen(local, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, bufsize=0, start_new_session=True)
        self._buf = b""

    def _answer(self, timeout: float) -> str | None:
        """The next line the renewal session sends, or None after `timeout` s or at its end."""
        end = time.monotonic() + timeout
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace").strip()

    def _close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._close()


def _say(text: str) -> None:
    try:
        sys.stderr.write(f"offlab: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ---- this process's leases ------------------------------------------------------------------------
_LOCK = threading.Lock()
_LEASES: dict[tuple[str, str], RemoteLease] = {}
_AT_EXIT = threading.Event()  # release_all is registered to run at exit
_KEY_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_PID = [os.getpid()]
_DONE: list[RemoteLease] = []  # released, kept for the counts of renewal_note
# The hosts (and remote directories) this process took a lease or recorded a process on: each is visited
# at its exit (release_all), registered before the first command that could leave something there.
_TOUCHED: dict[tuple[str, str], tuple[SshHost, str]] = {}


def _mine() -> dict[tuple[str, str], RemoteLease]:
    if _PID[0] != os.getpid():  # a forked child holds none of its parent's leases
        _LEASES.clear()
        _KEY_LOCKS.clear()
        _DONE.clear()
        _TOUCHED.clear()
        _PID[0] = os.getpid()
    return _LEASES


def lease_of(host: Host, remote_dir: str) -> str:
    """The id of this process's lease on `host`, taken (and its watchdog started) on the first call;
    "" for a host without one (not SSH, or `lease: 0`). Called before anything is recorded on a host,
    so the host is also visited at this process's exit (release_all)."""
    if not isinstance(host, SshHost):
        return ""
    key = (host._key, remote_dir)
    with _LOCK:
        leases = _mine()
        if key not in _TOUCHED:
            _TOUCHED[key] = (host, remote_dir)
            if not _AT_EXIT.is_set():
                ssh_close_at_exit()  # registered first, so it runs after release_all, over open masters
                atexit.register(release_all)
                _AT_EXIT.set()
        if host.lease == 0:
            return ""
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        lease = leases.get(key)
        if lease is None:
            lease = RemoteLease(host, remote_dir)
            lease.arm()
            with _LOCK:
                leases[key] = lease
    return lease.id


def held() -> list[RemoteLease]:
    with _LOCK:
        return list(_mine().values())


def release_idle(host: SshHost, remote_dir: str) -> None:
    """Release this process's lease on `host` when nothing it covers is journalled there any more."""
    with _LOCK:
        lease = _mine().get((host._key, remote_dir))
    if lease is not None and lease.release(only_if_idle=True):
        with _LOCK:
            _mine().pop((host._key, remote_dir), None)


# The lines of `own` naming one journal's undo scripts ($2: "-<journal>-", see knobs/undo) struck out.
_HAND_OVER = 'o=$1/own; [ -f "$o" ] || exit 0; grep -v -F -e "$2" "$o" >"$o.t"; mv "$o.t" "$o"'


def hand_over(host: SshHost, remote_dir: str, marker: str) -> None:
    """Changes this process leaves in force on purpose (a persisted transaction: `lab set`, a library's
    `persist=True`) are no longer its lease's to put back: the undo scripts whose names hold `marker`
    leave its list (they stay journalled on the host, for `lab down`, `offlab restore` or restore.sh),
    and the lease is released once nothing else it covers is left, as a command's lease at its end."""
    with _LOCK:
        lease = _mine().get((host._key, remote_dir))
    if lease is None:
        return
    host.run(["sh", "-c", _HAND_OVER, "sh", lease.dir, marker], check=False, timeout=30)
    release_idle(host, remote_dir)


def release_all() -> None:
    """At exit (and at the end of a command run in a longer-lived process): every lease of this process
    released (what it left journalled on purpose stays), and on every host it reached, what of its own it
    lost track of ended (_AT_EXIT_SH): one round trip per host, all hosts at once."""
    with _LOCK:
        leases = dict(_mine())
        touched = dict(_TOUCHED)
        _LEASES.clear()
        _TOUCHED.clear()

    def release(lease: RemoteLease) -> None:
        try:
            lease.release(at_exit=True)
        except (EnvironmentProblem, CommandFailed, OSError):
            lease._halt()  # unreachable: its watchdog puts the host back once the lease lapses

    def visit(host: SshHost, remote_dir: str) -> None:
        try:
            host.run(["sh", "-c", _AT_EXIT_SH, "sh", remote_dir, "", _owner_line()], check=False, timeout=30)
        except (EnvironmentProblem, CommandFailed, OSError):
            pass  # unreachable: `offlab restore` or its restore.sh ends them later

    calls = [functools.partial(release, lease) for lease in leases.values()]
    # A host without a lease of this process is visited only when something may have been lost there: a
    # command to it was cut short, or a signal came (it may land between a command and what keeps its answer)
    lost = signalled()
    calls += [functools.partial(visit, *where) for key, where in touched.items()
              if key not in leases and (lost or cut_short(where[0]))]
    at_once(calls)  # each host's round trip at once



def renewal_note() -> str | None:
    """For a run's closing note: the renewals of this process's leases, and any that failed."""
    leases = held()
    with _LOCK:
        leases += _DONE
    if not leases:
        return None
    n = sum(l.renewals for l in leases)
    failed = sum(l.failures for l in leases)
    lost = [l.host.name for l in leases if l.lost]
    text = (f"leases: {len(leases)} host(s), lapse {', '.join(sorted({f'{l.seconds} s' for l in leases}))}; "
            f"{n} renewal(s)" + (f", {failed} failed and retried" if failed else ""))
    return text + (f"; LAPSED on {', '.join(lost)}" if lost else "")


# ---- leases of other processes, lapse records -------------------------------------------------------
def stop_orphans(host: Host, remote_dir: str, *, force: bool = False, also: frozenset[int] | set[int] = frozenset(),
                 list_only: bool = False) -> list[str]:
    """Stop the watchdogs on `host` of this machine's controllers that are gone (also of the live processes
    `also`; every one of this machine's, with `force`); this process's own and other machines' stay."""
    from offlab.state import owner_alive

    listed = host.run(["sh", "-c", _LIST, "sh", remote_dir], timeout=30).stdout
    chosen, lines = [], []
    for line in listed.splitlines():
        parts = line.split(" ", 4)
        if len(parts) < 4 or parts[1] != remote_journal.boot_id():
            continue
        try:
            pid, start = int(parts[2]), int(parts[3])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        if force or pid in also or not owner_alive({"pid": pid, "start": start}):
            chosen.append(parts[0])
            lines.append(f"stop the lease watchdog of {parts[4].strip() if len(parts) > 4 else f'pid {pid}'}")
    if chosen and not list_only:
        host.run(["sh", "-c", _STOP_MANY, "sh", remote_dir, *chosen], check=False, timeout=30)
    return lines


def lapses(host: Host, remote_dir: str, *, remove: bool = False) -> list[str]:
    """What the watchdogs on `host` restored after their controller fell silent, one line per lapse and one
    per thing restored; with `remove`, the records go (said once)."""
    res = host.run(["sh", "-c", _LAPSED, "sh", remote_dir, "remove" if remove else "keep"], check=False, timeout=30)
    return parse_lapses(host.name, res.stdout)


def parse_lapses(host_name: str, text: str) -> list[str]:
    """The lapse records `text` holds (the read above: "@@ FILE" then the record), one line per lapse and
    one per thing restored, each starting with the host's name."""
    out: list[str] = []
    record: dict[str, str] = {}
    done: list[str] = []

    def flush() -> None:
        if not record:
            return
        at = _clock(record.get("lapsed"))
        silent = _clock(record.get("silent"))
        out.append(f"{host_name}: restored by its lease at {at} after the controller ({record.get('controller', '?')}) "
                   f"fell silent at {silent}")
        out.extend(f"{host_name}:   {line}" for line in done)

    for line in text.splitlines():
        if line.startswith("@@ "):
            flush()
            record, done = {"file": line[3:]}, []
            continue
        key, _, value = line.partition(" ")
        if key in ("lapsed", "silent", "controller") and key not in record:
            record[key] = value
        elif line.strip():
            done.append(line)
    flush()
    return out


def _clock(epoch: str | None) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(int(epoch or "")))
    except ValueError:
        return "?"

