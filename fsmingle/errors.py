"""The one exception family of fsmingle, and the process exit code of each member.

Every error fsmingle raises on purpose derives from :class:`FsmingleError`, so
``except fsmingle.FsmingleError`` catches all of them.  Each also subclasses the
built-in exception it is a kind of (``ValueError``, ``PermissionError``,
``OSError``, ``TimeoutError``, ``RuntimeError``), so code that already catches
those keeps working.  This mirrors tox-dev/filelock, whose ``Timeout`` is a
``TimeoutError``.

Exit codes of the ``fsmingle`` command (also ``FsmingleError.exit_code``):

====  ===========================================================================
code  meaning
====  ===========================================================================
0     success (``run`` returns the child's own exit code once it has started)
2     command-line usage error (unknown option, missing value) -- from click
3     :class:`ConfigError` -- an invalid value: job id, nnodes, rank, port, ...
4     :class:`UnsafeDirectoryError` -- directory or file not owned by you,
      group/world-writable, a symlink
5     :class:`StorageError` -- directory missing, not writable, read-only, full
6     :class:`RankConflictError` -- another live process holds the same rank
7     :class:`RendezvousTimeoutError` -- the world did not complete in time
8     :class:`CorruptStateError` -- a release record that cannot be trusted
9     any other :class:`FsmingleError`
10    :class:`UnsupportedFilesystemError` -- the filesystem of ``--dir`` cannot
      hold an exclusive claim (no hard links: s3fs, gcsfuse, blobfuse, ...)
126   ``run``: the command exists but cannot be executed (as in POSIX shells)
127   ``run``: the command was not found (as in POSIX shells)
130   interrupted (SIGINT / SIGTERM) while waiting; the rendezvous was withdrawn
====  ===========================================================================
"""

from __future__ import annotations

__all__ = [
    "FsmingleError",
    "ConfigError",
    "UnsafeDirectoryError",
    "StorageError",
    "RankConflictError",
    "RendezvousTimeoutError",
    "CorruptStateError",
    "RecordError",
    "UnsupportedFilesystemError",
]


class FsmingleError(Exception):
    """Base class of every error fsmingle raises on purpose.

    Attributes:
        exit_code (int): the exit status the ``fsmingle`` command uses for it.
    """

    exit_code: int = 9


class ConfigError(FsmingleError, ValueError):
    """An option or environment value is invalid (job id, nnodes, rank, port, address, interface).

    Raised before anything is written to the shared directory.
    """

    exit_code = 3


class UnsafeDirectoryError(FsmingleError, PermissionError):
    """The rendezvous directory or a file in it is unsafe to trust.

    Raised when the job directory is owned by another user, is group- or
    world-writable, is a symlink, or when ``--dir`` is world-writable without
    the sticky bit.  Other users could then plant beacons that send your nodes
    to their address.
    """

    exit_code = 4


class StorageError(FsmingleError, OSError):
    """The shared directory cannot be used: missing, not writable, read-only or full."""

    exit_code = 5


class RankConflictError(FsmingleError, RuntimeError):
    """Another live process already holds the rank this process asked for."""

    exit_code = 6


class RendezvousTimeoutError(FsmingleError, TimeoutError):
    """The world was not complete before the timeout.

    Attributes:
        missing (list[int]): ranks (node ranks in node mode) nobody holds.
        present (int): how many ranks were held when it gave up.
    """

    exit_code = 7

    def __init__(self, message: str, missing: list[int] | None = None, present: int = 0):
        super().__init__(message)
        self.missing = list(missing or [])
        self.present = present


class CorruptStateError(FsmingleError, RuntimeError):
    """A release record exists but stayed unreadable, foreign-owned or of an unknown schema."""

    exit_code = 8


class RecordError(FsmingleError, ValueError):
    """A beacon, claim or release record is not valid JSON of a known schema.

    Readers of the shared directory treat this as "not there yet" (a torn or
    foreign write must never crash a waiting node); it is raised to callers
    only by :func:`fsmingle.records.decode`.
    """

    exit_code = 9


class UnsupportedFilesystemError(StorageError):
    """The rendezvous directory is on a filesystem where no claim can be exclusive.

    Raised before anything is claimed when a real ``link()`` probe in the job
    directory fails with EPERM, EOPNOTSUPP, ENOSYS or EXDEV, or does not yield a
    link count of 2 (object stores seen as files: s3fs, gcsfuse, blobfuse,
    goofys, rclone mounts), and by :meth:`fsmingle.store.PosixStore.create` if
    link() fails so later.  fsmingle never falls back to ``O_CREAT|O_EXCL``,
    which such filesystems do not make exclusive across mounts.

    Attributes:
        fstype (str): mount type from /proc/self/mountinfo (``fuse.s3fs``; ``""`` if unknown).
        source (str): mount source; mount_point (str): where it is mounted.
    """

    exit_code = 10
    meaning: str = 'the filesystem of --dir cannot hold an exclusive claim (no hard links: s3fs, gcsfuse, blobfuse...); use a POSIX shared filesystem'

    def __init__(self, message: str, fstype: str = "", source: str = "", mount_point: str = ""):
        super().__init__(message)
        self.fstype, self.source, self.mount_point = fstype, source, mount_point
