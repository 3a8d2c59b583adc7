"""Open-file room for rank 0: the soft ``RLIMIT_NOFILE`` raised at start, descriptors kept for the filesystem.

Rank 0 holds one socket per member, and anyone who can reach its port can open more; its own
filesystem calls (listings, claim reads, beacons) must never meet EMFILE because of them.  The
soft limit is raised towards the hard one when rank 0 starts listening
(:func:`ensure_fd_capacity`), and :class:`fsmingle.net.channel.Hub` never holds more
connections than that limit less what the process holds and :data:`FD_RESERVE`.
"""

from __future__ import annotations

import os
import resource

from ..errors import ConfigError

# Descriptors rank 0 keeps for everything but its connections: the process's own files (counted
# at the hub's start) plus this many for the filesystem -- a listing, a claim read, a beacon's
# temporary file, a log -- so that a crowd of clients never makes the store meet EMFILE.
FD_RESERVE = 64
# The soft open-file limit rank 0 raises itself to (never above the hard limit), unless its world
# needs more: enough for a flood of connections beside its members, not so many that the
# training it execs inherits a limit of a million (some programs close every descriptor up to it).
FD_SOFT_TARGET = 1 << 16


def ensure_fd_capacity(needed: int) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` towards the hard limit: ``needed`` member connections must fit,
    and as many more as the hard limit allows (up to :data:`FD_SOFT_TARGET`) for the connections of
    others, which rank 0 sheds (:class:`Hub` never accepts past its room, ``Hub.room``).

    Many Linux systems default the soft limit to 1,024 while the hard limit is far higher; rank 0
    holds one socket per member, and a flood of connections must not push its own filesystem calls
    into EMFILE.

    Raises:
        ConfigError: even the hard limit is too low for ``needed`` members; says what to do.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 2 * FD_RESERVE  # the process's own files, the store, the listener, some room
    if hard != resource.RLIM_INFINITY and want > hard:
        raise ConfigError(
            f"rank 0 must hold {needed} member connections but the open-file limit is {hard} (hard); "
            "raise it (`ulimit -Hn`, limits.conf, or LimitNOFILE= in the unit) or use node mode "
            "(one participant per node, --nnodes) so that fewer processes rendezvous"
        )
    target = max(want, FD_SOFT_TARGET)
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # a container that refuses: the hub sheds clients within `soft`
            if want > soft:
                raise ConfigError(
                    f"rank 0 must hold {needed} member connections but cannot raise its open-file "
                    f"limit above {soft}; raise it (`ulimit -n`) before starting"
                ) from None


def open_fds() -> int:
    """Descriptors this process holds now (/proc/self/fd; 32 where it cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 32


def connection_room() -> int:
    """Connections a hub may hold (int): the soft open-file limit less the descriptors held now and
    :data:`FD_RESERVE` for the filesystem, at least 8."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    return max(8, soft - open_fds() - FD_RESERVE)
