"""Lookups that lie: a client's cache says a name is missing that the server has (a create race lost).

Two cures, both for a name the caller knows exists: :func:`stat_existing` (GlusterFS's nl-cache: a listing
of the parent) and :func:`refresh` (a kernel negative dentry: an exclusive create, which revalidates it).
And :func:`dir_signature` and :func:`link_count`: attributes read past the client's attribute cache.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import time

from ..errors import CorruptStateError

STAT_EXISTING_TRIES = 6  # lookups (each after a listing of the parent) before stat_existing gives up


def stat_existing(path: str, *, follow: bool = False) -> os.stat_result:
    """``lstat`` (or ``stat``) a name the server has just said exists (a create answered EEXIST).

    When this client lost a create race, the kernel looked the name up just before asking the
    server to create it, and on GlusterFS that lookup's ENOENT stays in the client's negative
    lookup cache (nl-cache, for ``performance.nl-cache-timeout``: 60.7 s measured on the
    ``nfs60`` profile): the name the winner just made is "missing" by name on this client for
    a minute, though ``mkdir`` said it exists.  So an ENOENT here is answered by one listing of
    the parent, which the server answers and which links every listed name into the client's
    inode table, which nl-cache consults first (``nlc_lookup`` in GlusterFS
    ``xlators/performance/nl-cache``), then one more lookup.  Measured: the race loser's
    ``stat`` went from ENOENT to found at once after the listing
    (``tests/test_realfs.py::test_create_race_loser_finds_the_winners_name``).  NFS needs no
    cure (an exclusive create skips the lookup: ``nfs_lookup`` in Linux ``fs/nfs/dir.c``).  Cost: only
    on the losing path, one lookup (``mkdir``'s EEXIST path already made it); listings and further
    lookups only while the lookup lies.

    Args:
        path (str): the name that exists.
        follow (bool): follow a final symlink (``stat``) instead of ``lstat``.

    Returns:
        os.stat_result: of ``path``.

    Raises:
        FileNotFoundError: ``path`` is still missing after :data:`STAT_EXISTING_TRIES` lookups,
            each after a listing of the parent (about 1.5 s: removed since).
        OSError: any other error of ``stat``/``lstat`` (EIO only if every lookup answered it).
    """
    look = os.stat if follow else os.lstat
    pause = 0.05
    for _ in range(STAT_EXISTING_TRIES - 1):
        try:
            return look(path)
        except OSError as e:
            # EIO too: GlusterFS (tuned profile, upcalls on) answered EIO to the race loser's lookup
            # of the name the winner had just made, once in a full test run -- the same moment
            # that answers EIO to a racing mkdir (PosixStore.mkdir).  A lookup that keeps failing
            # is reported by the last try below.
            if e.errno not in (errno.ENOENT, errno.EIO):
                raise
            try:
                os.listdir(os.path.dirname(path) or ".")
            except OSError:
                pass  # the last lookup reports what is wrong
        # Usually the first listing cures it; once in a full test run on GlusterFS nfs60 it did
        # not, so look again a few times (about 1.5 s in all) before calling the name gone.
        time.sleep(pause)
        pause *= 2
    return look(path)


_refreshed: set[str] = set()  # paths refresh()ed by this process (refresh)


def refresh(path: str) -> bool:
    """Make this client's next lookup of ``path`` -- a name the caller knows exists (it lies below a version
    of its own in a log without gaps, or a ``link()`` there answered EEXIST) -- ask the server, without
    waiting out a negative dentry of it.

    Why: a FUSE mount keeps a lookup's ENOENT as a negative dentry for ``negative_timeout`` (bindfs, the
    benchmark's 2 s): our ``link()`` into a slot another mount filled between the kernel's lookup and the
    ``LINK`` leaves one (EEXIST, the dentry stays negative) and a read of that name then says ENOENT for up to
    2 s.  A listing does not cure it here: bindfs 1.14 is built on libfuse 2, whose high-level API has no
    READDIRPLUS (with it, ``fuse_direntplus_link`` in Linux ``fs/fuse/dir.c`` would replace the negative dentry
    it meets); measured, the name stayed missing 2.0 s after a listing.  An exclusive create does:
    ``fuse_dentry_revalidate`` (same file) does a fresh lookup for a lookup flagged ``LOOKUP_EXCL`` ("For
    negative dentries, always do a fresh lookup"), which ``mkdir`` is -- the dentry turns positive and
    ``mkdir`` answers EEXIST without a ``MKDIR``: one ``LOOKUP`` (measured: visible at once).  NFS: with
    ``lookupcache=positive`` or ``none`` no negative entry is kept; with ``all`` a negative entry is dropped
    when the directory's change attribute moves (``nfs_neg_need_reval``, ``fs/nfs/dir.c``), so this costs one
    ``MKDIR`` answered EEXIST.  Lustre revalidates a dentry under the directory's LDLM lock, which another
    client's create cancels: nothing to cure, one RPC.

    The ``mkdir`` must never succeed: a directory at a free name would stand where a file belongs (a FolderStore
    version).  It cannot, for FolderStore's callers (``FolderKV._unreadable``, versions only): every name they pass
    was listed, answered EEXIST to a ``link()``, was seen or written by this process, or lies below such a version
    -- an epoch's versions have no gaps, as version m is linked only after m-1 was read, listed or answered
    EEXIST -- and versions are never removed but with their whole epoch (a ``rename()`` into the trash, its files
    kept ``retire_grace``; epoch names are never reused).  So the name exists at its path (EEXIST), or its epoch
    is gone from the path (ENOENT), or this client reaches the retired epoch by a cached handle (FUSE GlusterFS,
    NFS), where a sealed epoch's names are all kept (EEXIST).  A ``mkdir`` that succeeds proves the store damaged
    (a version unlinked by hand, the store removed while in use and made again): it is undone at once and, if the
    name's directory is still listed in its parent, :class:`~fsmingle.errors.CorruptStateError` says so -- else
    (a retired directory reached by a cached handle, its kept files swept) the caller finds it gone.  A concurrent
    ``link()`` into that name between the ``mkdir`` and its undoing (only in such a damaged store) sees EEXIST:
    FolderStore then reads a directory there (``Store.read`` answers it untrusted: CorruptStateError) or, once
    undone, nothing -- and its own ``refresh`` of the name raises this error.  A delta add that moved past it
    left a gap whose readers raise this error likewise: every path ends in the error, none in a wrong answer.
    Other errors of ``mkdir`` are ignored: the caller's next read says what is wrong.

    Returns:
        bool: True if refreshed now; False if ``path`` was refreshed before in this process (a name that exists is
        never looked up missing again: what still hides it is another cache, for the caller to wait out).

    Raises:
        CorruptStateError: ``path`` was missing while its directory is still in place (the ``mkdir`` succeeded).
    """
    if path in _refreshed:
        return False
    if len(_refreshed) > 4096:
        _refreshed.clear()
    _refreshed.add(path)
    try:
        os.mkdir(path, 0o700)
    except OSError:
        return True  # EEXIST: the lookup was fresh (the point); ENOENT, ESTALE: the directory went
    try:
        os.rmdir(path)  # at once: the name must not stand as a directory (above)
    except OSError:
        pass  # the check below still tells
    d = os.path.dirname(path)
    try:
        in_place = os.path.basename(d) in os.listdir(os.path.dirname(d) or ".")  # a listing: never a cached lookup
    except OSError:
        in_place = False
    if in_place:
        raise CorruptStateError(f"{path} was missing, though it existed (removed by hand, or the store removed "
                                "while in use?); remove the store")  # fmt: skip
    return True


def _statx_fresh():
    """libc's ``statx`` (Linux, glibc >= 2.28), or None: ``os.stat`` has no ``AT_STATX_FORCE_SYNC`` before 3.15."""
    try:
        f = ctypes.CDLL(None, use_errno=True).statx
    except (AttributeError, OSError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]
    return f


_STATX = _statx_fresh() if sys.platform.startswith("linux") else None
_AT_FDCWD, _AT_STATX_FORCE_SYNC, _STATX_NLINK, _STATX_BASIC_STATS = -100, 0x2000, 0x4, 0x7FF
# statx itself unusable: missing (ENOSYS: a kernel before 4.11), flags refused (EINVAL), or blocked by a seccomp
# filter (EPERM: Docker's profile before 18.04, allow-lists without it -- OpenJDK 8337966, kubearmor/KubeArmor#2658),
# where a plain stat still works.  Remembered, as OpenJDK does: one failed system call, not one per read.
_NO_STATX = (errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP)


def _forced_statx(path: str, mask: int) -> bytes | int:
    """``struct statx`` of ``path`` read from the server (``AT_STATX_FORCE_SYNC``), or the errno of the failure
    (one of :data:`_NO_STATX`: no usable ``statx`` here, so the caller falls back to a plain ``stat``).

    Why forced: FUSE (``fuse_update_get_attr``) sends a GETATTR despite ``attr_timeout``, NFS (``nfs_getattr``)
    revalidates despite ``acregmin``/``acdirmin``; Lustre reads attributes under its lock anyway."""
    global _STATX
    if _STATX is None:
        return errno.ENOSYS
    buf = ctypes.create_string_buffer(256)  # struct statx
    if _STATX(_AT_FDCWD, os.fsencode(path), _AT_STATX_FORCE_SYNC, mask, buf) == 0:
        return buf.raw
    err = ctypes.get_errno() or errno.EIO
    if err in _NO_STATX:
        _STATX = None
    return err


def dir_signature(path: str) -> bytes | tuple | None:
    """The directory's identity, link count, size, ctime and mtime, read from the server (None: unknown).

    :func:`_forced_statx`.  Measured on bindfs with 2 s caches: a plain ``stat`` showed the mtime of before another
    mount's create, the forced one the new mtime, at a quarter of a listing's time (100 vs 380 us).  Without
    ``statx`` a plain ``stat``, which may answer from the attribute cache (callers bound what that delays).
    """
    raw = _forced_statx(path, _STATX_BASIC_STATS)
    if isinstance(raw, bytes):
        return raw[16:20] + raw[32:48] + raw[96:128]  # stx_nlink, stx_ino, stx_size, stx_ctime, stx_mtime
    if raw not in _NO_STATX:
        return None  # gone, or unreadable: list it
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink, st.st_size)


def link_count(path: str, *, past_cache: bool = True) -> int:
    """The link count of ``path`` (int) read from the server; 0 if it cannot be read (gone, EIO, ESTALE).

    It answers "did my ``link()`` of this unique temporary take effect?" after the ``link()`` answered an error
    (EEXIST from a retransmitted LINK whose first reply was lost, EIO): the count is 2 if it did.  A plain ``stat``
    can answer that wrongly on NFS: Linux's client updates a file's attributes from a LINK reply only when the LINK
    succeeded (``_nfs4_proc_link``, fs/nfs/nfs4proc.c; ``nfs_link``, fs/nfs/dir.c), so inside ``acregmin`` (3 s by
    default, nfs(5)) a ``stat`` after the EEXIST answers the count from before -- 1 -- and the caller would link
    its file again under a second name: one write counted twice.  Hence :func:`_forced_statx` (one GETATTR);
    without a usable ``statx`` (not Linux, glibc < 2.28, a seccomp filter: :data:`_NO_STATX`) a plain ``stat``, the
    best there is.  (NFSv3's client updates the attributes from a failed LINK's reply too, ``nfs3_proc_link``: the
    stale count is NFSv4's.)  Where a FUSE daemon caches attributes itself, even the forced read can answer a count
    kept past a failed link (GlusterFS md-cache, ``mdc_link_cbk``): after an EIO the callers read the token back.

    ``past_cache=False``: a plain ``stat``, for the count right after a ``link()`` that *succeeded* (the first claim's
    proof that the filesystem links rather than copies, ``PosixStore.prove_link``): the LINK reply carried the file's
    attributes (RFC 1813 LINK3resok; NFSv4's LINK compound ends in a GETATTR; FUSE's link reply is an entry with
    attributes), so the kernel's copy is right -- but for RHEL 8.1's FUSE, which added one to it: the proof reads
    past the cache before it refuses.

    0 means unknown, never "not linked": the stores then read the token back or prove at a later link; only
    ``fsmingle check``'s link race counts it as no win, which can under-report a win, never invent one."""
    if not past_cache:
        try:
            return os.stat(path).st_nlink
        except OSError:
            return 0
    raw = _forced_statx(path, _STATX_NLINK)
    if isinstance(raw, bytes):
        return int.from_bytes(raw[16:20], sys.byteorder)  # stx_nlink
    if raw not in _NO_STATX:
        return 0
    try:
        return os.stat(path).st_nlink
    except OSError:
        return 0
