"""The one exception family of fsmingle, and the process exit code of each member.

Every error fsmingle raises on purpose derives from :class:`FsmingleError`, so
``except fsmingle.FsmingleError`` catches all of them.  Each also subclasses the
built-in exception it is a kind of (``ValueError``, ``PermissionError``,
``OSError``, ``TimeoutError``, ``RuntimeError``), so code that already catches
those keeps working.  This mirrors tox-dev/filelock, whose ``Timeout`` is a
``TimeoutError``.

Exit codes of the ``fsmingle`` command: each class carries ``exit_code`` and a
one-line ``meaning``; :func:`exit_codes` adds the codes that are not errors
(0, 2, 126, 127, 130, :data:`OTHER_EXIT_CODES`).  The README's table, ``fsmingle run --help`` and
``docs/cli.md`` are generated from :func:`exit_codes` (:func:`markdown_table`,
:func:`help_lines`), and ``tests/test_docs.py`` checks them against it.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptStateError",
    "FsmingleError",
    "GpuPreflightError",
    "PeerJobEndedError",
    "RankConflictError",
    "RecordError",
    "RendezvousTimeoutError",
    "StorageError",
    "UnsafeDirectoryError",
    "UnsupportedFilesystemError",
    "WorldSizeMismatchError",
    "exit_codes",
]


class FsmingleError(Exception):
    """Base class of every error fsmingle raises on purpose.

    Attributes:
        exit_code (int): the exit status the ``fsmingle`` command uses for it.
        meaning (str): one line saying what the exit code means (the exit-code tables).
    """

    exit_code: int = 9
    meaning: str = "any other fsmingle error"


class ConfigError(FsmingleError, ValueError):
    """An option or environment value is invalid (job id, nnodes, rank, port, address, interface).

    Raised before anything is written to the shared directory.
    """

    exit_code = 3
    meaning: str = "invalid value (job id, nnodes, rank, port, address, interface, option combination)"


class UnsafeDirectoryError(FsmingleError, PermissionError):
    """The rendezvous directory or a file in it is unsafe to trust.

    Raised when the job directory is owned by another user, is group- or
    world-writable, is a symlink, or when ``--dir`` is world-writable without
    the sticky bit.  Other users could then plant beacons that send your nodes
    to their address.
    """

    exit_code = 4
    meaning: str = "unsafe directory or file: not yours, group- or world-writable without the sticky bit, a symlink"


class StorageError(FsmingleError, OSError):
    """The shared directory cannot be used: missing, not writable, read-only, full, or its mount
    does not answer on this node (ETIMEDOUT, ENOTCONN, EIO from a client that lost its servers)."""

    exit_code = 5
    meaning: str = (
        "storage problem: --dir missing (not created for you), not a directory, not writable, read-only, full, "
        "or its mount not answering (ETIMEDOUT, ENOTCONN)"
    )


class RankConflictError(FsmingleError, RuntimeError):
    """Another live process already holds the rank this process asked for."""

    exit_code = 6
    meaning: str = "rank conflict: another live process holds the rank you asked for"


class RendezvousTimeoutError(FsmingleError, TimeoutError):
    """The world was not complete before the timeout.

    Attributes:
        missing (list[int]): ranks (node ranks in node mode) nobody holds.
        present (int): how many ranks were held when it gave up.
    """

    exit_code = 7
    meaning: str = (
        "timeout: the world did not complete in --timeout; the message names the missing ranks and the directory"
    )

    def __init__(self, message: str, missing: list[int] | None = None, present: int = 0):
        super().__init__(message)
        self.missing = list(missing or [])
        self.present = present


class CorruptStateError(FsmingleError, RuntimeError):
    """A release record exists but stayed unreadable, foreign-owned or of an unknown schema."""

    exit_code = 8
    meaning: str = "a release record that stayed unusable (unreadable, foreign-owned, unknown schema)"


class RecordError(FsmingleError, ValueError):
    """A beacon, claim or release record is not valid JSON of a known schema.

    Readers of the shared directory treat this as "not there yet" (a torn or
    foreign write must never crash a waiting node); it is raised to callers
    only by :func:`fsmingle.fs.records.decode`.
    """

    exit_code = 9
    meaning: str = "any other fsmingle error"


class UnsupportedFilesystemError(StorageError):
    """The rendezvous directory is on a filesystem where no claim can be exclusive.

    Raised by the first rank claim (:meth:`fsmingle.fs.store.PosixStore.create`)
    when its ``link()`` fails with EPERM, EOPNOTSUPP, ENOSYS or EXDEV, or the first
    one succeeds without a link count of 2 (object stores seen as files: s3fs,
    gcsfuse, blobfuse, goofys, rclone mounts).  No claim stands then.  fsmingle
    never falls back to ``O_CREAT|O_EXCL``, which such filesystems do not make
    exclusive across mounts.

    Attributes:
        fstype (str): mount type from /proc/self/mountinfo (``fuse.s3fs``; ``""`` if unknown).
        source (str): mount source; mount_point (str): where it is mounted.
    """

    exit_code = 10
    meaning: str = "the filesystem of --dir cannot hold an exclusive claim (no hard links: s3fs, gcsfuse, blobfuse...); use a POSIX shared filesystem"

    def __init__(self, message: str, fstype: str = "", source: str = "", mount_point: str = ""):
        super().__init__(message)
        self.fstype, self.source, self.mount_point = fstype, source, mount_point


# Exit codes that are not an FsmingleError: (code, meaning, where it comes from).
OTHER_EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success (`run`: the command's own exit code once it runs)"),
    (2, "usage error: unknown or misspelt option, missing value or argument"),
    (126, "`run`: the command exists but cannot be executed (as in POSIX shells)"),
    (127, "`run`: the command was not found (as in POSIX shells)"),
    (130, "interrupted (SIGINT or SIGTERM) while waiting: this participant withdrew cleanly"),
    (
        143,
        (
            "interrupted (SIGTERM or SIGINT) once the release was decided with this participant in it (or may "
            "have been: in the commit window), before the command started: too late to withdraw, the others "
            "were released with this participant"
        ),
    ),
)


class InterruptedInCommitWindow(KeyboardInterrupt):
    """An interrupt (SIGINT, or SIGTERM in ``fsmingle run``) inside the commit window whose decision
    could not be read back: a release naming this participant may stand, so it did not withdraw.

    Raised by :meth:`fsmingle.protocol.participant.Participant.run` (``fsmingle.rendezvous()``) from the
    original interrupt; the CLI exits 143.  A ``KeyboardInterrupt``, so code that stops on Ctrl-C
    still stops.  Attributes: ``job_id`` (str), ``generation`` (int), ``rank`` (int | None).
    """

    def __init__(self, message: str, job_id: str, generation: int, rank: int | None):
        super().__init__(message)
        self.job_id, self.generation, self.rank = job_id, generation, rank


def _error_classes() -> list[type[FsmingleError]]:
    """FsmingleError and every subclass (recursively), in definition order of the tree."""
    out, todo = [], [FsmingleError]
    while todo:
        c = todo.pop(0)
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


def exit_codes() -> dict[int, tuple[str, str]]:
    """Every exit status of the ``fsmingle`` command, ascending: code -> (meaning, class name or "").

    Derived from the classes themselves (each ``exit_code`` once, its most
    general class: ``FsmingleError`` for 9, not ``RecordError``), plus
    :data:`OTHER_EXIT_CODES`; a class added anywhere in the family appears here.
    """
    codes = {code: (meaning, "") for code, meaning in OTHER_EXIT_CODES}
    for c in _error_classes():
        codes.setdefault(c.exit_code, (c.meaning, c.__name__))
    return dict(sorted(codes.items()))


def markdown_table() -> str:
    """The exit-code table as Markdown (README.md, docs/cli.md), one row per code."""
    rows = ["| code | meaning |", "|---|---|"]
    for code, (meaning, cls) in exit_codes().items():
        rows.append(f"| {code} | {meaning}{f' (`{cls}`)' if cls else ''} |")
    return "\n".join(rows) + "\n"


def help_lines() -> str:
    """The exit-code list for ``--help`` texts: ``"0 success ...; 2 usage error ...; ..."`` in one paragraph."""
    return "; ".join(f"{code} {meaning.replace('`', '')}" for code, (meaning, _) in exit_codes().items()) + "."


class WorldSizeMismatchError(ConfigError):
    """Participants of one job disagree on the world size or mode (``--nnodes`` / ``--world-size``).

    The message names both values and both hosts.  The generation is voided
    first, so the participants that agree regroup in the next one.
    """

    exit_code = 11
    meaning: str = "participants disagree on the world size or mode (--nnodes / --world-size); the message names both values and hosts"


class GpuPreflightError(FsmingleError, RuntimeError):
    """``--gpus-per-node N``: this node has fewer than N usable GPUs (see :mod:`fsmingle.preflight.gpu`).

    Raised before anything is written to the shared directory, so the node never joins.
    The message says how many GPUs are usable, which ones were seen, how they were
    probed (NVML or ``nvidia-smi -L``) and ``CUDA_VISIBLE_DEVICES``.

    Attributes:
        found (int): usable GPUs seen; wanted (int): N.
    """

    exit_code = 12
    meaning: str = (
        "--gpus-per-node: this node has fewer usable GPUs than asked; it did not join (the message lists what it saw)"
    )

    def __init__(self, message: str, found: int = 0, wanted: int = 0):
        super().__init__(message)
        self.found, self.wanted = found, wanted


class PeerJobEndedError(FsmingleError, RuntimeError):
    """A peer job of this training (``--peer-jobs``, or a task of this job array) ended in the
    scheduler without joining: CANCELLED, FAILED, TIMEOUT, NODE_FAIL, COMPLETED...  The world
    cannot complete, so every participant fails at once instead of waiting out ``--timeout``
    (see :mod:`fsmingle.protocol.queue`).

    Attributes:
        ended (str): the jobs, their states and reasons.
    """

    exit_code = 13
    meaning: str = (
        "a peer job ended in the scheduler without joining (cancelled, failed...); the message names job, state, reason"
    )

    def __init__(self, message: str, ended: str = ""):
        super().__init__(message)
        self.ended = ended
