"""Retiring a directory: one ``rename()`` out of every listing, its files deleted when their time comes.

A retired directory is renamed to ``.trash-<expiry ms>-<random>-<name>`` in the store's root
(hidden: listings skip dot names), then every ``.trash-*`` whose expiry has passed is deleted --
this host's or another's (the sweep is one listing of the root).  A directory retired with nothing to
keep is deleted at once, and such a retire sweeps at most once per ``SWEEP_GAP`` seconds per root in a
process: the cleaner retires up to ``CLEAN_PER_CALL`` generations in one call and needs the root listed
once, not once each.  The expiry is wall
clock, so that it means the same to every host; a few seconds of clock skew are small beside a
grace meant to outlast entry caches of a minute (``Store.retire`` says why files are kept at all).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
import time

PREFIX = ".trash-"
_MS_DIGITS = 14
SWEEP_GAP = 10.0  # seconds between two sweeps of one root by one process
_last_sweep: dict[str, float] = {}  # root -> monotonic time of this process's last sweep of it
_kept: dict[tuple[str, str], str] = {}  # (root, retired directory) -> its trash entry (read_kept)
_NAME_MAX = 255  # bytes of one name (ext4, XFS, NFS, Lustre): a trash entry's name must fit


def _tail(name: str) -> str:
    """How a trash entry's name ends for retired directory ``name``: the name itself (``/`` as ``_``), or where
    that would make the entry's name over ``NAME_MAX`` (a FolderStore key of 96-100 bytes: ``k-`` and 200 hex,
    then its epoch), ``s-`` and the SHA-256 of it -- else the ``rename()`` fails with ENAMETOOLONG and the
    directory is never retired (such a key kept every epoch it ever made)."""
    flat = name.replace("/", "_")
    if len(PREFIX) + _MS_DIGITS + 10 + len(flat) <= _NAME_MAX:  # 10: the two "-" and 8 hex of move_aside
        return flat
    return "s-" + hashlib.sha256(flat.encode("utf-8", "surrogatepass")).hexdigest()


def move_aside(root: str, name: str, keep_for: float = 0.0) -> bool:
    """Rename directory ``root/name`` into the trash, kept ``keep_for`` seconds; then sweep (when: the module docstring).

    Returns:
        bool: False if ``name`` was already gone (ENOENT, ESTALE: another retired it).

    Raises:
        OSError: the rename failed otherwise (the caller names it: ``PosixStore.retire``).
    """
    expiry_ms = int((time.time() + keep_for) * 1000)
    aside = os.path.join(root, f"{PREFIX}{expiry_ms:0{_MS_DIGITS}d}-{secrets.token_hex(4)}-{_tail(name)}")
    try:
        os.rename(os.path.join(root, name), aside)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ESTALE):
            return False
        raise
    if keep_for <= 0:
        shutil.rmtree(aside, ignore_errors=True)  # nothing to keep: gone now, not at the next sweep
    now = time.monotonic()
    # With files kept, sweep at each retire: what expired is then deleted a little at a time (a
    # FolderStore's seal stays as cheap after a day as at its start, tests/test_folderstore_longjob.py).
    if keep_for > 0 or now - _last_sweep.get(root, -float("inf")) >= SWEEP_GAP:
        _last_sweep[root] = now
        sweep(root)
    return True


def find(root: str, name: str) -> str | None:
    """The trash entry (a name in ``root``) under which retired directory ``name`` is kept, or None (deleted
    already, or never retired).  A FolderStore writer whose version may have landed in an epoch retired since
    reads it back there (``fsmingle.fs.folderstore_add.read_retired``): one listing of ``root``.

    Raises:
        OSError: the listing failed otherwise than "gone" (EIO, ENOTCONN): whether the entry is there is unknown --
            never "not there", which a writer settling a ``link()`` of unknown effect would take for "never linked"
            and write again (session 12's attack: an add counted twice).
    """
    tail = "-" + _tail(name)
    try:
        names = os.listdir(root)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ESTALE, errno.ENOTDIR):
            return None
        raise
    return next((n for n in names if n.startswith(PREFIX) and n.endswith(tail)), None)


def read_kept(store, name: str) -> bytes | None:
    """``PosixStore.read_retired``: file ``name`` (``"dir/file"``) of retired directory ``dir`` from its trash
    entry, as ``store.read`` answers; None if not there.  The entry is found by one listing of the root
    (:func:`find`) and remembered: a FolderStore walking back through a retired epoch reads many of its files.

    Raises:
        OSError: listing the root failed otherwise than ENOENT, ESTALE or ENOTDIR (:func:`find`: an EIO is not "not
            in the trash"), or reading the file failed as ``store.read`` raises."""
    d, f = name.rsplit("/", 1)
    aside = _kept.get((store.root, d))
    if aside is None:
        aside = find(store.root, d)
        if aside is None:
            return None
        if len(_kept) > 64:
            _kept.clear()
        # Remembered: a directory is retired once (a FolderStore's epoch names are never reused) and its trash
        # entry is never renamed again, only deleted -- after which the read below answers None.
        _kept[(store.root, d)] = aside
    data = store.read(f"{aside}/{f}")
    if data is None:
        _kept.pop((store.root, d), None)
    return data


def sweep(root: str) -> None:
    """Delete every trash entry of ``root`` whose expiry has passed (and an older fsmingle's, which
    carry no time: their writer deleted them at once, so one still there is a leftover)."""
    now_ms = time.time() * 1000
    try:
        names = os.listdir(root)
    except OSError:
        return  # the next retire sweeps
    for n in names:
        if n.startswith(PREFIX):
            head = n[len(PREFIX) :].split("-", 1)[0]
            if not (head.isdigit() and len(head) == _MS_DIGITS) or int(head) <= now_ms:
                shutil.rmtree(os.path.join(root, n), ignore_errors=True)  # .nfs* go when their holders close
