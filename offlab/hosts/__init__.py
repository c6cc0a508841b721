"""Where commands run: this machine, a network namespace, a QEMU guest, an SSH host.

Every system command offlab runs goes through a `Host`: argv lists only (never a
shell string), a timeout on every call, errors that carry the argv and stderr, and
a JSON `ref()` that lets another process reach the same host again (restore after
a crash). This package is the only place a process is started.
"""

from offlab.hosts.base import (
    DEFAULT_TIMEOUT,
    TOOL_PACKAGES,
    Host,
    NetReader,
    Process,
    Result,
    is_root,
    require_tool,
    which,
)
from offlab.hosts.memo import Memo
from offlab.hosts.refs import from_ref
from offlab.hosts.local import LOCAL, LocalHost, NetnsHost, check_netns, netns_exists
from offlab.hosts.ssh import SshHost
from offlab.hosts.guest import GuestHost

__all__ = [
    "DEFAULT_TIMEOUT", "TOOL_PACKAGES", "Host", "Memo", "NetReader", "Process", "Result", "from_ref", "is_root",
    "require_tool", "which", "LOCAL", "LocalHost", "NetnsHost", "check_netns",
    "netns_exists", "SshHost", "GuestHost",
]
