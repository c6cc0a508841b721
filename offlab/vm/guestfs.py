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
# The command agent (engine/src/agent.rs; protocol: offlab/vm/guestfs.py). init respawns it.
export PATH={GUEST_PATH} HOME=/root
cd /root
exec /usr/bin/offlab-agent
"""
