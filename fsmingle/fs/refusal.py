"""Refusing a directory where no rank claim can be exclusive (exit 10), and the message that says so.

The first claim of a rendezvous is the probe: :meth:`fsmingle.fs.store.PosixStore.create` links a
complete temp file onto the claim's name, and refuses with :func:`unsupported` when link() fails
with an errno of :data:`REFUSE_ERRNOS` or succeeds without a link count of 2.  Nothing is claimed
then (the link failed, or its copy is removed).  A separate probe before the claim would cost
every process six more filesystem operations (create, write, link, stat, two unlinks) for an answer
the claim gives anyway: at 32,768 ranks, half a minute of a 5,000 op/s metadata server.
``fsmingle check`` still probes on its own (:func:`fsmingle.fs.fscheck.probe_link`).  link() decides,
not the type string: s3fs mounted with ``-o fsname=X`` shows as plain ``fuse`` in
/proc/self/mountinfo, and bindfs or MooseFS look the same.

Sources: link(2) and open(2) (``O_EXCL`` is not exclusive across object-store mounts, measured
in ``docs/filesystems/object-store-fuse.md``).
"""

from __future__ import annotations

import errno

from ..errors import StorageError, UnsupportedFilesystemError
from .mounts import MountInfo, find_mount


def errno_name(code: int) -> str:
    """Symbolic name of an errno value; 95 is EOPNOTSUPP (= ENOTSUP on Linux), as link(2) names it."""
    return "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, str(code))


# errno values of link() that mean "this filesystem has no hard links" (link(2)): EPERM "the
# filesystem does not support the creation of hard links", EOPNOTSUPP/ENOTSUP (s3fs, gcsfuse),
# ENOSYS (a FUSE daemon without a link handler), EXDEV (a union/overlay that splits one directory
# across filesystems).  Any of them: no exclusive claim is possible, and O_EXCL is no substitute
# (s3fs: two mounts both "won" 100 of 100 O_EXCL races here).
REFUSE_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})


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


def unsupported(directory: str, why: str) -> UnsupportedFilesystemError:
    """The error for a directory where link() cannot make an exclusive claim (exit 10).

    Args:
        directory (str): the job directory.
        why (str): what link() did, e.g. ``"link() fails there with EOPNOTSUPP (...)"``.

    Returns:
        UnsupportedFilesystemError: with the refusal message and the mount's type, source and
        mount point (empty where /proc/self/mountinfo does not say).
    """
    try:
        m = find_mount(directory)
    except StorageError:
        m = None
    return UnsupportedFilesystemError(
        refusal_message(directory, f"{why}, so it cannot hold an exclusive claim", m),
        fstype=m.fstype if m else "",
        source=m.source if m else "",
        mount_point=m.mount_point if m else "",
    )
