"""Filesystem primitives for one job directory: the state store the protocol runs on.

:class:`Store` is the interface the rendezvous policy (``protocol.py``) uses;
:class:`PosixStore` implements it on a real, possibly weakly consistent shared
filesystem (NFS, Lustre, GPFS, a FUSE mount).  Tests swap in an in-memory store
with stale reads and torn writes; both implement the same five operations, so
the same policy code runs on either.

Rules every method follows, each because of a filesystem fact (see
``docs/protocol.md`` and nfs(5)):

* Readers ``open()`` afresh every time: NFS guarantees only close-to-open
  consistency, so a descriptor kept open may show stale data forever.
* ``ENOENT`` and ``ESTALE`` on reads mean "not there (yet)", never a crash: a
  file another client just replaced or removed gives ESTALE on NFS.
* Hidden names (``.tmp-*``, ``.nfs*`` silly-renames, ``.trash-*``) are never
  listed, so a reader never picks up a half-written temporary.
* Files are opened with ``O_NOFOLLOW`` and must be regular files owned by our
  uid; anything else is untrusted and treated as absent (and reported once).
"""

from __future__ import annotations

import abc
import errno
import functools
import logging
import os
import secrets
import socket
import stat
import time

from ..errors import FsmingleError, StorageError, UnsafeDirectoryError
from . import lookup, trash
from .lookup import link_count, stat_existing
from .refusal import REFUSE_ERRNOS, errno_name, unsupported

log = logging.getLogger("fsmingle.store")

# errnos that mean "the shared filesystem refuses writes" -> StorageError
_WRITE_FATAL = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the filesystem is mounted read-only",
    errno.ENOSPC: "the filesystem is full",
    errno.EDQUOT: "your disk quota is exceeded",
}
_RETRY_READ = (errno.ENOENT, errno.ESTALE, errno.ENOTDIR)
# errnos of a call whose reply was lost, not refused: the call may have taken effect on the server.  ENOTCONN:
# a FUSE client whose daemon died or lost its servers (GlusterFS when a brick disconnects mid-call; the JuiceFS
# client killed); ETIMEDOUT, EIO: a soft NFS mount's major timeout (nfs(5), "soft"); ECONNRESET, ECONNABORTED: a
# network filesystem's connection torn mid-call.
_REPLY_LOST = (errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED)
UNTRUSTED = b""  # read() result for a file that exists but is not ours to trust (never valid JSON)


def refused(e: OSError) -> bool:
    """True if ``e`` is a filesystem's definite refusal of a write (permissions, read-only, full,
    quota): it took no effect and a retry meets it again, so nothing is read back (an EIO or a
    timeout, by contrast, may come after the write took effect)."""
    return (e.errno or 0) in _WRITE_FATAL


def storage_error(e: OSError, what: str, path: str, mutating: bool = False) -> StorageError:
    """Translate an OSError from a write, or from a read or listing that no retry fixes (ENOTCONN: the
    node's FUSE client died; EIO: it lost its servers), into a :class:`StorageError` that says what
    to do.  ``mutating``: ``e`` came from a call that changes the directory (a ``link()``); where its reply was
    lost rather than refused (:data:`_REPLY_LOST`) the message says it may have taken effect."""
    reason = _WRITE_FATAL.get(e.errno or 0, os.strerror(e.errno or 0) if e.errno else str(e))
    if mutating and e.errno in _REPLY_LOST:
        reason += " (the reply was lost: whether it took effect is unknown)"
    hint = {
        errno.EACCES: "use a directory you can write (--dir / FSMINGLE_DIR)",
        errno.EPERM: "use a directory you can write (--dir / FSMINGLE_DIR)",
        errno.EROFS: "point --dir at a writable shared mount",
        errno.ENOSPC: "free space there or choose another --dir",
        errno.EDQUOT: "free space in your quota or choose another --dir",
        errno.EMFILE: "raise the open-file limit (`ulimit -n`)",
        errno.ENFILE: "the system's open-file table is full (fs.file-max)",
    }.get(e.errno or 0, "check the shared mount on this node")
    err = StorageError(f"cannot {what} {path}: {reason}; {hint}")
    err.errno = e.errno
    return err


def _storage_errors(what: str):
    """Every ``OSError`` out of a :class:`PosixStore` method is a :class:`StorageError` (exit 5,
    with what to do), but for the ones the method documents: ``FileNotFoundError`` (the parent
    directory went) and fsmingle's own errors.  A raw ``OSError`` -- EMFILE from a listing while
    the process's descriptors ran out, EIO from a read -- once escaped ``listdir`` as a traceback
    (issue 29)."""

    def wrap(method):
        @functools.wraps(method)
        def wrapper(self, name: str = "", *args, **kwargs):
            try:
                return method(self, name, *args, **kwargs)
            except (FsmingleError, FileNotFoundError):
                raise
            except OSError as e:
                raise storage_error(e, what, self.path(name)) from None

        return wrapper

    return wrap


class Store(abc.ABC):
    """State store of one job directory; names are relative paths inside it (``"gen-00000001/release.json"``)."""

    @abc.abstractmethod
    def listdir(self, name: str = "") -> list[str]:
        """Visible entry names of directory ``name``; ``[]`` if it does not exist. Hidden names are skipped.
        Raises :class:`StorageError` when the listing fails otherwise (ENOTCONN, EIO...)."""

    @abc.abstractmethod
    def read(self, name: str) -> bytes | None:
        """Contents of file ``name``; None if absent or stale (ESTALE); ``UNTRUSTED`` (``b""``) if it exists
        but must not be trusted (foreign-owned, a symlink, not a regular file), so that callers can
        tell "nobody wrote it yet" from "somebody else's file is in the way".  Raises :class:`StorageError`
        when the read fails otherwise (ENOTCONN: the node's FUSE client died; EIO...)."""

    @abc.abstractmethod
    def publish(self, name: str, data: bytes) -> None:
        """Atomically create or replace file ``name`` (readers see old or new, never a mix).

        Raises:
            StorageError: the filesystem refuses the write (read-only, full, permissions).
            FileNotFoundError: the parent directory no longer exists.
        """

    @abc.abstractmethod
    def create(self, name: str, data: bytes, fsync: bool = True) -> bool:
        """Create file ``name`` with ``data`` only if it does not exist; True if this call created it.

        ``fsync=False`` skips the flush to stable storage before the name appears: only for files
        nobody reads after a crash of the writer's node or of the server (a FolderStore's versions:
        a crash ends the generation whose store they are; see :meth:`PosixStore.create`).  Other
        clients see the complete file either way (NFS close-to-open).

        Raises:
            StorageError, FileNotFoundError: as for :meth:`publish`.
        """

    @abc.abstractmethod
    def mkdir(self, name: str) -> bool:
        """Create directory ``name`` (owner-only); True if created, False if it already existed.

        Raises:
            StorageError: as for :meth:`publish`.
        """

    @abc.abstractmethod
    def remove(self, name: str) -> None:
        """Remove file ``name``; absent is fine."""

    @abc.abstractmethod
    def retire(self, name: str, keep_for: float = 0.0) -> bool:
        """Move directory ``name`` aside atomically, then delete it; False if it was already gone.
        ``keep_for`` (seconds): its files are deleted only that much later (by a later ``retire``):
        clients caching entries by inode (FUSE GlusterFS, MooseFS, JuiceFS; NFS) still reach it by its
        old name, and a ``link()`` there succeeds into the trash once its name is free (measured;
        CephFS and bindfs answer ENOENT); kept, every name stays taken (EEXIST)."""

    @abc.abstractmethod
    def read_retired(self, name: str) -> bytes | None:
        """File ``name`` (``"dir/file"``) of a directory retired with ``keep_for`` > 0, as :meth:`read` answers;
        None if never retired, or deleted since.  Raises :class:`StorageError` as :meth:`read` does."""

    def refresh(self, name: str) -> bool:
        """Make this client's next lookup of ``name`` -- a name the caller knows exists -- ask the server, past a
        negative lookup cache entry of it (:func:`fsmingle.fs.lookup.refresh`).  True if refreshed now (read it
        again at once); False if nothing was done (refreshed before, or a store whose lookups never lie)."""
        return False

    def dir_signature(self, name: str) -> object | None:
        """What the server says of directory ``name`` now, past the attribute cache: equal signatures mean no
        entry was made or removed between them (within a timestamp tick: callers bound what that delays).
        None: unknown (gone, unreadable, or a store without one): list it."""
        return None


def _tmp_name() -> str:
    # Unique per host, process and call; hidden so listings never show it.
    return f".tmp-{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(6)}"


class PosixStore(Store):
    """:class:`Store` on a real directory (local disk, NFS, Lustre, GPFS, FUSE).

    Args:
        root (str): the job directory, already validated by :func:`open_job_dir`.
    """

    def __init__(self, root: str):
        self.root = root
        self._uid = os.geteuid()
        self._reported: set[str] = set()
        self._link_proven = False  # the first successful link() checks the link count (create)

    def path(self, name: str) -> str:
        return os.path.join(self.root, name) if name else self.root

    def _report(self, name: str, msg: str) -> None:
        # Report each untrusted file once: polling must not flood the log.
        if name not in self._reported:
            self._reported.add(name)
            log.warning("ignoring %s: %s", self.path(name), msg)

    @_storage_errors("list")
    def listdir(self, name: str = "") -> list[str]:
        try:
            # readdir goes to the server on NFS when the directory changed
            # (ctime revalidation), unlike lookups of single names, which the
            # negative dentry cache may answer "missing" for seconds.
            entries = os.listdir(self.path(name))
        except OSError as e:
            if e.errno in _RETRY_READ:
                return []
            raise storage_error(e, "list", self.path(name)) from None
        return sorted(n for n in entries if not n.startswith("."))

    @_storage_errors("read")
    def read(self, name: str) -> bytes | None:
        p = self.path(name)
        try:
            # A fresh open() each time: close-to-open consistency is all NFS
            # promises.  O_NOFOLLOW: a symlink planted by someone else must not
            # redirect us.  O_NONBLOCK: a FIFO planted there must not hang us.
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            if e.errno in _RETRY_READ:
                return None
            if e.errno == errno.ELOOP:
                self._report(name, "it is a symlink (never followed)")
                return UNTRUSTED
            if e.errno in (errno.EACCES, errno.EPERM):
                self._report(name, "permission denied")
                return UNTRUSTED
            raise storage_error(e, "read", p) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._report(name, "not a regular file")
                return UNTRUSTED
            if st.st_uid != self._uid:
                self._report(name, f"owned by uid {st.st_uid}, not by you (uid {self._uid}); never trusted")
                return UNTRUSTED
            chunks = []
            while True:
                b = os.read(fd, 1 << 16)
                if not b:
                    break
                chunks.append(b)
                if sum(map(len, chunks)) > (1 << 21):
                    self._report(name, "larger than 2 MiB")
                    return UNTRUSTED
            return b"".join(chunks)
        except OSError as e:
            if e.errno in _RETRY_READ:  # ESTALE mid-read: the file was replaced
                return None
            raise storage_error(e, "read", p) from None
        finally:
            try:
                os.close(fd)
            except OSError:
                # GlusterFS answers the FUSE flush of a file another client replaced meanwhile
                # with ESTALE (seen when one host rewrote a beacon in a loop while another read it:
                # close() raised, and the exception escaped read()).  Nothing was written through
                # this read-only descriptor, and Linux releases it even when close() fails
                # (close(2)); what was read is one whole version (rename() replaces atomically).
                pass

    def _write_tmp(self, name: str, data: bytes, fsync: bool = True) -> str:
        directory = os.path.dirname(self.path(name))
        # Same directory as the target: rename/link are atomic only within one
        # directory (and one filesystem) on NFS, Lustre and GPFS.
        tmp = os.path.join(directory, _tmp_name())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_error(e, "write in", directory) from None
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                # fsync before publishing: after a crash of this node the name
                # must never point at an empty or partial file.
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)  # sends the data to an NFS server (close-to-open), fsync or not
        except OSError as e:
            _unlink_quiet(tmp)  # loses nothing: the target was never touched
            raise storage_error(e, "write", tmp) from None
        return tmp

    @_storage_errors("publish")
    def publish(self, name: str, data: bytes) -> None:
        tmp = self._write_tmp(name, data)
        try:
            # rename() within a directory is atomic on NFS, Lustre and GPFS:
            # readers see the old or the new beacon, never a mix.
            os.replace(tmp, self.path(name))
        except OSError as e:
            if e.errno != errno.ENOENT and _gone(tmp):
                # The rename took effect and still reported an error (EIO, a soft mount's timeout):
                # our unique temporary name is gone, and nobody else knows it, so it is the target
                # now.  Read back, never fail on an operation that happened.
                return
            _unlink_quiet(tmp)
            if e.errno == errno.ENOENT:
                raise
            raise storage_error(e, "publish", self.path(name)) from None

    @_storage_errors("create")
    def create(self, name: str, data: bytes, fsync: bool = True) -> bool:
        """Exclusive create by link() (see :meth:`Store.create`).

        ``fsync`` (default True): flush the temporary before linking it, so that after a crash of this
        node or the server the name never holds a partial file: the rendezvous's records (claims,
        releases, torchrun's state) are read again after a crash.  A FolderStore's versions pass
        False: a crash of the writer's node ends their generation, whose store is never read again
        (a ``set``: 0.36 ms instead of 0.56; issue 30).  Other clients see the whole file either way.

        The first claim is also the probe of the filesystem (:mod:`fsmingle.fs.refusal`):
        the first link() that succeeds must leave our temp file with a link count of 2 (one
        ``stat``, once per store), or the directory is refused.

        Raises:
            UnsupportedFilesystemError: link() fails with EPERM, EOPNOTSUPP, ENOSYS or EXDEV, or
                the first one succeeds without a link count of 2 (its copy is removed): this
                filesystem has no hard links, so no claim on it can be exclusive.  There is
                deliberately no fallback to O_CREAT|O_EXCL: object-store filesystems (s3fs) accept
                it on every mount at once (measured: both of two mounts won 100 of 100 races).
            StorageError, FileNotFoundError: as for :meth:`publish`.
        """
        tmp = self._write_tmp(name, data, fsync)
        target = self.path(name)
        try:
            try:
                # link() of a fully written unique file is the exclusive create
                # that nfs(5)/open(2) recommend: O_EXCL was unreliable before
                # NFSv3, and link() publishes complete content atomically.
                os.link(tmp, target)
            except FileExistsError:
                # link() may report failure after succeeding (a retransmitted
                # NFS request): a link count of 2 on our unique file is the truth --
                # read from the server, since NFS keeps the cached count after a
                # LINK that failed (lookup.link_count).
                if link_count(tmp) == 2:
                    return True
                # Lost the race: the winner's claim is read back by name next, so
                # make sure a negative lookup cache does not hide it (stat_existing).
                try:
                    stat_existing(target)
                except FileNotFoundError:
                    pass  # removed since (a cleaned generation): the read finds nothing either
                return False
            except OSError as e:
                if e.errno == errno.ENOENT:
                    raise
                if link_count(tmp) == 2:
                    return True
                if e.errno in REFUSE_ERRNOS:
                    raise unsupported(
                        self.root, f"link() fails there with {errno_name(e.errno)} ({os.strerror(e.errno)})"
                    ) from None
                raise storage_error(e, "create", target, mutating=True) from None
            if not self._link_proven:
                self.prove_link(tmp, target)
            return True
        finally:
            _unlink_quiet(tmp)

    def prove_link(self, tmp: str, target: str) -> None:
        """After the first ``link(tmp, target)`` of this store that succeeded: a filesystem that "links" by copying
        answers success without a second name, so such a claim (or FolderStore version) proves nothing.  The count
        is read plainly first -- the LINK reply carried the file's attributes (RFC 1813 LINK3resok; NFSv4's LINK
        compound ends in a GETATTR; a FUSE link reply is an entry with attributes) -- and past the cache before
        refusing: RHEL 8.1's FUSE added one to the reply's count and kept it (Red Hat bug 1802907; upstream fix
        97f044f690ba, "fuse: don't increment nlink in link()"), so a plain ``stat`` answered 3 on a correct
        filesystem.  A count of 0 (the read failed: a FolderStore epoch retired meanwhile) proves nothing either way:
        proven at the next.

        Raises:
            UnsupportedFilesystemError: the count is neither 2 nor unknown, twice (``target``, our copy, is removed:
                it must not stand as a claim).
        """
        n = link_count(tmp, past_cache=False)
        if n not in (0, 2):
            n = link_count(tmp)
        if n not in (0, 2):
            _unlink_quiet(target)
            raise unsupported(self.root, f"link() succeeded but the link count is {n}, not 2")
        self._link_proven = n == 2

    @_storage_errors("create directory")
    def mkdir(self, name: str) -> bool:
        p = self.path(name)
        retried = 0
        while True:
            try:
                os.mkdir(p, 0o700)  # mkdir is atomic and exclusive on every POSIX filesystem
                return True
            except FileExistsError:
                try:
                    return self._found_dir(p)
                except (FileNotFoundError, UnsafeDirectoryError):
                    raise
                except OSError as e:  # the lookup of a name mkdir said exists kept failing (EIO)
                    raise storage_error(e, "look up directory", p) from None
            except OSError as e:
                if e.errno != errno.EIO or retried >= MKDIR_EIO_TRIES:
                    raise storage_error(e, "create directory", p) from None
                # GlusterFS now and then answers EIO to a mkdir that raced another client's
                # mkdir of the same name (measured once in a full test run: 4 hosts racing on
                # the nfs60 profile); the winner's directory is then there.  Look for it
                # (stat_existing, which lists the parent if the lookup lies), else try once
                # more; a mount that is really broken fails the lookup or the second mkdir.
                retried += 1
                try:
                    return self._found_dir(p)
                except FileNotFoundError:
                    time.sleep(0.1 * retried)  # nobody made it (yet): mkdir again, a little later
                except OSError:
                    raise storage_error(e, "create directory", p) from None

    def _found_dir(self, p: str) -> bool:
        """``p`` exists (a mkdir said so): False if it is our directory (lost a creation race, or
        a re-run), :class:`UnsafeDirectoryError` if not."""
        # stat_existing, not lstat, so that a negative lookup cache cannot hide the
        # winner's directory for a minute.
        st = stat_existing(p)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != self._uid:
            raise UnsafeDirectoryError(
                f"{p} exists but is not a directory owned by you; remove it or use another --dir"
            )
        return False

    @_storage_errors("remove")
    def remove(self, name: str) -> None:
        _unlink_quiet(self.path(name))

    @_storage_errors("move aside")
    def retire(self, name: str, keep_for: float = 0.0) -> bool:
        try:
            # One atomic rename takes the whole directory out of every reader's view; slow readers
            # then get ENOENT (= "not there"), never a half-deleted directory -- except through an
            # entry cached by inode (Store.retire): so its files may be kept ``keep_for`` seconds.
            return trash.move_aside(self.root, name, keep_for)
        except OSError as e:
            raise storage_error(e, "move aside", self.path(name)) from None

    @_storage_errors("look in the trash for")
    def read_retired(self, name: str) -> bytes | None:
        return trash.read_kept(self, name)

    def refresh(self, name: str) -> bool:
        return lookup.refresh(self.path(name))  # an exclusive mkdir revalidates a negative dentry

    def dir_signature(self, name: str) -> bytes | tuple | None:
        return lookup.dir_signature(self.path(name))  # statx(AT_STATX_FORCE_SYNC): past attr_timeout, acdirmin


# mkdirs answered EIO (GlusterFS racing another client's mkdir) before a StorageError: twice in a row seen once
MKDIR_EIO_TRIES = 3


def _gone(path: str) -> bool:
    """True if ``path`` is certainly absent (lstat says ENOENT); any other answer is "maybe there"."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        pass
    return False


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
