"""The guest's own files: inittab, the boot script, and the script that starts the command agent.

The agent is `offlab-agent` (engine/src/agent.rs, built by `make install` and shipped like
offlab-engine): a persistent process that holds the virtio-serial port named `ctl` and speaks the
line protocol `offlab.hosts.guest` speaks on the host side:

    host → guest   Q <id> <base64 of the shell-quoted argv> <base64 of stdin, or ->
                   K <id>                       kill the process group of a running command
                   P <id>                       echo: answered `R <id> 0` at once (the channel alone)
                   F <id> <op> ...              file operations in the agent's own process (no fork):
                                                r:<b64 path>, w:<b64 path>:<b64 data>, e:<b64 path>,
                                                t:<b64 path>:<ms> (wait until it exists)
    guest → host   O <id> <base64 of stdout>    E <id> <base64 of stderr>    R <id> <exit code>
                   A <id> <result> ...          one per op: `0:<b64 data>` or `<errno>:`

A `Q` runs `/bin/sh -c` (dash: busybox's shell would prefer its own `ip` and `tc` applets to the
real iproute2 binaries whatever PATH says) in a new session, on a thread of the agent, with stdin,
stdout and stderr in memory files; every request has its own thread, so a slow one holds up
nothing, and an answer is written whole under one lock. A host that gave up on a command sends
`K`; the late answer then carries an id nobody waits for and is dropped. The port reads EOF while
no host is connected (the agent looks again every 20 ms); commands never inherit it, since the
port opens exclusively. Everything runs at the agent's own priority: an agent at nice −20 let its
plumbing take the vCPU from the traffic being measured.
"""

from __future__ import annotations

PORT_NAME = "ctl"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The kernel runs the boot script as PID 1 (`rdinit=/etc/offlab/rc`, offlab.vm.qemu.INIT_ARG), which
# ends by exec'ing busybox init: one process fewer than init forking it as `sysinit` and waiting.
INITTAB = """\
::respawn:/etc/offlab/agent
"""

# /etc/fstab for the boot script's `mount -a`: one process instead of one per file system.
FSTAB = """\
proc /proc proc defaults 0 0
sysfs /sys sysfs defaults 0 0
devpts /dev/pts devpts defaults 0 0
tmpfs /dev/shm tmpfs defaults 0 0
tmpfs /tmp tmpfs defaults 0 0
tmpfs /run tmpfs defaults 0 0
"""

# Every process the boot script starts costs tens of ms under TCG: shell builtins where they do.
RC = f"""#!/bin/busybox sh
# Boot, as PID 1: file systems, the modules of /etc/offlab/modules (in load order), loopback; then
# busybox init (/init) takes PID 1 over: it starts and respawns the agent and reaps orphans.
export PATH={GUEST_PATH}
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -a
mkdir -p /run/agent /root
while read -r m; do
  [ -n "$m" ] && {{ insmod "/lib/modules/offlab/$m.ko" || echo "offlab: insmod $m failed"; }}
done </etc/offlab/modules
echo offlab-guest >/proc/sys/kernel/hostname
ip link set lo up
read -r up _ </proc/uptime
echo "offlab: booted in $up s"
exec /init
"""

AGENT = f"""#!/bin/busybox sh
# The command agent (engine/src/agent.rs; protocol: offlab/vm/guestfs.py). init respawns it.
export PATH={GUEST_PATH} HOME=/root
cd /root
exec /usr/bin/offlab-agent
"""
