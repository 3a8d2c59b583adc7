"""Opening a job directory: ``<dir>/<job_id>/``, checked to be safe before anything is read or written.

``--dir`` must exist (fsmingle never creates it: a typo must not become a new rendezvous), be
a directory, and not be writable by others without the sticky bit; the job directory is made
owner-only (0700) and must be ours, not a symlink.  Each refusal names what is wrong and what
to do (exit 4 or 5).  The result is a :class:`fsmingle.fs.store.PosixStore` rooted there.
"""

from __future__ import annotations

import logging
import os
import stat

from ..errors import FsmingleError, StorageError, UnsafeDirectoryError
from .fscheck.families import family, gluster_nl_cache_warning
from .mounts import find_mount
from .store import PosixStore, stat_existing, storage_error

log = logging.getLogger("fsmingle.store")


def open_job_dir(base: str, job_id: str, *, create_base: bool = True) -> PosixStore:
    """Validate ``base``, create ``base/job_id`` owner-only if needed, and return its store.

    ``fsmingle run``/``env`` and :func:`fsmingle.rendezvous` pass
    ``create_base=False``: a ``--dir`` that does not exist on one node is
    usually a typo or a missing mount, and creating it would leave that node
    waiting alone until its timeout.  With ``create_base=True`` (the torchrun
    backend's documented behaviour) ``base`` is created mode 0700 when its
    parent exists, like ``mkdir`` without ``-p``.

    Args:
        base (str): the rendezvous directory (``--dir``), shared by all nodes.
        job_id (str): an already validated job id (see :func:`fsmingle.fs.layout.validate_job_id`).
        create_base (bool): create ``base`` (not its parents) if it is missing.

    Returns:
        PosixStore: rooted at ``base/job_id``.

    Raises:
        StorageError: ``base`` is missing (and not to be created) or its parent
            is missing, ``base`` is not a directory, or it cannot be written
            (permissions, read-only, full); or the mount does not answer (any other
            ``OSError``: ETIMEDOUT, ENOTCONN, EIO), its errno kept in ``.errno``.
        UnsafeDirectoryError: ``base`` is group- or world-writable without the
            sticky bit, or the job directory is a symlink, not owned by you, or
            group- or world-writable.
    """
    base = os.path.abspath(base)
    try:
        return _open_job_dir(base, job_id, create_base)
    except FsmingleError:
        raise
    except OSError as e:
        # A mount that does not answer -- ETIMEDOUT from a JuiceFS client that lost its metadata
        # engine (CI, stop 35), ENOTCONN from a dead FUSE client, EIO -- or a directory removed
        # under us used to escape as a raw traceback before the node had said anything; it is
        # the node's storage (exit 5).
        raise storage_error(e, "open the rendezvous directory", e.filename or base) from None


def _open_job_dir(base: str, job_id: str, create_base: bool) -> PosixStore:
    try:
        st = os.stat(base)
    except FileNotFoundError:
        parent = os.path.dirname(base)
        if not os.path.isdir(parent):
            raise StorageError(
                f"--dir {base}: its parent {parent} does not exist; is the shared filesystem mounted on this node?"
            ) from None
        if not create_base:
            raise StorageError(
                f"--dir {base} does not exist; create it once on the shared filesystem (`mkdir -m 700 {base}`), "
                "or check --dir for a typo: fsmingle does not create it, so that a wrong path fails at once"
            ) from None
        try:
            os.mkdir(base, 0o700)
            # mkdir's mode is filtered by the umask; a 0700 request can only lose bits, never gain them.
        except FileExistsError:
            pass  # another node made it first; stat_existing below sees it even so
        except OSError as e:
            raise storage_error(e, "create directory", base) from None
        st = stat_existing(base, follow=True)
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(f"--dir {base} is not a directory; point --dir at a directory on the shared filesystem")
    # Whoever may write to base may rename our job directory away and put their own in its
    # place (rename(2) needs write access to the parent only); the sticky bit forbids that
    # for entries they do not own (unlink(2)/rename(2), EPERM).
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(
            f"--dir {base} is world-writable without the sticky bit: anyone could replace your job "
            f"directory; use a directory of your own, or `chmod +t {base}`"
        )
    if st.st_mode & stat.S_IWGRP and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(
            f"--dir {base} is group-writable without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o}): other "
            f"members of its group could replace your job directory; `chmod g-w {base}`, `chmod +t {base}`, "
            "or use a directory of your own"
        )
    nl_cache = negative_lookup_cache_warning(base)
    jd = os.path.join(base, job_id)
    try:
        os.mkdir(jd, 0o700)  # owner-only: other users of shared scratch cannot plant beacons
    except FileExistsError:
        # Another node made it first (or a re-run): stat_existing makes sure a negative
        # lookup cache does not hide it from this node for a minute.
        try:
            stat_existing(jd)
        except FileNotFoundError:
            raise StorageError(
                f"job directory {jd} was removed while this node was creating it (a `fsmingle clean` "
                "at the same moment?); start this node again"
                + (f"; or this node's cache still hides it: {nl_cache}" if nl_cache else "")
            ) from None
    except OSError as e:
        raise storage_error(e, "create job directory", jd) from None
    check_owned_dir(jd, what="job directory")
    if not os.access(jd, os.W_OK | os.X_OK):
        raise StorageError(f"cannot write job directory {jd}: permission denied; use a directory you can write")
    return PosixStore(jd)


_NL_CACHE_WARNED: dict[str, str | None] = {}


def negative_lookup_cache_warning(base: str) -> str | None:
    """The start-up probe of a GlusterFS client's negative-lookup cache (nl-cache): once per mount
    and process, warn with the exact ``gluster volume set`` that turns it off; returns that line.

    nl-cache can hide a name this node lost a create race for (it cached the ENOENT of the
    kernel's lookup just before the create; ``fscheck.families.gluster_caches`` says why, from
    GlusterFS's source).  :func:`~fsmingle.fs.store.stat_existing` and the protocol's listings work
    around it, but a job directory raced into existence by several nodes can still fail on one of
    them.  Costs one read of /proc/self/mountinfo, and on GlusterFS one listing of the client's
    ``.meta``.
    """
    try:
        m = find_mount(base)
    except (OSError, StorageError):  # no /proc/self/mountinfo: nothing to tell
        return None
    if m.mount_point not in _NL_CACHE_WARNED:
        warn = gluster_nl_cache_warning(m.mount_point) if family(m) == "glusterfs" else None
        _NL_CACHE_WARNED[m.mount_point] = warn
        if warn:
            log.warning("%s", warn)
    return _NL_CACHE_WARNED[m.mount_point]


def check_owned_dir(path: str, what: str = "directory") -> None:
    """Raise :class:`UnsafeDirectoryError` unless ``path`` is a real directory of ours, not group/world-writable."""
    st = os.lstat(path)
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectoryError(f"{what} {path} is a symlink; fsmingle never follows it. Remove it and retry")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{what} {path} is not a directory; remove it and retry")
    if st.st_uid != uid:
        raise UnsafeDirectoryError(
            f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {uid}); another user may have "
            "created it to redirect your job: choose another --job-id or --dir"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectoryError(
            f"{what} {path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}): others could plant "
            f"beacons there; run `chmod go-w {path}` or remove it"
        )
