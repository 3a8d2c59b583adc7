"""Which mount a path lives on: /proc/self/mountinfo parsed into :class:`MountInfo`.

:func:`find_mount` reads mountinfo only and never stat()s a mount point: a hung
network client (NFS server gone, FUSE daemon stuck) would hang the caller.
The family of a mount (NFS, Lustre, object store...) is :mod:`.families`' job.

Source: proc(5), the fields of /proc/[pid]/mountinfo and their octal escapes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import StorageError


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/self/mountinfo (proc(5)): the mount a path lives on.

    Attributes:
        mount_point (str): where it is mounted.
        fstype (str): filesystem type (``nfs4``, ``lustre``, ``fuse.glusterfs``, ``fuse``...).
        source (str): mount source (``server:/export``, ``mfs#host:port``, the backing dir of bindfs).
        options (dict[str, str]): per-mount and superblock options merged (``"actimeo": "60"``;
            flags map to ``""``).
        device (str): ``MAJOR:MINOR``; for FUSE the minor is the connection number in /sys/fs/fuse/connections.
    """

    mount_point: str
    fstype: str
    source: str
    options: dict = field(default_factory=dict)
    device: str = ""

    def describe(self) -> str:
        return f"{self.fstype} filesystem {self.source!r} mounted at {self.mount_point}"


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline, backslash and '#' as \ooo octal (proc(5))
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _parse_options(*groups: str) -> dict:
    opts: dict = {}
    for g in groups:
        for o in g.split(","):
            if o:
                k, _, v = o.partition("=")
                opts[k] = v
    return opts


def find_mount(path: str, mountinfo: str = "/proc/self/mountinfo") -> MountInfo:
    """The mount that ``path`` lives on: the longest mount point that prefixes its real path;
    among equal ones the last line (the mount on top).  Reads mountinfo only, never stat()s a
    mount point (a hung network client would hang us).

    Raises:
        StorageError: mountinfo cannot be read (not Linux, /proc not mounted).
    """
    real = os.path.realpath(path)
    best: MountInfo | None = None
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise StorageError(f"cannot read {mountinfo} to tell which filesystem {path} is on: {e.strerror}") from None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        mp = _unescape(a[4])
        if not (real == mp or mp == "/" or real.startswith(mp.rstrip("/") + "/")):
            continue
        if best is None or len(mp) >= len(best.mount_point):
            best = MountInfo(mp, b[0], _unescape(b[1]), _parse_options(a[5], b[2] if len(b) > 2 else ""), a[2])
    if best is None:
        raise StorageError(f"no mount found for {path} in {mountinfo}")
    return best
