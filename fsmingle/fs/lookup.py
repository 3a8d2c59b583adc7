"""Lookups that lie: a client's cache says a name is missing that the server has (a create race lost).

The cure for a name the caller knows exists: :func:`stat_existing` (GlusterFS's nl-cache: a listing of the
parent).
"""

from __future__ import annotations

import errno
import os
import time

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
