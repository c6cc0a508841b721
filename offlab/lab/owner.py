"""Who owns a lab namespace: the state directory of the offlab that created it.

Two marks, because either alone can be lost or faked by accident:

- in the namespace itself, the alias of its `lo` (`ip -n NS link set lo alias
  offlab-owner=<state dir>`). It lives and dies with the namespace, needs no file
  under /run/netns or anywhere else, any tool shows it (`ip -n NS link show lo`), and
  a second offlab with another `OFFLAB_STATE_DIR` reads it before touching anything.
- in the lab's state file, the namespace's inode (its nsfs identity). A namespace
  deleted and re-made under the same name by someone else has another inode, so the
  state file alone never vouches for it.

A namespace is ours when its alias names our state directory, or when it carries
no alias at all but our state file recorded it (killed between `ip netns add` and
the alias) and its inode, if recorded, still matches. Links live inside the
namespaces, and daemons run in them with their run directory under the state
directory, so both are owned through their namespace.
"""

from __future__ import annotations

import hashlib
import os

from offlab import netdev
from offlab.hosts import LOCAL
from offlab.hosts.local import NETNS_DIR, check_netns
from offlab.state import state_dir

PREFIX = "offlab-owner="
ALIAS_MAX = 255  # IFALIASZ - 1


def owner_tag() -> str:
    """The alias that marks a namespace as made from this state directory."""
    path = str(state_dir().resolve())
    tag = PREFIX + path
    if len(tag.encode()) > ALIAS_MAX:
        # Too long to name in full: a digest still tells two state dirs apart.
        tag = PREFIX + "sha256:" + hashlib.sha256(path.encode()).hexdigest()
    return tag


def mark(ns: str) -> None:
    """Write our owner mark into namespace `ns`."""
    LOCAL.run(["ip", "-n", check_netns(ns), "link", "set", "dev", "lo", "alias", owner_tag()])


def inode(ns: str) -> int | None:
    """The namespace's identity (inode of its nsfs file), None if it does not exist."""
    try:
        return os.stat(os.path.join(NETNS_DIR, check_netns(ns))).st_ino
    except OSError:
        return None


def half_made(ns: str) -> bool:
    """`ns`'s file under /run/netns exists but no namespace is mounted on it: `ip netns add` creates
    the file, then bind-mounts the new namespace on it, and was killed in between (a signal during
    `lab up`). Nothing can enter it; it only blocks a namespace of that name until removed."""
    path = os.path.join(NETNS_DIR, check_netns(ns))
    try:
        # A mounted namespace is an nsfs inode: its device is not the directory's own.
        return os.lstat(path).st_dev == os.stat(NETNS_DIR).st_dev
    except OSError:
        return False


def remove_half_made(ns: str) -> None:
    """Remove `ns`'s file under /run/netns, if it is still one with no namespace on it."""
    if half_made(ns):
        try:
            os.unlink(os.path.join(NETNS_DIR, check_netns(ns)))
        except FileNotFoundError:
            pass


def owner_of(ns: str) -> str | None:
    """The state directory named by `ns`'s mark; "" when unmarked; None when `ns` is gone."""
    try:
        lo = netdev.find_link(LOCAL, "lo", netns=check_netns(ns))
    except ValueError:  # not JSON
        return ""
    if lo is None:
        return None
    alias = lo.ifalias
    return alias[len(PREFIX):] if alias.startswith(PREFIX) else ""


def is_ours(ns: str, recorded: list[str], inodes: dict[str, int]) -> bool | None:
    """True if this state directory made `ns`, False if not, None if `ns` does not exist."""
    owner = owner_of(ns)
    if owner is None:
        return None
    if owner:
        return PREFIX + owner == owner_tag()
    if ns not in recorded:
        return False
    want = inodes.get(ns)
    return want is None or want == inode(ns)
