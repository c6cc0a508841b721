"""The guest's own files: inittab, the boot script and the command agent (busybox sh).

The agent speaks the line protocol that `offlab.hosts.guest` speaks on the host side, over the
virtio-serial port named `ctl`:

    host → guest   Q <id> <base64 of the shell-quoted argv> <base64 of stdin, or ->
                   K <id>                       kill the process group of a running command
                   P <id>                       echo: answered `R <id> 0` at once (the channel alone)
    guest → host   O <id> <base64 chunk of stdout>     (any number, in order)
                   E <id> <base64 chunk of stderr>
                   R <id> <exit code>                  last line of one answer

Each command runs in its own background job, so a slow command never holds up the others; the
answer is written one line per write() (shell builtins only), so answers of concurrent jobs
interleave only at line boundaries and every line names its id. Forks are what a command costs
under TCG, so a job makes few (decode, setsid, base64 only for non-empty output, rm); an answer
of up to 30,000 base64 characters goes as one line. A host that gave up on a command sends `K`; the late
answer then carries an id nobody waits for and is dropped. The port reads EOF while no host is
connected, hence the outer loop; commands never inherit fd 3, since the port opens exclusively.
Every command runs at the agent's own priority: running the agent at nice −20 (so that a counter
read would overtake the traffic) let its plumbing take the vCPU from the traffic being measured,
and on a loaded host did not make the reads answer sooner (the host's CPUs were the limit).
Commands run under /bin/sh = dash, not busybox's shell, which would prefer its own `ip` and `tc`
applets to the real iproute2 binaries whatever PATH says.
"""

from __future__ import annotations

PORT_NAME = "ctl"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

INITTAB = """\
::sysinit:/etc/offlab/rc
::respawn:/etc/offlab/agent
"""

RC = f"""#!/bin/busybox sh
# Boot: file systems, the modules of /etc/offlab/modules (in load order), loopback.
export PATH={GUEST_PATH}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/agent /root
while read -r m; do
  [ -n "$m" ] && {{ insmod "/lib/modules/offlab/$m.ko" || echo "offlab: insmod $m failed"; }}
done </etc/offlab/modules
hostname offlab-guest
ip link set lo up
echo "offlab: booted in $(cut -d' ' -f1 /proc/uptime) s"
"""

AGENT = f"""#!/bin/busybox sh
# The command agent: see offlab/vm/guestfs.py for the protocol.
export PATH={GUEST_PATH} HOME=/root
cd /root
port=
while [ -z "$port" ]; do
  for n in /sys/class/virtio-ports/*/name; do
    [ "$(cat "$n" 2>/dev/null)" = {PORT_NAME} ] && {{ d=${{n%/name}}; port=/dev/${{d##*/}}; }}
  done
  [ -n "$port" ] && [ -e "$port" ] || {{ port=; sleep 0.1; }}
done
exec 3<>"$port"
echo "READY $(cut -d' ' -f1 /proc/uptime) $port"

# One line, one write(), when the answer fits a virtio-serial write (32 KiB): the shell's `read` takes
# a system call per byte, which under TCG on a loaded host cost ~0.3 s per KiB of answer.
say() {{
  l=$(base64 -w 0 "$2")
  if [ ${{#l}} -le 30000 ]; then echo "$1 $id $l"
  else base64 "$2" >"$d.b"; while read -r l; do echo "$1 $id $l"; done <"$d.b"; fi
}}

job() {{
  id=$1; d=/run/agent/$1
  base64 -d >"$d.c" <<EOF
$2
EOF
  IFS= read -r -d '' cmd <"$d.c"
  in=/dev/null
  if [ "$3" != - ]; then
    base64 -d >"$d.i" <<EOF
$3
EOF
    in=$d.i
  fi
  setsid /bin/sh -c "$cmd" <"$in" >"$d.o" 2>"$d.e" 3>&- &
  echo $! >"$d.p"
  wait $!; rc=$?
  {{
    if [ -s "$d.o" ]; then say O "$d.o"; fi
    if [ -s "$d.e" ]; then say E "$d.e"; fi
    echo "R $id $rc"
  }} >&3
  rm -f "$d.c" "$d.i" "$d.o" "$d.e" "$d.p" "$d.b"
}}

while :; do
  while read -r t id a b <&3; do
    jobs >/dev/null  # reaps finished jobs (a non-interactive ash does not on its own)
    case $id in ''|*[!0-9a-z]*) continue ;; esac
    case $t in
      Q) job "$id" "$a" "$b" & ;;
      K) p=$(cat "/run/agent/$id.p" 2>/dev/null) && kill -9 "-$p" 2>/dev/null ;;
      P) echo "R $id 0" >&3 ;;
    esac
  done
  sleep 0.2
done
"""
