"""Writes that may take effect and still report an error, resolved by reading back.

A create, a mkdir or a publish can happen on the server and still fail at the client: a soft NFS
mount's timeout (``nfs(5)``: "soft ... the client reports an error ... after retrans
retransmissions", though the server may have done the request), a lost reply to a retransmitted
LINK, GlusterFS answering EIO to a racing mkdir that took effect (measured in
``tests/test_realfs.py``).  A node must never fail on an operation that happened, nor believe in one
that did not: each function here reads the result back after any error that is not a definite
refusal (:func:`fsmingle.fs.store.refused`: full, read-only, no permission -- no effect, and no retry
helps), and tries once more when nothing is there.

Used by the protocol (:mod:`fsmingle.protocol.joining`) and by the tests that race these
operations across real filesystem clients, so both take the same path.  ``what`` names the caller
in the log ("job J").
"""

from __future__ import annotations

import logging

from ..errors import StorageError
from .store import Store, refused

log = logging.getLogger("fsmingle")


def create(store: Store, name: str, data: bytes, what: str = "") -> bool:
    """``store.create``, resolved by reading back when it raises: True if ``name`` holds ``data``.

    Our own bytes read back (a claim and a decision name their writer's unique instance) mean it
    happened; another's mean we lost (False); nothing visible, one more create settles it (EEXIST
    there is the caller's to read back, as after any create).

    Raises:
        StorageError: a definite refusal, or the second create failed as well (a broken mount).
        FileNotFoundError: the directory is gone.
    """
    try:
        return store.create(name, data)
    except StorageError as e:
        if refused(e):
            raise
        got = store.read(name)
        if got:
            how = "took effect" if got == data else "was made by another"
            log.warning("%screating %s failed (%s), but it %s: resolved by reading it back", _who(what), name, e, how)
            return got == data
        log.warning("%screating %s failed (%s) and it is not there; once more", _who(what), name, e)
        return store.create(name, data)


def make_dir(store: Store, name: str, what: str = "") -> bool:
    """``store.mkdir``, resolved by a listing when it raises: True if this call made ``name``.

    A directory the listing shows exists, made by us or by another: which is unknown, so False (a
    joiner that thinks another made its generation only asks rank 0 first).  Absent, one more mkdir
    settles it.  A listing, not a lookup: the server answers it, while a negative lookup cache
    (NFS lookupcache, GlusterFS nl-cache) may still say "absent" by name.

    Raises:
        StorageError: a definite refusal, or the second mkdir failed as well.
        FileNotFoundError: the parent directory is gone.
    """
    try:
        return store.mkdir(name)
    except StorageError as e:
        if refused(e):
            raise
        head, _, tail = name.rpartition("/")
        if tail in store.listdir(head):
            log.warning("%smkdir %s failed (%s), but the directory is there", _who(what), name, e)
            return False
        log.warning("%smkdir %s failed (%s) and it is not there; once more", _who(what), name, e)
        return store.mkdir(name)


def publish(store: Store, name: str, data: bytes, what: str = "") -> None:
    """``store.publish``, resolved by reading back when it raises: our bytes there mean it happened;
    otherwise -- not there, or the read-back failed too -- one more publish (a beacon or a
    heartbeat is idempotent, so publishing what may already be there costs nothing).

    Raises:
        StorageError: a definite refusal, or the second publish failed as well.
        FileNotFoundError: the directory is gone.
    """
    try:
        store.publish(name, data)
    except StorageError as e:
        if refused(e):
            raise
        try:
            if store.read(name) == data:
                log.info("%spublishing %s failed (%s), but it took effect", _who(what), name, e)
                return
        except StorageError as e2:
            # GlusterFS nfs60 (CI, tests/test_realfs.py's create race): in a directory whose racing
            # mkdir had answered EIO, that client's publish and then its read-back answered EIO too.
            # The read-back decides nothing here; the second publish does (or raises).
            log.warning(
                "%spublishing %s failed (%s) and reading it back failed (%s); once more", _who(what), name, e, e2
            )
        store.publish(name, data)


def _who(what: str) -> str:
    return f"{what}: " if what else ""
