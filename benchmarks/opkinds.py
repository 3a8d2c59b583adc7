"""The categories of filesystem operations both the real harness and the simulator count.

One list, so that :mod:`benchmarks.rdzv.fsops` (counting wrapper around ``os``) and
:mod:`benchmarks.sim.mds` (simulated metadata server) account the same way and
``tests/test_simulator.py`` can compare their counts kind by kind.
"""

from __future__ import annotations

KINDS = (
    "create",
    "open",
    "readdir",
    "entries",
    "read",
    "write",
    "fsync",
    "stat",
    "rename",
    "link",
    "unlink",
    "mkdir",
    "rmdir",
    "close",
)
#: Counted but not requests of their own: directory entries are a cost inside a readdir, and a
#: close is not sent to an NFS/Lustre server as an operation (close-to-open flushes ride on it).
NOT_REQUESTS = ("entries", "close")
#: Operations the (metadata) server sees.
SERVER_KINDS = tuple(k for k in KINDS if k not in NOT_REQUESTS)
#: The operations issue 13's "≤ 10 per participant per generation" target counts.
ISSUE13_KINDS = ("create", "open", "readdir", "rename", "link")
#: Metadata operations (what an NFS/Lustre metadata server serves).
METADATA = ("create", "open", "readdir", "stat", "rename", "link", "unlink", "mkdir", "rmdir")


def fs_ops(c: dict) -> int:
    """Filesystem operations in a counts dict ``{kind: count}``: every kind of :data:`KINDS` but
    :data:`NOT_REQUESTS`; keys that are not kinds (messages, connects) are ignored."""
    return sum(c.get(k, 0) for k in SERVER_KINDS)


def metadata_ops(c: dict) -> int:
    """Metadata operations in a counts dict: creates, lookups/opens, listings, stats, renames,
    links, unlinks, mkdir/rmdir."""
    return sum(c.get(k, 0) for k in METADATA)
