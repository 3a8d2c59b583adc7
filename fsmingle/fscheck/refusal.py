"""Refusing a directory where no rank claim can be exclusive (exit 10), and the message that says so.

:func:`require_claimable` is called once per process before anything is claimed
(:func:`fsmingle.api.rendezvous`); the store (:mod:`fsmingle.store`) refuses with the same
:func:`refusal_message` when link() fails that way later.  The link() probe decides, not the
type string: s3fs mounted with ``-o fsname=X`` shows as plain ``fuse`` in
/proc/self/mountinfo, and bindfs or MooseFS look the same.

Sources: link(2) and open(2) (``O_EXCL`` is not exclusive across object-store mounts, measured
in ``docs/filesystems/object-store-fuse.md``).
"""

from __future__ import annotations

import errno
import os

from ..errors import StorageError, UnsupportedFilesystemError
from .mounts import MountInfo, find_mount
from .probes import LinkProbe, probe_link

# errno values of link() that mean "this filesystem has no hard links" (link(2)): EPERM "the
# filesystem does not support the creation of hard links", EOPNOTSUPP/ENOTSUP (s3fs, gcsfuse),
# ENOSYS (a FUSE daemon without a link handler), EXDEV (a union/overlay that splits one directory
# across filesystems).  Any of them: no exclusive claim is possible, and O_EXCL is no substitute
# (s3fs: two mounts both "won" 100 of 100 O_EXCL races here).
REFUSE_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})

_probe_cache: dict[str, LinkProbe] = {}


def refusal_message(directory: str, why: str, m: MountInfo | None = None) -> str:
    """The one-paragraph refusal: which filesystem, why no exclusive claim, what to use instead."""
    if m is None:
        try:
            m = find_mount(directory)
        except StorageError:
            m = None
    fs = m.describe() if m else "its filesystem"
    return (
        f"{directory} is on {fs}: {why}. fsmingle claims a rank with link(), the only exclusive "
        f"create that works across nodes here, and will not fall back to O_CREAT|O_EXCL, which "
        f"object-store and some FUSE filesystems do not make exclusive across mounts (two nodes "
        f"could both hold one rank). Use a POSIX shared filesystem for --dir (NFS, Lustre, GPFS, "
        f"CephFS, GlusterFS, MooseFS, BeeGFS); `fsmingle check --dir DIR` tells whether one is usable"
    )


def require_claimable(directory: str) -> None:
    """Refuse a directory where no exclusive claim is possible; at most one probe per process
    and directory (the answer is cached: a filesystem does not gain or lose hard links mid-run).

    Raises:
        UnsupportedFilesystemError: link() fails with EPERM/EOPNOTSUPP/ENOSYS/EXDEV or does not
            yield a link count of 2.  Other errors (EACCES, EROFS, ENOSPC) are left to the
            store, which reports them as StorageError when it first writes.
    """
    key = os.path.realpath(directory)
    res = _probe_cache.get(key)
    if res is None:
        try:
            res = probe_link(directory)
        except OSError:
            return
        _probe_cache[key] = res
    if res.ok or (res.errno is not None and res.errno not in REFUSE_ERRNOS):
        return
    try:
        m = find_mount(directory)
    except StorageError:
        m = None
    raise UnsupportedFilesystemError(
        refusal_message(directory, f"it cannot hold an exclusive claim ({res.detail})", m),
        fstype=m.fstype if m else "",
        source=m.source if m else "",
        mount_point=m.mount_point if m else "",
    )
